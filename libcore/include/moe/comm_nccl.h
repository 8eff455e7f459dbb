/* comm_nccl: the NCCL communicator of GPU ranks (code in kernels/comm_nccl.cu; only in builds
 * with CUDA and NCCL: MOE_HAVE_NCCL). Rank 0 makes a unique id, every rank gets the same
 * bytes (moe_comm_share_blob: MPI broadcast under mpirun/srun, the TCP rendezvous for a
 * torchrun-style launch), and each creates its communicator on its CUDA backend's device;
 * collectives run on that backend's stream.
 *
 * Not yet called by the trainer (more than one GPU rank is still refused there) and not yet
 * run on a GPU: tests/gpu/test_comm_nccl.c (gpu.comm_nccl, e2e.comm_nccl_gpu) is the first
 * thing to run on one. Errors are MOE_ERR_RUNTIME with ncclGetErrorString's text and the
 * rank; a hang of another rank is not yet bounded by a deadline here (NCCL's asynchronous
 * error handling comes with the trainer's use). */
#ifndef MOE_COMM_NCCL_H
#define MOE_COMM_NCCL_H

#include <stdint.h>

#include "moe/err.h"
#include "moe/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES) */

typedef struct moe_nccl moe_nccl; /* a communicator, its rank and backend */

/* A fresh unique id into id [MOE_NCCL_ID_BYTES]; rank 0 calls it once per communicator. */
moe_status moe_nccl_unique_id(unsigned char *id, moe_err *err);
/* The communicator of rank of world from id [MOE_NCCL_ID_BYTES] (the same bytes on every
 * rank) on the device of CUDA backend be, which must outlive it. Blocks until every rank
 * has called it. NULL with err set on failure. */
moe_nccl *moe_nccl_create(const moe_backend *be, const unsigned char *id, int rank, int world,
                          moe_err *err);
/* In-place sum over the communicator's ranks of buf [n] fp32 dev (memory of its backend),
 * queued on the backend's stream: be->synchronize waits for it. */
moe_status moe_nccl_allreduce_f32(moe_nccl *c, float *buf, int64_t n, moe_err *err);
/* Releases the communicator (ncclCommDestroy); NULL is a no-op. */
void moe_nccl_destroy(moe_nccl *c);

#ifdef __cplusplus
}
#endif

#endif
