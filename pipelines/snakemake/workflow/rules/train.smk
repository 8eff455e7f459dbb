# train.smk: the shard manifest of the samples in the sheet, one moe-train run on it, and the
# loss plot for `snakemake --report`.
#
# The one thing to know: moe-train gets `--data MANIFEST`, a moe-token-shards manifest that
# lists exactly this run's declared shards (docs/formats.md), never the tokens/ directory,
# which may still hold shards of samples removed from the sheet. `train` starts a fresh run
# directory each time (Snakemake removes the old one first). The run is not protected():
# Snakemake 7.21 fails to write-protect a directory output with subdirectories (ckpt-*/;
# snakemake/snakemake#2130), see the README.


rule shard_manifest:
    input:
        shards=expand(f"{OUT}/tokens/{{sample}}.mtok", sample=SAMPLES),
        val=expand(f"{OUT}/tokens/{{sample}}.val.mtok", sample=SAMPLES) if WITH_VAL else [],
    output:
        f"{OUT}/tokens/train.manifest.json",
    log:
        f"{OUT}/logs/shard_manifest.log",
    conda:
        "../envs/python.yaml"
    script:
        "../scripts/shard_manifest.py"


rule train:
    input:
        manifest=f"{OUT}/tokens/train.manifest.json",
        config=TRAIN["config"],
    output:
        run=directory(f"{OUT}/run"),
    params:
        overrides=train_overrides(),
        args=TRAIN["args"],
    threads: TRAIN["threads"]
    resources:
        mem_mb=TRAIN["mem_mb"],
        gpus=TRAIN["gpus"],
    log:
        f"{OUT}/logs/train.log",
    benchmark:
        f"{OUT}/benchmarks/train.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-train -c {input.config} --data {input.manifest} -o {output.run} -@ {threads} "
        "{params.args} {params.overrides} 2> {log}"


rule loss_plot:
    input:
        run=f"{OUT}/run",
    output:
        report(
            f"{OUT}/report/loss.svg",
            caption="../report/loss.rst",
            category="Training",
        ),
    log:
        f"{OUT}/logs/loss_plot.log",
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "cp {input.run}/loss.svg {output} 2> {log}"
