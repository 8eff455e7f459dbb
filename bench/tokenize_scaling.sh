#!/usr/bin/env bash
# bench/tokenize_scaling.sh: moe-tokenize -@ 1, 2, 4, ... nproc on a bgzip FASTA, the same
# FASTA in plain gzip and a BAM, beside `samtools fasta` with the same total threads, plus
# the --part/merge path; checks that every output is byte-identical to the one-thread output
# and prints markdown tables for docs/performance.md.
#
# Usage: bench/tokenize_scaling.sh [BUILD_DIR] [WORK_DIR]     (about 5 minutes on 16 cores)
#        COPIES=100 bench/tokenize_scaling.sh ...             (a small trial: 100 genomes)
# Needs only a bare Debian and the repo build: awk, gzip, coreutils; bgzip and samtools are
# used when present (without bgzip the FASTA rows are skipped, without samtools the BAM and
# samtools rows) and the output says so. Inputs are made from data/lambda_virus.fa.gz:
# COPIES (20,000) renamed copies of the lambda genome (985 MB of FASTA) and 4 x COPIES
# unaligned 10 kb reads cut from them (every other one flagged reverse-strand; 210 MB BAM).
# Why that large: -@ 16 tokenizes 200 MB in about 0.1 s, where the process start, the first
# batch and the last one are a fifth of the time; a corpus is terabytes.
# The one thing to know: each timed command runs 3 times and the fastest counts;
# moe-tokenize writes its shard to stdout, redirected to /dev/null as samtools' FASTA is,
# so the table compares the work, not the disk (never `-o /dev/null`: a file output is
# written to a temporary name and renamed over its target). One more run per thread count
# writes a real shard file (the "-> file" columns, once, fsync included), checked with cmp.
# Plain gzip cannot be decoded in parallel, so its column has the first and last thread
# counts only; "bgzip -d" is the machine's own scaling on the same file (decompression only)
# for reference. Then 500 small files (each input's fixed cost), and last `moe-tokenize -v`
# at nproc threads says where the time went.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-${TMPDIR:-/tmp}/moe-bench-tokscale}
SRC=$(cd "$(dirname "$0")/.." && pwd)
MOE="$BUILD/moe-tokenize"
COPIES=${COPIES:-20000}
[ -x "$MOE" ] || { echo "no $MOE: build first (make)" >&2; exit 2; }
mkdir -p "$WORK"
NPROC=$(nproc)
export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s
have() { command -v "$1" >/dev/null; }
note() { echo "# $*"; }

# ---- inputs ----
FA="$WORK/lambda$COPIES.fa"
if [ ! -s "$FA" ]; then
  gzip -dc "$SRC/data/lambda_virus.fa.gz" | awk -v copies="$COPIES" 'NR == 1 { next } { s = s $0 }
    END { for (j = 1; j <= length(s); j += 70) body = body substr(s, j, 70) "\n"
          for (i = 0; i < copies; i++) printf ">lambda_%d copy %d\n%s", i, i, body }' > "$FA"
fi
GZ="$FA.gz"
[ -s "$GZ" ] || gzip -1 -c "$FA" > "$GZ"
BGZ=""
if have bgzip; then
  BGZ="$FA.bgz"
  [ -s "$BGZ" ] || bgzip -@ "$NPROC" -c "$FA" > "$BGZ"
else
  note "bgzip not found: the bgzip FASTA rows are skipped"
fi
BAM=""
if have samtools; then
  BAM="$WORK/reads$COPIES.bam"
  if [ ! -s "$BAM" ]; then
    gzip -dc "$SRC/data/lambda_virus.fa.gz" | awk -v copies="$COPIES" 'NR == 1 { next } { s = s $0 }
      END { print "@HD\tVN:1.6\tSO:unknown"; q = ""
            for (k = 0; k < 10000; k++) q = q substr("5?I+", k % 4 + 1, 1)
            for (j = 1; j + 9999 <= length(s); j += 10000) r[++nr] = substr(s, j, 10000) "\t" q
            n = 0
            for (i = 0; i < copies; i++) for (j = 1; j <= nr; j++) {
              n++; printf "read%d\t%d\t*\t0\t0\t*\t*\t0\t0\t%s\n", n, (n % 2 ? 4 : 20), r[j] } }' |
      samtools view -@ "$NPROC" -b -o "$BAM" -
  fi
else
  note "samtools not found: the BAM and samtools rows are skipped"
fi

# ---- timing ----
now() { date +%s.%N; }
best() { # fastest wall seconds of 3 runs of "$@" (stdout to /dev/null)
  local b=999999 t0 t1
  for _ in 1 2 3; do
    t0=$(now)
    "$@" > /dev/null 2>> "$WORK/stderr.txt"
    t1=$(now)
    b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { d = z - a; print (d < b ? d : b) }')
  done
  printf '%.2f' "$b"
}
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf (b > 0 ? "%.1f" : "-"), a / b }'; }
mb() { awk -v s="$(stat -c %s "$1")" 'BEGIN { printf "%.0f", s / 1e6 }'; }
threads=()
for t in 1 2 4 8 16 32 64; do [ "$t" -le "$NPROC" ] && threads+=("$t"); done
[ "${threads[-1]}" -eq "$NPROC" ] || threads+=("$NPROC")
status=0
same() { # reference, candidate, label: byte identity
  if ! cmp -s "$1" "$2"; then echo "MISMATCH: $3 differs from the one-thread output" >&2; status=1; fi
}

echo "## moe-tokenize thread scaling"
echo
note "$(date -u '+%Y-%m-%d %H:%M UTC'), $NPROC cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $("$MOE" --version | tr '\n' ' ')"
if have lscpu; then # 16 CPUs may be 8 cores with two hardware threads each: they share a core
  note "lscpu: $(lscpu | awk -F':[ \t]+' '/^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|CPU max MHz)/ { printf "%s%s %s", sep, $1, $2; sep = ", " }')"
fi
note "FASTA: $(mb "$FA") MB, $COPIES lambda genomes ($([ -n "$BGZ" ] && echo "bgzip $(mb "$BGZ") MB, ")gzip $(mb "$GZ") MB); BAM: $([ -n "$BAM" ] && echo "$(mb "$BAM") MB, $((4 * COPIES)) x 10 kb reads" || echo none)"
note "seconds, best of 3; speed-up = one-thread time / this time; samtools -@ N-1 (its -@ counts extra threads); samtools / moe = samtools time / moe time (goal >= 1.5 on BAM); bgzip -d -@ N: decompression alone, the machine's own scaling"
echo
echo "| threads | bgzip FASTA s | speed-up | gzip FASTA s | BAM s | speed-up | samtools fasta BAM s | samtools / moe | bgzip FASTA -> file s | BAM -> file s | bgzip -d s | speed-up |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
once() { # wall seconds of one run of "$@"
  local t0 t1
  t0=$(now)
  "$@" > /dev/null 2>> "$WORK/stderr.txt"
  t1=$(now)
  awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.2f", z - a }'
}
declare -A first # one-thread time of each input
last=${threads[-1]}
measure() { # name, input, threads: sets T (best time), X (speed-up), F (time to a file)
  local name=$1 in=$2 t=$3
  T=$(best "$MOE" -q -@ "$t" "$in")
  [ -n "${first[$name]:-}" ] || first[$name]=$T
  X=$(div "${first[$name]}" "$T")
  F=$(once "$MOE" -q -@ "$t" "$in" -o "$WORK/$name.$t.mtok")
  same "$WORK/$name.1.mtok" "$WORK/$name.$t.mtok" "$name -@ $t"
  [ "$t" -eq 1 ] || rm -f "$WORK/$name.$t.mtok" # 1 GB each: keep only the reference
}
for t in "${threads[@]}"; do
  fs="-" fx="-" gs="-" bs="-" bx="-" ss="-" sx="-" ff="-" bf="-" ds="-" dx="-"
  if [ -n "$BGZ" ]; then
    measure fa "$BGZ" "$t"
    fs=$T fx=$X ff=$F
    ds=$(best bgzip -d -c -@ "$t" "$BGZ")
    [ -n "${first[bgzip]:-}" ] || first[bgzip]=$ds
    dx=$(div "${first[bgzip]}" "$ds")
  fi
  if [ "$t" -eq 1 ] || [ "$t" -eq "$last" ]; then measure gz "$GZ" "$t"; gs=$T; fi
  if [ -n "$BAM" ]; then
    measure bam "$BAM" "$t"
    bs=$T bx=$X bf=$F
    if [ "$t" -eq 1 ]; then ss=$(best samtools fasta "$BAM"); else ss=$(best samtools fasta -@ $((t - 1)) "$BAM"); fi
    sx=$(div "$ss" "$bs")
  fi
  echo "| $t | $fs | $fx | $gs | $bs | $bx | $ss | $sx | $ff | $bf | $ds | $dx |"
done

# ---- many small inputs: what each input costs to open and close (htslib's threads) ----
if [ -n "$BGZ" ]; then
  MANY="$WORK/many"
  if [ ! -s "$MANY/f500.fa.bgz" ]; then
    mkdir -p "$MANY"
    head -c 20000 "$FA" > "$MANY/one.fa"
    for i in $(seq 500); do sed "s/^>lambda_/>f${i}_/" "$MANY/one.fa" | bgzip -c > "$MANY/f$i.fa.bgz"; done
  fi
  echo
  echo "500 bgzip FASTA files of 20 kB: -@ 1 $(best "$MOE" -q -@ 1 "$MANY"/f*.fa.bgz) s, -@ $last $(best "$MOE" -q -@ "$last" "$MANY"/f*.fa.bgz) s"
fi

# ---- where the time went at nproc threads (moe-tokenize -v, see docs/performance.md) ----
echo
echo "## moe-tokenize -v -@ $last"
echo
for in in $BGZ $BAM; do
  echo "$(basename "$in"):"
  "$MOE" -v -@ "$last" "$in" 2>&1 > /dev/null | grep -E 'debug: (-@ [0-9]+: |-@ [0-9]+ times|times)' | sed 's/^.*debug: /    /'
done

# ---- --part I/N + merge: N jobs of NPROC/N threads each, at the same time ----
echo
echo "## --part and merge ($NPROC threads in all)"
echo
note "every part and the merge write real files (fsync included), as does the one run"
echo
echo "| input | parts x threads | parts s (all at once) | merge s | total s | one run -@ $NPROC s |"
echo "|---|---|---|---|---|---|"
split_row() { # label, input, reference output of one run
  local in=$2 n=4 t0 t1 t2 parts=()
  [ "$NPROC" -ge 4 ] || n=2
  local per=$((NPROC / n > 0 ? NPROC / n : 1))
  rm -f "$WORK"/part*.mtok "$WORK/merged.mtok"
  t0=$(now)
  for i in $(seq "$n"); do
    "$MOE" -q -@ "$per" --part "$i/$n" "$in" -o "$WORK/part$i.mtok" &
    parts+=("$WORK/part$i.mtok")
  done
  wait
  t1=$(now)
  "$MOE" merge -q -o "$WORK/merged.mtok" "${parts[@]}"
  t2=$(now)
  same "$3" "$WORK/merged.mtok" "$1 --part 1..$n/$n + merge"
  awk -v a="$t0" -v b="$t1" -v c="$t2" -v l="$1" -v n="$n" -v p="$per" -v one="$4" \
    'BEGIN { printf "| %s | %d x %d | %.2f | %.2f | %.2f | %s |\n", l, n, p, b - a, c - b, c - a, one }'
}
if [ -n "$BGZ" ]; then split_row "bgzip FASTA" "$BGZ" "$WORK/fa.1.mtok" "$(best "$MOE" -q -@ "$last" "$BGZ" -o "$WORK/x.mtok")"; fi
if [ -n "$BAM" ]; then split_row "BAM" "$BAM" "$WORK/bam.1.mtok" "$(best "$MOE" -q -@ "$last" "$BAM" -o "$WORK/x.mtok")"; fi
echo
if [ "$status" -eq 0 ]; then
  note "byte identity: every output above equals the one-thread output (cmp)"
else
  note "byte identity: MISMATCHES above"
fi
rm -f "$WORK"/*.mtok
exit "$status"
