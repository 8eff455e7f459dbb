#!/usr/bin/env python3
"""np_score: the log-likelihoods `moe-score seq` should give, from the NumPy (float64)
Mixtral forward of np_mixtral.py on a `moe-convert to-hf` directory, or (--hf f32|bf16)
from Hugging Face MixtralForCausalLM loaded from that directory on the GPU.

  np_score.py HF_DIR FASTA MOE_TSV [--context N] [--lp LP.npy LP.ids.tsv] [--tol 1e-5]
              [--hf f32|bf16]

Tokenizes every record of FASTA (one sequence per line after its '>' header) with the
exported tokenizer.json, scores it with the window rule of docs/cli.md restated here
independently (windows of W = max_position_embeddings - BOS content tokens; the first
starts at 0, each next one starts N tokens before the end of the previous one and scores
only the tokens after it; BOS first when the tokenizer adds one, else the first token is
not scored) and compares: the TSV's log_likelihood within tol relative, bits_per_base
and perplexity consistent with it; with --lp, every per-position value within 1e-4
absolute (NaN exactly where nothing is scored). Exit 0 when all agree.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_export import load_dir  # noqa: E402
from np_mixtral import encode, forward  # noqa: E402


def read_fasta(path):
    recs, name = [], None
    for line in open(path):
        line = line.strip()
        if line.startswith(">"):
            name = line[1:].split()[0]
            recs.append([name, ""])
        elif line:
            recs[-1][1] += line
    return recs


def hf_forward(hf_dir, dtype):
    """A forward(cfg, t, ids) -> (None, logits [len(ids), V] float64) through transformers'
    MixtralForCausalLM on CUDA in dtype ("f32" or "bf16")."""
    import torch
    from transformers import MixtralForCausalLM

    td = torch.float32 if dtype == "f32" else torch.bfloat16
    model = MixtralForCausalLM.from_pretrained(hf_dir, dtype=td).to("cuda").eval()

    def fwd(cfg, t, ids):
        with torch.inference_mode():
            out = model(torch.tensor([ids], device="cuda")).logits[0]
        return None, out.float().cpu().numpy().astype(np.float64)

    return fwd


def score(cfg, t, hf_dir, seq, context, forward=forward):
    ids, off, n = encode(hf_dir, seq)
    bos = ids[:off]
    content = ids[off:off + n]
    nb = len(bos)
    W = cfg["max_position_embeddings"] - nb
    N = context if context else W // 2
    first = 0 if nb else 1
    lp = np.full(n, np.nan)
    end = 0
    while end < n and n > first:
        start = 0 if end == 0 else end - N
        stop = min(start + W, n)
        _, logits = forward(cfg, t, bos + content[start:stop])
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        for j in range(max(end, first), stop):
            lp[j] = logp[j - start + nb - 1, content[j]]
        end = stop
    return lp


def main():
    ap = argparse.ArgumentParser(description="moe-score seq against the NumPy Mixtral forward")
    ap.add_argument("hf_dir")
    ap.add_argument("fasta")
    ap.add_argument("tsv")
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--lp", nargs=2, metavar=("LP_NPY", "IDS_TSV"))
    ap.add_argument("--hf", choices=("f32", "bf16"), help="Hugging Face on the GPU instead")
    a = ap.parse_args()
    fwd = hf_forward(a.hf_dir, a.hf) if a.hf else forward
    what = f"Hugging Face MixtralForCausalLM ({a.hf}, cuda)" if a.hf else "the NumPy Mixtral reference"
    hf_dir, fasta, tsv, tol, lp_files = a.hf_dir, a.fasta, a.tsv, a.tol, a.lp
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    t = load_dir(hf_dir)
    lines = [line.rstrip("\n").split("\t") for line in open(tsv)]
    if not lines or lines[0][:2] != ["#@PG", "ID:moe-score"]:
        print(f"np_score: FAIL: {tsv} does not start with a #@PG provenance line")
        sys.exit(1)
    rows = lines[2:]  # the provenance line, the header, then one row per sequence
    recs = read_fasta(fasta)
    if len(rows) != len(recs):
        print(f"np_score: FAIL: {len(rows)} TSV rows for {len(recs)} sequences")
        sys.exit(1)
    ok = True
    lp_all = np.load(lp_files[0]) if lp_files else None
    for (name, seq), row in zip(recs, rows):
        ref = score(cfg, t, hf_dir, seq, a.context, fwd)
        ll_ref = np.nansum(ref)
        if lp_files:  # ids.tsv: row name length tokens first_row log_likelihood ...
            name_m, first_row, ll = row[1], int(row[4]), float(row[5])
            got = lp_all[first_row:first_row + len(ref)]
            if not (np.array_equal(np.isnan(got), np.isnan(ref))
                    and np.nanmax(np.abs(got - ref)) <= 1e-4):
                print(f"np_score: FAIL: {name}: per-position values differ")
                ok = False
        else:
            name_m, ll, bpb, ppl = row[0], float(row[2]), float(row[3]), float(row[4])
            scored = int(np.sum(~np.isnan(ref)))
            ok &= math.isclose(bpb, -ll / math.log(2) / scored, rel_tol=1e-5)
            ok &= math.isclose(ppl, math.exp(-ll / scored), rel_tol=1e-5)
        rel = abs(ll - ll_ref) / abs(ll_ref)
        print(f"np_score: {name}: {len(ref)} tokens, moe {ll:.6f} vs reference {ll_ref:.6f} "
              f"nats (relative {rel:.2g}, tol {tol:g})")
        ok &= name_m == name and rel <= tol
    verdict = "ok" if ok else "FAIL"
    print(f"np_score: {verdict}: {len(recs)} sequences against {what}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
