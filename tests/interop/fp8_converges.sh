# shellcheck shell=bash
# fp8_converges.sh, sourced by e2e.train_fp8_cpu and e2e.train_fp8_gpu: fp8_converges RECIPE...
# fails (the caller's fail) unless every loss run-bf16 and each run-RECIPE logged in its
# metrics.jsonl is finite and each RECIPE's last val_loss is within 2% of run-bf16's (printed).
fp8_val_loss() { sed -n 's/.*"val_loss":\([0-9.eE+-]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }
fp8_converges() {
    local ref got r
    for r in bf16 "$@"; do
        # awk reads the whole file (no early-exiting reader on a pipe: SIGPIPE under pipefail)
        awk -F'"loss":' 'NF > 1 { split($2, v, ","); if (v[1] !~ /^[0-9.eE+-]+$/) bad = 1 }
            END { exit bad }' "run-$r/metrics.jsonl" || fail "$r: a non-finite loss was logged"
    done
    ref=$(fp8_val_loss run-bf16)
    [ -n "$ref" ] || fail "no val_loss in run-bf16/metrics.jsonl"
    for r in "$@"; do
        got=$(fp8_val_loss "run-$r")
        [ -n "$got" ] || fail "no val_loss in run-$r/metrics.jsonl"
        awk -v g="$got" -v b="$ref" -v r="$r" 'BEGIN { d = (g - b) / b; if (d < 0) d = -d
            printf "%s: val_loss %.5f against bf16 %.5f (%.2f%%)\n", r, g, b, 100 * d
            exit !(d <= 0.02) }' || fail "$r: validation loss not within 2% of bf16's"
    done
}
