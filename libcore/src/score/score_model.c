/* score_model: the scoring engine of moe-score (score_internal.h) - a checkpoint opened for
 * log-probabilities, and windows of content tokens run through moe_model_logprobs in
 * batches of similar length.
 *
 * Flow of score_model_run: windows sorted by length, longest first (ties by their order in
 * the caller's list: deterministic) -> batches of at most batch_tokens padded tokens ->
 * rows BOS? + content + padding, targets = the next token where it is scored, -1 elsewhere
 * -> per-token log-probabilities back on the host, summed per window in double, in
 * position order. The one thing to know: right padding and per-token routing make a row's
 * numbers independent of its batch neighbours (up to the last bits of BLAS blocking), and
 * the batching depends only on the windows, so the same input gives the same bytes. */
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

/* Row b of the batch: BOS? + ids + padding [T]; targets: position p predicts token p + 1. */
static void fill_row(const score_model *sm, const score_win *w, int32_t *row, int32_t *tgt,
                     int64_t T) {
    int64_t t = 0;
    if (sm->nb) row[t++] = sm->tok->bos_id;
    memcpy(row + t, w->ids, (size_t)w->n * sizeof(int32_t));
    for (t += w->n; t < T; t++)
        row[t] = sm->pad;
    for (t = 0; t < T; t++)
        tgt[t] = -1;
    for (int64_t j = w->from; j < w->n; j++)
        tgt[j + sm->nb - 1] = w->ids[j];
}

moe_status score_model_run(score_model *sm, score_win *wins, int64_t n, moe_err *err) {
    if (n == 0) return MOE_OK; /* a chunk whose ALTs were all skipped (qsort wants an array) */
    if (score_grow((void **)&sm->order, &sm->cap_order, n, sizeof *sm->order, err) != MOE_OK)
        return err->status;
    for (int64_t i = 0; i < n; i++)
        sm->order[i] = &wins[i];
    qsort(sm->order, (size_t)n, sizeof *sm->order, cmp_win);
    moe_status st = MOE_OK;
    for (int64_t i = 0; st == MOE_OK && i < n;) {
        int64_t T = sm->order[i]->n + sm->nb;
        if (T < 1) T = 1;
        int64_t B = sm->batch_tokens / T;
        if (B < 1) B = 1;
        if (B > sm->cap_tokens / T) B = sm->cap_tokens / T;
        if (B > n - i) B = n - i;
        for (int64_t b = 0; b < B; b++)
            fill_row(sm, sm->order[i + b], sm->tokens + b * T, sm->targets + b * T, T);
        st =
            moe_model_logprobs(&sm->ck.model, sm->tokens, sm->targets, (int)B, (int)T, sm->lp, err);
        for (int64_t b = 0; st == MOE_OK && b < B; b++) {
            score_win *w = sm->order[i + b];
            double sum = 0.0;
            for (int64_t j = w->from; j < w->n; j++) {
                float v = sm->lp[b * T + j + sm->nb - 1]; /* predicted at the token before */
                sum += v;
                if (w->lp) w->lp[j - w->from] = v;
            }
            w->sum = sum;
            sm->scored += w->n - w->from;
        }
        sm->windows += B;
        i += B;
        moe_progress_update(&sm->prog, sm->scored, NULL);
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
    free(sm->tokens);
    free(sm->targets);
    free(sm->lp);
    free(sm->order);
    moe_infer_ckpt_close(&sm->ck);
    memset(sm, 0, sizeof *sm);
}
