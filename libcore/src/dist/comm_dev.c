/* comm_dev: the NCCL side of moe/comm.h - the communicators of the world and the ep / dp
 * groups, created on the GPU backend's device when the trainer attaches it, and the route
 * of each collective of comm_ops.c (device buffers, and host buffers when no MPI was started,
 * go to NCCL).
 * The one thing a reader must know: every rank must take the same route for the same call
 * (a rank on MPI and another on NCCL would wait for each other forever), so the route depends
 * only on what is the same on every rank: whether NCCL is attached, whether MPI runs, and
 * the kind of memory of the buffer (the same backend everywhere). */
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"
#include "moe/comm.h"
#include "moe/ops.h"
#ifdef MOE_HAVE_NCCL

struct moe_comm_dev {
    moe_nccl *group[MOE_COMM_N_GROUPS]; /* world, ep, dp (dp may be world's: not owned) */
    int owned[MOE_COMM_N_GROUPS];       /* 1: created here, released by detach */
};

/* Releases d's communicators (aborted when failed) and d. */
static void dev_free(struct moe_comm_dev *d, int failed) {
    for (int g = MOE_COMM_N_GROUPS - 1; g >= 0; g--)
        if (d->owned[g]) moe_nccl_destroy(d->group[g], failed);
    free(d);
}

/* The communicator of group g split from world: ranks with the same color, by world rank. */
static moe_status dev_split(struct moe_comm_dev *d, moe_comm_group g, int color, int rank,
                            moe_err *err) {
    d->group[g] =
        moe_nccl_split(d->group[MOE_COMM_WORLD], color, rank, moe_comm_group_name(g), err);
    d->owned[g] = d->group[g] != NULL;
    return d->group[g] ? MOE_OK : MOE_ERR_RUNTIME;
}
#endif

moe_status moe_comm_attach_backend(moe_comm *c, const moe_backend *be, moe_err *err) {
    if (strcmp(be->name, "cuda") != 0 || (!c->torchrun && !c->impl)) return MOE_OK;
#ifndef MOE_HAVE_NCCL
    if (c->world == 1) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "%d ranks on the GPU backend, but this build has no NCCL (GPU ranks communicate "
                "over NCCL)",
                c->world);
    moe_err_hint(err, "install NCCL (libnccl-dev, or the CUDA toolkit's) and rebuild: cmake "
                      "prints NCCL=ON; or train on one GPU, or on CPU ranks with device=cpu");
    return MOE_ERR_INPUT;
#else
    if (c->dev) return MOE_OK;
    struct moe_comm_dev *d = calloc(1, sizeof *d);
    if (!d) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    unsigned char id[MOE_NCCL_ID_BYTES] = {0};
    moe_status st = c->rank == 0 ? moe_nccl_unique_id(id, err) : MOE_OK;
    if (st == MOE_OK) st = moe_comm_share_blob(c, id, sizeof id, err);
    if (st == MOE_OK) {
        d->group[MOE_COMM_WORLD] =
            moe_nccl_create(be, id, c->rank, c->world, c->timeout_s, "world", err);
        d->owned[MOE_COMM_WORLD] = d->group[MOE_COMM_WORLD] != NULL;
        if (!d->group[MOE_COMM_WORLD]) st = MOE_ERR_RUNTIME;
    }
    if (st == MOE_OK) st = dev_split(d, MOE_COMM_EP, c->rank / c->ep, c->rank, err);
    if (st == MOE_OK && c->gsize[MOE_COMM_DP] == c->world)
        d->group[MOE_COMM_DP] = d->group[MOE_COMM_WORLD];
    else if (st == MOE_OK)
        st = dev_split(d, MOE_COMM_DP, c->rank % c->ep, c->rank, err);
    if (st != MOE_OK) {
        dev_free(d, 1);
        return st;
    }
    c->dev = d;
    return MOE_OK;
#endif
}

void moe_comm_detach_backend(moe_comm *c, int failed) {
#ifdef MOE_HAVE_NCCL
    if (c->dev) dev_free(c->dev, failed);
#else
    (void)failed;
#endif
    c->dev = NULL;
}

#ifdef MOE_HAVE_NCCL
moe_nccl *moe_comm_dev_route(const moe_comm *c, moe_comm_group g, const void *p) {
    if (!c->dev || (c->impl && !(p && moe_nccl_is_device(p)))) return NULL;
    return c->dev->group[g];
}
#endif
