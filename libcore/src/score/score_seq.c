/* score_seq: `moe-score seq` (moe/score.h) - log-likelihood of every input sequence, and
 * with --per-position the log-probability of every token.
 *
 * Flow per chunk (bounded by tokens, so memory does not grow with the input): sequences
 * read through moe/input.h (tokens, and the reverse complement's with --rc-average) ->
 * each strand cut into context windows (window_grid) -> all windows scored by the engine
 * (score_model.c) straight into the strand's per-token array -> per sequence the sums,
 * bits per base and perplexity -> rows written in input order.
 *
 *   TSV        name length log_likelihood bits_per_base perplexity (after a "#@PG" provenance
 *              line and a header line)
 *   .npy       float32 [tokens]: token i of a sequence at row first_row + i (NaN where no
 *              strand scores it: the first token without a BOS, single-strand)
 *   .ids.tsv   row name length tokens first_row log_likelihood bits_per_base perplexity
 *              (after the same two lines)
 *
 * The one thing to know: with --rc-average a position's value is the mean over the strands
 * that score it (the reverse strand's token n-1-i is the complement of token i), and a
 * sequence's log-likelihood is the mean of the two strand sums, so a sequence and its
 * reverse complement get the same log-likelihood. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/fileio.h"
#include "moe/input.h"
#include "moe/npy.h"
#include "score/score_internal.h"

void moe_score_seq_opts_defaults(moe_score_seq_opts *o) {
    memset(o, 0, sizeof *o);
    moe_seqio_opts_defaults(&o->io);
    o->m.device = MOE_DEVICE_AUTO;
    o->m.bf16 = -1;
    o->m.batch_tokens = 8192;
}

typedef struct seq_item {
    char *name;
    int64_t bases, n;
    int32_t *ids[2]; /* [n] forward, reverse complement (or NULL) */
    float *lp[2];    /* [n] per strand, in that strand's token order; NaN = not scored */
} seq_item;

typedef struct seq_scorer {
    const moe_score_seq_opts *o;
    score_model sm;
    int64_t W, N;       /* content tokens per window, left context of the later ones */
    uint8_t *tok_bases; /* [vocab] bases per token id */
    seq_item *items;
    int64_t n_items, cap_items, chunk_tokens;
    score_win *wins;
    int64_t cap_wins;
    moe_outfile tsv, ids;
    int tsv_open, ids_open;
    moe_npy_writer npy;
    int npy_open;
    char ids_path[4200];
    int64_t rows;
    float *row; /* [n] scratch of one sequence's per-position values */
    int64_t cap_row;
    moe_score_summary sum;
} seq_scorer;

/* ---- windows ---- */

/* The next window of a strand of n tokens after the one ending at *end (0 = none yet):
 * tokens [g[0], g[2]) fed, [g[1], g[2]) scored. Returns 0 when the strand is covered. */
static int window_next(const seq_scorer *s, int64_t n, int64_t *end, int64_t g[3]) {
    if (*end >= n || n <= s->sm.first) return 0;
    g[0] = *end == 0 ? 0 : *end - s->N;
    g[1] = *end == 0 ? s->sm.first : *end;
    g[2] = g[0] + s->W < n ? g[0] + s->W : n;
    *end = g[2];
    return 1;
}

/* ---- output ---- */

/* Opens the TSV (or the .npy and its .ids.tsv) and writes the provenance line and header. */
static moe_status out_open(seq_scorer *s, moe_err *err) {
    const moe_score_seq_opts *o = s->o;
    const char *out = o->output ? o->output : "-";
    char pg[SCORE_PG_MAX];
    score_model_pg_line(&s->sm, o->m.command, pg, sizeof pg);
    if (!o->per_position) {
        moe_status st = moe_outfile_open(&s->tsv, out, err);
        if (st != MOE_OK) return st;
        s->tsv_open = 1;
        const char *hdr = "name\tlength\tlog_likelihood\tbits_per_base\tperplexity\n";
        st = moe_outfile_write(&s->tsv, pg, strlen(pg), err);
        return st == MOE_OK ? moe_outfile_write(&s->tsv, hdr, strlen(hdr), err) : st;
    }
    size_t len = strlen(out);
    if (strcmp(out, "-") == 0 || len < 5 || strcmp(out + len - 4, ".npy") != 0) {
        moe_err_set(err, MOE_ERR_INPUT, out, "--per-position writes a .npy file, not '%s'", out);
        moe_err_hint(err, "give -o FILE.npy (FILE.ids.tsv is written beside it)");
        return MOE_ERR_INPUT;
    }
    snprintf(s->ids_path, sizeof s->ids_path, "%.*s.ids.tsv", (int)(len - 4), out);
    moe_status st = moe_npy_writer_open(&s->npy, out, MOE_NPY_F32, 0, err);
    if (st != MOE_OK) return st;
    s->npy_open = 1;
    st = moe_outfile_open(&s->ids, s->ids_path, err);
    if (st != MOE_OK) return st;
    s->ids_open = 1;
    const char *hdr =
        "row\tname\tlength\ttokens\tfirst_row\tlog_likelihood\tbits_per_base\tperplexity\n";
    st = moe_outfile_write(&s->ids, pg, strlen(pg), err);
    return st == MOE_OK ? moe_outfile_write(&s->ids, hdr, strlen(hdr), err) : st;
}

/* The finished sequence: strand sums -> its row (and its per-position values). */
static moe_status out_seq(seq_scorer *s, const seq_item *it, moe_err *err) {
    int strands = it->ids[1] ? 2 : 1;
    double ll = 0.0, ntok = 0.0, nbases = 0.0;
    for (int r = 0; r < strands; r++)
        for (int64_t i = 0; i < it->n; i++)
            if (!isnan(it->lp[r][i])) {
                ll += it->lp[r][i];
                ntok += 1.0;
                nbases += s->tok_bases[it->ids[r][i]];
            }
    ll /= strands;
    double bpb = nbases > 0 ? -ll / log(2.0) / (nbases / strands) : NAN;
    double ppl = exp(-ll / (ntok / strands));
    char line[4608];
    moe_status st;
    if (!s->o->per_position) {
        snprintf(line, sizeof line, "%s\t%" PRId64 "\t%.10g\t%.6g\t%.6g\n", it->name, it->bases, ll,
                 bpb, ppl);
        st = moe_outfile_write(&s->tsv, line, strlen(line), err);
    } else {
        snprintf(line, sizeof line,
                 "%" PRId64 "\t%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%.10g\t%.6g\t%.6g\n",
                 s->sum.sequences, it->name, it->bases, it->n, s->rows, ll, bpb, ppl);
        st = moe_outfile_write(&s->ids, line, strlen(line), err);
        for (int64_t i = 0; st == MOE_OK && i < it->n; i++) {
            double v = 0.0;
            int c = 0;
            if (!isnan(it->lp[0][i])) v += it->lp[0][i], c++;
            if (strands == 2 && !isnan(it->lp[1][it->n - 1 - i]))
                v += it->lp[1][it->n - 1 - i], c++;
            s->row[i] = c ? (float)(v / c) : NAN;
        }
        if (st == MOE_OK) st = moe_npy_writer_append(&s->npy, s->row, it->n, err);
        s->rows += it->n;
    }
    s->sum.sequences++;
    return st;
}

/* Puts every output under its final name (the .npy before its .ids.tsv). */
static moe_status out_commit(seq_scorer *s, moe_err *err) {
    moe_status st = MOE_OK;
    if (s->tsv_open) s->tsv_open = 0, st = moe_outfile_commit(&s->tsv, err);
    if (st == MOE_OK && s->npy_open) s->npy_open = 0, st = moe_npy_writer_commit(&s->npy, err);
    if (st == MOE_OK && s->ids_open) s->ids_open = 0, st = moe_outfile_commit(&s->ids, err);
    return st;
}

/* Removes what out_commit did not commit; safe to call after it. */
static void out_abort(seq_scorer *s) {
    if (s->tsv_open) moe_outfile_abort(&s->tsv);
    if (s->npy_open) moe_npy_writer_abort(&s->npy);
    if (s->ids_open) moe_outfile_abort(&s->ids);
    s->tsv_open = s->npy_open = s->ids_open = 0;
}

/* ---- chunks ---- */

static void free_chunk(seq_scorer *s) {
    for (int64_t i = 0; i < s->n_items; i++) {
        seq_item *it = &s->items[i];
        free(it->name);
        for (int r = 0; r < 2; r++)
            free(it->ids[r]), free(it->lp[r]);
    }
    s->n_items = s->chunk_tokens = 0;
}

/* Scores and writes the sequences of the chunk, then empties it. */
static moe_status flush_chunk(seq_scorer *s, moe_err *err) {
    int64_t nw = 0, maxn = 0, g[3];
    for (int64_t i = 0; i < s->n_items; i++) {
        const seq_item *it = &s->items[i];
        for (int64_t end = 0; window_next(s, it->n, &end, g);)
            nw += it->ids[1] ? 2 : 1;
        if (it->n > maxn) maxn = it->n;
    }
    if (score_grow((void **)&s->wins, &s->cap_wins, nw, sizeof *s->wins, err) != MOE_OK ||
        score_grow((void **)&s->row, &s->cap_row, maxn, sizeof *s->row, err) != MOE_OK)
        return err->status;
    int64_t m = 0;
    for (int64_t i = 0; i < s->n_items; i++) {
        seq_item *it = &s->items[i];
        for (int r = 0; r < 2 && it->ids[r]; r++)
            for (int64_t end = 0; window_next(s, it->n, &end, g);) {
                score_win *w = &s->wins[m];
                w->ids = it->ids[r] + g[0];
                w->n = g[2] - g[0];
                w->from = g[1] - g[0];
                w->lp = it->lp[r] + g[1];
                w->order = m++;
                w->parent = NULL;
            }
    }
    moe_status st = score_model_run(&s->sm, s->wins, m, err);
    for (int64_t i = 0; st == MOE_OK && i < s->n_items; i++)
        st = out_seq(s, &s->items[i], err);
    free_chunk(s);
    return st;
}

/* moe_input_fn: one sequence into the chunk (a sequence with no scorable token: skipped). */
static moe_status take_seq(void *ctx, const moe_input_seq *in, moe_err *err) {
    seq_scorer *s = ctx;
    if (in->n <= s->sm.first) {
        moe_log_warn("sequence %s has no token with a left context to score: skipped", in->name);
        s->sum.skipped++;
        return MOE_OK;
    }
    if (score_grow((void **)&s->items, &s->cap_items, s->n_items + 1, sizeof *s->items, err) !=
        MOE_OK)
        return err->status;
    seq_item *it = &s->items[s->n_items++]; /* owned by the chunk from here */
    memset(it, 0, sizeof *it);
    it->bases = in->bases;
    it->n = in->n;
    it->name = strdup(in->name);
    int strands = in->rc ? 2 : 1;
    for (int r = 0; r < strands; r++) {
        it->ids[r] = malloc((size_t)in->n * sizeof(int32_t));
        it->lp[r] = malloc((size_t)in->n * sizeof(float));
        if (!it->ids[r] || !it->lp[r])
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        memcpy(it->ids[r], r ? in->rc : in->ids, (size_t)in->n * sizeof(int32_t));
        for (int64_t i = 0; i < in->n; i++)
            it->lp[r][i] = NAN;
    }
    if (!it->name) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    s->chunk_tokens += in->n * strands;
    if (s->chunk_tokens >= 64 * s->sm.cap_tokens || s->n_items >= 100000)
        return flush_chunk(s, err);
    return MOE_OK;
}

/* ---- run ---- */

/* Model, window grid (--context checked against the window), bases per token, outputs. */
static moe_status setup(seq_scorer *s, const moe_score_seq_opts *o, moe_err *err) {
    moe_status st = score_model_open(&s->sm, &o->m, 0, "score", err);
    if (st != MOE_OK) return st;
    s->W = s->sm.max_content;
    s->N = o->context ? o->context : s->W / 2;
    if (s->N < s->sm.first || s->N >= s->W) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--context %" PRId64 " must be between %" PRId64 " and %" PRId64
                    " (the window of %" PRId64 " tokens minus one)",
                    s->N, s->sm.first, s->W - 1, s->W);
        moe_err_hint(err, "the window is the model's context (max_position_embeddings) minus "
                          "BOS; each later window repeats --context tokens of left context");
        return MOE_ERR_INPUT;
    }
    const moe_tokenizer *tok = s->sm.tok;
    s->tok_bases = calloc((size_t)tok->vocab_size, 1);
    if (!s->tok_bases) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    char buf[16];
    for (int32_t id = 0; id < tok->vocab_size; id++)
        s->tok_bases[id] = (uint8_t)moe_tokenizer_decode(tok, &id, NULL, 1, buf);
    moe_log_info("windows of %" PRId64 " tokens with %" PRId64 " tokens of left context%s", s->W,
                 s->N, o->m.rc_average ? ", averaged with the reverse complement" : "");
    return out_open(s, err);
}

moe_status moe_score_seq_run(const moe_score_seq_opts *o, moe_score_summary *sum, moe_err *err) {
    seq_scorer s;
    memset(&s, 0, sizeof s);
    s.o = o;
    moe_status st = setup(&s, o, err);
    for (int i = 0; st == MOE_OK && i < o->n_inputs; i++)
        st = moe_input_read(o->inputs[i], &o->io, s.sm.tok, o->m.rc_average, take_seq, &s, err);
    if (st == MOE_OK && s.n_items) st = flush_chunk(&s, err);
    free_chunk(&s);
    if (st == MOE_OK) st = out_commit(&s, err);
    out_abort(&s);
    char done[64];
    snprintf(done, sizeof done, "%" PRId64 " sequences", s.sum.sequences);
    score_model_finish(&s.sm, st, done, &s.sum);
    if (sum) *sum = s.sum;
    free(s.items);
    free(s.wins);
    free(s.row);
    free(s.tok_bases);
    score_model_close(&s.sm);
    return st;
}
