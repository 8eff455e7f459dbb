#!/usr/bin/env bash
# e2e tokenize_parts: `--part I/N` for N = 1, 3, 7, merged with `moe-tokenize merge`, is
# byte for byte the single-process output - file output with a validation split, directory
# output with rollover, and -@ 2 / 4 - on FASTA (plain, gzip, bgzip), FASTQ, BAM and CRAM
# (split by reference sequence; unplaced reads in the last part), also when the parts were
# made with different -@. A bgzip FASTA with a samtools faidx index: N = 1, 3, 7, 16 with
# -@ 1 and 4 seek (-v says so) and merge to one run with --revcomp random; a stale .fai, no
# .gzi, a blank line, a record without bases, a duplicate name and plain gzip read from the
# start and merge the same (CR LF line ends seek); an error in part 3 of 7 names the record
# and line one run names. Also the refusals (stdin, two inputs, SAM, an unsorted CRAM, bad
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

# ---- a bgzip FASTA with a .fai/.gzi: parts seek to their share ----
# genome.fa: 24 records, most of 0.5..1.5 Mbases (a part seeks only past records of 8 BGZF
# blocks or more on average) and a few of 1..300, at widths 50..1000, one of 1.5 MB at
# width 60, one header exactly at a block start; BAD=1 adds a record named "" (an error) at
# about 2.5/7 of the file and writes its record and line number to bad.fa.where
gen_fasta() { # seed, out, [BAD]
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import random, sys
rng = random.Random(int(sys.argv[1])); out = open(sys.argv[2], "w"); bad = sys.argv[3] == "1"
where = open(sys.argv[2] + ".where", "w")
BLOCK = 65280 # the bytes of text in a full bgzip block
pos, line, n = 0, 1, 0
def record(name, length, width, head=None):
    global pos, line, n
    head = head or ">%s%s\n" % (name, rng.choice(["", " desc %d" % n, "\tx=y"]))
    if length < 0: # as many bases as end the record at a block start (one it can reach)
        length = next(l for m in range(2, 9) for end in [(pos // BLOCK + m) * BLOCK]
                      for l in range((end - pos - len(head)) * width // (width + 1) - 2,
                                     end - pos)
                      if len(head) + l + -(-l // width) == end - pos)
    n += 1
    if head == ">\n": where.write("bad %d %d\n" % (n, line))
    out.write(head); pos += len(head); line += 1
    seq = "".join(rng.choices("ACGTNacgt", k=length))
    for k in range(0, length, width):
        out.write(seq[k:k + width] + "\n"); pos += len(seq[k:k + width]) + 1; line += 1
for i in range(24):
    if i == 5: record("pad", -1, 80); where.write("block_start %d\n" % pos)
    if i == 18: record("big", 1500000, 60)
    if bad and i == 8: record("", 500, 60, head=">\n")
    record("r%d" % i, rng.choice([rng.randint(1, 300)] + [rng.randint(500000, 1500000)] * 5),
           rng.choice([50, 60, 61, 70, 80, 100, 1000]))
PY
}
gen_fasta 7 genome.fa
bgzip -c genome.fa > genome.fa.bgz
samtools faidx genome.fa.bgz
python3 - genome.fa.bgz.gzi genome.fa.where <<'PY' || fail "no header starts a BGZF block"
import struct, sys
d = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", d[:8])[0]
starts = {struct.unpack("<QQ", d[8 + 16 * i:24 + 16 * i])[1] for i in range(n)}
want = [int(l.split()[1]) for l in open(sys.argv[2]) if l.startswith("block_start")]
sys.exit(0 if want and want[0] in starts else 1)
PY
seek_merge() { # label, N, -@, expected "seek"/"start" for parts 2..N, then arguments
  local label=$1 n=$2 t=$3 want=$4; shift 4
  rm -rf whole* part* merged* log*
  moe-tokenize -q -@ "$t" "$@" --revcomp random --val-fraction 0.2 -o whole.mtok
  local parts=()
  for i in $(seq "$n"); do
    moe-tokenize -v -@ "$t" "$@" --revcomp random --val-fraction 0.2 --part "$i/$n" \
      -o "part$i.mtok" 2> "log$i"
    parts+=("part$i.mtok")
    [ "$i" -eq 1 ] && continue
    case $want in
      seek) grep -q "part $i/$n seeks to" "log$i" || fail "$label: part $i/$n did not seek: $(grep part "log$i")" ;;
      start) grep -q "part $i/$n reads from the start" "log$i" || fail "$label: part $i/$n seeked: $(grep part "log$i")" ;;
    esac
  done
  moe-tokenize merge -q -o merged.mtok "${parts[@]}"
  cmp whole.mtok merged.mtok || fail "$label, N=$n, -@ $t: merged train shard differs"
  cmp whole.val.mtok merged.val.mtok || fail "$label, N=$n, -@ $t: merged validation shard differs"
}
for t in 1 4; do
  for n in 1 3 7 16; do seek_merge "seeking bgzip FASTA" "$n" "$t" seek genome.fa.bgz; done
done
# the parts' first records are those the index gives (16 parts over 26 records: not all
# in one)
grep -h "seeks to record" log* | sed 's/.*seeks to record \([0-9]*\).*/\1/' | sort -un | wc -l \
  | { read -r k; [ "$k" -ge 8 ] || fail "16 parts start at only $k distinct records"; }
# the last record long (1.5 MB): the last parts hold no record start and seek to the end
awk '/^>/ { keep = ++n <= 10 || $1 == ">big" } keep' genome.fa | bgzip -c > tail.fa.bgz
samtools faidx tail.fa.bgz
seek_merge "bgzip FASTA, a long last record" 16 1 seek tail.fa.bgz
grep -q "part 16/16 seeks to the end" log16 || fail "part 16/16 of tail.fa.bgz: $(grep part log16)"
# a stale .fai (another file's, newer), a missing .gzi, a blank line: read from the start
gen_fasta 8 other.fa
bgzip -c other.fa > other.fa.bgz
samtools faidx other.fa.bgz
cp genome.fa.bgz.fai genome.fai.keep
cp other.fa.bgz.fai genome.fa.bgz.fai
seek_merge "stale .fai" 7 1 start genome.fa.bgz
cp genome.fai.keep genome.fa.bgz.fai
mv genome.fa.bgz.gzi genome.gzi.keep
seek_merge "no .gzi" 7 4 start genome.fa.bgz
mv genome.gzi.keep genome.fa.bgz.gzi
awk 'NR > 1 && /^>/ && ++h == 3 { print "" } { print }' genome.fa | bgzip -c > blank.fa.bgz
samtools faidx blank.fa.bgz
seek_merge "a blank line between records" 7 1 start blank.fa.bgz
# records faidx leaves out (one without bases, a duplicate name): read from the start;
# CR LF line ends: seek
awk 'NR > 1 && /^>/ && ++h == 3 { print ">empty" } { print }' genome.fa | bgzip -c > empty.fa.bgz
sed 's/^>r1$/>r0/; s/^>r1\([ \t]\)/>r0\1/' genome.fa | bgzip -c > dup.fa.bgz
sed 's/$/\r/' genome.fa | bgzip -c > crlf.fa.bgz
for f in empty dup crlf; do samtools faidx $f.fa.bgz 2> /dev/null; done
seek_merge "a record without bases" 7 1 start empty.fa.bgz
seek_merge "a duplicate name" 7 1 start dup.fa.bgz
seek_merge "CR LF line ends" 7 4 seek crlf.fa.bgz
# short records (a header in most blocks): checking them would cost what reading them does
python3 -c 'import random; r = random.Random(3)
for i in range(4000): print(">s%d\n%s" % (i, "".join(r.choices("ACGT", k=r.randint(1, 2000)))))' \
  | bgzip -c > dense.fa.bgz
samtools faidx dense.fa.bgz
seek_merge "short records" 7 4 start dense.fa.bgz
grep -q "fewer than 8 BGZF blocks" log7 || fail "short records: part 7/7 gave another reason: $(grep part log7)"
seek_merge "plain gzip" 3 1 start big.fa.gz
# an error in a later part names the record and line one run names
gen_fasta 7 bad.fa 1
bgzip -c bad.fa > bad.fa.bgz
samtools faidx bad.fa.bgz
read -r _ bad_rec bad_line < <(grep bad bad.fa.where)
set +e
moe-tokenize -q bad.fa.bgz -o bad.mtok 2> bad_whole.err; rc_whole=$?
found=
for i in $(seq 7); do
  moe-tokenize -v --part "$i/7" bad.fa.bgz -o bad.mtok 2> "bad$i.err" && continue
  [ -z "$found" ] && found=$i
done
set -e
[ "$rc_whole" -eq 2 ] || fail "the record named \"\" should fail one run with exit 2"
grep -q "record $bad_rec ().*empty record name" bad_whole.err && grep -q ":$bad_line" bad_whole.err \
  || fail "one run: expected record $bad_rec at line $bad_line in: $(cat bad_whole.err)"
[ "$found" = 3 ] || fail "the bad record should fail part 3/7 first, not ${found:-none}"
grep -q "part 3/7 seeks to record" bad3.err || fail "part 3/7 of bad.fa.bgz did not seek"
diff <(grep -v debug bad_whole.err | sed 's/^\[[0-9:]*\] //') \
  <(grep -v debug bad3.err | sed 's/^\[[0-9:]*\] //') \
  || fail "part 3/7 fails with another message than one run"

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
