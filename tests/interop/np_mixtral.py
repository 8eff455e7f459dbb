#!/usr/bin/env python3
"""np_mixtral: an independent NumPy (float64) forward pass of Hugging Face's Mixtral, read
from a `moe-convert to-hf` directory, to check moe's forward without PyTorch.

  np_mixtral.py HF_DIR SEQUENCE L:TSV [L:TSV ...] [--tol 1e-4]

Tokenizes SEQUENCE with the exported tokenizer.json (as check_hf_export.py does: BOS/EOS
from its TemplateProcessing), runs the model written as in transformers'
modeling_mixtral.py (RMSNorm, RoPE with rotate_half, grouped-query causal attention,
softmax router -> top-k -> renormalised weights, SwiGLU experts w2(silu(w1 x) * w3 x),
final norm, lm_head), and compares each TSV of `moe-embed --per-token --layer L` with the
reference hidden states of layer L (0 = embeddings, l = after decoder layer l, the number
of layers = final norm output) at the sequence's content positions:
max |moe - ref| / max |ref| <= tol. Also prints the logits' agreement computed from the
final-norm rows (moe rows @ lm_head^T vs reference logits) when the top layer is given.
Used by tests/e2e/convert_parity_numpy.sh and by hf_parity.py (to triangulate).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_export import hf_tokenize, load_dir  # noqa: E402

BF16 = "BF16"


def tensor(tensors, name):
    dt, shape, raw = tensors[name]
    if dt == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dt == BF16:
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise SystemExit(f"np_mixtral: unsupported dtype {dt} of {name}")
    return a.reshape(shape).astype(np.float64)


def encode(hf_dir, seq):
    tok = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
    ids = hf_tokenize(tok, seq)
    pre, post = [], []
    tp = tok.get("post_processor") or {}
    seen_a = False
    for piece in tp.get("single", []):
        if "Sequence" in piece:
            seen_a = True
        else:
            tid = tp["special_tokens"][piece["SpecialToken"]["id"]]["ids"][0]
            (post if seen_a else pre).append(tid)
    return pre + ids + post, len(pre), len(ids)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def forward(cfg, t, ids):
    """Hidden states [L+1] (embeddings, after each layer, final norm) and logits."""
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C, E, K = cfg["hidden_size"], cfg["num_local_experts"], cfg["num_experts_per_tok"]
    D, eps, T = C // H, cfg["rms_norm_eps"], len(ids)
    x = tensor(t, "model.embed_tokens.weight")[ids]
    states = [x.copy()]
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D))
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(q):  # q [T, heads, D]
        rot = np.concatenate([-q[..., D // 2:], q[..., :D // 2]], -1)
        return q * cos[:, None, :] + rot * sin[:, None, :]

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for li in range(L):
        p = f"model.layers.{li}."
        h = rmsnorm(x, tensor(t, p + "input_layernorm.weight"), eps)
        q = rope((h @ tensor(t, p + "self_attn.q_proj.weight").T).reshape(T, H, D))
        k = rope((h @ tensor(t, p + "self_attn.k_proj.weight").T).reshape(T, KV, D))
        v = (h @ tensor(t, p + "self_attn.v_proj.weight").T).reshape(T, KV, D)
        out = np.zeros((T, H, D))
        for hd in range(H):
            g = hd // (H // KV)
            s = q[:, hd, :] @ k[:, g, :].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hd, :] = (s / s.sum(-1, keepdims=True)) @ v[:, g, :]
        x = x + out.reshape(T, C) @ tensor(t, p + "self_attn.o_proj.weight").T
        h = rmsnorm(x, tensor(t, p + "post_attention_layernorm.weight"), eps)
        logits = h @ tensor(t, p + "block_sparse_moe.gate.weight").T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        moe = np.zeros_like(x)
        for n in range(T):
            top = np.argsort(-probs[n], kind="stable")[:K]
            w = probs[n, top] / probs[n, top].sum()
            for e, we in zip(top, w):
                ep = p + f"block_sparse_moe.experts.{e}."
                a = tensor(t, ep + "w1.weight") @ h[n]
                b = tensor(t, ep + "w3.weight") @ h[n]
                moe[n] += we * (tensor(t, ep + "w2.weight") @ (a / (1 + np.exp(-a)) * b))
        x = x + moe
        if li < L - 1:
            states.append(x.copy())
    xn = rmsnorm(x, tensor(t, "model.norm.weight"), eps)
    states.append(xn)
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    return states, xn @ tensor(t, head).T


def main():
    args = [a for a in sys.argv[1:]]
    tol = 1e-4
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) < 3:
        print(__doc__)
        sys.exit(2)
    hf_dir, seq = args[0], args[1]
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    t = load_dir(hf_dir)
    ids, off, n = encode(hf_dir, seq)
    states, logits = forward(cfg, t, ids)
    L = cfg["num_hidden_layers"]
    ok = True
    for spec in args[2:]:
        layer, path = spec.split(":", 1)
        layer = int(layer)
        moe = np.array([[float(v) for v in line.split("\t")[2:]] for line in open(path)])
        ref = states[layer][off:off + n]
        if moe.shape != ref.shape:
            print(f"np_mixtral: FAIL: layer {layer}: moe {moe.shape} vs reference {ref.shape}")
            ok = False
            continue
        rel = np.abs(moe - ref).max() / np.abs(ref).max()
        print(f"np_mixtral: layer {layer}: max |moe - ref| / max |ref| = {rel:.3g} (tol {tol:g})")
        ok &= rel <= tol
        if layer == L:
            head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
            ml = moe @ tensor(t, head).T
            rl = logits[off:off + n]
            lrel = np.abs(ml - rl).max() / np.abs(rl).max()
            print(f"np_mixtral: logits: max |moe - ref| / max |ref| = {lrel:.3g} (tol {tol:g})")
            ok &= lrel <= tol
    if not ok:
        print("np_mixtral: FAIL")
        sys.exit(1)
    print(f"np_mixtral: ok: {len(ids)} tokens, moe matches the NumPy Mixtral reference")


if __name__ == "__main__":
    main()
