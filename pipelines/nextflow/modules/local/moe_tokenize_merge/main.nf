// MOE_TOKENIZE_MERGE: the shards of one file's MOE_TOKENIZE parts (--part 1/N .. N/N) -> the
// shard(s) one MOE_TOKENIZE task on the whole file writes, byte for byte.
//
// nf-core style module: options come from task.ext.args (conf/modules.config), the output name
// from task.ext.prefix (default meta.id). The one thing to know: `moe-tokenize merge` reads its
// arguments as parts 1..N, so `shards` must come in part order (main.nf sorts them by
// meta.part); each part's validation shard (${part}.val.mtok, from --val-fraction) is staged
// beside it in `vals` ([] for none), where merge finds it, and joined into ${prefix}.val.mtok.
process MOE_TOKENIZE_MERGE {
    tag "$meta.id"
    label 'process_low'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(shards), path(vals)

    output:
    tuple val(meta), path("${prefix}.mtok")    , emit: shards
    tuple val(meta), path("${prefix}.val.mtok"), emit: val, optional: true
    tuple val("${task.process}"), val('moe-tokenize'), eval("moe-tokenize --version | head -n 1 | sed 's/^moe-tokenize (moe-genomics) //'"), emit: versions_moe_tokenize, topic: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    moe-tokenize merge \\
        $args \\
        -o ${prefix}.mtok \\
        $shards
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.mtok
    """
}
