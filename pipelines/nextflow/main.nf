#!/usr/bin/env nextflow
// main.nf: the moe-genomics Nextflow (DSL2) workflow - a sample sheet of sequence files ->
// token shards -> one trained MoE checkpoint -> per-sample embeddings and log-likelihoods, and
// the variant-effect scores of a VCF (--vcf, on the reference --fasta/--fasta_fai).
//
//   MOE_TOKENIZE (per sample) -> MOE_TRAIN (all shards together) -> MOE_EMBED (per sample)
//                                                                -> MOE_SCORE (per sample)
//                                                                -> MOE_SCORE_VARIANTS (--vcf)
//   A file over --tokenize_parts_min_mb goes through MOE_TOKENIZE per part (--tokenize_parts)
//   and MOE_TOKENIZE_MERGE instead, which writes the bytes one MOE_TOKENIZE task would.
//
// Run:  nextflow run pipelines/nextflow -profile test      (lambda phage, 20 steps; from the
//                                                          checkout's top directory)
//       nextflow run pipelines/nextflow --input samplesheet.csv --outdir results
// The one thing to know: every module's script is a single moe-* command; the options live in
// conf/modules.config as ext.args, so a run is changed there (or with -c my.config), not here.
nextflow.enable.dsl = 2

include { validateParameters; samplesheetToList } from 'plugin/nf-schema'
include { MOE_TOKENIZE } from './modules/local/moe_tokenize/main'
include { MOE_TOKENIZE_MERGE } from './modules/local/moe_tokenize_merge/main'
include { MOE_TRAIN    } from './modules/local/moe_train/main'
include { MOE_EMBED    } from './modules/local/moe_embed/main'
include { MOE_SCORE    } from './modules/local/moe_score/main'
include { MOE_SCORE_VARIANTS } from './modules/local/moe_score_variants/main'

// How many MOE_TOKENIZE tasks tokenize the file at path: --tokenize_parts when it is larger
// than --tokenize_parts_min_mb megabytes, else 1. SAM text is never split (--part refuses it).
def tokenizeParts(path) {
    def big = path.size() > params.tokenize_parts_min_mb * 1e6
    def sam = path.name ==~ /.*\.sam(\.gz)?/
    return big && !sam ? params.tokenize_parts : 1
}

workflow {
    validateParameters()   // against nextflow_schema.json

    // [ meta, file, index or [] ] per row of the sheet (assets/schema_input.json).
    ch_seqs = channel
        .fromList(samplesheetToList(params.input, "${projectDir}/assets/schema_input.json"))
        .map { meta, path, index -> [ meta, path, index ?: [] ] }

    // The CRAM reference, [ meta, fasta, fai ], or empty lists when there is none (an optional input).
    ch_ref = params.fasta
        ? channel.value([ [ id: file(params.fasta).baseName ], file(params.fasta, checkIfExists: true),
                          params.fasta_fai ? file(params.fasta_fai, checkIfExists: true) : [] ])
        : channel.value([ [], [], [] ])

    // One task per sample, or one per part of a large file: meta.part = I of meta.parts = N
    // (moe-tokenize --part I/N, see the module).
    ch_tokenize = ch_seqs.flatMap { meta, path, index ->
        def n = tokenizeParts(path)
        n == 1 ? [ [ meta, path, index ] ]
               : (1..n).collect { i -> [ meta + [ part: i, parts: n ], path, index ] }
    }

    MOE_TOKENIZE(ch_tokenize, ch_ref)

    // A split file's parts, merged in part order. groupTuple waits for all N parts of a sample
    // (groupKey's size) but lists them in the order the tasks finished, so they are sorted by
    // meta.part before they reach merge, which reads its arguments as parts 1..N. A part's
    // validation shard (null without --val-fraction) travels with it.
    ch_parts = MOE_TOKENIZE.out.shards
        .join(MOE_TOKENIZE.out.val, remainder: true)
        .filter { meta, shard, val -> meta.parts }
        .map { meta, shard, val ->
            def sample = meta.findAll { key, value -> !(key in [ 'part', 'parts' ]) }
            [ groupKey(sample, meta.parts), [ meta.part, shard, val ] ]
        }
        .groupTuple()
        .map { sample, parts ->
            def ordered = parts.sort { part -> part[0] }
            [ sample.getGroupTarget(), ordered.collect { part -> part[1] },
              ordered.collect { part -> part[2] }.findAll { val -> val != null } ]
        }

    MOE_TOKENIZE_MERGE(ch_parts)

    // The training and validation shards of all samples go to one training run: a whole
    // file's from MOE_TOKENIZE, a split one's from MOE_TOKENIZE_MERGE.
    ch_shards = MOE_TOKENIZE.out.shards
        .mix(MOE_TOKENIZE.out.val)
        .filter { meta, shard -> !meta.parts }
        .mix(MOE_TOKENIZE_MERGE.out.shards, MOE_TOKENIZE_MERGE.out.val)
        .map { meta, shard -> shard }
        .collect()
        .map { shards -> [ [ id: params.run_name ], shards ] }

    MOE_TRAIN(ch_shards, file(params.model_config, checkIfExists: true))

    MOE_EMBED(ch_seqs, MOE_TRAIN.out.run.first(), ch_ref)

    MOE_SCORE(ch_seqs, MOE_TRAIN.out.run.first(), ch_ref)

    // The variants are scored on the reference: --vcf needs --fasta and its --fasta_fai.
    if (params.vcf) {
        if (!params.fasta || !params.fasta_fai) {
            error "--vcf ${params.vcf} needs the reference the variants are on: --fasta REF.fa --fasta_fai REF.fa.fai (samtools faidx)"
        }
        ch_vcf = channel.value([ [ id: file(params.vcf).simpleName ], file(params.vcf, checkIfExists: true) ])
        MOE_SCORE_VARIANTS(ch_vcf, MOE_TRAIN.out.run.first(), ch_ref)
    }

    // Tool versions, the nf-core way: every module emits (process, tool, version) on the
    // `versions` topic.
    channel.topic('versions')
        .unique()
        .map { process, tool, version -> "${process.tokenize(':')[-1]}:\n    ${tool}: ${version}\n" }
        .collectFile(name: 'software_versions.yml', storeDir: "${params.outdir}/pipeline_info", sort: true)
}
