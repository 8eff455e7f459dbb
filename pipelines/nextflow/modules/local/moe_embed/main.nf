// MOE_EMBED: sequences + a trained run (or checkpoint) directory -> an embedding matrix
// (${prefix}.npy, float32 [rows, hidden]) and its row index (${prefix}.ids.tsv).
//
// nf-core style module. task.ext.args carries moe-embed options (windows, pooling, layer,
// e.g. '--window 1000 --stride 1000 --per-window'). The one thing to know: the model input
// may be a run directory (its `latest` checkpoint is used) or one ckpt-<step>/ directory.
process MOE_EMBED {
    tag "$meta.id"
    label 'process_medium'

    input:
    tuple val(meta), path(seqs)
    tuple val(meta2), path(model)

    output:
    tuple val(meta), path("${prefix}.npy"), path("${prefix}.ids.tsv"), emit: embeddings
    path "versions.yml"                                              , emit: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    moe-embed \\
        -m $model \\
        -@ $task.cpus \\
        $args \\
        -o ${prefix}.npy \\
        $seqs

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-embed: \$(moe-embed --version | head -n 1 | sed 's/^moe-embed (moe-genomics) //')
    END_VERSIONS
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.npy ${prefix}.ids.tsv

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-embed: \$(moe-embed --version | head -n 1 | sed 's/^moe-embed (moe-genomics) //')
    END_VERSIONS
    """
}
