#!/usr/bin/env bash
# pipeline_nextflow.sh: the Nextflow modules' command lines, run by bash on lambda phage, and
# the pipeline's nf-core files checked.
#
# Nextflow is not installable here, so this test does what Nextflow would do with each process
# of pipelines/nextflow/modules/local/moe_*/main.nf: take the script: (and the stub:) block,
# strip its indentation, interpolate the Groovy variables ($args from conf/test.config's or else
# conf/modules.config's ext.args, $task.cpus, $prefix, the inputs), stage the inputs into a task
# directory under their names and run it with `bash -euo pipefail` (conf/base.config's
# process.shell). Then it checks the outputs each module declares, and runs the module's
# `eval(...)` versions output in the task directory as Nextflow would (it must print the
# project's version). A CRAM input with its .crai and its reference + .fai staged beside it, and
# a region, must work inside the task; MOE_TOKENIZE's parts 1..3 of a file (meta.part,
# meta.parts) merged by MOE_TOKENIZE_MERGE must be the bytes of one MOE_TOKENIZE task on it,
# shard and validation shard; MOE_SCORE and MOE_SCORE_VARIANTS score the embed task's sequence
# and the test profile's variants (assets/test/) with the trained run. Also checked:
# nextflow_schema.json and assets/schema_input.json are valid JSON Schema (2020-12) and the test
# sample sheet passes; every module has meta.yml (naming each input), environment.yml,
# conda/container directives and nf-test files; main.nf includes the six modules; the test
# profile's files exist and the committed .fai is samtools faidx's.
# Not executed by any test: Nextflow itself (main.nf's channel logic - which files are split,
# the parts reaching the merge in part order -, nf-schema, the versions topic, retries,
# resourceLimits), nf-test, conda and containers.
# The one thing to know: an unknown Groovy variable in a script block fails the test, so the
# modules and this test move together.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
# ctest runs tests side by side on few cores: OpenMP threads that spin while waiting slow
# every job down several-fold there, sleeping ones do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
nf=$src/pipelines/nextflow
lambda=$src/data/lambda_virus.fa.gz
[ -r "$lambda" ] || lambda=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -r "$lambda" ] || { echo "SKIP: no lambda genome (data/ or bowtie2-examples)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to extract the scripts"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf work && mkdir -p work && cd work

# extract MODULE BLOCK VAR=VALUE... : prints the bash script Nextflow would run.
cat >extract.py <<'EOF'
import re, sys, textwrap
path, block, *assigns = sys.argv[1:]
vals = dict(a.split("=", 1) for a in assigns)
text = open(path).read()
m = re.search(r"^\s*" + block + r":\s*\n(.*?)^\s*\"\"\"\n(.*?)^\s*\"\"\"", text, re.S | re.M)
if not m:
    sys.exit(f"{path}: no {block}: block with a \"\"\" script")
body = textwrap.dedent(m.group(2))
def sub(mo):
    tok = mo.group(0)
    if tok == "\\\\":
        return "\\"
    if tok == "\\$":
        return "$"
    name = mo.group(1) or mo.group(2)
    if name not in vals:
        sys.exit(f"{path}: {block}: Groovy variable '{name}' has no value in the test")
    return vals[name]
print(re.sub(r"\\\\|\\\$|\$\{([^}]*)\}|\$([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", sub, body), end="")
EOF

# ext_args PROCESS : ext.args under withName: 'PROCESS' in conf/test.config (the `test`
# profile), else in conf/modules.config (as `-profile test` resolves it).
ext_args() {
    python3 - "$nf/conf/test.config" "$nf/conf/modules.config" "$1" <<'EOF'
import re, sys
pat = r"withName:\s*'" + sys.argv[3] + r"'\s*\{[^}]*?ext\.args\s*=\s*'([^']*)'"
for path in sys.argv[1:3]:
    found = re.findall(pat, open(path).read())
    if found:
        print(found[-1])
        sys.exit(0)
sys.exit(f"conf/: no ext.args for {sys.argv[3]}")
EOF
}

# run_task NAME MODULE BLOCK VAR=VALUE... : runs the block in task dir NAME (inputs staged already).
run_task() {
    local dir=$1 module=$2 block=$3
    shift 3
    python3 extract.py "$nf/modules/local/$module/main.nf" "$block" "$@" >"$dir/.command.sh"
    echo "== $module $block:"
    cat "$dir/.command.sh"
    (cd "$dir" && bash -euo pipefail .command.sh >.command.out 2>.command.err) ||
        { cat "$dir/.command.err"; fail "$module $block script failed"; }
}
# check_versions DIR MODULE TOOL: the module's eval("...") versions output, run in DIR as
# Nextflow runs it after the script, must print the project's version.
check_versions() {
    local cmd got
    cmd=$(python3 - "$nf/modules/local/$2/main.nf" "$3" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"val\('" + re.escape(sys.argv[2]) + r"'\), eval\(\"(.*?)\"\), emit: versions_\w+, topic: versions", text)
if not m:
    sys.exit(f"{sys.argv[1]}: no (process, '{sys.argv[2]}', eval(...)) output on the versions topic")
print(m.group(1))
EOF
    ) || fail "$2: versions output"
    got=$(cd "$1" && bash -euo pipefail -c "$cmd") || fail "$2: the versions command failed: $cmd"
    [ "$got" = "$version" ] || fail "$2: versions eval printed '$got', expected '$version'"
}
version=$(sed -n 's/^project(moe_genomics VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")

[ -n "${MOE_BUILD_DIR:-}" ] && PATH="$MOE_BUILD_DIR:$PATH"
start=$SECONDS

# MOE_TOKENIZE: tuple val(meta), path(reads), path(index); tuple val(meta2), path(fasta),
# path(fai). meta.id = lambda, no index, no reference.
mkdir tok && ln -s "$lambda" tok/lambda_virus.fa.gz
run_task tok moe_tokenize script args="$(ext_args MOE_TOKENIZE)" task.cpus=1 prefix=lambda \
    meta.id=lambda reads=lambda_virus.fa.gz part= reference= task.process=MOE_TOKENIZE
[ -s tok/lambda.mtok ] || fail "MOE_TOKENIZE: no lambda.mtok"
check_versions tok moe_tokenize moe-tokenize

# MOE_TOKENIZE on a CRAM with its .crai, the reference and its .fai staged beside it, and a
# region in ext.args: the task must decode the CRAM and use the index.
HT=/usr/share/htslib-test/test
if [ -r "$HT/range.cram.crai" ] && [ -r "$HT/ce.fa.fai" ] && command -v samtools >/dev/null; then
    mkdir cram && for f in range.cram range.cram.crai ce.fa ce.fa.fai; do ln -s "$HT/$f" cram/; done
    (export REF_PATH=/dev/null/no-ref/%s REF_CACHE=/dev/null/no-ref/%s
        run_task cram moe_tokenize script args="-r CHROMOSOME_I" task.cpus=1 prefix=range \
            meta.id=range reads=range.cram part= reference="--reference ce.fa" task.process=MOE_TOKENIZE)
    docs=$(moe-tokenize stats --json cram/range.mtok |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["documents"])')
    want=$(samtools view -c -F 0xF00 -T "$HT/ce.fa" "$HT/range.cram" CHROMOSOME_I)
    [ "$docs" = "$want" ] || fail "MOE_TOKENIZE on CRAM + region: $docs documents, samtools counts $want"
else
    echo "no htslib-test CRAM or samtools: the CRAM staging case is not run"
fi

# MOE_TOKENIZE on parts I = 1..3 of a file (meta.part = I, meta.parts = 3: `--part I/3`, output
# x8.I.mtok) and MOE_TOKENIZE_MERGE: tuple val(meta), path(shards) in part order, path(vals)
# staged beside them. The merged shard and validation shard must be one MOE_TOKENIZE task's
# bytes. Lambda is one record, which would fall whole into part 1, so the file is lambda cut
# into 1 kb records, 8 times over (391 kB of plain FASTA, which htslib reads in 64 kB pieces):
# every part gets records (checked), so a wrong part order or count changes the merged bytes.
mkdir -p split/whole split/merge
gzip -dc "$lambda" | awk 'NR > 1 { s = s $0 } END {
    for (c = 1; c <= 8; c++) for (i = 0; i * 1000 < length(s); i++)
        printf ">c%d_%d\n%s\n", c, i + 1, substr(s, i * 1000 + 1, 1000) }' >split/lambda_x8.fa
tok_args=$(ext_args MOE_TOKENIZE)
ln -s ../lambda_x8.fa split/whole/
run_task split/whole moe_tokenize script args="$tok_args" task.cpus=1 prefix=x8 meta.id=x8 \
    reads=lambda_x8.fa part= reference= task.process=MOE_TOKENIZE
shards=
for i in 1 2 3; do
    mkdir "split/part$i" && ln -s ../lambda_x8.fa "split/part$i/"
    run_task "split/part$i" moe_tokenize script args="$tok_args" task.cpus=1 prefix="x8.$i" \
        meta.id=x8 reads=lambda_x8.fa part="--part $i/3" reference= task.process=MOE_TOKENIZE
    docs=$(moe-tokenize stats --json "split/part$i/x8.$i.mtok" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["documents"])')
    [ "$docs" -gt 0 ] || fail "MOE_TOKENIZE --part $i/3: no documents (the part order is untested)"
    ln -s "../part$i/x8.$i.mtok" "../part$i/x8.$i.val.mtok" split/merge/
    shards+=" x8.$i.mtok"
done
run_task split/merge moe_tokenize_merge script args="$(ext_args MOE_TOKENIZE_MERGE)" prefix=x8 \
    meta.id=x8 shards="${shards# }" task.process=MOE_TOKENIZE_MERGE
for f in x8.mtok x8.val.mtok; do
    cmp "split/merge/$f" "split/whole/$f" ||
        fail "MOE_TOKENIZE_MERGE of parts 1..3: $f is not the bytes of one MOE_TOKENIZE task"
done
check_versions split/merge moe_tokenize_merge moe-tokenize

# MOE_TRAIN: tuple val(meta), path(shards, stageAs: 'shards/*'); path config
mkdir -p train/shards && ln -s "$PWD"/tok/*.mtok train/shards/ && ln -s "$src/configs/tiny.yaml" train/
run_task train moe_train script args="$(ext_args MOE_TRAIN)" task.cpus=2 prefix=run \
    meta.id=run config=tiny.yaml task.process=MOE_TRAIN
for f in run/latest run/metrics.jsonl run/loss.svg; do [ -s "train/$f" ] || fail "MOE_TRAIN: no $f"; done
[ "$(wc -l <train/run/metrics.jsonl)" -eq 20 ] || fail "MOE_TRAIN: test profile should train 20 steps"
check_versions train moe_train moe-train

# MOE_EMBED: tuple val(meta), path(seqs); tuple val(meta2), path(model). The first 10.5 kb
# of lambda (embedding is the slow step under ASan) -> 11 windows of up to 1 kb.
mkdir emb && ln -s "$PWD/train/run" emb/run
gzip -dc "$lambda" | awk 'NR == 1 { print; next } { s = s $0 } END { print substr(s, 1, 10500) }' \
    >emb/lambda_head.fa
run_task emb moe_embed script args="$(ext_args MOE_EMBED)" task.cpus=2 prefix=lambda \
    meta.id=lambda seqs=lambda_head.fa model=run reference= task.process=MOE_EMBED
rows=$(head -c 128 emb/lambda.npy | tr -d '\0' | grep -ao "'shape': ([0-9]*" | grep -o '[0-9]*$')
[ "$rows" = 11 ] || fail "MOE_EMBED: lambda.npy has '$rows' rows, expected 11 (1 kb windows)"
[ "$(wc -l <emb/lambda.ids.tsv)" = 13 ] || fail "MOE_EMBED: lambda.ids.tsv should have the @PG line, a header and 11 rows"
check_versions emb moe_embed moe-embed

# MOE_SCORE: the same inputs as MOE_EMBED -> ${prefix}.ll.tsv (#@PG line, header, one row).
mkdir score && ln -s "$PWD/train/run" score/run && ln -s "$PWD/emb/lambda_head.fa" score/
run_task score moe_score script args="$(ext_args MOE_SCORE)" task.cpus=2 prefix=lambda \
    meta.id=lambda seqs=lambda_head.fa model=run reference= task.process=MOE_SCORE
[ "$(wc -l <score/lambda.ll.tsv)" = 3 ] || fail "MOE_SCORE: lambda.ll.tsv should have the @PG line, a header and 1 row"
awk -F'\t' 'NR == 1 && $2 != "ID:moe-score" { exit 1 } NR == 3 && $2 != 10500 { exit 1 }' score/lambda.ll.tsv ||
    fail "MOE_SCORE: lambda.ll.tsv is not moe-score's table of the 10,500-base record"
check_versions score moe_score moe-score

# MOE_SCORE_VARIANTS: tuple val(meta), path(vcf); the model; tuple val(meta3), path(fasta),
# path(fai) - the test profile's variants on its 5 kb reference; every record gets MOE_LLR.
mkdir var && ln -s "$PWD/train/run" var/run
for f in calls.vcf lambda_5kb.fa lambda_5kb.fa.fai; do ln -s "$nf/assets/test/$f" var/; done
run_task var moe_score_variants script args="$(ext_args MOE_SCORE_VARIANTS)" task.cpus=2 \
    prefix=calls.scored meta.id=calls vcf=calls.vcf model=run fasta=lambda_5kb.fa \
    task.process=MOE_SCORE_VARIANTS
gzip -dc var/calls.scored.vcf.gz >var/out.vcf || fail "MOE_SCORE_VARIANTS: calls.scored.vcf.gz is not gzip"
grep -q '^##moe_score=<model="run/ckpt-' var/out.vcf || fail "MOE_SCORE_VARIANTS: no ##moe_score line"
[ "$(awk -F'\t' '!/^#/ && $8 ~ /MOE_LLR=/' var/out.vcf | wc -l)" = 6 ] ||
    fail "MOE_SCORE_VARIANTS: not all 6 records have INFO/MOE_LLR"
check_versions var moe_score_variants moe-score
if command -v samtools >/dev/null; then # the committed index is the one samtools writes
    cp "$nf/assets/test/lambda_5kb.fa" var/fresh.fa && samtools faidx var/fresh.fa
    cmp -s var/fresh.fa.fai "$nf/assets/test/lambda_5kb.fa.fai" ||
        fail "assets/test/lambda_5kb.fa.fai is not samtools faidx's index of lambda_5kb.fa"
fi

# The stub: blocks (nextflow -stub-run) must run too and create the declared outputs.
for m in tokenize:lambda.mtok tokenize_merge:lambda.mtok train:run/latest embed:lambda.ids.tsv \
    score:lambda.ll.tsv score_variants:calls.vcf.gz; do
    mod=moe_${m%%:*} out=${m##*:}
    mkdir "stub_$mod"
    run_task "stub_$mod" "$mod" stub prefix="${out%%[./]*}" meta.id=x task.process="${mod^^}"
    [ -e "stub_$mod/$out" ] || fail "$mod stub: no $out"
done

# main.nf includes exactly these modules, from files that exist, and each of the six.
modules="moe_tokenize moe_tokenize_merge moe_train moe_embed moe_score moe_score_variants"
grep -o "include { [A-Z_]* *} from '[^']*'" "$nf/main.nf" | while read -r _ _ name _ _ path; do
    path=${path//\'/}
    [ -f "$nf/$path.nf" ] || fail "main.nf includes $name from missing $path.nf"
    grep -q "^process $name {" "$nf/$path.nf" || fail "$path.nf does not define process $name"
done
for mod in $modules; do
    grep -q "^include { ${mod^^} *} from './modules/local/$mod/main'$" "$nf/main.nf" ||
        fail "main.nf does not include ${mod^^}"
done
includes=$(grep -c "^include { MOE_[A-Z_]* *} from './modules/" "$nf/main.nf")
[ "$includes" = "$(wc -w <<<"$modules")" ] ||
    fail "main.nf should include the six modules only"

# nf-core module files: meta.yml names every input of the process, environment.yml is the
# conda directive's, a container is named, nf-test cases sit beside the module.
for mod in $modules; do
    dir=$nf/modules/local/$mod
    for f in meta.yml environment.yml tests/main.nf.test; do [ -s "$dir/$f" ] || fail "$mod: no $f"; done
    grep -q '^    conda "${moduleDir}/environment.yml"$' "$dir/main.nf" || fail "$mod: no conda directive"
    grep -q '^    container "' "$dir/main.nf" || fail "$mod: no container directive"
    grep -q "process \"${mod^^}\"" "$dir/tests/main.nf.test" || fail "$mod: its nf-test does not test ${mod^^}"
    python3 - "$dir/main.nf" "$dir/meta.yml" "$dir/environment.yml" <<'EOF' || fail "$mod: meta.yml/environment.yml"
import re, sys, yaml
main, meta, env = open(sys.argv[1]).read(), yaml.safe_load(open(sys.argv[2])), yaml.safe_load(open(sys.argv[3]))
block = re.search(r"^    input:\n(.*?)^    output:", main, re.S | re.M).group(1)
inputs = re.findall(r"(?:val|path)\((\w+)", block)
named = set()
for group in meta["input"]:
    for item in group if isinstance(group, list) else [group]:
        named.update(item.keys())
missing = [i for i in inputs if i not in named]
assert not missing, f"meta.yml does not describe the inputs {missing}"
assert meta["name"] == sys.argv[1].split("/")[-2], meta["name"]
assert any("moe-genomics" in d for d in env["dependencies"]), env
EOF
done

# The parameter and sample-sheet schemas are valid JSON Schema 2020-12, every parameter of the
# schema is one of nextflow.config's, and the test sheet's rows pass (nf-schema's own
# keywords - format/exists/meta/errorMessage/uniqueEntries - are not checked here).
python3 - "$nf" "$src" <<'EOF' || fail "nextflow_schema.json / assets/schema_input.json"
import csv, json, os, re, sys
from jsonschema import Draft202012Validator
nf, src = sys.argv[1:]
params = json.load(open(f"{nf}/nextflow_schema.json"))
rows_schema = json.load(open(f"{nf}/assets/schema_input.json"))
for s in (params, rows_schema):
    Draft202012Validator.check_schema(s)
config = open(f"{nf}/nextflow.config").read()
for k in (k for d in params["$defs"].values() for k in d["properties"]):
    assert f"\n    {k} " in config, f"nextflow_schema.json's {k} is not in nextflow.config's params"
rows = [{k: v for k, v in r.items() if v} for r in csv.DictReader(open(f"{nf}/assets/samplesheet_test.csv"))]
Draft202012Validator(rows_schema).validate(rows)
for r in rows:
    assert os.path.exists(os.path.join(src, r["path"])), r  # relative to the checkout's top
test_conf = open(f"{nf}/conf/test.config").read()
for rel in re.findall(r'"\$\{projectDir\}/([^"]+)"', test_conf):  # the test profile's files
    assert os.path.exists(os.path.join(nf, rel)), f"conf/test.config names a missing {rel}"
assert "vcf " in test_conf, "the test profile should score variants (params.vcf)"
bad = [{"sample": "bad name", "path": "x.fa"}]
assert list(Draft202012Validator(rows_schema).iter_errors(bad)), "a sample name with a space passed"
EOF
echo "PASS pipeline_nextflow ($((SECONDS - start)) s)"
