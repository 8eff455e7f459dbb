#!/usr/bin/env bash
# e2e.train_document_mask: train.document_mask through moe-train on the CPU. The lambda phage
# genome cut into 200 bp records packs about one document boundary into every 128-token
# sample; 3 steps with the mask on (the default) and off must give different per-step losses
# and weights (the trainer hands the tokenizer's EOS to the loader and the model), the same
# setting twice the same bytes, and each checkpoint's resolved config.yaml records its
# setting.
set -euo pipefail
src=${MOE_SRC_DIR:?}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
source "$src/tests/interop/lambda_1kb.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf shards dm-*
awk '/^>/ {next} {s = s $0} END {for (i = 1; i + 199 <= length(s); i += 200)
     printf(">r%d\n%s\n", i, substr(s, i, 200))}' lambda_1kb.fa > lambda_200.fa
moe-tokenize -q lambda_200.fa -o shards/
train() {
    moe-train -q -c "$src/configs/tiny.yaml" --data shards train.steps=3 train.seq_len=128 \
        train.global_batch_tokens=512 optim.warmup_steps=1 train.eval_every=0 \
        train.eval_tokens=256 checkpoint.every=3 checkpoint.keep=0 "$@"
}
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
train -o dm-on
train -o dm-on2 train.document_mask=true
train -o dm-off train.document_mask=false
[ "$(losses dm-on | wc -l)" -eq 3 ] || fail "expected 3 metrics lines, got $(losses dm-on | wc -l)"
cmp dm-on/ckpt-00000003/model.safetensors dm-on2/ckpt-00000003/model.safetensors \
    || fail "the default and train.document_mask=true differ"
if diff -q <(losses dm-on) <(losses dm-off) > /dev/null; then
    fail "train.document_mask=false gave the same losses as the mask"
fi
cmp -s dm-on/ckpt-00000003/model.safetensors dm-off/ckpt-00000003/model.safetensors \
    && fail "train.document_mask=false gave the same weights as the mask"
grep -q '^  document_mask: true$' dm-on/ckpt-00000003/config.yaml \
    || fail "config.yaml of the masked run does not say document_mask: true"
grep -q '^  document_mask: false$' dm-off/ckpt-00000003/config.yaml \
    || fail "config.yaml of the unmasked run does not say document_mask: false"
paste <(losses dm-on) <(losses dm-off) | awk '{print "step " $1 ": loss with mask " $2 ", without " $4}'
echo "ok"
