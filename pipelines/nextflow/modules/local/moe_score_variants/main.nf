// MOE_SCORE_VARIANTS: a VCF/BCF + a trained run (or checkpoint) directory + the reference the
// variants are on -> the same records as bgzip VCF with INFO/MOE_LLR (log P(ALT window) -
// log P(REF window), nats, one value per ALT) and a ##moe_score header line.
//
// nf-core style module. task.ext.args carries `moe-score variants` options (e.g. '--window
// 8192 --rc-average', '-r chr1'); the reference and its .fai are staged beside each other
// (faidx needs both). The one thing to know: the output is named ${prefix}.vcf.gz with the
// prefix "${meta.id}.scored" by default, so it never takes the name of a staged input
// ${meta.id}.vcf.gz.
process MOE_SCORE_VARIANTS {
    tag "$meta.id"
    label 'process_medium'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(vcf)
    tuple val(meta2), path(model)
    tuple val(meta3), path(fasta), path(fai)

    output:
    tuple val(meta), path("${prefix}.vcf.gz"), emit: vcf
    tuple val("${task.process}"), val('moe-score'), eval("moe-score --version | head -n 1 | sed 's/^moe-score (moe-genomics) //'"), emit: versions_moe_score, topic: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}.scored"
    """
    moe-score variants \\
        -m $model \\
        -@ $task.cpus \\
        -f $fasta \\
        $args \\
        -O z \\
        -o ${prefix}.vcf.gz \\
        $vcf
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}.scored"
    """
    echo | gzip > ${prefix}.vcf.gz
    """
}
