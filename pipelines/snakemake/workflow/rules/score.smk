# score.smk: moe-score with the trained run - the log-likelihood of every sample's sequences,
# and the variant-effect scores (INFO/MOE_LLR) of the VCFs listed under score.vcfs.
#
# Outputs: {outdir}/scores/{sample}.ll.tsv (a #@PG provenance line, a header, one row per
# sequence: name length log_likelihood bits_per_base perplexity) and, per entry of
# score.vcfs, {outdir}/scores/{vcf}.vcf.gz (bgzip VCF with INFO/MOE_LLR and a ##moe_score
# header line). The one thing to know: the reference of the VCFs (score.fasta) and its .fai
# are declared inputs (functions, so that a config without VCFs needs no reference), and
# common.smk checks them before any job runs.


rule score:
    input:
        seqs=lambda wc: SAMPLES[wc.sample],
        run=f"{OUT}/run",
    output:
        f"{OUT}/scores/{{sample}}.ll.tsv",
    params:
        args=SCORE["args"],
    threads: SCORE["threads"]
    resources:
        mem_mb=SCORE["mem_mb"],
    log:
        f"{OUT}/logs/score.{{sample}}.log",
    benchmark:
        f"{OUT}/benchmarks/score.{{sample}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-score seq -m {input.run} -@ {threads} {params.args} -o {output} {input.seqs} 2> {log}"


rule score_variants:
    input:
        vcf=lambda wc: VCFS[wc.vcf],
        fasta=lambda wc: SCORE["fasta"],
        fai=lambda wc: f"{SCORE['fasta']}.fai",
        run=f"{OUT}/run",
    output:
        f"{OUT}/scores/{{vcf}}.vcf.gz",
    params:
        args=SCORE["variants_args"],
    threads: SCORE["threads"]
    resources:
        mem_mb=SCORE["mem_mb"],
    log:
        f"{OUT}/logs/score_variants.{{vcf}}.log",
    benchmark:
        f"{OUT}/benchmarks/score_variants.{{vcf}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-score variants -m {input.run} -@ {threads} -f {input.fasta} {params.args} "
        "-O z -o {output} {input.vcf} 2> {log}"
