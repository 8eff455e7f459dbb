// MOE_TOKENIZE: one sequence file (FASTA/FASTQ/SAM/BAM/CRAM) -> token shard(s) for moe-train.
//
// nf-core style module: options come from task.ext.args (conf/modules.config), the output name
// from task.ext.prefix (default meta.id). The input's index (.fai/.bai/.csi/.crai, or [] for
// none) and the CRAM reference with its .fai ([[], [], []] for none) are staged beside it, so
// `-r`/`--regions-file` in ext.args and CRAM inputs work inside the task. The one thing to
// know: with --val-fraction in ext.args, records whose name hash falls below the fraction go
// to ${prefix}.val.mtok, which moe-train picks up as validation data when both files sit in
// its --data directory. Records split whole, so a single-record genome needs non-overlapping
// windows (--window 1000, as the default config sets) to get a validation part. With meta.part
// and meta.parts set (I and N), the task tokenizes only part I of N of the file
// (`moe-tokenize --part I/N`) into ${prefix}.I.mtok, for MOE_TOKENIZE_MERGE to join; parts and
// whole files share this process, so they share its ext.args, as merge and moe-train require.
process MOE_TOKENIZE {
    tag "${meta.id}${meta.parts ? " part ${meta.part}/${meta.parts}" : ''}"
    label 'process_low'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(reads), path(index)
    tuple val(meta2), path(fasta), path(fai)

    output:
    tuple val(meta), path("${prefix}.mtok")    , emit: shards
    tuple val(meta), path("${prefix}.val.mtok"), emit: val, optional: true
    tuple val("${task.process}"), val('moe-tokenize'), eval("moe-tokenize --version | head -n 1 | sed 's/^moe-tokenize (moe-genomics) //'"), emit: versions_moe_tokenize, topic: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = (task.ext.prefix ?: "${meta.id}") + (meta.parts ? ".${meta.part}" : '')
    def reference = fasta ? "--reference ${fasta}" : ''
    def part = meta.parts ? "--part ${meta.part}/${meta.parts}" : ''
    """
    moe-tokenize \\
        -@ $task.cpus \\
        $part \\
        $reference \\
        $args \\
        -o ${prefix}.mtok \\
        $reads
    """

    stub:
    prefix = (task.ext.prefix ?: "${meta.id}") + (meta.parts ? ".${meta.part}" : '')
    """
    touch ${prefix}.mtok
    """
}
