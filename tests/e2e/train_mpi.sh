#!/usr/bin/env bash
# e2e.train_mpi: data parallelism over MPI on the CPU (moe/comm.h). `mpirun -np 2 moe-train
# ... parallel.dp=2` computes the same function as one process accumulating the same two
# micro-batches per step: the same per-step losses (within 1e-6 relative in metrics.jsonl),
# weights within 1e-5 and the AdamW moments (sharded over the ranks, ZeRO-1, and gathered
# into the checkpoint) within 1e-4 relative after 6 steps; two dp=2 runs
# give the same bytes; a dp=2 run stopped with --stop-at and resumed under mpirun ends with
# the same bytes as an uninterrupted one; only rank 0 writes the run directory; under bf16
# and fp8-block, whose weight copies are refreshed after the all-gather, the same losses as
# one process within 1e-3 relative; with bf16 AdamW moments (sharded and gathered as 2-byte
# values) likewise, and a dp=2 run of them resumes to the same bytes; with bf16 expert
# gradients (optim.expert_grads, reduce-scattered as bf16 sums) likewise; with split masters
# (optim.master split, their fp32 part and both halves all-gathered) likewise, and a dp=2
# run of them repeats and resumes to the same bytes. Bad launches
# (dp=2 in one process, 2 processes with dp=1, a micro-batch count dp does not divide) are
# refused with exit 2 and a hint.
set -euo pipefail
src=${MOE_SRC_DIR:?}
source "$src/tests/interop/mpi_env.sh"
mpi2() { ASAN_OPTIONS="$mpi_asan" timeout 300 mpirun -np 2 "$@"; }

rm -rf one dp2 dp2b split bad1 bad2 bad3 l.mtok l.val.mtok one-m16 dp2-m16 split-m16 one-g16 dp2-g16 \
    one-s16 dp2-s16 dp2b-s16 split-s16
gzip -dc "$fa" | moe-tokenize -q -t nuc --window 128 --val-fraction 0.1 -o l.mtok -
args=(-q -@ 1 -c "$src/configs/tiny.yaml" --data l.mtok train.steps=6 optim.warmup_steps=1
      train.seq_len=128 train.global_batch_tokens=512 train.micro_batch_tokens=256
      model.hidden_size=32 model.intermediate_size=48 model.vocab_size=40
      model.max_position_embeddings=256 checkpoint.every=2 checkpoint.keep=0 train.eval_every=3)
moe-train "${args[@]}" -o one
mpi2 moe-train "${args[@]}" -o dp2 parallel.dp=2 2> dp2.err ||
    { cat dp2.err; fail "mpirun -np 2 moe-train parallel.dp=2 failed"; }
mpi2 moe-train "${args[@]}" -o dp2b parallel.dp=2
cmp dp2/ckpt-00000006/model.safetensors dp2b/ckpt-00000006/model.safetensors ||
    fail "two dp=2 runs differ"
mpi2 moe-train "${args[@]}" -o split parallel.dp=2 --stop-at 4
mpi2 moe-train "${args[@]}" -o split parallel.dp=2 --resume auto
for f in model.safetensors optimizer-rank0.safetensors; do
    cmp dp2/ckpt-00000006/$f split/ckpt-00000006/$f || fail "dp=2 resume: $f differs"
done
[ "$(ls dp2)" = "$(ls one)" ] || fail "the dp=2 run directory holds other files: $(ls dp2)"

"$PY" - <<'PY'
import json, os, sys, numpy as np
def metrics(d):
    return [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
a, b = metrics("one"), metrics("dp2")
assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 7)), "steps"
for x, y in zip(a, b):
    for k in ("loss", "ce_loss", "aux_loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= 1e-6 * abs(x[k]), (x["step"], k, x[k], y[k])
    assert x["tokens"] == y["tokens"] and x["expert_load_max_over_mean"] == y["expert_load_max_over_mean"]
    assert ("val_loss" in x) == ("val_loss" in y)
sys.path.insert(0, os.path.join(os.environ["MOE_SRC_DIR"], "tests", "interop"))
from st_tool import read
def tensors(p):
    return {k: np.frombuffer(b, np.float32) for k, (_, _, b) in read(p)[0].items()}
w1, w2 = tensors("one/ckpt-00000006/model.safetensors"), tensors("dp2/ckpt-00000006/model.safetensors")
assert w1.keys() == w2.keys()
worst = max(float(np.abs(w1[k] - w2[k]).max() / np.abs(w1[k]).max()) for k in w1)
assert worst < 1e-5, worst
# the AdamW state, sharded over the ranks (ZeRO-1) and gathered by rank 0 for the checkpoint
o1 = tensors("one/ckpt-00000006/optimizer-rank0.safetensors")
o2 = tensors("dp2/ckpt-00000006/optimizer-rank0.safetensors")
assert o1.keys() == o2.keys() and len(o1) == 2 * len(w1)
worst_o = max(float(np.abs(o1[k] - o2[k]).max() / max(np.abs(o1[k]).max(), 1e-30)) for k in o1)
assert worst_o < 1e-4, worst_o
print(f"dp=2 vs one process: losses equal within 1e-6, weights within {worst:.2e} relative, "
      f"AdamW moments within {worst_o:.2e}")
PY

# bf16 and fp8-block keep weight copies that the matrix products read: with two ranks each
# rank updates its slices of the masters and the copies are refreshed from the all-gathered
# masters before the next forward (AdamW writes none of them there). The same losses as one
# process, to rounding: the ranks add the gradients in another order, which can move a copy
# across a rounding boundary (bf16, e4m3).
for r in bf16 fp8-block; do
    rm -rf "one-$r" "dp2-$r"
    moe-train "${args[@]}" -o "one-$r" precision.recipe=$r checkpoint.every=0
    mpi2 moe-train "${args[@]}" -o "dp2-$r" precision.recipe=$r checkpoint.every=0 parallel.dp=2
    "$PY" - "one-$r" "dp2-$r" "$r" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:3])
assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 7)), "steps"
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print(f"{sys.argv[3]}: dp=2 vs one process, losses within {worst:.2e} relative")
assert worst < 1e-3, worst
PY
done

# dp2_resumes X WHAT CHECK OVERRIDES...: one process into one-X, dp=2 into dp2-X, and dp=2
# stopped at step 4 and resumed into split-X, which ends with dp2-X's bytes; dp2-X's losses
# are one process's to rounding (the gradient sums' order, as above), and CHECK looks into
# its checkpoint: "moments" (every gathered moment a bf16 value) or "masters" (the gathered
# masters keep low bits: not bf16 values).
dp2_resumes() {
    local x=$1 what=$2 check=$3
    shift 3
    moe-train "${args[@]}" "$@" -o "one-$x"
    mpi2 moe-train "${args[@]}" "$@" -o "dp2-$x" parallel.dp=2 2> "dp2-$x.err" ||
        { cat "dp2-$x.err"; fail "$what: mpirun -np 2 moe-train failed"; }
    mpi2 moe-train "${args[@]}" "$@" -o "split-$x" parallel.dp=2 --stop-at 4
    mpi2 moe-train "${args[@]}" "$@" -o "split-$x" parallel.dp=2 --resume auto
    for f in model.safetensors optimizer-rank0.safetensors; do
        cmp "dp2-$x/ckpt-00000006/$f" "split-$x/ckpt-00000006/$f" || fail "$what, dp=2 resume: $f differs"
    done
    "$PY" - "one-$x" "dp2-$x" "$what" "$check" <<'PY'
import json, os, sys, numpy as np
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:3])
what, check = sys.argv[3:5]
assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 7)), "steps"
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
sys.path.insert(0, os.path.join(os.environ["MOE_SRC_DIR"], "tests", "interop"))
from st_tool import read
f = "optimizer-rank0" if check == "moments" else "model"
t = read(f"{sys.argv[2]}/ckpt-00000006/{f}.safetensors")[0]
w = np.concatenate([np.frombuffer(b, np.uint32) for _, _, b in t.values()])
low = int(((w & 0xffff) != 0).sum())
print(f"{what}: dp=2 vs one process, losses within {worst:.2e} relative; {low} of {w.size} "
      f"gathered {check} with low bits")
assert worst < 1e-3, worst
assert low == 0 if check == "moments" else low > w.size // 2, f"gathered {check}: {low} with low bits"
PY
}

# bf16 AdamW moments: each rank keeps its ZeRO-1 slices as bf16, the checkpoint gathers them
# as 2-byte values, which are bf16 values.
dp2_resumes m16 "bf16 moments" moments optim.moments=bf16 checkpoint.every=4

# bf16 expert gradients: the dp ranks' sums are reduce-scattered as bf16 (each addition in
# fp32, rounded): one process's losses to rounding, and not fp32 gradients' losses
g16=(optim.expert_grads=bf16 checkpoint.every=0)
moe-train "${args[@]}" "${g16[@]}" -o one-g16
mpi2 moe-train "${args[@]}" "${g16[@]}" -o dp2-g16 parallel.dp=2
"$PY" - one-g16 dp2-g16 one <<'PY'
import json, sys
a, b, f = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:4])
assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 7)), "steps"
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print(f"bf16 expert gradients: dp=2 vs one process, losses within {worst:.2e} relative")
assert worst < 1e-3, worst
assert [x["loss"] for x in a] != [x["loss"] for x in f], "bf16 expert gradients gave fp32's losses"
PY

# split masters (optim.master split, bf16): each rank updates its slices of the masters, the
# fp32 ones that stay (norms, embeddings, router gates, packed) and the split ones' two halves,
# and the all-gathers move each part; the gathered masters keep their low bits, and two dp=2
# runs give the same bytes.
dp2_resumes s16 "split masters" masters precision.recipe=bf16 optim.master=split checkpoint.every=4
mpi2 moe-train "${args[@]}" precision.recipe=bf16 optim.master=split checkpoint.every=4 \
    -o dp2b-s16 parallel.dp=2
for f in model.safetensors optimizer-rank0.safetensors; do
    cmp dp2-s16/ckpt-00000006/$f dp2b-s16/ckpt-00000006/$f || fail "split masters: two dp=2 runs: $f differs"
done

# bad launches
expect2() { # expect2 PATTERN CMD... : exit 2 and PATTERN in stderr
    local pat=$1 rc=0; shift
    "$@" > bad.out 2> bad.err || rc=$?
    [ "$rc" = 2 ] || { cat bad.err; fail "expected exit 2, got $rc: $*"; }
    grep -q -- "$pat" bad.err || { cat bad.err; fail "no '$pat' in the message: $*"; }
}
expect2 "mpirun -np 2" moe-train "${args[@]}" -o bad1 parallel.dp=2
expect2 "set parallel.dp=2" mpi2 moe-train "${args[@]}" -o bad2
expect2 "not a multiple of the 2 ranks" mpi2 moe-train "${args[@]}" -o bad3 parallel.dp=2 train.micro_batch_tokens=512
echo "train_mpi: ok"
