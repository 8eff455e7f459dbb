#!/usr/bin/env bash
# pipeline_snakemake.sh: runs pipelines/snakemake end to end with --cores 2 on lambda phage
# (two samples in a TSV sheet: the genome, and 2 kb pieces of its first 10 kb as separate
# records), 20 training steps, then checks every output: shards (and the declared
# *.val.mtok; the genome goes through 3 `--part` jobs and `merge`, which must give one job's
# bytes), the shard manifest, checkpoint, metrics with a validation loss, the loss plot
# for the report, benchmarks, embedding matrices whose row count matches the windows,
# per-sample log-likelihood tables and a scored VCF (moe-score: provenance naming the trained
# checkpoint, a row per sequence, MOE_LLR for every ALT, read by bcftools), the logs. Then the stale-sample case: a sample removed from the sheet is no longer trained on
# although its shards stay in tokens/ (moe-train's token count must be the remaining
# sample's). And a further run has nothing to do; `snakemake --lint` is clean; bad sample
# sheets and configs are refused before anything runs, naming the line or key.
# The one thing to know: the full run uses a config written here (small overrides); the
# checkout's config/ is only planned and linted (snakemake -n, --lint), from a mirror of the tree.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
# ctest runs tests side by side on few cores: OpenMP threads that spin while waiting slow
# every job down several-fold there, sleeping ones do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
command -v snakemake >/dev/null || { echo "SKIP: snakemake is not installed (make deps)"; exit 77; }
for t in samtools bcftools; do
    command -v $t >/dev/null || { echo "SKIP: $t is not installed (make deps)"; exit 77; }
done
lambda=$src/data/lambda_virus.fa.gz
[ -r "$lambda" ] || lambda=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -r "$lambda" ] || { echo "SKIP: no lambda genome (data/ or bowtie2-examples)"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -n "${MOE_BUILD_DIR:-}" ] && PATH="$MOE_BUILD_DIR:$PATH"
tokens_of() { moe-tokenize stats --json "$1" | grep -m 1 -o '"tokens": *[0-9]*' | sed 's/.*: *//'; }

rm -rf work && mkdir -p work && cd work
wf=$src/pipelines/snakemake/workflow
snakefile=$wf/Snakefile
# Second sample: the first 10,000 bases of lambda as five 2 kb records part1..part5.
gzip -dc "$lambda" | awk 'NR > 1 { s = s $0 } END { for (i = 0; i < 5; i++)
    printf ">part%d\n%s\n", i + 1, substr(s, i * 2000 + 1, 2000) }' >parts.fa

printf 'sample\tpath\nlambda\t%s\nparts\tparts.fa\n' "$lambda" >samples.tsv
# The variants to score: SNVs, an MNV and a deletion on lambda (renamed: the VCF's contig).
gzip -dc "$lambda" | sed '1s/^>.*/>lambda/' >ref.fa
samtools faidx ref.fa
awk 'NR > 1 { s = s $0 } END {
    print "##fileformat=VCFv4.2\n##contig=<ID=lambda,length=" length(s) ">"
    print "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO"
    n = split("1000 5000 20000", pos, " ")
    for (i = 1; i <= n; i++) { r = substr(s, pos[i], 1)
        printf "lambda\t%d\tsnv%d\t%s\t%s\t.\t.\t.\n", pos[i], i, r, r == "A" ? "C" : "A" }
    printf "lambda\t30000\tmnv\t%s\t%s\t.\t.\t.\n", substr(s, 30000, 2), substr(s, 30000, 2) == "AC" ? "GT" : "AC"
    printf "lambda\t40000\tdel\t%s\t%s\t.\t.\t.\n", substr(s, 40000, 4), substr(s, 40000, 1) }' ref.fa >calls.vcf
cat >config.yaml <<EOF2
samples: samples.tsv
outdir: results
bin_dir: ${MOE_BUILD_DIR:-}
tokenize:
  val_fraction: 0.5
  args: "--window 1000"
  threads: 1
  parts: 3
  parts_min_mb: 0.012
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
score:
  vcfs:
    calls: calls.vcf
  fasta: ref.fa
  variants_args: "--window 500"
  threads: 2
EOF2

# The shipped config/ must plan and lint as a user runs it: from pipelines/snakemake/ of a
# checkout (mirrored here, so that nothing is written into the source tree).
mkdir -p tree/pipelines/snakemake tree/data
cp -r "$wf" "$src/pipelines/snakemake/config" tree/pipelines/snakemake/
ln -s "$lambda" tree/data/lambda_virus.fa.gz
ln -s "$src/configs" tree/configs
(cd tree/pipelines/snakemake && snakemake -n --cores 2 >plan.txt 2>&1) ||
    { cat tree/pipelines/snakemake/plan.txt; fail "snakemake -n with the shipped config"; }
for r in tokenize shard_manifest train loss_plot embed score; do
    grep -q "rule $r:" tree/pipelines/snakemake/plan.txt || fail "the shipped plan has no $r job"
done
(cd tree/pipelines/snakemake && snakemake --lint >lint.txt 2>&1) ||
    { cat tree/pipelines/snakemake/lint.txt; fail "snakemake --lint is not clean"; }

# Bad inputs are refused before any job runs, naming the sheet's line or the config key.
refused() { # DESCRIPTION EXPECTED-MESSAGE SNAKEMAKE-ARGS...
    local what=$1 want=$2
    shift 2
    if snakemake -s "$snakefile" --cores 1 -n "$@" >bad.txt 2>&1; then fail "$what was accepted"; fi
    grep -q -- "$want" bad.txt || { cat bad.txt; fail "$what: no '$want' in the error"; }
}
printf 'sample\tpath\nlambda\t%s\nlambda\tparts.fa\n' "$lambda" >dup.tsv
refused "a sample listed twice" "dup.tsv: line 3: sample 'lambda' is listed twice" \
    --configfile config.yaml --config samples=dup.tsv
printf 'sample\tpath\nbad/name\tparts.fa\n' >badname.tsv
refused "a sample name with /" "badname.tsv: line 2: " --configfile config.yaml --config samples=badname.tsv
printf 'sample\tpath\nx\tmissing.fa\n' >missing.tsv
refused "a missing input file" "missing.tsv: line 2: sample 'x': no such file: missing.fa" \
    --configfile config.yaml --config samples=missing.tsv
sed 's/^  threads: 1$/  thread: 1/' config.yaml >typo.yaml
refused "an unknown config key" "thread" --configfile typo.yaml
grep -v '^  fasta: ref.fa$' config.yaml >nofasta.yaml
refused "VCFs without a reference" "score.vcfs needs score.fasta" --configfile nofasta.yaml
cp ref.fa noindex.fa
sed 's/^  fasta: ref.fa$/  fasta: noindex.fa/' config.yaml >noindex.yaml
refused "a reference without .fai" "noindex.fa has no index noindex.fa.fai" --configfile noindex.yaml
# SAM text above parts_min_mb is planned as one job (moe-tokenize --part refuses SAM).
gzip -dc "$lambda" | awk 'NR > 1 { s = s $0 } END { for (i = 0; i < 10; i++)
    printf ">r%d\n%s\n", i + 1, substr(s, i * 2000 + 1, 2000) }' >sam.fa
samtools import -0 sam.fa -o big.sam
[ "$(wc -c <big.sam)" -gt 12000 ] || fail "big.sam is not above parts_min_mb"
printf 'sample\tpath\nbig\tbig.sam\n' >sam.tsv
snakemake -s "$snakefile" --configfile config.yaml --config samples=sam.tsv --cores 1 -n \
    >sam_plan.txt 2>&1 || { cat sam_plan.txt; fail "snakemake -n with a SAM sample"; }
grep -q "rule tokenize:" sam_plan.txt || { cat sam_plan.txt; fail "the SAM sample has no tokenize job"; }
! grep -q "rule tokenize_part:" sam_plan.txt || fail "the SAM sample was planned in --part jobs"

start=$SECONDS
run_workflow() {
    snakemake -s "$snakefile" --configfile config.yaml --cores 2 --quiet --printshellcmds ||
        { for l in results/logs/*.log; do echo "== $l"; tail -n 20 "$l"; done; fail "snakemake run"; }
}
run_workflow
echo "snakemake run: $((SECONDS - start)) s"

for f in results/tokens/lambda.mtok results/tokens/parts.mtok results/tokens/lambda.val.mtok \
    results/tokens/parts.val.mtok results/run/latest results/run/metrics.jsonl results/run/loss.svg \
    results/report/loss.svg results/logs/train.log results/logs/tokenize_merge.lambda.log \
    results/logs/tokenize_part.lambda.3.log results/logs/tokenize.parts.log \
    results/logs/embed.parts.log results/benchmarks/train.tsv results/benchmarks/tokenize.parts.tsv \
    results/benchmarks/embed.lambda.tsv results/scores/lambda.ll.tsv results/scores/parts.ll.tsv \
    results/scores/calls.vcf.gz results/logs/score.parts.log results/logs/score_variants.calls.log \
    results/benchmarks/score.lambda.tsv results/benchmarks/score_variants.calls.tsv; do
    [ -s "$f" ] || fail "missing or empty: $f"
done
# lambda (15 kB of gzip, above parts_min_mb) went through 3 --part jobs and a merge, parts.fa
# (10 kB) through one job: the merged shards are the bytes of one job, the parts are gone.
moe-tokenize -q --val-fraction 0.5 --window 1000 -o one.mtok "$lambda"
cmp one.mtok results/tokens/lambda.mtok || fail "merged lambda.mtok differs from one job's"
cmp one.val.mtok results/tokens/lambda.val.mtok || fail "merged lambda.val.mtok differs from one job's"
[ -z "$(ls results/tokens/parts/ 2>/dev/null)" ] || fail "the parts were left in tokens/parts/"
ckpt=$(cat results/run/latest)
[ -s "results/run/$ckpt/model.safetensors" ] || fail "latest -> $ckpt has no model.safetensors"
[ "$(wc -l <results/run/metrics.jsonl)" -eq 20 ] || fail "metrics.jsonl: expected 20 steps"
tail -n 1 results/run/metrics.jsonl | grep -q '"step": *20' || fail "last metrics line is not step 20"
grep -q '"val_loss"' results/run/metrics.jsonl || fail "no val_loss in metrics.jsonl"
first=$(head -n 1 results/run/metrics.jsonl | grep -o '"loss": *[0-9.]*' | sed 's/.*: *//')
last=$(tail -n 1 results/run/metrics.jsonl | grep -o '"loss": *[0-9.]*' | sed 's/.*: *//')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
grep -q '<svg' results/report/loss.svg || fail "report/loss.svg is not SVG"
cmp -s results/run/loss.svg results/report/loss.svg || fail "report/loss.svg is not the run's plot"

# moe-train trained on exactly the sheet's shards (its log counts the training tokens).
trained() { grep -o 'data: [0-9]* tokens' results/logs/train.log | grep -o '[0-9]*'; }
want=$(($(tokens_of results/tokens/lambda.mtok) + $(tokens_of results/tokens/parts.mtok)))
[ "$(trained)" = "$want" ] || fail "trained on $(trained) tokens, the two samples have $want"
python3 - results/tokens/train.manifest.json lambda,parts <<'EOF2' || fail "train.manifest.json"
import json, sys
m = json.load(open(sys.argv[1]))
names = sys.argv[2].split(",")
assert m["format"] == "moe-token-shards", m
assert [e["path"] for e in m["shards"]] == [n + ".mtok" for n in names], m
assert [e["path"] for e in m["val_shards"]] == [n + ".val.mtok" for n in names], m
EOF2

# Rows: lambda has 48,502 bases -> 49 windows of 1 kb; parts: 5 records x 2 windows.
npy_rows() { head -c 128 "$1" | tr -d '\0' | grep -ao "'shape': ([0-9]*" | grep -o '[0-9]*$'; }
for s in lambda:49 parts:10; do
    name=${s%%:*} want=${s##*:}
    got=$(npy_rows "results/embeddings/$name.npy")
    [ "$got" = "$want" ] || fail "$name.npy has $got rows, expected $want"
    [ "$(($(wc -l <"results/embeddings/$name.ids.tsv") - 2))" = "$want" ] ||
        fail "$name.ids.tsv does not have $want rows"
done

# Scores: each table starts with moe-score's #@PG line naming the trained checkpoint, then
# the header and one row per sequence; the scored VCF has a MOE_LLR for every ALT.
for s in lambda:1 parts:5; do
    name=${s%%:*} want=${s##*:} t=results/scores/${s%%:*}.ll.tsv
    awk -F'\t' -v ck="DS:checkpoint results/run/$ckpt step 20 " 'NR == 1 && ($1 != "#@PG" ||
        $2 != "ID:moe-score" || index($NF, ck) != 1) { exit 1 }' "$t" ||
        fail "$t: line 1 is not moe-score's #@PG line for results/run/$ckpt: $(awk 'NR == 1' "$t")"
    [ "$(awk 'NR == 2' "$t")" = "$(printf 'name\tlength\tlog_likelihood\tbits_per_base\tperplexity')" ] ||
        fail "$t: no header line"
    [ "$(($(wc -l <"$t") - 2))" = "$want" ] || fail "$t does not have $want rows"
done
[ "$(awk -F'\t' 'NR > 2 { print $1 }' results/scores/parts.ll.tsv | tr '\n' ' ')" = "part1 part2 part3 part4 part5 " ] ||
    fail "parts.ll.tsv: not one row per record in order"
bcftools view -h results/scores/calls.vcf.gz | grep '^##moe_score=<model="results/run/'"$ckpt"'",step=20,' > /dev/null ||
    fail "calls.vcf.gz: no ##moe_score line for results/run/$ckpt"
[ "$(bcftools query -f '%ID:%INFO/MOE_LLR\n' results/scores/calls.vcf.gz | awk -F: '$2 != "." { n++ } END { print n }')" = 5 ] ||
    fail "calls.vcf.gz: not every ALT has a MOE_LLR: $(bcftools query -f '%ID:%INFO/MOE_LLR ' results/scores/calls.vcf.gz)"

# The stale-sample case: remove `parts` from the sheet. Its shards stay in results/tokens/,
# but the retrained model must not see them.
sed -i '/^parts\t/d' samples.tsv
run_workflow
want=$(tokens_of results/tokens/lambda.mtok)
[ -s results/tokens/parts.mtok ] || fail "the removed sample's shard should still lie in tokens/"
[ "$(trained)" = "$want" ] ||
    fail "after removing 'parts' the model trained on $(trained) tokens, lambda alone has $want"
python3 - results/tokens/train.manifest.json lambda <<'EOF2' || fail "train.manifest.json after removal"
import json, sys
m = json.load(open(sys.argv[1]))
assert [e["path"] for e in m["shards"]] == ["lambda.mtok"], m
assert [e["path"] for e in m["val_shards"]] == ["lambda.val.mtok"], m
EOF2

# A further run has nothing to do.
snakemake -s "$snakefile" --configfile config.yaml --cores 2 -n 2>&1 | grep -q "Nothing to be done" ||
    fail "a second snakemake run would redo work"
echo "PASS pipeline_snakemake ($((SECONDS - start)) s)"
