# og2_model.sh: sourced by bench/embed_gpu.sh and bench/score_gpu.sh - what the GPU
# benchmarks against Hugging Face share: the scratch directory, the checks for the tools and
# for torch + transformers, and the model. The model is a random-init MixtralForCausalLM with
# the og2-8x1b shapes in bf16 (`bench/embed_hf.py make-model`), imported with `moe-convert
# from-hf --tokenizer byte` into WORK/ckpt (fp32, 13.7 GB; the HF directory made for the
# import is deleted after it) and exported with `moe-convert to-hf --dtype bf16` into
# WORK/hf-converted (6.8 GB), the directory the HF side loads, so that HF runs on the
# converted checkpoint.
# The one thing to know: functions only (no side effects when sourced); a step whose output
# is already in WORK is not run again, so a second run in the same WORK reuses the model.
# shellcheck shell=bash

# og2_scratch NAME GB: prints the scratch directory - $WORK when set, else /dev/shm/NAME when
# /dev/shm has more than GB gigabytes free, else /tmp/NAME.
og2_scratch() {
    if [ -n "${WORK:-}" ]; then echo "$WORK"; return; fi
    local free_kb
    free_kb=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
    if [ "${free_kb:-0}" -gt $(($2 * 1024 * 1024)) ]; then echo "/dev/shm/$1"; else echo "/tmp/$1"; fi
}

# og2_require_tools SCRIPT BUILD_DIR PROGRAM...: exits 2 (naming SCRIPT) when a program is
# not built in BUILD_DIR.
og2_require_tools() {
    local script=$1 build=$2 t
    shift 2
    for t in "$@"; do
        [ -x "$build/$t" ] || { echo "$script: $build/$t not found; build first" >&2; exit 2; }
    done
}

# og2_require_torch SCRIPT: exits 77 (nothing measured) when python3 has no torch +
# transformers.
og2_require_torch() {
    python3 -c 'import torch, transformers' 2>/dev/null ||
        { echo "$1: python3 has no torch + transformers; nothing measured" >&2; exit 77; }
}

# og2_model BUILD_DIR WORK EXPORT: makes WORK/ckpt when it has no MANIFEST, and with EXPORT =
# 1 WORK/hf-converted when it has no config.json (see the banner). Returns 1 when a step
# fails (its messages on stderr).
og2_model() {
    local build=$1 work=$2 export=$3 here t0
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if [ ! -f "$work/ckpt/MANIFEST" ]; then
        python3 "$here/embed_hf.py" make-model "$work/hf" || return 1
        t0=$(date +%s.%N)
        "$build/moe-convert" from-hf --tokenizer byte "$work/hf" "$work/ckpt" || return 1
        echo "from-hf: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
        rm -rf "$work/hf"
    fi
    if [ "$export" = 1 ] && [ ! -f "$work/hf-converted/config.json" ]; then
        "$build/moe-convert" to-hf --dtype bf16 "$work/ckpt" "$work/hf-converted" || return 1
    fi
    return 0
}
