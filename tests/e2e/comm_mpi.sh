#!/usr/bin/env bash
# e2e.comm_mpi: the collectives of moe/comm.h between real MPI ranks - tests/unit/test_comm.c
# started by mpirun on 3 ranks (odd: one expert group of 1, uneven slices) and on 4 ranks
# (dp 2 x ep 2 groups); every rank checks what it received.
set -euo pipefail
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt install openmpi-bin)"; exit 77; }
moe-train --version | grep -q "^MPI: yes" || { echo "skip: built without MPI"; exit 77; }
bin=${MOE_BUILD_DIR:?}/tests/unit_test_comm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" # MPI_Init's own allocations
for np in 3 4; do
    timeout 120 mpirun -np "$np" "$bin" > out.$np 2>&1 || { cat out.$np; echo "FAIL: $np ranks"; exit 1; }
    [ "$(grep -c ', 0 failed' out.$np)" = "$np" ] || { cat out.$np; echo "FAIL: $np ranks"; exit 1; }
done
echo "comm_mpi: ok"
