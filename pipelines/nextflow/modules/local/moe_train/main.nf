// MOE_TRAIN: token shards (+ validation shards) and a YAML config -> a training run directory
// (ckpt-<step>/ checkpoints, `latest`, metrics.jsonl, loss.svg).
//
// nf-core style module. task.ext.args carries moe-train options and key=value config
// overrides (e.g. 'train.steps=400 device=cuda'). The one thing to know: the shards given are
// staged into one directory, shards/, and moe-train trains on every *.mtok there and
// validates on every *.val.mtok - only the staged ones, so all must come from one tokenizer
// setup.
process MOE_TRAIN {
    tag "$meta.id"
    label 'process_high'

    conda "${moduleDir}/environment.yml"
    container "moe-genomics:0.1.0"

    input:
    tuple val(meta), path(shards, stageAs: 'shards/*')
    path config

    output:
    tuple val(meta), path("${prefix}")              , emit: run
    tuple val(meta), path("${prefix}/metrics.jsonl"), emit: metrics
    tuple val(meta), path("${prefix}/loss.svg")     , emit: loss_plot
    tuple val("${task.process}"), val('moe-train'), eval("moe-train --version | head -n 1 | sed 's/^moe-train (moe-genomics) //'"), emit: versions_moe_train, topic: versions

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
    """

    stub:
    prefix = task.ext.prefix ?: "${meta.id}"
    """
    mkdir -p ${prefix}/ckpt-00000000
    touch ${prefix}/metrics.jsonl ${prefix}/loss.svg
    echo ckpt-00000000 > ${prefix}/latest
    """
}
