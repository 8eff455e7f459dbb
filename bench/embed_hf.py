"""embed_hf.py: the Hugging Face side of bench/embed_gpu.sh (needs torch + transformers).

  embed_hf.py make-model HF_DIR            random-init MixtralForCausalLM, og2-8x1b shapes, bf16
  embed_hf.py make-fasta FA N GENOME.fa.gz N sequences of 1,000-8,000 bases cut from GENOME
  embed_hf.py embed HF_DIR FA ORDER BATCH OUT.npy [N]
        MixtralModel.from_pretrained(HF_DIR) in bf16 (SDPA attention, the fastest experts
        implementation this transformers offers), mean of the final-norm hidden states over
        each sequence's bases (as `moe-embed` pools): ORDER `input` = batches of BATCH
        sequences in file order, right-padded with an attention mask (what a plain HF loop
        does); `sorted` = longest first, as many sequences per batch as fit in BATCH padded
        tokens (the token budget `moe-embed --batch-tokens` uses). Prints one JSON line with
        sequences/s; the model load is not timed. Only the first N sequences when N is given.
  embed_hf.py compare A.npy B.npy          min / median cosine and max relative norm difference
                                           of two [n, hidden] arrays (rows in the same order)

bench/score_hf.py (the HF side of bench/score_gpu.sh) imports read_fasta and load_model from
here. Token ids are those of moe's default `byte` tokenizer (byte value of each base, case kept,
EOS = id 0 appended, no BOS; pad id 1), so both sides embed the very same ids.
"""
import gzip, json, sys, time

OG2 = dict(hidden_size=2048, intermediate_size=4096, num_local_experts=8, num_experts_per_tok=2,
           num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8, vocab_size=256,
           max_position_embeddings=8192, rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False)
EOS, PAD = 0, 1


def read_fasta(path):
    name, parts, out = None, [], []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                if name is not None:
                    out.append((name, "".join(parts)))
                name, parts = line[1:].split()[0], []
            elif line:
                parts.append(line)
    if name is not None:
        out.append((name, "".join(parts)))
    return out


def make_model(hf_dir):
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = MixtralForCausalLM._from_config(MixtralConfig(**OG2), torch_dtype=torch.bfloat16)
    model.save_pretrained(hf_dir, safe_serialization=True)
    print(f"make-model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters -> {hf_dir}")


def make_fasta(path, n, genome):
    import random
    g = "".join(s for _, s in read_fasta(genome))
    g2 = g + g  # cut across the end of a circular-ish genome too
    rng = random.Random(42)
    with open(path, "w") as f:
        for i in range(n):
            length = rng.randint(1000, 8000)
            start = rng.randrange(len(g))
            s = (g2 * (1 + length // len(g)))[start:start + length]
            f.write(f">s{i} len={length}\n")
            for j in range(0, len(s), 80):
                f.write(s[j:j + 80] + "\n")
    print(f"make-fasta: {n} sequences of 1000-8000 bases from {genome} -> {path}")


def load_model(hf_dir, cls="MixtralModel", dtype="bf16"):
    """transformers' class CLS (MixtralModel, MixtralForCausalLM) from HF_DIR on the GPU in
    eval mode: DTYPE bf16 or fp32, SDPA attention, the fastest experts implementation this
    transformers offers (grouped_mm, else its default). Returns (model, that implementation)."""
    import torch
    import transformers
    kind = getattr(transformers, cls)
    kw = dict(dtype=torch.bfloat16 if dtype == "bf16" else torch.float32, attn_implementation="sdpa")
    impl = "default"
    for cand in ("grouped_mm", None):
        try:
            if cand:
                model = kind.from_pretrained(hf_dir, experts_implementation=cand, **kw)
                impl = cand
            else:
                model = kind.from_pretrained(hf_dir, **kw)
            break
        except (TypeError, ValueError):
            continue
    return model.cuda().eval(), impl


def batches(seqs, order, batch):
    idx = list(range(len(seqs)))
    if order == "input":
        for i in range(0, len(idx), batch):
            yield idx[i:i + batch]
        return
    idx.sort(key=lambda i: -len(seqs[i][1]))
    i = 0
    while i < len(idx):
        b = max(1, batch // (len(seqs[idx[i]][1]) + 1))
        yield idx[i:i + b]
        i += b


def embed(hf_dir, fa, order, batch, out, n=None):
    import numpy as np
    import torch
    seqs = read_fasta(fa)
    if n is not None:
        seqs = seqs[:n]
    model, impl = load_model(hf_dir)
    res = np.zeros((len(seqs), model.config.hidden_size), dtype=np.float32)
    tokens = 0
    padded = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches(seqs, order, batch):
            ids = [list(seqs[i][1].encode()) + [EOS] for i in b]
            T = max(len(x) for x in ids)
            mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in ids], device="cuda")
            inp = torch.tensor([x + [PAD] * (T - len(x)) for x in ids], device="cuda")
            h = model(input_ids=inp, attention_mask=mask).last_hidden_state.float()
            bases = mask.clone()
            lens = torch.tensor([len(x) - 1 for x in ids], device="cuda")
            bases[torch.arange(len(ids), device="cuda"), lens] = 0  # EOS is not pooled
            v = (h * bases.unsqueeze(-1)).sum(1) / lens.unsqueeze(-1)
            res[b] = v.cpu().numpy()
            tokens += sum(len(x) for x in ids)
            padded += len(ids) * T
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    np.save(out, res)
    print(json.dumps(dict(side="hf", order=order, batch=batch, experts_impl=impl, sequences=len(seqs),
                          tokens=tokens, padded_tokens=padded, seconds=round(dt, 2),
                          sequences_per_s=round(len(seqs) / dt, 2), tokens_per_s=round(tokens / dt),
                          peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 1))))


def compare(a, b):
    import numpy as np
    x, y = np.load(a).astype(np.float64), np.load(b).astype(np.float64)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    rel = np.abs(np.linalg.norm(x, axis=1) - np.linalg.norm(y, axis=1)) / np.linalg.norm(y, axis=1)
    print(json.dumps(dict(rows=n, cosine_min=float(cos.min()), cosine_median=float(np.median(cos)),
                          norm_rel_diff_max=float(rel.max()))))


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "make-model":
        make_model(a[0])
    elif cmd == "make-fasta":
        make_fasta(a[0], int(a[1]), a[2])
    elif cmd == "embed":
        embed(a[0], a[1], a[2], int(a[3]), a[4], int(a[5]) if len(a) > 5 else None)
    elif cmd == "compare":
        compare(a[0], a[1])
    else:
        sys.exit(f"embed_hf.py: unknown command {cmd}")
