// MOE_TOKENIZE: one sequence file (FASTA/FASTQ/SAM/BAM/CRAM) -> token shard(s) for moe-train.
//
// nf-core style module: options come from task.ext.args (set in nextflow.config), the output
// name from task.ext.prefix (default meta.id). The one thing to know: with --val-fraction in
// ext.args, records whose name hash falls below the fraction go to ${prefix}.val.mtok, which
// moe-train picks up as validation data when both files sit in its --data directory.
// Records split whole, so a single-record genome needs non-overlapping windows
// (--window 1000, as the default config sets) to get a validation part.
process MOE_TOKENIZE {
    tag "$meta.id"
    label 'process_low'

    input:
    tuple val(meta), path(reads)

    output:
    tuple val(meta), path("${prefix}.mtok")    , emit: shards
    tuple val(meta), path("${prefix}.val.mtok"), emit: val, optional: true
    path "versions.yml"                        , emit: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    moe-tokenize \\
        -@ $task.cpus \\
        $args \\
        -o ${prefix}.mtok \\
        $reads

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-tokenize: \$(moe-tokenize --version | head -n 1 | sed 's/^moe-tokenize (moe-genomics) //')
    END_VERSIONS
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.mtok

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-tokenize: \$(moe-tokenize --version | head -n 1 | sed 's/^moe-tokenize (moe-genomics) //')
    END_VERSIONS
    """
}
