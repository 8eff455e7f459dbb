#!/usr/bin/env bash
# embed_gpu.sh: the GPU embedding benchmark of docs/performance-inference.md "Embedding", in one go on
# one GPU: a random-init Mixtral with the og2-8x1b shapes (Hugging Face, bf16) imported with
# `moe-convert from-hf` and exported again with `moe-convert to-hf --dtype bf16` (the
# converted checkpoint HF loads); N sequences of 1,000-8,000 bases cut from the bundled
# lambda genome; `moe-embed --device cuda` on them; then Hugging Face MixtralModel on the same weights and sequences, in file
# order with a fixed batch of sequences and longest first under the same token budget; then
# the cosine agreement of the vectors and the ratios.
#
#   bench/embed_gpu.sh [BUILD_DIR]        (default build-gpu; run from the checkout root)
#
# Environment: N (sequences, default 10000), N_HF (sequences the HF runs embed: the first
# N_HF of the same file, default N), BATCH_TOKENS (padded tokens per forward pass for
# moe-embed and for HF `sorted`, default 65536), HF_BATCH (sequences per batch for HF
# `input`, default BATCH_TOKENS / 8192), HF_ORDERS (default "input sorted"; empty: no HF
# run), WORK (scratch directory: needs about 21 GB, the fp32 checkpoint and the bf16 export;
# default /dev/shm/embed-bench when /dev/shm has 24 GB free, else /tmp/embed-bench). Model
# loading is not timed on either side. The model steps are bench/og2_model.sh's, shared with
# bench/score_gpu.sh.
set -uo pipefail
build=${1:-build-gpu}
n=${N:-10000}
n_hf=${N_HF:-$n}
bt=${BATCH_TOKENS:-65536}
hf_batch=${HF_BATCH:-$((bt / 8192))}
orders=${HF_ORDERS-"input sorted"}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=og2_model.sh
source "$here/og2_model.sh"
work=$(og2_scratch embed-bench 24)
og2_require_tools embed_gpu.sh "$build" moe-embed moe-convert
og2_require_torch embed_gpu.sh
mkdir -p "$work"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), scratch $work"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

og2_model "$build" "$work" "$([ -n "$orders" ] && echo 1 || echo 0)" || exit 1
python3 "$here/embed_hf.py" make-fasta "$work/seqs.fa" "$n" data/lambda_virus.fa.gz || exit 1

echo
echo "== moe-embed, $n sequences, --batch-tokens $bt"
"$build/moe-embed" -m "$work/ckpt" --device cuda --batch-tokens "$bt" -o "$work/ours.npy" \
    "$work/seqs.fa" 2>&1 | tr '\r' '\n' | grep -v '^$' | tee "$work/ours.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "embed_gpu.sh: moe-embed failed"; exit 1; }
if [ "$n_hf" -lt "$n" ]; then
    python3 "$here/embed_hf.py" make-fasta "$work/sub.fa" "$n_hf" data/lambda_virus.fa.gz
    echo "== moe-embed, the first $n_hf sequences"
    "$build/moe-embed" -m "$work/ckpt" --device cuda --batch-tokens "$bt" -o "$work/ours-sub.npy" \
        "$work/sub.fa" 2>&1 | tr '\r' '\n' | grep -v '^$' | tee "$work/ours-sub.log"
fi

for o in $orders; do
    b=$bt
    [ "$o" = input ] && b=$hf_batch
    echo
    echo "== HF MixtralModel, order $o, batch $b, $n_hf sequences"
    python3 "$here/embed_hf.py" embed "$work/hf-converted" "$work/seqs.fa" "$o" "$b" "$work/hf-$o.npy" "$n_hf" \
        2>&1 | grep -v Warning | tee "$work/hf-$o.log"
    python3 "$here/embed_hf.py" compare "$work/ours.npy" "$work/hf-$o.npy"
done

echo
echo "== summary (same call, same GPU)"
rate() { sed -n 's/.*(\([0-9.]*\) sequences\/s.*/\1/p' "$1" | tail -1; }
ours=$(rate "$work/ours.log")
ours_sub=$ours
[ -f "$work/ours-sub.log" ] && ours_sub=$(rate "$work/ours-sub.log")
echo "moe-embed: $ours sequences/s over $n sequences ($ours_sub over the first $n_hf)"
for o in $orders; do
    hf=$(sed -n 's/.*"sequences_per_s": \([0-9.]*\).*/\1/p' "$work/hf-$o.log")
    echo "HF $o: $hf sequences/s; moe-embed / HF = $(python3 -c "print(round($ours_sub / $hf, 2))")x"
done
