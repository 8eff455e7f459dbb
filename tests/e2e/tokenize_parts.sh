#!/usr/bin/env bash
# e2e tokenize_parts: `--part I/N` for N = 1, 3, 7, merged with `moe-tokenize merge`, is
# byte for byte the single-process output - file output with a validation split, directory
# output with rollover, and -@ 2 / 4 - on FASTA (plain, gzip, bgzip), FASTQ, BAM and CRAM
# (split by reference sequence; unplaced reads in the last part), also when the parts were
# made with different -@. Also the refusals (stdin, two inputs, SAM, an unsorted CRAM, bad
# I/N, regions).
set -euo pipefail
HT=/usr/share/htslib-test/test
PCS=/usr/share/doc/seqkit-examples/tests/pcs109_5k.bam.gz
SIRV=/usr/share/doc/seqkit-examples/tests/SIRV_150601a.fasta.gz
READS=/usr/share/doc/bowtie2/examples/reads/reads_1.fq.gz
command -v samtools >/dev/null || { echo "samtools not installed: skip"; exit 77; }
command -v bgzip >/dev/null || { echo "bgzip not installed: skip"; exit 77; }
for f in "$HT/ce.fa" "$HT/range.cram" "$PCS" "$SIRV" "$READS"; do
  [ -r "$f" ] || { echo "$f missing (htslib-test, seqkit-examples, bowtie2-examples): skip"; exit 77; }
done
export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf ./*

awk '/^>/ { n++; print ">c" n; next } { print }' $(for _ in $(seq 6); do echo "$HT/ce.fa"; done) > big.fa
bgzip -c big.fa > big.fa.bgz
gzip -1 -c big.fa > big.fa.gz
zcat "$READS" > reads.fq
zcat "$PCS" > pcs.bam                       # coordinate-sorted, 58 unplaced reads
samtools cat -o pcs3.bam pcs.bam pcs.bam pcs.bam
zcat "$SIRV" > sirv.fa
samtools view -C -T sirv.fa -o pcs.cram pcs.bam
cp "$HT/ce.fa" "$HT/range.cram" "$HT/range.cram.crai" .

split_merge() { # label, N, then arguments (input included): merged parts == one run
  local label=$1 n=$2; shift 2
  rm -rf whole* part* merged*
  moe-tokenize -q "$@" --val-fraction 0.2 -o whole.mtok
  local parts=()
  for i in $(seq "$n"); do
    moe-tokenize -q "$@" --val-fraction 0.2 --part "$i/$n" -o "part$i.mtok"
    parts+=("part$i.mtok")
  done
  moe-tokenize merge -q -o merged.mtok "${parts[@]}"
  cmp whole.mtok merged.mtok || fail "$label, N=$n: merged train shard differs"
  cmp whole.val.mtok merged.val.mtok || fail "$label, N=$n: merged validation shard differs"
  # directory output: the parts as directories, merged with the same rollover
  moe-tokenize -q "$@" --val-fraction 0.2 --shard-tokens 300000 -o whole/
  parts=()
  for i in $(seq "$n"); do
    moe-tokenize -q "$@" --val-fraction 0.2 --part "$i/$n" -o "part$i/"
    parts+=("part$i/")
  done
  moe-tokenize merge -q --shard-tokens 300000 -o merged/ "${parts[@]}"
  diff -r whole merged || fail "$label, N=$n: merged directory differs"
}
for n in 1 3 7; do
  split_merge "FASTA" "$n" big.fa
  split_merge "bgzip FASTA" "$n" big.fa.bgz --revcomp random
  split_merge "FASTQ" "$n" reads.fq
  split_merge "BAM" "$n" pcs3.bam
  split_merge "CRAM" "$n" pcs.cram -T sirv.fa --revcomp random
done
split_merge "gzip FASTA, kmer" 3 big.fa.gz -t kmer
split_merge "BAM, -@ 2" 3 pcs3.bam -@ 2 --revcomp random
split_merge "bgzip FASTA, -@ 4" 3 big.fa.bgz -@ 4 # the reader's kept text, other parts skipped
split_merge "CRAM, 7 sequences in 7 parts" 7 range.cram -T ce.fa
# the parts do not depend on -@ (a FASTA record's part is the BGZF block its header starts
# in, not how far the reader had read): parts made with different -@ still merge to one run
for in in big.fa big.fa.bgz big.fa.gz; do
  moe-tokenize -q "$in" -o whole.mtok
  mixed=()
  for i in 1 2 3 4 5; do
    moe-tokenize -q -@ $((i % 2 ? 1 : 4)) --part "$i/5" "$in" -o "mix$i.mtok"
    mixed+=("mix$i.mtok")
  done
  moe-tokenize merge -q -o merged.mtok "${mixed[@]}"
  cmp whole.mtok merged.mtok || fail "$in: parts made with -@ 1 and -@ 4 do not merge to one run"
done
rm -f mix*.mtok merged.mtok whole.mtok
# every part of a real split holds something (the split is not all in one part)
moe-tokenize -q --part 2/3 big.fa.bgz -o p2.mtok
[ "$(moe-tokenize stats --json p2.mtok | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["documents"])')" -gt 0 ] \
  || fail "part 2/3 of big.fa.bgz is empty"

refuse() { # expected message, then arguments: exit 2 and the message
  local want=$1; shift
  set +e
  moe-tokenize -q "$@" -o r.mtok 2> r.err; local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "$* should exit 2, not $rc"
  grep -q -- "$want" r.err || fail "$*: expected '$want' in: $(cat r.err)"
  [ ! -e r.mtok ] || fail "$*: output left behind"
}
refuse "stdin" --part 1/2 - < big.fa
refuse "one input" --part 1/2 big.fa reads.fq
refuse "I/N" --part 3/2 big.fa
refuse "I/N" --part 0/2 big.fa
samtools view -h pcs.bam > pcs.sam
refuse "SAM" --part 1/2 pcs.sam
samtools view -H pcs.bam | sed 's/SO:coordinate/SO:unsorted/' > unsorted.sam
samtools reheader unsorted.sam pcs.bam > unsorted.bam
samtools view -C -T sirv.fa -o unsorted.cram unsorted.bam
refuse "coordinate-sorted" --part 1/2 unsorted.cram -T sirv.fa
refuse "region" --part 1/2 -r CHROMOSOME_I ce.fa
echo "tokenize_parts: ok"
