# tokenize.smk: one moe-tokenize job per sample of the sheet.
#
# Output: {outdir}/tokens/{sample}.mtok, and {sample}.val.mtok when tokenize.val_fraction > 0
# (moe-tokenize then always writes it, possibly with no documents). The one thing to know:
# all samples share one set of tokenizer options (tokenize.args), because they train one model.


rule tokenize:
    input:
        lambda wc: SAMPLES[wc.sample],
    output:
        **tokenize_outputs(),
    params:
        args=TOK["args"],
        val_fraction=TOK["val_fraction"],
    threads: TOK["threads"]
    resources:
        mem_mb=TOK["mem_mb"],
    log:
        f"{OUT}/logs/tokenize.{{sample}}.log",
    benchmark:
        f"{OUT}/benchmarks/tokenize.{{sample}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-tokenize -@ {threads} --val-fraction {params.val_fraction} {params.args} "
        "-o {output.shard} {input} 2> {log}"
