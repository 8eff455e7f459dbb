/* score_vcf_out: the output of `moe-score variants` - the input VCF/BCF with INFO/MOE_LLR
 * and a ##moe_score header line (VCF, bgzip VCF or BCF through htslib), or a TSV (a "#@PG"
 * provenance line, a header, a row per ALT).
 *
 * The one thing to know: htslib writes into the descriptor of a moe_outfile (a duplicate of
 * it, handed to hdopen), so the output lives under a temporary name until
 * score_vcf_out_commit renames it - nothing half-written appears under the final name, and
 * stdout ("-") is written in place like every other tool's. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <htslib/hfile.h>

#include "moe/version.h"
#include "score/score_internal.h"
#include "score/score_vcf.h"

/* The header lines, their values quoted where they may hold commas or spaces, appended to the
 * input header itself (w->hdr): the records are read and written with that one header, so a
 * FILTER, INFO or contig that htslib defines while reading (one the header lacks) keeps its
 * ID when written; with a copy made before the records, that ID named another tag or none. */
static moe_status add_header(vcf_out *w, const vcf_meta *meta, moe_err *err) {
    int id = bcf_hdr_id2int(w->hdr, BCF_DT_ID, "MOE_LLR");
    int have = bcf_hdr_idinfo_exists(w->hdr, BCF_HL_INFO, id); /* scored before: overwritten */
    kstring_t line = {0, 0, NULL};
    int bad = 0;
    if (!have)
        bad |= ksprintf(&line,
                        "##INFO=<ID=MOE_LLR,Number=A,Type=Float,Description=\"moe-score "
                        "log-likelihood ratio of each ALT: log P(ALT window) - log P(REF "
                        "window), nats (%s over a %" PRId64 "-base window)\">",
                        meta->reduce_mean ? "mean per token" : "sum", meta->window) < 0 ||
               bcf_hdr_append(w->hdr, line.s) < 0;
    line.l = 0;
    bad |= ksprintf(&line,
                    "##moe_score=<model=\"%s\",step=%" PRId64 ",checkpoint=\"%s\",tokenizer=%s,"
                    "window=%" PRId64 ",windows=%s,reduce=%s,strands=%d,version=%s,command=\"",
                    meta->model, meta->step, meta->ckpt_id, meta->tokenizer, meta->window,
                    meta->grid ? "grid" : "centred", meta->reduce_mean ? "mean" : "sum",
                    meta->strands, moe_version()) < 0;
    for (const char *c = meta->command ? meta->command : ""; *c; c++) /* no quotes inside */
        bad |= kputc(*c == '"' ? '\'' : *c, &line) < 0;
    bad |=
        kputs("\">", &line) < 0 || bcf_hdr_append(w->hdr, line.s) < 0 || bcf_hdr_sync(w->hdr) < 0;
    free(line.s);
    if (bad) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot build the output VCF header");
    return MOE_OK;
}

moe_status score_vcf_out_open(vcf_out *w, const moe_score_vcf_opts *o, bcf_hdr_t *in,
                              const vcf_meta *meta, moe_err *err) {
    memset(w, 0, sizeof *w);
    w->tsv = o->tsv;
    w->hdr = in;
    const char *path = o->output ? o->output : "-";
    moe_status st = moe_outfile_open(&w->file, path, err);
    if (st != MOE_OK) return st;
    w->file_open = 1;
    if (w->tsv) {
        const char *h = "chrom\tpos\tid\tref\talt\tllr\n";
        st = moe_outfile_write(&w->file, meta->pg, strlen(meta->pg), err);
        return st == MOE_OK ? moe_outfile_write(&w->file, h, strlen(h), err) : st;
    }
    st = add_header(w, meta, err);
    if (st != MOE_OK) return st;
    char mode[4] = {'w', o->format == 'z' ? 'z' : o->format == 'b' ? 'b' : '\0', '\0', '\0'};
    fflush(w->file.fp);
    int fd = dup(fileno(w->file.fp));
    hFILE *hf = fd >= 0 ? hdopen(fd, "w") : NULL;
    if (!hf && fd >= 0) close(fd);
    w->hts = hf ? hts_hopen(hf, path, mode) : NULL;
    if (!w->hts) {
        if (hf) hclose_abruptly(hf);
        return moe_err_errno(err, path, "cannot open the output for htslib");
    }
    if (bcf_hdr_write(w->hts, w->hdr) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot write the VCF header");
    return MOE_OK;
}

moe_status score_vcf_out_record(vcf_out *w, bcf1_t *rec, const float *llr, int n_alt,
                                moe_err *err) {
    const char *path = w->file.path;
    if (w->tsv) { /* alleles may be long: the line is built in a growing kstring */
        kstring_t line = {0, 0, NULL};
        int bad = 0;
        for (int a = 0; a < n_alt; a++) {
            line.l = 0;
            bad |= ksprintf(&line, "%s\t%" PRId64 "\t%s\t%s\t%s\t", bcf_seqname_safe(w->hdr, rec),
                            (int64_t)rec->pos + 1, rec->d.id, rec->d.allele[0],
                            rec->d.allele[a + 1]) < 0;
            bad |= (isnan(llr[a]) ? kputs(".\n", &line)
                                  : ksprintf(&line, "%.6g\n", (double)llr[a])) < 0;
            if (bad || moe_outfile_write(&w->file, line.s, line.l, err) != MOE_OK) break;
        }
        free(line.s);
        if (bad) return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        return err->status;
    }
    int any = 0;
    for (int a = 0; a < n_alt; a++)
        any |= !isnan(llr[a]);
    if (any && score_grow((void **)&w->vals, &w->cap_vals, n_alt, sizeof *w->vals, err) != MOE_OK)
        return err->status;
    if (any) {
        float *v = w->vals;
        for (int a = 0; a < n_alt; a++) {
            if (isnan(llr[a]))
                bcf_float_set_missing(v[a]);
            else
                v[a] = llr[a];
        }
        if (bcf_update_info_float(w->hdr, rec, "MOE_LLR", v, n_alt) < 0)
            return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot set INFO/MOE_LLR");
    }
    if (bcf_write(w->hts, w->hdr, rec) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot write a record");
    return MOE_OK;
}

moe_status score_vcf_out_commit(vcf_out *w, moe_err *err) {
    moe_status st = MOE_OK;
    if (w->hts) {
        int rc = hts_close(w->hts);
        w->hts = NULL;
        if (rc < 0)
            st = moe_err_set(err, MOE_ERR_RUNTIME, w->file.path, "cannot finish the output");
    }
    if (st == MOE_OK) {
        w->file_open = 0;
        st = moe_outfile_commit(&w->file, err);
    }
    score_vcf_out_abort(w);
    return st;
}

void score_vcf_out_abort(vcf_out *w) {
    if (w->hts) hts_close(w->hts);
    w->hts = NULL;
    if (w->file_open) moe_outfile_abort(&w->file);
    w->file_open = 0;
    w->hdr = NULL; /* the input's: not ours to free */
    free(w->vals);
    w->vals = NULL;
    w->cap_vals = 0;
}
