#!/usr/bin/env bash
# grouped_gpu.sh: issue 12's grouped expert product against torch._grouped_mm, in one go on
# one GPU: the op harness's forward grouped cases (both presets' gate-up and down products,
# even and uneven counts: `gpu_test_backend_ops --perf --only "grouped bf16"`), then
# bench/grouped_torch.py runs torch._grouped_mm on the same shapes and counts and prints one
# table with the ratio ours / torch (time, so > 1 means ours is faster).
#
#   bench/grouped_gpu.sh [BUILD_DIR]        (default build-gpu; run from the checkout root)
#
# The one thing to know: the ratio is only meaningful when both ran in the same call on the
# same GPU, which is why they are in one script.
set -uo pipefail
build=${1:-build-gpu}
ops="$build/tests/gpu_test_backend_ops"
if [ ! -x "$ops" ]; then
    echo "grouped_gpu.sh: $ops not found; build first (source bench/gpu_build.sh $build)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
"$ops" --perf --only "grouped bf16" | tee "$tmp/ours.txt" || exit 1
python3 "$(dirname "$0")/grouped_torch.py" "$tmp/ours.txt"
