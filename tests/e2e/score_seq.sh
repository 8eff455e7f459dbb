#!/usr/bin/env bash
# score_seq: `moe-score seq` against the NumPy Mixtral forward (tests/interop/np_score.py on
# the exported directory): per-sequence log-likelihoods within 1e-5 relative, bits per base
# and perplexity consistent, per-position values within 1e-4, for a sequence longer than the
# model's context (three windows with --context 64), a short one and a two-token one, with a
# tokenizer without BOS (the first token is not scored) and one with BOS. Also: the output
# is deterministic and batching changes no number beyond BLAS rounding, --rc-average is the
# mean of both strands and strand invariant, and bad options fail with exit 2.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "SKIP: no python3 with numpy (apt install python3-numpy)"; exit 77; fi
"$PY" - "$LAMBDA" <<'PY'
import gzip, sys
s = "".join(l.strip() for l in gzip.open(sys.argv[1], "rt") if not l.startswith(">"))
open("w.fa", "w").write(">long\n" + s[1000:1600] + "\n>short\nACGTTGCAGGCATTACGATCGATCGNNACGTAC"
                        "GTTTGACCAGTacgtRYACGGT\n>two\nAC\n")
comp = {"A": "T", "C": "G", "G": "C", "T": "A"}
rc = "".join(comp[c] for c in reversed(s[2000:2300]))
open("strands.fa", "w").write(">f\n" + s[2000:2300] + "\n>r\n" + rc + "\n")
PY
moe-tiny() { moe-score seq -q -m "$1" --context 64 "${@:2}"; }
tiny_train bos -t nuc --bos
for ck in "$CKPT" "$(ls -d bos/ckpt-* | tail -1)"; do
    moe-convert -q to-hf "$ck" hf
    moe-tiny "$ck" w.fa > w.tsv
    "$PY" "$INTEROP/np_score.py" hf w.fa w.tsv --context 64
    moe-tiny "$ck" w.fa --per-position -o w.npy
    "$PY" "$INTEROP/np_score.py" hf w.fa w.ids.tsv --context 64 --lp w.npy w.ids.tsv
    # deterministic: the same run gives the same bytes; one window per forward pass gives
    # the same numbers up to the last bits of BLAS blocking
    moe-tiny "$ck" w.fa > w2.tsv && cmp w.tsv w2.tsv
    moe-tiny "$ck" w.fa --batch-tokens 1 > w1.tsv
    paste w.tsv w1.tsv | awk -F'\t' 'NR > 1 { d = $3 - $8; if (d < 0) d = -d
        if (d > 1e-6 * ($3 < 0 ? -$3 : $3)) { print "batching changed " $1; exit 1 } }'
    rm -rf hf
done
# --rc-average: the mean of the two strands, and the same for a sequence and its reverse
# complement
moe-tiny "$CKPT" strands.fa > s.tsv
moe-tiny "$CKPT" strands.fa --rc-average > rc.tsv
"$PY" - <<'PY'
rows = [l.split("\t") for l in open("s.tsv")][1:]
rc = [l.split("\t") for l in open("rc.tsv")][1:]
mean = (float(rows[0][2]) + float(rows[1][2])) / 2
assert abs(float(rc[0][2]) - mean) <= 1e-6 * abs(mean), (rc[0][2], mean)
assert abs(float(rc[0][2]) - float(rc[1][2])) <= 1e-6 * abs(mean), "not strand invariant"
assert abs(float(rows[0][2]) - float(rows[1][2])) > 1e-3, "strands should differ"
PY
# -o FILE.tsv is the same table as stdout, written atomically
moe-tiny "$CKPT" w.fa > w.tsv && moe-tiny "$CKPT" w.fa -o out.tsv && cmp out.tsv w.tsv
# bad input: exit 2 with a message
expect2() { local rc=0; "$@" 2>err.txt >/dev/null || rc=$?; [ "$rc" = 2 ] || { echo "FAIL: exit $rc: $*" >&2; cat err.txt >&2; exit 1; }; }
expect2 moe-score seq -m "$CKPT" --context 256 w.fa
grep -q "context 256 must be between" err.txt
expect2 moe-score seq -m "$CKPT" --per-position -o lp.tsv w.fa
grep -q "writes a .npy file" err.txt
expect2 moe-score seq -m "$CKPT" missing.fa
expect2 moe-score seq w.fa
expect2 moe-score frobnicate
[ ! -e lp.tsv ] && [ ! -e lp.npy ]
echo "score_seq: ok"
