# tokenize.smk: one moe-tokenize job per sample of the sheet; a sample whose input is larger
# than tokenize.parts_min_mb is tokenized by tokenize.parts jobs (`moe-tokenize --part I/N`)
# whose outputs `moe-tokenize merge` joins.
#
# Output: {outdir}/tokens/{sample}.mtok, and {sample}.val.mtok when tokenize.val_fraction > 0
# (moe-tokenize then always writes it, possibly with no documents); the parts lie in
# tokens/parts/ until the merge has run. The one thing to know: all samples share one set of
# tokenizer options (tokenize.args), because they train one model, and a merged shard is
# byte for byte what one job writes (docs/cli.md "Splitting one input across jobs").


rule tokenize:
    input:
        lambda wc: SAMPLES[wc.sample],
    output:
        **tokenize_outputs(),
    wildcard_constraints:
        sample=sample_regex(WHOLE),
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


rule tokenize_part:
    input:
        lambda wc: SAMPLES[wc.sample],
    output:
        **{k: temp(v) for k, v in tokenize_outputs(f"{OUT}/tokens/parts/{{sample}}.{{part}}").items()},
    wildcard_constraints:
        sample=sample_regex(SPLIT),
    params:
        args=TOK["args"],
        val_fraction=TOK["val_fraction"],
        parts=lambda wc: tokenize_parts(wc.sample),
    threads: TOK["threads"]
    resources:
        mem_mb=TOK["mem_mb"],
    log:
        f"{OUT}/logs/tokenize_part.{{sample}}.{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/tokenize_part.{{sample}}.{{part}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-tokenize -@ {threads} --part {wildcards.part}/{params.parts} "
        "--val-fraction {params.val_fraction} {params.args} -o {output.shard} {input} 2> {log}"


rule tokenize_merge:
    input:
        # the validation parts too: merge reads each part's companion
        lambda wc: [
            f
            for i in range(1, tokenize_parts(wc.sample) + 1)
            for f in tokenize_outputs(f"{OUT}/tokens/parts/{wc.sample}.{i}").values()
        ],
    output:
        **tokenize_outputs(),
    wildcard_constraints:
        sample=sample_regex(SPLIT),
    params:
        shards=lambda wc: [
            f"{OUT}/tokens/parts/{wc.sample}.{i}.mtok"
            for i in range(1, tokenize_parts(wc.sample) + 1)
        ],
    resources:
        mem_mb=TOK["mem_mb"],
    log:
        f"{OUT}/logs/tokenize_merge.{{sample}}.log",
    benchmark:
        f"{OUT}/benchmarks/tokenize_merge.{{sample}}.tsv"
    conda:
        "../envs/moe-genomics.yaml"
    shell:
        "moe-tokenize merge -o {output.shard} {params.shards} 2> {log}"
