"""score_hf.py: the data and the Hugging Face side of bench/score_gpu.sh (only `score` needs
torch + transformers; the model itself is bench/embed_hf.py's, loaded through its load_model).

  score_hf.py make-data REF.fa CALLS.vcf GENOME.fa.gz LENGTH N W
        REF.fa: one contig `bench` of LENGTH bases, copies of GENOME's sequence end to end
        (80 bases a line), and REF.fa.fai beside it (samtools faidx's columns, written here:
        samtools need not be installed); CALLS.vcf: N SNVs at evenly spaced positions whose
        W-base windows lie inside the contig, REF the reference base, ALT another base.
  score_hf.py windows REF.fa CALLS.vcf W OUT.fa [N]
        the REF and ALT window of each of the first N records (>rI, >aI, record I, in
        order): the sequences `moe-score seq` scores to check site_windows against moe-score.
  score_hf.py seq-llr SEQ.tsv CALLS.vcf OUT.tsv
        `moe-score seq` on the windows of `windows` -> LLR = ALT - REF log-likelihood per
        record, in the `moe-score variants --tsv` columns.
  score_hf.py score HF_DIR REF.fa CALLS.vcf W BATCH DTYPE OUT.tsv [N]
        MixtralForCausalLM (DTYPE bf16|fp32, SDPA) on each record's REF and ALT window in
        batches of BATCH windows of one length, longest first (Evo 2's notebook batching;
        every window here has W bases, so batches of BATCH windows): LLR = sum log P(ALT
        window) - sum log P(REF window) over each window's predicted tokens, written in the
        `variants --tsv` columns. Prints one JSON line with variants/s; the model load is not
        timed, everything after it is (reading the inputs, windows, forward passes, output).
  score_hf.py compare A.tsv B.tsv [MAX_ABS_DIFF]
        Pearson correlation and max |difference| of the LLRs of the records in both (by
        chrom, pos, ref, alt); exit 1 when a common record is unscored in one of them, none
        are common, or the max difference exceeds MAX_ABS_DIFF.

Tokens: the checkpoint's tokenizer as `moe-convert to-hf` exports it (tokenizer.json's vocab
for each base, BOS first when moe_tokenizer.json's policies say so; moe's byte tokenizer has
none, so the first token has no context and is not scored, as in moe-score). EOS is never
scored and not fed.
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embed_hf import load_model, read_fasta  # noqa: E402

CONTIG = "bench"
GRID = os.environ.get("WINDOW_GRID") == "1"
TSV_HEADER = "chrom\tpos\tid\tref\talt\tllr\n"


def site_windows(seq, pos, ref, alt, W):
    """moe-score's REF and ALT windows of W bases for the variant at 1-based POS of contig SEQ
    (docs/cli.md "variants", libcore/src/score/score_vcf_site.c, restated): REF window [s, s +
    W) with s = POS0 - W // 2 (with WINDOW_GRID=1 in the environment, `--window-grid`: the
    multiple of W // 2 with POS0 - s in [W // 4, W // 4 + W // 2)); the ALT window keeps [s,
    POS0), then ALT, then the reference after REF, filled or trimmed on the right to W bases.
    None where moe-score skips the ALT (a window or the fill off the contig, REF past the
    window)."""
    p0 = pos - 1
    s = (p0 - W // 4) // (W // 2) * (W // 2) if GRID else p0 - W // 2
    h = p0 - s
    if s < 0 or s + W > len(seq) or p0 + len(ref) > s + W:
        return None
    right = max(W - h - len(alt), 0)
    if p0 + len(ref) + right > len(seq):
        return None
    alt_w = (seq[s:p0] + alt + seq[p0 + len(ref):p0 + len(ref) + right])[:W]
    return seq[s:s + W], alt_w


def read_vcf(path, n=None):
    """The first N records of a VCF (all without N) as (chrom, pos, id, ref, alt) tuples."""
    recs = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        if n is not None and len(recs) >= n:
            break
        f = line.rstrip("\n").split("\t")
        recs.append((f[0], int(f[1]), f[2], f[3], f[4]))
    return recs


def read_ref(path):
    """The contigs of a FASTA as a dict name -> sequence."""
    return dict(read_fasta(path))


def windows_of(recs, ref, W):
    """Per record its (REF window, ALT window), or None where it is not scored."""
    out = []
    for chrom, pos, _, r, a in recs:
        seq = ref[chrom]
        if seq[pos - 1:pos - 1 + len(r)].upper() != r.upper():
            sys.exit(f"score_hf.py: {chrom}:{pos}: REF {r} is not the reference's base")
        out.append(site_windows(seq, pos, r, a, W))
    return out


def write_llrs(path, recs, llrs, comment):
    """The `moe-score variants --tsv` layout: a comment line, the header, one row per record
    (`.` where LLR is None)."""
    with open(path, "w") as f:
        f.write(f"#{comment}\n{TSV_HEADER}")
        for (chrom, pos, vid, r, a), v in zip(recs, llrs):
            f.write(f"{chrom}\t{pos}\t{vid}\t{r}\t{a}\t{'.' if v is None else repr(v)}\n")


def make_data(fa, vcf, genome, length, n, W):
    """`make-data` (see the module docstring); exits with a message when N SNVs do not fit."""
    g = "".join(s for _, s in read_fasta(genome)).upper()
    seq = (g * (length // len(g) + 1))[:length]
    with open(fa, "w") as f:
        f.write(f">{CONTIG}\n")
        for i in range(0, length, 80):
            f.write(seq[i:i + 80] + "\n")
    with open(fa + ".fai", "w") as f:  # name, length, offset, bases a line, bytes a line
        f.write(f"{CONTIG}\t{length}\t{len(CONTIG) + 2}\t80\t81\n")
    h = W // 2
    # POS0 in [h, h + span]: s = POS0 - h >= 0 and s + W <= length; on the grid s reaches
    # POS0 - W // 4, so the last variants stay W // 4 further from the end
    span = length - W - (W // 4 if GRID else 0)
    if span < 0 or n < 1 or n > span + 1:
        sys.exit(f"score_hf.py: {n} SNVs with windows of {W} do not fit in {length} bases")
    with open(vcf, "w") as f:
        f.write(f"##fileformat=VCFv4.2\n##contig=<ID={CONTIG},length={length}>\n")
        f.write("#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n")
        for i in range(n):
            p0 = h + (i * span // (n - 1) if n > 1 else span // 2)
            r = seq[p0]
            a = "ACGT"[("ACGT".index(r) + 1 + i % 3) % 4]
            f.write(f"{CONTIG}\t{p0 + 1}\tsnv{i}\t{r}\t{a}\t.\t.\t.\n")
    print(f"make-data: {length} bases ({len(g)}-base {genome} repeated) -> {fa} (+ .fai), "
          f"{n} SNVs -> {vcf}")


def windows(fa, vcf, W, out, n=None):
    """`windows`: the REF and ALT window of each of the first N records as FASTA."""
    recs = read_vcf(vcf, n)
    with open(out, "w") as f:
        for i, w in enumerate(windows_of(recs, read_ref(fa), W)):
            if w is None:
                sys.exit(f"score_hf.py: record {i + 1} has no windows (off the contig)")
            f.write(f">r{i}\n{w[0]}\n>a{i}\n{w[1]}\n")
    print(f"windows: {len(recs)} REF + ALT windows of {W} bases -> {out}")


def seq_llr(seq_tsv, vcf, out):
    """`seq-llr`: rows rI, aI of a `moe-score seq` TSV -> the LLR of record I."""
    rows = [l.split("\t") for l in open(seq_tsv).read().splitlines()
            if l and not l.startswith("#") and not l.startswith("name\t")]
    ll = {r[0]: float(r[2]) for r in rows}
    recs = read_vcf(vcf, len(rows) // 2)
    write_llrs(out, recs, [ll[f"a{i}"] - ll[f"r{i}"] for i in range(len(recs))],
               f"LLR = ALT - REF log-likelihood of `moe-score seq` {seq_tsv}")


def tokenizer(hf_dir):
    """encode(window) -> its token ids as bytes (BOS first when the tokenizer adds one), from
    the exported tokenizer files of HF_DIR (one token a base, ids below 256)."""
    vocab = json.load(open(os.path.join(hf_dir, "tokenizer.json")))["model"]["vocab"]
    moe = json.load(open(os.path.join(hf_dir, "moe_tokenizer.json")))
    bases = {c: i for c, i in vocab.items() if len(c) == 1 and c.isalpha() and i < 256}
    if moe.get("k", 1) != 1 or not set("ACGT") <= set(bases):
        sys.exit(f"score_hf.py: {hf_dir}: a {moe.get('name')} tokenizer (one base a token needed)")
    table = bytearray(range(256))
    for c, i in bases.items():
        table[ord(c)] = i
    head = bytes([moe["bos_id"]]) if moe["policies"].get("bos") else b""

    def encode(s):
        if not set(s) <= bases.keys():
            bad = sorted(set(s) - bases.keys())
            sys.exit(f"score_hf.py: a window holds {bad}, not in the tokenizer of {hf_dir}")
        return head + s.encode().translate(table)
    return encode, len(head)


def shared_prefix(a, b):
    """The length of the longest common prefix of strings A and B (a binary search over
    slice comparisons: no Python loop over the bases inside the timed loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid - 1)
    return lo


def score(hf_dir, fa, vcf, W, batch, dtype, out, n=None):
    """`score`: the HF loop on the first N records of VCF (all without N), its LLRs to OUT and
    one JSON line of rates on stdout (prefix_residual_max: the largest change of an LLR when
    the tokens both windows share are left out, as moe-score does; 0 when HF gives them the
    same values in both rows)."""
    import torch
    encode, nb = tokenizer(hf_dir)
    model, impl = load_model(hf_dir, "MixtralForCausalLM", dtype)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    recs = read_vcf(vcf, n)
    wins = windows_of(recs, read_ref(fa), W)
    rows, first = [], []  # rows: token ids (bytes), REF then ALT of each scored record
    for w in wins:
        if w is None:
            continue
        d = shared_prefix(*w)
        for s in w:
            rows.append(encode(s))
            first.append(d + nb)  # the first row position that differs
    total, suffix = [0.0] * len(rows), [0.0] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # stable: input order in ties
    tokens = 0
    with torch.inference_mode():
        i = 0
        while i < len(order):
            T = len(rows[order[i]])
            j = i
            while j < len(order) and j - i < batch and len(rows[order[j]]) == T:
                j += 1
            b = order[i:j]
            ids = torch.frombuffer(bytearray(b"".join(rows[k] for k in b)), dtype=torch.uint8)
            ids = ids.view(len(b), T).to("cuda").long()
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0].double()
            cum = lp.flip(1).cumsum(1).flip(1).cpu()  # cum[:, p] = sum of lp[:, p:]
            for r, k in enumerate(b):
                total[k] = float(cum[r, 0])
                # the tokens from the first differing one (predicted at the position before)
                p = max(first[k] - 1, 0)
                suffix[k] = float(cum[r, p]) if p < T - 1 else 0.0
            tokens += len(b) * T
            i = j
    llrs, residual, m = [], 0.0, 0
    for w in wins:
        if w is None:
            llrs.append(None)
            continue
        llrs.append(total[m + 1] - total[m])
        residual = max(residual, abs((total[m + 1] - total[m]) - (suffix[m + 1] - suffix[m])))
        m += 2
    write_llrs(out, recs, llrs, f"hf MixtralForCausalLM {hf_dir} {dtype} sdpa experts={impl}")
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    scored = sum(v is not None for v in llrs)
    print(json.dumps(dict(side="hf", dtype=dtype, batch=batch, experts_impl=impl, window=W,
                          variants=scored, windows=len(rows), tokens=tokens,
                          seconds=round(dt, 2), variants_per_s=round(scored / dt, 3),
                          tokens_per_s=round(tokens / dt),
                          prefix_residual_max=residual,
                          peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 1))))


def read_llrs(path):
    """(chrom, pos, ref, alt) -> LLR (None for `.`) of a `variants --tsv` layout file."""
    out = {}
    for line in open(path):
        if line.startswith("#") or line.startswith("chrom\t") or not line.strip():
            continue
        c, pos, _, r, a, v = line.rstrip("\n").split("\t")
        out[(c, int(pos), r, a)] = None if v == "." else float(v)
    return out


def compare(a, b, max_diff=None):
    """`compare`: one JSON line (records, pearson, max_abs_diff, ...); exits 1 as documented."""
    x, y = read_llrs(a), read_llrs(b)
    keys = [k for k in x if k in y]
    bad = [k for k in keys if x[k] is None or y[k] is None]
    if not keys or bad:
        sys.exit(f"compare: {len(keys)} records in both {a} and {b}, {len(bad)} unscored in one")
    u, v = [x[k] for k in keys], [y[k] for k in keys]
    n = len(keys)
    mu, mv = sum(u) / n, sum(v) / n
    su = math.sqrt(sum((p - mu) ** 2 for p in u) / n)
    sv = math.sqrt(sum((q - mv) ** 2 for q in v) / n)
    cov = sum((p - mu) * (q - mv) for p, q in zip(u, v)) / n
    diff = max(abs(p - q) for p, q in zip(u, v))
    r = cov / (su * sv) if su > 0 and sv > 0 else float("nan")
    print(json.dumps(dict(records=n, pearson=r, max_abs_diff=diff,
                          mean_abs_diff=sum(abs(p - q) for p, q in zip(u, v)) / n,
                          llr_mean=[round(mu, 6), round(mv, 6)],
                          llr_std=[round(su, 6), round(sv, 6)])))
    if max_diff is not None and diff > max_diff:
        sys.exit(f"compare: {a} and {b} differ by up to {diff:.3g} (more than {max_diff})")


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    opt = lambda i: int(a[i]) if len(a) > i else None  # noqa: E731
    if cmd == "make-data":
        make_data(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
    elif cmd == "windows":
        windows(a[0], a[1], int(a[2]), a[3], opt(4))
    elif cmd == "seq-llr":
        seq_llr(a[0], a[1], a[2])
    elif cmd == "score":
        score(a[0], a[1], a[2], int(a[3]), int(a[4]), a[5], a[6], opt(7))
    elif cmd == "compare":
        compare(a[0], a[1], float(a[2]) if len(a) > 2 else None)
    else:
        sys.exit(f"score_hf.py: unknown command {cmd}")
