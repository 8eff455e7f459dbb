#!/usr/bin/env bash
# pipeline_snakemake.sh: runs pipelines/snakemake end to end with --cores 2 on lambda phage
# (two samples: the genome, and 2 kb pieces of its first 10 kb as separate records so that the
# validation split has records to take), 20 training steps, then checks every output: shards,
# checkpoint, metrics with a validation loss, the loss plot, embedding matrices whose row count
# matches the windows, the logs; and that a second run has nothing to do.
# The one thing to know: the full run uses a config written here (small overrides); the
# checkout's config/config.yaml is only planned (snakemake -n), from a mirror of the tree.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
# ctest runs tests side by side on few cores: OpenMP threads that spin while waiting slow
# every job down several-fold there, sleeping ones do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
command -v snakemake >/dev/null || { echo "SKIP: snakemake is not installed (make deps)"; exit 77; }
lambda=$src/data/lambda_virus.fa.gz
[ -r "$lambda" ] || lambda=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -r "$lambda" ] || { echo "SKIP: no lambda genome (data/ or bowtie2-examples)"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf work && mkdir -p work && cd work
snakefile=$src/pipelines/snakemake/Snakefile
# Second sample: the first 10,000 bases of lambda as five 2 kb records part1..part5.
gzip -dc "$lambda" | awk 'NR > 1 { s = s $0 } END { for (i = 0; i < 5; i++)
    printf ">part%d\n%s\n", i + 1, substr(s, i * 2000 + 1, 2000) }' >parts.fa

cat >config.yaml <<EOF
samples:
  lambda: $lambda
  parts: parts.fa
outdir: results
bin_dir: ${MOE_BUILD_DIR:-}
tokenize:
  val_fraction: 0.5
  args: ""
  threads: 1
train:
  config: $src/configs/tiny.yaml
  overrides:
    train.steps: 20
    train.seq_len: 128
    train.global_batch_tokens: 512
    optim.warmup_steps: 5
    train.eval_every: 10
    checkpoint.every: 10
  threads: 2
embed:
  args: "--window 1000 --stride 1000 --per-window"
  threads: 2
EOF

# The shipped config/config.yaml must plan as a user runs it: from pipelines/snakemake/ of a
# checkout (mirrored here with links, so that nothing is written into the source tree).
mkdir -p tree/pipelines/snakemake/config tree/data
cp "$snakefile" tree/pipelines/snakemake/
cp "$src/pipelines/snakemake/config/config.yaml" tree/pipelines/snakemake/config/
ln -s "$lambda" tree/data/lambda_virus.fa.gz
ln -s "$src/configs" tree/configs
(cd tree/pipelines/snakemake && snakemake -n --cores 2 >plan.txt 2>&1) ||
    { cat tree/pipelines/snakemake/plan.txt; fail "snakemake -n with the shipped config"; }
for r in tokenize train embed; do
    grep -q "rule $r:" tree/pipelines/snakemake/plan.txt || fail "the shipped plan has no $r job"
done

start=$SECONDS
snakemake -s "$snakefile" --configfile config.yaml --cores 2 --quiet --printshellcmds ||
    { for l in results/logs/*.log; do echo "== $l"; tail -n 20 "$l"; done; fail "snakemake run"; }
echo "snakemake run: $((SECONDS - start)) s"

for f in results/tokens/lambda.mtok results/tokens/parts.mtok results/run/latest \
    results/run/metrics.jsonl results/run/loss.svg results/logs/train.log \
    results/logs/tokenize.lambda.log results/logs/embed.parts.log; do
    [ -s "$f" ] || fail "missing or empty: $f"
done
ls results/tokens/parts.val.mtok >/dev/null 2>&1 || fail "val_fraction 0.5 of 5 records wrote no parts.val.mtok"
ckpt=$(cat results/run/latest)
[ -s "results/run/$ckpt/model.safetensors" ] || fail "latest -> $ckpt has no model.safetensors"
[ "$(wc -l <results/run/metrics.jsonl)" -eq 20 ] || fail "metrics.jsonl: expected 20 steps"
tail -n 1 results/run/metrics.jsonl | grep -q '"step": *20' || fail "last metrics line is not step 20"
grep -q '"val_loss"' results/run/metrics.jsonl || fail "no val_loss in metrics.jsonl"
first=$(head -n 1 results/run/metrics.jsonl | grep -o '"loss": *[0-9.]*' | sed 's/.*: *//')
last=$(tail -n 1 results/run/metrics.jsonl | grep -o '"loss": *[0-9.]*' | sed 's/.*: *//')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
grep -q '<svg' results/run/loss.svg || fail "loss.svg is not SVG"

# Rows: lambda has 48,502 bases -> 49 windows of 1 kb; parts: 5 records x 2 windows.
npy_rows() { head -c 128 "$1" | tr -d '\0' | grep -ao "'shape': ([0-9]*" | grep -o '[0-9]*$'; }
for s in lambda:49 parts:10; do
    name=${s%%:*} want=${s##*:}
    got=$(npy_rows "results/embeddings/$name.npy")
    [ "$got" = "$want" ] || fail "$name.npy has $got rows, expected $want"
    [ "$(($(wc -l <"results/embeddings/$name.ids.tsv") - 1))" = "$want" ] ||
        fail "$name.ids.tsv does not have $want rows"
done

# A second run has nothing to do.
snakemake -s "$snakefile" --configfile config.yaml --cores 2 -n 2>&1 | grep -q "Nothing to be done" ||
    fail "a second snakemake run would redo work"
echo "PASS pipeline_snakemake ($((SECONDS - start)) s)"
