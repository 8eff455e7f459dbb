/* score_vcf: what score_vcf.c (records, windows, scores) and score_vcf_out.c (the scored
 * VCF/BCF or TSV) share. Private to libcore. */
#ifndef MOE_SCORE_VCF_H
#define MOE_SCORE_VCF_H

#include <stdint.h>

#include <htslib/vcf.h>

#include "moe/fileio.h"
#include "moe/score.h"

typedef struct vcf_meta {        /* what the ##moe_score header line records */
    const char *model, *ckpt_id; /* the checkpoint's directory and its moe_ckpt_id */
    const char *tokenizer, *command;
    const char *pg; /* the TSV's first line (score_model_pg_line) */
    int64_t step, window;
    int reduce_mean, strands;
} vcf_meta;

typedef struct vcf_out {
    int tsv;
    moe_outfile file; /* the final name; htslib writes a duplicate of its descriptor */
    int file_open;
    htsFile *hts;
    bcf_hdr_t *hdr;          /* the input header + MOE_LLR + ##moe_score (owned) */
    const bcf_hdr_t *in_hdr; /* for the TSV's contig names */
    float *vals;             /* [cap_vals] INFO values of one record */
    int64_t cap_vals;
} vcf_out;

/* Opens the output (o->output, o->format, o->tsv) and writes its header. */
moe_status score_vcf_out_open(vcf_out *w, const moe_score_vcf_opts *o, const bcf_hdr_t *in,
                              const vcf_meta *meta, moe_err *err);
/* Writes rec (read with the input header) with llr [n_alt] (NaN = not scored; a record with
 * no score gets no MOE_LLR). */
moe_status score_vcf_out_record(vcf_out *w, bcf1_t *rec, const float *llr, int n_alt, moe_err *err);
/* Finishes and renames into place; frees w whatever the outcome. */
moe_status score_vcf_out_commit(vcf_out *w, moe_err *err);
/* Removes the temporary file and frees w. */
void score_vcf_out_abort(vcf_out *w);

#endif
