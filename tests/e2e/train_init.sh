#!/usr/bin/env bash
# train_init: `moe-train --init CKPT` fine-tunes from a checkpoint imported with
# `moe-convert from-hf`: a new run starts at step 1 (metrics.jsonl) and trains 5 steps with
# this config's schedule; its step-1 AdamW moments are those of a fresh optimizer (m and v
# from one gradient only: (m / (1 - b1))^2 = v / (1 - b2)); with lr 0 the weights it starts
# from are the imported ones, bit for bit; trainer_state.json records init_from; model.*
# comes from the checkpoint (the tiny config's own model section is replaced), a model.*
# override that differs is an error naming the key, one that agrees is fine; --resume auto
# of the fine-tuning run continues it instead of starting again.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "SKIP: no python3 with numpy (apt install python3-numpy)"; exit 77; fi
moe-convert -q to-hf "$CKPT" hf
moe-convert -q from-hf hf imported
# no model.* here: --init takes the checkpoint's (configs/tiny.yaml's own would not fit)
ft() { moe-train -q -c "$MOE_SRC_DIR/configs/tiny.yaml" --data run.mtok --init imported \
    train.seq_len=128 train.global_batch_tokens=512 optim.warmup_steps=1 log.every=1 \
    train.eval_every=0 "$@" >/dev/null; }
ft -o ft train.steps=5 checkpoint.every=0
[ -d ft/ckpt-00000005 ] && [ "$(sed -n '1s/^{"step": *\([0-9]*\).*/\1/p' ft/metrics.jsonl)" = 1 ]
grep -q '"init_from": *"imported"' ft/ckpt-00000005/trainer_state.json
grep -q '"step": *5' ft/ckpt-00000005/trainer_state.json
# step 1 from a fresh optimizer and from the imported weights
ft -o one train.steps=1 optim.lr=1e-7 optim.min_lr=1e-7
"$PY" - "$INTEROP" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from st_tool import read
w0, _ = read("imported/model.safetensors")
w1, _ = read("one/ckpt-00000001/model.safetensors")
assert sorted(w0) == sorted(w1)
moved = max(np.abs(np.frombuffer(w0[k][2], "<f4") - np.frombuffer(w1[k][2], "<f4")).max()
            for k in w0)
assert moved < 1e-5, f"the weights moved by {moved}: not started from the imported ones"
t, _ = read("one/ckpt-00000001/optimizer-rank0.safetensors")
cfg = open("one/ckpt-00000001/config.yaml").read()
b1 = float(cfg.split("beta1:")[1].split()[0])
b2 = float(cfg.split("beta2:")[1].split()[0])
worst, n = 0.0, 0
for name in t:
    if not name.endswith(".exp_avg"):
        continue
    m = np.frombuffer(t[name][2], "<f4").astype(np.float64)
    v = np.frombuffer(t[name[:-len("exp_avg")] + "exp_avg_sq"][2], "<f4").astype(np.float64)
    g2 = (m / (1 - b1)) ** 2
    worst = max(worst, np.abs(g2 - v / (1 - b2)).max() / max(g2.max(), 1e-30))
    n += 1
assert n > 0 and worst < 1e-5, (n, worst)
print(f"train_init: {n} tensors: step-1 moments are those of a fresh optimizer ({worst:.2g})")
PY
# model.* comes from the checkpoint: a differing override names the key, an equal one passes
rc=0; ft -o bad train.steps=1 model.hidden_size=64 2>err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "model.hidden_size" err.txt && [ ! -d bad/ckpt-00000001 ]
ft -o same train.steps=1 model.hidden_size=32
# --resume auto on the fine-tuning run goes on from its checkpoint (init_from kept)
ft -o ft train.steps=6 --resume auto checkpoint.every=0
grep -q '"step": *6' ft/ckpt-00000006/trainer_state.json
grep -q '"init_from": *"imported"' ft/ckpt-00000006/trainer_state.json
echo "train_init: ok"
