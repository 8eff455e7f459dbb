#!/usr/bin/env bash
# e2e.train_signal: preemption. SIGTERM (and SIGINT, SIGUSR1, train.stop_signal) makes
# moe-train finish the step, write a checkpoint and exit 0 with a log line; --resume auto
# then ends with the same bytes as an uninterrupted run. A second SIGINT aborts at once;
# train.stop_signal=none leaves SIGUSR1's default. Under mpirun, a signal to one rank stops
# both at the same step (exit 0, one checkpoint).
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
src=${MOE_SRC_DIR:?}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fa=$src/data/lambda_virus.fa.gz
[ -f "$fa" ] || { echo "skip: lambda_virus.fa.gz not found"; exit 77; }

rm -rf full sig* mpi* l.mtok
gzip -dc "$fa" | moe-tokenize -q -t nuc --window 128 -o l.mtok -
args=(-@ 1 -c "$src/configs/tiny.yaml" --data l.mtok train.steps=40 optim.warmup_steps=2
      train.seq_len=128 train.global_batch_tokens=1024 train.micro_batch_tokens=512
      model.hidden_size=32 model.intermediate_size=48 model.vocab_size=40
      model.max_position_embeddings=256 checkpoint.every=0 checkpoint.keep=0 train.eval_every=0
      log.every=1)
# wait_steps RUN N: until RUN/metrics.jsonl has N lines (the run is inside its loop)
wait_steps() {
  for _ in $(seq 600); do
    [ "$(cat "$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "$1 did not reach step $2"
}
# signalled RUN SIGNAL [overrides...]: starts a run, sends SIGNAL after its 3rd step, sets rc
signalled() {
  local run=$1 sig=$2; shift 2
  moe-train "${args[@]}" -o "$run" "$@" 2> "$run.err" &
  local pid=$!
  wait_steps "$run" 3
  kill -s "$sig" $pid
  set +e; wait $pid; rc=$?; set -e
}

moe-train -q "${args[@]}" -o full
for sig in TERM INT USR1; do
  signalled sig$sig $sig
  [ $rc -eq 0 ] || { cat sig$sig.err; fail "SIG$sig: exit $rc, want 0"; }
  grep -Eq "stopped after step [0-9]+ of 40 with a checkpoint in sig$sig; continue with --resume auto" \
    sig$sig.err || { cat sig$sig.err; fail "SIG$sig: no stop line"; }
  at=$(sed -n 's/.*stopped after step \([0-9]*\) of.*/\1/p' sig$sig.err)
  [ "$(cat sig$sig/latest)" = "$(printf 'ckpt-%08d' "$at")" ] || fail "SIG$sig: latest is not step $at"
  [ "$at" -lt 40 ] || fail "SIG$sig: the run was not stopped early (step $at)"
  moe-train -q "${args[@]}" -o sig$sig --resume auto
  for f in model.safetensors optimizer-rank0.safetensors; do
    cmp full/ckpt-00000040/$f sig$sig/ckpt-00000040/$f || fail "SIG$sig: $f differs after resume"
  done
  diff <(cut -d, -f1-3 full/metrics.jsonl) <(cut -d, -f1-3 sig$sig/metrics.jsonl) ||
    fail "SIG$sig: per-step losses differ after resume"
done
echo "ok: SIGTERM, SIGINT, SIGUSR1 stop with a checkpoint; resume gives the same bytes"

# a configured signal; none: SIGUSR1 keeps its default action (the process ends by it)
signalled sigUSR2 USR2 train.stop_signal=usr2
[ $rc -eq 0 ] && grep -q "stopped after step" sigUSR2.err || fail "train.stop_signal=usr2: exit $rc"
signalled signone USR1 train.stop_signal=none
[ $rc -eq $((128 + 10)) ] || fail "train.stop_signal=none: SIGUSR1 gave exit $rc, want 138"

# a second SIGINT while the stop is pending aborts at once (exit by SIGINT, no new checkpoint):
# slow steps so that the step is still running when the second one comes
moe-train "${args[@]}" -o sigint2 train.global_batch_tokens=65536 train.micro_batch_tokens=512 \
  train.steps=4 2> sigint2.err &
pid=$!
for _ in $(seq 600); do grep -q "step 1/4" sigint2.err 2>/dev/null && break; sleep 0.05; done
kill -INT $pid
for _ in $(seq 100); do grep -q "stop requested" sigint2.err && break; sleep 0.02; done
kill -INT $pid
set +e; wait $pid; rc=$?; set -e
[ $rc -eq 130 ] || { cat sigint2.err; fail "a second SIGINT: exit $rc, want 130"; }
[ ! -e sigint2/latest ] || fail "a second SIGINT still wrote a checkpoint"
echo "ok: train.stop_signal, a second SIGINT aborts"

# MPI: a signal to one rank stops both at the same step
if command -v mpirun >/dev/null && moe-train --version | grep -q "^MPI: yes"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  mpi2() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 mpirun -np 2 "$@"; }
  mpi2 moe-train -q "${args[@]}" -o mpifull parallel.dp=2
  mpi2 moe-train "${args[@]}" -o mpisig parallel.dp=2 2> mpisig.err &
  mpipid=$!
  wait_steps mpisig 3
  # one rank (a descendant of this mpirun, not mpirun itself): the other must follow
  rank=""
  kids=$mpipid
  for _ in 1 2 3 4; do
    kids=$(for k in $kids; do pgrep -P "$k" || true; done)
    for k in $kids; do
      [ "$(cat /proc/$k/comm 2>/dev/null)" = moe-train ] && { rank=$k; break 2; }
    done
  done
  [ -n "$rank" ] || fail "no moe-train rank under mpirun"
  kill -USR1 "$rank"
  set +e; wait $mpipid; rc=$?; set -e
  [ $rc -eq 0 ] || { cat mpisig.err; fail "mpirun with one signalled rank: exit $rc"; }
  grep -Eq "stopped after step [0-9]+ of 40" mpisig.err || { cat mpisig.err; fail "mpi: no stop line"; }
  mpi2 moe-train -q "${args[@]}" -o mpisig parallel.dp=2 --resume auto
  cmp mpifull/ckpt-00000040/model.safetensors mpisig/ckpt-00000040/model.safetensors ||
    fail "mpi: weights differ after the signalled stop and resume"
  echo "ok: under mpirun one signalled rank stops both at step $(cat mpisig/latest)"
else
  echo "note: no mpirun or no MPI build: the two-rank case is not run"
fi
