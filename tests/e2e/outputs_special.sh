#!/usr/bin/env bash
# e2e.outputs_special: an output that is a FIFO or a device is written in place (streamed),
# never replaced; a symlink is followed (its target is written, the link stays); a full
# device is exit 1 with a message. moe-tokenize (shard), moe-embed (.npy + .ids.tsv) and
# moe-train (--log-json, metrics.jsonl) all go through the one output helper. A tool killed
# by SIGTERM removes its temporary files.
# The machine's /dev/null and /dev/full are never named directly: the tests write through
# symlinks made here, so a regression replaces a link in this directory, not a device.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh" # trains ./run, sets LAMBDA and CKPT
[ -c /dev/full ] && [ -c /dev/null ] || fail "/dev/full or /dev/null is not a character device"

moe-tokenize -q "$LAMBDA" -o - > ref.mtok

# FIFO: written in place, streamed like -o - (same bytes); the FIFO is still a FIFO
mkfifo pipe.mtok
timeout 120 cat pipe.mtok > fromfifo.mtok &
reader=$!
moe-tokenize -q "$LAMBDA" -o pipe.mtok || { kill $reader; fail "moe-tokenize into a FIFO"; }
wait $reader || fail "the FIFO reader timed out: nothing was written into the FIFO"
[ -p pipe.mtok ] || fail "the FIFO was replaced"
cmp ref.mtok fromfifo.mtok || fail "bytes through the FIFO differ from -o -"
[ -z "$(ls -A | grep '\.tmp\.')" ] || fail "temporary files left: $(ls -A | grep '\.tmp\.')"

# symlink: the target gets the file, the link stays a link (also a dangling one)
mkdir -p target
: > target/a.mtok
ln -s target/a.mtok link.mtok
ln -s target/new.mtok dangling.mtok
moe-tokenize -q "$LAMBDA" -o link.mtok
moe-tokenize -q "$LAMBDA" -o dangling.mtok
[ -L link.mtok ] && [ -L dangling.mtok ] || fail "a symlink output was replaced"
moe-tokenize stats target/a.mtok > /dev/null || fail "the symlink's target is no shard"
moe-tokenize stats target/new.mtok > /dev/null || fail "the dangling symlink's target was not made"
moe-tokenize -q "$LAMBDA" -o regular.mtok
cmp regular.mtok target/a.mtok || fail "the symlink's target differs from a regular output"

# a full device (through a symlink to /dev/full): exit 1 naming the output
ln -s /dev/full full.mtok
expect 1 "full.mtok.*No space left on device" -- moe-tokenize -q "$LAMBDA" -o full.mtok
[ -L full.mtok ] && [ -c /dev/full ] || fail "/dev/full or its link was replaced"

# moe-embed: /dev/null through a link is written in place and gets no .ids.tsv beside it;
# a FIFO cannot take a .npy (its header is rewritten): exit 2 before any work
printf '>a\nACGTACGTACGTACGTAAAC\n>b\nGGGCCCAATTACGTTGCA\n' > seqs.fa
ln -s /dev/null null.npy
moe-embed -q -m "$CKPT" seqs.fa -o null.npy
[ -L null.npy ] && [ -c /dev/null ] || fail "moe-embed replaced the /dev/null link"
[ ! -e null.ids.tsv ] || fail "moe-embed wrote null.ids.tsv beside a device"
mkfifo pipe.npy
expect 2 "pipe.npy: a .npy needs a seekable output" -- moe-embed -q -m "$CKPT" seqs.fa -o pipe.npy
[ -p pipe.npy ] || fail "the .npy FIFO was replaced"
moe-embed -q -m "$CKPT" seqs.fa -o ref.npy
ln -s target/e.npy elink.npy
moe-embed -q -m "$CKPT" seqs.fa -o elink.npy
[ -L elink.npy ] && cmp ref.npy target/e.npy || fail "the .npy symlink was not followed"
ln -s /dev/full efull.npy
expect 1 "efull.npy.*No space left on device" -- moe-embed -q -m "$CKPT" seqs.fa -o efull.npy
[ -c /dev/full ] || fail "/dev/full was replaced"

# moe-train: --log-json into a FIFO and through a symlink; a full one names that file
train() { # train RUN --log-json FILE
  moe-train -q -c "$MOE_SRC_DIR/configs/tiny.yaml" --data run.mtok -o "$@" train.steps=2 \
    optim.warmup_steps=1 train.seq_len=128 train.global_batch_tokens=512 model.hidden_size=32 \
    model.intermediate_size=48 model.vocab_size=40 model.max_position_embeddings=256 \
    checkpoint.every=0 log.every=1 train.eval_every=0
}
mkfifo log.pipe
timeout 120 cat log.pipe > fromlog.jsonl &
reader=$!
train r1 --log-json log.pipe || { kill $reader; fail "moe-train into a FIFO"; }
wait $reader || fail "the FIFO reader timed out: nothing was written into the FIFO"
[ -p log.pipe ] || fail "the --log-json FIFO was replaced"
[ "$(wc -l < fromlog.jsonl)" -eq 2 ] || fail "--log-json FIFO: $(wc -l < fromlog.jsonl) lines, want 2"
cmp fromlog.jsonl r1/metrics.jsonl || fail "--log-json FIFO differs from metrics.jsonl"
ln -s /dev/full log.full
expect 1 "log.full: write failed: No space left on device" -- train r2 --log-json log.full
[ -c /dev/full ] && [ -L log.full ] || fail "/dev/full or its link was replaced"
# a moe-tokenize killed by SIGTERM (waiting on its FIFO input) leaves no temporary file
mkfifo sig.fa
moe-tokenize -q sig.fa -o sig.mtok 2> sig.err &
pid=$!
for _ in $(seq 200); do ls -A | grep -q '^\.sig\.mtok\.tmp\.' && break; sleep 0.05; done
ls -A | grep -q '^\.sig\.mtok\.tmp\.' || fail "no temporary file while moe-tokenize runs"
kill -TERM $pid
set +e; wait $pid; rc=$?; set -e
[ $rc -eq 143 ] || fail "SIGTERM: exit $rc, want 143 (ended by the signal)"
[ -z "$(ls -A | grep '^\.\?sig\.mtok')" ] || fail "SIGTERM left $(ls -A | grep 'sig\.mtok')"
echo "ok: FIFO, symlink, dangling symlink, device and full device outputs"
