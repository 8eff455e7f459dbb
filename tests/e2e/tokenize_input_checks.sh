#!/usr/bin/env bash
# e2e.tokenize_input_checks: input mistakes that used to pass or mislead. A bare '>' header
# is refused (exit 2, line named); a region whose end is before its start says so (not
# "missing contig"); a region on an unindexed BAM hints at samtools index; --val-fraction
# that sends nothing to validation warns; a bad number names its option (moe-embed too).
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
LAMBDA="$MOE_SRC_DIR/data/lambda_virus.fa.gz"
rm -f ./*.mtok ./*.fai
printf '>a\nACGT\n>\nACGT\n' > bare.fa
expect 2 "bare.fa:3: record 2 \(\): empty record name" -- moe-tokenize bare.fa -o x.mtok
printf '@a\nACGT\n+\nIIII\n@ comment only\nACGT\n+\nIIII\n' > bare.fq
expect 2 "bare.fq:5: record 2 \(\): empty record name" -- moe-tokenize bare.fq -o x.mtok
[ ! -e x.mtok ] || fail "a refused input left x.mtok"

printf '>6\nACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGT\n' > six.fa
expect 2 'region "6:100-50": end 50 is before start 100' -- moe-tokenize -r 6:100-50 six.fa -o x.mtok
moe-tokenize -q -r 6:10-50 six.fa -o ok.mtok
t=/usr/share/htslib-test/test
if [ -f $t/range.bam ]; then
  cp $t/range.bam noindex.bam
  expect 2 "noindex.bam: --region needs an index" -- moe-tokenize -r CHROMOSOME_I noindex.bam -o x.mtok
  grep -q "samtools index noindex.bam" err.txt || fail "no samtools index hint: $(cat err.txt)"
  expect 2 'region "CHROMOSOME_I:900-100": end 100 is before start 900' -- \
    moe-tokenize -r CHROMOSOME_I:900-100 $t/range.bam -o x.mtok
fi
# one record: routed whole, nothing in validation: a warning, not silence
expect 0 "--val-fraction 0.05 sent none of the 1 documents to validation" -- \
  moe-tokenize "$LAMBDA" --val-fraction 0.05 -o one.mtok
# a bad number names its option
expect 2 "moe-embed: error: --window expects a number >= 1, not '0'" -- moe-embed --window 0 -m ck in.fa
expect 2 "moe-embed: error: --threads expects a number >= 1, not 'x'" -- moe-embed -@ x -m ck in.fa
expect 2 "moe-tokenize: error: --window expects a non-negative number, not '-3'" -- \
  moe-tokenize --window -3 six.fa
echo "ok: bare headers, reversed regions, unindexed BAM, empty validation split"
