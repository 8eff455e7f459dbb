#!/usr/bin/env bash
# pipeline_nextflow.sh: the Nextflow modules' command lines, run by bash on lambda phage.
#
# Nextflow is not installable here, so this test does what Nextflow would do with each
# process of pipelines/nextflow/modules/local/moe_{tokenize,train,embed}/main.nf: take the
# script: (and the stub:) block, strip its indentation, interpolate the Groovy variables
# ($args from the `test` profile's ext.args in nextflow.config, $task.cpus, $prefix, the
# inputs), stage the inputs into a task directory under their names and run it with
# `bash -euo pipefail` (nextflow.config's process.shell). Then it checks the outputs each
# module declares and that versions.yml reports the tools' version. The one thing to know: an
# unknown Groovy variable in a script block fails the test, so the modules and this test move
# together.
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

# ext_args PROCESS : ext.args under withName: 'PROCESS' in the `test` profile of
# nextflow.config, else in the top-level process scope (as `-profile test` resolves it).
ext_args() {
    python3 - "$nf/nextflow.config" "$1" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
top, _, profiles = text.partition("\nprofiles {")
test = re.search(r"^    test \{\n(.*?)^    \}", profiles, re.S | re.M)
pat = r"withName:\s*'" + sys.argv[2] + r"'\s*\{[^}]*?ext\.args\s*=\s*'([^']*)'"
for scope in ([test.group(1)] if test else []) + [top]:
    found = re.findall(pat, scope)
    if found:
        print(found[-1])
        sys.exit(0)
sys.exit(f"nextflow.config: no ext.args for {sys.argv[2]}")
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
check_versions() { # DIR TOOL
    grep -q "^    $2: 0\.1\.0$" "$1/versions.yml" || { cat "$1/versions.yml"; fail "$1/versions.yml"; }
}

[ -n "${MOE_BUILD_DIR:-}" ] && PATH="$MOE_BUILD_DIR:$PATH"
start=$SECONDS

# MOE_TOKENIZE: tuple val(meta), path(reads); meta.id = lambda
mkdir tok && ln -s "$lambda" tok/lambda_virus.fa.gz
run_task tok moe_tokenize script args="$(ext_args MOE_TOKENIZE)" task.cpus=1 prefix=lambda \
    meta.id=lambda reads=lambda_virus.fa.gz task.process=MOE_TOKENIZE
[ -s tok/lambda.mtok ] || fail "MOE_TOKENIZE: no lambda.mtok"
check_versions tok moe-tokenize

# MOE_TRAIN: tuple val(meta), path(shards, stageAs: 'shards/*'); path config
mkdir -p train/shards && ln -s "$PWD"/tok/*.mtok train/shards/ && ln -s "$src/configs/tiny.yaml" train/
run_task train moe_train script args="$(ext_args MOE_TRAIN)" task.cpus=2 prefix=run \
    meta.id=run config=tiny.yaml task.process=MOE_TRAIN
for f in run/latest run/metrics.jsonl run/loss.svg; do [ -s "train/$f" ] || fail "MOE_TRAIN: no $f"; done
[ "$(wc -l <train/run/metrics.jsonl)" -eq 20 ] || fail "MOE_TRAIN: test profile should train 20 steps"
check_versions train moe-train

# MOE_EMBED: tuple val(meta), path(seqs); tuple val(meta2), path(model). The first 10.5 kb
# of lambda (embedding is the slow step under ASan) -> 11 windows of up to 1 kb.
mkdir emb && ln -s "$PWD/train/run" emb/run
gzip -dc "$lambda" | awk 'NR == 1 { print; next } { s = s $0 } END { print substr(s, 1, 10500) }' \
    >emb/lambda_head.fa
run_task emb moe_embed script args="$(ext_args MOE_EMBED)" task.cpus=2 prefix=lambda \
    meta.id=lambda seqs=lambda_head.fa model=run task.process=MOE_EMBED
rows=$(head -c 128 emb/lambda.npy | tr -d '\0' | grep -ao "'shape': ([0-9]*" | grep -o '[0-9]*$')
[ "$rows" = 11 ] || fail "MOE_EMBED: lambda.npy has '$rows' rows, expected 11 (1 kb windows)"
[ "$(wc -l <emb/lambda.ids.tsv)" = 12 ] || fail "MOE_EMBED: lambda.ids.tsv should have 11 rows + header"
check_versions emb moe-embed

# The stub: blocks (nextflow -stub-run) must run too and create the declared outputs.
for m in tokenize:lambda.mtok train:run/latest embed:lambda.ids.tsv; do
    mod=moe_${m%%:*} out=${m##*:}
    mkdir "stub_$mod"
    run_task "stub_$mod" "$mod" stub prefix="${out%%[./]*}" meta.id=x task.process="${mod^^}"
    [ -e "stub_$mod/$out" ] || fail "$mod stub: no $out"
done

# main.nf includes exactly these modules, from files that exist.
grep -o "include { [A-Z_]* *} from '[^']*'" "$nf/main.nf" | while read -r _ _ name _ _ path; do
    path=${path//\'/}
    [ -f "$nf/$path.nf" ] || fail "main.nf includes $name from missing $path.nf"
    grep -q "^process $name {" "$nf/$path.nf" || fail "$path.nf does not define process $name"
done
[ "$(grep -c '^include {' "$nf/main.nf")" = 3 ] || fail "main.nf should include the three modules"
echo "PASS pipeline_nextflow ($((SECONDS - start)) s)"
