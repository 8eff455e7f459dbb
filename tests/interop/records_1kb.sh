# shellcheck shell=bash
# records_1kb.sh, sourced by the training e2e scripts: records_1kb GZ PREFIX OUT writes OUT, the
# bases of every record of the gzipped FASTA GZ joined and cut into 1 kb records PREFIX_1,
# PREFIX_2, ... (moe-tokenize --val-fraction holds records out by name, so a genome cut this
# way gives a validation set spread over it).
records_1kb() {
    gzip -dc "$1" | awk -v p="$2" '/^>/ {next} {s = s $0}
        END {for (i = 1; i <= length(s); i += 1000) printf(">%s_%d\n%s\n", p, (i - 1) / 1000 + 1, substr(s, i, 1000))}' \
        > "$3"
}
