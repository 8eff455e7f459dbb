#!/usr/bin/env bash
# e2e.score_cuda_vs_cpu: moe-score on the GPU gives the CPU's numbers. On the tiny trained
# checkpoint (2 heads: head dim 16, which the GPU's bf16 attention takes), `seq` on lambda
# pieces of 30-900 bases (the longer ones in several windows, --context 64), `seq
# --per-position` and `variants --tsv` on a VCF of SNVs, an MNV, indels and a multi-allelic
# site are run with --device cpu and with --device cuda, each in fp32 and in bf16 (the CPU's
# bf16 recipe rounds as the GPU's does), and compared at the same precision:
#   fp32  every sequence's log-likelihood within 1e-5 relative, every per-position value
#         within 1e-4 absolute (NaN at the same places);
#   bf16  the total log-likelihood of all sequences within 1e-3 relative;
#   fp32  every ALT's MOE_LLR within 1e-3 nats, the same ALTs scored;
#   bf16  the same ALTs scored, each MOE_LLR no further from the fp32 CPU's than twice the
#         CPU bf16's largest distance + 1e-3 nats (bf16 rounding alone moves this tiny
#         model's LLRs of 0.01-0.4 nats by up to 0.018 nats on the CPU: a fixed 1e-3 would
#         test rounding luck, not the GPU).
# (An H200 gave fp32 1.2e-8 relative, bf16 total 2.4e-5, variants 4e-6 nats.) --device auto
# takes the GPU and gives the bf16 numbers. Skipped (77) where no NVIDIA GPU is visible or the
# build has no CUDA, as in CI. MOE_SCORE_TEST_DEVICE=cpu runs the same comparisons with the
# CPU on both sides (a check of this script on a machine without a GPU).
set -euo pipefail
dev=${MOE_SCORE_TEST_DEVICE:-cuda}
if [ "$dev" = cuda ]; then
    nvidia-smi -L >/dev/null 2>&1 || { echo "skip: no CUDA device (nvidia-smi -L failed)"; exit 77; }
    # awk reads to the end (no `grep -q` on a pipe): under pipefail an early reader's exit
    # would kill the writer with SIGPIPE
    moe-score --version | awk '/^CUDA: not built/ { n = 1 } END { exit n }' ||
        { echo "skip: this build has no CUDA (cmake -DMOE_CUDA=ON)"; exit 77; }
fi
# shellcheck disable=SC2034 # read by the sourced tiny_ckpt.sh
TINY_TRAIN_ARGS="model.num_attention_heads=2"
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "skip: no python3 with numpy"; exit 77; fi

zcat "$LAMBDA" | sed '1s/^>.*/>lambda/' > ref.fa
# its .fai as samtools faidx writes it (name, length, offset, bases and bytes per line), so
# that the GPU machine needs no samtools
"$PY" - <<'PY'
lines = open("ref.fa", "rb").read().split(b"\n")
body = [l for l in lines[1:] if l]
assert all(len(l) == len(body[0]) for l in body[:-1]), "ref.fa: lines of unequal length"
with open("ref.fa.fai", "w") as f:
    f.write("lambda\t%d\t%d\t%d\t%d\n" % (sum(map(len, body)), len(lines[0]) + 1,
                                           len(body[0]), len(body[0]) + 1))
PY
"$PY" - <<'PY'
seq = "".join(l.strip() for l in open("ref.fa") if not l.startswith(">"))
with open("seqs.fa", "w") as f:  # 30 .. 900 bases; the context is 256 tokens
    for i, n in enumerate((30, 77, 128, 255, 256, 300, 513, 900)):
        f.write(f">s{i}\n{seq[1000 * i + 7:1000 * i + 7 + n]}\n")
b = lambda p: seq[p - 1]  # 1-based
other = lambda c: "A" if c != "A" else "C"
recs = [(p, b(p), other(b(p))) for p in range(400, 3000, 300)]          # SNVs
recs += [(3200, seq[3199:3202], "".join(other(c) for c in seq[3199:3202])),  # MNV
         (3500, b(3500), b(3500) + "GATTACA"),                           # insertion
         (3800, seq[3799:3810], b(3800)),                                # deletion
         (4100, b(4100), ",".join(c for c in "ACGT" if c != b(4100)))]   # multi-allelic
with open("calls.vcf", "w") as f:
    f.write("##fileformat=VCFv4.2\n##contig=<ID=lambda,length=%d>\n" % len(seq))
    f.write("#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n")
    for i, (p, r, a) in enumerate(recs):
        f.write(f"lambda\t{p}\tv{i}\t{r}\t{a}\t.\t.\t.\n")
PY

for d in cpu "$dev"; do
    for p in fp32 bf16; do
        run=(-q -m "$CKPT" --device "$d" --precision "$p" --batch-tokens 2048)
        moe-score seq "${run[@]}" --context 64 seqs.fa > "seq.$d.$p.tsv"
        moe-score variants "${run[@]}" -f ref.fa --window 200 --tsv calls.vcf > "var.$d.$p.tsv"
    done
    moe-score seq -q -m "$CKPT" --device "$d" --precision fp32 --context 64 --per-position \
        -o "lp.$d.npy" seqs.fa
done
if [ "$dev" = cuda ]; then # --device auto: the GPU, bf16 (the table below the #@PG line)
    moe-score seq -q -m "$CKPT" --batch-tokens 2048 --context 64 seqs.fa > seq.auto.tsv
    cmp <(tail -n +2 seq.auto.tsv) <(tail -n +2 seq.cuda.bf16.tsv) ||
        { echo "FAIL: --device auto is not the GPU's bf16 run"; exit 1; }
fi

# cmp.py seq|seqtotal|lp|var A B TOL, cmp.py varbf16 A B TOL C: exit 1 when B is not A within
# TOL (varbf16: when bf16 B is further from fp32 A than 2x the CPU's bf16 C is, + TOL).
cat > cmp.py <<'PY'
import sys
import numpy as np
mode, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def table(path):  # the rows below the #@PG provenance line and the header
    lines = open(path).read().splitlines()
    assert lines[0].startswith("#@PG\tID:moe-score\t"), (path, lines[:1])
    rows = [l.split("\t") for l in lines[2:]]
    assert rows, f"{path}: no rows"
    return rows
if mode == "lp":  # per-position values: NaN at the same places, else within tol absolute
    x, y = np.load(a + ".npy"), np.load(b + ".npy")
    assert x.shape == y.shape and x.size > 0, (x.shape, y.shape)
    assert np.array_equal(np.isnan(x), np.isnan(y)), "NaN at different positions"
    worst = float(np.nanmax(np.abs(x - y)))
    print(f"{b}: {x.size} per-position values, max abs diff {worst:.2g} (tol {tol:g})")
    sys.exit(0 if worst <= tol else 1)
ra, rb = table(a), table(b)
assert len(ra) == len(rb), (a, len(ra), b, len(rb))
if mode.startswith("seq"):  # seq: each row within tol relative; seqtotal: the sum
    assert [r[0] for r in ra] == [r[0] for r in rb], "the sequences differ"
    la = np.array([float(r[2]) for r in ra])
    lb = np.array([float(r[2]) for r in rb])
    if mode == "seqtotal":
        worst, what = abs(lb.sum() - la.sum()) / abs(la.sum()), f"total {la.sum():.6f} nats"
    else:
        rel = np.abs(lb - la) / np.abs(la)
        worst, what = float(rel.max()), f"worst {ra[int(rel.argmax())][0]}"
    print(f"{b}: {len(ra)} sequences, relative diff {worst:.2g} ({what}; tol {tol:g})")
    sys.exit(0 if worst <= tol else 1)
# variants --tsv rows: chrom pos id ref alt llr
assert [r[:5] for r in ra] == [r[:5] for r in rb], "the ALT alleles differ"
assert [r[5] == "." for r in ra] == [r[5] == "." for r in rb], "different ALTs scored"
def llr_diff(x, y):  # the largest |LLR difference| over the scored ALTs, and its ALT
    d = [(abs(float(v[5]) - float(u[5])), u[2], u[4]) for u, v in zip(x, y) if u[5] != "."]
    assert d, f"{a}: no ALT scored"
    return max(d)
worst = llr_diff(ra, rb)
if mode == "varbf16":  # B is bf16, A fp32: B's error at most 2x the CPU bf16's (file 5) + tol
    rc = table(sys.argv[5])
    cpu, direct = llr_diff(ra, rc), llr_diff(rc, rb)
    print(f"{b}: {len(ra)} ALTs, max |LLR - fp32 LLR| {worst[0]:.2g} nats ({worst[1]} "
          f"{worst[2]}), the CPU's bf16 {cpu[0]:.2g} (bound 2x that + {tol:g}); "
          f"max |LLR - CPU bf16 LLR| {direct[0]:.2g} nats")
    sys.exit(0 if worst[0] <= 2 * cpu[0] + tol else 1)
assert mode == "var", mode
print(f"{b}: {len(ra)} ALTs, max |LLR diff| {worst[0]:.2g} nats ({worst[1]} {worst[2]}; tol {tol:g})")
sys.exit(0 if worst[0] <= tol else 1)
PY
status=0
check() { "$PY" cmp.py "$@" || { echo "FAIL: $2 vs $3 beyond $4 ($1)"; status=1; }; }
check seq seq.cpu.fp32.tsv "seq.$dev.fp32.tsv" 1e-5
check lp lp.cpu "lp.$dev" 1e-4
check seqtotal seq.cpu.bf16.tsv "seq.$dev.bf16.tsv" 1e-3
check var var.cpu.fp32.tsv "var.$dev.fp32.tsv" 1e-3
check varbf16 var.cpu.fp32.tsv "var.$dev.bf16.tsv" 1e-3 var.cpu.bf16.tsv
# the variants must have been scored (15 ALTs of 13 records), in both precisions
[ "$(awk -F'\t' 'NR > 2 && $6 != "."' "var.$dev.bf16.tsv" | wc -l)" = 15 ] ||
    { echo "FAIL: var.$dev.bf16.tsv should score 15 ALTs"; status=1; }
exit $status
