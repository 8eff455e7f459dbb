#!/usr/bin/env bash
# e2e.train_fp8_gpu: fp8-block and mxfp8 on the GPU converge like bf16 (issue 14's GPU
# convergence check; e2e.train_fp8_cpu is the CPU emulation's): configs/L0_sanity.yaml on the
# C. elegans excerpts of data/ce_excerpts.fa.gz (htslib's test/ce.fa, 1.06 Mb, cut into 1 kb
# records, 20% held out), 300 steps of 4,096 tokens (about 1.4 passes over the training records)
# with device=cuda under bf16, fp8-block, fp8-block with precision.fp8_wgrad x-tiles and
# mxfp8, same seed and data order; the final validation loss of each fp8 run within 2% of
# bf16's, every logged loss finite, and the loss fallen. Not
# lambda: its 39 kb of training records are seen 125 times in 300 steps of 16,384 tokens, the
# model memorises them and the validation loss climbs to about the uniform ln 256 = 5.55 (seen
# on the H200, 2026-12-02: bf16 5.25, fp8-block 5.72), so it measured overfitting. Skipped (77)
# where no NVIDIA GPU is visible, as in CI.
set -euo pipefail
src=${MOE_SRC_DIR:?}
if ! nvidia-smi -L >/dev/null 2>&1; then echo "skip: no CUDA device (nvidia-smi -L failed)"; exit 77; fi
source "$src/tests/interop/records_1kb.sh"
source "$src/tests/interop/fp8_converges.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf shards run-*
records_1kb "$src/data/ce_excerpts.fa.gz" ce ce_1kb.fa
moe-tokenize -q ce_1kb.fa --val-fraction 0.2 -o shards/
common=(-c "$src/configs/L0_sanity.yaml" --data shards device=cuda train.steps=300
        train.global_batch_tokens=4096 train.eval_every=300 checkpoint.every=300 log.every=1)
recipes=(bf16 fp8-block mxfp8)
for r in "${recipes[@]}"; do
    moe-train -q "${common[@]}" precision.recipe=$r -o "run-$r"
done
moe-train -q "${common[@]}" precision.recipe=fp8-block precision.fp8_wgrad=x-tiles -o run-xtiles
recipes+=(xtiles)
fp8_converges fp8-block mxfp8 xtiles
for r in "${recipes[@]}"; do
    # awk reads the whole file (no early-exiting reader on a pipe: SIGPIPE under pipefail)
    awk -F'"loss":' 'NF > 1 { split($2, v, ","); if (n++ == 0) first = v[1]; last = v[1] }
        END { exit !(last < first) }' "run-$r/metrics.jsonl" || fail "$r: the loss did not fall"
done
echo "train_fp8_gpu: ok"
