/* test_comm_nccl: the collectives of moe/comm.h over NCCL, brought up the way the trainer
 * does: the launch from the environment (moe_comm_init: mpirun/srun, torchrun-style
 * variables, or none), the groups (moe_comm_split: ep = 2 when the world is even, else 1),
 * the rank's GPU by its local rank (moe_backend_rank_device), then moe_comm_attach_backend
 * (rank 0's unique id shared by MPI broadcast or the TCP rendezvous, the world communicator
 * and its ep / dp splits). On every group: all-reduce (f32 on the device, f64 and i64 host
 * statistics), reduce-scatter and all-gather of equal and of uneven slices, gather, broadcast,
 * all-to-all(v) with empty parts and a barrier, each checked against what every rank computes
 * on the host (exact: small multiples of 0.5). Host buffers go through MPI under mpirun and
 * through NCCL's staging buffer under a torchrun-style launch. Started without a launcher it
 * makes itself a world-1 torchrun-style launch (RANK=0 WORLD_SIZE=1): gpu.comm_nccl runs it
 * that way; e2e.comm_nccl_gpu runs it with RANK=0 WORLD_SIZE=1 MASTER_ADDR /
 * MASTER_PORT, under mpirun -np 1, and on 2 GPUs both ways when 2 are visible. Exits 77
 * without NCCL in the build or without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/ops.h"
#include "testlib.h"

#ifdef MOE_HAVE_NCCL
/* The value rank r contributes at element i: small multiples of 0.5, exact in any sum. */
static float val(int r, int64_t i) {
    return 0.5f * (float)((r + 1) * (i % 1000));
}

/* be's copy of host [n] floats (free with be->free), or NULL. */
static float *to_dev(const moe_backend *be, const float *host, int64_t n) {
    float *d = be->alloc(be, (size_t)(n ? n : 1) * sizeof *d);
    if (d) be->memcpy_h2d(be, d, host, (size_t)n * sizeof *d);
    return d;
}

/* host [n] from dev, after the queued work (checked). */
static void from_dev(const moe_backend *be, float *host, const float *dev, int64_t n) {
    moe_err err;
    moe_err_clear(&err);
    be->memcpy_d2h(be, host, dev, (size_t)n * sizeof *host);
    CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "%s", err.msg);
}

/* All-reduce of n device floats over g: every element the sum of val over g's ranks. */
static void check_allreduce(const moe_comm *c, moe_comm_group g, const moe_backend *be, int64_t n) {
    moe_err err;
    moe_err_clear(&err);
    int size = c->gsize[g], me = c->grank[g];
    float *host = malloc((size_t)n * sizeof *host);
    for (int64_t i = 0; host && i < n; i++)
        host[i] = val(me, i);
    float *dev = host ? to_dev(be, host, n) : NULL;
    CHECK(host && dev);
    if (!host || !dev) return;
    CHECK_MSG(moe_comm_allreduce(c, g, dev, n, MOE_COMM_F32, &err) == MOE_OK, "%s", err.msg);
    from_dev(be, host, dev, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += host[i] != 0.25f * (float)(size * (size + 1) * (i % 1000));
    CHECK_MSG(bad == 0, "all-reduce over group %d: %lld of %lld sums differ", g, (long long)bad,
              (long long)n);
    be->free(be, dev);
    free(host);
}

/* The trainer's statistics: f64 and i64 sums of host buffers. */
static void check_host_sums(const moe_comm *c, moe_comm_group g) {
    moe_err err;
    moe_err_clear(&err);
    int size = c->gsize[g], me = c->grank[g];
    double d[6];
    int64_t k[37];
    for (int i = 0; i < 6; i++)
        d[i] = 0.25 * (me + 1) * (i + 1);
    for (int i = 0; i < 37; i++)
        k[i] = (int64_t)(me + 1) * i * 1000003;
    CHECK_MSG(moe_comm_allreduce(c, g, d, 6, MOE_COMM_F64, &err) == MOE_OK, "%s", err.msg);
    CHECK_MSG(moe_comm_allreduce(c, g, k, 37, MOE_COMM_I64, &err) == MOE_OK, "%s", err.msg);
    int64_t ranks = (int64_t)size * (size + 1) / 2;
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(d[i], 0.25 * (double)ranks * (i + 1), 0);
    for (int i = 0; i < 37; i++)
        CHECK_INT_EQ(k[i], ranks * i * 1000003);
}

/* Reduce-scatter then all-gather of total device floats over g, sliced evenly (total a
 * multiple of the size) or not: after the first the own slice holds the sums, after the
 * second every slice holds its owner's (the own slice's sums, scaled by the owner). */
static void check_slices(const moe_comm *c, moe_comm_group g, const moe_backend *be,
                         int64_t total) {
    moe_err err;
    moe_err_clear(&err);
    int size = c->gsize[g], me = c->grank[g];
    int64_t *off = malloc((size_t)(size + 1) * sizeof *off);
    float *host = malloc((size_t)total * sizeof *host);
    CHECK(off && host);
    if (!off || !host) return;
    for (int r = 0; r <= size; r++)
        off[r] = total * r / size;
    for (int64_t i = 0; i < total; i++)
        host[i] = val(me, i);
    float *dev = to_dev(be, host, total);
    CHECK_MSG(moe_comm_reduce_scatter(c, g, dev, off, MOE_COMM_F32, &err) == MOE_OK, "%s", err.msg);
    from_dev(be, host, dev, total);
    float ranks = 0.5f * (float)(size * (size + 1));
    int64_t bad = 0;
    for (int64_t i = off[me]; i < off[me + 1]; i++)
        bad += host[i] != 0.5f * ranks * (float)(i % 1000);
    CHECK_MSG(bad == 0, "reduce-scatter of %lld over group %d: %lld sums differ", (long long)total,
              g, (long long)bad);
    /* all-gather: own slice = val(me), the rest poisoned */
    for (int64_t i = 0; i < total; i++)
        host[i] = i >= off[me] && i < off[me + 1] ? val(me, i) : -1.0f;
    be->memcpy_h2d(be, dev, host, (size_t)total * sizeof *host);
    CHECK_MSG(moe_comm_allgather(c, g, dev, off, MOE_COMM_F32, &err) == MOE_OK, "%s", err.msg);
    from_dev(be, host, dev, total);
    bad = 0;
    for (int r = 0; r < size; r++)
        for (int64_t i = off[r]; i < off[r + 1]; i++)
            bad += host[i] != val(r, i);
    CHECK_MSG(bad == 0, "all-gather of %lld over group %d: %lld elements differ", (long long)total,
              g, (long long)bad);
    /* gather to the last rank of the group: mine is a separate buffer */
    int root = size - 1;
    int64_t own = off[me + 1] - off[me];
    for (int64_t i = 0; i < own; i++)
        host[i] = val(me, off[me] + i) + 1.0f;
    float *mine = to_dev(be, host, own);
    be->memset(be, dev, 0, (size_t)total * sizeof *dev);
    CHECK_MSG(moe_comm_gather(c, g, me == root ? dev : NULL, mine, off, root, MOE_COMM_F32, &err) ==
                  MOE_OK,
              "%s", err.msg);
    if (me == root) {
        from_dev(be, host, dev, total);
        bad = 0;
        for (int r = 0; r < size; r++)
            for (int64_t i = off[r]; i < off[r + 1]; i++)
                bad += host[i] != val(r, i) + 1.0f;
        CHECK_MSG(bad == 0, "gather of %lld over group %d: %lld elements differ", (long long)total,
                  g, (long long)bad);
    }
    be->free(be, mine);
    be->free(be, dev);
    free(host);
    free(off);
}

/* Bytes rank s sends to rank r of a group: some parts empty. */
static int64_t a2a_count(int s, int r) {
    return (int64_t)((s + r) % 3) * 5;
}
static unsigned char a2a_byte(int s, int r, int64_t i) {
    return (unsigned char)(s * 31 + r * 7 + i);
}

/* All-to-all(v) of device bytes, broadcasts of a host and a device buffer, a barrier. */
static void check_exchange(const moe_comm *c, moe_comm_group g, const moe_backend *be) {
    moe_err err;
    moe_err_clear(&err);
    int size = c->gsize[g], me = c->grank[g];
    int64_t sc[64], rc[64], sn = 0, rn = 0;
    unsigned char hs[64 * 10], hr[64 * 10];
    CHECK(size <= 64);
    if (size > 64) return;
    for (int r = 0; r < size; r++) {
        sc[r] = a2a_count(me, r), rc[r] = a2a_count(r, me);
        for (int64_t i = 0; i < sc[r]; i++)
            hs[sn + i] = a2a_byte(me, r, i);
        sn += sc[r], rn += rc[r];
    }
    unsigned char *ds = be->alloc(be, (size_t)sn + 1), *dr = be->alloc(be, (size_t)rn + 1);
    CHECK(ds && dr);
    if (ds && dr) {
        be->memcpy_h2d(be, ds, hs, (size_t)sn);
        (void)moe_comm_stats_take((moe_comm *)c);
        CHECK_MSG(moe_comm_alltoallv(c, g, ds, sc, dr, rc, MOE_COMM_BYTE, &err) == MOE_OK, "%s",
                  err.msg);
        /* timed by CUDA events around the NCCL operation: positive, and counted once */
        const moe_comm_stats st = moe_comm_stats_take((moe_comm *)c);
        CHECK_MSG(st.calls[g] == 1 && st.a2a_seconds > 0 && st.a2a_seconds == st.seconds[g] &&
                      st.a2a_bytes == sn - sc[me],
                  "all-to-all over group %d: stats calls %lld, %g s of %g, %lld bytes", g,
                  (long long)st.calls[g], st.a2a_seconds, st.seconds[g], (long long)st.a2a_bytes);
        be->memcpy_d2h(be, hr, dr, (size_t)rn);
        CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "%s", err.msg);
        int64_t o = 0, bad = 0;
        for (int s = 0; s < size; o += rc[s], s++)
            for (int64_t i = 0; i < rc[s]; i++)
                bad += hr[o + i] != a2a_byte(s, me, i);
        CHECK_MSG(bad == 0, "all-to-all over group %d: %lld of %lld bytes differ", g,
                  (long long)bad, (long long)rn);
    }
    be->free(be, ds);
    be->free(be, dr);
    char name[64]; /* as the trainer's checkpoint directory name */
    snprintf(name, sizeof name, "%s", me == 0 ? "run/ckpt-00000006.tmp-12345" : "unset");
    CHECK_MSG(moe_comm_broadcast(c, g, name, sizeof name, MOE_COMM_BYTE, 0, &err) == MOE_OK, "%s",
              err.msg);
    CHECK(strcmp(name, "run/ckpt-00000006.tmp-12345") == 0);
    float h[3] = {val(me, 1), val(me, 2), val(me, 3)}, *d = to_dev(be, h, 3);
    CHECK_MSG(moe_comm_broadcast(c, g, d, 3, MOE_COMM_F32, size - 1, &err) == MOE_OK, "%s",
              err.msg);
    from_dev(be, h, d, 3);
    CHECK(h[0] == val(size - 1, 1) && h[2] == val(size - 1, 3));
    be->free(be, d);
    CHECK_MSG(moe_comm_barrier(c, g, &err) == MOE_OK, "%s", err.msg);
}

/* Every collective over group g. */
static void check_group(const moe_comm *c, moe_comm_group g, const moe_backend *be) {
    check_allreduce(c, g, be, 1);
    check_allreduce(c, g, be, (1 << 20) + 3);
    check_host_sums(c, g);
    check_slices(c, g, be, 4096 * (int64_t)c->gsize[g]); /* equal slices */
    check_slices(c, g, be, 1000003);                     /* uneven */
    check_exchange(c, g, be);
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
    int ok = moe_comm_init(&c, &argc, &argv, &err) == MOE_OK;
    if (ok && !c.torchrun && !c.impl) { /* no launcher: be a world-1 torchrun-style one */
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "1", 1);
        ok = moe_comm_init(&c, &argc, &argv, &err) == MOE_OK;
    }
    ok = ok && moe_comm_split(&c, c.world % 2 == 0 ? 2 : 1, 60, &err) == MOE_OK &&
         moe_backend_rank_device("cuda", c.local_rank, gpus, dev, sizeof dev, &err) == MOE_OK &&
         (be = moe_backend_open(dev, MOE_RECIPE_FP32, 0, &err)) != NULL &&
         moe_comm_attach_backend(&c, be, &err) == MOE_OK;
    CHECK_MSG(ok, "rank %d of %d (%s): %s", c.rank, c.world,
              c.torchrun ? "torchrun-style" : "MPI or no launcher", err.msg);
    CHECK_MSG(!ok || c.dev, "rank %d: a GPU backend under a launcher attached no NCCL", c.rank);
    if (ok && c.dev)
        for (int g = 0; g < MOE_COMM_N_GROUPS; g++)
            check_group(&c, (moe_comm_group)g, be);
    moe_comm_detach_backend(&c, 0);
    if (be) be->destroy(be);
    char name[48];
    snprintf(name, sizeof name, "comm_nccl[rank %d of %d]", c.rank, c.world);
    int rc = test_summary(name);
    moe_comm_finalize(&c);
    return rc;
#endif
}
