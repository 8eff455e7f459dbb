/* comm_nccl: the NCCL half of the dist layer (moe/comm_nccl.h) - unique id, non-blocking
 * communicators on the CUDA backend's device and their splits, and the collectives of
 * moe/comm.h on its stream, each waited for with a deadline. Built only when CMake found NCCL
 * (MOE_HAVE_NCCL). The one thing a reader must know: on a non-blocking communicator every
 * NCCL call may return ncclInProgress, and nothing else may be called on it (nor queued on
 * its stream) until ncclCommGetAsyncError says ncclSuccess: settle() is that wait, and
 * wait_done() the one for the queued work; both end with ncclCommAbort past the deadline. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_cuda.cuh"
#include "moe/comm_nccl.h"
#include "moe/log.h"

static_assert(sizeof(ncclUniqueId) == MOE_NCCL_ID_BYTES, "MOE_NCCL_ID_BYTES is NCCL's id size");
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0),
              "NCCL 2.18 or newer is needed (ncclCommSplit, non-blocking communicators)");

struct moe_nccl {
    ncclComm_t comm;
    int rank, size;        /* this rank's place in the communicator, and its size */
    int who;               /* this rank in the world, for messages */
    const char *group;     /* "world", ... for messages */
    double timeout_s;      /* deadline of every wait; 0 = none */
    const moe_backend *be; /* device and stream */
    cudaEvent_t start;     /* recorded before each operation (its staging copies included) */
    cudaEvent_t done;      /* recorded after each operation's queued work */
    double last_s;         /* the last operation's time on the stream, start to done */
    void *stage;           /* [stage_bytes] dev, host buffers travel through it */
    size_t stage_bytes;
    int failed; /* an operation failed or timed out: the communicator was aborted */
};

static cudaStream_t stream_of(const moe_nccl *c) {
    return moe_cuda_ctx_of(c->be)->stream;
}

/* MOE_ERR_RUNTIME naming what failed on which rank and group with NCCL's message for r. */
static moe_status nccl_fail(moe_err *err, ncclResult_t r, int rank, const char *group,
                            const char *what) {
    moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: NCCL %s over the %s group failed: %s", rank,
                what, group, ncclGetErrorString(r));
    if (r == ncclSystemError || r == ncclRemoteError)
        moe_err_hint(err, "another rank died or the network between the ranks failed; "
                          "NCCL_DEBUG=WARN prints NCCL's view");
    else
        moe_err_hint(err, "NCCL_DEBUG=INFO prints NCCL's view of the failure");
    return MOE_ERR_RUNTIME;
}

/* Aborts c's communicator (its kernels end, later calls fail) after a failure. */
static void abort_comm(moe_nccl *c) {
    if (c->failed) return;
    c->failed = 1;
    ncclCommAbort(c->comm);
}

/* The failure r of what: c aborted, err set. */
static moe_status fail_abort(moe_nccl *c, ncclResult_t r, const char *what, moe_err *err) {
    nccl_fail(err, r, c->who, c->group, what);
    abort_comm(c);
    return MOE_ERR_RUNTIME;
}

/* The deadline message: what over c's group did not complete within timeout_s; c aborted. */
static moe_status fail_timeout(moe_nccl *c, const char *what, moe_err *err) {
    moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                "rank %d: NCCL %s over the %s group did not complete within "
                "parallel.timeout_s=%g s: another rank died, hangs or is that far behind",
                c->who, what, c->group, c->timeout_s);
    moe_err_hint(err, "see the other ranks' messages; NCCL_DEBUG=WARN prints NCCL's view");
    abort_comm(c);
    return MOE_ERR_RUNTIME;
}

/* Spins briefly (latency), then sleeps between polls; 1 once timeout_s (> 0) has passed. */
static int poll_expired(const moe_nccl *c, long polls, double t0) {
    const struct timespec pause = {0, 100000};
    if (polls > 2000) nanosleep(&pause, NULL);
    return c->timeout_s > 0 && (polls & 63) == 0 && moe_time_now() - t0 > c->timeout_s;
}

/* After a call that returned r: waits while c is ncclInProgress (a non-blocking call still
 * being issued; one that returned ncclSuccess may still be: the communicator's state says,
 * and the next call on a communicator in progress fails with ncclInvalidArgument). MOE_OK
 * once settled; an error or the deadline aborts c. */
static moe_status settle(moe_nccl *c, ncclResult_t r, const char *what, moe_err *err) {
    double t0 = moe_time_now();
    if (r == ncclSuccess) {
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &r);
        if (q != ncclSuccess) r = q;
    }
    for (long polls = 0; r == ncclInProgress; polls++) {
        if (poll_expired(c, polls, t0)) return fail_timeout(c, what, err);
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &r);
        if (q != ncclSuccess) r = q;
    }
    return r == ncclSuccess ? MOE_OK : fail_abort(c, r, what, err);
}

/* Waits for the work queued on the stream so far (the operation just issued) to complete,
 * watching c for asynchronous errors (a peer that died). */
static moe_status wait_done(moe_nccl *c, const char *what, moe_err *err) {
    cudaStream_t s = stream_of(c);
    cudaError_t e = cudaEventRecord(c->done, s);
    double t0 = moe_time_now();
    for (long polls = 0; e == cudaSuccess; polls++) {
        e = cudaEventQuery(c->done);
        if (e == cudaSuccess) return MOE_OK;
        if (e != cudaErrorNotReady) break;
        e = cudaSuccess;
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &a);
        if (q != ncclSuccess || (a != ncclSuccess && a != ncclInProgress))
            return fail_abort(c, q != ncclSuccess ? q : a, what, err);
        if (poll_expired(c, polls, t0)) return fail_timeout(c, what, err);
    }
    moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                "rank %d: CUDA error waiting for NCCL %s over the %s group: %s", c->who, what,
                c->group, cudaGetErrorString(e));
    abort_comm(c);
    return MOE_ERR_RUNTIME;
}

/* MOE_ERR_RUNTIME when c was aborted by an earlier failure (nothing may be queued on it). */
static moe_status check_live(const moe_nccl *c, const char *what, moe_err *err) {
    if (!c->failed) return MOE_OK;
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                       "rank %d: NCCL %s over the %s group after an earlier NCCL failure", c->who,
                       what, c->group);
}

static ncclDataType_t nccl_type(moe_comm_dtype dt) {
    return dt == MOE_COMM_F32    ? ncclFloat32
           : dt == MOE_COMM_F64  ? ncclFloat64
           : dt == MOE_COMM_I64  ? ncclInt64
           : dt == MOE_COMM_U16  ? ncclFloat16 /* NCCL has no 2-byte integer; only moved */
           : dt == MOE_COMM_BF16 ? ncclBfloat16
                                 : ncclUint8;
}

/* moe_comm_dtype_size's rule, restated: libmoe_cuda links libmoe_base only, not libmoe. */
static size_t type_size(moe_comm_dtype dt) {
    return dt == MOE_COMM_F32                          ? 4
           : dt == MOE_COMM_BYTE                       ? 1
           : dt == MOE_COMM_U16 || dt == MOE_COMM_BF16 ? 2
                                                       : 8;
}

static char *at(const void *p, int64_t i, moe_comm_dtype dt) {
    return (char *)p + (size_t)i * type_size(dt);
}

extern "C" int moe_nccl_is_device(const void *p) {
    cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* an unknown pointer is host memory; clear the error */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ---- host buffers through the staging buffer ---- */

/* c->stage holding at least bytes, or NULL with err set. */
static void *stage(moe_nccl *c, size_t bytes, moe_err *err) {
    if (bytes <= c->stage_bytes) return c->stage;
    c->be->free(c->be, c->stage);
    c->stage_bytes = 0;
    c->stage = c->be->alloc(c->be, bytes);
    if (!c->stage) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                    "rank %d: out of GPU memory for a %zu-byte NCCL staging buffer", c->who, bytes);
        return NULL;
    }
    c->stage_bytes = bytes;
    return c->stage;
}

/* Copies bytes between host and device (either way: cudaMemcpyDefault), queued on c's stream,
 * or at once when `now` (a result copied back after wait_done: nothing left to wait for).
 * MOE_ERR_RUNTIME on a CUDA failure. */
static moe_status copy(moe_nccl *c, void *dst, const void *src, size_t bytes, int now,
                       moe_err *err) {
    if (bytes == 0 || dst == src) return MOE_OK;
    cudaError_t e = now ? cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)
                        : cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(c));
    if (e == cudaSuccess) return MOE_OK;
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                       "rank %d: CUDA copy of %zu bytes for NCCL over the %s group: %s", c->who,
                       bytes, c->group, cudaGetErrorString(e));
}

/* ---- creation ---- */

/* A moe_nccl shell for be (its event created; who: the world rank), or NULL with err set. */
static moe_nccl *shell(const moe_backend *be, int who, double timeout_s, const char *group,
                       moe_err *err) {
    moe_cuda_ctx *cx = moe_cuda_ctx_of(be);
    moe_nccl *c = (moe_nccl *)calloc(1, sizeof *c);
    if (!c) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory creating a NCCL communicator");
        return NULL;
    }
    c->rank = c->who = who, c->be = be, c->group = group, c->timeout_s = timeout_s;
    cudaError_t e = cudaSetDevice(cx->device);
    if (e == cudaSuccess) e = cudaEventCreate(&c->start);
    if (e == cudaSuccess) e = cudaEventCreate(&c->done);
    if (e != cudaSuccess) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: NCCL communicator on device %d: %s", who,
                    cx->device, cudaGetErrorString(e));
        if (c->start) cudaEventDestroy(c->start);
        free(c);
        return NULL;
    }
    return c;
}

/* Frees c's host and CUDA resources (its communicator already destroyed or aborted). */
static void free_shell(moe_nccl *c) {
    c->be->free(c->be, c->stage);
    if (c->start) cudaEventDestroy(c->start);
    if (c->done) cudaEventDestroy(c->done);
    free(c);
}

extern "C" moe_status moe_nccl_unique_id(unsigned char *id, moe_err *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(err, r, 0, "world", "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return MOE_OK;
}

extern "C" moe_nccl *moe_nccl_create(const moe_backend *be, const unsigned char *id, int rank,
                                     int size, double timeout_s, const char *group, moe_err *err) {
    moe_nccl *c = shell(be, rank, timeout_s, group, err);
    if (!c) return NULL;
    c->size = size;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_fail(err, r, rank, group, "ncclCommInitRank");
        free_shell(c);
        return NULL;
    }
    if (settle(c, r, "ncclCommInitRank", err) != MOE_OK) {
        free_shell(c);
        return NULL;
    }
    return c;
}

extern "C" moe_nccl *moe_nccl_split(moe_nccl *parent, int color, int key, const char *group,
                                    moe_err *err) {
    if (check_live(parent, "ncclCommSplit", err) != MOE_OK) return NULL;
    moe_nccl *c = shell(parent->be, parent->who, parent->timeout_s, group, err);
    if (!c) return NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommSplit(parent->comm, color, key, &c->comm, &cfg);
    moe_status st = settle(parent, r, "ncclCommSplit", err);
    if (st == MOE_OK) st = settle(c, ncclInProgress, "ncclCommSplit", err);
    if (st == MOE_OK && (ncclCommUserRank(c->comm, &c->rank) != ncclSuccess ||
                         ncclCommCount(c->comm, &c->size) != ncclSuccess))
        st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: ncclCommSplit gave no %s group",
                         parent->who, group);
    if (st != MOE_OK) {
        free_shell(c);
        return NULL;
    }
    return c;
}

extern "C" void moe_nccl_destroy(moe_nccl *c, int abort) {
    if (!c) return;
    if (!c->failed && !abort) {
        moe_err err;
        moe_err_clear(&err);
        if (settle(c, ncclCommFinalize(c->comm), "ncclCommFinalize", &err) == MOE_OK)
            ncclCommDestroy(c->comm);
        else
            moe_log_warn("%s", err.msg); /* settle aborted it */
    } else if (!c->failed) {
        ncclCommAbort(c->comm);
    }
    free_shell(c);
}

/* ---- the collectives ---- */

/* One operation on c. `issue` queues the NCCL calls on device pointers: the caller's, or,
 * when a buffer is host memory, slices of the staging buffer (inputs copied in first, the
 * result copied back once the operation completed). */
typedef struct op_args {
    void *buf;           /* the buffer written (all-reduce, slices, broadcast: in place; gather's
                            full, all-to-all's recv), or NULL (a gather's other ranks) */
    const void *in;      /* a separate input (gather's mine, all-to-all's send) or NULL */
    int64_t buf_n, in_n; /* their element counts */
    int64_t in_at;       /* >= 0: staged, `in` goes to buf + in_at (a gather root's own slice) */
    int buf_in;          /* 1: buf is also an input (in-place operations) */
    int buf_out;         /* 1: buf is a result the caller reads */
} op_args;

typedef ncclResult_t (*issue_fn)(moe_nccl *c, void *buf, const void *in, void *ctx);

/* Runs `what` on c (issue with ctx, over a's buffers of dt elements) and waits for it; host
 * buffers are staged. MOE_ERR_RUNTIME (c aborted) on a failure or past the deadline. */
static moe_status run_op(moe_nccl *c, const char *what, moe_comm_dtype dt, op_args a,
                         issue_fn issue, void *ctx, moe_err *err) {
    if (check_live(c, what, err) != MOE_OK) return MOE_ERR_RUNTIME;
    c->last_s = 0.0;
    if (cudaEventRecord(c->start, stream_of(c)) != cudaSuccess)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "rank %d: CUDA event before %s over the %s group", c->who, what,
                           c->group);
    int host = (a.buf && !moe_nccl_is_device(a.buf)) || (a.in && !moe_nccl_is_device(a.in));
    void *buf = a.buf;
    const void *in = a.in;
    size_t es = type_size(dt), bb = (size_t)a.buf_n * es, ib = (size_t)a.in_n * es;
    if (host) {
        char *s = (char *)stage(c, bb + ib + 8, err);
        if (!s) return MOE_ERR_RUNTIME;
        if (a.buf && a.buf_in && copy(c, s, a.buf, bb, 0, err) != MOE_OK) return MOE_ERR_RUNTIME;
        buf = a.buf ? s : NULL;
        if (a.in) {
            char *d = a.in_at >= 0 ? s + (size_t)a.in_at * es : s + bb;
            if (copy(c, d, a.in, ib, 0, err) != MOE_OK) return MOE_ERR_RUNTIME;
            in = d;
        }
    }
    moe_status st = settle(c, issue(c, buf, in, ctx), what, err);
    if (st == MOE_OK) st = wait_done(c, what, err);
    float ms = 0.0f;
    if (st == MOE_OK && cudaEventElapsedTime(&ms, c->start, c->done) == cudaSuccess)
        c->last_s = ms / 1e3;
    if (st == MOE_OK && host && a.buf && a.buf_out) st = copy(c, a.buf, buf, bb, 1, err);
    return st;
}

/* What an issue_* function needs besides the buffers. */
typedef struct red_ctx {
    int64_t n;                      /* elements (all-reduce, broadcast) */
    moe_comm_dtype dt;              /* their type */
    int root;                       /* broadcast, gather */
    const int64_t *offsets;         /* [size + 1] slices (reduce-scatter, all-gather, gather) */
    const int64_t *scount, *rcount; /* [size] all-to-all counts per peer */
} red_ctx;

static ncclResult_t issue_allreduce(moe_nccl *c, void *buf, const void *, void *ctx) {
    red_ctx *x = (red_ctx *)ctx;
    return ncclAllReduce(buf, buf, (size_t)x->n, nccl_type(x->dt), ncclSum, c->comm, stream_of(c));
}

extern "C" moe_status moe_nccl_allreduce(moe_nccl *c, void *buf, int64_t n, moe_comm_dtype dt,
                                         moe_err *err) {
    red_ctx x = {n, dt, 0, NULL, NULL, NULL};
    op_args a = {buf, NULL, n, 0, -1, 1, 1};
    return run_op(c, "all-reduce", dt, a, issue_allreduce, &x, err);
}

static ncclResult_t issue_broadcast(moe_nccl *c, void *buf, const void *, void *ctx) {
    red_ctx *x = (red_ctx *)ctx;
    return ncclBroadcast(buf, buf, (size_t)x->n, nccl_type(x->dt), x->root, c->comm, stream_of(c));
}

extern "C" moe_status moe_nccl_broadcast(moe_nccl *c, void *buf, int64_t n, moe_comm_dtype dt,
                                         int root, moe_err *err) {
    red_ctx x = {n, dt, root, NULL, NULL, NULL};
    op_args a = {buf, NULL, n, 0, -1, 1, 1};
    return run_op(c, "broadcast", dt, a, issue_broadcast, &x, err);
}

extern "C" moe_status moe_nccl_barrier(moe_nccl *c, moe_err *err) {
    int64_t one = 1; /* staged: a barrier needs no device buffer of the caller's */
    red_ctx x = {1, MOE_COMM_I64, 0, NULL, NULL, NULL};
    op_args a = {&one, NULL, 1, 0, -1, 1, 0};
    return run_op(c, "barrier", MOE_COMM_I64, a, issue_allreduce, &x, err);
}

/* 1 when the slices of offsets [n + 1] all have offsets[1] - offsets[0] elements. */
static int equal_slices(const int64_t *offsets, int n) {
    for (int r = 0; r <= n; r++)
        if (offsets[r] != offsets[0] + r * (offsets[1] - offsets[0])) return 0;
    return 1;
}

/* Reduce-scatter (sum) or all-gather of the slices: one in-place call when the slices are
 * equal, else one grouped reduce or broadcast per owner with a non-empty slice. */
static ncclResult_t issue_slices(moe_nccl *c, void *buf, int sum, const red_ctx *x) {
    const int64_t *o = x->offsets;
    ncclDataType_t t = nccl_type(x->dt);
    cudaStream_t s = stream_of(c);
    if (equal_slices(o, c->size)) {
        size_t cnt = (size_t)(o[1] - o[0]);
        char *base = at(buf, o[0], x->dt), *mine = at(buf, o[c->rank], x->dt);
        return sum ? ncclReduceScatter(base, mine, cnt, t, ncclSum, c->comm, s)
                   : ncclAllGather(mine, base, cnt, t, c->comm, s);
    }
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        size_t cnt = (size_t)(o[q + 1] - o[q]);
        char *p = at(buf, o[q], x->dt);
        if (cnt == 0) continue;
        r = sum ? ncclReduce(p, p, cnt, t, ncclSum, q, c->comm, s)
                : ncclBroadcast(p, p, cnt, t, q, c->comm, s);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static ncclResult_t issue_reduce_scatter(moe_nccl *c, void *buf, const void *, void *ctx) {
    return issue_slices(c, buf, 1, (const red_ctx *)ctx);
}

static ncclResult_t issue_allgather(moe_nccl *c, void *buf, const void *, void *ctx) {
    return issue_slices(c, buf, 0, (const red_ctx *)ctx);
}

extern "C" moe_status moe_nccl_reduce_scatter(moe_nccl *c, void *buf, const int64_t *offsets,
                                              moe_comm_dtype dt, moe_err *err) {
    red_ctx x = {0, dt, 0, offsets, NULL, NULL};
    op_args a = {buf, NULL, offsets[c->size], 0, -1, 1, 1};
    return run_op(c, "reduce-scatter", dt, a, issue_reduce_scatter, &x, err);
}

extern "C" moe_status moe_nccl_allgather(moe_nccl *c, void *buf, const int64_t *offsets,
                                         moe_comm_dtype dt, moe_err *err) {
    red_ctx x = {0, dt, 0, offsets, NULL, NULL};
    op_args a = {buf, NULL, offsets[c->size], 0, -1, 1, 1};
    return run_op(c, "all-gather", dt, a, issue_allgather, &x, err);
}

/* Gather: the root receives every other slice into full and copies its own; the others
 * send theirs. */
static ncclResult_t issue_gather(moe_nccl *c, void *full, const void *mine, void *ctx) {
    red_ctx *x = (red_ctx *)ctx;
    const int64_t *o = x->offsets;
    ncclDataType_t t = nccl_type(x->dt);
    cudaStream_t s = stream_of(c);
    int me = c->rank;
    size_t own = (size_t)(o[me + 1] - o[me]);
    if (me == x->root && own > 0 && at(full, o[me], x->dt) != mine &&
        cudaMemcpyAsync(at(full, o[me], x->dt), mine, own * type_size(x->dt),
                        cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        size_t cnt = (size_t)(o[q + 1] - o[q]);
        if (q == me || cnt == 0) continue;
        if (me == x->root) r = ncclRecv(at(full, o[q], x->dt), cnt, t, q, c->comm, s);
    }
    if (r == ncclSuccess && me != x->root && own > 0)
        r = ncclSend(mine, own, t, x->root, c->comm, s);
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

extern "C" moe_status moe_nccl_gather(moe_nccl *c, void *full, const void *mine,
                                      const int64_t *offsets, int root, moe_comm_dtype dt,
                                      moe_err *err) {
    red_ctx x = {0, dt, root, offsets, NULL, NULL};
    int me = c->rank;
    /* staged, mine lands on its own slice of the staged full (the root's copy is then a no-op) */
    int is_root = me == root;
    op_args a = {is_root ? full : NULL,
                 mine,
                 is_root ? offsets[c->size] : 0,
                 offsets[me + 1] - offsets[me],
                 is_root ? offsets[me] : -1,
                 0,
                 1};
    return run_op(c, "gather", dt, a, issue_gather, &x, err);
}

static ncclResult_t issue_alltoallv(moe_nccl *c, void *recv, const void *send, void *ctx) {
    red_ctx *x = (red_ctx *)ctx;
    ncclDataType_t t = nccl_type(x->dt);
    cudaStream_t s = stream_of(c);
    int64_t so = 0, ro = 0;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        if (x->scount[q] > 0)
            r = ncclSend(at(send, so, x->dt), (size_t)x->scount[q], t, q, c->comm, s);
        if (r == ncclSuccess && x->rcount[q] > 0)
            r = ncclRecv(at(recv, ro, x->dt), (size_t)x->rcount[q], t, q, c->comm, s);
        so += x->scount[q], ro += x->rcount[q];
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

extern "C" moe_status moe_nccl_alltoallv(moe_nccl *c, const void *send, const int64_t *send_counts,
                                         void *recv, const int64_t *recv_counts, moe_comm_dtype dt,
                                         moe_err *err) {
    int64_t sn = 0, rn = 0;
    for (int q = 0; q < c->size; q++)
        sn += send_counts[q], rn += recv_counts[q];
    red_ctx x = {0, dt, 0, NULL, send_counts, recv_counts};
    op_args a = {recv, send, rn, sn, -1, 0, 1};
    return run_op(c, "all-to-all", dt, a, issue_alltoallv, &x, err);
}

extern "C" double moe_nccl_last_seconds(const moe_nccl *c) {
    return c->last_s;
}
