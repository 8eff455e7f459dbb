#!/usr/bin/env bash
# e2e.train_lambda: the tiny config trained on the lambda phage genome lowers the validation
# loss by a clear margin, and the run directory has the documented layout (metrics.jsonl,
# loss.svg, ckpt-<step>/ with MANIFEST, latest). Also: --log-json, --dry-run, and a shard
# stream on stdin (`moe-tokenize ... -o - | moe-train --data -`).
#
# The genome is a single FASTA record and moe-tokenize splits validation by record name, so
# the test first cuts it into 1 kb records; about a fifth of them become *.val.mtok.
set -euo pipefail
src=${MOE_SRC_DIR:?}
# A shared 2-core box: no OpenMP spin-waiting, no BLAS threads beside OpenMP's (the tools
# choose the AVX-512 GEMM kernels themselves; see docs/performance.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
source "$src/tests/interop/lambda_1kb.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf shards run run-stdin log.jsonl
moe-tokenize -q lambda_1kb.fa --val-fraction 0.2 -o shards/
ls shards/*.val.mtok >/dev/null 2>&1 || fail "moe-tokenize --val-fraction 0.2 wrote no validation shard"

# --dry-run: resolved config + sizes, exit 0, nothing written.
moe-train -c "$src/configs/tiny.yaml" --data shards --dry-run -o run > dry.txt
grep -q '^# parameters: [0-9]* total, [0-9]* active per token' dry.txt || fail "dry-run: no parameter counts"
grep -q '^# training FLOPs: ' dry.txt || fail "dry-run: no FLOPs"
grep -q '^# memory estimate: ' dry.txt || fail "dry-run: no memory estimate"
grep -q '^  hidden_size: 64' dry.txt || fail "dry-run: resolved config missing"
grep -q 'on a CUDA device + .* backend scratch = .* peak$' dry.txt || fail "dry-run: no CUDA peak"
# mxfp8 has a CUDA peak too (its quantized operands in the backend's scratch)
moe-train -c "$src/configs/tiny.yaml" --data shards --dry-run -o run precision.recipe=mxfp8 > dry8.txt
grep -q 'on a CUDA device + .* backend scratch = .* peak$' dry8.txt ||
    fail "dry-run mxfp8: $(grep '^# memory estimate' dry8.txt)"
[ ! -e run ] || fail "dry-run created the run directory"

# 40 steps of 1024 tokens (about one epoch of the 40 kb training split).
moe-train -q -@ 2 -c "$src/configs/tiny.yaml" --data shards -o run --log-json log.jsonl \
    train.steps=40 train.global_batch_tokens=1024 optim.warmup_steps=5 train.eval_every=10 \
    checkpoint.every=20 checkpoint.keep=5

for f in metrics.jsonl loss.svg latest ckpt-00000020/MANIFEST ckpt-00000040/MANIFEST; do
    [ -f "run/$f" ] || fail "run/$f missing"
done
[ "$(cat run/latest)" = ckpt-00000040 ] || fail "latest is '$(cat run/latest)'"
for f in config.yaml tokenizer.json model.safetensors optimizer-rank0.safetensors trainer_state.json; do
    grep -q " $f\$" run/ckpt-00000040/MANIFEST || fail "MANIFEST does not list $f"
done
[ "$(wc -l < run/metrics.jsonl)" -eq 40 ] || fail "metrics.jsonl has $(wc -l < run/metrics.jsonl) lines, expected 40"
cmp -s run/metrics.jsonl log.jsonl || fail "--log-json differs from metrics.jsonl"
for key in step loss ppl bits_per_base grad_norm lr tokens_per_s aux_loss z_loss router_entropy expert_load_max_over_mean time elapsed_s; do
    grep -q "\"$key\":" <(head -1 run/metrics.jsonl) || fail "metrics line lacks \"$key\""
done
grep -q '<polyline' run/loss.svg && grep -q '>validation<' run/loss.svg || fail "loss.svg lacks curves/legend"
grep -q 'cross-entropy (bits per base, log scale)' run/loss.svg || fail "loss.svg: y axis is not bits per base"
# wall time (ISO-8601 UTC) and elapsed seconds, growing
grep -q '"time":"20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\.[0-9]\{3\}Z"' <(tail -1 run/metrics.jsonl) ||
    fail "metrics line lacks an ISO-8601 UTC time"
el() { sed -n "${1}s/.*\"elapsed_s\":\([0-9.eE+-]*\).*/\1/p" run/metrics.jsonl; }
awk -v a="$(el 1)" -v b="$(el 40)" 'BEGIN { exit !(a > 0 && b > a) }' || fail "elapsed_s does not grow"
# metrics.tsv: the same 40 steps, one column per key, for spreadsheets
[ "$(wc -l < run/metrics.tsv)" -eq 41 ] || fail "metrics.tsv: expected a header and 40 lines"
head -1 run/metrics.tsv | tr '\t' '\n' | grep -qx val_bits_per_base || fail "metrics.tsv lacks val_bits_per_base"
[ "$(awk -F'\t' 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == "step") c = i} NR == 41 {print $c}' run/metrics.tsv)" = 40 ] ||
    fail "metrics.tsv's last line is not step 40"
# provenance: one @PG line per invocation with version and command line
grep -q "^@PG	ID:moe-train	PN:moe-train	VN:$(moe-train --version | awk 'NR == 1 {print $NF}')	CL:moe-train -q -@ 2 -c $src/configs/tiny.yaml --data shards -o run --log-json log.jsonl .*	DS:20.*Z start step 0$" run/provenance.txt ||
    { cat run/provenance.txt; fail "run/provenance.txt lacks the @PG line"; }

# The untrained model predicts ~uniformly over 256 tokens: its loss (step 1) is near
# ln 256 = 5.55 nats. Learning the 4-letter alphabet alone brings it to ln 4 = 1.39. Require
# the last validation loss (step 40) below 2 nats, at least 3 nats under the step-1 loss,
# and no worse than the first evaluation (step 10; 0.05 nats of noise allowed).
vals=$(sed -n 's/.*"val_loss":\([0-9.eE+-]*\).*/\1/p' run/metrics.jsonl)
[ "$(echo "$vals" | wc -l)" -eq 4 ] || fail "expected 4 evaluations, got: $vals"
start=$(sed -n '1s/.*"loss":\([0-9.eE+-]*\),.*/\1/p' run/metrics.jsonl)
first=$(echo "$vals" | head -1); last=$(echo "$vals" | tail -1)
echo "step-1 loss $start; val_loss at steps 10..40: $(echo $vals)"
awk -v s="$start" -v f="$first" -v l="$last" 'BEGIN { exit !(s > 5 && l < 2.0 && l < s - 3 && l <= f + 0.05) }' ||
    fail "validation loss did not fall clearly: step-1 loss $start, val_loss first $first, last $last"

# A shard stream on stdin trains too (no validation data: a warning, not an error).
moe-tokenize -q lambda_1kb.fa -o - | moe-train -q -c "$src/configs/tiny.yaml" --data - -o run-stdin \
    train.steps=2 optim.warmup_steps=1 2> stdin.err
[ -f run-stdin/ckpt-00000002/MANIFEST ] || fail "stdin run wrote no checkpoint"
grep -q '"step":2' run-stdin/metrics.jsonl || fail "stdin run: no metrics"
echo "ok"
