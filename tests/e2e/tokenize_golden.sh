#!/usr/bin/env bash
# e2e tokenize_golden: the shard format does not drift. tests/data/tokenize/tiny.mtok is the
# worked example of docs/formats.md; tokenizing tiny.fa the documented way must give the
# same bytes. Regenerate the golden file (and the hexdump in the docs) only on purpose,
# when the format version changes.
set -euo pipefail
G="$MOE_SRC_DIR/tests/data/tokenize"
cp "$G/tiny.fa" tiny.fa   # the input name is stored in the shard: use the same relative name
moe-tokenize -q -t nuc --case upper+mask --iupac to-n tiny.fa -o tiny.mtok
cmp tiny.mtok "$G/tiny.mtok" || { echo "FAIL: shard bytes differ from the golden file" >&2; exit 1; }
# and the golden file decodes back to the input, case included
[ "$(moe-tokenize decode -w 0 "$G/tiny.mtok" | grep -v '^>' | tr -d '\n')" = "ACGTacGGN" ] \
  || { echo "FAIL: golden decode" >&2; exit 1; }
echo "tokenize_golden: ok"
