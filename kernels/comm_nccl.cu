/* comm_nccl: the NCCL half of the dist layer (moe/comm_nccl.h) - unique id, communicator on
 * the CUDA backend's device, an fp32 all-reduce on its stream. Built only when CMake found
 * NCCL (MOE_HAVE_NCCL). The one thing a reader must know: ncclCommInitRank blocks until every
 * rank of the communicator has called it, so all ranks must reach moe_nccl_create. */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "moe/comm_nccl.h"

static_assert(sizeof(ncclUniqueId) == MOE_NCCL_ID_BYTES, "MOE_NCCL_ID_BYTES is NCCL's id size");

struct moe_nccl {
    ncclComm_t comm;
    int rank;              /* for messages */
    const moe_backend *be; /* device and stream */
};

/* MOE_ERR_RUNTIME naming what failed on which rank with NCCL's message for r. */
static moe_status nccl_fail(moe_err *err, ncclResult_t r, int rank, const char *what) {
    moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: NCCL %s failed: %s", rank, what,
                ncclGetErrorString(r));
    if (r == ncclSystemError || r == ncclRemoteError)
        moe_err_hint(err, "another rank died or the network between the ranks failed; "
                          "NCCL_DEBUG=WARN prints NCCL's view");
    else
        moe_err_hint(err, "NCCL_DEBUG=INFO prints NCCL's view of the failure");
    return MOE_ERR_RUNTIME;
}

extern "C" moe_status moe_nccl_unique_id(unsigned char *id, moe_err *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(err, r, 0, "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return MOE_OK;
}

extern "C" moe_nccl *moe_nccl_create(const moe_backend *be, const unsigned char *id, int rank,
                                     int world, moe_err *err) {
    moe_cuda_ctx *cx = moe_cuda_ctx_of(be);
    moe_nccl *c = (moe_nccl *)calloc(1, sizeof *c);
    if (!c) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory creating a NCCL communicator");
        return NULL;
    }
    c->rank = rank, c->be = be;
    cudaError_t e = cudaSetDevice(cx->device);
    if (e != cudaSuccess) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: cudaSetDevice(%d): %s", rank, cx->device,
                    cudaGetErrorString(e));
        free(c);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&c->comm, world, u, rank);
    if (r != ncclSuccess) {
        nccl_fail(err, r, rank, "ncclCommInitRank");
        free(c);
        return NULL;
    }
    return c;
}

extern "C" moe_status moe_nccl_allreduce_f32(moe_nccl *c, float *buf, int64_t n, moe_err *err) {
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, c->comm,
                                   moe_cuda_ctx_of(c->be)->stream);
    return r == ncclSuccess ? MOE_OK : nccl_fail(err, r, c->rank, "ncclAllReduce");
}

extern "C" void moe_nccl_destroy(moe_nccl *c) {
    if (!c) return;
    ncclCommDestroy(c->comm);
    free(c);
}
