#!/usr/bin/env bash
# e2e.comm_nccl_gpu: the NCCL communicator's bring-up (tests/gpu/test_comm_nccl.c) launched
# both ways a GPU run can start: torchrun-style variables (RANK=0 WORLD_SIZE=1 MASTER_ADDR
# MASTER_PORT) and mpirun -np 1; each run builds the communicator on its GPU and checks an
# all-reduce of a device buffer. Skipped (77) without the test binary (a build without CUDA
# or NCCL), without a GPU, or without mpirun for the second launch. Not yet run on a GPU.
set -euo pipefail
bin=${MOE_BUILD_DIR:?}/tests/gpu_test_comm_nccl
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$bin" ] || { echo "skip: no $bin (a build without CUDA)"; exit 77; }
port=$((20000 + $$ % 20000))
rc=0
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" > torchrun.out 2>&1 || rc=$?
[ "$rc" = 77 ] && { cat torchrun.out; exit 77; }
[ "$rc" = 0 ] && grep -q "comm_nccl\[rank 0 of 1\].*, 0 failed" torchrun.out ||
    { cat torchrun.out; fail "torchrun-style launch: exit $rc"; }
command -v mpirun >/dev/null || { echo "skip: no mpirun for the second launch"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 300 mpirun -np 1 "$bin" > mpirun.out 2>&1 || { cat mpirun.out; fail "mpirun -np 1"; }
grep -q "comm_nccl\[rank 0 of 1\].*, 0 failed" mpirun.out || { cat mpirun.out; fail "mpirun -np 1"; }
echo "comm_nccl_gpu: ok (torchrun-style and mpirun -np 1)"
