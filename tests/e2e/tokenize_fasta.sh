#!/usr/bin/env bash
# e2e tokenize_fasta: FASTA/FASTQ -> shards checked against counts and sequences computed
# another way (zcat/grep/tr, samtools, python), decode round trips, case mask round trip,
# CRLF and very long lines, stdin, and byte-identical output whatever --threads.
set -euo pipefail
LAMBDA="$MOE_SRC_DIR/data/lambda_virus.fa.gz"
HT=/usr/share/htslib-test/test
command -v samtools >/dev/null || { echo "samtools not installed: skip"; exit 77; }
[ -r "$HT/fastqs.fq" ] || { echo "htslib-test not installed: skip"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ntok() { moe-tokenize stats --json "$1" | python3 -c 'import json,sys; print(sum(x["tokens"] for x in json.load(sys.stdin) if x["split"]=="train"))'; }
ndoc() { moe-tokenize stats --json "$1" | python3 -c 'import json,sys; print(sum(x["documents"] for x in json.load(sys.stdin) if x["split"]=="train"))'; }
seqs_only() { grep -v '^>' | tr -d '\r\n'; }

# 1. lambda: tokens = bases + one EOS; decode gives back the bases exactly
bases=$(zcat "$LAMBDA" | seqs_only | wc -c)
moe-tokenize -q "$LAMBDA" -o lam.mtok
[ "$(ntok lam.mtok)" -eq $((bases + 1)) ] || fail "lambda tokens $(ntok lam.mtok) != $bases + 1"
moe-tokenize decode -w 0 lam.mtok | seqs_only > dec.txt
zcat "$LAMBDA" | seqs_only > ref.txt
cmp dec.txt ref.txt || fail "lambda decode differs"
name=$(zcat "$LAMBDA" | awk 'NR == 1 { print $1 }')
[ "$(moe-tokenize decode lam.mtok | awk 'NR == 1 { print $1 }')" = "$name" ] || fail "name"

# 2. stdin and threads: same tokens; the shard bytes do not depend on --threads
zcat "$LAMBDA" | moe-tokenize -q - -o stdin.mtok
cmp <(moe-tokenize decode stdin.mtok | seqs_only) ref.txt || fail "stdin decode"
if command -v bgzip >/dev/null; then
  zcat "$LAMBDA" | bgzip -c > lam.fa.bgz
  moe-tokenize -q lam.fa.bgz -@ 1 -o t1.mtok
  moe-tokenize -q lam.fa.bgz -@ 3 -o t3.mtok
  cmp t1.mtok t3.mtok || fail "--threads changed the output"
fi
moe-tokenize -q "$LAMBDA" -@ 2 -o t2.mtok
cmp lam.mtok t2.mtok || fail "-@ 2 changed the output"
moe-tokenize "$LAMBDA" > piped.mtok 2>/dev/null
cmp <(moe-tokenize decode piped.mtok) <(moe-tokenize decode lam.mtok) || fail "stdout shard"

# several inputs in one call, in order, through the reader thread too
moe-tokenize -q "$LAMBDA" "$HT/fastqs.fq" -o two.mtok
moe-tokenize -q -@ 2 "$LAMBDA" "$HT/fastqs.fq" -o two2.mtok
cmp two.mtok two2.mtok || fail "two inputs: -@ 2 differs"
[ "$(ndoc two.mtok)" -eq $(( 1 + $(samtools view -c "$HT/fastqs.fq") )) ] || fail "two inputs"

# 3. kmer: floor(L/6) k-mers + L%6 single bases + EOS (lambda has no N)
moe-tokenize -q -t kmer -k 6 "$LAMBDA" -o k6.mtok
[ "$(ntok k6.mtok)" -eq $((bases / 6 + bases % 6 + 1)) ] || fail "kmer count"
cmp <(moe-tokenize decode k6.mtok | seqs_only) ref.txt || fail "kmer decode"

# 4. soft-masked input: upper+mask keeps the case in a side mask, decode restores it
zcat "$LAMBDA" | awk 'NR % 3 == 0 && !/^>/ { print tolower($0); next } { print }' > soft.fa
moe-tokenize -q -t nuc --case upper+mask soft.fa -o soft.mtok
cmp <(moe-tokenize decode soft.mtok | seqs_only) <(seqs_only < soft.fa) || fail "mask round trip"
lower=$(seqs_only < soft.fa | tr -cd 'acgtn' | wc -c)
got=$(moe-tokenize stats --json soft.mtok | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["lowercase_tokens"])')
[ "$got" -eq "$lower" ] || fail "lowercase tokens $got != $lower"

# 5. fastqs.fq edge cases (wrapped records, '@' and '+' starting quality lines, lower case,
#    IUPAC, U): same records and bases as htslib's own FASTQ parser
want_n=$(samtools view -c "$HT/fastqs.fq")
want_b=$(samtools view "$HT/fastqs.fq" | awk '{ s += length($10) } END { print s }')
moe-tokenize -q "$HT/fastqs.fq" -o fq.mtok --no-eos
[ "$(ndoc fq.mtok)" -eq "$want_n" ] || fail "fastqs.fq records $(ndoc fq.mtok) != $want_n"
[ "$(ntok fq.mtok)" -eq "$want_b" ] || fail "fastqs.fq bases $(ntok fq.mtok) != $want_b"
cmp <(moe-tokenize decode -w 0 fq.mtok | grep -v '^>' | tr a-z A-Z | tr U N) \
    <(samtools fasta "$HT/fastqs.fq" 2>/dev/null | grep -v '^>') || fail "fastqs.fq bases differ"

# bowtie2's simulated reads: one document per read, bases = sum of read lengths
R1=/usr/share/doc/bowtie2/examples/reads/reads_1.fq.gz
if [ -r "$R1" ]; then
  moe-tokenize -q -t nuc "$R1" --no-eos -o r1.mtok
  [ "$(ndoc r1.mtok)" -eq "$(zcat "$R1" | awk 'NR % 4 == 2' | wc -l)" ] || fail "reads_1 count"
  [ "$(ntok r1.mtok)" -eq "$(zcat "$R1" | awk 'NR % 4 == 2' | tr -d '\n' | wc -c)" ] || fail "reads_1 bases"
fi

# 6. CRLF line endings and a 5 Mb single-line record
zcat "$LAMBDA" | sed 's/$/\r/' > crlf.fa
moe-tokenize -q crlf.fa -o crlf.mtok
cmp <(moe-tokenize decode crlf.mtok | seqs_only) ref.txt || fail "CRLF"
python3 -c 'import sys; sys.stdout.write(">long\n" + "ACGTTGCA" * 625000 + "\n>s\nAC\n")' > long.fa
moe-tokenize -q long.fa -o long.mtok --no-eos
[ "$(ntok long.mtok)" -eq 5000002 ] || fail "long line"
cmp <(moe-tokenize decode long.mtok | seqs_only) <(seqs_only < long.fa) || fail "long decode"
# a long record is written in chunks; an error deep inside still names its exact base
python3 -c 'import sys; sys.stdout.write(">long\n" + "ACGT" * 1125000 + "*" + "ACGT" * 10 + "\n")' > bad_long.fa
set +e; moe-tokenize bad_long.fa -o bad_long.mtok 2> bad_long.err; rc=$?; set -e
[ "$rc" -eq 2 ] && grep -q "'\*' (0x2a) at base 4500001 is not" bad_long.err || fail "long error: $(cat bad_long.err)"

# 7. windows: every base of lambda is covered, ranges are consistent
moe-tokenize -q "$LAMBDA" --window 1000 --stride 1000 --no-eos -o win.mtok
cmp <(moe-tokenize decode win.mtok | seqs_only) ref.txt || fail "windows"
[ "$(ndoc win.mtok)" -eq $(( (bases + 999) / 1000 )) ] || fail "window count"
echo "tokenize_fasta: ok"
