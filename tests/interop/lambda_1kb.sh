# shellcheck shell=bash
# lambda_1kb.sh, sourced by the training e2e scripts: writes lambda_1kb.fa in the current
# directory, the lambda phage genome (data/lambda_virus.fa.gz, else Debian's bowtie2-examples
# copy) cut into 1 kb records lambda_1, lambda_2, ...; the sourcing script exits 77 (skipped)
# when neither copy exists.
lambda_fa=${MOE_SRC_DIR:?}/data/lambda_virus.fa.gz
[ -f "$lambda_fa" ] || lambda_fa=/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz
[ -f "$lambda_fa" ] || { echo "skip: lambda_virus.fa.gz not found (data/ or bowtie2-examples)"; exit 77; }
source "$MOE_SRC_DIR/tests/interop/records_1kb.sh"
records_1kb "$lambda_fa" lambda lambda_1kb.fa
