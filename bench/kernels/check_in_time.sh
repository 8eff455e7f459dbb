#!/usr/bin/env bash
# check_in_time.sh: as much of a GPU check of one tree as fits BUDGET seconds, for a call whose
# device time was cut short (failed starts cost 75-180 s of a session's 1,800 each: 2026-12-06
# ended twice with too little left for the planned calls). The steps run in value order, each
# only where its expected cost still fits the time left, so that a call of any length ends
# with whole results; a step that does not fit is reported as left out, never run in part.
#   1. build the tree's GPU test binaries (gpu_test_backend_ops, gpu_test_quant_operands,
#      gpu_test_model_cuda; COST_BUILD, default 150 s on the 16-core machine)
#   2. run them: every op case against the CPU reference, the fp8 operands and pairs byte for
#      byte, the model's steps against the CPU's (COST_TESTS, 60 s)
#   3. bench/gpu_check.sh on the same build: the remaining targets, `ctest -L gpu` and
#      memcheck (COST_CHECK, 330 s with GPU_CHECK_J=8)
#   4. bench/attention_sdpa.py: our attention against PyTorch's SDPA in the same call
#      (COST_SDPA, 240 s)
# One line a step on stdout, logs under OUT_DIR. TREE: a tar of a tree (prepare_ab.sh's) or a
# directory. Run from the checkout's root on the GPU machine, after `source .deps/env.sh` and
# `export CFLAGS="-isystem $PWD/.deps/root/usr/include"` (as for ab_revs.sh). Exit status 0
# when every step ran and passed, 1 otherwise (a step left out included).
#
#   BUDGET=380 bench/kernels/check_in_time.sh /tmp/cit "$OUT/cit" work/ab/3-bf5393b.tar
set -uo pipefail
work=${1:?usage: check_in_time.sh WORK_DIR OUT_DIR TREE}
out=${2:?usage: check_in_time.sh WORK_DIR OUT_DIR TREE}
tree=${3:?usage: check_in_time.sh WORK_DIR OUT_DIR TREE}
root=$PWD
budget=${BUDGET:-540}
t0=$(date +%s)
mkdir -p "$work" "$out"
work=$(cd "$work" && pwd)
out=$(cd "$out" && pwd)
src=$work/src build=$work/build
fail=0
left() { echo $((budget - ($(date +%s) - t0))); }
# fits STEP COST: whether COST seconds are left for STEP; reports it left out otherwise
fits() {
    [ "$(left)" -ge "$2" ] && return 0
    echo "$1: LEFT OUT ($(left) s left, about $2 s needed)"
    fail=1
    return 1
}
# built STEP [BINARY]: whether BINARY (default the op harness) was built; reports STEP left out
# otherwise
built() {
    [ -x "${2:-$build/tests/gpu_test_backend_ops}" ] && return 0
    echo "$1: LEFT OUT (not built)"
    fail=1
    return 1
}
# outcome STEP STATUS LOG: one line for a step that ran
outcome() {
    if [ "$2" -eq 0 ]; then echo "$1: passed ($(($(date +%s) - t0)) s in)"; else
        echo "$1: FAILED, exit $2 (see $3)"
        fail=1
    fi
}

rm -rf "$src" "$build" && mkdir -p "$src"
if [ -d "$tree" ]; then cp -r "$tree"/. "$src"; else tar -xf "$tree" -C "$src" || exit 2; fi
ln -sfn "$root/.deps" "$src/.deps"
if fits build "${COST_BUILD:-150}"; then
    log=$out/build.log
    timeout "$(left)" bash -c "cmake -S '$src' -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build '$build' -j\$(nproc) --target \
        gpu_test_backend_ops gpu_test_quant_operands gpu_test_model_cuda" > "$log" 2>&1
    outcome build $? "$log"
fi
for t in quant_operands model_cuda backend_ops; do
    built "gpu_test_$t" "$build/tests/gpu_test_$t" || continue
    fits "gpu_test_$t" $(((${COST_TESTS:-60} + 2) / 3)) || continue
    log=$out/$t.log
    timeout "$(left)" "$build/tests/gpu_test_$t" > "$log" 2>&1
    st=$?
    if [ $st -eq 77 ]; then
        echo "gpu_test_$t: SKIPPED (no GPU: not a check)"
        fail=1
        continue
    fi
    outcome "gpu_test_$t" $st "$log"
done
if built gpu_check && fits gpu_check "${COST_CHECK:-330}"; then
    (cd "$src" && GPU_CHECK_J=${GPU_CHECK_J:-8} timeout "$(left)" bash bench/gpu_check.sh \
        "$build" "$out/check" > "$out/check.log" 2>&1)
    outcome "gpu_check ($out/check/summary.txt)" $? "$out/check.log"
fi
if built attention_sdpa && fits attention_sdpa "${COST_SDPA:-240}"; then
    (cd "$src" && timeout "$(left)" env PYTHONUNBUFFERED=1 python3 bench/attention_sdpa.py \
        "$build" > "$out/sdpa.md" 2>&1)
    outcome "attention_sdpa ($out/sdpa.md)" $? "$out/sdpa.md"
fi
echo "check_in_time.sh: $(($(date +%s) - t0)) s of $budget"
exit $fail
