/* score_internal: the scoring engine both subcommands share (score_model.c) - the model
 * opened for log-probabilities and a batched runner over windows of content tokens.
 * Private to libcore.
 *
 * The one thing to know: a window is its content tokens; the engine puts BOS in front when
 * the tokenizer adds one, and content token j (0-based) is scored as log P(ids[j] | BOS?,
 * ids[0, j)), so j = 0 is scorable only with a BOS (score_model.first). */
#ifndef MOE_SCORE_INTERNAL_H
#define MOE_SCORE_INTERNAL_H

#include <stdint.h>

#include "moe/embed.h"
#include "moe/log.h"
#include "moe/model.h"
#include "moe/score.h"

typedef struct score_win {
    const int32_t *ids; /* [n] content tokens (caller memory, alive during score_model_run) */
    int64_t n;
    int64_t from;  /* tokens [from, n) are scored; from >= score_model.first */
    float *lp;     /* [n - from] log-probabilities out (caller memory), or NULL */
    double sum;    /* out: their sum (nats), in position order */
    int64_t order; /* position in the caller's list: the tie-break of the length sort */
    /* A window whose first `share` content tokens are those of `parent` (another window of
     * the same list, without a parent of its own; from >= share) runs only from there on,
     * continuing the parent's cached keys: an ALT window after its REF window. NULL: run
     * whole. */
    const struct score_win *parent;
    int64_t share;
    /* score_model_run's: the row position a continuing window starts at (0: run whole), and
     * a window run whole's batch and row in it */
    int64_t start, batch, row;
} score_win;

typedef struct score_model {
    moe_infer_ckpt ck;
    const moe_tokenizer *tok;
    int nb;              /* 1: windows start with BOS */
    int64_t first;       /* first scorable content token: 0 with BOS, else 1 */
    int64_t max_content; /* content tokens per window: the model's context minus BOS */
    int32_t pad;
    int64_t max_seq, max_batch, cap_tokens, batch_tokens;
    int32_t *tokens, *targets; /* [cap_tokens] one batch */
    float *lp;                 /* [cap_tokens] */
    score_win **order;         /* sort scratch: the windows run whole, then the others */
    int64_t cap_order;
    moe_kv_cache kv; /* the parents' keys of one batch (kv.tokens = cap_tokens; 0: none yet) */
    int32_t *src;    /* [max_batch] a continuing batch's parent rows */
    moe_progress prog;
    int64_t scored, windows; /* tokens scored and windows run so far */
    double load_seconds;     /* opening the checkpoint and loading the model */
    double t_loaded;         /* moe_time_now() when the model was ready */
} score_model;

/* Makes *buf ([*cap] elements of elem bytes) hold at least need elements: grows to
 * max(need, 2 * cap); *buf and *cap unchanged when out of memory (MOE_ERR_RUNTIME). */
moe_status score_grow(void **buf, int64_t *cap, int64_t need, size_t elem, moe_err *err);

/* The window geometry of a model of `positions` positions with tokenizer tok into sm: tok,
 * nb, first, and max_content (max_content, or the context without BOS when it is <= 0 or
 * more). What score_model_open sets first; alone, it lets windows be built without a
 * model (tests/fuzz/fuzz_vcf). */
void score_model_geometry(score_model *sm, const moe_tokenizer *tok, int64_t positions,
                          int64_t max_content);
/* Opens the checkpoint, picks the backend (o->device, o->bf16 as moe-embed) and loads the
 * model for windows of up to max_content content tokens (0: the model's context).
 * what names the progress line ("score"). */
moe_status score_model_open(score_model *sm, const moe_score_model_opts *o, int64_t max_content,
                            const char *what, moe_err *err);
/* Scores wins[0, n) (any order, any lengths up to max_content): fills lp and sum of each.
 * The windows without a parent run batched longest first; after each batch, the windows
 * whose parents it holds continue them, batched by where they start and their length. Every
 * number depends only on its own window (up to the last bits of BLAS blocking). */
moe_status score_model_run(score_model *sm, score_win *wins, int64_t n, moe_err *err);
/* Ends the progress line with `done` (after a successful run) and fills the engine's part
 * of *sum: windows, tokens, load and scoring seconds. */
void score_model_finish(score_model *sm, moe_status st, const char *done, moe_score_summary *sum);
void score_model_close(score_model *sm);

#define SCORE_PG_MAX 8448 /* bytes of a provenance line: a command line and a path fit */
/* moe-score's provenance line into out [n >= 3]: "#" + the samtools-style @PG line of
 * moe_ckpt_provenance (version, command (NULL: no CL field), checkpoint id) + "\n". It is
 * the first line of every TSV that moe-score writes. */
void score_model_pg_line(const score_model *sm, const char *command, char *out, size_t n);

#endif
