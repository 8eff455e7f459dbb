# shellcheck shell=bash
# mpi_env.sh, sourced by the e2e scripts that start ranks with mpirun: the sourcing script
# exits 77 (skipped) without mpirun, without MPI in moe-train, without python3-numpy or the
# lambda genome ($fa); sets PY, fa, the Open MPI variables for root and for more ranks than
# cores (CI has 2), turns LeakSanitizer off for the ranks (MPI_Init's own allocations, in
# plugins unloaded by MPI_Finalize, would fail `make test-asan`) and defines fail.
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt install openmpi-bin)"; exit 77; }
moe-train --version | grep -q "^MPI: yes" || { echo "skip: moe-train built without MPI"; exit 77; }
PY=/usr/bin/python3
"$PY" -c "import numpy" 2>/dev/null || { echo "skip: no python3-numpy"; exit 77; }
fa=${MOE_SRC_DIR:?}/data/lambda_virus.fa.gz
[ -f "$fa" ] || { echo "skip: lambda_virus.fa.gz not found"; exit 77; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi_asan="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fail() { echo "FAIL: $*" >&2; exit 1; }
