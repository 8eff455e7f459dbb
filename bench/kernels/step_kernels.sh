#!/usr/bin/env bash
# step_kernels.sh: where one training step's GPU time goes, kernel by kernel. ncu times every
# kernel of bench_train_gpu's last timed step (NCU_STEP=1 makes that step the profiler's
# capture range) and the launches are summed by kernel name (template arguments kept,
# parameters dropped), largest first, with their share and launch count. ncu runs each kernel
# alone at locked clocks, so the sum runs above the unprofiled step (about 7% on an H100,
# docs/performance-gpu.md); the shares are what to read.
#
#   bench/kernels/step_kernels.sh BUILD_DIR PRESET [OUT_DIR]
#   RECIPE=fp8-block MOMENTS=bf16 EXPERT_GRADS=bf16 bench/kernels/step_kernels.sh build-gpu mixtral8x7b-2L $OUT
#
# RECIPE, WGRAD, MOMENTS, EXPERT_GRADS and MASTER reach bench_train_gpu as for its own runs.
# Writes OUT_DIR/step_kernels_PRESET_RECIPE.csv (RECIPE-WGRAD when WGRAD is set; ncu's raw
# CSV) and prints the table. Needs ncu and
# python3 on the GPU machine (both there: docs/performance-gpu.md "Tools").
set -euo pipefail
build=${1:?usage: step_kernels.sh BUILD_DIR PRESET [OUT_DIR]}
preset=${2:?usage: step_kernels.sh BUILD_DIR PRESET [OUT_DIR]}
out=${3:-.}
bin="$build/bench/bench_train_gpu"
[ -x "$bin" ] || { echo "step_kernels.sh: $bin not found (build first)" >&2; exit 2; }
mkdir -p "$out"
csv="$out/step_kernels_${preset}_${RECIPE:-bf16}${WGRAD:+-$WGRAD}.csv"
NCU_STEP=1 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv "$bin" "$preset" 1 0 \
    > "$csv"
python3 - "$csv" "$preset ${RECIPE:-bf16}${WGRAD:+ $WGRAD}" <<'PY'
import collections, csv, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
to_ms = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0].strip()
    tot[name] += float(r["Metric Value"].replace(",", "")) * to_ms[r["Metric Unit"]]
    cnt[name] += 1
if not tot:
    sys.exit("step_kernels.sh: ncu timed no kernel (see " + sys.argv[1] + ")")
s = sum(tot.values())
print(f"{sys.argv[2]}: {s:.2f} ms in {sum(cnt.values())} kernels (ncu's clocks)")
for k, v in sorted(tot.items(), key=lambda t: -t[1]):
    print(f"{v:9.3f} ms {100 * v / s:5.1f}% {cnt[k]:5d}  {k[:150]}")
PY
