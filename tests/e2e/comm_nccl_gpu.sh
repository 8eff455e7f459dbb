#!/usr/bin/env bash
# e2e.comm_nccl_gpu: the collectives of moe/comm.h over NCCL (tests/gpu/test_comm_nccl.c:
# all-reduce, reduce-scatter and all-gather of equal and uneven slices, gather, broadcast,
# all-to-all(v), barrier, on the world and the ep / dp groups, against host-computed sums)
# launched both ways a GPU run can start: torchrun-style variables (RANK=0 WORLD_SIZE=1
# MASTER_ADDR MASTER_PORT: host buffers staged through NCCL) and mpirun -np 1 (host buffers
# over MPI); then, where nvidia-smi lists at least 2 GPUs, 2 ranks both ways (ep = 2: the
# expert group is the world, the dp groups one rank each). Skipped (77) without the test
# binary (a build without CUDA or NCCL) or without a GPU; the mpirun launches are left out
# (with a message) without mpirun. Passed on one H200 (2026-12-02); not yet run on 2 GPUs.
set -euo pipefail
bin=${MOE_BUILD_DIR:?}/tests/gpu_test_comm_nccl
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$bin" ] || { echo "skip: no $bin (a build without CUDA)"; exit 77; }
port=$((20000 + $$ % 20000))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# torchrun NP: NP torchrun-style ranks of the test, each must report 0 failures
torchrun() {
    local np=$1 pids=() rc=0
    for r in $(seq 0 $((np - 1))); do
        RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout 300 "$bin" > "torchrun$np.rank$r.out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    port=$((port + 1))
    [ "$rc" = 77 ] && { cat torchrun$np.rank0.out; exit 77; }
    for r in $(seq 0 $((np - 1))); do
        [ "$rc" = 0 ] && grep -q "comm_nccl\[rank $r of $np\].*, 0 failed" "torchrun$np.rank$r.out" ||
            { cat torchrun$np.rank*.out; fail "$np torchrun-style ranks: exit $rc"; }
    done
}
# mpi NP: the test under mpirun -np NP
mpi() {
    timeout 300 mpirun -np "$1" "$bin" > "mpirun$1.out" 2>&1 || { cat "mpirun$1.out"; fail "mpirun -np $1"; }
    for r in $(seq 0 $(($1 - 1))); do
        grep -q "comm_nccl\[rank $r of $1\].*, 0 failed" "mpirun$1.out" || { cat "mpirun$1.out"; fail "mpirun -np $1"; }
    done
}
has_mpirun=0
command -v mpirun >/dev/null && has_mpirun=1
torchrun 1
[ $has_mpirun = 1 ] && mpi 1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "$gpus" -ge 2 ]; then
    torchrun 2
    [ $has_mpirun = 1 ] && mpi 2
    echo "comm_nccl_gpu: ok on 1 and 2 ranks (torchrun-style$([ $has_mpirun = 1 ] && echo ' and mpirun'))"
else
    echo "comm_nccl_gpu: ok on 1 rank (torchrun-style$([ $has_mpirun = 1 ] && echo ' and mpirun')); 2 GPUs needed for 2 ranks, $gpus visible"
fi
