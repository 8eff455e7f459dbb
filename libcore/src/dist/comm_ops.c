/* comm_ops: the collectives of moe/comm.h: over NCCL where moe_comm_dev_route says so (device
 * buffers once a GPU backend is attached: comm_dev.c), else over MPI on host buffers. Each is
 * started non-blocking and waited for with the run's deadline (moe_comm_wait). MPI counts are int:
 * the sums and broadcasts run in chunks of at most moe_comm.chunk elements, the slice operations
 * take one MPI call when every count and displacement fits and otherwise fall back to per-owner
 * chunked reductions or broadcasts; all-to-all(v) and gather are grouped point-to-point
 * sends and receives in chunks (as NCCL's grouped send/recv), so they have no int limit. A
 * group of one rank needs no MPI: the operations copy their own part or do nothing. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"
#include "moe/comm.h"
#include "moe/dtype.h"
#include "moe/log.h"

static char *at(const void *buf, int64_t i, moe_comm_dtype dt) {
    return (char *)buf + (size_t)i * moe_comm_dtype_size(dt);
}

/* 1 when group g spans several ranks that no transport connects (a torchrun-style launch:
 * its ranks know each other, but no MPI was started and no GPU backend attached NCCL), with
 * err set: the collective must fail rather than do nothing. */
static int no_transport(const moe_comm *c, moe_comm_group g, moe_err *err) {
    if (c->impl || c->gsize[g] == 1) return 0;
    moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                "rank %d of %d: a collective over %d ranks, but no transport connects them "
                "(a torchrun-style launch starts no MPI)",
                c->rank, c->world, c->gsize[g]);
    moe_err_hint(err, "launch CPU ranks with mpirun or srun");
    return 1;
}

#ifdef MOE_HAVE_MPI
static MPI_Datatype mpi_type(moe_comm_dtype dt) {
    return dt == MOE_COMM_F32                          ? MPI_FLOAT
           : dt == MOE_COMM_F64                        ? MPI_DOUBLE
           : dt == MOE_COMM_I64                        ? MPI_INT64_T
           : dt == MOE_COMM_U16 || dt == MOE_COMM_BF16 ? MPI_UINT16_T
                                                       : MPI_BYTE;
}

/* MPI_Op of bf16 sums (MOE_COMM_BF16 on MPI_UINT16_T): inout[i] = bf16(in[i] + inout[i]), each
 * addition in fp32 */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = moe_f32_to_bf16(moe_bf16_to_f32(a[i]) + moe_bf16_to_f32(b[i]));
}

/* The sum operation of dt into *op: MPI_SUM, or for BF16 an operation created here that
 * sum_op_free releases. MPI_SUCCESS or MPI's error. */
static int sum_op(moe_comm_dtype dt, MPI_Op *op) {
    *op = MPI_SUM;
    return dt == MOE_COMM_BF16 ? MPI_Op_create(bf16_sum, 1, op) : MPI_SUCCESS;
}
static void sum_op_free(MPI_Op *op) {
    if (*op != MPI_SUM) MPI_Op_free(op);
}

static MPI_Comm group_comm(const moe_comm *c, moe_comm_group g) {
    return c->impl->group[g];
}

/* 1 when every slice size and offset of offsets [n + 1] fits one MPI call's count. */
static int fits_int(const moe_comm *c, const int64_t *offsets, int n) {
    return offsets[n] < c->chunk;
}

/* Sum of [n] into root's buf (in place), in chunks; root == -1: into every rank's. */
static moe_status reduce_chunks(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                                moe_comm_dtype dt, int root, moe_err *err) {
    MPI_Comm comm = group_comm(c, g);
    MPI_Op op;
    int rc = sum_op(dt, &op);
    if (rc != MPI_SUCCESS) return moe_comm_mpi_fail(c, g, rc, "a sum", err);
    moe_status st = MOE_OK;
    for (int64_t i = 0; i < n && st == MOE_OK; i += c->chunk) {
        int cnt = (int)(n - i < c->chunk ? n - i : c->chunk);
        MPI_Request req;
        if (root < 0)
            rc = MPI_Iallreduce(MPI_IN_PLACE, at(buf, i, dt), cnt, mpi_type(dt), op, comm, &req);
        else if (c->grank[g] == root)
            rc = MPI_Ireduce(MPI_IN_PLACE, at(buf, i, dt), cnt, mpi_type(dt), op, root, comm, &req);
        else
            rc = MPI_Ireduce(at(buf, i, dt), NULL, cnt, mpi_type(dt), op, root, comm, &req);
        st = rc != MPI_SUCCESS ? moe_comm_mpi_fail(c, g, rc, "a sum", err)
                               : moe_comm_wait(c, g, &req, 1, "a sum", err);
    }
    sum_op_free(&op);
    return st;
}

static moe_status bcast_chunks(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                               moe_comm_dtype dt, int root, moe_err *err) {
    for (int64_t i = 0; i < n; i += c->chunk) {
        int cnt = (int)(n - i < c->chunk ? n - i : c->chunk);
        MPI_Request req;
        int rc = MPI_Ibcast(at(buf, i, dt), cnt, mpi_type(dt), root, group_comm(c, g), &req);
        if (rc != MPI_SUCCESS) return moe_comm_mpi_fail(c, g, rc, "a broadcast", err);
        if (moe_comm_wait(c, g, &req, 1, "a broadcast", err) != MOE_OK) return err->status;
    }
    return MOE_OK;
}

/* Grouped point-to-point: to each peer r send[r] [scount[r]], from each peer s recv[s]
 * [rcount[s]] (NULL pointers and zero counts skip the peer), chunked, then one wait. */
static moe_status exchange(const moe_comm *c, moe_comm_group g, const void *const *send,
                           const int64_t *scount, void *const *recv, const int64_t *rcount,
                           moe_comm_dtype dt, const char *what, moe_err *err) {
    int n = c->gsize[g], nreq = 0, cap = 0;
    for (int r = 0; r < n; r++) {
        if (send[r]) cap += (int)((scount[r] + c->chunk - 1) / c->chunk);
        if (recv[r]) cap += (int)((rcount[r] + c->chunk - 1) / c->chunk);
    }
    MPI_Request *req = malloc((size_t)(cap ? cap : 1) * sizeof *req);
    if (!req) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    MPI_Comm comm = group_comm(c, g);
    int rc = MPI_SUCCESS;
    for (int r = 0; r < n && rc == MPI_SUCCESS; r++) {
        for (int64_t i = 0; recv[r] && i < rcount[r] && rc == MPI_SUCCESS; i += c->chunk)
            rc = MPI_Irecv(at(recv[r], i, dt),
                           (int)(rcount[r] - i < c->chunk ? rcount[r] - i : c->chunk), mpi_type(dt),
                           r, 0, comm, &req[nreq++]);
        for (int64_t i = 0; send[r] && i < scount[r] && rc == MPI_SUCCESS; i += c->chunk)
            rc = MPI_Isend(at(send[r], i, dt),
                           (int)(scount[r] - i < c->chunk ? scount[r] - i : c->chunk), mpi_type(dt),
                           r, 0, comm, &req[nreq++]);
    }
    moe_status st = rc == MPI_SUCCESS ? moe_comm_wait(c, g, req, nreq, what, err)
                                      : moe_comm_mpi_fail(c, g, rc, what, err);
    free(req);
    return st;
}

/* int counts and displacements of offsets [n + 1] (fits_int holds) into cnt, dsp [n]. */
static void int_slices(const int64_t *offsets, int n, int *cnt, int *dsp) {
    for (int r = 0; r < n; r++)
        cnt[r] = (int)(offsets[r + 1] - offsets[r]), dsp[r] = (int)offsets[r];
}
#endif

static moe_status allreduce_op(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                               moe_comm_dtype dt, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, buf);
    if (nc) return moe_nccl_allreduce(nc, buf, n, dt, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
#ifdef MOE_HAVE_MPI
    if (c->impl && c->gsize[g] > 1) return reduce_chunks(c, g, buf, n, dt, -1, err);
#endif
    (void)c, (void)g, (void)buf, (void)n, (void)dt, (void)err;
    return MOE_OK;
}

#ifdef MOE_HAVE_MPI
/* The slice operations: sum == 1 reduce-scatter, 0 all-gather(v), over the slices of
 * offsets [gsize + 1]. One MPI call when the counts fit an int, else one chunked reduction
 * or broadcast per owner's slice. */
static moe_status slices(const moe_comm *c, moe_comm_group g, void *buf, const int64_t *offsets,
                         moe_comm_dtype dt, int sum, moe_err *err) {
    int n = c->gsize[g], me = c->grank[g];
    const char *what = sum ? "a reduce-scatter" : "an all-gather";
    if (!fits_int(c, offsets, n)) {
        for (int r = 0; r < n; r++) {
            void *slice = at(buf, offsets[r], dt);
            int64_t len = offsets[r + 1] - offsets[r];
            if ((sum ? reduce_chunks(c, g, slice, len, dt, r, err)
                     : bcast_chunks(c, g, slice, len, dt, r, err)) != MOE_OK)
                return err->status;
        }
        return MOE_OK;
    }
    int *cnt = malloc((size_t)n * 2 * sizeof *cnt);
    if (!cnt) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    int_slices(offsets, n, cnt, cnt + n);
    MPI_Request req;
    MPI_Op op = MPI_SUM;
    int rc = sum ? sum_op(dt, &op) : MPI_SUCCESS;
    /* in place, a reduce-scatter leaves this rank's sum at the start of buf: moved below */
    if (rc == MPI_SUCCESS)
        rc = sum ? MPI_Ireduce_scatter(MPI_IN_PLACE, buf, cnt, mpi_type(dt), op, group_comm(c, g),
                                       &req)
                 : MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, cnt + n,
                                   mpi_type(dt), group_comm(c, g), &req);
    moe_status st = rc == MPI_SUCCESS ? moe_comm_wait(c, g, &req, 1, what, err)
                                      : moe_comm_mpi_fail(c, g, rc, what, err);
    if (sum) sum_op_free(&op);
    free(cnt);
    if (st == MOE_OK && sum && offsets[me] > 0)
        memmove(at(buf, offsets[me], dt), buf,
                (size_t)(offsets[me + 1] - offsets[me]) * moe_comm_dtype_size(dt));
    return st;
}
#endif

static moe_status reduce_scatter_op(const moe_comm *c, moe_comm_group g, void *buf,
                                    const int64_t *offsets, moe_comm_dtype dt, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, buf);
    if (nc) return moe_nccl_reduce_scatter(nc, buf, offsets, dt, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
#ifdef MOE_HAVE_MPI
    if (c->impl && c->gsize[g] > 1) return slices(c, g, buf, offsets, dt, 1, err);
#endif
    (void)c, (void)g, (void)buf, (void)offsets, (void)dt, (void)err;
    return MOE_OK;
}

static moe_status allgather_op(const moe_comm *c, moe_comm_group g, void *buf,
                               const int64_t *offsets, moe_comm_dtype dt, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, buf);
    if (nc) return moe_nccl_allgather(nc, buf, offsets, dt, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
#ifdef MOE_HAVE_MPI
    if (c->impl && c->gsize[g] > 1) return slices(c, g, buf, offsets, dt, 0, err);
#endif
    (void)c, (void)g, (void)buf, (void)offsets, (void)dt, (void)err;
    return MOE_OK;
}

static moe_status gather_op(const moe_comm *c, moe_comm_group g, void *full, const void *mine,
                            const int64_t *offsets, int root, moe_comm_dtype dt, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, mine);
    if (nc) return moe_nccl_gather(nc, full, mine, offsets, root, dt, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
    int me = c->grank[g], n = c->gsize[g];
    int64_t own = offsets[me + 1] - offsets[me];
    if (me == root && own > 0 && at(full, offsets[me], dt) != (const char *)mine)
        memcpy(at(full, offsets[me], dt), mine, (size_t)own * moe_comm_dtype_size(dt));
#ifdef MOE_HAVE_MPI
    if (!c->impl || n == 1) return MOE_OK;
    const void **send = calloc((size_t)n, sizeof *send);
    void **recv = calloc((size_t)n, sizeof *recv);
    int64_t *cnt = malloc((size_t)n * sizeof *cnt);
    moe_status st = MOE_OK;
    if (!send || !recv || !cnt) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int r = 0; st == MOE_OK && r < n; r++) {
        cnt[r] = me == root ? offsets[r + 1] - offsets[r] : own;
        if (me == root && r != root) recv[r] = at(full, offsets[r], dt);
        if (me != root && r == root) send[r] = mine;
    }
    if (st == MOE_OK) st = exchange(c, g, send, cnt, recv, cnt, dt, "a gather", err);
    free(send);
    free(recv);
    free(cnt);
    return st;
#else
    (void)n, (void)err;
    return MOE_OK;
#endif
}

static moe_status alltoallv_op(const moe_comm *c, moe_comm_group g, const void *send,
                               const int64_t *send_counts, void *recv, const int64_t *recv_counts,
                               moe_comm_dtype dt, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, send);
    if (nc) return moe_nccl_alltoallv(nc, send, send_counts, recv, recv_counts, dt, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
    int n = c->gsize[g], me = c->grank[g];
    int64_t so = 0, ro = 0; /* this rank's own part is a copy */
    for (int r = 0; r < me; r++)
        so += send_counts[r], ro += recv_counts[r];
    if (send_counts[me] != recv_counts[me])
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "all-to-all: %lld elements to itself but %lld expected",
                           (long long)send_counts[me], (long long)recv_counts[me]);
    if (send_counts[me] > 0)
        memcpy(at(recv, ro, dt), at(send, so, dt),
               (size_t)send_counts[me] * moe_comm_dtype_size(dt));
#ifdef MOE_HAVE_MPI
    if (!c->impl || n == 1) return MOE_OK;
    const void **sp = calloc((size_t)n, sizeof *sp);
    void **rp = calloc((size_t)n, sizeof *rp);
    if (!sp || !rp) {
        free(sp);
        free(rp);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    }
    so = ro = 0;
    for (int r = 0; r < n; r++) {
        if (r != me && send_counts[r] > 0) sp[r] = at(send, so, dt);
        if (r != me && recv_counts[r] > 0) rp[r] = at(recv, ro, dt);
        so += send_counts[r], ro += recv_counts[r];
    }
    moe_status st = exchange(c, g, (const void *const *)sp, send_counts, rp, recv_counts, dt,
                             "an all-to-all", err);
    free(sp);
    free(rp);
    return st;
#else
    (void)n, (void)err;
    return MOE_OK;
#endif
}

static moe_status broadcast_op(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                               moe_comm_dtype dt, int root, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, buf);
    if (nc) return moe_nccl_broadcast(nc, buf, n, dt, root, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
#ifdef MOE_HAVE_MPI
    if (c->impl && c->gsize[g] > 1) return bcast_chunks(c, g, buf, n, dt, root, err);
#endif
    (void)c, (void)g, (void)buf, (void)n, (void)dt, (void)root, (void)err;
    return MOE_OK;
}

static moe_status barrier_op(const moe_comm *c, moe_comm_group g, moe_err *err) {
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, NULL);
    if (nc) return moe_nccl_barrier(nc, err);
#endif
    if (no_transport(c, g, err)) return MOE_ERR_RUNTIME;
#ifdef MOE_HAVE_MPI
    if (!c->impl || c->gsize[g] == 1) return MOE_OK;
    MPI_Request req;
    int rc = MPI_Ibarrier(group_comm(c, g), &req);
    if (rc != MPI_SUCCESS) return moe_comm_mpi_fail(c, g, rc, "a barrier", err);
    return moe_comm_wait(c, g, &req, 1, "a barrier", err);
#else
    (void)c, (void)g, (void)err;
    return MOE_OK;
#endif
}

/* ---- the public operations: each timed into c's statistics (moe_comm_stats) ---- */

/* Adds one operation over g begun at t0 (moe_time_now) to c's statistics: the NCCL
 * operation's own time when it went over NCCL (the route of buffer p, as the operation chose
 * it), else the wall time since t0; a2a: an all-to-all, which sent a2a_bytes to other ranks. */
static void stats_add(const moe_comm *c, moe_comm_group g, double t0, const void *p, int a2a,
                      int64_t a2a_bytes) {
    moe_comm_stats *s = (moe_comm_stats *)&c->stats; /* c itself is never const */
    double dt = moe_time_now() - t0;
#ifdef MOE_HAVE_NCCL
    moe_nccl *nc = moe_comm_dev_route(c, g, p);
    if (nc) dt = moe_nccl_last_seconds(nc);
#else
    (void)p;
#endif
    s->seconds[g] += dt;
    s->calls[g]++;
    if (a2a) s->a2a_seconds += dt, s->a2a_bytes += a2a_bytes;
}

moe_comm_stats moe_comm_stats_take(moe_comm *c) {
    moe_comm_stats s = c->stats;
    memset(&c->stats, 0, sizeof c->stats);
    return s;
}

moe_status moe_comm_allreduce(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                              moe_comm_dtype dt, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = allreduce_op(c, g, buf, n, dt, err);
    stats_add(c, g, t0, buf, 0, 0);
    return st;
}

moe_status moe_comm_reduce_scatter(const moe_comm *c, moe_comm_group g, void *buf,
                                   const int64_t *offsets, moe_comm_dtype dt, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = reduce_scatter_op(c, g, buf, offsets, dt, err);
    stats_add(c, g, t0, buf, 0, 0);
    return st;
}

moe_status moe_comm_allgather(const moe_comm *c, moe_comm_group g, void *buf,
                              const int64_t *offsets, moe_comm_dtype dt, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = allgather_op(c, g, buf, offsets, dt, err);
    stats_add(c, g, t0, buf, 0, 0);
    return st;
}

moe_status moe_comm_gather(const moe_comm *c, moe_comm_group g, void *full, const void *mine,
                           const int64_t *offsets, int root, moe_comm_dtype dt, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = gather_op(c, g, full, mine, offsets, root, dt, err);
    stats_add(c, g, t0, mine, 0, 0);
    return st;
}

moe_status moe_comm_alltoallv(const moe_comm *c, moe_comm_group g, const void *send,
                              const int64_t *send_counts, void *recv, const int64_t *recv_counts,
                              moe_comm_dtype dt, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = alltoallv_op(c, g, send, send_counts, recv, recv_counts, dt, err);
    int64_t sent = 0; /* to the other ranks */
    for (int r = 0; r < c->gsize[g]; r++)
        if (r != c->grank[g]) sent += send_counts[r];
    stats_add(c, g, t0, send, 1, sent * (int64_t)moe_comm_dtype_size(dt));
    return st;
}

moe_status moe_comm_broadcast(const moe_comm *c, moe_comm_group g, void *buf, int64_t n,
                              moe_comm_dtype dt, int root, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = broadcast_op(c, g, buf, n, dt, root, err);
    stats_add(c, g, t0, buf, 0, 0);
    return st;
}

moe_status moe_comm_barrier(const moe_comm *c, moe_comm_group g, moe_err *err) {
    const double t0 = moe_time_now();
    moe_status st = barrier_op(c, g, err);
    stats_add(c, g, t0, NULL, 0, 0);
    return st;
}
