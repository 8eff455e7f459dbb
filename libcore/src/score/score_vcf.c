/* score_vcf: `moe-score variants` (moe/score.h) - each ALT allele of a VCF/BCF scored as
 * MOE_LLR = log P(ALT window) - log P(REF window) with the reference from an indexed FASTA.
 *
 * Windows (docs/cli.md): W bases, the REF window [s, s + W) with s = POS0 - W/2 (POS0 = the
 * 0-based position of the REF allele's first base); the ALT window keeps the left flank
 * [s, POS0), then the ALT allele, then the reference after the REF allele, filled (a
 * deletion) or trimmed (an insertion) on the right to W bases. Both are tokenized as they
 * are (FASTA case kept, the ALT as written in the VCF).
 *
 * Flow per chunk of records: records read in input order (sorted or not), checked against
 * the FASTA, their windows tokenized -> one REF window per record and strand (all its ALTs
 * share it), one window per ALT and strand, scored only after the tokens it shares with
 * the REF window (a causal model gives those shared tokens identical log-probabilities:
 * they cancel exactly, so they are left out); adjacent records at the same position (split
 * multi-allelic sites) run their common REF window once -> all windows of the chunk batched
 * by length
 * (score_model.c) -> LLRs -> records written in input order.
 *
 * The one thing to know: an ALT's LLR sums the ALT window's log-probabilities after the
 * shared prefix minus the REF window's over the same positions, so the REF window's
 * per-token values are kept (a suffix sum per ALT), never recomputed per ALT. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <htslib/faidx.h>

#include "moe/ckpt.h"
#include "moe/seqio.h"
#include "score/score_internal.h"
#include "score/score_vcf.h"

void moe_score_vcf_opts_defaults(moe_score_vcf_opts *o) {
    memset(o, 0, sizeof *o);
    o->m.device = MOE_DEVICE_AUTO;
    o->m.bf16 = -1;
    o->m.batch_tokens = 8192;
    o->format = 'v';
}

enum { ALT_SCORED = 0, ALT_SYMBOLIC, ALT_EDGE, ALT_REF_MISMATCH };

typedef struct vwin { /* one tokenized window of one strand */
    int32_t *ids;
    int64_t n;
    int64_t from; /* ALT: first token not shared with the REF window's start */
    int64_t win;  /* its index in the chunk's score_win list */
} vwin;

typedef struct vsite {
    bcf1_t *rec;
    int n_alt, strands;
    int *status;  /* [n_alt] ALT_* */
    vwin ref[2];  /* the REF window per strand (ids NULL when the record is skipped) */
    float *lp[2]; /* [ref n - first] REF log-probabilities per strand */
    vwin *alt;    /* [n_alt * 2] ALT a, strand r at 2a + r */
    float *llr;   /* [n_alt] out (NaN = not scored) */
    int64_t root; /* the site of the chunk whose REF windows (equal to this one's) are run */
    int need_ref; /* root: some ALT of its group is scored */
} vsite;

typedef struct vcf_scorer {
    const moe_score_vcf_opts *o;
    score_model sm;
    faidx_t *fai;
    htsFile *in;
    bcf_hdr_t *hdr;
    vcf_out out;
    int64_t W;
    vsite *sites;
    int64_t n_sites, cap_sites, chunk_tokens, rec_no;
    score_win *wins;
    int64_t cap_wins;
    moe_token_buf enc;
    char *buf; /* [cap_buf] window bases */
    int64_t cap_buf;
    moe_score_summary sum;
} vcf_scorer;

/* ---- reference and input ---- */

/* The FASTA through faidx (never building an index beside the user's file). */
static moe_status open_fasta(vcf_scorer *v, const char *path, moe_err *err) {
    v->fai = fai_load3(path, NULL, NULL, 0);
    if (v->fai) return MOE_OK;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moe_err_errno(err, path, "cannot open the reference FASTA");
    unsigned char magic[2] = {0, 0};
    int gz = fread(magic, 1, 2, fp) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    fclose(fp);
    moe_err_set(err, MOE_ERR_INPUT, path, "cannot load the FASTA index (%s.fai%s)", path,
                gz ? " and .gzi" : "");
    if (gz)
        moe_err_hint(err,
                     "a gzip FASTA needs bgzip compression and an index: zcat %s | bgzip > "
                     "ref.fa.gz && samtools faidx ref.fa.gz (or decompress it and run "
                     "samtools faidx)",
                     path);
    else
        moe_err_hint(err, "index it first: samtools faidx %s", path);
    return MOE_ERR_INPUT;
}

/* A contig the FASTA lacks: an error naming the record, with a hint when only a chr prefix
 * differs. */
static moe_status missing_contig(vcf_scorer *v, const char *chrom, int64_t pos, moe_err *err) {
    moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                "%s:%" PRId64 ": contig '%s' is not in the reference %s", chrom, pos, chrom,
                v->o->fasta);
    moe_err_at_record(err, v->rec_no);
    char alt[1024];
    if (strncmp(chrom, "chr", 3) == 0)
        snprintf(alt, sizeof alt, "%s", chrom + 3);
    else
        snprintf(alt, sizeof alt, "chr%s", chrom);
    if (faidx_has_seq(v->fai, alt))
        moe_err_hint(err,
                     "the FASTA calls it '%s': the names differ by a chr prefix (rename "
                     "the VCF's contigs with bcftools annotate --rename-chrs)",
                     alt);
    else
        moe_err_hint(err, "use the reference the calls were made against");
    return MOE_ERR_INPUT;
}

/* <DEL>-style, * (a spanning deletion), . (no ALT) and breakends: nothing to score. */
static int is_symbolic(const char *a) {
    return a[0] == '<' || strcmp(a, "*") == 0 || strcmp(a, ".") == 0 || strchr(a, '[') ||
           strchr(a, ']');
}

/* Tokens of bases[0, len) into a new array (*ids, *n). */
static moe_status tokenize(vcf_scorer *v, const char *bases, int64_t len, int32_t **ids, int64_t *n,
                           moe_err *err) {
    v->enc.n = 0;
    if (moe_tokenizer_encode(v->sm.tok, bases, len, &v->enc, err) != MOE_OK) return err->status;
    *ids = malloc((size_t)(v->enc.n ? v->enc.n : 1) * sizeof(int32_t));
    if (!*ids) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    memcpy(*ids, v->enc.ids, (size_t)v->enc.n * sizeof(int32_t));
    *n = v->enc.n;
    if (*n <= v->sm.max_content) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "a window of %" PRId64 " bases is %" PRId64 " tokens, more than the model's "
                "context of %" PRId64,
                len, *n, v->sm.max_content);
    moe_err_hint(err, "use a smaller --window");
    return MOE_ERR_INPUT;
}

/* The REF and ALT windows of both strands of a site from the reference ref[0, len) that
 * starts at the window start. */
static moe_status site_windows(vcf_scorer *v, vsite *st, const char *ref, int64_t len, int64_t rlen,
                               moe_err *err) {
    int64_t W = v->W, h = W / 2;
    if (score_grow((void **)&v->buf, &v->cap_buf, W + 1, 1, err) != MOE_OK) return err->status;
    for (int r = 0; r < st->strands; r++) {
        memcpy(v->buf, ref, (size_t)W);
        if (r) moe_seqio_revcomp(v->buf, W);
        if (tokenize(v, v->buf, W, &st->ref[r].ids, &st->ref[r].n, err) != MOE_OK)
            return err->status;
    }
    for (int a = 0; a < st->n_alt; a++) {
        if (st->status[a] != ALT_SCORED) continue;
        const char *alt = st->rec->d.allele[a + 1];
        int64_t alen = (int64_t)strlen(alt), right = W - h - alen;
        if (h + rlen + (right > 0 ? right : 0) > len) { /* the fill runs off the contig */
            st->status[a] = ALT_EDGE;
            continue;
        }
        memcpy(v->buf, ref, (size_t)h);
        memcpy(v->buf + h, alt, (size_t)(alen < W - h ? alen : W - h));
        if (right > 0) memcpy(v->buf + h + alen, ref + h + rlen, (size_t)right);
        for (int r = 0; r < st->strands; r++) {
            if (r) moe_seqio_revcomp(v->buf, W); /* the strand after the forward one */
            vwin *w = &st->alt[2 * a + r];
            if (tokenize(v, v->buf, W, &w->ids, &w->n, err) != MOE_OK) {
                moe_err_prefix(err, "ALT %d (%s)", a + 1, alt);
                return err->status;
            }
            const vwin *rw = &st->ref[r];
            int64_t p = 0;
            while (p < w->n && p < rw->n && w->ids[p] == rw->ids[p])
                p++;
            w->from = p > v->sm.first ? p : v->sm.first;
        }
    }
    return MOE_OK;
}

/* Reads the record into a new site: checks, windows, tokens. */
static moe_status add_site(vcf_scorer *v, bcf1_t *rec, moe_err *err) {
    if (bcf_unpack(rec, BCF_UN_STR) < 0)
        return moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "record %" PRId64 " cannot be parsed",
                           v->rec_no);
    if (rec->n_allele < 1) { /* htslib leaves a line it could not split without alleles */
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "record %" PRId64 " has no REF allele",
                    v->rec_no);
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "the record is malformed: check its columns (tab-separated, no NUL "
                          "bytes)");
        return MOE_ERR_INPUT;
    }
    if (score_grow((void **)&v->sites, &v->cap_sites, v->n_sites + 1, sizeof *v->sites, err) !=
        MOE_OK)
        return err->status;
    vsite *st = &v->sites[v->n_sites++]; /* owned by the chunk from here */
    memset(st, 0, sizeof *st);
    st->rec = bcf_dup(rec);
    st->n_alt = rec->n_allele - 1;
    st->strands = v->o->m.rc_average ? 2 : 1;
    int n = st->n_alt > 0 ? st->n_alt : 1;
    st->status = calloc((size_t)n, sizeof *st->status);
    st->alt = calloc((size_t)n * 2, sizeof *st->alt);
    st->llr = malloc((size_t)n * sizeof *st->llr);
    if (!st->rec || !st->status || !st->alt || !st->llr)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    if (bcf_unpack(st->rec, BCF_UN_STR) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot copy record %" PRId64, v->rec_no);
    v->sum.records++;
    v->sum.alts += st->n_alt;
    for (int a = 0; a < st->n_alt; a++) {
        st->llr[a] = NAN;
        if (is_symbolic(rec->d.allele[a + 1])) st->status[a] = ALT_SYMBOLIC;
    }
    const char *chrom = bcf_seqname_safe(v->hdr, rec), *ref_allele = rec->d.allele[0];
    int64_t pos0 = rec->pos, rlen = (int64_t)strlen(ref_allele), W = v->W, s = pos0 - W / 2;
    if (!faidx_has_seq(v->fai, chrom)) return missing_contig(v, chrom, pos0 + 1, err);
    if (pos0 < 0) { /* POS 0 or empty (htslib reads both as 0): nothing to compare REF with */
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "%s: POS %" PRId64 " is not a position", chrom,
                    pos0 + 1);
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "VCF positions count from 1; the record is malformed");
        return MOE_ERR_INPUT;
    }
    int64_t L = faidx_seq_len(v->fai, chrom); /* int: htslib 1.16 */
    /* the reference from the window start: the REF window, and a deletion's fill after it */
    int64_t lo = s > 0 ? s : 0, hi = s + 2 * W + rlen < L ? s + 2 * W + rlen : L, len = 0;
    char *ref = hi > lo ? faidx_fetch_seq64(v->fai, chrom, lo, hi - 1, &len) : NULL;
    if (hi > lo && (!ref || len != hi - lo)) {
        free(ref);
        return moe_err_set(err, MOE_ERR_RUNTIME, v->o->fasta, "cannot read %s:%" PRId64 "-%" PRId64,
                           chrom, lo + 1, hi);
    }
    int match = pos0 + rlen <= L;
    for (int64_t i = 0; match && i < rlen; i++)
        match = toupper((unsigned char)ref_allele[i]) == toupper((unsigned char)ref[pos0 - lo + i]);
    moe_status rc = MOE_OK;
    int status = ALT_SCORED;
    if (!match && !v->o->check_ref_warn) {
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                    "%s:%" PRId64 ": REF '%.40s' does not match the reference %s there ('%.*s')",
                    chrom, pos0 + 1, ref_allele, v->o->fasta,
                    (int)(pos0 < L ? (rlen < 40 ? rlen : 40) : 0), ref ? ref + (pos0 - lo) : "");
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "use the FASTA the calls were made against, or --check-ref warn to "
                          "skip such records");
        rc = MOE_ERR_INPUT;
    } else if (!match) {
        if (v->sum.skip_ref < 5)
            moe_log_warn("record %" PRId64 " (%s:%" PRId64 "): REF does not match the reference: "
                         "skipped",
                         v->rec_no, chrom, pos0 + 1);
        status = ALT_REF_MISMATCH;
    } else if (s < 0 || s + W > L || pos0 + rlen > s + W) {
        status = ALT_EDGE; /* the window runs off the contig, or the REF off the window */
    }
    for (int a = 0; a < st->n_alt; a++)
        if (st->status[a] == ALT_SCORED) st->status[a] = status;
    if (rc == MOE_OK && status == ALT_SCORED) rc = site_windows(v, st, ref, len, rlen, err);
    free(ref);
    if (rc != MOE_OK) {
        if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", v->o->vcf);
        if (!err->record) moe_err_at_record(err, v->rec_no);
        return rc;
    }
    for (int a = 0; a < st->n_alt; a++) {
        v->sum.skip_symbolic += st->status[a] == ALT_SYMBOLIC;
        v->sum.skip_edge += st->status[a] == ALT_EDGE;
        v->sum.skip_ref += st->status[a] == ALT_REF_MISMATCH;
    }
    for (int r = 0; r < 2; r++)
        v->chunk_tokens += st->ref[r].n;
    for (int a = 0; a < 2 * st->n_alt; a++)
        v->chunk_tokens += st->alt[a].n;
    return MOE_OK;
}

/* ---- chunks ---- */

static void free_chunk(vcf_scorer *v) {
    for (int64_t i = 0; i < v->n_sites; i++) {
        vsite *st = &v->sites[i];
        if (st->rec) bcf_destroy(st->rec);
        for (int r = 0; r < 2; r++)
            free(st->ref[r].ids), free(st->lp[r]);
        for (int a = 0; st->alt && a < 2 * st->n_alt; a++)
            free(st->alt[a].ids);
        free(st->alt);
        free(st->status);
        free(st->llr);
    }
    v->n_sites = v->chunk_tokens = 0;
}

/* Adds window w of a site to the chunk's list (lp: its per-token values, or NULL). */
static void add_win(vcf_scorer *v, vwin *w, int64_t from, float *lp, int64_t *m) {
    score_win *sw = &v->wins[*m];
    sw->ids = w->ids;
    sw->n = w->n;
    sw->from = from;
    sw->lp = lp;
    sw->order = *m;
    w->win = (*m)++;
}

/* The LLR of ALT a of a scored site, from the chunk's scored windows. */
static float site_llr(const vcf_scorer *v, const vsite *st, int a) {
    int64_t first = v->sm.first;
    const vsite *rs = &v->sites[st->root];
    double llr = 0.0;
    for (int r = 0; r < st->strands; r++) {
        const vwin *rw = &rs->ref[r], *aw = &st->alt[2 * a + r];
        double pre = 0.0, suf = 0.0; /* the REF window before and from the ALT's first */
        for (int64_t j = first; j < rw->n; j++)
            *(j < aw->from ? &pre : &suf) += rs->lp[r][j - first];
        double alt = v->wins[aw->win].sum;
        if (v->o->reduce == MOE_SCORE_MEAN)
            llr += (pre + alt) / (double)(aw->n - first) - (pre + suf) / (double)(rw->n - first);
        else
            llr += alt - suf;
    }
    return (float)(llr / st->strands);
}

/* 1 when sites a and b have the same tokenized REF windows (both have some). */
static int same_ref(const vsite *a, const vsite *b) {
    if (!a->ref[0].ids || !b->ref[0].ids || a->strands != b->strands ||
        a->rec->rid != b->rec->rid || a->rec->pos != b->rec->pos)
        return 0;
    for (int r = 0; r < a->strands; r++)
        if (a->ref[r].n != b->ref[r].n ||
            memcmp(a->ref[r].ids, b->ref[r].ids, (size_t)a->ref[r].n * sizeof(int32_t)) != 0)
            return 0;
    return 1;
}

/* Scores the chunk's sites and writes their records, then empties it. */
static moe_status flush_chunk(vcf_scorer *v, moe_err *err) {
    int64_t nw = 0;
    for (int64_t i = 0; i < v->n_sites; i++)
        nw += 2 + 2 * v->sites[i].n_alt;
    if (score_grow((void **)&v->wins, &v->cap_wins, nw, sizeof *v->wins, err) != MOE_OK)
        return err->status;
    /* records with the same REF window (same contig and POS: split multi-allelic sites,
     * as bcftools norm -m- writes them) run it once, through the first of them */
    for (int64_t i = 0; i < v->n_sites; i++) {
        vsite *st = &v->sites[i], *p = i ? &v->sites[v->sites[i - 1].root] : NULL;
        st->root = p && same_ref(p, st) ? p->root : i;
        for (int a = 0; a < st->n_alt; a++)
            v->sites[st->root].need_ref |= st->status[a] == ALT_SCORED;
    }
    int64_t m = 0, first = v->sm.first;
    moe_status rc = MOE_OK;
    for (int64_t i = 0; rc == MOE_OK && i < v->n_sites; i++) {
        vsite *st = &v->sites[i];
        for (int r = 0; st->root == i && st->need_ref && r < st->strands; r++) {
            st->lp[r] = malloc((size_t)(st->ref[r].n - first + 1) * sizeof(float));
            if (!st->lp[r])
                rc = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
            else
                add_win(v, &st->ref[r], first, st->lp[r], &m);
        }
        for (int a = 0; a < st->n_alt; a++)
            for (int r = 0; r < st->strands && st->status[a] == ALT_SCORED; r++)
                add_win(v, &st->alt[2 * a + r], st->alt[2 * a + r].from, NULL, &m);
    }
    if (rc == MOE_OK) rc = score_model_run(&v->sm, v->wins, m, err);
    for (int64_t i = 0; rc == MOE_OK && i < v->n_sites; i++) {
        vsite *st = &v->sites[i];
        for (int a = 0; a < st->n_alt; a++)
            if (st->status[a] == ALT_SCORED) {
                st->llr[a] = site_llr(v, st, a);
                v->sum.scored++;
            }
        rc = score_vcf_out_record(&v->out, st->rec, st->llr, st->n_alt, err);
    }
    free_chunk(v);
    return rc;
}

/* ---- run ---- */

/* -r regions: 0-based [beg, end) of a contig name; a record overlapping one is kept. */
static int in_regions(const vcf_scorer *v, const bcf1_t *rec) {
    if (v->o->n_regions == 0) return 1;
    const char *chrom = bcf_seqname_safe(v->hdr, rec);
    for (int i = 0; i < v->o->n_regions; i++) {
        hts_pos_t beg, end;
        const char *r = v->o->regions[i], *e = hts_parse_reg64(r, &beg, &end);
        if (e && (size_t)(e - r) == strlen(chrom) && strncmp(r, chrom, (size_t)(e - r)) == 0 &&
            rec->pos < end && rec->pos + rec->rlen > beg)
            return 1;
    }
    return 0;
}

/* Regions checked, FASTA index, VCF header, model, window W, output header. */
static moe_status setup(vcf_scorer *v, const moe_score_vcf_opts *o, moe_err *err) {
    for (int i = 0; i < o->n_regions; i++) {
        hts_pos_t beg, end;
        if (!hts_parse_reg64(o->regions[i], &beg, &end)) {
            moe_err_set(err, MOE_ERR_INPUT, NULL, "-r %s is not a region", o->regions[i]);
            moe_err_hint(err, "write chr, chr:beg or chr:beg-end (1-based, inclusive)");
            return MOE_ERR_INPUT;
        }
    }
    moe_status st = open_fasta(v, o->fasta, err);
    if (st != MOE_OK) return st;
    v->in = hts_open(o->vcf, "r");
    if (!v->in) return moe_err_errno(err, o->vcf, "cannot open the VCF/BCF");
    if (hts_get_format(v->in)->category != variant_data) {
        char *what = hts_format_description(hts_get_format(v->in)); /* malloc'ed */
        moe_err_set(err, MOE_ERR_INPUT, o->vcf, "not a VCF or BCF file (%s)",
                    what ? what : "unknown format");
        free(what);
        return MOE_ERR_INPUT;
    }
    v->hdr = bcf_hdr_read(v->in);
    if (!v->hdr) return moe_err_set(err, MOE_ERR_INPUT, o->vcf, "cannot read the VCF header");
    st = score_model_open(&v->sm, &o->m, 0, "variants", err);
    if (st != MOE_OK) return st;
    int64_t ctx = v->sm.max_content * moe_tokenizer_max_bases_per_token(v->sm.tok);
    v->W = o->window ? o->window : ctx < 8192 ? ctx : 8192;
    if (v->W < 2 || v->W > ctx) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--window %" PRId64 " must be between 2 and %" PRId64 " bases (the model's "
                    "context)",
                    v->W, ctx);
        return MOE_ERR_INPUT;
    }
    char pg[SCORE_PG_MAX], id[MOE_CKPT_PATH_MAX + 64];
    score_model_pg_line(&v->sm, o->m.command, pg, sizeof pg);
    moe_ckpt_id(&v->sm.ck.ckpt, id, sizeof id);
    vcf_meta meta = {v->sm.ck.ckpt.dir,
                     id,
                     v->sm.tok->name,
                     o->m.command,
                     pg,
                     moe_ckpt_step_of(v->sm.ck.ckpt.dir),
                     v->W,
                     o->reduce == MOE_SCORE_MEAN,
                     o->m.rc_average ? 2 : 1};
    moe_log_info("windows of %" PRId64 " bases around each variant%s", v->W,
                 o->m.rc_average ? ", both strands" : "");
    return score_vcf_out_open(&v->out, o, v->hdr, &meta, err);
}

moe_status moe_score_vcf_run(const moe_score_vcf_opts *o, moe_score_summary *sum, moe_err *err) {
    vcf_scorer v;
    memset(&v, 0, sizeof v);
    v.o = o;
    moe_status st = setup(&v, o, err);
    bcf1_t *rec = bcf_init();
    if (!rec && st == MOE_OK) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    int rc = 0;
    while (st == MOE_OK && (rc = bcf_read(v.in, v.hdr, rec)) == 0) {
        v.rec_no++;
        if (!in_regions(&v, rec)) continue;
        st = add_site(&v, rec, err);
        if (st == MOE_OK && (v.chunk_tokens >= 64 * v.sm.cap_tokens || v.n_sites >= 4096))
            st = flush_chunk(&v, err);
    }
    if (st == MOE_OK && rc < -1) {
        st = moe_err_set(err, MOE_ERR_INPUT, o->vcf, "record %" PRId64 " cannot be read",
                         v.rec_no + 1);
        moe_err_at_record(err, v.rec_no + 1);
    }
    if (st == MOE_OK && v.n_sites) st = flush_chunk(&v, err);
    free_chunk(&v);
    if (st == MOE_OK) st = score_vcf_out_commit(&v.out, err);
    score_vcf_out_abort(&v.out);
    char done[64];
    snprintf(done, sizeof done, "%" PRId64 " ALT alleles", v.sum.scored);
    score_model_finish(&v.sm, st, done, &v.sum);
    if (sum) *sum = v.sum;
    if (rec) bcf_destroy(rec);
    if (v.hdr) bcf_hdr_destroy(v.hdr);
    if (v.in) hts_close(v.in);
    if (v.fai) fai_destroy(v.fai);
    free(v.sites);
    free(v.wins);
    free(v.buf);
    moe_token_buf_free(&v.enc);
    score_model_close(&v.sm);
    return st;
}
