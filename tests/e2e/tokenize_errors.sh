#!/usr/bin/env bash
# e2e tokenize_errors: bad inputs and bad usage give exit 2, a message naming the file
# (and line/record where there is one) and leave no file under the final name; --help and
# --version behave.
set -euo pipefail
LAMBDA="$MOE_SRC_DIR/data/lambda_virus.fa.gz"
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect CODE PATTERN -- command...: exit code and a stderr line matching PATTERN
expect() {
  local code=$1 pat=$2; shift 3
  set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
  [ "$rc" -eq "$code" ] || fail "$*: exit $rc, want $code; stderr: $(cat err.txt)"
  grep -q -- "$pat" err.txt || fail "$*: stderr lacks '$pat': $(cat err.txt)"
}

moe-tokenize --help | grep -q "Usage: moe-tokenize" || fail "--help"
[ "$(moe-tokenize --version | head -1)" = "moe-tokenize (moe-genomics) 0.1.0" ] || fail "--version"
moe-tokenize --version | grep -q '^htslib [0-9]' || fail "--version htslib line"

# truncated gzip: exit 2, no output file, nothing temporary left behind
head -c 9000 "$LAMBDA" > cut.fa.gz
expect 2 "cut.fa.gz" -- moe-tokenize cut.fa.gz -o out.mtok
[ -z "$(ls -A | grep -E 'out\.mtok')" ] || fail "left $(ls -A | grep out.mtok)"
# BGZF without its end-of-file block
zcat "$LAMBDA" | bgzip -c > full.fa.bgz
head -c $(( $(stat -c %s full.fa.bgz) - 28 )) full.fa.bgz > noeof.fa.bgz
expect 2 "truncated" -- moe-tokenize noeof.fa.bgz -o out.mtok
# file-level problems
expect 2 "missing.fa: cannot open" -- moe-tokenize missing.fa -o out.mtok
printf 'hello\tworld 123\n' > junk.txt
expect 2 "unknown file format" -- moe-tokenize junk.txt -o out.mtok
printf 'ACGT\n>a\nAC\n' > nohdr.fa
expect 2 "nohdr.fa:1:1: missing header" -- moe-tokenize nohdr.fa -o out.mtok
printf '@a\nACGT\n+\nIIII\n@b\nACGT\n' > trunc.fq
expect 2 "trunc.fq:6: record 2 (b)" -- moe-tokenize trunc.fq -o out.mtok
printf '@a\nACGT\n+\nIII\n@b\nAC\n+\nII\n' > short.fq
expect 2 "short.fq:1: record 1 (a): 5 quality characters for 4 bases" -- moe-tokenize short.fq -o out.mtok
printf '>a\nACGT\n>b\nAC-GT\n' > gap.fa
expect 2 "gap.fa:3: record 2 (b).*'-' (0x2d) at base 3" -- moe-tokenize gap.fa -o out.mtok
# the same errors through the reader thread (-@ 2)
expect 2 "gap.fa:3: record 2 (b).*'-' (0x2d) at base 3" -- moe-tokenize -@ 2 gap.fa -o out.mtok
expect 2 "trunc.fq:6: record 2 (b)" -- moe-tokenize -@ 2 "$LAMBDA" trunc.fq -o out.mtok
expect 2 "cut.fa.gz" -- moe-tokenize -@ 3 cut.fa.gz -o out.mtok
moe-tokenize -q --iupac keep -t nuc gap.fa -o x.mtok 2>/dev/null && fail "gap accepted"
printf '>a\n\n>b\nAC\n' > empty.fa
expect 0 "no bases; skipped" -- moe-tokenize empty.fa -o ok.mtok
[ -s ok.mtok ] || fail "empty record run wrote nothing"
[ ! -e out.mtok ] || fail "a failed run left out.mtok"

# directory output never mixes with the shards of an earlier run
rm -rf d
moe-tokenize -q "$LAMBDA" -o d/
expect 2 "already holds token shards" -- moe-tokenize "$LAMBDA" -o d/

# a failure after some shards were committed removes them again
rm -rf late
expect 2 "gap.fa:3: record 2 (b)" -- moe-tokenize "$LAMBDA" gap.fa -o late/ --shard-tokens 1000
[ -z "$(ls -A late)" ] || fail "a failed run left $(ls -A late | tr '\n' ' ')"

# bad shards
printf 'MOETOK\0\1garbage' > bad.mtok
expect 2 "bad.mtok: not a valid token shard" -- moe-tokenize stats bad.mtok
moe-tokenize -q "$LAMBDA" -o good.mtok
head -c 2000 good.mtok > cut.mtok
expect 2 "cut.mtok: not a valid token shard" -- moe-tokenize decode cut.mtok
printf 'XXXXXXXX' | cat - <(tail -c +9 good.mtok) > magic.mtok
expect 2 "wrong magic" -- moe-tokenize stats magic.mtok

# usage errors
expect 2 "tokenizer must be" -- moe-tokenize -t bpe "$LAMBDA"
expect 2 "kmer vocabulary has no lower-case" -- moe-tokenize -t kmer --case keep "$LAMBDA" -o k.mtok
expect 2 "no input files" -- moe-tokenize -o x.mtok
expect 2 "val-fraction needs" -- moe-tokenize --val-fraction 0.1 "$LAMBDA"
expect 2 "shard-tokens needs a directory" -- moe-tokenize --shard-tokens 10 "$LAMBDA" -o x.mtok
cp "$LAMBDA" lam.fa.gz
expect 2 "not gzip" -- moe-tokenize -r x:1-10 lam.fa.gz -o x.mtok
expect 2 "needs an indexed FASTA" -- moe-tokenize -r x:1-10 - -o x.mtok < lam.fa.gz
expect 2 "unknown option" -- moe-tokenize --frobnicate "$LAMBDA"
echo "tokenize_errors: ok"
