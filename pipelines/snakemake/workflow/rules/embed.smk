# embed.smk: one moe-embed job per sample with the trained run's latest checkpoint.
#
# Output: {outdir}/embeddings/{sample}.npy (float32 [rows, hidden]) and {sample}.ids.tsv
# (row -> sequence, window). The one thing to know: embed.args sets the windows and pooling
# for every sample alike.


rule embed:
    input:
        seqs=lambda wc: SAMPLES[wc.sample],
        run=f"{OUT}/run",
    output:
        npy=f"{OUT}/embeddings/{{sample}}.npy",
        ids=f"{OUT}/embeddings/{{sample}}.ids.tsv",
    params:
        args=EMBED["args"],
    threads: EMBED["threads"]
    resources:
        mem_mb=EMBED["mem_mb"],
    log:
        f"{OUT}/logs/embed.{{sample}}.log",
    benchmark:
        f"{OUT}/benchmarks/embed.{{sample}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-embed -m {input.run} -@ {threads} {params.args} -o {output.npy} {input.seqs} 2> {log}"
