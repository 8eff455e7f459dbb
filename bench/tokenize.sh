#!/usr/bin/env bash
# bench/tokenize.sh: moe-tokenize throughput beside the tools that only read the same input -
# `zcat FILE > /dev/null` for a >= 200 MB gzip FASTA and `samtools fasta -@N` for a BAM - in
# the same run, printing times, MB/s of input and ratios (goal: >= 0.8x with 1 thread).
#
# Not part of ctest (it takes minutes). Usage: bench/tokenize.sh [BUILD_DIR] [WORK_DIR]
# The FASTA is NC_008253.fna.gz (bowtie-examples) concatenated to >= 200 MB of gzip members;
# without that package, htslib-test's ce.fa (gzip-compressed here) is used instead and the
# output says so. The one thing to know: each command runs 3 times and the best time counts,
# so a busy shared machine disturbs the figures less.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-${TMPDIR:-/tmp}/moe-bench-tokenize}
MOE="$BUILD/moe-tokenize"
[ -x "$MOE" ] || { echo "no $MOE: build first (make)" >&2; exit 2; }
command -v samtools >/dev/null || { echo "samtools is needed" >&2; exit 2; }
mkdir -p "$WORK"
ECOLI=/usr/share/doc/bowtie/examples/genomes/NC_008253.fna.gz
CE=/usr/share/htslib-test/test/ce.fa
PCS=/usr/share/doc/seqkit-examples/tests/pcs109_5k.bam.gz
export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s

if [ -r "$ECOLI" ]; then
  SRC="$ECOLI (bowtie-examples)"; cp "$ECOLI" "$WORK/unit.fa.gz"
else
  SRC="$CE (htslib-test; bowtie-examples not installed)"; gzip -c "$CE" > "$WORK/unit.fa.gz"
fi
FA="$WORK/big.fa.gz"
if [ ! -s "$FA" ] || [ "$(stat -c %s "$FA")" -lt 200000000 ]; then
  unit=$(stat -c %s "$WORK/unit.fa.gz")
  n=$(( 200000000 / unit + 1 ))
  for _ in $(seq "$n"); do cat "$WORK/unit.fa.gz"; done > "$FA"   # gzip members concatenate
fi
BAM="$WORK/big.bam"
if [ ! -s "$BAM" ]; then
  zcat "$PCS" > "$WORK/pcs.bam"
  samtools cat -o "$BAM" $(for _ in $(seq 20); do echo "$WORK/pcs.bam"; done)
fi

best() { # "wall cpu" of the fastest of 3 runs of "$@" (cpu = user + sys seconds)
  local b=999999 c=0 w u sy
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %U %S" -o "$WORK/time.txt" "$@" > /dev/null 2> "$WORK/stderr.txt"
    read -r w u sy < "$WORK/time.txt"
    if [ "$(echo "$w < $b" | bc -l)" -eq 1 ]; then b=$w; c=$(echo "$u + $sy" | bc -l); fi
  done
  printf '%.2f %.2f' "$b" "$c"
}
mbs() { echo "scale=1; $(stat -c %s "$1") / 1000000 / $2" | bc -l; }
ratio() { echo "scale=2; $1 / $2" | bc -l; }

echo "# moe-tokenize benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -m)"
echo "# FASTA: $FA, $(( $(stat -c %s "$FA") / 1000000 )) MB gzip, built from $SRC"
echo "# BAM: $BAM, $(( $(stat -c %s "$BAM") / 1000000 )) MB (20 x pcs109_5k.bam)"
row() { # label, "wall cpu", reference "wall cpu", input file
  local w c rw rc
  read -r w c <<< "$2"; read -r rw rc <<< "$3"
  printf '%-46s %7s %7s %8s %7s %7s\n' "$1" "$w" "$c" "$(mbs "$4" "$w")" "$(ratio "$rw" "$w")" \
    "$(ratio "$rc" "$c")"
}
printf '%-46s %7s %7s %8s %7s %7s\n' "command" "wall s" "cpu s" "MB/s in" "x wall" "x cpu"
r=$(best zcat "$FA"); row "zcat FA > /dev/null" "$r" "$r" "$FA"
row "moe-tokenize FA -o x.mtok" "$(best "$MOE" -q "$FA" -o "$WORK/x.mtok")" "$r" "$FA"
row "moe-tokenize -@2 FA -o x.mtok" "$(best "$MOE" -q -@ 2 "$FA" -o "$WORK/x.mtok")" "$r" "$FA"
row "moe-tokenize FA > /dev/null (stdout: no fsync)" "$(best "$MOE" -q "$FA")" "$r" "$FA"
row "moe-tokenize -t kmer -k 6 FA -o x.mtok" \
    "$(best "$MOE" -q -t kmer -k 6 "$FA" -o "$WORK/x.mtok")" "$r" "$FA"
r=$(best samtools fasta "$BAM"); row "samtools fasta BAM > /dev/null" "$r" "$r" "$BAM"
row "moe-tokenize BAM -o y.mtok" "$(best "$MOE" -q "$BAM" -o "$WORK/y.mtok")" "$r" "$BAM"
row "moe-tokenize BAM > /dev/null (stdout)" "$(best "$MOE" -q "$BAM")" "$r" "$BAM"
r=$(best samtools fasta -@ 1 "$BAM"); row "samtools fasta -@1 BAM > /dev/null" "$r" "$r" "$BAM"
row "moe-tokenize -@2 BAM -o y.mtok" "$(best "$MOE" -q -@ 2 "$BAM" -o "$WORK/y.mtok")" "$r" "$BAM"
echo "# x wall, x cpu = reference (row above with ratio 1.00) / this row; >= 1 is at least as fast"
rm -f "$WORK/x.mtok" "$WORK/y.mtok"
