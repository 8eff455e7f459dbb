#!/usr/bin/env bash
# sass_hot.sh: where one kernel's instructions and stalls go, SASS line by line. ncu profiles
# the first launch of the kernels matching REGEX in COMMAND (--set full with the source view),
# and the instructions executed are summed per opcode and per region of the listing: a run of
# lines executed equally often is one region (a straight stretch of code), printed with its
# count relative to the kernel's most frequent count (what ran once a warp, twice, ...), its
# instructions and its share of the stall samples. The region table is what found, on
# 2026-12-06, that k_swiglu_bwd_pairs loaded each token's values only after computing the
# previous token's (a branch a token: 16 memory latencies a tile), which the kernel-level
# metrics showed only as low IPC.
#
#   bench/kernels/sass_hot.sh OUT_DIR REGEX COMMAND...
#   RECIPE=fp8-block bench/kernels/sass_hot.sh $OUT k_swiglu_bwd_pairs build-gpu/bench/bench_train_gpu mixtral8x7b-2L 1 0
#
# Writes OUT_DIR/sass.csv (ncu's source page, SASS) and prints the tables; with a CSV already
# there from an earlier run, `sass_hot.sh OUT_DIR --table` only prints them (no GPU needed).
# Needs ncu and python3 (both on the GPU machine: docs/performance-gpu.md "Tools").
set -euo pipefail
out=${1:?usage: sass_hot.sh OUT_DIR REGEX COMMAND... | sass_hot.sh OUT_DIR --table}
regex=${2:?usage: sass_hot.sh OUT_DIR REGEX COMMAND... | sass_hot.sh OUT_DIR --table}
shift 2
mkdir -p "$out"
csv="$out/sass.csv"
if [ "$regex" != "--table" ]; then
    [ $# -gt 0 ] || { echo "sass_hot.sh: name the command to profile" >&2; exit 2; }
    rep="$out/sass_hot"
    ncu --set full --import-source yes -k "regex:$regex" -c 1 -f -o "$rep" "$@" > "$out/ncu.log" 2>&1 ||
        { tail -5 "$out/ncu.log"; echo "sass_hot.sh: ncu failed (log: $out/ncu.log)" >&2; exit 1; }
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$csv"
fi
[ -s "$csv" ] || { echo "sass_hot.sh: no $csv" >&2; exit 2; }
python3 - "$csv" <<'PY'
import collections, csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
hdr = rows[head]
ie, src = hdr.index("Instructions Executed"), hdr.index("Source")
st = hdr.index("Warp Stall Sampling (All Samples)")
lines = []
for r in rows[head + 1:]:
    try:
        lines.append((int(r[ie]), int(r[st] or 0), r[src].strip()))
    except (ValueError, IndexError):
        pass
if not lines:
    sys.exit("sass_hot.sh: no SASS lines with counts in " + sys.argv[1])
total = sum(c for c, _, _ in lines) or 1
stalls = sum(s for _, s, _ in lines) or 1
def opcode(text):
    w = text.split()
    w = w[1:] if w and w[0].startswith("@") else w
    return w[0].split(".")[0] if w else "?"
print(f"{total:,} warp instructions, {stalls:,} stall samples, {len(lines)} SASS lines")
print("\nby opcode (share of instructions, of stalls):")
ops, opst = collections.Counter(), collections.Counter()
for c, s, t in lines:
    ops[opcode(t)] += c
    opst[opcode(t)] += s
for o, c in ops.most_common(16):
    print(f"  {o:10s} {100 * c / total:5.1f}%  {100 * opst[o] / stalls:5.1f}%")
# regions: runs of neighbouring lines whose counts stay within 10% of the run's first (a
# stretch of code with its branches' predicated lines); counts relative to the kernel's first
# line, which every warp runs once
unit = lines[0][0] or 1
regions, start = [], 0
for i in range(1, len(lines) + 1):
    if i == len(lines) or abs(lines[i][0] - lines[start][0]) > 0.1 * lines[start][0]:
        regions.append((start, i))
        start = i
print(f"\nthe 20 largest regions (x: times a warp runs them; {unit:,} warps):")
def weight(ab):
    return sum(x[0] for x in lines[ab[0]:ab[1]])
for a, b in sorted(regions, key=weight, reverse=True)[:20]:
    c, s = weight((a, b)), sum(x[1] for x in lines[a:b])
    top = collections.Counter(opcode(t) for _, _, t in lines[a:b]).most_common(5)
    print(f"  lines {a:5d}-{b - 1:5d}  x{lines[a][0] / unit:5.2f}  {100 * c / total:5.1f}% of "
          f"instructions  {100 * s / stalls:5.1f}% of stalls  "
          + " ".join(f"{o}:{n}" for o, n in top))
PY
