#!/usr/bin/env bash
# score_gpu.sh: the variant-scoring benchmark of issue 17 (docs/performance-inference.md "Variant
# scoring and Hugging Face in the same run"), in one go on one GPU: the og2-8x1b model of
# bench/og2_model.sh (random-init HF Mixtral, bf16 -> `moe-convert from-hf --tokenizer byte`
# -> our checkpoint; `moe-convert to-hf --dtype bf16` -> the directory HF loads); a LEN-base
# reference (copies of the bundled lambda genome end to end, .fai written by
# bench/score_hf.py) and a VCF of N SNVs evenly spread over it; a check that the windows the
# HF side builds are moe-score's (`moe-score variants` against `moe-score seq` on them, fp32,
# the first CHECK SNVs); `moe-score variants --tsv` on all N SNVs (and on the first N_HF when
# N_HF < N); Hugging Face MixtralForCausalLM scoring each of the first N_HF SNVs' REF and ALT
# windows in batches of HF_BATCH windows; then the agreement of the LLRs (Pearson, max
# |difference|) and variants/s of both on the same SNVs with their ratio.
#
#   bench/score_gpu.sh [BUILD_DIR]        (default build-gpu; run from the checkout root)
#
# Environment: N (SNVs, default 10000), N_HF (SNVs HF scores: the first N_HF, default N; 0:
# no HF run), W (window in bases, default 8192), LEN (reference bases, default 5000000),
# BATCH_TOKENS (moe-score --batch-tokens, default 65536), HF_BATCH (windows per HF forward
# pass, default BATCH_TOKENS / W), PRECISION (empty: moe-score's default, bf16 on CUDA, and
# bf16 HF; fp32 or bf16: both sides in it), DEVICE (moe-score --device, default cuda), CHECK
# (SNVs of the window check, default 8; 0: none), HF_FP32 (1: HF also scores the same SNVs in
# fp32, and both bf16 sides are compared with those values: the spread of bf16 rounding on
# this model; default 0), GRID (1: `moe-score variants --window-grid`, and HF scores the
# same grid windows, each SNV's REF and ALT window as the naive loop does; default 0),
# CHECK_TOL (its max |LLR difference| in
# nats, default 0.01), CKPT (a byte-tokenizer checkpoint to score with instead of the og2
# model; exported to WORK/hf-ckpt when HF runs), WORK (scratch directory: about 21 GB for the
# og2 model; default /dev/shm/score-bench when /dev/shm has 24 GB free, else
# /tmp/score-bench). Timed on both sides: everything after the model load (reading the VCF
# and FASTA, windows, tokens, forward passes, the TSV written); moe-score reports its load
# separately. Without torch + transformers it exits 77, unless CKPT is set and N_HF=0 (the
# moe-score side alone, e.g. DEVICE=cpu with a tiny checkpoint).
set -uo pipefail
build=${1:-build-gpu}
n=${N:-10000}
n_hf=${N_HF:-$n}
W=${W:-8192}
len=${LEN:-5000000}
bt=${BATCH_TOKENS:-65536}
hf_batch=${HF_BATCH:-$((bt / W > 0 ? bt / W : 1))}
precision=${PRECISION:-}
device=${DEVICE:-cuda}
check=${CHECK:-8}
check_tol=${CHECK_TOL:-0.01}
hf_fp32=${HF_FP32:-0}
export WINDOW_GRID=${GRID:-0} # score_hf.py's window rule
grid=()
[ "$WINDOW_GRID" = 1 ] && grid=(--window-grid)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=og2_model.sh
source "$here/og2_model.sh"
work=$(og2_scratch score-bench 24)
og2_require_tools score_gpu.sh "$build" moe-score moe-convert
[ "$n_hf" -le "$n" ] || { echo "score_gpu.sh: N_HF=$n_hf is more than N=$n" >&2; exit 2; }
if [ "$n_hf" -gt 0 ] || [ -z "${CKPT:-}" ]; then og2_require_torch score_gpu.sh; fi
prec=()
[ -n "$precision" ] && prec=(--precision "$precision")
mkdir -p "$work"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), scratch $work"
[ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ -n "${CKPT:-}" ]; then
    ckpt=$CKPT
    hf=$work/hf-ckpt
    if [ "$n_hf" -gt 0 ]; then
        rm -rf "$hf"
        "$build/moe-convert" -q to-hf --dtype bf16 "$ckpt" "$hf" || exit 1
    fi
else
    og2_model "$build" "$work" "$([ "$n_hf" -gt 0 ] && echo 1 || echo 0)" || exit 1
    ckpt=$work/ckpt
    hf=$work/hf-converted
fi
python3 "$here/score_hf.py" make-data "$work/ref.fa" "$work/calls.vcf" \
    "$(cd "$here/.." && pwd)/data/lambda_virus.fa.gz" "$len" "$n" "$W" || exit 1
first_records() { # first_records K OUT.vcf: the header and the first K records of calls.vcf
    awk -v k="$1" '/^#/ || ++r <= k' "$work/calls.vcf" > "$2"
}
variants() { # variants VCF ARGS...: moe-score variants --tsv on VCF to stdout
    local vcf=$1
    shift
    "$build/moe-score" variants -m "$ckpt" -f "$work/ref.fa" --window "$W" "${grid[@]}" \
        --device "$device" --batch-tokens "$bt" "$@" --tsv "$vcf"
}

if [ "$check" -gt 0 ]; then
    [ "$check" -le "$n" ] || check=$n
    echo
    echo "== window check, the first $check SNVs: moe-score variants against moe-score seq on"
    echo "   the windows of score_hf.py (fp32)"
    first_records "$check" "$work/check.vcf"
    python3 "$here/score_hf.py" windows "$work/ref.fa" "$work/check.vcf" "$W" "$work/check.fa" ||
        exit 1
    variants "$work/check.vcf" -q --precision fp32 > "$work/check-variants.tsv" || exit 1
    "$build/moe-score" seq -q -m "$ckpt" --device "$device" --precision fp32 --batch-tokens "$bt" \
        "$work/check.fa" > "$work/check-seq.tsv" || exit 1
    python3 "$here/score_hf.py" seq-llr "$work/check-seq.tsv" "$work/check.vcf" \
        "$work/check-seq-llr.tsv" || exit 1
    python3 "$here/score_hf.py" compare "$work/check-variants.tsv" "$work/check-seq-llr.tsv" \
        "$check_tol" ||
        { echo "score_gpu.sh: score_hf.py's windows are not moe-score's" >&2; exit 1; }
fi

ours() { # ours NAME VCF: moe-score variants on VCF -> WORK/NAME.tsv, its messages in NAME.log
    echo
    echo "== moe-score variants, $(grep -vc '^#' "$2") SNVs: --window $W${grid[*]:+ ${grid[*]}}" \
        "--device $device${prec[*]:+ ${prec[*]}} --batch-tokens $bt"
    variants "$2" "${prec[@]}" 2>&1 >"$work/$1.tsv" | tr '\r' '\n' | grep -v '^$' |
        tee "$work/$1.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "score_gpu.sh: moe-score variants failed" >&2; exit 1; }
}
ours ours "$work/calls.vcf"
mine=ours
if [ "$n_hf" -gt 0 ] && [ "$n_hf" -lt "$n" ]; then
    first_records "$n_hf" "$work/sub.vcf"
    ours ours-sub "$work/sub.vcf"
    mine=ours-sub
fi
if [ "$n_hf" -gt 0 ]; then
    echo
    echo "== HF MixtralForCausalLM, ${precision:-bf16}, $hf_batch windows per batch," \
        "the first $n_hf SNVs"
    python3 "$here/score_hf.py" score "$hf" "$work/ref.fa" "$work/calls.vcf" "$W" "$hf_batch" \
        "${precision:-bf16}" "$work/hf.tsv" "$n_hf" 2>&1 | grep -v Warning | tee "$work/hf.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "score_gpu.sh: the HF run failed" >&2; exit 1; }
    python3 "$here/score_hf.py" compare "$work/$mine.tsv" "$work/hf.tsv" | tee "$work/compare.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
    if [ "$hf_fp32" = 1 ]; then
        echo
        echo "== HF MixtralForCausalLM, fp32, the same $n_hf SNVs: the values both sides round"
        python3 "$here/score_hf.py" score "$hf" "$work/ref.fa" "$work/calls.vcf" "$W" \
            "$hf_batch" fp32 "$work/hf32.tsv" "$n_hf" 2>&1 | grep -v Warning | tee "$work/hf32.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "score_gpu.sh: the HF fp32 run failed" >&2; exit 1; }
        for side in "$mine" hf; do
            python3 "$here/score_hf.py" compare "$work/$side.tsv" "$work/hf32.tsv" |
                tee "$work/compare-$side-fp32.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
        done
    fi
fi

echo
echo "== summary (same call, same device)"
# "... ALT alleles: S scored, ...; K windows in T s after a L s model load" -> S T L
timing() {
    local num='\([0-9.]*\)'
    sed -n "s/.* ALT alleles: $num scored.* windows in $num s after a $num s model load.*/\1 \2 \3/p" \
        "$work/$1.log" | tail -1
}
rate() { # rate A B: A / B, 3 decimals
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'
}
json() { # json FILE KEY [FORMAT]: KEY of the JSON line that ends WORK/FILE
    python3 -c "import json, sys
row = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(format(row[sys.argv[2]], sys.argv[3]))" "$work/$1" "$2" "${3:-}"
}
read -r s t l <<< "$(timing ours)"
echo "moe-score variants: $(rate "$s" "$t") variants/s ($s SNVs in $t s after a $l s model load)"
[ "$n_hf" -gt 0 ] || exit 0
read -r s t l <<< "$(timing "$mine")"
ours_rate=$(rate "$s" "$t")
[ "$mine" = ours ] ||
    echo "moe-score variants, the first $n_hf: $ours_rate variants/s ($s SNVs in $t s)"
hf_rate=$(json hf.log variants_per_s)
echo "HF MixtralForCausalLM (${precision:-bf16}, batch $hf_batch): $hf_rate variants/s" \
    "($(json hf.log variants) SNVs in $(json hf.log seconds) s)"
echo "moe-score / HF on the same $n_hf SNVs: $(rate "$ours_rate" "$hf_rate")x (goal >= 3x)"
echo "LLRs, moe-score vs HF on them: Pearson $(json compare.log pearson .6f) (goal >= 0.999)," \
    "max |difference| $(json compare.log max_abs_diff .3g) nats"
echo "LLR standard deviations, moe-score and HF: $(json compare.log llr_std)"
if [ "$hf_fp32" = 1 ]; then
    echo "against HF in fp32: moe-score Pearson $(json "compare-$mine-fp32.log" pearson .6f)," \
        "HF ${precision:-bf16} Pearson $(json compare-hf-fp32.log pearson .6f)"
fi
