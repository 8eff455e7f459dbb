#!/usr/bin/env bash
# parallel_gpu.sh: issue 16's benchmark - data and expert parallelism against one GPU, at the
# same tokens per GPU. Three runs of moe-train on the same shards: one GPU (one micro-batch of
# MICRO tokens a step), then 2 ranks with parallel.dp=2 and with parallel.ep=2 (2 x MICRO
# tokens a step, one micro-batch a rank), each launched by mpirun. Per run, the median over
# the steps after the first of metrics.jsonl's tokens_per_s divided by the ranks (tokens/s per
# GPU), its ratio to one GPU's (issue 16's goal: >= 0.95), and from rank 0's comm_s,
# alltoall_s and alltoall_GBps: the time in collectives a step, the expert all-to-alls' time
# per layer and their bandwidth (against the 281 GB/s all-to-all bus bandwidth of two H200s
# for 256 MiB in ../shared/anchors/). No exchange overlaps compute yet, so none of that time
# is hidden. One Markdown table.
#
#   bench/parallel_gpu.sh [BUILD_DIR]       (default build-gpu; run from the checkout root)
#
# Environment: CONFIG (default configs/mixtral_8x7b.yaml with LAYERS layers, default 2: the
# mixtral8x7b-2L preset's shapes), MICRO (tokens a micro-batch, default 8192: 2 sequences of
# 4096), STEPS (default 6), DEVICE (default cuda; cpu runs the same three runs on CPU ranks,
# which is how this script is checked without GPUs), RANKS (default 2), THREADS (moe-train -@,
# default: cores / ranks). parallel.ep > 1 on GPUs needs the expert-parallel exchange on GPUs
# (8bb7af6, reverted on main until it has run on two GPUs: restore it first). Keep
# NCCL_NVLS_ENABLE=0 on the GPU machines (KINDS.md).
set -euo pipefail
build=$(cd "${1:-build-gpu}" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
config=${CONFIG:-$here/configs/mixtral_8x7b.yaml}
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
layers=${LAYERS:-2}
micro=${MICRO:-8192}
steps=${STEPS:-6}
device=${DEVICE:-cuda}
ranks=${RANKS:-2}
threads=${THREADS:-$(($(nproc) / ranks > 0 ? $(nproc) / ranks : 1))}
[ -x "$build/moe-train" ] || { echo "parallel_gpu.sh: $build/moe-train not built" >&2; exit 2; }
command -v mpirun > /dev/null || { echo "parallel_gpu.sh: needs mpirun" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-bench-parallel.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

# random bases, enough for every run's steps (the runs read their own micro-batches)
need=$((micro * ranks * (steps + 1) * 2))
awk -v n="$need" 'BEGIN {srand(16); s = "ACGT"; for (r = 0; r * 4096 < n; r++) {
    printf(">r%d\n", r); for (i = 0; i < 4096; i++) printf("%s", substr(s, int(rand() * 4) + 1, 1));
    printf("\n") }}' > bases.fa
"$build/moe-tokenize" -q bases.fa -o shards/

common=(-q -c "$config" --data shards device="$device" model.num_hidden_layers="$layers"
        train.steps="$steps" train.micro_batch_tokens="$micro" optim.warmup_steps=1
        checkpoint.every=0 train.eval_every=0)
# run NAME NP OVERRIDES...: moe-train on NP ranks (mpirun when NP > 1)
run() {
    local name=$1 np=$2; shift 2
    local launch=()
    [ "$np" -gt 1 ] && launch=(mpirun -np "$np" --oversubscribe --bind-to none)
    "${launch[@]}" "$build/moe-train" -@ "$threads" "${common[@]}" -o "$name" "$@" \
        2> "$name.err" || { cat "$name.err" >&2; echo "parallel_gpu.sh: $name failed" >&2; exit 1; }
}
# median KEY RUN: the median of KEY over the steps after the first (0 when absent)
median() {
    tail -n +2 "$2/metrics.jsonl" | sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p" | sort -g |
        awk '{a[NR] = $1} END {if (!NR) print 0; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

run one 1 train.global_batch_tokens="$micro"
run dp "$ranks" train.global_batch_tokens=$((micro * ranks)) parallel.dp="$ranks"
run ep "$ranks" train.global_batch_tokens=$((micro * ranks)) parallel.ep="$ranks"

base=$(median tokens_per_s one)
echo "| run ($device, $layers layers, $micro tokens a micro-batch, $(date -u +%F)) | tokens/s per rank (GPU) | / one GPU | collectives a step | all-to-all per layer | all-to-all bandwidth |"
echo "|---|---|---|---|---|---|"
for r in one dp ep; do
    np=$ranks
    [ $r = one ] && np=1
    tps=$(median tokens_per_s $r)
    awk -v r=$r -v np="$np" -v tps="$tps" -v base="$base" -v comm="$(median comm_s $r)" \
        -v a2a="$(median alltoall_s $r)" -v bw="$(median alltoall_GBps $r)" -v L="$layers" '
        BEGIN {
            name = r == "one" ? "one rank" : r == "dp" ? "parallel.dp=" np : "parallel.ep=" np
            printf("| %s | %.0f | %.3f | %s | %s | %s |\n", name, tps / np, tps / np / base,
                   np > 1 ? sprintf("%.2f ms", comm * 1e3) : "-",
                   a2a > 0 ? sprintf("%.3f ms", a2a * 1e3 / L) : "-",
                   bw > 0 ? sprintf("%.1f GB/s", bw) : "-")
        }'
done
