// MOE_TRAIN: token shards (+ validation shards) and a YAML config -> a training run directory
// (ckpt-<step>/ checkpoints, `latest`, metrics.jsonl, loss.svg).
//
// nf-core style module. task.ext.args carries moe-train options and key=value config
// overrides (e.g. 'train.steps=400 device=cuda'). The one thing to know: every shard is
// staged into one directory, shards/, because `moe-train --data DIR` trains on every *.mtok
// there and validates on every *.val.mtok - so all shards must come from one tokenizer setup.
process MOE_TRAIN {
    tag "$meta.id"
    label 'process_high'

    input:
    tuple val(meta), path(shards, stageAs: 'shards/*')
    path config

    output:
    tuple val(meta), path("${prefix}")              , emit: run
    tuple val(meta), path("${prefix}/metrics.jsonl"), emit: metrics
    tuple val(meta), path("${prefix}/loss.svg")     , emit: loss_plot
    path "versions.yml"                             , emit: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    moe-train \\
        -c $config \\
        --data shards \\
        -o ${prefix} \\
        -@ $task.cpus \\
        $args

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-train: \$(moe-train --version | head -n 1 | sed 's/^moe-train (moe-genomics) //')
    END_VERSIONS
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    mkdir -p ${prefix}/ckpt-00000000
    touch ${prefix}/metrics.jsonl ${prefix}/loss.svg
    echo ckpt-00000000 > ${prefix}/latest

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        moe-train: \$(moe-train --version | head -n 1 | sed 's/^moe-train (moe-genomics) //')
    END_VERSIONS
    """
}
