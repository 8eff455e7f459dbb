#!/usr/bin/env bash
# score_variants: `moe-score variants` on a VCF written here for the lambda genome (SNVs, an
# MNV, insertions, deletions, a multi-allelic site, the same site split into two records, a
# symbolic ALT, a REF mismatch, a variant too close to the contig start): every scored
# ALT's MOE_LLR equals `moe-score seq` on its REF and ALT windows written out as FASTA by the
# rule of docs/cli.md (restated here), for the sum, --reduce mean and --rc-average (the ALT
# windows run from their first differing token on, continuing the REF's cached keys), and
# with --window-grid (the grid's rule; variants in one window's middle half share it); one REF
# window per position; Debian's bcftools reads the VCF, bgzip
# VCF and BCF outputs (query of INFO/MOE_LLR, the header lines); the TSV's #@PG provenance
# line and the ##moe_score line name the checkpoint as moe-embed does; and every bad input of the
# issue: REF mismatch (exit 2, naming the record; --check-ref warn skips and counts),
# missing contig with the chr-prefix hint, gzip FASTA without .fai, no output left behind;
# POS 0, NUL bytes in a record, a record of fewer than 8 columns or of fewer than its header's
# samples ask for, a POS or QUAL that is not a number, an empty ALT allele; a VCF with nothing to score
# passes through; FILTER and INFO tags the header does not define are written back as they were.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "SKIP: no python3 with numpy (apt install python3-numpy)"; exit 77; fi
command -v bcftools >/dev/null || { echo "SKIP: bcftools is needed (apt install bcftools)"; exit 77; }
command -v samtools >/dev/null || { echo "SKIP: samtools is needed (apt install samtools)"; exit 77; }
zcat "$LAMBDA" | sed '1s/^>.*/>lambda/' > ref.fa
samtools faidx ref.fa
W=200
"$PY" - <<'PY'
seq = "".join(l.strip() for l in open("ref.fa") if not l.startswith(">"))
b = lambda p: seq[p - 1]  # 1-based
other = lambda c: "A" if c != "A" else "C"
recs = [
    (500, b(500), other(b(500))),                                    # SNV
    (700, b(700), other(b(700))),                                    # SNV
    (1000, seq[999:1002], "".join(other(c) for c in seq[999:1002])),  # MNV
    (2000, b(2000), b(2000) + "ACGT"),                               # insertion
    (2500, b(2500), b(2500) + "GATTACA" * 20),                       # insertion > W/2
    (3000, seq[2999:3005], b(3000)),                                 # deletion
    (3500, seq[3499:3520], b(3500)),                                 # deletion of 20
    (4000, b(4000), ",".join(c for c in "ACGT" if c != b(4000))),    # multi-allelic
    (4500, b(4500), other(b(4500))),                                 # the same site split
    (4500, b(4500), "G" if b(4500) != "G" and other(b(4500)) != "G" else "T"),  # in two
    (5000, b(5000), "<DEL>"),                                        # symbolic
    (5500, b(5500), "A,<INS>"),                                      # SNV + symbolic
    (50, b(50), other(b(50))),                                       # window off the start
    (6000, other(b(6000)), "G" if other(b(6000)) != "G" else "T"),   # REF mismatch
]
with open("calls.vcf", "w") as f:
    f.write("##fileformat=VCFv4.2\n##contig=<ID=lambda,length=%d>\n" % len(seq))
    f.write("#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n")
    for i, (p, r, a) in enumerate(recs):
        f.write(f"lambda\t{p}\tv{i}\t{r}\t{a}\t.\t.\t.\n")
PY
awk -F'\t' '$2 != 6000' calls.vcf > good.vcf
sc() { moe-score variants -q -m "$CKPT" -f ref.fa --window $W "$@"; }

# the windows, written out by the documented rule, scored by `seq`
windows_fa() { # windows_fa TSV OUT.fa [grid]: REF and ALT window of every scored ALT
    "$PY" - "$1" "$2" "$W" "${3:-centred}" <<'PY'
import sys
tsv, out, W, grid = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "grid"
seq = "".join(l.strip() for l in open("ref.fa") if not l.startswith(">"))
with open(out, "w") as f:
    for i, line in enumerate(open(tsv).read().splitlines()[2:]):  # after #@PG and the header
        chrom, pos, vid, ref, alt, llr = line.split("\t")
        if llr == ".":
            continue
        p0 = int(pos) - 1
        # centred: the variant at W/2; grid: the multiple of W/2 with p0 - s in [W/4, 3W/4)
        s = (p0 - W // 4) // (W // 2) * (W // 2) if grid else p0 - W // 2
        refw = seq[s:s + W]
        altw = (seq[s:p0] + alt + seq[p0 + len(ref):p0 + len(ref) + W])[:W]
        assert len(refw) == W and len(altw) == W
        f.write(f">r{i}\n{refw}\n>a{i}\n{altw}\n")
PY
}
check_llr() { # check_llr VARIANTS_TSV SEQ_TSV mean|sum
    "$PY" - "$@" <<'PY'
import sys
var, ll, mode = sys.argv[1:]
rows = [l.split("\t") for l in open(var).read().splitlines()[2:]]
lls = [l.split("\t") for l in open(ll).read().splitlines()[2:]]
scored = [r for r in rows if r[5] != "."]
assert len(lls) == 2 * len(scored), (len(lls), len(scored))
worst = 0.0
for k, r in enumerate(scored):
    ref, alt = lls[2 * k], lls[2 * k + 1]
    if mode == "mean":  # per scored token: length - 1 tokens without a BOS (nuc)
        want = float(alt[2]) / (int(alt[1]) - 1) - float(ref[2]) / (int(ref[1]) - 1)
    else:
        want = float(alt[2]) - float(ref[2])
    worst = max(worst, abs(float(r[5]) - want))
    assert abs(float(r[5]) - want) <= 2e-4, (r, want)
print(f"check_llr: {len(scored)} ALTs ({mode}) equal seq on their windows (max diff {worst:.2g})")
PY
}
sc good.vcf --tsv > llr.tsv
[ "$(awk -F'\t' 'NR > 2 && $6 != "."' llr.tsv | wc -l)" = 13 ]  # 16 ALTs - 2 symbolic - 1 edge
windows_fa llr.tsv win.fa
moe-score seq -q -m "$CKPT" win.fa > win.tsv
check_llr llr.tsv win.tsv sum
# ... with the ALT windows continuing their REF windows' cached keys (the log says so)
log=$(moe-score variants -m "$CKPT" -f ref.fa --window $W good.vcf --tsv 2>&1 >/dev/null)
grep -q "ALT windows continue their REF windows' cached keys" <<< "$log"
sc good.vcf --tsv --reduce mean > mean.tsv
check_llr mean.tsv win.tsv mean
sc good.vcf --tsv --rc-average > rc.tsv
moe-score seq -q -m "$CKPT" --rc-average win.fa > winrc.tsv
check_llr rc.tsv winrc.tsv sum
# --window-grid: the same checks on the grid's windows, and variants of one window's middle
# half share its REF window: 8 SNVs 12 bases apart (POS0 1000..1084; grid windows start at
# 900 for POS0 < 1050, else at 1000) run 2 REF + 8 ALT windows, centred 8 + 8
sc good.vcf --tsv --window-grid > grid.tsv
windows_fa grid.tsv gridwin.fa grid
moe-score seq -q -m "$CKPT" gridwin.fa > gridwin.tsv
check_llr grid.tsv gridwin.tsv sum
awk '/^#/ {print; next} {exit}' good.vcf > dense.vcf
"$PY" - >> dense.vcf <<'PY'
seq = "".join(l.strip() for l in open("ref.fa") if not l.startswith(">"))
for i in range(8):
    p = 1001 + 12 * i
    print(f"lambda\t{p}\td{i}\t{seq[p - 1]}\t{'A' if seq[p - 1] != 'A' else 'C'}\t.\t.\t.")
PY
for mode in centred grid; do
    flag=$([ $mode = grid ] && echo --window-grid || true)
    moe-score variants -m "$CKPT" -f ref.fa --window $W $flag --tsv dense.vcf 2>dense.$mode.log \
        > dense.$mode.tsv
done
grep -q "8 scored,.*; 16 windows in" dense.centred.log
grep -q "8 scored,.*; 10 windows in" dense.grid.log
windows_fa dense.grid.tsv densewin.fa grid
moe-score seq -q -m "$CKPT" densewin.fa > densewin.tsv
check_llr dense.grid.tsv densewin.tsv sum

# VCF, bgzip VCF and BCF: bcftools reads them; the values are the TSV's
for t in v z b; do
    sc good.vcf -O $t -o out.$t 2>log.txt
    bcftools view -h out.$t > hdr.$t
    grep -q '^##INFO=<ID=MOE_LLR,Number=A,Type=Float' hdr.$t
    grep -q '^##moe_score=<model=.*,step=2,checkpoint=.*,tokenizer=nuc,window=200,' hdr.$t
    bcftools query -f '%CHROM\t%POS\t%INFO/MOE_LLR\n' out.$t > q.$t
done
cmp q.v q.z && cmp q.v q.b
"$PY" - <<'PY'
q = [l.split("\t") for l in open("q.v").read().splitlines()]
t = [l.split("\t") for l in open("llr.tsv").read().splitlines()[2:]]
vals = [v for r in q for v in r[2].split(",")]
assert len(vals) == len(t), (len(vals), len(t))
for v, r in zip(vals, t):
    assert (v == ".") == (r[5] == "."), (v, r)
    assert v == "." or abs(float(v) - float(r[5])) <= 1e-5 * max(1, abs(float(v))), (v, r)
PY
# provenance: the TSV's line 1 is the #@PG line moe-embed writes for this checkpoint (its
# id: dir, step, model CRC-32), with moe-score's version and command line; the VCF's
# ##moe_score line names the same checkpoint id and command
moe-embed -q -m "$CKPT" win.fa -o emb.npy
version=$(moe-score --version | sed -n '1s/^moe-score (moe-genomics) //p')
ds=$(awk -F'\t' 'NR == 1 { print $NF }' emb.ids.tsv)
cl="moe-score variants -q -m $CKPT -f ref.fa --window $W good.vcf --tsv"
want=$(printf '#@PG\tID:moe-score\tPN:moe-score\tVN:%s\tCL:%s\t%s' "$version" "$cl" "$ds")
[ "$(awk 'NR == 1' llr.tsv)" = "$want" ] || { echo "FAIL: llr.tsv line 1 is not '$want'"; exit 1; }
[ "$(awk 'NR == 2' llr.tsv)" = "$(printf 'chrom\tpos\tid\tref\talt\tllr')" ]
cl="moe-score variants -q -m $CKPT -f ref.fa --window $W good.vcf -O v -o out.v"
grep -qF "##moe_score=<model=\"$CKPT\",step=2,checkpoint=\"${ds#DS:checkpoint }\",tokenizer=nuc,window=200,windows=centred,reduce=sum,strands=1,version=$version,command=\"$cl\">" hdr.v ||
    { echo "FAIL: the ##moe_score line:"; grep '^##moe_score' hdr.v; exit 1; }
# skipped ALTs are counted in the summary
moe-score variants -m "$CKPT" -f ref.fa --window $W good.vcf -o out2.vcf 2>log.txt
# one REF window per position (the split site's two records share theirs), one per ALT
grep -q "16 ALT alleles: 13 scored, skipped 2 symbolic, 1 with a window off the contig, 0 REF mismatches; 23 windows" log.txt

# REF mismatch: an error naming the record, nothing left under the output name
expect2() { local rc=0; "$@" 2>err.txt >/dev/null || rc=$?; [ "$rc" = 2 ] || { echo "FAIL: exit $rc: $*" >&2; cat err.txt >&2; exit 1; }; }
expect2 sc calls.vcf -o bad.vcf
grep -q "record 14: lambda:6000: REF .*does not match the reference" err.txt
[ ! -e bad.vcf ] && ! ls .bad.vcf* 2>/dev/null
moe-score variants -m "$CKPT" -f ref.fa --window $W calls.vcf --check-ref warn -o warn.vcf 2>log.txt
grep -q "1 REF mismatches" log.txt
[ "$(bcftools query -f '%POS\t%INFO/MOE_LLR\n' -i 'POS=6000' warn.vcf)" = "$(printf '6000\t.')" ]
# FILTER and INFO tags the header does not define (htslib defines them while it reads): each
# record is written with its own tags (one header to read and write with)
awk -F'\t' 'BEGIN { OFS = "\t" } !/^#/ && $2 == 500 { $7 = "LowQual"; $8 = "DP=7" } { print }' \
    good.vcf > undef.vcf
sc undef.vcf -o undef.out.vcf 2>/dev/null
grep -qP '^lambda\t500\tv0\t.*\tLowQual\tDP=7;MOE_LLR=-?[0-9]' undef.out.vcf ||
    { echo "FAIL: undefined tags:"; grep -v '^##' undef.out.vcf | head -3; exit 1; }
# a record of fewer than 8 columns: exit 2 naming it (htslib reads it without an error)
awk -F'\t' 'BEGIN { OFS = "\t" } !/^#/ && $2 == 700 { NF = 4 } { print }' good.vcf > short.vcf
expect2 sc short.vcf -o short.out.vcf
grep -q "record 2: 4 tab-separated columns; a VCF record has at least 8" err.txt
# what htslib reads without an error but would write back changed: exit 2 naming the record
# and the column (POS text read as 0, QUAL text written back as 0, an empty ALT allele as
# "."), and a record short of the header's sample columns (writing it failed, exit 1)
for bad in '2 x700 POS .x700. is not a number' '6 abc QUAL .abc. is neither a number' \
           '5 C, ALT .C,. has an empty allele' '5 ,C ALT .,C. has an empty allele' \
           '5 A,,C ALT .A,,C. has an empty allele'; do
    set -- $bad
    awk -F'\t' -v c="$1" -v t="$2" 'BEGIN { OFS = "\t" } !/^#/ && $2 == 700 { $c = t } { print }' \
        good.vcf > field.vcf
    expect2 sc field.vcf -o field.out.vcf
    shift 2
    grep -q "field.vcf: record 2: $*" err.txt || { cat err.txt >&2; exit 1; }
    [ ! -e field.out.vcf ]
done
# (without FORMAT htslib reads it; with too few samples it refuses it, saying why)
for short in '' '\tGT\t0/1'; do
    awk -F'\t' -v s="$short" 'BEGIN { OFS = "\t" } /^#CHROM/ { $0 = $0 "\tFORMAT\tS1\tS2" }
        !/^#/ { $0 = $0 ($2 == 700 ? s : "\tGT\t0/1\t1/1") } { print }' good.vcf > samples.vcf
    expect2 sc samples.vcf -o samples.out.vcf
    grep -q "record 2: 8 tab-separated columns; the header names 2 samples, so a record has 11\|record 2: htslib cannot read this record" err.txt || { cat err.txt >&2; exit 1; }
done
# contig named differently: the chr-prefix hint
sed 's/^lambda\t/chrlambda\t/; s/ID=lambda,/ID=chrlambda,/' good.vcf > chr.vcf
expect2 sc chr.vcf
grep -q "contig 'chrlambda' is not in the reference" err.txt && grep -q "chr prefix" err.txt
# gzip FASTA without an index
cp "$LAMBDA" plain.fa.gz
expect2 moe-score variants -m "$CKPT" -f plain.fa.gz good.vcf
grep -q "bgzip" err.txt
# text that is not a VCF (fuzz_vcf: the format description was leaked; ASan in make
# test-asan sees it)
printf 'AL\tFILTER\tINFO\nchr1\t50\t.\tG\tA\n' > notvcf.txt
expect2 sc notvcf.txt
grep -q "notvcf.txt: not a VCF or BCF file" err.txt || { cat err.txt >&2; exit 1; }
# POS 0 (or empty): refused naming the record (fuzz_vcf: the REF check read before the
# reference it had fetched)
{ grep '^#' good.vcf; printf 'lambda\t0\t.\tA\tC\t.\t.\t.\n'; } > pos0.vcf
expect2 sc pos0.vcf
grep -q "pos0.vcf: record 1: lambda: POS 0 is not a position" err.txt || { cat err.txt >&2; exit 1; }
# NUL bytes in a record (htslib then gives it no alleles): refused naming the record
# (fuzz_vcf: a NULL allele array was read)
{ grep '^#' good.vcf; printf 'lambda\t50\t.\0\0\0\tG\tA\t.\tPASS\t.\n'; } > nul.vcf
expect2 sc nul.vcf
grep -q "nul.vcf: record 1: " err.txt && grep -q "no NUL bytes" err.txt || { cat err.txt >&2; exit 1; }
# -r keeps only the records in the region
sc good.vcf --tsv -r lambda:1-1500 > reg.tsv
[ "$(tail -n +3 reg.tsv | cut -f2 | sort -u | tr '\n' ' ')" = "1000 50 500 700 " ]
# nothing to score (symbolic ALTs only): the records pass through without MOE_LLR (fuzz_vcf
# found the empty batch sorted through a NULL array; UBSan in make test-asan stops there)
grep '^#' good.vcf > sym.vcf
grep -P '\t<DEL>\t' good.vcf >> sym.vcf
sc sym.vcf -o sym.out.vcf 2>log.txt
[ "$(bcftools query -f '%POS\t%INFO/MOE_LLR\n' sym.out.vcf)" = "$(printf '5000\t.')" ] ||
    { echo "FAIL: symbolic-only VCF: $(cat log.txt)" >&2; exit 1; }
echo "score_variants: ok"
