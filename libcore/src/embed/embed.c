/* embed: the moe-embed pipeline (moe/embed.h) - read sequences in chunks, cut windows,
 * batch them longest first, run the model to the chosen layer, pool, write in input order.
 *
 * Flow per chunk (bounded by tokens and accumulator size, so memory does not grow with
 * the input): sequences are read and tokenized (and reverse-complemented) -> every window
 * of every strand becomes a work item -> items sorted by padded length (ties by position
 * in the input: deterministic) -> batches of at most batch_tokens padded tokens ->
 * moe_model_hidden_pooled (pooling on the backend; moe_model_hidden for --per-token) -> each
 * window's pooled vector (or its token rows) is added into its sequence's double accumulator ->
 * sequences are finished and written in input order. The one thing to know: every number a sequence
 * gets depends only on that sequence and the options (padding is right-side, attention causal,
 * routing per token), not on which other sequences share its batch - up to the last bits of BLAS
 * blocking. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "embed/embed_internal.h"
#include "moe/input.h"

void moe_embed_opts_defaults(moe_embed_opts *o) {
    memset(o, 0, sizeof *o);
    moe_seqio_opts_defaults(&o->io);
    o->dtype = MOE_NPY_F32;
    o->pool = MOE_EMBED_POOL_MEAN;
    o->layer = MOE_EMBED_LAYER_DEFAULT;
    o->batch_tokens = 8192;
    o->device = MOE_DEVICE_AUTO;
    o->bf16 = -1;
}

typedef struct embed_win {
    int64_t seq;   /* index in the chunk */
    int64_t k;     /* window index within its strand */
    int64_t start; /* content tokens [start, end) in forward coordinates */
    int64_t end;
    int64_t T;     /* tokens fed to the model: BOS? + content + EOS? */
    int64_t bases; /* bases its content covers (progress is counted in bases) */
    int rc;        /* 1: a window of the reverse complement (its range: flush_chunk) */
} embed_win;

typedef struct embedder {
    const moe_embed_opts *o;
    moe_infer_ckpt ck;
    const moe_tokenizer *tok;
    int64_t C, W, S, max_seq, max_batch, cap_tokens;
    int layer, nb, ne;
    int32_t pad;
    embed_seq *seqs;
    int64_t n_seqs, cap_seqs, chunk_tokens, chunk_acc;
    embed_win *wins;
    int64_t cap_wins;
    int32_t *tokens; /* [cap_tokens] one batch */
    int32_t *range;  /* [cap_tokens, 2] pooled positions of each row (B <= cap_tokens) */
    float *hidden;   /* [cap_tokens, C] token rows (--per-token), or [B, C] vectors */
    embed_out out;
    moe_progress prog; /* in bases of windows: total = those of the chunks flushed so far */
    int64_t bases_done;
    moe_embed_summary sum;
} embedder;

/* ---- windows and batches ---- */

static int64_t n_windows(const embedder *e, int64_t n) {
    if (n <= e->W) return 1;
    int64_t k = 1;
    for (int64_t s = 0; s + e->W < n; s += e->S)
        k++;
    return k;
}

static int cmp_win(const void *a, const void *b) {
    const embed_win *x = a, *y = b;
    if (x->T != y->T) return x->T > y->T ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    if (x->rc != y->rc) return x->rc - y->rc;
    return x->k < y->k ? -1 : (x->k > y->k);
}

/* Adds the token rows h [Tw, C] of one window (--per-token) to its sequence's rows. */
static void add_token_rows(embedder *e, const embed_win *w, const float *h) {
    embed_seq *s = &e->seqs[w->seq];
    int64_t C = e->C;
    for (int64_t j = 0; j < w->end - w->start; j++) {
        int64_t pos = w->rc ? w->end - 1 - j : w->start + j;
        const float *src = h + (e->nb + j) * C;
        double *dst = s->acc + pos * C;
        for (int64_t c = 0; c < C; c++)
            dst[c] += src[c];
        s->cover[pos]++;
    }
}

/* The positions a window's vector pools: its content tokens (its last position for `last`;
 * all of BOS/EOS when it has no content). range [2]: first, count. */
static void pool_range(const embedder *e, const embed_win *w, int32_t *range) {
    int64_t cnt = w->end - w->start;
    if (e->o->pool == MOE_EMBED_POOL_LAST)
        range[0] = (int32_t)(w->T - 1), range[1] = 1;
    else if (cnt == 0)
        range[0] = 0, range[1] = (int32_t)w->T;
    else
        range[0] = (int32_t)e->nb, range[1] = (int32_t)cnt;
}

/* Adds a window's pooled vector v [C] where it belongs (its window row or the mean). */
static void add_window_vector(embedder *e, const embed_win *w, const float *v) {
    embed_seq *s = &e->seqs[w->seq];
    double *dst = e->o->per_window ? s->acc + w->k * e->C : s->acc;
    for (int64_t c = 0; c < e->C; c++)
        dst[c] += v[c];
}

/* Runs windows [0, n) (sorted, longest first) through the model in batches; pooling happens
 * on the backend, so only [B, C] per batch comes back (all rows with --per-token). */
static moe_status run_windows(embedder *e, embed_win *wins, int64_t n, moe_err *err) {
    moe_status st = MOE_OK;
    for (int64_t i = 0; st == MOE_OK && i < n;) {
        int64_t T = wins[i].T;
        int64_t B = e->o->batch_tokens / T;
        if (B < 1) B = 1;
        if (B > e->cap_tokens / T) B = e->cap_tokens / T;
        if (B > n - i) B = n - i;
        for (int64_t b = 0; b < B; b++) {
            const embed_win *w = &wins[i + b];
            const embed_seq *s = &e->seqs[w->seq];
            int32_t *row = e->tokens + b * T;
            int64_t t = 0;
            if (e->nb) row[t++] = e->tok->bos_id;
            if (w->rc)
                memcpy(row + t, s->rc + (s->n - w->end), (size_t)(w->end - w->start) * 4);
            else
                memcpy(row + t, s->ids + w->start, (size_t)(w->end - w->start) * 4);
            t += w->end - w->start;
            if (e->ne) row[t++] = e->tok->eos_id;
            for (; t < T; t++)
                row[t] = e->pad;
            pool_range(e, w, e->range + 2 * b);
        }
        if (e->o->per_token)
            st =
                moe_model_hidden(&e->ck.model, e->tokens, (int)B, (int)T, e->layer, e->hidden, err);
        else
            st =
                moe_model_hidden_pooled(&e->ck.model, e->tokens, (int)B, (int)T, e->layer, e->range,
                                        e->o->pool == MOE_EMBED_POOL_MAX, e->hidden, err);
        for (int64_t b = 0; st == MOE_OK && b < B; b++) {
            if (e->o->per_token)
                add_token_rows(e, &wins[i + b], e->hidden + b * T * e->C);
            else
                add_window_vector(e, &wins[i + b], e->hidden + b * e->C);
            e->sum.tokens += wins[i + b].end - wins[i + b].start;
        }
        for (int64_t b = 0; b < B; b++)
            e->bases_done += wins[i + b].bases;
        e->sum.windows += B;
        i += B;
        moe_progress_update(&e->prog, e->bases_done, NULL);
    }
    return st;
}

static void free_chunk(embedder *e) {
    for (int64_t i = 0; i < e->n_seqs; i++) {
        embed_seq *s = &e->seqs[i];
        free(s->name);
        free(s->ids);
        free(s->rc);
        free(s->acc);
        free(s->cover);
        free(s->span);
    }
    e->n_seqs = e->chunk_tokens = e->chunk_acc = 0;
}

/* Embeds and writes the sequences of the current chunk, then empties it. */
static moe_status flush_chunk(embedder *e, moe_err *err) {
    int strands = e->o->rc_average ? 2 : 1;
    int64_t nw = 0;
    for (int64_t i = 0; i < e->n_seqs; i++)
        nw += e->seqs[i].n_win * strands;
    if (nw > e->cap_wins) {
        embed_win *p = realloc(e->wins, (size_t)nw * sizeof *p);
        if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        e->wins = p;
        e->cap_wins = nw;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < e->n_seqs; i++) {
        const embed_seq *s = &e->seqs[i];
        for (int r = 0; r < strands; r++)
            for (int64_t k = 0; k < s->n_win; k++) {
                embed_win *w = &e->wins[m++];
                w->seq = i;
                w->k = k;
                w->rc = r;
                int64_t a = k * e->S, b = a + e->W < s->n ? a + e->W : s->n;
                /* The reverse strand's windows: with --per-window the complement of the
                 * same bases (window k of both strands covers one region); otherwise the
                 * reverse complement's own window grid, [a, b) counted from its start,
                 * which is forward range [n - b, n - a). Then a sequence and its reverse
                 * complement average the very same set of windows: exact invariance. */
                if (r && !e->o->per_window) {
                    w->start = s->n - b;
                    w->end = s->n - a;
                } else {
                    w->start = a;
                    w->end = b;
                }
                w->T = (w->end - w->start) + e->nb + e->ne;
                w->bases =
                    w->end > w->start ? s->span[2 * (w->end - 1) + 1] - s->span[2 * w->start] : 0;
                e->prog.total += w->bases; /* one long record still shows a percentage */
            }
    }
    qsort(e->wins, (size_t)m, sizeof *e->wins, cmp_win);
    moe_status st = run_windows(e, e->wins, m, err);
    int64_t C = e->C;
    for (int64_t i = 0; st == MOE_OK && i < e->n_seqs; i++) {
        embed_seq *s = &e->seqs[i];
        if (e->o->per_token) {
            for (int64_t t = 0; t < s->n; t++)
                for (int64_t c = 0; c < C; c++)
                    s->acc[t * C + c] /= s->cover[t];
        } else if (e->o->per_window) {
            for (int64_t k = 0; k < s->n_win * C; k++)
                s->acc[k] /= strands;
        } else {
            for (int64_t c = 0; c < C; c++)
                s->acc[c] /= (double)(s->n_win * strands);
        }
        st = moe_embed_out_seq(&e->out, e->o, s, e->S, e->W, err);
        e->sum.rows = e->out.rows;
    }
    free_chunk(e);
    return st;
}

/* ---- input ---- */

/* Fills s->span [n, 2] with each token's base range: from src->pos when the reader has the
 * tokens' first bases, else back to back from base 0 (a token's length is what it decodes
 * to: 0 for specials). */
static void fill_spans(const embedder *e, embed_seq *s, const moe_input_seq *src) {
    char buf[64];
    int64_t at = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (src->pos) at = src->pos[i];
        s->span[2 * i] = at;
        at += moe_tokenizer_decode(e->tok, s->ids + i, NULL, 1, buf);
        s->span[2 * i + 1] = at;
    }
}

/* Adds one sequence (content tokens ids [n]; rc [n] or NULL) to the chunk. */
static moe_status add_seq(embedder *e, const char *name, int64_t bases, const int32_t *ids,
                          int64_t n, const int32_t *rc, const moe_input_seq *src, moe_err *err) {
    if (n == 0 && e->nb + e->ne == 0) {
        moe_log_warn("sequence %s has no tokens and the tokenizer adds no BOS/EOS: skipped", name);
        e->sum.skipped++;
        return MOE_OK;
    }
    if (e->n_seqs == e->cap_seqs) {
        int64_t cap = e->cap_seqs ? 2 * e->cap_seqs : 256;
        embed_seq *p = realloc(e->seqs, (size_t)cap * sizeof *p);
        if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        e->seqs = p;
        e->cap_seqs = cap;
    }
    embed_seq *s = &e->seqs[e->n_seqs];
    memset(s, 0, sizeof *s);
    s->bases = bases;
    s->src_start = src->src_start;
    s->strand = src->strand;
    s->flip = src->flip;
    s->n = n;
    s->n_win = n_windows(e, n);
    int64_t rows = e->o->per_token ? n : e->o->per_window ? s->n_win : 1;
    s->name = strdup(name);
    s->ids = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    s->acc = calloc((size_t)(rows ? rows : 1) * (size_t)e->C, sizeof(double));
    if (rc) s->rc = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (e->o->per_token) s->cover = calloc((size_t)(n ? n : 1), sizeof(int32_t));
    s->span = malloc((size_t)(n ? n : 1) * 2 * sizeof(int64_t));
    e->n_seqs++; /* owned by the chunk from here, freed on every path */
    if (!s->name || !s->ids || !s->acc || !s->span || (rc && !s->rc) ||
        (e->o->per_token && !s->cover))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    memcpy(s->ids, ids, (size_t)n * sizeof(int32_t));
    fill_spans(e, s, src);
    if (rc) memcpy(s->rc, rc, (size_t)n * sizeof(int32_t));
    e->sum.sequences++;
    e->chunk_tokens += n * (rc ? 2 : 1);
    e->chunk_acc += rows * e->C;
    /* bounded chunks: ~64 full batches of work or 32 M accumulator doubles */
    if (e->chunk_tokens >= 64 * e->cap_tokens || e->chunk_acc >= (32 << 20) || e->n_seqs >= 100000)
        return flush_chunk(e, err);
    return MOE_OK;
}

/* moe_input_fn: one sequence of the input into the chunk. */
static moe_status take_seq(void *ctx, const moe_input_seq *in, moe_err *err) {
    return add_seq(ctx, in->name, in->bases, in->ids, in->n, in->rc, in, err);
}

/* ---- setup ---- */

static moe_status setup(embedder *e, const moe_embed_opts *o, moe_err *err) {
    if (o->per_token && o->per_window) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "--per-token and --per-window exclude each other");
        return MOE_ERR_INPUT;
    }
    if (o->window < 0 || o->stride < 0 || (o->stride && !o->window) || o->stride > o->window ||
        o->batch_tokens < 1) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--window must be >= 1, --stride between 1 and the window (and only with "
                    "--window), --batch-tokens >= 1");
        return MOE_ERR_INPUT;
    }
    moe_status st = moe_infer_ckpt_open(&e->ck, o->ckpt_dir, err);
    if (st != MOE_OK) return st;
    e->tok = e->ck.ckpt.tok;
    const moe_model_config *mc = &e->ck.ckpt.cfg.model;
    e->C = mc->hidden_size;
    e->nb = e->tok->opts.add_bos && e->tok->bos_id >= 0;
    e->ne = e->tok->opts.add_eos && e->tok->eos_id >= 0;
    e->pad = e->tok->pad_id >= 0 ? e->tok->pad_id : 0;
    int64_t ctx = mc->max_position_embeddings - e->nb - e->ne;
    if (o->window > ctx) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--window %" PRId64 " plus BOS/EOS exceeds the model's context of %" PRId64
                    " tokens",
                    o->window, mc->max_position_embeddings);
        moe_err_hint(err, "use --window %" PRId64 " or less", ctx);
        return MOE_ERR_INPUT;
    }
    e->W = o->window ? o->window : ctx;
    e->S = o->stride ? o->stride : e->W;
    int L = (int)mc->num_hidden_layers;
    e->layer = o->layer == MOE_EMBED_LAYER_DEFAULT ? L : o->layer < 0 ? L + 1 + o->layer : o->layer;
    if (e->layer < 0 || e->layer > L) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--layer %d is outside the model's %d layers (0 = embeddings .. %d = final "
                    "norm, -1 = final norm, -%d = embeddings)",
                    o->layer, L, L, L + 1);
        return MOE_ERR_INPUT;
    }
    if (o->rc_average && moe_input_check_rc(e->tok, err) != MOE_OK) return err->status;
    e->max_seq = e->W + e->nb + e->ne;
    int64_t cap = o->batch_tokens > e->max_seq ? o->batch_tokens : e->max_seq;
    e->max_batch = (cap + e->max_seq - 1) / e->max_seq;
    e->cap_tokens = e->max_batch * e->max_seq;
    st = moe_infer_ckpt_load_model(&e->ck, o->device, o->threads, o->bf16, (int)e->max_batch,
                                   (int)e->max_seq, err);
    if (st != MOE_OK) return st;
    e->tokens = malloc((size_t)e->cap_tokens * sizeof(int32_t));
    e->range = malloc((size_t)e->cap_tokens * 2 * sizeof(int32_t));
    e->hidden = malloc((size_t)e->cap_tokens * (size_t)e->C * sizeof(float));
    if (!e->tokens || !e->range || !e->hidden)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    moe_log_info("checkpoint %s: %s tokenizer, hidden %" PRId64 ", layer %d of %d (%s), %s "
                 "pooling%s, windows of %" PRId64 " tokens every %" PRId64 ", %s backend",
                 e->ck.ckpt.dir, e->tok->name, e->C, e->layer, L,
                 e->layer == L   ? "final norm"
                 : e->layer == 0 ? "embeddings"
                                 : "layer output",
                 o->per_token                     ? "no"
                 : o->pool == MOE_EMBED_POOL_MAX  ? "max"
                 : o->pool == MOE_EMBED_POOL_LAST ? "last"
                                                  : "mean",
                 o->rc_average ? " with reverse-complement averaging" : "", e->W, e->S,
                 e->ck.be->name);
    char prov[4096];
    moe_ckpt_provenance(&e->ck.ckpt, "moe-embed", o->command, prov, sizeof prov);
    return moe_embed_out_open(&e->out, o, e->C, prov, err);
}

moe_status moe_embed_run(const moe_embed_opts *o, moe_embed_summary *sum, moe_err *err) {
    embedder e;
    memset(&e, 0, sizeof e);
    e.o = o;
    double t0 = moe_time_now();
    moe_status st = setup(&e, o, err);
    double t1 = moe_time_now();
    e.sum.load_seconds = t1 - t0;
    moe_progress_start(&e.prog, "embed", "bases", 0);
    if (o->quiet) e.prog.enabled = e.prog.tty = 0;
    for (int i = 0; st == MOE_OK && i < o->n_inputs; i++)
        st = moe_input_read(o->inputs[i], &o->io, e.tok, o->rc_average, take_seq, &e, err);
    if (st == MOE_OK && e.n_seqs) st = flush_chunk(&e, err);
    free_chunk(&e);
    if (st == MOE_OK) {
        st = moe_embed_out_commit(&e.out, err);
        char extra[96];
        snprintf(extra, sizeof extra, "%" PRId64 " sequences, %" PRId64 " rows", e.sum.sequences,
                 e.sum.rows);
        moe_progress_finish(&e.prog, extra);
    } else {
        moe_embed_out_abort(&e.out);
    }
    e.sum.cols = e.C;
    e.sum.seconds = moe_time_now() - t1;
    size_t peak = 0;
    if (e.ck.be) e.ck.be->memory(e.ck.be, NULL, &peak); /* 0 on the CPU */
    e.sum.device_peak_bytes = (int64_t)peak;
    if (sum) *sum = e.sum;
    free(e.seqs);
    free(e.wins);
    free(e.tokens);
    free(e.range);
    free(e.hidden);
    moe_infer_ckpt_close(&e.ck);
    return st;
}
