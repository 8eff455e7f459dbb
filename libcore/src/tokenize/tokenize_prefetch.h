/* tokenize_prefetch: the reader thread of moe_tokenize_run (see tokenize_prefetch.c).
 *
 * The one thing to know: records come out in exactly the order a single-threaded
 * moe_seqio loop over the inputs would give them. */
#ifndef MOE_TOKENIZE_PREFETCH_H
#define MOE_TOKENIZE_PREFETCH_H

#include "moe/seqio.h"

typedef struct moe_prefetch moe_prefetch;

/* Starts a thread reading inputs[0, n_inputs) in order (inputs must outlive it). */
moe_status moe_prefetch_start(moe_prefetch **out, const char *const *inputs, int n_inputs,
                              const moe_seqio_opts *io, moe_err *err);
/* Next record (valid until the next call; name, seq, coordinates and record_no only) and
 * the index of its input. 1: a record, 0: all inputs done, -1: error in err. filtered and
 * empty are increased by the counts of inputs the reader has finished. */
int moe_prefetch_next(moe_prefetch *p, moe_seq_record *rec, int *input, int64_t *filtered,
                      int64_t *empty, moe_err *err);
/* Stops the thread (if still running) and frees everything. */
void moe_prefetch_finish(moe_prefetch *p);

#endif
