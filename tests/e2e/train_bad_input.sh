#!/usr/bin/env bash
# e2e.train_bad_input: moe-train refuses bad input with exit 2 and a message that says what
# is wrong: vocabulary mismatch between data and model, seq_len above
# max_position_embeddings, bf16 AdamW moments with a beta above 0.99, split masters
# (optim.master split) under a recipe other than bf16, empty / missing /
# non-shard data, an unwritable run directory, device cuda without a GPU, a fresh run into a
# directory with checkpoints, bad options.
set -uo pipefail
src=${MOE_SRC_DIR:?}
# A shared 2-core box: no OpenMP spin-waiting, no BLAS threads beside OpenMP's (the tools
# choose the AVX-512 GEMM kernels themselves; see docs/performance.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fa=$src/data/lambda_virus.fa.gz
[ -f "$fa" ] || fa=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -f "$fa" ] || { echo "skip: lambda_virus.fa.gz not found (data/ or bowtie2-examples)"; exit 77; }
cfg=$src/configs/tiny.yaml
failures=0
# expect_fail NAME PATTERN CMD...: CMD must exit 2 and print PATTERN (grep -E) on stderr.
expect_fail() {
    local name=$1 pattern=$2; shift 2
    "$@" > out.txt 2> err.txt
    local rc=$?
    if [ $rc -ne 2 ] || ! grep -Eq -e "$pattern" err.txt; then
        echo "FAIL [$name]: exit $rc, stderr:"; cat err.txt; failures=$((failures + 1))
    else
        echo "ok [$name]: $(head -1 err.txt)"
    fi
}
rm -rf shards run*
moe-tokenize -q "$fa" -o shards/ || exit 1
moe-train -q -c "$cfg" --data shards -o run-ok train.steps=1 optim.warmup_steps=0 || exit 1

expect_fail vocab 'vocabulary size 256.*model.vocab_size=512' \
    moe-train -q -c "$cfg" --data shards -o run1 model.vocab_size=512
expect_fail seq_len 'train.seq_len \(2048\) exceeds model.max_position_embeddings \(1024\)' \
    moe-train -q -c "$cfg" --data shards -o run1 train.seq_len=2048
# in the file: the error names it and the line of optim.moments, and hints at fp32 moments
printf 'optim:\n  beta2: 0.999\n  moments: bf16\n' > moments.yaml
expect_fail bf16-moments-beta 'moments.yaml:3:3: optim.moments bf16 needs optim.beta2 <= 0.99, got 0.999' \
    moe-train -q -c moments.yaml --data shards -o run1
grep -q 'hint: use optim.moments: fp32' err.txt || { echo "FAIL [bf16-moments-beta]: no hint"; failures=$((failures + 1)); }
expect_fail bf16-moments-override "after override 'optim.moments=bf16'.*optim.beta1 <= 0.99, got 0.995" \
    moe-train -q -c "$cfg" --data shards -o run1 optim.beta1=0.995 optim.moments=bf16
# split masters are bf16 copies plus low bits: refused under the recipes without bf16 copies
# (tiny.yaml's fp32, fp8-block), naming the key, with a hint
for r in fp32 fp8-block; do
    expect_fail "split-master-$r" "optim.master split needs precision.recipe bf16, got $r" \
        moe-train -q -c "$cfg" --data shards -o run1 optim.master=split precision.recipe=$r
    grep -q 'hint: use optim.master: fp32' err.txt ||
        { echo "FAIL [split-master-$r]: no hint"; failures=$((failures + 1)); }
done
: > empty.mtok
expect_fail empty 'empty.mtok' moe-train -q -c "$cfg" --data empty.mtok -o run1
expect_fail missing 'no-such-shards' moe-train -q -c "$cfg" --data no-such-shards -o run1
echo "ACGT" > not-a-shard.mtok
expect_fail not-a-shard 'not-a-shard.mtok' moe-train -q -c "$cfg" --data not-a-shard.mtok -o run1
expect_fail too-short 'fewer than one sample' \
    moe-train -q -c "$cfg" --data shards -o run1 train.seq_len=65536 model.max_position_embeddings=65536 \
    train.global_batch_tokens=65536
expect_fail no-data 'no training data' moe-train -q -c "$cfg" -o run1
touch plainfile
expect_fail unwritable 'plainfile' moe-train -q -c "$cfg" --data shards -o plainfile/run
if [ "$(id -u)" -ne 0 ]; then
    mkdir -p ro && chmod 555 ro
    expect_fail read-only 'ro' moe-train -q -c "$cfg" --data shards -o ro/run
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    expect_fail cuda 'device: cuda' moe-train -q -c "$cfg" --data shards -o run1 device=cuda
fi
expect_fail existing-run 'already holds 1 checkpoint' \
    moe-train -q -c "$cfg" --data shards -o run-ok train.steps=1 optim.warmup_steps=0
expect_fail resume-missing 'run-none/ckpt-00000005' \
    moe-train -q -c "$cfg" --data shards -o run1 --resume run-none/ckpt-00000005
expect_fail model-changed 'model.hidden_size' \
    moe-train -q -c "$cfg" --data shards -o run-ok --resume auto train.steps=2 optim.warmup_steps=0 \
    model.hidden_size=32
expect_fail stop-at '--stop-at' moe-train -c "$cfg" --stop-at zero
expect_fail no-config 'config is required' moe-train --data shards
expect_fail stray-arg "unexpected argument 'extra'" moe-train -c "$cfg" extra
[ ! -e run1 ] || { echo "FAIL: a refused run left run1/ behind"; ls -la run1; failures=$((failures + 1)); }
[ $failures -eq 0 ] || { echo "$failures case(s) failed"; exit 1; }
echo "all bad-input cases refused"
