#!/usr/bin/env nextflow
// main.nf: the moe-genomics Nextflow (DSL2) workflow - a sample sheet of sequence files ->
// token shards -> one trained MoE checkpoint -> per-sample embeddings and log-likelihoods, and
// the variant-effect scores of a VCF (--vcf, on the reference --fasta/--fasta_fai).
//
//   MOE_TOKENIZE (per sample) -> MOE_TRAIN (all shards together) -> MOE_EMBED (per sample)
//                                                                -> MOE_SCORE (per sample)
//                                                                -> MOE_SCORE_VARIANTS (--vcf)
//
// Run:  nextflow run pipelines/nextflow -profile test      (lambda phage, 20 steps; from the
//                                                          checkout's top directory)
//       nextflow run pipelines/nextflow --input samplesheet.csv --outdir results
// The one thing to know: every module's script is a single moe-* command; the options live in
// conf/modules.config as ext.args, so a run is changed there (or with -c my.config), not here.
nextflow.enable.dsl = 2

include { validateParameters; samplesheetToList } from 'plugin/nf-schema'
include { MOE_TOKENIZE } from './modules/local/moe_tokenize/main'
include { MOE_TRAIN    } from './modules/local/moe_train/main'
include { MOE_EMBED    } from './modules/local/moe_embed/main'
include { MOE_SCORE    } from './modules/local/moe_score/main'
include { MOE_SCORE_VARIANTS } from './modules/local/moe_score_variants/main'

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

    MOE_TOKENIZE(ch_seqs, ch_ref)

    // The training and validation shards of all samples go to one training run.
    ch_shards = MOE_TOKENIZE.out.shards
        .mix(MOE_TOKENIZE.out.val)
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
