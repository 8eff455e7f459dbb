# tiny_ckpt.sh: sourced by tests/e2e/embed_*.sh and convert_*.sh - trains the smallest
# useful checkpoint (2 layers, hidden 32, 4 experts, nuc tokenizer, 2 steps) on the lambda
# phage genome into ./run and sets CKPT to its checkpoint directory. Also sets PY to a
# python3 that has numpy (Debian's python3-numpy), or to "" when there is none.
# TINY_TRAIN_ARGS: more key=value overrides for moe-train (e.g. a GPU-friendly head count).
# The one thing to know: this is a sourced fragment, not a test (tests/e2e/*.sh are tests),
# and it changes into ./work (emptied first).
set -euo pipefail
# a fresh work directory inside the test's scratch directory, so that the test can run
# again (the last run's files stay for debugging until then)
rm -rf work && mkdir work && cd work
LAMBDA=""
for f in "${MOE_SRC_DIR:-.}/data/lambda_virus.fa.gz" \
         /usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz; do
    if [ -f "$f" ]; then LAMBDA=$f; break; fi
done
if [ -z "$LAMBDA" ]; then echo "SKIP: lambda_virus.fa.gz not found (data/ or bowtie2-examples)"; exit 77; fi
INTEROP="${MOE_SRC_DIR:-.}/tests/interop"
tiny_train() { # tiny_train RUN_DIR TOKENIZER_ARGS...
    local run=$1; shift
    moe-tokenize -q "$LAMBDA" "$@" --window 128 -o "$run.mtok"
    local vocab
    vocab=$(moe-tokenize stats --json "$run.mtok" | sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' | awk 'NR == 1')
    moe-train -q -c "${MOE_SRC_DIR:-.}/configs/tiny.yaml" --data "$run.mtok" -o "$run" \
        train.steps=2 optim.warmup_steps=1 train.seq_len=128 train.global_batch_tokens=512 \
        model.hidden_size=32 model.intermediate_size=48 model.vocab_size="$vocab" \
        model.max_position_embeddings=256 checkpoint.every=0 log.every=1 train.eval_every=0 \
        ${TINY_TRAIN_ARGS:-} >/dev/null
}
tiny_train run -t nuc
CKPT=$(ls -d run/ckpt-* | tail -1)
PY=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
