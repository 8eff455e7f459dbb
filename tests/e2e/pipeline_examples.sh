#!/usr/bin/env bash
# pipeline_examples.sh: the two documented shell examples in pipelines/examples/ run as written:
# stream_train.sh (moe-tokenize ... -o - | moe-train --data - ...) trains a short run on lambda
# phage, must give the same metrics as training from a shard file, and embed_bam_region.sh
# embeds the reads of one region of htslib's indexed test BAM with that model: one row per
# read that samtools counts in the region with the same filters.
# The one thing to know: both examples are run from the checkout unchanged; only their
# arguments (and MOE_BUILD_DIR, to find the tools) differ from a user's call.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
# ctest runs tests side by side on few cores: OpenMP threads that spin while waiting slow
# every job down several-fold there, sleeping ones do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
lambda=$src/data/lambda_virus.fa.gz
[ -r "$lambda" ] || lambda=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -r "$lambda" ] || { echo "SKIP: no lambda genome (data/ or bowtie2-examples)"; exit 77; }
bam=/usr/share/htslib-test/test/range.bam
[ -r "$bam" ] && [ -r "$bam.bai" ] || { echo "SKIP: htslib-test's range.bam(.bai) missing (make deps)"; exit 77; }
command -v samtools >/dev/null || { echo "SKIP: samtools is not installed (make deps)"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf piped filed reads.* shard.mtok
short="train.steps=6 optim.warmup_steps=2 train.global_batch_tokens=1024 checkpoint.every=0"

# shellcheck disable=SC2086
"$src/pipelines/examples/stream_train.sh" "$lambda" piped $short 2>stream.err ||
    { tail -n 20 stream.err; fail "stream_train.sh"; }
grep -q '^\$ moe-tokenize .* -o - | moe-train .* --data - ' stream.err || fail "stream command not printed"
[ -s piped/latest ] && [ -s piped/metrics.jsonl ] || fail "stream_train.sh wrote no run"
# The pipe is the file: same shard bytes, same run (metrics without timing fields).
moe-tokenize "$lambda" -o shard.mtok 2>/dev/null
# shellcheck disable=SC2086
moe-train -c "$src/configs/tiny.yaml" --data shard.mtok -o filed $short 2>/dev/null
strip() { sed -E 's/,"(tokens_per_s|step_time_s|time|elapsed_s)":[^,}]*//g' "$1"; }
diff <(strip piped/metrics.jsonl) <(strip filed/metrics.jsonl) >/dev/null ||
    fail "training from the pipe differs from training from the shard file"

region=CHROMOSOME_II
"$src/pipelines/examples/embed_bam_region.sh" piped "$bam" "$region" reads.npy 2>embed.err ||
    { tail -n 20 embed.err; fail "embed_bam_region.sh"; }
want=$(samtools view -c -F 0xF00 "$bam" "$region")
got=$(($(wc -l <reads.ids.tsv) - 2))
[ "$want" -gt 0 ] && [ "$got" = "$want" ] || fail "reads.ids.tsv has $got rows, samtools counts $want"
rows=$(head -c 128 reads.npy | tr -d '\0' | grep -ao "'shape': ([0-9]*" | grep -o '[0-9]*$')
[ "$rows" = "$want" ] || fail "reads.npy has $rows rows, expected $want"
echo "PASS pipeline_examples"
