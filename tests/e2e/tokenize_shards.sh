#!/usr/bin/env bash
# e2e tokenize_shards: directory output (--shard-tokens, manifest.json), the validation
# split by record-name hash (recomputed here in Python from the documented rule), the
# document policies (revcomp add, N-run split, min-length, BOS/EOS) and stats output.
set -euo pipefail
HAIRPIN=/usr/share/doc/seqkit-examples/tests/hairpin.fa.gz
[ -r "$HAIRPIN" ] || { echo "seqkit-examples not installed: skip"; exit 77; }
LAMBDA="$MOE_SRC_DIR/data/lambda_virus.fa.gz"
fail() { echo "FAIL: $*" >&2; exit 1; }
js() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

rm -rf out again   # the scratch directory survives between runs
# hairpin: many short RNA records (U is a nucleotide code, kept by --iupac keep)
nrec=$(zcat "$HAIRPIN" | grep -c '^>')
nbase=$(zcat "$HAIRPIN" | grep -v '^>' | tr -d '\r\n' | wc -c)
moe-tokenize -q "$HAIRPIN" -o out/ --shard-tokens 500000 --val-fraction 0.1
[ -s out/manifest.json ] || fail "no manifest"
python3 - "$HAIRPIN" <<'PY' > want.txt
import gzip, sys
M = 2**64
def fnv(s):   # the split hash of docs/formats.md
    h = 1469598103934665603
    for b in s.encode():
        h ^= b; h = (h * 1099511628211) % M
    x = (h + 0x9E3779B97F4A7C15) % M          # splitmix64 finaliser
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % M
    return x ^ (x >> 31)
val = tr = 0
for line in gzip.open(sys.argv[1], "rt"):
    if line.startswith(">"):
        name = line[1:].split()[0]
        if (fnv(name) >> 11) * 2.0**-53 < 0.1: val += 1   # split key: the record name
        else: tr += 1
print(tr, val)
PY
read -r want_tr want_val < want.txt
got_tr=$(js 'd["totals"]["docs"]' < out/manifest.json)
got_val=$(js 'd["totals"]["val_docs"]' < out/manifest.json)
[ "$got_tr" -eq "$want_tr" ] && [ "$got_val" -eq "$want_val" ] || fail "split $got_tr/$got_val != $want_tr/$want_val"
[ $((got_tr + got_val)) -eq "$nrec" ] || fail "records lost"
# every shard respects the roll-over rule: >= N tokens except the last
nsh=$(js 'len(d["shards"])' < out/manifest.json)
[ "$nsh" -ge 2 ] || fail "expected several shards, got $nsh"
[ "$(ls out/*.mtok | grep -vc val)" -eq "$nsh" ] || fail "manifest/shard files disagree"
python3 -c "
import json; d = json.load(open('out/manifest.json'))
s = d['shards']
assert all(x['tokens'] >= 500000 for x in s[:-1]), s
assert sum(x['tokens'] for x in s) == d['totals']['tokens']
"
# stats over the directory: train + val tokens = bases + one EOS per record
moe-tokenize stats --json out > st.json
tot=$(js 'sum(x["tokens"] for x in d)' < st.json)
[ "$tot" -eq $((nbase + nrec)) ] || fail "tokens $tot != $nbase + $nrec"
[ "$(moe-tokenize stats out/manifest.json | grep -c "^  documents")" -eq 2 ] || fail "text stats"
# the same input gives the same bytes again
moe-tokenize -q "$HAIRPIN" -o again/ --shard-tokens 500000 --val-fraction 0.1 -@ 2
for f in out/*.mtok; do cmp "$f" "again/$(basename "$f")" || fail "not deterministic: $f"; done

# policies on lambda
bases=$(zcat "$LAMBDA" | grep -v '^>' | tr -d '\n' | wc -c)
moe-tokenize -q "$LAMBDA" --revcomp add --bos --eos -o rc.mtok
[ "$(moe-tokenize stats --json rc.mtok | js 'd[0]["tokens"]')" -eq $((2 * (bases + 2))) ] || fail "revcomp add"
# the second document is the reverse complement of the first
moe-tokenize decode -w 0 rc.mtok | awk 'NR == 2' > fwd.txt
moe-tokenize decode -w 0 rc.mtok | awk 'NR == 4' | rev | tr ACGT TGCA > back.txt
cmp fwd.txt back.txt || fail "reverse complement"
[ "$(moe-tokenize decode rc.mtok | grep -c 'strand=-')" -eq 1 ] || fail "strand"
# revcomp random: about half the records flipped, reproducible for a seed, another seed differs
moe-tokenize -q "$HAIRPIN" --revcomp random --seed 7 -o rr7.mtok
moe-tokenize -q "$HAIRPIN" --revcomp random --seed 7 -@ 2 -o rr7b.mtok
moe-tokenize -q "$HAIRPIN" --revcomp random --seed 8 -o rr8.mtok
cmp rr7.mtok rr7b.mtok || fail "revcomp random not reproducible"
cmp -s rr7.mtok rr8.mtok && fail "seed has no effect"
minus=$(moe-tokenize decode rr7.mtok | grep -c 'strand=-')
[ "$minus" -gt $((nrec * 45 / 100)) ] && [ "$minus" -lt $((nrec * 55 / 100)) ] || fail "flipped $minus of $nrec"
# a flipped record decodes to the reverse complement of the input record
first_minus=$(moe-tokenize decode -w 0 rr7.mtok | awk '/strand=-/ && !done { print substr($1, 2); done = 1 }')
moe-tokenize decode -w 0 rr7.mtok | awk -v n=">$first_minus" 'take { print; take = 0 } $1 == n && !seen { take = seen = 1 }' > flip.txt
zcat "$HAIRPIN" | awk -v n=">$first_minus" '$1 == n { on = 1; next } /^>/ { on = 0 } on' | tr -d '\n' \
  | rev | tr ACGUacgu TGCAtgca > want_flip.txt   # complement of A is T, also for RNA
echo >> want_flip.txt
cmp flip.txt want_flip.txt || fail "flipped record is not the reverse complement"

printf '>a\nACGTNNNNNACGTACGTNA\n>b\nNNNN\n' > n.fa
moe-tokenize -q -t nuc --n-runs split --no-eos n.fa -o split.mtok
[ "$(moe-tokenize decode -w 0 split.mtok | tr '\n' ' ')" = ">a range=1-4 strand=+ ACGT >a range=10-17 strand=+ ACGTACGT >a range=19-19 strand=+ A " ] \
  || fail "split: $(moe-tokenize decode -w 0 split.mtok | tr '\n' ' ')"
moe-tokenize -q -t nuc --n-runs split --min-length 2 --no-eos n.fa -o split2.mtok
[ "$(moe-tokenize stats --json split2.mtok | js 'd[0]["documents"]')" -eq 2 ] || fail "min-length"
moe-tokenize -q -t nuc --n-runs collapse --no-eos n.fa -o col.mtok
[ "$(moe-tokenize decode -w 0 col.mtok | grep -v '>' | tr '\n' ' ')" = "ACGTNACGTACGTNA N " ] || fail "collapse"
# non-overlapping windows split one by one (key "name/index"): one genome, both sides
moe-tokenize -q --window 1000 --val-fraction 0.2 "$LAMBDA" -o win.mtok
python3 - > want_win.txt <<'PY'
M = 2**64
def split_hash(s):
    h = 1469598103934665603
    for b in s.encode():
        h ^= b; h = (h * 1099511628211) % M
    x = (h + 0x9E3779B97F4A7C15) % M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % M
    return x ^ (x >> 31)
n = (48502 + 999) // 1000    # lambda: 48,502 bases in 1 kb windows
val = sum((split_hash("gi|9626243|ref|NC_001416.1|/%d" % i) >> 11) * 2.0**-53 < 0.2 for i in range(n))
print(n - val, val)
PY
read -r want_tr want_val < want_win.txt
got_tr=$(moe-tokenize stats --json win.mtok | js 'd[0]["documents"]')
got_val=$(moe-tokenize stats --json win.val.mtok | js 'd[0]["documents"]')
[ "$got_tr" -eq "$want_tr" ] && [ "$got_val" -eq "$want_val" ] && [ "$got_val" -gt 0 ] \
  || fail "window split $got_tr/$got_val != $want_tr/$want_val"
echo "tokenize_shards: ok"
