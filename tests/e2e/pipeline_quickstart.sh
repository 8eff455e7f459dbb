#!/usr/bin/env bash
# pipeline_quickstart.sh: smoke test of pipelines/quickstart.sh (what `make demo` runs) with a
# short training (10 steps of 512 tokens) on a 6 kb piece of lambda: the summary's
# numbers must agree with the input (train/validation token counts from the 90/10 split,
# one embedding row per started kilobase, hidden size of the config), every printed command
# must be there and the printed training command must work when pasted; a second run must
# reuse the finished training and print the same summary, other settings must retrain, and
# --fresh must redo it all with the same result.
# The one thing to know: the expected numbers are derived from the input, not pasted in, so
# the test holds for any single- or multi-record FASTA given as MOE_DEMO_INPUT.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
# ctest runs tests side by side on few cores: OpenMP threads that spin while waiting slow
# every job down several-fold there, sleeping ones do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
lambda=$src/data/lambda_virus.fa.gz
[ -r "$lambda" ] || lambda=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -r "$lambda" ] || { echo "SKIP: no lambda genome (data/ or bowtie2-examples)"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# The first 6 kb of lambda keep the runs (each embeds the whole input) quick, also under ASan.
gzip -dc "$lambda" | awk 'NR == 1 { print; next } { s = s $0 } END { print substr(s, 1, 6000) }' |
    gzip >excerpt.fa.gz
export MOE_DEMO_DIR=$PWD/demo MOE_DEMO_INPUT=$PWD/excerpt.fa.gz MOE_DEMO_DEVICE=cpu
export MOE_DEMO_TRAIN_ARGS="train.steps=10 optim.warmup_steps=2 train.eval_every=5 train.global_batch_tokens=512"
rm -rf "$MOE_DEMO_DIR"
start=$SECONDS
"$src/pipelines/quickstart.sh" >out1.txt 2>err1.txt || { tail -n 30 err1.txt; fail "first run"; }
echo "first run: $((SECONDS - start)) s"
cat out1.txt

# Expected values from the input itself.
read -r train_tok val_tok rows < <(gzip -dc "$MOE_DEMO_INPUT" | awk '
    /^>/ { if (n) { c = int(n * 0.9); t += c + 1; v += n - c + 1; r += int((n + 999) / 1000) } n = 0; next }
    { n += length($0) }
    END { c = int(n * 0.9); t += c + 1; v += n - c + 1; r += int((n + 999) / 1000); print t, v, r }')
hidden=$(sed -n 's/^ *hidden_size: *\([0-9]*\).*/\1/p' "$src/configs/tiny.yaml")
grep -q "^tokens  *$train_tok train + $val_tok validation" out1.txt || fail "token counts (want $train_tok + $val_tok)"
grep -q "^embeddings  *($rows, $hidden)" out1.txt || fail "embedding shape (want ($rows, $hidden))"
grep -Eq '^loss  *[0-9.]+ at step 1 -> [0-9.]+ at step 10$' out1.txt || fail "loss line"
grep -Eq '^validation  *[0-9]+\.[0-9]+ bits per base' out1.txt || fail "validation bits per base"
grep -Eq '^model  *tiny.yaml: [0-9]+ parameters \([0-9]+ active per token\), cpu, fp32$' out1.txt || fail "parameter count"
for cmd in 'gzip -dcf' 'awk -v' 'moe-tokenize ' 'moe-train -c' 'moe-embed -m'; do
    grep -q "^\$ $cmd" err1.txt || fail "the command '$cmd...' was not printed"
done
for f in run/loss.svg run/metrics.jsonl embeddings.npy embeddings.ids.tsv tokens/train.mtok \
    tokens/train.val.mtok; do
    [ -s "$MOE_DEMO_DIR/$f" ] || fail "missing $f"
done

# The printed training command, pasted back into a shell, is what ran: here it finds the run done.
line=$(sed -n 's/^\$ \(moe-train -c .*\)/\1/p' err1.txt)
(PATH="${MOE_BUILD_DIR:-}:$PATH" eval "$line") 2>paste.txt || { cat paste.txt; fail "pasted: $line"; }
grep -q "nothing to do" paste.txt || fail "the pasted moe-train line did not find the finished run"

# Second run: reuses the training, same summary apart from the wall time.
"$src/pipelines/quickstart.sh" >out2.txt 2>err2.txt || { tail -n 30 err2.txt; fail "second run"; }
grep -q "nothing to do" err2.txt || fail "second run retrained instead of reusing the run"
diff <(grep -v '^wall time' out1.txt) <(grep -v '^wall time' out2.txt) || fail "second summary differs"

# Other training settings: the finished run is not reused.
MOE_DEMO_TRAIN_ARGS="$MOE_DEMO_TRAIN_ARGS train.steps=12" "$src/pipelines/quickstart.sh" \
    >out4.txt 2>err4.txt || { tail -n 30 err4.txt; fail "run with other settings"; }
grep -q "trained with other settings" err4.txt || fail "changed settings did not retrain"
grep -Eq '^loss .* at step 12$' out4.txt || fail "changed settings: not trained to step 12"

# --fresh starts over and trains again.
"$src/pipelines/quickstart.sh" --fresh >out3.txt 2>err3.txt || { tail -n 30 err3.txt; fail "--fresh run"; }
grep -q "starting from step 0" err3.txt || fail "--fresh did not retrain"
diff <(grep -v '^wall time' out1.txt) <(grep -v '^wall time' out3.txt) || fail "--fresh run is not deterministic"
echo "PASS pipeline_quickstart ($((SECONDS - start)) s)"
