/* comm_nccl: the NCCL communicators of GPU ranks (code in kernels/comm_nccl.cu; only in builds
 * with CUDA and NCCL: MOE_HAVE_NCCL). Rank 0 makes a unique id, every rank gets the same
 * bytes (moe_comm_share_blob: MPI broadcast under mpirun/srun, the TCP rendezvous for a
 * torchrun-style launch), and each creates its world communicator on its CUDA backend's
 * device; the groups' communicators are split from it (ncclCommSplit). The dist layer
 * (dist/comm_dev.c) holds them behind moe/comm.h; the trainer never calls this header.
 *
 * Every operation is the moe/comm.h collective of the same name (same slices, same in-place
 * contract) and is WAITED FOR before it returns: queued on the backend's stream, then the
 * stream polled together with ncclCommGetAsyncError until it completes or the deadline
 * (timeout_s of moe_nccl_create; 0 = none) passes. A missed deadline or an asynchronous NCCL
 * error aborts the communicator (ncclCommAbort: its kernels end) and is MOE_ERR_RUNTIME
 * naming the operation, the group and the rank. The communicators are non-blocking (NCCL's
 * config.blocking = 0), so their creation and split are bounded by the deadline too.
 *
 * Buffers may be device memory (the backend's) or host memory: host buffers are copied
 * through a device staging buffer of the communicator (what a torchrun-style launch, which
 * has no MPI, does with the trainer's small statistics). */
#ifndef MOE_COMM_NCCL_H
#define MOE_COMM_NCCL_H

#include <stdint.h>

#include "moe/comm.h"
#include "moe/err.h"
#include "moe/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES) */

typedef struct moe_nccl moe_nccl; /* a communicator, its rank, group name and backend */

/* A fresh unique id into id [MOE_NCCL_ID_BYTES]; rank 0 calls it once per communicator. */
moe_status moe_nccl_unique_id(unsigned char *id, moe_err *err);
/* The communicator of rank of size ranks from id [MOE_NCCL_ID_BYTES] (the same bytes on every
 * rank) on the device of CUDA backend be, which must outlive it; group names it in messages
 * (a static string), timeout_s bounds every later wait. Waits until every rank has called it
 * (within timeout_s). NULL with err set on failure. */
moe_nccl *moe_nccl_create(const moe_backend *be, const unsigned char *id, int rank, int size,
                          double timeout_s, const char *group, moe_err *err);
/* The communicator of the ranks of parent that pass the same color, ordered by key
 * (ncclCommSplit); every rank of parent calls it. NULL with err set on failure. */
moe_nccl *moe_nccl_split(moe_nccl *parent, int color, int key, const char *group, moe_err *err);
/* 1 when p is CUDA device (or managed) memory, 0 for host memory. */
int moe_nccl_is_device(const void *p);

/* In-place sum of buf [n] (F32, F64 or I64) over the communicator's ranks. */
moe_status moe_nccl_allreduce(moe_nccl *c, void *buf, int64_t n, moe_comm_dtype dt, moe_err *err);
/* Reduce-scatter / all-gather(v) of the slices offsets [size + 1] of buf (moe/comm.h):
 * equal slices are one ncclReduceScatter / ncclAllGather in place, uneven ones one grouped
 * ncclReduce / ncclBroadcast per owner. */
moe_status moe_nccl_reduce_scatter(moe_nccl *c, void *buf, const int64_t *offsets,
                                   moe_comm_dtype dt, moe_err *err);
moe_status moe_nccl_allgather(moe_nccl *c, void *buf, const int64_t *offsets, moe_comm_dtype dt,
                              moe_err *err);
/* Gather(v) to root of each rank's mine [offsets[r + 1] - offsets[r]] into root's full
 * [offsets[size]] (NULL elsewhere): grouped ncclSend / ncclRecv. */
moe_status moe_nccl_gather(moe_nccl *c, void *full, const void *mine, const int64_t *offsets,
                           int root, moe_comm_dtype dt, moe_err *err);
/* All-to-all(v) of moe_comm_alltoallv (counts [size] per peer, in elements): grouped
 * ncclSend / ncclRecv. */
moe_status moe_nccl_alltoallv(moe_nccl *c, const void *send, const int64_t *send_counts, void *recv,
                              const int64_t *recv_counts, moe_comm_dtype dt, moe_err *err);
/* buf [n] of root to every rank. */
moe_status moe_nccl_broadcast(moe_nccl *c, void *buf, int64_t n, moe_comm_dtype dt, int root,
                              moe_err *err);
/* Returns once every rank has reached it (an all-reduce of one word). */
moe_status moe_nccl_barrier(moe_nccl *c, moe_err *err);
/* The last operation's time on the backend's stream (CUDA events before and after it, so
 * work queued before it does not count; host staging copies do), seconds; 0 after a failure. */
double moe_nccl_last_seconds(const moe_nccl *c);
/* Releases the communicator: ncclCommFinalize and ncclCommDestroy, or ncclCommAbort when
 * abort is set, an operation of it failed or the finalize misses the deadline (another rank
 * gone). NULL is a no-op. */
void moe_nccl_destroy(moe_nccl *c, int abort);

#ifdef __cplusplus
}
#endif

#endif
