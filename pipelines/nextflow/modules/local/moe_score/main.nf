// MOE_SCORE: sequences + a trained run (or checkpoint) directory -> the log-likelihood of every
// sequence (${prefix}.ll.tsv: a #@PG provenance line, a header, then name length
// log_likelihood bits_per_base perplexity per sequence).
//
// nf-core style module. task.ext.args carries `moe-score seq` options (e.g. '--context 512
// --rc-average'); the input's index and the CRAM reference are staged as in MOE_TOKENIZE ([]
// and [[], [], []] for none). The one thing to know: the output is the TSV, so --per-position
// (which writes a .npy) does not belong in ext.args here.
process MOE_SCORE {
    tag "$meta.id"
    label 'process_medium'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(seqs), path(index)
    tuple val(meta2), path(model)
    tuple val(meta3), path(fasta), path(fai)

    output:
    tuple val(meta), path("${prefix}.ll.tsv"), emit: scores
    tuple val("${task.process}"), val('moe-score'), eval("moe-score --version | head -n 1 | sed 's/^moe-score (moe-genomics) //'"), emit: versions_moe_score, topic: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    def reference = fasta ? "--reference ${fasta}" : ''
    """
    moe-score seq \\
        -m $model \\
        -@ $task.cpus \\
        $reference \\
        $args \\
        -o ${prefix}.ll.tsv \\
        $seqs
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.ll.tsv
    """
}
