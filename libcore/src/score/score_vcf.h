/* score_vcf: what score_vcf_site.c (records checked against the reference, windows),
 * score_vcf.c (scores) and score_vcf_out.c (the scored VCF/BCF or TSV) share. Private to
 * libcore (and tests/fuzz/fuzz_vcf, which builds the sites of its inputs without a model).
 *
 * The one thing to know: building sites needs only the model's tokenizer and window
 * geometry (score_model_geometry), not the model: the sites of a chunk are built first, then
 * scored together (score_vcf.c). */
#ifndef MOE_SCORE_VCF_H
#define MOE_SCORE_VCF_H

#include <stdint.h>

#include <htslib/faidx.h>
#include <htslib/vcf.h>

#include "moe/fileio.h"
#include "moe/score.h"
#include "score/score_internal.h"

enum { ALT_SCORED = 0, ALT_SYMBOLIC, ALT_EDGE, ALT_REF_MISMATCH }; /* what becomes of an ALT */

typedef struct vwin { /* one tokenized window of one strand */
    int32_t *ids;
    int64_t n;
    int64_t from; /* ALT: first token not shared with the REF window's start */
    int64_t win;  /* its index in the chunk's score_win list */
} vwin;

typedef struct vsite {
    bcf1_t *rec;
    int n_alt, strands;
    int *status;   /* [n_alt] ALT_* */
    vwin ref[2];   /* the REF window per strand (ids NULL when the record is skipped) */
    float *lp[2];  /* [ref n - first] REF log-probabilities per strand */
    vwin *alt;     /* [n_alt * 2] ALT a, strand r at 2a + r */
    float *llr;    /* [n_alt] out (NaN = not scored) */
    int64_t start; /* 0-based start of the REF window on the contig */
    int64_t root;  /* the site of the chunk whose REF windows (equal to this one's) are run */
    int need_ref;  /* root: some ALT of its group is scored */
} vsite;

typedef struct vcf_sites { /* the input and the checked sites of the current chunk */
    const moe_score_vcf_opts *o;
    const score_model *sm; /* its tokenizer and geometry (tok, first, max_content) */
    faidx_t *fai;
    htsFile *in;
    bcf_hdr_t *hdr;
    bcf1_t *rec; /* the record read last */
    int64_t W;   /* window bases */
    vsite *sites;
    int64_t n_sites, cap_sites, chunk_tokens, rec_no;
    moe_token_buf enc;
    char *buf; /* [cap_buf] window bases */
    int64_t cap_buf;
    moe_score_summary sum; /* records, ALTs and skipped ALTs so far (the scorer adds the rest) */
} vcf_sites;

/* Opens the reference of o into *s (zeroed first): -r regions checked, the FASTA's index
 * (o->fasta). On failure *s holds what opened: close it. */
moe_status score_vcf_sites_open(vcf_sites *s, const moe_score_vcf_opts *o, moe_err *err);
/* Opens the VCF/BCF o->vcf and reads its header (the input before, if any, ended first: one
 * reference, any number of inputs one after another). */
moe_status score_vcf_sites_input(vcf_sites *s, moe_err *err);
/* Takes the tokenizer and window geometry of sm (alive while s is used) and sets the window:
 * o->window bases, or (0) the model's context up to 8192; outside [2, context] is
 * MOE_ERR_INPUT. */
moe_status score_vcf_sites_model(vcf_sites *s, const score_model *sm, moe_err *err);
/* Reads records up to the next one in o's regions and adds it to the chunk as a site:
 * checked against the reference (contig, POS, REF; --check-ref warn skips a mismatch),
 * symbolic ALTs and windows off a contig edge marked, both windows tokenized. Returns 1
 * with a site added, 0 at the end of the input, -1 on an error (err names the record). */
int score_vcf_sites_next(vcf_sites *s, moe_err *err);
/* Empties the chunk (its sites freed). */
void score_vcf_sites_clear(vcf_sites *s);
/* Ends the input: the chunk emptied, the VCF/BCF closed (the reference stays open). */
void score_vcf_sites_end(vcf_sites *s);
/* Frees everything of s (safe on a zeroed one). */
void score_vcf_sites_close(vcf_sites *s);

typedef struct vcf_meta {        /* what the ##moe_score header line records */
    const char *model, *ckpt_id; /* the checkpoint's directory and its moe_ckpt_id */
    const char *tokenizer, *command;
    const char *pg; /* the TSV's first line (score_model_pg_line) */
    int64_t step, window;
    int grid; /* --window-grid */
    int reduce_mean, strands;
} vcf_meta;

typedef struct vcf_out {
    int tsv;
    moe_outfile file; /* the final name; htslib writes a duplicate of its descriptor */
    int file_open;
    htsFile *hts;
    bcf_hdr_t *hdr; /* the input header itself; for a VCF, MOE_LLR + ##moe_score appended to
                       it (score_vcf_out.c: one header to read and write with) */
    float *vals;    /* [cap_vals] INFO values of one record */
    int64_t cap_vals;
} vcf_out;

/* Opens the output (o->output, o->format, o->tsv) and writes its header. */
moe_status score_vcf_out_open(vcf_out *w, const moe_score_vcf_opts *o, bcf_hdr_t *in,
                              const vcf_meta *meta, moe_err *err);
/* Writes rec (read with the input header) with llr [n_alt] (NaN = not scored; a record with
 * no score gets no MOE_LLR). */
moe_status score_vcf_out_record(vcf_out *w, bcf1_t *rec, const float *llr, int n_alt, moe_err *err);
/* Finishes and renames into place; frees w whatever the outcome. */
moe_status score_vcf_out_commit(vcf_out *w, moe_err *err);
/* Removes the temporary file and frees w. */
void score_vcf_out_abort(vcf_out *w);

#endif
