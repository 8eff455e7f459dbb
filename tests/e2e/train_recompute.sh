#!/usr/bin/env bash
# e2e.train_recompute: train.recompute through moe-train on the CPU. Runs of 4 steps (two
# micro-steps each) with recompute none, attn, moe and full end with bit-identical weights and
# optimizer state and the same per-step losses (the layer recomputation repeats deterministic
# ops), and --dry-run's memory estimate shrinks from none to full.
set -euo pipefail
src=${MOE_SRC_DIR:?}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
source "$src/tests/interop/lambda_1kb.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf shards rc-*
moe-tokenize -q lambda_1kb.fa -o shards/
train() {
    moe-train -q -@ 2 -c "$src/configs/tiny.yaml" --data shards train.steps=4 train.seq_len=128 \
        train.global_batch_tokens=512 train.micro_batch_tokens=256 optim.warmup_steps=1 \
        train.eval_every=0 train.eval_tokens=256 checkpoint.every=4 checkpoint.keep=0 "$@"
}
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
prev=""
for r in none attn moe full; do
    train -o rc-$r train.recompute=$r
    [ "$(losses rc-$r | wc -l)" -eq 4 ] || fail "recompute $r: $(losses rc-$r | wc -l) metrics lines"
    if [ $r != none ]; then
        diff <(losses rc-none) <(losses rc-$r) || fail "recompute $r: per-step losses differ from none"
        for f in model.safetensors optimizer-rank0.safetensors; do
            cmp rc-none/ckpt-00000004/$f rc-$r/ckpt-00000004/$f || fail "recompute $r: $f differs from none"
        done
    fi
    # activation bytes from --dry-run: "activations <n> <unit> (train.recompute <mode>)"
    act=$(moe-train -c "$src/configs/L0_sanity.yaml" --dry-run train.recompute=$r |
        sed -n 's/.* activations \([0-9.]*\) \([KMG]i\)B (train.recompute '$r').*/\1 \2/p')
    [ -n "$act" ] || fail "--dry-run printed no activation estimate for recompute $r"
    echo "recompute $r: L0_sanity activations ${act}B"
    mib=$(echo "$act" | awk '{v = $1; if ($2 == "Ki") v /= 1024; if ($2 == "Gi") v *= 1024; print v}')
    if [ -n "$prev" ]; then
        awk -v a="$mib" -v b="$prev" 'BEGIN {exit !(a < b)}' || fail "recompute $r does not lower the estimate ($mib MiB vs $prev MiB)"
    fi
    prev=$mib
done
echo "recompute none/attn/moe/full: identical losses, weights and optimizer state"
