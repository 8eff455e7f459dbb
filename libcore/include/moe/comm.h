/* comm: the processes of a multi-process run (DESIGN "dist") - rank, world and local rank
 * from the launcher, the groups of data and expert parallelism, and the collectives the
 * trainer and the model's MoE block need.
 *
 * Launch: a program started by an MPI launcher (mpirun/mpiexec of Open MPI or MPICH, srun
 * --mpi=pmix or pmi2: recognised by OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK) initialises MPI
 * here; MPI's rank and size must agree with what the launcher announced. Any other start is
 * world 1, rank 0, and every collective is a no-op (all-to-all and gather copy their own
 * part), so callers use them unconditionally. Torchrun-style variables (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT; no MPI) give rank, world and local rank and say where
 * rank 0 listens for the TCP rendezvous (moe_comm.torchrun): the launch of GPU ranks, whose
 * NCCL communicators get their id that way. Such a launch starts no MPI: its collectives over
 * several ranks fail until a GPU backend attaches NCCL (moe_comm_attach_backend), and a CPU
 * run refuses it with a hint to use mpirun or srun (moe_comm_check_host). Local rank: LOCAL_RANK,
 * or under MPI the rank among the processes of the same node (MPI_COMM_TYPE_SHARED); it chooses a
 * rank's GPU.
 *
 * Groups (moe_comm_split): world = dp x ep, rank = d * ep + e. The ep CONSECUTIVE ranks
 * [d * ep, (d + 1) * ep) form expert group d (on a node of 8 GPUs with ep <= 8 the
 * all-to-all stays inside the node); rank e of every expert group holds the same experts,
 * and those dp ranks {e, ep + e, 2 ep + e, ...} are the dp group of that expert shard.
 *
 * Buffers: every operation takes elements of a moe_comm_dtype with int64 counts (chunked
 * where MPI's int counts demand). Two transports sit behind the same calls, chosen per
 * buffer, so callers never ask which one they have (the handles are opaque):
 *   - MPI moves host buffers: the CPU backend's memory, and the small host statistics of GPU
 *     ranks launched by mpirun/srun;
 *   - NCCL (moe_comm_attach_backend, builds with CUDA and NCCL) moves the CUDA backend's
 *     device buffers on its stream, and, for a torchrun-style launch (no MPI), host buffers
 *     too, through a device staging buffer. Once attached, every device buffer goes through
 *     NCCL, even on a group of one rank (world 1 runs the same path as world N).
 * A group of several ranks without a transport (a torchrun-style launch of CPU ranks) fails
 * every collective with MOE_ERR_RUNTIME.
 *
 * Failures: every operation is started non-blocking and waited for with a deadline of
 * moe_comm.timeout_s (parallel.timeout_s; 0 = none). A rank that died or hangs makes the
 * others miss the deadline: the first to notice prints which operation on which group
 * waited too long and ends the whole job (MPI_Abort). MPI errors return (MPI_ERRORS_RETURN)
 * as MOE_ERR_RUNTIME with MPI's message; callers end the job with moe_comm_abort. A NCCL
 * operation that misses the deadline or reports an asynchronous error aborts its
 * communicator (ncclCommAbort) and returns MOE_ERR_RUNTIME naming the operation and group;
 * moe_comm_abort then ends an MPI job, and torchrun ends the others of its launch.
 *
 * Rounding: a sum's rounding depends on the order of its terms, so a dp-rank run computes
 * the same function as one process accumulating the same micro-batches, equal up to
 * rounding (tested), while two runs with the same world size give the same bytes (MPI uses
 * the same reduction order for the same sizes). */
#ifndef MOE_COMM_H
#define MOE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "moe/err.h"

typedef enum moe_comm_group {
    MOE_COMM_WORLD = 0, /* all dp x ep ranks */
    MOE_COMM_EP,        /* the ep ranks of this rank's expert group */
    MOE_COMM_DP,        /* the dp ranks holding the same experts as this one */
    MOE_COMM_N_GROUPS
} moe_comm_group;

typedef enum moe_comm_dtype {
    MOE_COMM_F32 = 0,
    MOE_COMM_F64,
    MOE_COMM_I64,
    MOE_COMM_BYTE, /* raw bytes: all-to-all of rows, gathers; no sums */
    MOE_COMM_U16,  /* 2-byte elements moved as they are (bf16 AdamW moments); no sums */
    MOE_COMM_BF16, /* bf16 values; summed as NCCL sums them: each addition in fp32, the result
                      rounded to bf16 (nearest even) - the experts' gradients under
                      optim.expert_grads bf16 */
} moe_comm_dtype;

/* What the collectives cost this rank since the last moe_comm_stats_take, per group: seconds
 * in them (over MPI the blocking call's wall time; over NCCL the operation's own time on the
 * stream between CUDA events around it, so GPU work queued before it does not count) and
 * calls; of which the all-to-alls (the expert exchanges): seconds and the bytes this rank sent
 * to the other ranks. Every exchange waits for its completion (none overlaps compute), so
 * this time is all exposed. */
typedef struct moe_comm_stats {
    double seconds[MOE_COMM_N_GROUPS];
    int64_t calls[MOE_COMM_N_GROUPS];
    double a2a_seconds;
    int64_t a2a_bytes;
} moe_comm_stats;

typedef struct moe_comm {
    int rank, world, local_rank;
    int dp, ep;                   /* the layout (1 x world until moe_comm_split) */
    int grank[MOE_COMM_N_GROUPS]; /* this rank's place in each group */
    int gsize[MOE_COMM_N_GROUPS]; /* each group's size */
    double timeout_s;             /* deadline of every operation; 0 = none */
    int64_t chunk;                /* most elements one MPI call moves: INT_MAX / 2 (tests lower
                                     it to run the chunked paths) */
    int torchrun;                 /* 1: RANK and WORLD_SIZE started it (no MPI) */
    char master_addr[256];        /* MASTER_ADDR, MASTER_PORT of a torchrun launch ("", 0 when */
    int master_port;              /* unset: world 1 needs no rendezvous) */
    struct moe_comm_impl *impl;   /* MPI's handles; NULL: no MPI (one process, torchrun) */
    struct moe_comm_dev *dev;     /* NCCL's (moe_comm_attach_backend); NULL: host buffers only */
    moe_comm_stats stats;         /* the one field the (const) collectives write */
} moe_comm;

struct moe_backend;

/* Rank, world and local rank from the launcher (see above); world 1 when none started this
 * process. An MPI launch in a build without MPI, or an environment that contradicts itself
 * or MPI (half a torchrun set, RANK >= WORLD_SIZE, LOCAL_RANK >= WORLD_SIZE, MASTER_PORT not a
 * port, several torchrun ranks without LOCAL_RANK, MASTER_ADDR or MASTER_PORT) is
 * MOE_ERR_INPUT with a hint. */
moe_status moe_comm_init(moe_comm *c, int *argc, char ***argv, moe_err *err);
/* MOE_OK when host buffers (the CPU backend's) can travel between c's ranks: one process, or
 * MPI. A torchrun-style launch of several processes is MOE_ERR_INPUT with the mpirun / srun
 * command that starts the same ranks over MPI. */
moe_status moe_comm_check_host(const moe_comm *c, moe_err *err);
/* One process without a launcher: world 1, the groups of size 1, no deadline. */
void moe_comm_single(moe_comm *c);
/* Forms the groups for ep ranks per expert group (ep must divide world: MOE_ERR_INPUT) and
 * sets the deadline of every later operation (seconds, 0 = none). */
moe_status moe_comm_split(moe_comm *c, int ep, double timeout_s, moe_err *err);
/* Device buffers of be from now on: when be is a GPU backend and a launcher started the run
 * (MPI or torchrun-style, any world; after moe_comm_split), creates the NCCL communicators of
 * the world and of the ep and dp groups on be's device (rank 0's unique id shared by
 * moe_comm_share_blob), within moe_comm.timeout_s. Otherwise (a CPU backend, one process
 * without a launcher) does nothing. A GPU backend with several ranks in a build without NCCL
 * is MOE_ERR_INPUT with a hint; NCCL failures are MOE_ERR_RUNTIME. be must outlive the
 * attachment: moe_comm_detach_backend before be->destroy. */
moe_status moe_comm_attach_backend(moe_comm *c, const struct moe_backend *be, moe_err *err);
/* Releases the NCCL communicators (none: no-op); `failed` (the run ends in an error, so
 * other ranks may be gone) aborts them instead of a collective finalize. */
void moe_comm_detach_backend(moe_comm *c, int failed);
void moe_comm_finalize(moe_comm *c);
/* Ends every rank of the run with exit code `code` (after one rank failed: the others would
 * wait for it forever). Returns only when world is 1. */
void moe_comm_abort(const moe_comm *c, int code);

/* Rank 0's blob [len] (a NCCL unique id) into every rank's blob: an MPI broadcast under
 * mpirun/srun, the TCP rendezvous at MASTER_ADDR:MASTER_PORT for a torchrun-style launch
 * (comm_tcp.c), nothing for one process; within moe_comm.timeout_s (set by moe_comm_split).
 * Every rank calls it once with the same len. */
moe_status moe_comm_share_blob(const moe_comm *c, void *blob, size_t len, moe_err *err);

/* c's statistics since the last call (or the start), which start again from zero. */
moe_comm_stats moe_comm_stats_take(moe_comm *c);

/* Size in bytes of one element of dt. */
size_t moe_comm_dtype_size(moe_comm_dtype dt);

/* The collectives over group g; every rank of g calls them in the same order with the same
 * n / offsets. Sums are of F32, F64, I64 or BF16 elements. Slices: rank r of g owns elements
 * [offsets[r], offsets[r + 1]) of a flat buffer (offsets [gsize + 1], non-decreasing; a
 * slice may be empty). */

/* In-place sum: buf [n] on every rank. */
moe_status moe_comm_allreduce(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                              moe_comm_dtype dt, moe_err *err);
/* Sum of buf [offsets[gsize]] over g, of which this rank keeps its slice: afterwards
 * buf[offsets[r], offsets[r + 1]) holds the sum; the rest of buf is unspecified. */
moe_status moe_comm_reduce_scatter(const moe_comm *c, moe_comm_group g, void *buf,
                                   const int64_t *offsets, moe_comm_dtype dt, moe_err *err);
/* In-place all-gather(v): every rank's buf [offsets[gsize]] gets every rank's slice. */
moe_status moe_comm_allgather(const moe_comm *c, moe_comm_group g, void *buf,
                              const int64_t *offsets, moe_comm_dtype dt, moe_err *err);
/* Gather(v) to root: root's full [offsets[gsize]] gets every slice; `mine` is this rank's
 * slice [offsets[r + 1] - offsets[r]]; full may be NULL on the other ranks. */
moe_status moe_comm_gather(const moe_comm *c, moe_comm_group g, void *full, const void *mine,
                           const int64_t *offsets, int root, moe_comm_dtype dt, moe_err *err);
/* All-to-all(v): send [sum send_counts] holds, in rank order, send_counts[r] elements for
 * rank r of g; recv [sum recv_counts] gets, in rank order, recv_counts[s] elements from rank
 * s (which must equal what s sends here). Counts [gsize] may be 0; send and recv must not
 * overlap. */
moe_status moe_comm_alltoallv(const moe_comm *c, moe_comm_group g, const void *send,
                              const int64_t *send_counts, void *recv, const int64_t *recv_counts,
                              moe_comm_dtype dt, moe_err *err);
/* buf [n] of root to every rank of g. */
moe_status moe_comm_broadcast(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                              moe_comm_dtype dt, int root, moe_err *err);
moe_status moe_comm_barrier(const moe_comm *c, moe_comm_group g, moe_err *err);

#endif
