/* comm: the processes of a multi-process run (DESIGN "dist") - rank and world size from the
 * launcher, and the collectives the trainer needs.
 *
 * A program started by an MPI launcher (mpirun/mpiexec of Open MPI or MPICH, srun with PMI:
 * recognised by their environment variables) initialises MPI here and gets its rank; any
 * other start is world 1, rank 0, and every collective returns at once, so callers use them
 * unconditionally. Sums are MPI_SUM on host buffers.
 *
 * The one thing to know: a sum's rounding depends on the order of its terms, so a dp-rank
 * run computes the same function as one process accumulating the same micro-batches, equal
 * up to rounding (tested), while two runs with the same world size give the same bytes (a
 * sum over two ranks is one commutative addition per element; larger worlds rely on MPI
 * choosing the same reduction for the same size, which Open MPI does). Device buffers
 * (NCCL) are not handled here yet: data parallelism runs on the CPU backend. */
#ifndef MOE_COMM_H
#define MOE_COMM_H

#include <stdint.h>

#include "moe/err.h"

typedef struct moe_comm {
    int rank, world;
    int mpi; /* 1: MPI was initialised by moe_comm_init (finalize it) */
} moe_comm;

/* Rank and world from the launcher (see above); world 1 when none started this process.
 * Started by an MPI launcher in a build without MPI: MOE_ERR_INPUT with a hint. */
moe_status moe_comm_init(moe_comm *c, int *argc, char ***argv, moe_err *err);
void moe_comm_finalize(moe_comm *c);
/* Ends every rank of the run with exit code `code` (after one rank failed: the others would
 * wait for it forever). Returns only when world is 1. */
void moe_comm_abort(const moe_comm *c, int code);

/* In-place sums over all ranks; buf [n] host, the same n on every rank. */
moe_status moe_comm_sum_f32(const moe_comm *c, float *buf, int64_t n, moe_err *err);
moe_status moe_comm_sum_f64(const moe_comm *c, double *buf, int64_t n, moe_err *err);
moe_status moe_comm_sum_i64(const moe_comm *c, int64_t *buf, int64_t n, moe_err *err);
/* Slices of a flat array: rank r owns [offsets[r], offsets[r + 1]) (offsets [world + 1]).
 * allgather: every rank's buf [offsets[world]] gets every rank's slice from its owner.
 * gather: root's full [offsets[world]] gets every slice; `mine` is this rank's slice
 * [offsets[rank + 1] - offsets[rank]]; full may be NULL on the other ranks. Host buffers. */
moe_status moe_comm_allgather_f32(const moe_comm *c, float *buf, const int64_t *offsets,
                                  moe_err *err);
moe_status moe_comm_gather_f32(const moe_comm *c, float *full, const float *mine,
                               const int64_t *offsets, int root, moe_err *err);

#endif
