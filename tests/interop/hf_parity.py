#!/usr/bin/env python3
"""hf_parity: moe against Hugging Face transformers on an exported checkpoint (GPU machine
with PyTorch + transformers; run by tests/interop/gpu_parity.sh, figures in
docs/interop.md).

  hf_parity.py --ckpt CKPT --hf HF_F32 --hf-bf16 HF_BF16 --seq SEQ --work DIR
               [--json OUT.json]

Checks, each recorded in the JSON report:
  load       MixtralForCausalLM.from_pretrained(HF_F32) reports no missing, unexpected or
             mismatched keys (and the same for HF_BF16)
  tokenizer  AutoTokenizer.from_pretrained(HF_F32)(SEQ) gives the ids that the exported
             tokenizer.json gives by hand (np_mixtral.encode) and moe's tokens (layer 0)
  hidden     moe-embed --per-token --layer l (CPU, fp32) vs HF hidden states (forward hooks:
             embeddings, each decoder layer's output, the final norm) at the content
             positions: max |moe - hf| / max |hf| <= 1e-4
  logits     moe's final-norm rows @ lm_head^T vs HF logits: max rel <= 1e-4 (f32)
  pooled     moe-embed (mean pooling) vs the mean of HF's final-norm states: rel <= 1e-4
  bf16       HF_BF16 loaded in bfloat16: logits cosine with moe's f32 logits >= 0.999, and
             with moe-embed --precision bf16 (moe's bf16 recipe) >= 0.999
  numpy      the NumPy reference (np_mixtral.py) agrees with HF too (triangulation)
Exit 0 when all criteria hold.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import np_mixtral  # noqa: E402
from check_hf_export import load_dir  # noqa: E402


def moe_rows(ckpt, fa, work, tag, extra):
    out = os.path.join(work, f"{tag}.npy")
    subprocess.run(["moe-embed", "-q", "-m", ckpt, fa, "-o", out] + extra, check=True)
    return np.load(out).astype(np.float64)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def load_hf(path, dtype):
    from transformers import MixtralForCausalLM
    kw = dict(output_loading_info=True, attn_implementation="eager")
    try:
        model, info = MixtralForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model, info = MixtralForCausalLM.from_pretrained(path, torch_dtype=dtype, **kw)
    bad = {k: list(v) for k, v in info.items() if v}
    return model.eval(), bad


def hf_states(model, ids, dev):
    """Embeddings, each decoder layer's output, final norm output, logits (float64)."""
    cap = {}
    hooks = []

    def keep(name):
        def hook(_m, _inp, out):
            cap[name] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    inner = model.model
    hooks.append(inner.embed_tokens.register_forward_hook(keep("emb")))
    for i, layer in enumerate(inner.layers):
        hooks.append(layer.register_forward_hook(keep(f"layer{i}")))
    hooks.append(inner.norm.register_forward_hook(keep("norm")))
    with torch.no_grad():
        out = model(torch.tensor([ids], device=dev), use_cache=False)
    for h in hooks:
        h.remove()
    L = len(inner.layers)
    states = [cap["emb"]] + [cap[f"layer{i}"] for i in range(L - 1)] + [cap["norm"]]
    f = lambda t: t.float().cpu().numpy().reshape(-1, t.shape[-1]).astype(np.float64)  # noqa: E731
    return [f(s) for s in states], f(out.logits)


def main():
    ap = argparse.ArgumentParser()
    for a in ("--ckpt", "--hf", "--hf-bf16", "--seq", "--work"):
        ap.add_argument(a, required=True)
    ap.add_argument("--json")
    args = ap.parse_args()
    import transformers
    from transformers import AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rep = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "sequence_bases": len(args.seq), "checks": {}}
    ok = True

    def check(name, passed, **figures):
        nonlocal ok
        rep["checks"][name] = dict(figures, passed=bool(passed))
        ok &= bool(passed)
        print(f"hf_parity: {'ok  ' if passed else 'FAIL'} {name}: {figures}", flush=True)

    os.makedirs(args.work, exist_ok=True)
    fa = os.path.join(args.work, "seq.fa")
    with open(fa, "w") as f:
        f.write(f">parity\n{args.seq}\n")
    cfg = json.load(open(os.path.join(args.hf, "config.json")))
    L = cfg["num_hidden_layers"]

    def section(name, fn):
        """Runs one group of checks; an exception fails it without stopping the others."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded in the report
            check(name, False, error=f"{type(e).__name__}: {e}"[:500])

    S = {}

    def load():  # no missing / unexpected / mismatched keys
        model, bad = load_hf(args.hf, torch.float32)
        S["model"] = model.to(dev)
        check("load_f32", not bad, problems=bad)

    def load16():
        mb, bad16 = load_hf(args.hf_bf16, torch.bfloat16)
        S["mb"] = mb.to(dev)
        check("load_bf16", not bad16, problems=bad16)

    def tokenizer():
        at = AutoTokenizer.from_pretrained(args.hf)
        at_ids = at(args.seq)["input_ids"]
        check("tokenizer", at_ids == ids, autotokenizer=at_ids[:12], tokenizer_json=ids[:12],
              tokens=len(ids), equal=at_ids == ids)

    ids, off, n = np_mixtral.encode(args.hf, args.seq)
    t = load_dir(args.hf)
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    W = np_mixtral.tensor(t, head)
    S["moe"] = [moe_rows(args.ckpt, fa, args.work, f"l{l}", ["--per-token", "--layer", str(l)])
                for l in range(L + 1)]
    S["moe_logits"] = S["moe"][L] @ W.T

    def f32():  # hidden states and logits
        states, logits = hf_states(S["model"], ids, dev)
        moe = S["moe"]
        for l in range(L + 1):
            r = rel(moe[l], states[l][off:off + n])
            check(f"hidden_layer{l}", r <= 1e-4, max_rel=r)
        S["hf_logits"] = hf_logits = logits[off:off + n]
        ml = S["moe_logits"]
        r = rel(ml, hf_logits)
        check("logits_f32", r <= 1e-4, max_rel=r, cosine=cosine(ml, hf_logits),
              max_abs=float(np.abs(ml - hf_logits).max()), positions=n, vocab=int(W.shape[0]))
        pooled = moe_rows(args.ckpt, fa, args.work, "pooled", [])[0]
        r = rel(pooled, states[L][off:off + n].mean(0))
        check("pooled_embedding", r <= 1e-4, max_rel=r)
        ref_states, ref_logits = np_mixtral.forward(cfg, t, ids)
        r = rel(hf_logits, ref_logits[off:off + n])
        check("numpy_vs_hf_logits", r <= 1e-4, max_rel=r)

    def bf16():
        _, logits16 = hf_states(S["mb"], ids, dev)
        S["hf16"] = l16 = logits16[off:off + n]
        c = cosine(l16, S["moe_logits"])
        check("bf16_hf_vs_moe_f32_logits", c >= 0.999, cosine=c)
        moe16 = moe_rows(args.ckpt, fa, args.work, "bf16", ["--per-token", "--precision", "bf16"])
        c = cosine(l16, moe16 @ W.T)
        check("bf16_hf_vs_moe_bf16_logits", c >= 0.999, cosine=c)

    section("load_f32", load)
    section("load_bf16", load16)
    section("tokenizer", tokenizer)
    if "model" in S:
        section("f32", f32)
    if "mb" in S:
        section("bf16", bf16)

    rep["passed"] = bool(ok)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=2)
    print("hf_parity: " + ("all checks passed" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
