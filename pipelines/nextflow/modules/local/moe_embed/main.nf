// MOE_EMBED: sequences + a trained run (or checkpoint) directory -> an embedding matrix
// (${prefix}.npy, float32 [rows, hidden]) and its row index (${prefix}.ids.tsv).
//
// nf-core style module. task.ext.args carries moe-embed options (windows, pooling, layer,
// e.g. '--window 1000 --stride 1000 --per-window'). The input's index and the CRAM reference
// are staged as in MOE_TOKENIZE ([] and [[], [], []] for none). The one thing to know: the
// model input may be a run directory (its `latest` checkpoint is used) or one ckpt-<step>/.
process MOE_EMBED {
    tag "$meta.id"
    label 'process_medium'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(seqs), path(index)
    tuple val(meta2), path(model)
    tuple val(meta3), path(fasta), path(fai)

    output:
    tuple val(meta), path("${prefix}.npy"), path("${prefix}.ids.tsv"), emit: embeddings
    tuple val("${task.process}"), val('moe-embed'), eval("moe-embed --version | head -n 1 | sed 's/^moe-embed (moe-genomics) //'"), emit: versions_moe_embed, topic: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    def reference = fasta ? "--reference ${fasta}" : ''
    """
    moe-embed \\
        -m $model \\
        -@ $task.cpus \\
        $reference \\
        $args \\
        -o ${prefix}.npy \\
        $seqs
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.npy ${prefix}.ids.tsv
    """
}
