#!/usr/bin/env bash
# e2e.train_resume: exact resume on the CPU. A run of 2N steps and the same run stopped with
# --stop-at N and continued with --resume auto end with bit-identical weights and optimizer
# state and the same per-step losses (also under fp8-block, whose weight copies the resumed
# run makes again); --resume DIR restarts from an older checkpoint and
# reaches the same bytes again; a checkpoint with a flipped byte is refused naming the file.
set -euo pipefail
src=${MOE_SRC_DIR:?}
# A shared 2-core box: no OpenMP spin-waiting, no BLAS threads beside OpenMP's (the tools
# choose the AVX-512 GEMM kernels themselves; see docs/performance.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
source "$src/tests/interop/lambda_1kb.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf shards full split older full8 split8
moe-tokenize -q lambda_1kb.fa --val-fraction 0.2 -o shards/
# 4 sequences of 128 tokens per step in 2 micro-steps (gradient accumulation), evaluation
# and checkpoints at odd places, a cosine schedule that depends on train.steps.
train() {
    moe-train -q -@ 2 -c "$src/configs/tiny.yaml" --data shards train.steps=8 train.seq_len=128 \
        train.global_batch_tokens=512 train.micro_batch_tokens=256 optim.warmup_steps=2 \
        train.eval_every=3 train.eval_tokens=512 checkpoint.every=2 checkpoint.keep=0 "$@"
}
train -o full
train -o split --stop-at 4
[ "$(cat split/latest)" = ckpt-00000004 ] || fail "--stop-at 4 did not end with ckpt-00000004"
[ ! -e split/ckpt-00000006 ] || fail "--stop-at 4 ran past step 4"
train -o split --resume auto

losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
[ "$(losses full | wc -l)" -eq 8 ] || fail "full run: $(losses full | wc -l) metrics lines"
diff <(losses full) <(losses split) || fail "per-step losses differ after resume"
# provenance: one @PG line per invocation, the resumed one naming its checkpoint
[ "$(sed 's/.*	DS:[^ ]* //' split/provenance.txt)" = "start step 0
start step 4 resuming ckpt-00000004" ] || { cat split/provenance.txt; fail "split/provenance.txt"; }
for f in model.safetensors optimizer-rank0.safetensors; do
    cmp full/ckpt-00000008/$f split/ckpt-00000008/$f || fail "$f differs after resume"
done
cmp <(grep -v tokens_per_s full/ckpt-00000008/trainer_state.json | grep -v step_time_s | grep -v -e '"time"' -e elapsed_s) \
    <(grep -v tokens_per_s split/ckpt-00000008/trainer_state.json | grep -v step_time_s | grep -v -e '"time"' -e elapsed_s) ||
    fail "trainer_state.json differs after resume"

# --resume DIR from an older checkpoint, into another run directory.
train -o older --resume split/ckpt-00000002
cmp full/ckpt-00000008/model.safetensors older/ckpt-00000008/model.safetensors ||
    fail "resume from ckpt-00000002 did not reproduce the weights"

# fp8-block (pow2 scales, the last layer kept in bf16): the e4m3 weight copies are not in the
# checkpoint, the resumed run quantizes them again from the restored masters; the same bytes.
fp8=(precision.recipe=fp8-block precision.fp8_scale=pow2 precision.skip_layers=-1)
train -o full8 "${fp8[@]}"
train -o split8 "${fp8[@]}" --stop-at 4
train -o split8 "${fp8[@]}" --resume auto
diff <(losses full8) <(losses split8) || fail "fp8-block: per-step losses differ after resume"
for f in model.safetensors optimizer-rank0.safetensors; do
    cmp full8/ckpt-00000008/$f split8/ckpt-00000008/$f || fail "fp8-block: $f differs after resume"
done

# --resume auto on a finished run: nothing to do, exit 0.
train -o full --resume auto

# A flipped byte in a checkpoint file: refused, naming the file, exit 2.
printf '\x55' | dd of=split/ckpt-00000008/optimizer-rank0.safetensors bs=1 seek=4000 conv=notrunc 2>/dev/null
set +e
train -o split --resume auto train.steps=10 2> corrupt.err
rc=$?
set -e
cat corrupt.err
[ $rc -eq 2 ] || fail "corrupted checkpoint: exit $rc, expected 2"
grep -q 'ckpt-00000008/optimizer-rank0.safetensors' corrupt.err || fail "error does not name the file"
grep -q 'older checkpoint' corrupt.err || fail "no hint to use an older checkpoint"
echo "ok"
