#!/usr/bin/env bash
# embed_basic: moe-embed on a tiny trained checkpoint - .npy + ids.tsv checked with Debian's
# NumPy against the TSV output (pooled, per-window, per-token, f16), deterministic bytes,
# strand invariance of --rc-average, layer 0 = token embeddings, .mtok input, bad input.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "SKIP: no python3 with numpy (apt install python3-numpy)"; exit 77; fi

cat > seqs.fa <<'FA'
>short
ACGTACGTAC
>mixed desc text
GGGCCCAATTNNACGTTGCAacgtacgtTTGA
>long
ACGATCGATCGTAGCTAGCTAGCTAGCATCGATCGATGCATGCATCGATCGTAGCTAGCTAGCGGCGCGATATATCGCGATTACGA
FA
zcat /usr/share/doc/bowtie2/examples/reads/reads_1.fq.gz 2>/dev/null | head -40 > reads.fq || true
if [ ! -s reads.fq ]; then  # no bowtie2-examples: ten reads cut from the lambda genome
    zcat "$LAMBDA" | grep -v '>' | tr -d '\n' | fold -w 70 | sed -n '2,11p' |
        awk '{q = $0; gsub(/./, "I", q); printf "@r%d\n%s\n+\n%s\n", NR, $0, q}' > reads.fq
fi

# every output mode: .npy + ids.tsv equal to the TSV text of the same options
for mode in pooled per-window per-token; do
    opt=""; [ "$mode" != pooled ] && opt="--$mode"
    moe-embed -q -m "$CKPT" seqs.fa $opt --window 16 --stride 8 -o "$mode.npy"
    moe-embed -q -m "$CKPT" seqs.fa $opt --window 16 --stride 8 > "$mode.tsv"
    "$PY" "$INTEROP/check_npy.py" "$mode.npy" "$mode.tsv" "$mode"
done
# pooling runs on the backend: it must agree with pooling the per-token rows here
moe-embed -q -m "$CKPT" seqs.fa --per-token > tok.tsv
moe-embed -q -m "$CKPT" seqs.fa > mean.tsv
moe-embed -q -m "$CKPT" seqs.fa --pool max > max.tsv
"$PY" - <<'PY'
import numpy as np
rows = {}
for l in open("tok.tsv"):
    f = l.rstrip("\n").split("\t")
    rows.setdefault(f[0], []).append(np.array(f[2:], float))  # name, position, vector
def vecs(p): return {l.split("\t")[0]: np.array(l.split("\t")[1:], float) for l in open(p)}
mean, mx = vecs("mean.tsv"), vecs("max.tsv")
assert len(mean) == 3 and mean.keys() == mx.keys(), (mean.keys(), mx.keys())
for k in mean:
    t = np.array(rows[k])
    assert np.allclose(mean[k], t.mean(0), rtol=1e-6, atol=1e-6), k
    assert np.array_equal(mx[k], t.max(0)), k
PY
# inference never reads the optimizer state, so its CRC is not checked (its size is); a
# reader of the moments (consolidate) still refuses the damaged file
cp -r "$CKPT" flipped
"$PY" -c "f=open('flipped/optimizer-rank0.safetensors','r+b'); f.seek(-9,2); b=f.read(1); f.seek(-9,2); f.write(bytes([b[0]^1]))"
moe-embed -q -m flipped seqs.fa > flipped.tsv && cmp flipped.tsv mean.tsv
rc=0; moe-convert consolidate flipped cons 2> cons.err || rc=$?
[ "$rc" = 2 ] && grep -q "optimizer-rank0.safetensors" cons.err ||
    { echo "FAIL: consolidate accepted a damaged optimizer file (rc $rc)"; cat cons.err; exit 1; }
moe-embed -q -m "$CKPT" seqs.fa --dtype f16 -o h.npy
moe-embed -q -m "$CKPT" seqs.fa --dtype f16 > h.tsv
"$PY" "$INTEROP/check_npy.py" h.npy h.tsv pooled f16
# a run directory means its latest checkpoint; FASTQ input; max/last pooling
moe-embed -q -m run reads.fq seqs.fa --pool max -o m.npy
"$PY" -c "import numpy as n, sys; a=n.load('m.npy'); sys.exit(0 if a.shape==(13,32) else 1)" \
    || { echo "FAIL: expected 10 reads + 3 sequences x 32"; exit 1; }

# BAM input with the htslib reader, filters and regions
BAM=/usr/share/htslib-test/test/range.bam
if [ -f "$BAM" ] && command -v samtools >/dev/null; then
    cp "$BAM" r.bam && samtools index r.bam
    n_all=$(samtools view -c -F 0xF00 r.bam)
    n_reg=$(samtools view -c -F 0xF00 r.bam CHROMOSOME_I:1-1000)
    [ "$(moe-embed -q -m "$CKPT" r.bam | wc -l)" = "$n_all" ]
    [ "$(moe-embed -q -m "$CKPT" r.bam -r CHROMOSOME_I:1-1000 | wc -l)" = "$n_reg" ]
fi

# deterministic: same inputs and options -> same bytes, whatever the thread count
moe-embed -q -m "$CKPT" seqs.fa reads.fq -o d1.npy
moe-embed -q -@ 1 -m "$CKPT" seqs.fa reads.fq -o d2.npy
cmp d1.npy d2.npy && cmp <(tail -n +2 d1.ids.tsv) <(tail -n +2 d2.ids.tsv)
# ... and the first line records the command, version and checkpoint (samtools @PG style)
head -1 d2.ids.tsv | grep -q "^#@PG	ID:moe-embed	PN:moe-embed	VN:$(moe-embed --version | awk 'NR == 1 {print $NF}')	CL:moe-embed -q -@ 1 -m $CKPT seqs.fa reads.fq -o d2.npy	DS:checkpoint $CKPT step 2 model-crc32 [0-9a-f]\{8\}$" ||
    { echo "FAIL: provenance line"; head -1 d2.ids.tsv; exit 1; }

# progress counts bases of windows, so one long record shows a percentage (and an ETA on
# the plain lines cluster logs get every 10 s)
zcat "$LAMBDA" | awk 'NR <= 71' > lam5k.fa   # 70 lines of 70 bases
moe-embed -m "$CKPT" lam5k.fa --window 128 -o lam.npy 2> lam.err
grep -q '^\[20[0-9-]*T[0-9:]*Z\] embed: 4.90k/4.90k bases (100%)' lam.err ||
    { echo "FAIL: no progress by bases"; cat lam.err; exit 1; }

# genomic coordinates (BED: 0-based, half-open): region offsets and windows included, and
# a reverse-complement document's rows on '-' over the same forward bases
samtools faidx seqs.fa 2>/dev/null || printf 'short\t10\t7\t10\t11\nmixed\t32\t35\t32\t33\nlong\t86\t73\t86\t87\n' > seqs.fa.fai
moe-embed -q -m "$CKPT" seqs.fa -r long:11-40 --window 8 --stride 4 --per-window -o reg.npy
[ "$(awk -F'\t' 'NR > 2 {printf "%s:%s-%s%s,", $4, $5, $6, $7}' reg.ids.tsv)" = \
  "long:10-18+,long:14-22+,long:18-26+,long:22-30+,long:26-34+,long:30-38+,long:34-40+," ] ||
    { echo "FAIL: region windows' coordinates"; cat reg.ids.tsv; exit 1; }
moe-tokenize -q -t nuc --revcomp add seqs.fa -o both.mtok
moe-embed -q -m "$CKPT" both.mtok --window 16 --stride 8 --per-window -o both.npy
moe-embed -q -m "$CKPT" both.mtok --per-token -o bt.npy
"$PY" - <<'PY'
rows = [l.rstrip("\n").split("\t") for l in open("both.ids.tsv")][2:]
fwd = {(r[3], r[4], r[5]) for r in rows if r[6] == "+"}
rev = {(r[3], r[4], r[5]) for r in rows if r[6] == "-"}
assert len(rows) == 2 * len(fwd) and rev, rows
# the reverse document's window 0 covers the forward strand's last bases
long_rev = [r for r in rows if r[2] == "long" and r[6] == "-"]
assert (long_rev[0][4], long_rev[0][5]) == ("70", "86"), long_rev[0]
offs = [l.rstrip("\n").split("\t") for l in open("bt.offsets.tsv")][1:]
ids = [l.rstrip("\n").split("\t") for l in open("bt.ids.tsv")][2:]
short_rev = [o for o in offs if ids[int(o[1])][2] == "short" and o[6] == "-"]
assert [(o[4], o[5]) for o in short_rev[:2]] == [("9", "10"), ("8", "9")], short_rev
PY

# --rc-average is strand invariant: a sequence and its reverse complement get one vector
printf '>fwd\nACGGTTCAGTCCATTGACNAGTACCA\n>rev\nTGGTACTNGTCAATGGACTGAACCGT\n' > strands.fa
moe-embed -q -m "$CKPT" --rc-average --window 12 --stride 5 strands.fa > rc.tsv
moe-embed -q -m "$CKPT" strands.fa > norc.tsv
"$PY" - <<'PY'
import numpy as np
def rows(f): return [np.array(l.split("\t")[1:], float) for l in open(f)]
a, b = rows("rc.tsv"); c, d = rows("norc.tsv")
assert np.abs(a - b).max() < 1e-5 * np.abs(a).max(), ("rc-average differs", np.abs(a - b).max())
assert np.abs(c - d).max() > 1e-3, "without --rc-average both strands should differ"
PY
# ... also per token: token i of one strand is token n-1-i of the other
moe-embed -q -m "$CKPT" --rc-average --per-token --window 12 --stride 5 strands.fa > rct.tsv
"$PY" - <<'PY'
import numpy as np
rows = [l.split("\t") for l in open("rct.tsv")]
f = np.array([r[2:] for r in rows if r[0] == "fwd"], float)
r = np.array([r[2:] for r in rows if r[0] == "rev"], float)
assert f.shape == r.shape == (26, 32), f.shape
assert np.abs(f - r[::-1]).max() < 1e-5 * np.abs(f).max(), np.abs(f - r[::-1]).max()
PY

# layer 0 = the embedding table: equal bases give equal rows; the final norm does not
printf '>a\nAAAA\n' > aaaa.fa
moe-embed -q -m "$CKPT" --per-token --layer 0 aaaa.fa > l0.tsv
moe-embed -q -m "$CKPT" --per-token aaaa.fa > l2.tsv
[ "$(cut -f3- l0.tsv | sort -u | wc -l)" = 1 ] || { echo "FAIL: layer 0 rows differ"; exit 1; }
[ "$(cut -f3- l2.tsv | sort -u | wc -l)" = 4 ] || { echo "FAIL: final-norm rows equal"; exit 1; }
[ "$(moe-embed -q -m "$CKPT" --layer -3 aaaa.fa | cut -f2-)" = "$(moe-embed -q -m "$CKPT" --layer 0 aaaa.fa | cut -f2-)" ]

# .mtok input with the checkpoint's tokenizer gives the FASTA's numbers
moe-tokenize -q -t nuc seqs.fa -o seqs.mtok
moe-embed -q -m "$CKPT" seqs.mtok > mtok.tsv
moe-embed -q -m "$CKPT" seqs.fa > fa.tsv
cmp mtok.tsv fa.tsv
moe-tokenize -q -t nuc seqs.fa -o sdir/ --shard-tokens 20   # a directory of 2 shards
moe-embed -q -m "$CKPT" sdir/ > dir.tsv
moe-embed -q -m "$CKPT" sdir/manifest.json > manifest.tsv
cmp dir.tsv fa.tsv && cmp manifest.tsv fa.tsv

# bad input: exit 2 with a message naming the problem, no output left behind
expect_fail() { # expect_fail PATTERN CMD...
    local pat=$1; shift
    set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
    if [ $rc -ne 2 ] || ! grep -q "$pat" err.txt; then
        echo "FAIL: '$*' gave exit $rc, stderr:"; cat err.txt; exit 1
    fi
}
moe-tokenize -q seqs.fa -o byte.mtok
expect_fail "another tokenizer" moe-embed -m "$CKPT" byte.mtok -o bad.npy
[ ! -e bad.npy ] && [ ! -e bad.ids.tsv ]
expect_fail "no such checkpoint" moe-embed -m nowhere seqs.fa
expect_fail "layer" moe-embed -m "$CKPT" --layer 7 seqs.fa
expect_fail "exceeds the model's context" moe-embed -m "$CKPT" --window 1000 seqs.fa
printf '>x\nACGT!!\n' > bad.fa
expect_fail "bad.fa" moe-embed -m "$CKPT" bad.fa
if ! nvidia-smi -L >/dev/null 2>&1; then
    expect_fail "cuda" moe-embed -m "$CKPT" --device cuda seqs.fa
fi
echo "embed_basic: ok"
