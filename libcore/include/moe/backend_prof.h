/* backend_prof: a profiling wrapper around any backend table (ops.h), for "where does a
 * training step spend its time" on the GPU.
 *
 * moe_backend_prof_wrap(inner) returns a table whose every entry calls the same entry of
 * `inner`; op entries (and the memory copies/sets) are bracketed by inner->synchronize and
 * moe_time_now, and their seconds and calls are accumulated per op and direction. Results are
 * bit-identical to the inner backend's: the wrapper only adds waits.
 *
 * The one thing a reader must know: waiting for the device around every op removes the
 * overlap of host work with queued device work and adds one synchronisation per op, so a
 * profiled step is somewhat slower than an unprofiled one. Take throughput from an
 * unprofiled run; use these figures for the split between op kinds. */
#ifndef MOE_BACKEND_PROF_H
#define MOE_BACKEND_PROF_H

#include <stdint.h>
#include <stdio.h>

#include "moe/err.h"
#include "moe/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Op kinds the time is reported by. */
typedef enum moe_prof_kind {
    MOE_PROF_ATTENTION,   /* attention forward/backward */
    MOE_PROF_EXPERT_GEMM, /* grouped matmul (the expert w1/w3/w2 GEMMs) */
    MOE_PROF_DENSE_GEMM,  /* matmul: q/k/v/o projections, router gate, lm_head */
    MOE_PROF_OTHER,       /* embedding, norms, rope, swiglu, router, permute, loss, add,
                             optimizer (adamw, sum_squares) */
    MOE_PROF_MEMORY,      /* memcpy h2d/d2h/d2d and memset issued through the table */
    MOE_PROF_KIND_COUNT
} moe_prof_kind;

/* Accumulated figures; index [op][0] = forward (or the op's only direction: add, adamw,
 * sum_squares), [op][1] = backward. */
typedef struct moe_backend_prof_stats {
    double op_seconds[MOE_OP_COUNT][2];
    int64_t op_calls[MOE_OP_COUNT][2];
    double mem_seconds; /* memory copies and sets */
    int64_t mem_calls;
    int64_t host_syncs; /* calls that make the host wait for the device (in an unprofiled
                           run too): synchronize, memcpy_h2d and _d2h, sum_squares */
} moe_backend_prof_stats;

/* Wraps `inner` (which must outlive the wrapper). Returns NULL with a runtime error when out
 * of host memory. The table's name is the inner backend's name; alloc/free, supports and
 * memory are forwarded untimed; destroy frees the wrapper (as moe_backend_prof_free), never
 * the inner backend. synchronize() reports the first error any bracketing wait saw, else the
 * inner backend's. */
const moe_backend *moe_backend_prof_wrap(const moe_backend *inner, moe_err *err);
/* The wrapped backend. */
const moe_backend *moe_backend_prof_inner(const moe_backend *prof);
/* Frees the wrapper, not the inner backend. NULL is ok. */
void moe_backend_prof_free(const moe_backend *prof);

/* Copies the accumulated figures into *out / sets them all to zero. */
void moe_backend_prof_get(const moe_backend *prof, moe_backend_prof_stats *out);
void moe_backend_prof_reset(const moe_backend *prof);

/* Kind of an op; "attention", "expert GEMMs", "dense GEMMs", "other ops", "memory". */
moe_prof_kind moe_backend_prof_kind_of(moe_op op);
const char *moe_backend_prof_kind_name(moe_prof_kind kind);
/* Seconds and calls of one kind in s (both directions summed). */
double moe_backend_prof_kind_seconds(const moe_backend_prof_stats *s, moe_prof_kind kind,
                                     int64_t *calls /* may be NULL */);

/* Prints a table (kind, ms per step, share, calls per step), then per op and direction, for
 * stats accumulated over `steps` steps whose profiled wall time was `wall_seconds` in all;
 * the remainder (host work outside the table's entries) is its own line. */
void moe_backend_prof_print(const moe_backend_prof_stats *s, int steps, double wall_seconds,
                            FILE *f);

#ifdef __cplusplus
}
#endif

#endif
