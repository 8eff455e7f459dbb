#!/usr/bin/env bash
# embed_bam_region.sh: one embedding per read for the reads of a BAM region.
#
#   moe-embed -m MODEL -r REGION --min-mapq Q -o OUT.npy READS.bam
#
# The BAM must be coordinate-sorted and indexed (.bai/.csi: `samtools index`). Reads are
# taken as sequenced: reverse-strand alignments are reverse-complemented back (--as-stored
# keeps them as stored); secondary, supplementary, QC-fail and duplicate records are dropped
# (-F 0xF00, the default). The one thing to know: the model's tokenizer decides how bases
# are read, so a model trained on upper-case genomes should embed upper-case reads (BAM
# sequences are upper case).
#
# Usage: embed_bam_region.sh [MODEL] [READS.bam] [REGION] [OUT.npy]
#   defaults: demo-out/run (from `make demo`), htslib's test range.bam (C. elegans reads),
#   CHROMOSOME_II, reads.npy (+ reads.ids.tsv: row -> read name, interval, length; line 1 the @PG provenance).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -n "${MOE_BUILD_DIR:-}" ] && PATH="$MOE_BUILD_DIR:$PATH"
[ -x "$src/build/moe-embed" ] && PATH="$PATH:$src/build"
model=${1:-demo-out/run}
bam=${2:-/usr/share/htslib-test/test/range.bam}
region=${3:-CHROMOSOME_II}
out=${4:-reads.npy}
minq=${MOE_MIN_MAPQ:-0}

echo "\$ moe-embed -m $model -r $region --min-mapq $minq -o $out $bam" >&2
moe-embed -m "$model" -r "$region" --min-mapq "$minq" -o "$out" "$bam"
echo "$out: $(($(wc -l <"${out%.npy}.ids.tsv") - 2)) reads; row names in ${out%.npy}.ids.tsv" >&2
