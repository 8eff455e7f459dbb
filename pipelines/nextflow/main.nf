#!/usr/bin/env nextflow
// main.nf: the moe-genomics Nextflow (DSL2) workflow - sequence files -> token shards -> one
// trained MoE checkpoint -> per-sample embeddings.
//
//   MOE_TOKENIZE (per sample) -> MOE_TRAIN (all shards together) -> MOE_EMBED (per sample)
//
// Run:  nextflow run pipelines/nextflow -profile test      (lambda phage, 20 steps)
//       nextflow run pipelines/nextflow --input 'genomes/*.fa.gz' --outdir results
// The one thing to know: every module's script is a single moe-* command; the options live in
// nextflow.config as ext.args, so a run is changed there (or with -c my.config), not here.
nextflow.enable.dsl = 2

include { MOE_TOKENIZE } from './modules/local/moe_tokenize/main'
include { MOE_TRAIN    } from './modules/local/moe_train/main'
include { MOE_EMBED    } from './modules/local/moe_embed/main'

workflow {
    if (!params.input) {
        error "--input is required: a glob of FASTA/FASTQ/SAM/BAM/CRAM files, e.g. --input 'data/*.fa.gz'"
    }
    ch_versions = Channel.empty()

    // [ meta, file ]: the sample id is the file name without its extensions.
    ch_seqs = Channel
        .fromPath(params.input, checkIfExists: true)
        .map { f -> [ [ id: f.name.replaceFirst('\\.(fa|fasta|fna|fq|fastq|sam|bam|cram)(\\.gz)?$', '') ], f ] }

    MOE_TOKENIZE(ch_seqs)
    ch_versions = ch_versions.mix(MOE_TOKENIZE.out.versions.first())

    // All training and validation shards of all samples go to one training run.
    ch_shards = MOE_TOKENIZE.out.shards
        .mix(MOE_TOKENIZE.out.val)
        .map { meta, shard -> shard }
        .collect()
        .map { shards -> [ [ id: params.run_name ], shards ] }

    MOE_TRAIN(ch_shards, file(params.model_config, checkIfExists: true))
    ch_versions = ch_versions.mix(MOE_TRAIN.out.versions)

    MOE_EMBED(ch_seqs, MOE_TRAIN.out.run.first())
    ch_versions = ch_versions.mix(MOE_EMBED.out.versions.first())

    ch_versions
        .unique()
        .collectFile(name: 'software_versions.yml', storeDir: "${params.outdir}/pipeline_info")
}
