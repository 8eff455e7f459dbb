/* score_model: the scoring engine of moe-score (score_internal.h) - a checkpoint opened for
 * log-probabilities, and windows of content tokens run through moe_model_logprobs in
 * batches of similar length.
 *
 * Flow of score_model_run: the windows run whole sorted by length, longest first (ties by
 * their order in the caller's list: deterministic) -> batches of at most batch_tokens padded
 * tokens -> rows BOS? + content + padding, targets = the next token where it is scored, -1
 * elsewhere -> per-token log-probabilities back on the host, summed per window in double,
 * in position order. A batch that holds parents saves its keys (moe_model_logprobs_kv), and
 * their continuing windows (an ALT window after its REF window) run next from their last
 * shared token on, reading the parents' cached keys: about half a window instead of a
 * whole one for a variant in the middle. The one thing to know: right padding and per-token
 * routing make a row's numbers independent of its batch neighbours (up to the last bits of
 * BLAS blocking), and the batching depends only on the windows, so the same input gives the
 * same bytes. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moe/input.h"
#include "score/score_internal.h"

/* Checkpoint + backend + model in one place: what moves to moe_ckpt_open / moe_backend_open
 * when those land. */
static moe_status load(score_model *sm, const moe_score_model_opts *o, moe_err *err) {
    moe_status st = moe_infer_ckpt_open(&sm->ck, o->ckpt_dir, err);
    if (st != MOE_OK) return st;
    score_model_geometry(sm, sm->ck.ckpt.tok, sm->ck.ckpt.cfg.model.max_position_embeddings,
                         sm->max_content);
    if (o->rc_average && moe_input_check_rc(sm->tok, err) != MOE_OK) return err->status;
    sm->max_seq = sm->max_content + sm->nb;
    int64_t cap = sm->batch_tokens > sm->max_seq ? sm->batch_tokens : sm->max_seq;
    sm->max_batch = (cap + sm->max_seq - 1) / sm->max_seq;
    sm->cap_tokens = sm->max_batch * sm->max_seq;
    return moe_infer_ckpt_load_model(&sm->ck, o->device, o->threads, o->bf16, (int)sm->max_batch,
                                     (int)sm->max_seq, err);
}

void score_model_geometry(score_model *sm, const moe_tokenizer *tok, int64_t positions,
                          int64_t max_content) {
    sm->tok = tok;
    sm->nb = tok->opts.add_bos && tok->bos_id >= 0;
    sm->first = sm->nb ? 0 : 1;
    int64_t ctx = positions - sm->nb;
    sm->max_content = max_content > 0 && max_content < ctx ? max_content : ctx;
}

moe_status score_model_open(score_model *sm, const moe_score_model_opts *o, int64_t max_content,
                            const char *what, moe_err *err) {
    memset(sm, 0, sizeof *sm);
    double t0 = moe_time_now();
    sm->batch_tokens = o->batch_tokens > 0 ? o->batch_tokens : 8192;
    sm->max_content = max_content;
    moe_status st = load(sm, o, err);
    if (st != MOE_OK) return st;
    sm->pad = sm->tok->pad_id >= 0 ? sm->tok->pad_id : 0;
    sm->tokens = malloc((size_t)sm->cap_tokens * sizeof(int32_t));
    sm->targets = malloc((size_t)sm->cap_tokens * sizeof(int32_t));
    sm->lp = malloc((size_t)sm->cap_tokens * sizeof(float));
    if (!sm->tokens || !sm->targets || !sm->lp)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    sm->load_seconds = moe_time_now() - t0;
    sm->t_loaded = moe_time_now();
    moe_progress_start(&sm->prog, what, "tokens", 0);
    if (o->quiet) sm->prog.enabled = sm->prog.tty = 0;
    moe_log_info("checkpoint %s: %s tokenizer%s, windows of up to %" PRId64 " tokens, %s backend, "
                 "%s",
                 sm->ck.ckpt.dir, sm->tok->name, sm->nb ? " (BOS first)" : "", sm->max_content,
                 sm->ck.be->name, moe_recipe_name(sm->ck.model.recipe));
    return MOE_OK;
}

moe_status score_grow(void **buf, int64_t *cap, int64_t need, size_t elem, moe_err *err) {
    if (need <= *cap) return MOE_OK;
    int64_t n = need > 2 * *cap ? need : 2 * *cap;
    void *p = realloc(*buf, (size_t)n * elem);
    if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    *buf = p;
    *cap = n;
    return MOE_OK;
}

/* Longest window first; ties in the caller's order (deterministic batches). */
static int cmp_win(const void *a, const void *b) {
    const score_win *x = *(score_win *const *)a, *y = *(score_win *const *)b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

/* The row position a continuing window starts at: the last shared token's (its prediction is
 * the first that can differ), after BOS. 0 (run whole): no parent, a parent that continues
 * another, or nothing shared before a position. */
static int64_t cont_start(const score_model *sm, const score_win *w) {
    if (!w->parent || w->parent->parent || w->share > w->n || w->share > w->parent->n ||
        w->share > w->from)
        return 0;
    return w->share + sm->nb - 1 >= 1 ? w->share + sm->nb - 1 : 0;
}

/* Continuing windows by their parent's batch, then start, then length, then the caller's
 * order: the windows of one continuing batch are neighbours. */
static int cmp_cont(const void *a, const void *b) {
    const score_win *x = *(score_win *const *)a, *y = *(score_win *const *)b;
    if (x->parent->batch != y->parent->batch) return x->parent->batch < y->parent->batch ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

/* Positions [p0, p0 + T) of window w's row BOS? + ids + padding into row/tgt [T]: position
 * t predicts token t + 1, a target where that token is scored and -1 elsewhere. */
static void fill_row(const score_model *sm, const score_win *w, int64_t p0, int32_t *row,
                     int32_t *tgt, int64_t T) {
    for (int64_t u = 0; u < T; u++) {
        int64_t t = p0 + u, j = t - sm->nb, next = t + 1 - sm->nb;
        row[u] = j < 0 ? sm->tok->bos_id : j < w->n ? w->ids[j] : sm->pad;
        tgt[u] = next >= w->from && next < w->n ? w->ids[next] : -1;
    }
}

/* Runs wins[0, B) (pointers), rows of T positions from p0 on (kv: cached keys, or NULL),
 * and sums each window's scored tokens into lp and sum. */
static moe_status run_batch(score_model *sm, score_win **wins, int64_t B, int64_t p0, int64_t T,
                            const moe_kv_use *kv, moe_err *err) {
    for (int64_t b = 0; b < B; b++)
        fill_row(sm, wins[b], p0, sm->tokens + b * T, sm->targets + b * T, T);
    moe_status st = moe_model_logprobs_kv(&sm->ck.model, sm->tokens, sm->targets, (int)B, (int)T,
                                          kv, sm->lp, err);
    for (int64_t b = 0; st == MOE_OK && b < B; b++) {
        score_win *w = wins[b];
        double sum = 0.0;
        for (int64_t j = w->from; j < w->n; j++) {
            float v = sm->lp[b * T + j + sm->nb - 1 - p0]; /* predicted at the token before */
            sum += v;
            if (w->lp) w->lp[j - w->from] = v;
        }
        w->sum = sum;
        sm->scored += w->n - w->from;
    }
    sm->windows += B;
    moe_progress_update(&sm->prog, sm->scored, NULL);
    return st;
}

/* The continuing windows c[0, n) of the parents in the batch just run (sorted by cmp_cont),
 * in batches that start at their first window's start P: a later window of a batch (a
 * larger start) runs its shared tokens from P on again - the same values, for at most an
 * eighth more positions than it scores - so that variants at different offsets (on the
 * window grid) still fill a batch. Rows end where the longest ends, within the cache's work
 * buffers. */
static moe_status run_continuing(score_model *sm, score_win **c, int64_t n, moe_err *err) {
    moe_status st = MOE_OK;
    for (int64_t i = 0; st == MOE_OK && i < n;) {
        const int64_t P = c[i]->start;
        int64_t end = 0, B = 0; /* the rows' end position */
        while (i + B < n && B < sm->max_batch) {
            const score_win *w = c[i + B];
            int64_t e = w->n + sm->nb > end ? w->n + sm->nb : end;
            if ((B + 1) * e > sm->kv.tokens || 8 * (w->start - P) > w->n + sm->nb - w->start) break;
            end = e;
            B++;
        }
        const int64_t T = end - P;
        for (int64_t b = 0; b < B; b++)
            sm->src[b] = (int32_t)c[i + b]->parent->row;
        moe_kv_use use = {NULL, &sm->kv, sm->src, P};
        st = run_batch(sm, c + i, B, P, T, &use, err);
        i += B;
    }
    return st;
}

moe_status score_model_run(score_model *sm, score_win *wins, int64_t n, moe_err *err) {
    if (n == 0) return MOE_OK; /* a chunk whose ALTs were all skipped (qsort wants an array) */
    if (score_grow((void **)&sm->order, &sm->cap_order, n, sizeof *sm->order, err) != MOE_OK)
        return err->status;
    /* the windows run whole (nr of them, sorted) first in order[], the continuing ones after */
    int64_t nr = 0, nc = 0;
    for (int64_t i = 0; i < n; i++) {
        wins[i].start = cont_start(sm, &wins[i]);
        if (!wins[i].start) sm->order[nr++] = &wins[i];
    }
    qsort(sm->order, (size_t)nr, sizeof *sm->order, cmp_win);
    /* batches of the whole windows: batch numbers and rows of the parents */
    for (int64_t i = 0, k = 0; i < nr; k++) {
        int64_t T = sm->order[i]->n + sm->nb, B = sm->batch_tokens / T;
        if (B < 1) B = 1;
        if (B > sm->cap_tokens / T) B = sm->cap_tokens / T;
        if (B > nr - i) B = nr - i;
        for (int64_t b = 0; b < B; b++)
            sm->order[i + b]->batch = k, sm->order[i + b]->row = b;
        i += B;
    }
    for (int64_t i = 0; i < n; i++)
        if (wins[i].start) sm->order[nr + nc++] = &wins[i];
    score_win **c = sm->order + nr;
    qsort(c, (size_t)nc, sizeof *c, cmp_cont);
    if (nc && !sm->kv.tokens) {
        if (moe_kv_cache_create(&sm->kv, &sm->ck.model, sm->cap_tokens, err) != MOE_OK)
            return err->status;
        sm->src = malloc((size_t)sm->max_batch * sizeof(int32_t));
        if (!sm->src) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        moe_log_info(
            "ALT windows continue their REF windows' cached keys (%.0f MiB)",
            (double)moe_kv_cache_bytes(&sm->ck.model.cfg, sm->ck.model.recipe, sm->kv.tokens) /
                (1 << 20));
    }
    moe_status st = MOE_OK;
    for (int64_t i = 0, ci = 0; st == MOE_OK && i < nr;) {
        const int64_t k = sm->order[i]->batch, T = sm->order[i]->n + sm->nb;
        int64_t B = 0, m = 0;
        while (i + B < nr && sm->order[i + B]->batch == k)
            B++;
        while (ci + m < nc && c[ci + m]->parent->batch == k)
            m++;
        moe_kv_use save = {&sm->kv, NULL, NULL, 0};
        st = run_batch(sm, sm->order + i, B, 0, T, m ? &save : NULL, err);
        if (st == MOE_OK && m) st = run_continuing(sm, c + ci, m, err);
        i += B;
        ci += m;
    }
    return st;
}

void score_model_finish(score_model *sm, moe_status st, const char *done, moe_score_summary *sum) {
    if (st == MOE_OK) moe_progress_finish(&sm->prog, done);
    sum->windows = sm->windows;
    sum->tokens = sm->scored;
    sum->load_seconds = sm->load_seconds;
    sum->seconds = sm->t_loaded > 0 ? moe_time_now() - sm->t_loaded : 0.0;
}

void score_model_pg_line(const score_model *sm, const char *command, char *out, size_t n) {
    out[0] = '#';
    moe_ckpt_provenance(&sm->ck.ckpt, "moe-score", command, out + 1, n - 2);
    size_t k = strlen(out);
    out[k] = '\n';
    out[k + 1] = '\0';
}

void score_model_close(score_model *sm) {
    if (sm->kv.tokens) moe_kv_cache_free(&sm->kv, &sm->ck.model);
    free(sm->src);
    free(sm->tokens);
    free(sm->targets);
    free(sm->lp);
    free(sm->order);
    moe_infer_ckpt_close(&sm->ck);
    memset(sm, 0, sizeof *sm);
}
