#!/usr/bin/env bash
# e2e.train_ep: expert parallelism over MPI on the CPU (moe/comm.h, model_ep.c). With the same
# global batch and seed over 10 fp32 steps, (a) `mpirun -np 2 ... parallel.ep=2` and (b)
# `mpirun -np 4 ... parallel.dp=2 parallel.ep=2` compute the same function as one process:
# per-step losses within 1e-6 relative (measured 5e-9), the global per-expert load equal,
# weights within 5e-5 of each tensor's largest value (measured 1.1e-5, as dp=2 alone: AdamW
# amplifies the last bits of tiny gradients) and the AdamW moments within 1e-4 (measured
# 3e-6); the ep=2 checkpoint is the expert-parallel layout; metrics.jsonl reports rank 0's
# time in collectives and in the expert all-to-alls with their bandwidth (none for one process). (e) An ep=2 run stopped at step 5
# and resumed at ep=2 ends with the same bytes; resumed at ep=1 (one process) and at ep=4,
# directly and after moe-convert reshard --ep 4, its next losses equal the uninterrupted
# run's. (c) torchrun-style variables for CPU ranks are refused (exit 2, mpirun/srun hint),
# and so are half a torchrun set, a MASTER_PORT that is not a port, torchrun variables that
# contradict MPI's ranks, and expert parallelism on the GPU backend, launched by mpirun or by
# torchrun-style variables (GPU ranks train data-parallel over NCCL; ep > 1 stays on the CPU).
# (d) One of 2 ranks killed mid-run ends the run with an error; one stopped (SIGSTOP: a hang)
# makes the other end the job within parallel.timeout_s with a message naming it. (f) With
# the experts' gradients in bf16 (optim.expert_grads, one replica of each expert), ep=2
# follows one process within 1e-3 relative (each rank rounds its own micro-steps' sums). (g)
# With split masters (optim.master split, bf16) likewise.
set -euo pipefail
src=${MOE_SRC_DIR:?}
source "$src/tests/interop/mpi_env.sh"
mpi() { local np=$1; shift; ASAN_OPTIONS="$mpi_asan" timeout 300 mpirun -np "$np" "$@"; }

rm -rf one ep2 d2e2 s2 same r1 r4 rs4 bad kill hang one16 ep216 ones ep2s ./*.mtok
gzip -dc "$fa" | moe-tokenize -q -t nuc --window 64 --val-fraction 0.1 -o l.mtok -
# 4 micro-batches of 1 sequence per step: one process runs all four, ep=2 ranks two each
args=(-q -@ 1 -c "$src/configs/tiny.yaml" --data l.mtok train.steps=10 optim.warmup_steps=1
      train.seq_len=64 train.global_batch_tokens=256 train.micro_batch_tokens=64
      model.hidden_size=32 model.intermediate_size=48 model.vocab_size=40
      model.max_position_embeddings=128 checkpoint.every=5 checkpoint.keep=0 train.eval_every=5)
moe-train "${args[@]}" -o one
mpi 2 moe-train "${args[@]}" -o ep2 parallel.ep=2 2> ep2.err || { cat ep2.err; fail "ep=2"; }
mpi 4 moe-train "${args[@]}" -o d2e2 parallel.dp=2 parallel.ep=2 2> d2e2.err ||
    { cat d2e2.err; fail "dp=2 x ep=2"; }
for f in model.safetensors.index.json model-ep00000-of-00002.safetensors \
         model-ep00001-of-00002.safetensors optimizer-rank0.safetensors optimizer-rank1.safetensors; do
    [ -f ep2/ckpt-00000010/$f ] || fail "the ep=2 checkpoint has no $f: $(ls ep2/ckpt-00000010)"
done

# (e) resume: same layout (bytes), ep=1 and ep=4 directly, ep=4 after moe-convert reshard
mpi 2 moe-train "${args[@]}" -o s2 parallel.ep=2 --stop-at 5
cp -r s2 same && cp -r s2 r1 && cp -r s2 r4
mpi 2 moe-train "${args[@]}" -o same parallel.ep=2 --resume auto
for f in model-ep00000-of-00002.safetensors model-ep00001-of-00002.safetensors \
         optimizer-rank0.safetensors optimizer-rank1.safetensors; do
    cmp ep2/ckpt-00000010/$f same/ckpt-00000010/$f || fail "ep=2 resume: $f differs"
done
moe-train "${args[@]}" -o r1 --resume auto
mpi 4 moe-train "${args[@]}" -o r4 parallel.ep=4 --resume auto
mkdir rs4 && moe-convert reshard -q --ep 4 s2/ckpt-00000005 rs4/ckpt-00000005
mpi 4 moe-train "${args[@]}" -o rs4 parallel.ep=4 --resume auto

"$PY" - <<'PY'
import glob, json, os, sys, numpy as np
sys.path.insert(0, os.path.join(os.environ["MOE_SRC_DIR"], "tests", "interop"))
from st_tool import read
def metrics(d):
    return {m["step"]: m for m in map(json.loads, open(f"{d}/metrics.jsonl"))}
def tensors(pattern):
    out = {}
    for p in sorted(glob.glob(pattern)):
        out.update({k: np.frombuffer(b, np.float32) for k, (_, _, b) in read(p)[0].items()})
    return out
def rel(a, b):
    return abs(a - b) / abs(a)
one = metrics("one")
w1 = tensors("one/ckpt-00000010/model.safetensors")
o1 = tensors("one/ckpt-00000010/optimizer-rank0.safetensors")
assert all("comm_s" not in one[s] for s in one) # one process: no collectives to report
for d in ("ep2", "d2e2"):
    m = metrics(d)
    assert sorted(m) == list(range(1, 11)), (d, sorted(m))
    for s in m: # rank 0's collectives of the step, of which the expert all-to-alls
        c, a, bw = m[s]["comm_s"], m[s]["alltoall_s"], m[s]["alltoall_GBps"]
        assert c > 0 and 0 < a <= c and bw > 0, (d, s, c, a, bw)
    worst = max(rel(one[s]["loss"], m[s]["loss"]) for s in m)
    assert worst < 1e-6, (d, worst)
    for s in m:
        assert m[s]["expert_load_max_over_mean"] == one[s]["expert_load_max_over_mean"], (d, s)
        assert ("val_loss" in m[s]) == ("val_loss" in one[s]), (d, s)
        if "val_loss" in m[s]:
            assert rel(one[s]["val_loss"], m[s]["val_loss"]) < 1e-6, (d, s)
    w = tensors(f"{d}/ckpt-00000010/model-ep*.safetensors")
    o = tensors(f"{d}/ckpt-00000010/optimizer-rank*.safetensors")
    assert w.keys() == w1.keys() and o.keys() == o1.keys(), d
    ww = max(float(np.abs(w1[k] - w[k]).max() / np.abs(w1[k]).max()) for k in w1)
    wo = max(float(np.abs(o1[k] - o[k]).max() / max(np.abs(o1[k]).max(), 1e-30)) for k in o1)
    assert ww < 5e-5 and wo < 1e-4, (d, ww, wo)
    print(f"{d} vs one process: losses within {worst:.1e}, weights {ww:.1e}, moments {wo:.1e}")
ep2 = metrics("ep2")
for d in ("r1", "r4", "rs4"):
    m = metrics(d)
    assert sorted(m) == list(range(1, 11)) or sorted(m) == list(range(6, 11)), (d, sorted(m))
    worst = max(rel(ep2[s]["loss"], m[s]["loss"]) for s in range(6, 11))
    assert worst < 1e-6, (d, worst)
    print(f"ep=2 checkpoint resumed as {d}: next losses within {worst:.1e} of the ep=2 run")
PY

# (f) bf16 expert gradients under expert parallelism
moe-train "${args[@]}" -o one16 optim.expert_grads=bf16
mpi 2 moe-train "${args[@]}" -o ep216 parallel.ep=2 optim.expert_grads=bf16 2> ep216.err ||
    { cat ep216.err; fail "ep=2 optim.expert_grads=bf16"; }
"$PY" - <<'PY'
import json
def losses(d):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{d}/metrics.jsonl"))}
a, b, f = losses("one16"), losses("ep216"), losses("one")
assert sorted(a) == sorted(b) == list(range(1, 11)), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
assert worst < 1e-3, worst
assert a != f, "bf16 expert gradients gave fp32's losses"
print(f"bf16 expert gradients: ep=2 within {worst:.1e} of one process")
PY

# (g) split masters (optim.master split, bf16) under expert parallelism: each rank holds its
# experts' halves and the dense part's fp32 masters and halves, gathered over all ranks
moe-train "${args[@]}" -o ones precision.recipe=bf16 optim.master=split
mpi 2 moe-train "${args[@]}" -o ep2s parallel.ep=2 precision.recipe=bf16 optim.master=split \
    2> ep2s.err || { cat ep2s.err; fail "ep=2 optim.master=split"; }
"$PY" - <<'PY'
import json
def losses(d):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{d}/metrics.jsonl"))}
a, b = losses("ones"), losses("ep2s")
assert sorted(a) == sorted(b) == list(range(1, 11)), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
assert worst < 1e-3, worst
print(f"split masters: ep=2 within {worst:.1e} of one process")
PY

# (c) torchrun-style variables for CPU ranks
rc=0
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
    moe-train "${args[@]}" -o bad parallel.ep=2 2> bad.err || rc=$?
[ "$rc" = 2 ] || { cat bad.err; fail "torchrun-style launch: exit $rc, expected 2"; }
grep -q "mpirun -np 2" bad.err && grep -q "srun --mpi=pmix" bad.err ||
    { cat bad.err; fail "no mpirun/srun hint"; }
[ ! -e bad ] || fail "a refused launch made its run directory"
# expert parallelism on the GPU backend: refused (data parallelism only over NCCL); on a node
# with one GPU, rank 1's local rank has no GPU of its own, which is an error of its own
rc=0
mpi 2 moe-train "${args[@]}" -o bad parallel.ep=2 device=cuda 2> bad.err || rc=$?
[ "$rc" = 2 ] && grep -Eq "expert parallelism runs on the CPU backend|this process sees 1 GPU " bad.err ||
    { cat bad.err; fail "parallel.ep=2 device=cuda: exit $rc"; }
# ... and so are torchrun-style GPU ranks, each on the GPU of its LOCAL_RANK
rc=0
RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
    moe-train "${args[@]}" -o bad parallel.ep=2 device=cuda 2> bad.err || rc=$?
[ "$rc" = 2 ] && grep -q "expert parallelism runs on the CPU backend" bad.err &&
    grep -q "this rank: cuda:0" bad.err && grep -q "set parallel.ep=1 parallel.dp=2" bad.err ||
    { cat bad.err; fail "torchrun-style device=cuda: exit $rc"; }
# inconsistent environments: half a torchrun set; torchrun variables that contradict MPI
rc=0
WORLD_SIZE=2 moe-train "${args[@]}" -o bad 2> bad.err || rc=$?
[ "$rc" = 2 ] && grep -q "inconsistent torchrun-style environment" bad.err ||
    { cat bad.err; fail "WORLD_SIZE without RANK: exit $rc"; }
rc=0
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=99999 \
    moe-train "${args[@]}" -o bad parallel.ep=2 2> bad.err || rc=$?
[ "$rc" = 2 ] && grep -q "MASTER_PORT='99999' is not a TCP port" bad.err ||
    { cat bad.err; fail "MASTER_PORT=99999: exit $rc"; }
rc=0
RANK=3 WORLD_SIZE=2 mpi 2 moe-train "${args[@]}" -o bad parallel.ep=2 2> bad.err || rc=$?
[ "$rc" = 2 ] && grep -q "contradict MPI's rank" bad.err ||
    { cat bad.err; fail "RANK=3 under mpirun -np 2: exit $rc"; }

# (d) a rank that dies, a rank that hangs: the run ends with an error within the timeout
long=("${args[@]}" parallel.ep=2 train.steps=100000 optim.warmup_steps=10 checkpoint.every=0
      train.eval_every=0 parallel.timeout_s=5)
# start_rank1 DIR: starts the long run in the background, sets rank1 to rank 1's pid; until
# the run is waited for, leaving the script (a failed check) ends it, so that a failure does
# not leave two ranks training for 100,000 steps
start_rank1() {
    ASAN_OPTIONS="$mpi_asan" mpirun -np 2 moe-train "${long[@]}" -o "$1" > "$1.out" 2> "$1.err" &
    mpid=$! rank1=
    trap 'if [ -n "$rank1" ]; then kill -CONT "$rank1" 2> /dev/null || true; fi
          kill "$mpid" 2> /dev/null || true' EXIT
    for _ in $(seq 200); do [ -s "$1/metrics.jsonl" ] && break; sleep 0.1; done
    [ -s "$1/metrics.jsonl" ] || { cat "$1.err"; fail "$1: the run did not start"; }
    # grep reads the environment itself: `tr | grep -q` under pipefail failed when grep
    # stopped at the match and tr died writing the rest (SIGPIPE; seen under load, 2026-12-05)
    for p in $(pgrep -P "$mpid" -x moe-train); do
        grep -qxz OMPI_COMM_WORLD_RANK=1 /proc/"$p"/environ && rank1=$p
    done
    [ -n "$rank1" ] || fail "$1: rank 1 not found"
}
# ends DIR SIGNAL: signals rank 1; mpirun must end non-zero within 5 s + 20 s of slack
ends() {
    start_rank1 "$1"
    local t0 rc=0
    t0=$(date +%s)
    kill -"$2" "$rank1"
    wait "$mpid" || rc=$?
    trap - EXIT
    local took=$(($(date +%s) - t0))
    [ "$rc" != 0 ] || fail "$1: the run exited 0 after rank 1 got SIG$2"
    [ "$took" -le 25 ] || fail "$1: the run took $took s to end after SIG$2"
    echo "SIG$2 to rank 1: the run ended with exit $rc after $took s"
}
ends kill KILL
grep -q "rank 1" kill.err || { cat kill.err; fail "no message about the dead rank"; }
ends hang STOP
grep -q "did not complete within parallel.timeout_s=5 s" hang.err ||
    { cat hang.err; fail "no timeout message"; }
echo "train_ep: ok"
