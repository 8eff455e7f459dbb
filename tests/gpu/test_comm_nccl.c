/* test_comm_nccl: the NCCL communicator (moe/comm_nccl.h) brought up the way the trainer
 * will: the launch from the environment (moe_comm_init: mpirun/srun, torchrun-style
 * variables, or none), the rank's GPU by its local rank (moe_backend_rank_device), rank 0's
 * unique id shared (moe_comm_share_blob: MPI broadcast or the TCP rendezvous), the
 * communicator on the CUDA backend's device, then an fp32 all-reduce of a device buffer on
 * the backend's stream, checked against the sum every rank can compute (exact: small
 * multiples of 0.5). gpu.comm_nccl runs it alone (world 1); e2e.comm_nccl_gpu runs it with
 * RANK=0 WORLD_SIZE=1 MASTER_ADDR/MASTER_PORT and under mpirun -np 1; the same binary runs
 * on more GPUs by either launch. Exits 77 without NCCL in the build or without a GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "moe/comm.h"
#include "moe/ops.h"
#include "testlib.h"
#ifdef MOE_HAVE_NCCL
#include "moe/comm_nccl.h"

/* The all-reduce of n floats over c's ranks on be, checked element by element. */
static void check_allreduce(const moe_comm *c, const moe_backend *be, moe_nccl *nc, int64_t n) {
    moe_err err;
    moe_err_clear(&err);
    float *host = malloc((size_t)n * sizeof *host);
    float *dev = be->alloc(be, (size_t)n * sizeof *dev);
    CHECK(host && dev);
    if (!host || !dev) return;
    for (int64_t i = 0; i < n; i++)
        host[i] = 0.5f * (float)((c->rank + 1) * (i % 1000));
    be->memcpy_h2d(be, dev, host, (size_t)n * sizeof *host);
    CHECK_MSG(moe_nccl_allreduce_f32(nc, dev, n, &err) == MOE_OK, "%s", err.msg);
    CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "%s", err.msg);
    be->memcpy_d2h(be, host, dev, (size_t)n * sizeof *host);
    CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "%s", err.msg);
    int64_t bad = 0;
    double ranks = c->world * (c->world + 1) / 2.0; /* sum of rank + 1 */
    for (int64_t i = 0; i < n; i++)
        bad += host[i] != (float)(0.5 * ranks * (double)(i % 1000));
    CHECK_MSG(bad == 0, "%lld of %lld sums differ", (long long)bad, (long long)n);
    be->free(be, dev);
    free(host);
}
#endif

int main(int argc, char **argv) {
#ifndef MOE_HAVE_NCCL
    (void)argc, (void)argv;
    printf("skip: this build has no NCCL\n");
    return 77;
#else
    int gpus = moe_backend_gpu_count();
    if (gpus == 0) {
        printf("skip: no CUDA device\n");
        return 77;
    }
    moe_comm c; /* one process until moe_comm_init succeeds */
    moe_err err;
    moe_err_clear(&err);
    char dev[32];
    const moe_backend *be = NULL;
    moe_nccl *nc = NULL;
    unsigned char id[MOE_NCCL_ID_BYTES] = {0};
    int ok = moe_comm_init(&c, &argc, &argv, &err) == MOE_OK &&
             moe_comm_split(&c, 1, 60, &err) == MOE_OK &&
             moe_backend_rank_device("cuda", c.local_rank, gpus, dev, sizeof dev, &err) == MOE_OK &&
             (be = moe_backend_open(dev, MOE_RECIPE_FP32, 0, &err)) != NULL &&
             (c.rank != 0 || moe_nccl_unique_id(id, &err) == MOE_OK) &&
             moe_comm_share_blob(&c, id, sizeof id, &err) == MOE_OK &&
             (nc = moe_nccl_create(be, id, c.rank, c.world, &err)) != NULL;
    CHECK_MSG(ok, "rank %d of %d (%s): %s", c.rank, c.world,
              c.torchrun ? "torchrun-style" : "MPI or no launcher", err.msg);
    if (ok) {
        check_allreduce(&c, be, nc, 1);
        check_allreduce(&c, be, nc, (1 << 20) + 3);
    }
    moe_nccl_destroy(nc);
    if (be) be->destroy(be);
    char name[48];
    snprintf(name, sizeof name, "comm_nccl[rank %d of %d]", c.rank, c.world);
    int rc = test_summary(name);
    moe_comm_finalize(&c);
    return rc;
#endif
}
