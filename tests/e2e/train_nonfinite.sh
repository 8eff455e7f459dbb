#!/usr/bin/env bash
# e2e.train_nonfinite: non-finite values never pass silently. A checkpoint with a NaN weight
# (made through to-hf / from-hf, so its MANIFEST is right): moe-convert inspect counts the
# NaN (and the Inf of a file made here) per tensor; moe-embed refuses to write NaN
# vectors (exit 1, naming the first bad row, no output file); moe-train resumed from it skips
# train.max_bad_steps steps and then stops (exit 1) without blaming the learning rate, also
# when stopped and resumed between the skipped steps (the count is in the checkpoint). A
# learning rate far too high (optim.lr=10, no clipping) gets a loss-spike warning that does.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh" # trains ./run, sets LAMBDA, CKPT and PY
[ -n "$PY" ] || { echo "SKIP: no python3"; exit 77; }
moe-convert -q to-hf "$CKPT" hf
PYTHONPATH="$INTEROP" "$PY" - hf/model.safetensors <<'PY'
import struct, sys, st_tool
t, meta = st_tool.read(sys.argv[1])
dt, shape, b = t["model.norm.weight"]
t["model.norm.weight"] = (dt, shape, struct.pack("<f", float("nan")) + b[4:])
st_tool.write(sys.argv[1], t, meta)
PY
moe-convert -q from-hf hf nan
# inspect counts NaN and Inf per tensor (RMS and max |x| are of the finite values)
moe-convert inspect nan > inspect.txt
grep -Eq "^  model.norm.weight +F32 +\[32\] +[0-9.e+-]+ +[0-9.e+-]+ +1 +0$" inspect.txt ||
    fail "inspect: no NaN count for model.norm.weight: $(grep norm.weight inspect.txt)"
grep -q "^non-finite: 1 NaN and 0 Inf values in 1 tensors (the first: model.norm.weight)" \
    inspect.txt || fail "inspect: no non-finite summary: $(tail -2 inspect.txt)"
PYTHONPATH="$INTEROP" "$PY" - odd.safetensors <<'PY'
import struct, sys, st_tool
inf, nan = float("inf"), float("nan")
st_tool.write(sys.argv[1], {"x": ("F32", [5], struct.pack("<5f", nan, inf, -inf, -2.0, 1.0)),
                            "y": ("F32", [2], struct.pack("<2f", 3.0, 4.0))}, {})
PY
moe-convert inspect odd.safetensors > odd.txt
grep -Eq "^  x +F32 +\[5\] +1.58114 +2 +1 +2$" odd.txt || fail "inspect x: $(grep '^  x' odd.txt)"
grep -Eq "^  y +F32 +\[2\] +3.53553 +4 +0 +0$" odd.txt || fail "inspect y: $(grep '^  y' odd.txt)"
grep -q "^non-finite: 1 NaN and 2 Inf values in 1 tensors (the first: x)" odd.txt ||
    fail "inspect: $(tail -1 odd.txt)"
moe-convert inspect "$CKPT" | grep -q "^non-finite: none$" || fail "inspect: a healthy checkpoint"
printf '>first\nACGTACGTACGTAAAC\n>second\nGGGCCCAATTACGTTGCA\n' > seqs.fa
expect 1 "row 0 \(first\) has a non-finite value nan in column 0: no output is written" -- \
  moe-embed -q -m nan seqs.fa -o e.npy
grep -q "weights hold NaN" err.txt || fail "moe-embed: no hint about the weights"
[ ! -e e.npy ] && [ ! -e e.ids.tsv ] || fail "moe-embed left output files"
expect 1 "row 0 \(first\)" -- moe-embed -q -m nan seqs.fa # TSV on stdout too
moe-embed -q -m "$CKPT" seqs.fa -o good.npy # the healthy checkpoint still embeds

train() { # train RUN [overrides...]
  local run=$1; shift
  moe-train -c "${MOE_SRC_DIR}/configs/tiny.yaml" --data run.mtok -o "$run" train.steps=6 \
    optim.warmup_steps=1 train.seq_len=128 train.global_batch_tokens=512 model.hidden_size=32 \
    model.intermediate_size=48 model.vocab_size=40 model.max_position_embeddings=256 \
    checkpoint.every=0 log.every=1 train.eval_every=0 "$@"
}
expect 1 "diverged at step 4: loss nan.*4 non-finite steps in a row, train.max_bad_steps=3" -- \
  train bad --resume nan
[ "$(grep -c 'the update is skipped' err.txt)" -eq 3 ] || fail "not 3 skipped steps: $(cat err.txt)"
grep -q "learning rate is an unlikely cause" err.txt || fail "wrong hint: $(cat err.txt)"
grep -q "lower optim.lr" err.txt && fail "the lr hint for NaN weights: $(cat err.txt)"
expect 1 "diverged at step 1.*train.max_bad_steps=0" -- train bad0 --resume nan train.max_bad_steps=0
# stopped after 2 skipped steps and resumed: the count goes on from 2 (trainer_state.json
# "health"), so the run stops at step 4 like the uninterrupted one, not at step 6
expect 0 "2 in a row" -- train split --resume nan --stop-at 2
grep -q '"bad_steps_in_row": 2' split/ckpt-00000002/trainer_state.json ||
    fail "the checkpoint does not carry the 2 skipped steps: $(cat split/ckpt-00000002/trainer_state.json)"
expect 1 "diverged at step 4: loss nan.*4 non-finite steps in a row" -- train split --resume auto
[ "$(grep -c 'the update is skipped' err.txt)" -eq 1 ] || fail "resumed: not 1 more skipped step: $(cat err.txt)"

# far too high a learning rate: the run ends, but not silently
expect 0 "loss spike: .*lower optim.lr" -- train hot optim.lr=10 optim.grad_clip=0 train.steps=30
train calm > /dev/null 2> calm.err
grep -q "loss spike" calm.err && fail "a spike warning for a healthy run: $(cat calm.err)"
echo "ok: non-finite embeddings refused, non-finite steps skipped then stopped, spike warned"
