#!/usr/bin/env bash
# train_fp8_cpu: the fp8 recipes emulated on the CPU (ops_fp8.c, moe/quant.h) converge like
# bf16: configs/tiny.yaml on lambda (1 kb records, 20% held out) for 300 steps under bf16,
# fp8-block and mxfp8; the final validation loss of each fp8 recipe within 2% of bf16's and
# every logged loss finite. Also: fp8 runs are deterministic (the same recipe twice gives the
# same checkpoint bytes over a short run), precision.fp8_scale and precision.fp8_wgrad change
# the result (fp8_wgrad x-tiles only under fp8-block: exit 2 under mxfp8), precision.skip_layers
# is applied and logged, mxfp8 says at start-up what it does, and --dry-run accepts the recipes
# and shows mxfp8's smaller activations.
set -euo pipefail
src=${MOE_SRC_DIR:?}
source "$src/tests/interop/lambda_1kb.sh"
source "$src/tests/interop/fp8_converges.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf shards run-*
moe-tokenize -q lambda_1kb.fa --val-fraction 0.2 -o shards/
common=(-c "$src/configs/tiny.yaml" --data shards device=cpu train.steps=300 train.eval_every=300
        checkpoint.every=300 log.every=1)
for r in bf16 fp8-block mxfp8; do
    moe-train -q "${common[@]}" precision.recipe=$r -o "run-$r"
done
fp8_converges fp8-block mxfp8
# deterministic: the same fp8 run twice gives the same bytes
short=(-c "$src/configs/tiny.yaml" --data shards device=cpu train.steps=12 optim.warmup_steps=2
       train.eval_every=0 checkpoint.every=12 precision.recipe=mxfp8)
moe-train -q "${short[@]}" -o run-a
moe-train -q "${short[@]}" -o run-b
cmp run-a/ckpt-00000012/model.safetensors run-b/ckpt-00000012/model.safetensors || fail "mxfp8 is not deterministic"
# precision.fp8_scale: the other scale rule of each recipe trains and changes the result
moe-train -q "${short[@]}" precision.fp8_scale=ocp-floor -o run-floor
moe-train -q "${short[@]}" precision.recipe=fp8-block -o run-amax
moe-train -q "${short[@]}" precision.recipe=fp8-block precision.fp8_scale=pow2 -o run-pow2
# precision.fp8_wgrad x-tiles: the wgrad's x in tiles changes the result too
moe-train "${short[@]}" precision.recipe=fp8-block precision.fp8_wgrad=x-tiles -o run-xtiles \
    2> xtiles.log
grep -q "precision: fp8-block takes the weight gradients' activations in 128 x 128 tiles" \
    xtiles.log || { cat xtiles.log; fail "no x-tiles start-up line"; }
for pair in "run-a run-floor" "run-amax run-pow2" "run-amax run-xtiles"; do
    set -- $pair
    ! cmp -s "$1/ckpt-00000012/model.safetensors" "$2/ckpt-00000012/model.safetensors" \
        || fail "$2: its precision option changed nothing"
done
# an option of fp8-block alone: a clear error, exit 2
set +e
moe-train "${short[@]}" precision.fp8_wgrad=x-tiles -o run-bad 2> bad.log
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "precision.fp8_wgrad" bad.log ||
    { cat bad.log; fail "x-tiles under mxfp8: rc $rc"; }
# precision.skip_layers: named in the log, trains
moe-train "${short[@]}" train.steps=2 checkpoint.every=2 precision.skip_layers=0,-1 -o run-skip \
    2> skip.log
grep -q "precision: layers 0,1 stay bf16 under mxfp8" skip.log \
    || { cat skip.log; fail "no skip_layers log line"; }
grep -q "precision: mxfp8 runs its products on E4M3 values .*(emulated by the cpu backend)" \
    skip.log || { cat skip.log; fail "no mxfp8 start-up line"; }
moe-train -c "$src/configs/tiny.yaml" --dry-run precision.recipe=fp8-block > dry.txt
grep -q "recipe: fp8-block" dry.txt || fail "--dry-run does not show the fp8-block recipe"
# mxfp8 stores the expert activations in MXFP8: --dry-run's activations below bf16's
acts() { moe-train -c "$src/configs/tiny.yaml" --dry-run precision.recipe=$1 |
    sed -n 's/.* activations \([0-9.]*\) MiB .*/\1/p'; }
a16=$(acts bf16) a8=$(acts mxfp8)
[ -n "$a16" ] && [ -n "$a8" ] || fail "no activations in MiB in --dry-run's estimate"
awk -v a="$a8" -v b="$a16" 'BEGIN { exit !(a < 0.9 * b) }' ||
    fail "mxfp8 activations $a8 MiB are not below bf16's $a16 MiB"
echo "train_fp8_cpu: ok"
