#!/usr/bin/env bash
# e2e.run_lock: one run per directory. While moe-train runs in RUN, a second moe-train into
# RUN (fresh or --resume auto) is refused with exit 2 naming the holder's host and pid; the
# lock goes with its process (clean stop or kill -9), so the next run then proceeds. The same
# for two moe-tokenize runs into one shard directory.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
host=$(hostname)
fa=$MOE_SRC_DIR/data/lambda_virus.fa.gz # in the repository: no skip

rm -rf run shards in.fifo l.mtok
gzip -dc "$fa" | moe-tokenize -q -t nuc --window 128 -o l.mtok -
args=(-q -@ 1 -c "$MOE_SRC_DIR/configs/tiny.yaml" --data l.mtok train.steps=400 optim.warmup_steps=2
      train.seq_len=128 train.global_batch_tokens=1024 model.hidden_size=32
      model.intermediate_size=48 model.vocab_size=40 model.max_position_embeddings=256
      checkpoint.every=1 checkpoint.keep=2 train.eval_every=0 log.every=1)
# start_run: moe-train into ./run in the background, inside its loop; sets pid
start_run() {
  moe-train "${args[@]}" -o run "$@" 2> first.err &
  pid=$!
  for _ in $(seq 600); do
    [ "$(cat run/metrics.jsonl 2>/dev/null | wc -l)" -ge 2 ] && return 0
    sleep 0.05
  done
  fail "the first run did not start"
}
start_run
expect 2 "run: in use by moe-train on host $host, pid $pid" -- moe-train "${args[@]}" -o run --resume auto
expect 2 "run: in use by moe-train on host $host, pid $pid" -- moe-train "${args[@]}" -o run
kill -TERM $pid
wait $pid || fail "the first run did not stop cleanly"
moe-train "${args[@]}" -o run --resume auto --stop-at "$(( $(sed -n 's/ckpt-0*//p' run/latest) + 1 ))" ||
  fail "a run after the first ended was refused"
# kill -9 leaves the lock file but not the lock
start_run --resume auto
kill -9 $pid
wait $pid || true
moe-train "${args[@]}" -o run --resume auto --stop-at "$(( $(sed -n 's/ckpt-0*//p' run/latest) + 1 ))" ||
  fail "the lock outlived a killed run"
echo "ok: moe-train run directory lock"

# moe-tokenize into one directory: the first waits on a FIFO input while holding the lock
mkfifo in.fifo
moe-tokenize -q in.fifo -o shards/ 2> tok1.err &
tpid=$!
for _ in $(seq 200); do grep -q "$tpid" shards/.lock 2>/dev/null && break; sleep 0.05; done
expect 2 "shards: in use by moe-tokenize on host $host, pid $tpid" -- moe-tokenize -q "$fa" -o shards/
gzip -dc "$fa" > in.fifo
wait $tpid || { cat tok1.err; fail "the first moe-tokenize failed"; }
moe-tokenize stats shards/ > /dev/null || fail "the first moe-tokenize wrote no shards"
echo "ok: moe-tokenize output directory lock"
