#!/usr/bin/env bash
# e2e tokenize_threads: moe-tokenize -@ 1, 2 and 8 (3 and 16 for some) write byte-identical
# shards on FASTA (plain, gzip, bgzip), FASTQ, BAM and CRAM, with the tokenizer and document
# options that change the work per record (kmer, windows, N-split, reverse complements,
# validation split, soft-mask, directory output with rollover), and fail the same way on a
# bad record that sits behind several batches or in the first one; a large plain gzip input
# gets one hint to bgzip it. The inputs are many reader batches (1 Mbase / 8192 records)
# long, so the workers really encode different batches at once.
set -euo pipefail
HT=/usr/share/htslib-test/test
PCS=/usr/share/doc/seqkit-examples/tests/pcs109_5k.bam.gz
HAIRPIN=/usr/share/doc/seqkit-examples/tests/hairpin.fa.gz
READS=/usr/share/doc/bowtie2/examples/reads/reads_1.fq.gz
command -v samtools >/dev/null || { echo "samtools not installed: skip"; exit 77; }
command -v bgzip >/dev/null || { echo "bgzip not installed: skip"; exit 77; }
for f in "$HT/ce.fa" "$HT/range.cram" "$PCS" "$HAIRPIN" "$READS"; do
  [ -r "$f" ] || { echo "$f missing (htslib-test, seqkit-examples, bowtie2-examples): skip"; exit 77; }
done
export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s
fail() { echo "FAIL: $*" >&2; exit 1; }

# inputs: 12 renamed copies of ce.fa (12 MB, soft-masked case made up), many short records,
# reads, 4 x pcs109 (20,000 kept reads, a third reverse), and the CRAM with its reference
awk '/^>/ { n++; print ">c" n; next } { print (n % 3 ? tolower($0) : $0) }' \
  $(for _ in $(seq 12); do echo "$HT/ce.fa"; done) > big.fa
bgzip -c big.fa > big.fa.bgz
gzip -1 -c big.fa > big.fa.gz
zcat "$HAIRPIN" | awk '/^>/ { print; next } { gsub(/U/, "T"); print }' > hairpin.fa
zcat "$READS" > reads.fq
zcat "$PCS" > pcs.bam
samtools cat -o pcs4.bam pcs.bam pcs.bam pcs.bam pcs.bam
cp "$HT/ce.fa" "$HT/range.cram" "$HT/range.cram.crai" .

check() { # label, then moe-tokenize arguments without -@ and -o: -@ 2 and 8 == -@ 1
  local label=$1; shift
  moe-tokenize -q -@ 1 "$@" -o t1.mtok
  for t in 2 8; do
    moe-tokenize -q -@ "$t" "$@" -o "t$t.mtok"
    cmp t1.mtok "t$t.mtok" || fail "$label: -@ $t differs from -@ 1"
    if [ -e t1.val.mtok ]; then cmp t1.val.mtok "t$t.val.mtok" || fail "$label: -@ $t val"; fi
  done
  rm -f t*.mtok
}
for fa in big.fa big.fa.bgz big.fa.gz; do check "$fa" "$fa"; done
check "kmer" -t kmer -k 6 big.fa.bgz
check "windows" --window 1000 --stride 700 --revcomp add --val-fraction 0.2 big.fa.bgz
check "N split, non-overlapping windows" --n-runs split --window 5000 --val-fraction 0.3 big.fa.bgz
check "revcomp random, mask" --revcomp random --seed 7 --case upper+mask --bos big.fa.bgz
check "short records" -t nuc --iupac drop --min-length 40 hairpin.fa
check "FASTQ" --revcomp random reads.fq
check "BAM" pcs4.bam
check "BAM as stored" --as-stored --val-fraction 0.1 pcs4.bam
check "CRAM" --reference ce.fa range.cram
check "several inputs" hairpin.fa pcs.bam range.cram big.fa.bgz --reference ce.fa
check "several FASTA inputs" hairpin.fa big.fa.bgz hairpin.fa big.fa

# the pool's extremes: -@ 3 (two workers, one of them free for decompression at any time)
# and -@ 16 on a small machine (more workers than cores, many encodings queued at once)
for t in 3 16; do
  for in in big.fa.bgz pcs4.bam; do
    moe-tokenize -q -@ 1 --val-fraction 0.1 "$in" -o p1.mtok
    moe-tokenize -q -@ "$t" --val-fraction 0.1 "$in" -o "p$t.mtok"
    cmp p1.mtok "p$t.mtok" || fail "$in: -@ $t differs from -@ 1"
    cmp p1.val.mtok "p$t.val.mtok" || fail "$in: -@ $t validation shard differs from -@ 1"
  done
done
rm -f p*.mtok

# directory output rolling over every 1M tokens: same files, same manifest
rm -rf d1 d8
for t in 1 8; do moe-tokenize -q -@ $t --shard-tokens 1000000 --val-fraction 0.1 big.fa.bgz -o "d$t/"; done
[ "$(ls d1 | wc -l)" -gt 5 ] || fail "expected several shards in d1/"
diff -r d1 d8 || fail "directory output differs between -@ 1 and -@ 8"

same_failure() { # label, input, then thread counts: exit 2, no output, -@ 1's message
  local label=$1 in=$2; shift 2
  for t in 1 "$@"; do
    set +e
    moe-tokenize -q -@ "$t" "$in" -o "f$t.mtok" 2> "f$t.err"; local rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "$label, -@ $t: exit $rc"
    [ ! -e "f$t.mtok" ] || fail "$label, -@ $t: output left behind"
    cmp f1.err "f$t.err" || fail "$label: -@ $t says $(cat "f$t.err")"
  done
}
# a bad character in a record after several batches: the same message, exit 2, no file
{ cat big.fa; printf '>bad\nACGT\nAC#T\n'; cat big.fa; } > bad.fa
same_failure "bad record" bad.fa 8 16
grep -q "record 85 (bad)" f1.err || fail "bad record message: $(cat f1.err)"
# the same in the first batch, with every later batch queued or encoding when it is found
{ printf '>bad\nAC#T\n'; cat big.fa; } > bad_first.fa
same_failure "bad first record" bad_first.fa 16
# a reader error (a header without a name) after many records: the same message and line
{ cat big.fa; printf '>\nACGT\n'; } > noname.fa
same_failure "nameless header" noname.fa 8
grep -q "empty record name" f1.err || fail "nameless header: $(cat f1.err)"
# a plain gzip input over 100 MB gets one hint to bgzip it (once, however many there are);
# the same text in BGZF, or a small gzip, gets none. Stored deflate blocks of blank lines
# (one empty record) keep this fast.
python3 - <<'PY'
import zlib
c = zlib.compressobj(0, zlib.DEFLATED, 31)
with open("huge.fa.gz", "wb") as f:
    f.write(c.compress(b">x\n"))
    chunk = b"\n" * 1000000
    for _ in range(101):
        f.write(c.compress(chunk))
    f.write(c.flush())
PY
[ "$(stat -c %s huge.fa.gz)" -gt 100000000 ] || fail "huge.fa.gz is not over 100 MB"
moe-tokenize -@ 2 huge.fa.gz huge.fa.gz hairpin.fa > /dev/null 2> hint.err
[ "$(grep -c 'hint: huge.fa.gz is 10[0-9] MB of plain gzip' hint.err)" -eq 1 ] \
  || fail "expected one bgzip hint: $(cat hint.err)"
zcat huge.fa.gz | bgzip -l 0 -c > huge.fa.bgz
moe-tokenize -@ 2 huge.fa.bgz hairpin.fa big.fa.gz > /dev/null 2> nohint.err
! grep -q "hint:" nohint.err || fail "hint without a large plain gzip input: $(cat nohint.err)"
rm -f huge.fa.gz huge.fa.bgz
echo "tokenize_threads: ok"
