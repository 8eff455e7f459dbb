/* tokenize_prefetch: the reader thread of moe_tokenize_run -@ N (see tokenize_prefetch.c).
 *
 * The one thing to know: batches are handed out numbered 0, 1, ... in exactly the order a
 * single-threaded moe_seqio loop over the inputs would give their records. */
#ifndef MOE_TOKENIZE_PREFETCH_H
#define MOE_TOKENIZE_PREFETCH_H

#include "moe/seqio.h"

typedef struct moe_prefetch moe_prefetch;
typedef struct moe_prefetch_batch moe_prefetch_batch;

/* Called on the reader thread with each batch as soon as it is filled, in batch order (seq
 * = 0, 1, ...); the batch is the receiver's until it gives it back with
 * moe_prefetch_release. Batch seq lives in slot seq % n_slots, so at most n_slots are out. */
typedef void (*moe_prefetch_filled_fn)(void *arg, moe_prefetch_batch *b, int64_t seq);

/* Starts a thread reading inputs[0, n_inputs) in order (inputs must outlive it) into a ring
 * of n_slots batches handed to filled(arg, ...). io->pool (with io->threads) decompresses;
 * it is the caller's and must outlive moe_prefetch_finish. */
moe_status moe_prefetch_start(moe_prefetch **out, const char *const *inputs, int n_inputs,
                              const moe_seqio_opts *io, int n_slots, moe_prefetch_filled_fn filled,
                              void *arg, moe_err *err);
int moe_prefetch_batch_size(const moe_prefetch_batch *b);
/* Record i of b (valid until b is released; name, seq, coordinates, record_no, line, raw
 * and ordinal, counted over all inputs) and the index of its input. */
void moe_prefetch_batch_record(const moe_prefetch_batch *b, int i, moe_seq_record *rec, int *input);
/* After b's records: -1 with err for a reader error; else 1 when b is the last batch, 0 when
 * not. filtered and empty are the counts of inputs the reader finished while filling b. */
int moe_prefetch_batch_end(const moe_prefetch_batch *b, int64_t *filtered, int64_t *empty,
                           moe_err *err);
void moe_prefetch_release(moe_prefetch *p, moe_prefetch_batch *b);
/* Makes the reader thread stop after the batch it is filling (which it still hands out). */
void moe_prefetch_stop(moe_prefetch *p);
/* Where the reader thread's time went (moe_time_now clock; seconds). */
typedef struct moe_prefetch_stats {
    double t_start, t_first, t_done; /* the thread started, filled its first batch, ended */
    double cpu;                      /* CPU time of the reader thread (with htslib's copy out) */
    double wait_free;                /* waiting for a batch to be released */
    int64_t batches;
} moe_prefetch_stats;

/* Stops the thread (if still running) and waits for it to end, copies its figures to stats
 * (may be NULL) and frees every batch: none may be in use any more. */
void moe_prefetch_finish(moe_prefetch *p, moe_prefetch_stats *stats);

#endif
