#!/usr/bin/env bash
# e2e.embed_cuda_vs_cpu: moe-embed on the GPU gives the CPU's vectors. On the tiny trained
# checkpoint, pooled mean, max and last vectors, per-window rows and per-token rows from
# --device cuda agree with --device cpu: fp32 recipe within 1e-5 relative per vector (the
# kernels differ from the CPU's only in summation order); bf16 (the GPU default) with cosine
# >= 0.999 per vector. --device auto takes the GPU and gives the bf16 bytes. Skipped (77)
# where no NVIDIA GPU is visible, as in CI. MOE_EMBED_TEST_DEVICE=cpu runs the same checks
# with the CPU on both sides (a check of this script on a machine without a GPU).
set -euo pipefail
dev=${MOE_EMBED_TEST_DEVICE:-cuda}
if [ "$dev" = cuda ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skip: no CUDA device (nvidia-smi -L failed)"; exit 77
fi
# 2 heads: head dim 16, which the GPU's bf16 attention takes (4 heads give 8: refused before
# any work, docs/model.md)
TINY_TRAIN_ARGS="model.num_attention_heads=2"
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "skip: no python3 with numpy"; exit 77; fi

# awk reads to the end (no `head`): under pipefail an early reader's exit would kill the
# writers with SIGPIPE and fail the test at random
zcat "$LAMBDA" | grep -v '>' | tr -d '\n' | fold -w 90 |
    awk 'NR <= 12 {printf ">s%d\n%s\n", NR, substr($0, 1, 20 + 6 * NR)}' > seqs.fa
modes=("--pool mean" "--pool max" "--pool last" "--per-window --window 24 --stride 12" "--per-token")
i=0
for m in "${modes[@]}"; do
    # shellcheck disable=SC2086
    moe-embed -q -m "$CKPT" --device cpu --precision fp32 $m seqs.fa > "cpu$i.tsv"
    # shellcheck disable=SC2086
    moe-embed -q -m "$CKPT" --device "$dev" --precision fp32 $m seqs.fa > "dev32_$i.tsv"
    # shellcheck disable=SC2086
    moe-embed -q -m "$CKPT" --device "$dev" --precision bf16 $m seqs.fa > "dev16_$i.tsv"
    i=$((i + 1))
done
if [ "$dev" = cuda ]; then
    moe-embed -q -m "$CKPT" seqs.fa > auto.tsv
    cmp auto.tsv dev16_0.tsv || { echo "FAIL: --device auto is not the GPU's bf16 run"; exit 1; }
fi
"$PY" - "${#modes[@]}" <<'PY'
import sys
import numpy as np
def rows(path):
    out = []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        vals = [x for x in f[1:] if x]
        out.append((f[0], np.array(vals[-32:], float)))  # the last 32 fields: the vector
    return out
for i in range(int(sys.argv[1])):
    cpu, d32, d16 = rows(f"cpu{i}.tsv"), rows(f"dev32_{i}.tsv"), rows(f"dev16_{i}.tsv")
    assert len(cpu) == len(d32) == len(d16) > 0, (i, len(cpu), len(d32), len(d16))
    worst, cos_min = 0.0, 1.0
    for (n1, a), (n2, b), (n3, c) in zip(cpu, d32, d16):
        assert n1 == n2 == n3, (i, n1, n2, n3)
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
        cos_min = min(cos_min, float(a @ c / (np.linalg.norm(a) * np.linalg.norm(c))))
    assert worst <= 1e-5, (i, "fp32", worst)
    assert cos_min >= 0.999, (i, "bf16", cos_min)
    print(f"mode {i}: {len(cpu)} rows, fp32 max rel diff {worst:.2e}, bf16 min cosine {cos_min:.6f}")
PY
