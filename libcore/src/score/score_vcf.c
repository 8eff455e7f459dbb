/* score_vcf: `moe-score variants` (moe/score.h) - each ALT allele of a VCF/BCF scored as
 * MOE_LLR = log P(ALT window) - log P(REF window) with the reference from an indexed FASTA.
 *
 * Flow per chunk of records: records read in input order (sorted or not), checked against
 * the FASTA, their windows tokenized (score_vcf_site.c) -> one REF window per record and
 * strand (all its ALTs share it), one window per ALT and strand, scored only after the
 * tokens it shares with the REF window (a causal model gives those shared tokens identical
 * log-probabilities: they cancel exactly, so they are left out); adjacent records at the
 * same position (split multi-allelic sites) run their common REF window once -> all windows
 * of the chunk batched by length (score_model.c), each ALT window continuing its REF
 * window's cached keys from its first differing token on -> LLRs -> records written in
 * input order.
 *
 * The one thing to know: an ALT's LLR sums the ALT window's log-probabilities after the
 * shared prefix minus the REF window's over the same positions, so the REF window's
 * per-token values are kept (a suffix sum per ALT), never recomputed per ALT. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"
#include "score/score_internal.h"
#include "score/score_vcf.h"

void moe_score_vcf_opts_defaults(moe_score_vcf_opts *o) {
    memset(o, 0, sizeof *o);
    o->m.device = MOE_DEVICE_AUTO;
    o->m.bf16 = -1;
    o->m.batch_tokens = 8192;
    o->format = 'v';
}

typedef struct vcf_scorer {
    const moe_score_vcf_opts *o;
    vcf_sites s; /* the input and the chunk's sites */
    score_model sm;
    vcf_out out;
    score_win *wins;
    int64_t cap_wins;
} vcf_scorer;

/* ---- chunks ---- */

/* Adds window w of a site to the chunk's list (lp: its per-token values, or NULL; parent:
 * the REF window an ALT window continues after its first `from` tokens, or NULL). */
static void add_win(vcf_scorer *v, vwin *w, int64_t from, float *lp, const vwin *parent,
                    int64_t *m) {
    score_win *sw = &v->wins[*m];
    sw->ids = w->ids;
    sw->n = w->n;
    sw->from = from;
    sw->lp = lp;
    sw->order = *m;
    sw->parent = parent ? &v->wins[parent->win] : NULL;
    sw->share = from;
    w->win = (*m)++;
}

/* The LLR of ALT a of a scored site, from the chunk's scored windows. */
static float site_llr(const vcf_scorer *v, const vsite *st, int a) {
    int64_t first = v->sm.first;
    const vsite *rs = &v->s.sites[st->root];
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
        a->rec->rid != b->rec->rid || a->start != b->start)
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
    for (int64_t i = 0; i < v->s.n_sites; i++)
        nw += 2 + 2 * v->s.sites[i].n_alt;
    if (score_grow((void **)&v->wins, &v->cap_wins, nw, sizeof *v->wins, err) != MOE_OK)
        return err->status;
    /* adjacent records with the same REF window (same contig and window start: split
     * multi-allelic sites, as bcftools norm -m- writes them, and with --window-grid the
     * variants of one window's middle half) run it once, through the first of them */
    for (int64_t i = 0; i < v->s.n_sites; i++) {
        vsite *st = &v->s.sites[i], *p = i ? &v->s.sites[v->s.sites[i - 1].root] : NULL;
        st->root = p && same_ref(p, st) ? p->root : i;
        for (int a = 0; a < st->n_alt; a++)
            v->s.sites[st->root].need_ref |= st->status[a] == ALT_SCORED;
    }
    int64_t m = 0, first = v->sm.first;
    moe_status rc = MOE_OK;
    for (int64_t i = 0; rc == MOE_OK && i < v->s.n_sites; i++) {
        vsite *st = &v->s.sites[i];
        for (int r = 0; st->root == i && st->need_ref && r < st->strands; r++) {
            st->lp[r] = malloc((size_t)(st->ref[r].n - first + 1) * sizeof(float));
            if (!st->lp[r])
                rc = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
            else
                add_win(v, &st->ref[r], first, st->lp[r], NULL, &m);
        }
        const vsite *rs = &v->s.sites[st->root];
        for (int a = 0; a < st->n_alt; a++)
            for (int r = 0; r < st->strands && st->status[a] == ALT_SCORED; r++)
                add_win(v, &st->alt[2 * a + r], st->alt[2 * a + r].from, NULL, &rs->ref[r], &m);
    }
    if (rc == MOE_OK) rc = score_model_run(&v->sm, v->wins, m, err);
    for (int64_t i = 0; rc == MOE_OK && i < v->s.n_sites; i++) {
        vsite *st = &v->s.sites[i];
        for (int a = 0; a < st->n_alt; a++)
            if (st->status[a] == ALT_SCORED) {
                st->llr[a] = site_llr(v, st, a);
                v->s.sum.scored++;
            }
        rc = score_vcf_out_record(&v->out, st->rec, st->llr, st->n_alt, err);
    }
    score_vcf_sites_clear(&v->s);
    return rc;
}

/* ---- run ---- */

/* Inputs, model, window W, output header. */
static moe_status setup(vcf_scorer *v, const moe_score_vcf_opts *o, moe_err *err) {
    moe_status st = score_vcf_sites_open(&v->s, o, err);
    if (st == MOE_OK) st = score_vcf_sites_input(&v->s, err);
    if (st == MOE_OK) st = score_model_open(&v->sm, &o->m, 0, "variants", err);
    if (st == MOE_OK) st = score_vcf_sites_model(&v->s, &v->sm, err);
    if (st != MOE_OK) return st;
    char pg[SCORE_PG_MAX], id[MOE_CKPT_PATH_MAX + 64];
    score_model_pg_line(&v->sm, o->m.command, pg, sizeof pg);
    moe_ckpt_id(&v->sm.ck.ckpt, id, sizeof id);
    vcf_meta meta = {v->sm.ck.ckpt.dir,
                     id,
                     v->sm.tok->name,
                     o->m.command,
                     pg,
                     moe_ckpt_step_of(v->sm.ck.ckpt.dir),
                     v->s.W,
                     o->window_grid,
                     o->reduce == MOE_SCORE_MEAN,
                     o->m.rc_average ? 2 : 1};
    moe_log_info("windows of %" PRId64 " bases %s%s", v->s.W,
                 o->window_grid ? "on a grid of half windows, shared by the variants in their "
                                  "middle half"
                                : "around each variant",
                 o->m.rc_average ? ", both strands" : "");
    return score_vcf_out_open(&v->out, o, v->s.hdr, &meta, err);
}

moe_status moe_score_vcf_run(const moe_score_vcf_opts *o, moe_score_summary *sum, moe_err *err) {
    vcf_scorer v;
    memset(&v, 0, sizeof v);
    v.o = o;
    moe_status st = setup(&v, o, err);
    int got;
    while (st == MOE_OK && (got = score_vcf_sites_next(&v.s, err)) != 0) {
        if (got < 0)
            st = err->status;
        else if (v.s.chunk_tokens >= 64 * v.sm.cap_tokens || v.s.n_sites >= 4096)
            st = flush_chunk(&v, err);
    }
    if (st == MOE_OK && v.s.n_sites) st = flush_chunk(&v, err);
    if (st == MOE_OK) st = score_vcf_out_commit(&v.out, err);
    score_vcf_out_abort(&v.out);
    char done[64];
    snprintf(done, sizeof done, "%" PRId64 " ALT alleles", v.s.sum.scored);
    score_model_finish(&v.sm, st, done, &v.s.sum);
    if (sum) *sum = v.s.sum;
    score_vcf_sites_close(&v.s);
    free(v.wins);
    score_model_close(&v.sm);
    return st;
}
