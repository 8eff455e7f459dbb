#!/usr/bin/env bash
# quickstart.sh: the `make demo` pipeline - a FASTA genome to embeddings in one command.
#
#   genome.fa.gz -> genome.fa + 90/10 BED split -> train/val token shards -> tiny MoE run -> 1 kb embeddings
#
# On the bundled lambda phage genome (data/lambda_virus.fa.gz, 48.5 kb) it tokenizes with
# the last 10% of every sequence held out for validation, trains configs/tiny.yaml (on the
# GPU with the bf16 recipe when nvidia-smi sees one, else on the CPU in fp32), embeds the
# genome in 1 kb windows and prints a summary. Every step prints the exact command it runs,
# so each can be copied and varied. The one thing to know: re-running is safe -
# tokenization and embedding are redone (deterministic, seconds), training continues the
# existing run (`--resume auto`: a no-op when it is complete) unless the input or the
# training settings changed, in which case it trains again; `--fresh` starts over.
#
# Usage: pipelines/quickstart.sh [--fresh] [INPUT.fa[.gz]]
# Environment:
#   MOE_DEMO_DIR         output directory (default ./demo-out)
#   MOE_DEMO_INPUT       the FASTA when none is given (default data/lambda_virus.fa.gz)
#   MOE_BUILD_DIR        where the tools are (default build/ of this checkout, then $PATH)
#   MOE_DEMO_DEVICE      cpu | cuda (default: cuda when nvidia-smi sees a GPU)
#   MOE_DEMO_CONFIG      training config (default configs/tiny.yaml)
#   MOE_DEMO_TRAIN_ARGS  extra key=value overrides for moe-train, e.g. "train.steps=40"
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fresh=0
input=""
for arg in "$@"; do
    case "$arg" in
    --fresh) fresh=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "quickstart.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    *) input=$arg ;;
    esac
done
input=${input:-${MOE_DEMO_INPUT:-$src/data/lambda_virus.fa.gz}}
out=${MOE_DEMO_DIR:-demo-out}
config=${MOE_DEMO_CONFIG:-$src/configs/tiny.yaml}

if [ -n "${MOE_BUILD_DIR:-}" ]; then
    PATH="$MOE_BUILD_DIR:$PATH"
elif [ -x "$src/build/moe-train" ]; then
    PATH="$src/build:$PATH"
fi
for tool in moe-tokenize moe-train moe-embed; do
    if ! command -v "$tool" >/dev/null; then
        echo "quickstart.sh: $tool not found (looked in \$MOE_BUILD_DIR, $src/build and \$PATH)" >&2
        echo "hint: run 'make demo' (or 'make' first) from the checkout" >&2
        exit 2
    fi
done
for f in "$input" "$config"; do
    if [ ! -r "$f" ]; then
        echo "quickstart.sh: cannot read $f" >&2
        exit 2
    fi
done

# Quote a command so that the printed line can be pasted back into a shell.
show() {
    local line="" a
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then line+="$a "; else line+="$(printf '%q' "$a") "; fi
    done
    printf '\n$ %s\n' "${line% }" >&2
}
run() {
    show "$@"
    "$@"
}
step_start=0
step() {
    printf '\n==> %s\n' "$*" >&2
    step_start=$SECONDS
}
step_done() { printf '    (%ds)\n' $((SECONDS - step_start)) >&2; }

t0=$SECONDS
if [ "$fresh" = 1 ] && [ -d "$out" ]; then
    run rm -rf "$out"
fi
mkdir -p "$out/tokens"
# A run trained on other inputs or settings is not reused: start that part over.
stamp="input=$(cd "$(dirname "$input")" && pwd)/$(basename "$input") config=$config args=${MOE_DEMO_TRAIN_ARGS:-} device=${MOE_DEMO_DEVICE:-auto}"
if [ -d "$out/run" ] && [ "$(cat "$out/.demo-settings" 2>/dev/null)" != "$stamp" ]; then
    echo "quickstart.sh: $out/run was trained with other settings; training again" >&2
    run rm -rf "$out/run"
fi
printf '%s\n' "$stamp" >"$out/.demo-settings"

device=${MOE_DEMO_DEVICE:-}
if [ -z "$device" ]; then
    device=cpu
    if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        device=cuda
    fi
fi

step "1/4 decompress the genome; hold out the last 10% of every sequence (BED regions)"
printf '\n$ gzip -dcf %q > %q\n' "$input" "$out/genome.fa" >&2
gzip -dcf "$input" >"$out/genome.fa.tmp"
mv "$out/genome.fa.tmp" "$out/genome.fa"
rm -f "$out/genome.fa.fai" # moe-tokenize indexes the FASTA again for the region queries
# BED is 0-based, half-open: the first 90% of every sequence trains, the last 10% validates.
split='function emit() { if (name != "") { c = int(n * 0.9); print name, 0, c > (dir "/train.bed"); print name, c, n > (dir "/val.bed") } }
/^>/ { emit(); name = substr($1, 2); n = 0; next } { gsub(/[ \t\r]/, ""); n += length($0) } END { emit() }'
printf "\n\$ awk -v OFS='\\\\t' -v dir=%q '%s' %q\n" "$out" "$split" "$out/genome.fa" >&2
awk -v OFS='\t' -v dir="$out" "$split" "$out/genome.fa"
step_done

step "2/4 tokenize (byte tokenizer; validation = the held-out 10%)"
run moe-tokenize "$out/genome.fa" --regions-file "$out/train.bed" -o "$out/tokens/train.mtok"
run moe-tokenize "$out/genome.fa" --regions-file "$out/val.bed" -o "$out/tokens/train.val.mtok"
step_done

step "3/4 train $(basename "$config") on $device (continues $out/run when it exists)"
# The CUDA backend trains in bf16 (fp32 is the CPU reference recipe).
recipe=fp32
[ "$device" = cuda ] && recipe=bf16
# shellcheck disable=SC2086 # MOE_DEMO_TRAIN_ARGS is a list of key=value words
run moe-train -c "$config" --data "$out/tokens/train.mtok" -o "$out/run" --resume auto \
    device="$device" precision.recipe=$recipe ${MOE_DEMO_TRAIN_ARGS:-}
step_done

step "4/4 embed the genome in 1 kb windows (one row per window)"
run moe-embed -m "$out/run" --window 1000 --stride 1000 --per-window -o "$out/embeddings.npy" \
    "$out/genome.fa"
step_done

# ---- summary: read back from the files the steps wrote ----
json_num() { # json_num KEY FILE -> the value of the first "KEY": number in FILE
    grep -o "\"$1\": *[-0-9.eE+]*" "$2" | head -n 1 | sed 's/.*: *//'
}
tokens_of() { moe-tokenize stats --json "$1" 2>/dev/null | grep -m 1 -o '"tokens": *[0-9]*' | sed 's/.*: *//'; }
metrics="$out/run/metrics.jsonl"
loss_first=$(json_num loss "$metrics")
loss_last=$(grep '"loss"' "$metrics" | tail -n 1 | grep -o '"loss": *[-0-9.eE+]*' | sed 's/.*: *//')
step_last=$(grep '"step"' "$metrics" | tail -n 1 | grep -o '"step": *[0-9]*' | sed 's/.*: *//')
val_bpb=$(grep '"val_bits_per_base"' "$metrics" | tail -n 1 |
    grep -o '"val_bits_per_base": *[-0-9.eE+]*' | sed 's/.*: *//')
# shellcheck disable=SC2086
params=$(moe-train -c "$config" --data "$out/tokens/train.mtok" --dry-run device=cpu \
    ${MOE_DEMO_TRAIN_ARGS:-} 2>/dev/null | sed -n 's/^# parameters: \([0-9]*\) total, \([0-9]*\) active per token.*/\1 parameters (\2 active per token)/p')
shape=""
for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import numpy' 2>/dev/null; then
        shape=$("$py" -c 'import sys, numpy; a = numpy.load(sys.argv[1]); print(a.shape, a.dtype)' \
            "$out/embeddings.npy")
        break
    fi
done
if [ -z "$shape" ]; then # no numpy: the .npy header is text
    shape="$(head -c 128 "$out/embeddings.npy" | tr -d '\0' | grep -ao "'shape': ([0-9, ]*)" |
        sed "s/'shape': //") (from the .npy header; python3-numpy not found)"
fi
ckpt=$(cat "$out/run/latest" 2>/dev/null || echo "?")

fmt() { [ -n "$1" ] && printf '%.4f' "$1" || printf 'n/a'; }
cat <<EOF

================ moe-genomics demo summary ================
input            $input
tokens           $(tokens_of "$out/tokens/train.mtok") train + $(tokens_of "$out/tokens/train.val.mtok") validation (byte tokenizer)
model            $(basename "$config"): ${params:-? parameters}, $device, $recipe
loss             $(fmt "$loss_first") at step 1 -> $(fmt "$loss_last") at step ${step_last:-?}
validation       $(fmt "$val_bpb") bits per base (2.0 = no better than uniform over ACGT)
embeddings       $shape  one row per 1 kb window
files            $out/tokens/train.mtok, train.val.mtok   token shards
                 $out/run/$ckpt/   the trained checkpoint (run/latest names it)
                 $out/run/metrics.jsonl   one JSON line per step
                 $out/run/loss.svg   loss curve: open it in a browser
                 $out/embeddings.npy   + embeddings.ids.tsv (row -> sequence, window)
wall time        $((SECONDS - t0)) s
===========================================================
EOF
