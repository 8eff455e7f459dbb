#!/usr/bin/env bash
# gpu_check.sh: the check that opens and closes every GPU session (docs/performance-gpu.md
# "Correctness"): build the tree on the GPU machine, run `ctest -L gpu`, and beside it
# compute-sanitizer memcheck over the op harness; logs and a summary under OUT_DIR.
#
#   bench/gpu_check.sh [BUILD_DIR] [OUT_DIR]      (defaults: build-gpu, $OUT or ./gpu-check)
#
# GPU_CHECK_J=N runs N gpu tests at once (ctest -j N; default 1). They are independent and
# one H200 holds several at once, so -j 4 brought the check from about 250 s to the
# longest test (132 s on 2026-12-02), for a session short of device time.
# GPU_CHECK_QUICK=1 leaves out the two longest tests (e2e.train_cuda_vs_cpu, 140-170 s, and
# e2e.score_hf_cuda, 60-90 s): about 40 s of tests after the build, for a session whose
# device time runs out; the summary says which were left out, and it is not the full check.
# Needs .deps/ (../shared/gpu/stage-deps.sh) in the checkout, as bench/gpu_build.sh does.
# Exit status: 0 when the build, every gpu test and memcheck passed; 1 otherwise, including
# when a gpu test skipped (no GPU: a skipped test is not a check) or compute-sanitizer is
# missing.
# The one thing to know: the build's environment (library paths of .deps/) must reach ctest,
# so the build is sourced in this shell, never in a subshell.
set -uo pipefail
build=${1:-build-gpu}
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the shared hosts
git log -1 --format='tree: %H %s' > "$out/tree.txt" 2>/dev/null || echo "tree: (not a git checkout)" > "$out/tree.txt"
git status --short >> "$out/tree.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
if ! source bench/gpu_build.sh "$build" > "$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    echo "gpu_check.sh: the build failed (log: $out/build.log)"
    exit 1
fi
ops="$build/tests/gpu_test_backend_ops"
( if command -v compute-sanitizer > /dev/null; then
      compute-sanitizer --tool memcheck --error-exitcode 3 "$ops" > "$out/memcheck.log" 2>&1
      echo "memcheck exit $?" >> "$out/memcheck.log"
  else
      echo "memcheck: compute-sanitizer not found (it comes with the CUDA toolkit)" > "$out/memcheck.log"
  fi ) &
mc=$!
quick=()
[ "${GPU_CHECK_QUICK:-0}" = 1 ] && quick=(-E 'e2e\.train_cuda_vs_cpu|e2e\.score_hf_cuda')
ctest --test-dir "$build" -L gpu "${quick[@]}" -j "${GPU_CHECK_J:-1}" --output-on-failure \
    > "$out/ctest-gpu.log" 2>&1
ct=$?
wait $mc
{
    cat "$out/tree.txt" "$out/gpu.txt"
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|tests failed' "$out/ctest-gpu.log"
    grep -E 'cases, .* failed|ERROR SUMMARY|memcheck' "$out/memcheck.log"
    [ ${#quick[@]} -eq 0 ] || echo "GPU_CHECK_QUICK: e2e.train_cuda_vs_cpu and e2e.score_hf_cuda left out"
} | tee "$out/summary.txt"
skipped=$(grep -c '\*\*\*Skipped' "$out/ctest-gpu.log")
[ "$skipped" -eq 0 ] || echo "gpu_check.sh: $skipped gpu tests skipped (no GPU, or a tool missing): not a check" | tee -a "$out/summary.txt"
grep -q 'memcheck exit 0' "$out/memcheck.log" && [ $ct -eq 0 ] && [ "$skipped" -eq 0 ]
