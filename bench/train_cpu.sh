#!/usr/bin/env bash
# bench/train_cpu.sh: CPU training throughput of moe-train - tokens/s and achieved GFLOP/s
# for the tiny and L0_sanity configs on the lambda phage genome.
#
# Usage: bench/train_cpu.sh [BUILD_DIR] (default: build). Env: THREADS (default: nproc),
# TINY_STEPS (default 20), L0_STEPS (default 4), L0_BATCH_TOKENS (default 4096: the config's
# 16384-token batch takes minutes per step on a small CPU; the per-token cost is the same).
# The first step (allocation, page faults) is excluded; the figure is the median of the
# remaining steps' tokens_per_s from metrics.jsonl. GFLOP/s = tokens/s x training FLOPs per
# token as printed by `moe-train --dry-run` (6 x matmul weights touched per token + causal
# attention, see docs/training.md). Prints one Markdown table row per config.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
threads=${THREADS:-$(nproc)}
tiny_steps=${TINY_STEPS:-20}
l0_steps=${L0_STEPS:-4}
l0_batch=${L0_BATCH_TOKENS:-4096}
fa=$here/data/lambda_virus.fa.gz
[ -f "$fa" ] || fa=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -x "$build/moe-train" ] || { echo "bench/train_cpu.sh: $build/moe-train not built" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-bench-train.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
gzip -dc "$fa" | awk '/^>/ {next} {s = s $0}
    END {for (i = 1; i <= length(s); i += 1000) printf(">lambda_%d\n%s\n", (i - 1) / 1000 + 1, substr(s, i, 1000))}' \
    > lambda_1kb.fa
"$build/moe-tokenize" -q lambda_1kb.fa -o shards/  # no validation split: no evaluation cost

# bench NAME CONFIG STEPS OVERRIDES...
bench() {
    local name=$1 cfg=$2 steps=$3; shift 3
    local fpt tps
    fpt=$("$build/moe-train" -c "$cfg" "$@" --dry-run | sed -n 's/^# training FLOPs: \([^ ]*\) per token.*/\1/p')
    "$build/moe-train" -q -@ "$threads" -c "$cfg" --data shards -o "run-$name" train.steps="$steps" \
        optim.warmup_steps=1 checkpoint.every=0 "$@" 2> "run-$name.err" ||
        { cat "run-$name.err" >&2; return 1; }
    tps=$(tail -n +2 "run-$name/metrics.jsonl" | sed -n 's/.*"tokens_per_s":\([0-9.eE+-]*\).*/\1/p' | sort -g |
          awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    local tokens_per_step
    tokens_per_step=$(sed -n 's/.*"tokens":\([0-9]*\).*/\1/p' "run-$name/metrics.jsonl" | head -1)
    awk -v n="$name" -v s="$steps" -v b="$tokens_per_step" -v t="$tps" -v f="$fpt" -v th="$threads" \
        'BEGIN { printf("| %s | %d | %d | %d | %.0f | %.3g | %.2f |\n", n, th, s, b, t, f, t * f / 1e9) }'
}
echo "| config | threads | steps | tokens/step | tokens/s | FLOPs/token | GFLOP/s |"
echo "|---|---|---|---|---|---|---|"
bench tiny "$here/configs/tiny.yaml" "$tiny_steps"
bench L0_sanity "$here/configs/L0_sanity.yaml" "$l0_steps" train.global_batch_tokens="$l0_batch" \
    train.micro_batch_tokens=0
