#!/usr/bin/env bash
# score_seq: `moe-score seq` against the NumPy Mixtral forward (tests/interop/np_score.py on
# the exported directory): per-sequence log-likelihoods within 1e-5 relative, bits per base
# and perplexity consistent, per-position values within 1e-4, for a sequence longer than the
# model's context (three windows with --context 64), a short one and a two-token one, with a
# tokenizer without BOS (the first token is not scored) and one with BOS. Also: the output
# is deterministic and batching changes no number beyond BLAS rounding, --rc-average is the
# mean of both strands and strand invariant, every table starts with a #@PG provenance line
# (the checkpoint id moe-embed writes), and bad options or subcommands fail with exit 2.
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
    paste w.tsv w1.tsv | awk -F'\t' 'NR > 2 { d = $3 - $8; if (d < 0) d = -d
        if (d > 1e-6 * ($3 < 0 ? -$3 : $3)) { print "batching changed " $1; exit 1 } }'
    rm -rf hf
done
# --rc-average: the mean of the two strands, and the same for a sequence and its reverse
# complement
moe-tiny "$CKPT" strands.fa > s.tsv
moe-tiny "$CKPT" strands.fa --rc-average > rc.tsv
"$PY" - <<'PY'
rows = [l.split("\t") for l in open("s.tsv")][2:]
rc = [l.split("\t") for l in open("rc.tsv")][2:]
mean = (float(rows[0][2]) + float(rows[1][2])) / 2
assert abs(float(rc[0][2]) - mean) <= 1e-6 * abs(mean), (rc[0][2], mean)
assert abs(float(rc[0][2]) - float(rc[1][2])) <= 1e-6 * abs(mean), "not strand invariant"
assert abs(float(rows[0][2]) - float(rows[1][2])) > 1e-3, "strands should differ"
PY
# -o FILE.tsv is the same table as stdout (below the provenance line, whose CL differs),
# written atomically
moe-tiny "$CKPT" w.fa > w.tsv && moe-tiny "$CKPT" w.fa -o out.tsv
cmp <(tail -n +2 out.tsv) <(tail -n +2 w.tsv)
# provenance: line 1 of the TSV and of the .ids.tsv is a #@PG line (samtools style) with the
# version, this command line and the checkpoint id that moe-embed records for the same
# checkpoint; numpy (and pandas, where installed) load the tables below it
moe-tiny "$CKPT" w.fa --per-position -o pp.npy
moe-embed -q -m "$CKPT" w.fa -o emb.npy
version=$(moe-score --version | sed -n '1s/^moe-score (moe-genomics) //p')
ds=$(awk -F'\t' 'NR == 1 { print $NF }' emb.ids.tsv)
case "$ds" in "DS:checkpoint $CKPT step 2 model-crc32 "*) ;; *) echo "FAIL: embed DS '$ds'"; exit 1;; esac
for f in "out.tsv:-o out.tsv" "pp.ids.tsv:--per-position -o pp.npy"; do
    want=$(printf '#@PG\tID:moe-score\tPN:moe-score\tVN:%s\tCL:moe-score seq -q -m %s --context 64 w.fa %s\t%s' \
        "$version" "$CKPT" "${f#*:}" "$ds")
    [ "$(awk 'NR == 1' "${f%%:*}")" = "$want" ] || { echo "FAIL: ${f%%:*} line 1 is not '$want'"; exit 1; }
done
"$PY" - <<'PY'
import numpy as np
for path, cols in (("out.tsv", 5), ("pp.ids.tsv", 8)):
    t = np.genfromtxt(path, delimiter="\t", skip_header=1, names=True, dtype=None, encoding="utf-8")
    assert len(t) == 3 and len(t.dtype.names) == cols, (path, t.dtype.names, len(t))
    assert list(t["name"]) == ["long", "short", "two"], (path, t["name"])
try:
    import pandas as pd
except ImportError:
    pd = None
if pd is not None:
    for path in ("out.tsv", "pp.ids.tsv"):
        a = pd.read_csv(path, sep="\t", skiprows=1)
        b = pd.read_csv(path, sep="\t", comment="#")
        assert a.equals(b) and list(a["name"]) == ["long", "short", "two"], (path, a, b)
print("provenance: ok" + ("" if pd is not None else " (pandas not installed: numpy only)"))
PY
# bad input: exit 2 with a message
expect2() { local rc=0; "$@" 2>err.txt >/dev/null || rc=$?; [ "$rc" = 2 ] || { echo "FAIL: exit $rc: $*" >&2; cat err.txt >&2; exit 1; }; }
expect2 moe-score seq -m "$CKPT" --context 256 w.fa
grep -q "context 256 must be between" err.txt
expect2 moe-score seq -m "$CKPT" --per-position -o lp.tsv w.fa
grep -q "writes a .npy file" err.txt
expect2 moe-score seq -m "$CKPT" missing.fa
expect2 moe-score seq w.fa
# no subcommand, or an unknown one: the synopsis and a clear error, exit 2
for sub in "" frobnicate; do
    # shellcheck disable=SC2086 # an empty $sub is no argument
    expect2 moe-score $sub
    grep -q "^moe-score: error: a command is required: seq or variants${sub:+ (not '$sub')}\$" err.txt
    grep -q "^Usage: moe-score seq -m CKPT" err.txt && grep -q "^       moe-score variants -m CKPT" err.txt
done
[ ! -e lp.tsv ] && [ ! -e lp.npy ]
echo "score_seq: ok"
