/* comm: rank/world from the launcher and host-buffer sums over MPI (moe/comm.h). Without
 * MPI in the build, a single process works as before and an MPI launch is refused. */
#include "moe/comm.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOE_HAVE_MPI
#include <mpi.h>
#endif

/* World size the launcher announces in the environment, 0 when none did. */
static int launcher_world(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                       "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 0;
}

moe_status moe_comm_init(moe_comm *c, int *argc, char ***argv, moe_err *err) {
    memset(c, 0, sizeof *c);
    c->world = 1;
    int announced = launcher_world();
    if (announced == 0) return MOE_OK;
#ifdef MOE_HAVE_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "MPI_Init failed");
    c->mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    return MOE_OK;
#else
    (void)argc;
    (void)argv;
    if (announced == 1) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "started by an MPI launcher with %d processes, but this build has no MPI",
                announced);
    moe_err_hint(err, "install libopenmpi-dev and rebuild (make), or run one process");
    return MOE_ERR_INPUT;
#endif
}

void moe_comm_finalize(moe_comm *c) {
#ifdef MOE_HAVE_MPI
    if (c->mpi) MPI_Finalize();
#endif
    c->mpi = 0;
}

void moe_comm_abort(const moe_comm *c, int code) {
#ifdef MOE_HAVE_MPI
    if (c->mpi && c->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)c;
    (void)code;
#endif
}

#ifdef MOE_HAVE_MPI
/* MPI counts are int: sum in chunks of at most INT_MAX / 2 elements. */
static moe_status sum(const moe_comm *c, void *buf, int64_t n, MPI_Datatype type, size_t size,
                      moe_err *err) {
    if (!c->mpi || c->world == 1) return MOE_OK;
    const int64_t chunk = INT_MAX / 2;
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        if (MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * size, cnt, type, MPI_SUM,
                          MPI_COMM_WORLD) != MPI_SUCCESS)
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "MPI_Allreduce of %lld values failed",
                               (long long)n);
    }
    return MOE_OK;
}
#endif

moe_status moe_comm_sum_f32(const moe_comm *c, float *buf, int64_t n, moe_err *err) {
#ifdef MOE_HAVE_MPI
    return sum(c, buf, n, MPI_FLOAT, sizeof(float), err);
#else
    (void)c, (void)buf, (void)n, (void)err;
    return MOE_OK;
#endif
}

moe_status moe_comm_sum_f64(const moe_comm *c, double *buf, int64_t n, moe_err *err) {
#ifdef MOE_HAVE_MPI
    return sum(c, buf, n, MPI_DOUBLE, sizeof(double), err);
#else
    (void)c, (void)buf, (void)n, (void)err;
    return MOE_OK;
#endif
}

moe_status moe_comm_sum_i64(const moe_comm *c, int64_t *buf, int64_t n, moe_err *err) {
#ifdef MOE_HAVE_MPI
    return sum(c, buf, n, MPI_INT64_T, sizeof(int64_t), err);
#else
    (void)c, (void)buf, (void)n, (void)err;
    return MOE_OK;
#endif
}

#ifdef MOE_HAVE_MPI
/* Point to point in chunks of at most INT_MAX / 2 floats (MPI counts are int). */
static int send_f32(const float *p, int64_t n, int to) {
    const int64_t chunk = INT_MAX / 2;
    for (int64_t at = 0; at < n; at += chunk)
        if (MPI_Send(p + at, (int)(n - at < chunk ? n - at : chunk), MPI_FLOAT, to, 0,
                     MPI_COMM_WORLD) != MPI_SUCCESS)
            return 0;
    return 1;
}

static int recv_f32(float *p, int64_t n, int from) {
    const int64_t chunk = INT_MAX / 2;
    for (int64_t at = 0; at < n; at += chunk)
        if (MPI_Recv(p + at, (int)(n - at < chunk ? n - at : chunk), MPI_FLOAT, from, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return 0;
    return 1;
}

static int bcast_f32(float *p, int64_t n, int root) {
    const int64_t chunk = INT_MAX / 2;
    for (int64_t at = 0; at < n; at += chunk)
        if (MPI_Bcast(p + at, (int)(n - at < chunk ? n - at : chunk), MPI_FLOAT, root,
                      MPI_COMM_WORLD) != MPI_SUCCESS)
            return 0;
    return 1;
}
#endif

moe_status moe_comm_allgather_f32(const moe_comm *c, float *buf, const int64_t *offsets,
                                  moe_err *err) {
#ifdef MOE_HAVE_MPI
    if (!c->mpi || c->world == 1) return MOE_OK;
    for (int r = 0; r < c->world; r++)
        if (!bcast_f32(buf + offsets[r], offsets[r + 1] - offsets[r], r))
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "MPI_Bcast of rank %d's slice failed",
                               r);
#else
    (void)c, (void)buf, (void)offsets, (void)err;
#endif
    return MOE_OK;
}

moe_status moe_comm_gather_f32(const moe_comm *c, float *full, const float *mine,
                               const int64_t *offsets, int root, moe_err *err) {
    int64_t own = offsets[c->rank + 1] - offsets[c->rank];
    if (c->rank == root && full + offsets[c->rank] != mine)
        memcpy(full + offsets[c->rank], mine, (size_t)own * sizeof(float));
#ifdef MOE_HAVE_MPI
    if (!c->mpi || c->world == 1) return MOE_OK;
    int ok = 1;
    if (c->rank == root) {
        for (int r = 0; r < c->world && ok; r++)
            if (r != root) ok = recv_f32(full + offsets[r], offsets[r + 1] - offsets[r], r);
    } else {
        ok = send_f32(mine, own, root);
    }
    if (!ok) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "MPI gather of slices failed");
#else
    (void)err;
#endif
    return MOE_OK;
}
