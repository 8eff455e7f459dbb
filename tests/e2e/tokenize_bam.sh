#!/usr/bin/env bash
# e2e tokenize_bam: SAM/BAM/CRAM through moe-tokenize against samtools - the read filter
# selects exactly the records samtools selects with the same flags, reverse-strand reads
# come back in sequenced orientation (= samtools fasta), CRAM decodes with ce.fa and fails
# clearly without it, regions match `samtools view -c REGION`, truncated BAM exits 2.
set -euo pipefail
HT=/usr/share/htslib-test/test
PCS=/usr/share/doc/seqkit-examples/tests/pcs109_5k.bam.gz
UBAM=/usr/share/doc/bowtie2/examples/reads/combined_reads.bam.gz
command -v samtools >/dev/null || { echo "samtools not installed: skip"; exit 77; }
for f in "$HT/range.cram" "$PCS" "$UBAM"; do
  [ -r "$f" ] || { echo "$f missing (htslib-test, seqkit-examples, bowtie2-examples): skip"; exit 77; }
done
# samtools must not reach the network either
export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s
fail() { echo "FAIL: $*" >&2; exit 1; }
ndoc() { moe-tokenize stats --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["documents"])'; }
ntok() { moe-tokenize stats --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tokens"])'; }
names_seqs() { awk '/^>/ { print $1; next } { print }'; }

zcat "$PCS" > pcs.bam
zcat "$UBAM" > ubam.bam
# 1. default filter = samtools -F 0xF00 (5,000 primary reads of 12,447 records)
moe-tokenize -q pcs.bam --no-eos -o pcs.mtok
[ "$(ndoc pcs.mtok)" -eq "$(samtools view -c -F 0xF00 pcs.bam)" ] || fail "default filter"
[ "$(ntok pcs.mtok)" -eq "$(samtools view -F 0xF00 pcs.bam | awk '{ s += length($10) } END { print s }')" ] || fail "bases"
# reverse-strand reads restored: identical to samtools fasta
cmp <(moe-tokenize decode -w 0 pcs.mtok | names_seqs) \
    <(samtools fasta -F 0xF00 pcs.bam 2>/dev/null | names_seqs) || fail "orientation/sequence"
# --as-stored: the stored SEQ column
cmp <(moe-tokenize -q pcs.bam --as-stored --no-eos | moe-tokenize decode -w 0 - | grep -v '^>') \
    <(samtools view -F 0xF00 pcs.bam | cut -f10) || fail "--as-stored"
# other filters
for args in "--exclude-flags 0:-F 0" "--exclude-flags 0x900:-F 0x900" "--min-mapq 30:-F 0xF00 -q 30" \
            "--require-flags 16:-F 0xF00 -f 16" "-F 0x904 -f 0:-F 0x904"; do
  ours=${args%%:*}; theirs=${args#*:}
  # shellcheck disable=SC2086
  moe-tokenize -q pcs.bam $ours -o f.mtok
  # shellcheck disable=SC2086
  # records without SEQ ('*', most secondary alignments) are skipped as empty
  [ "$(ndoc f.mtok)" -eq "$(samtools view $theirs pcs.bam | awk '$10 != "*"' | wc -l)" ] \
    || fail "filter $ours vs samtools $theirs"
done
# 2. unaligned BAM (no @SQ)
moe-tokenize -q ubam.bam -@ 2 -o u.mtok
[ "$(ndoc u.mtok)" -eq "$(samtools view -c -F 0xF00 ubam.bam)" ] || fail "unaligned BAM"
moe-tokenize -q ubam.bam -@ 1 -o u1.mtok
cmp u.mtok u1.mtok || fail "--threads changed the BAM output"
# 3. CRAM with its reference equals the BAM of the same reads; without it: exit 2 + hint
cp "$HT/ce.fa" "$HT/range.bam" "$HT/range.bam.bai" "$HT/range.cram" "$HT/range.cram.crai" .
moe-tokenize -q range.cram --reference ce.fa -o cram.mtok
moe-tokenize -q range.bam -o bam.mtok
cmp <(moe-tokenize decode cram.mtok) <(moe-tokenize decode bam.mtok) || fail "CRAM != BAM"
[ "$(ndoc cram.mtok)" -eq "$(samtools view -c -F 0xF00 -T ce.fa range.cram)" ] || fail "CRAM count"
set +e
moe-tokenize -q range.cram -o nocram.mtok 2> nocram.err; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "CRAM without reference: exit $rc"
grep -q -- "--reference" nocram.err || fail "CRAM message: $(cat nocram.err)"
[ ! -e nocram.mtok ] || fail "a failed run left nocram.mtok"
# 4. regions on indexed BAM and CRAM, and from a BED file
for reg in CHROMOSOME_I:1-1000 CHROMOSOME_I:10000-20000 CHROMOSOME_II; do
  moe-tokenize -q range.bam -r "$reg" -o reg.mtok
  [ "$(ndoc reg.mtok)" -eq "$(samtools view -c -F 0xF00 range.bam "$reg")" ] || fail "region $reg"
done
printf 'CHROMOSOME_I\t0\t1000\nCHROMOSOME_I\t9999\t20000\n' > r.bed
moe-tokenize -q range.cram -T ce.fa --regions-file r.bed -o bed.mtok
[ "$(ndoc bed.mtok)" -eq "$(samtools view -c -F 0xF00 -T ce.fa -M -L r.bed range.cram)" ] || fail "BED regions"
# 5. indexed FASTA regions = samtools faidx
moe-tokenize -q ce.fa -r CHROMOSOME_I:1001-1100 -r CHROMOSOME_III --no-eos -o fa.mtok
cmp <(moe-tokenize decode -w 0 fa.mtok | grep -v '^>' | tr -d '\n') \
    <(samtools faidx ce.fa CHROMOSOME_I:1001-1100 CHROMOSOME_III | grep -v '^>' | tr -d '\n') \
  || fail "FASTA regions"
# 6. truncated BAM (missing EOF block, and cut mid-block): exit 2, no output left
head -c 300000 pcs.bam > cut.bam
set +e
moe-tokenize -q cut.bam -o cut.mtok 2>/dev/null; rc=$?
set -e
[ "$rc" -eq 2 ] && [ ! -e cut.mtok ] || fail "truncated BAM: exit $rc"
echo "tokenize_bam: ok"
