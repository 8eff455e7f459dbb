#!/usr/bin/env bash
# train_gpu.sh: the GPU training benchmark of docs/performance-gpu.md, in one go on one GPU:
# bench_train_gpu on mixtral8x7b-2L and og2-8x1b (tokens/s, model TFLOP/s, MFU vs 790 TFLOP/s,
# peak memory, time per op kind), then the Hugging Face MixtralForCausalLM baseline of
# ../shared/anchors on the same shapes, then one table with the ratio ours / HF.
#
#   bench/train_gpu.sh [BUILD_DIR]          (default build-gpu; run from the checkout root)
#
# Environment: STEPS (timed unprofiled steps, default 5), PROF_STEPS (profiled steps, 2; in the
# first round only), ROUNDS (default 1: ours then HF, this many times in turn; the summary gives
# each round's ratio and their median, the spread a single ratio hides),
# PRESETS (default "mixtral8x7b-2L og2-8x1b"), RECIPES (precision recipes, default bf16; e.g.
# "bf16 fp8-block fp8-block:x-tiles mxfp8" adds each recipe's ratio to our bf16, issue 14's
# table, a recipe with ":x-tiles" run under precision.fp8_wgrad x-tiles (WGRAD); MOMENTS,
# EXPERT_GRADS, MASTER, ACCUM, TOKENS and LR are passed through to bench_train_gpu; the baseline
# has neither ACCUM nor TOKENS, so read its ratio without them), HF_IMPLS (experts
# implementations for the baseline, default grouped_mm; e.g. grouped_mm,eager), HF_SCRIPT (default
# .anchors/hf_moe_baseline.py, else ../shared/anchors/hf_moe_baseline.py; the baseline is
# skipped with a message when neither exists or python3 has no torch).
# The one thing to know: the ratio is only meaningful when both sides ran in the same call on
# the same GPU, which is why they are in one script.
set -uo pipefail
build=${1:-build-gpu}
steps=${STEPS:-5}
prof_steps=${PROF_STEPS:-2}
rounds=${ROUNDS:-1}
presets=${PRESETS:-"mixtral8x7b-2L og2-8x1b"}
recipes=${RECIPES:-bf16}
hf_impls=${HF_IMPLS:-grouped_mm}
hf=${HF_SCRIPT:-}
if [ -z "$hf" ]; then
    for c in .anchors/hf_moe_baseline.py ../shared/anchors/hf_moe_baseline.py; do
        [ -f "$c" ] && { hf=$c; break; }
    done
fi
bin="$build/bench/bench_train_gpu"
if [ ! -x "$bin" ]; then
    echo "train_gpu.sh: $bin not found; build first (source bench/gpu_build.sh $build)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null ||
    echo "(nvidia-smi not available)"
rc=0
for k in $(seq 1 "$rounds"); do
    ps=$prof_steps
    [ "$k" -gt 1 ] && ps=0
    for p in $presets; do
        for r in $recipes; do
            echo
            wg=blocks # RECIPE:x-tiles runs it with precision.fp8_wgrad x-tiles
            [ "${r#*:}" = x-tiles ] && wg=x-tiles
            echo "== round $k: RECIPE=${r%%:*} WGRAD=$wg bench_train_gpu $p $steps $ps"
            RECIPE=${r%%:*} WGRAD=$wg "$bin" "$p" "$steps" "$ps" | tee "$tmp/ours-$p-$r-$k.log"
            st=${PIPESTATUS[0]}
            [ "$st" -eq 77 ] && { echo "train_gpu.sh: no CUDA device, nothing measured"; exit 77; }
            [ "$st" -ne 0 ] && { echo "train_gpu.sh: bench_train_gpu $p ($r) failed (exit $st)"; rc=1; }
        done
    done
    echo
    if [ -n "$hf" ] && python3 -c 'import torch, transformers' 2>/dev/null; then
        names=$(echo $presets | tr ' ' ',')
        echo "== round $k: python3 $hf $hf_impls $names"
        PYTHONUNBUFFERED=1 python3 "$hf" "$hf_impls" "$names" 2>&1 | tee "$tmp/hf-$k.log"
        [ "${PIPESTATUS[0]}" -ne 0 ] && { echo "train_gpu.sh: the HF baseline failed"; rc=1; }
    else
        echo "== HF baseline skipped: ${hf:-no hf_moe_baseline.py found} / python3 without torch+transformers"
    fi
done

echo
echo "== summary (same call, same GPU)"
python3 - "$tmp" "$recipes" "$rounds" $presets <<'PY'
import json, os, re, statistics, sys
tmp, recipes, rounds, presets = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]


def read_round(k):
    """ours, prof keyed by (preset, recipe); hf by preset: round k's lines"""
    ours, prof, hf = {}, {}, {}
    for p in presets:
        for rc in recipes:
            f = os.path.join(tmp, f"ours-{p}-{rc}-{k}.log")
            if not os.path.exists(f):
                continue
            for line in open(f):
                if line.startswith("RESULT ") or line.startswith("PROF "):
                    kv = dict(t.split("=", 1) for t in line.split()[1:])
                    (ours if line.startswith("RESULT") else prof)[(p, rc)] = kv
    hl = os.path.join(tmp, f"hf-{k}.log")
    if os.path.exists(hl):
        for line in open(hl):
            if line.startswith("{"):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "tokens_per_s" in r:
                    hf.setdefault(r["config"], []).append(r)
    return ours, prof, hf


ours, prof, hf = read_round(1)
print("| preset | recipe | moments, expert grads | tokens/step | ours tokens/s | / our bf16 | ours TFLOP/s | ours MFU | ours peak GiB | activations GiB | HF impl | HF tokens/s | HF TFLOP/s | HF peak GiB | ours/HF |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in presets:
    base = ours.get((p, "bf16"))
    for rc in recipes:
        o = ours.get((p, rc))
        if not o:
            print(f"| {p} | {rc} | | failed | | | | | | | | | | | |")
            continue
        vs = f"{float(o['tokens_per_s']) / float(base['tokens_per_s']):.2f}x" if base else "-"
        rows = hf.get(p) or [None]
        for r in rows:
            tail = "| - | - | - | - | - |" if r is None else (
                f"| {r['impl']} | {r['tokens_per_s']:,} | {r['model_tflops']} | {r['peak_mem_GiB']} | "
                f"{float(o['tokens_per_s']) / r['tokens_per_s']:.3f}x |")
            state = f"{o.get('moments', '?')}, {o.get('expert_grads', 'fp32')}"
            state += ", split master" if o.get('master') == 'split' else ""
            print(f"| {p} | {rc} | {state} | {int(o['tokens_per_step']):,} | {float(o['tokens_per_s']):,.0f} | {vs} | "
                  f"{o['model_tflops']} | {o['mfu_pct']}% | {o['peak_gib']} | {o.get('act_gib', '-')} " + tail)
if rounds > 1:  # each round's ratio to HF's first implementation, and their median
    per = [read_round(k) for k in range(1, rounds + 1)]
    print()
    print("| preset | recipe | " + " | ".join(f"round {k}" for k in range(1, rounds + 1)) +
          " | median ours/HF |")
    print("|---|---|" + "---|" * (rounds + 1))
    for p in presets:
        for rc in recipes:
            ratios = []
            for o_k, _, hf_k in per:
                o, h = o_k.get((p, rc)), (hf_k.get(p) or [None])[0]
                ratios.append(float(o["tokens_per_s"]) / h["tokens_per_s"] if o and h else None)
            got = [x for x in ratios if x is not None]
            cells = [f"{x:.3f}x" if x is not None else "-" for x in ratios]
            med = f"{statistics.median(got):.3f}x" if got else "-"
            print(f"| {p} | {rc} | " + " | ".join(cells) + f" | {med} |")
if prof:
    names = ["attention", "expert GEMMs", "dense GEMMs", "other ops", "memory"]
    print()
    print("| preset | recipe | profiled step ms | " + " | ".join(names) + " | host |")
    print("|---|---|---|" + "---|" * (len(names) + 1))
    for p in presets:
        for rc in recipes:
            k = prof.get((p, rc))
            if not k:
                continue
            step = float(k["profiled_step_ms"])
            ms = [float(k[f"kind{i}_ms"]) for i in range(len(names))]
            cells = [f"{v:.1f} ({100 * v / step:.0f}%)" for v in ms]
            host = step - sum(ms)
            print(f"| {p} | {rc} | {step:.1f} | " + " | ".join(cells) + f" | {host:.1f} ({100 * host / step:.0f}%) |")
    print("\n(profiled steps synchronise the GPU around every op; throughput above is unprofiled)")
PY
exit $rc
