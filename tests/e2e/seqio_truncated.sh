#!/usr/bin/env bash
# e2e.seqio_truncated: BAM and CRAM inputs without their end-of-file marker are refused with
# exit 2 (htslib only warns, and a CRAM cut at a container boundary decodes cleanly up to the
# cut); a CRAM damaged inside a container, whose header names no reference, is not blamed on
# a missing --reference. Inputs: Debian's htslib-test range.bam/range.cram (on ce.fa) and a
# CRAM made here from bowtie2-examples' unaligned combined_reads.bam.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
t=/usr/share/htslib-test/test
bam=/usr/share/doc/bowtie2/examples/reads/combined_reads.bam.gz
[ -f $t/range.cram ] && [ -f $bam ] && command -v samtools >/dev/null ||
  { echo "skip: needs htslib-test, bowtie2-examples and samtools"; exit 77; }
cut_tail() { head -c $(( $(stat -c %s "$1") - $2 )) "$1" > "$3"; } # FILE BYTES OUT

# aligned CRAM with its reference: whole is fine; without the 38-byte EOF container, refused
rm -f ./*.mtok
cp $t/ce.fa ce.fa
moe-tokenize -q -T ce.fa $t/range.cram -o whole.mtok
cut_tail $t/range.cram 38 noeof.cram
# range.cram ends with two EOF containers: cut until the file ends with none
while cmp -s <(tail -c 38 noeof.cram) <(tail -c 38 $t/range.cram); do
  cut_tail noeof.cram 38 noeof.tmp && mv noeof.tmp noeof.cram
done
expect 2 "noeof.cram: CRAM end-of-file marker missing: the file is truncated" -- \
  moe-tokenize -q -T ce.fa noeof.cram -o x.mtok
[ ! -e x.mtok ] || fail "a refused CRAM left x.mtok"
# BAM without its 28-byte BGZF EOF block
cut_tail $t/range.bam 28 noeof.bam
expect 2 "noeof.bam: BAM end-of-file marker missing" -- moe-tokenize -q noeof.bam -o x.mtok

# an unaligned CRAM with several containers: cut at the last container boundary and in the
# middle; damaged mid-container with the EOF container put back: a decode error whose hint
# does not ask for a reference (the header has no @SQ)
gzip -dc $bam > reads.bam
samtools view -C -o reads.cram reads.bam
moe-tokenize -q reads.cram -o all.mtok
cut_tail reads.cram 38 boundary.cram
expect 2 "boundary.cram: CRAM end-of-file marker missing" -- moe-tokenize -q boundary.cram -o x.mtok
half=$(( $(stat -c %s reads.cram) / 2 ))
head -c $half reads.cram > mid.cram
expect 2 "mid.cram: CRAM end-of-file marker missing" -- moe-tokenize -q mid.cram -o x.mtok
cat mid.cram <(tail -c 38 reads.cram) > damaged.cram
expect 2 "damaged.cram: cannot decode record" -- moe-tokenize -q damaged.cram -o x.mtok
grep -q "reference" err.txt && fail "damaged unaligned CRAM: the hint blames the reference: $(cat err.txt)"
grep -q "truncated or corrupt" err.txt || fail "damaged CRAM: no truncated/corrupt hint"
echo "ok: truncated BAM/CRAM refused, damaged CRAM hint"
