/* backend_prof: the profiling wrapper of moe/backend_prof.h.
 *
 * The wrapper's table lives inside its context (ctx points back at the struct that holds the
 * table), so op entries find the inner backend and the counters through be->ctx without any
 * global state. Each timed entry: wait for the inner backend, read the clock, call the inner
 * entry with the INNER table (its own ctx), wait again, read the clock, add. The waits make
 * the interval cover exactly the device work of that call. */
#include "moe/backend_prof.h"

#include <stdlib.h>
#include <string.h>

#include "moe/log.h"

typedef struct prof_ctx {
    moe_backend table; /* what moe_backend_prof_wrap returns; table.ctx == this struct */
    const moe_backend *inner;
    moe_backend_prof_stats st;
    moe_err first_err; /* first failure a bracketing wait reported */
} prof_ctx;

static prof_ctx *ctx_of(const moe_backend *be) {
    return (prof_ctx *)be->ctx;
}

static void prof_wait(prof_ctx *p) {
    moe_err e;
    moe_err_clear(&e);
    if (p->inner->synchronize(p->inner, &e) != MOE_OK && p->first_err.status == MOE_OK)
        p->first_err = e;
}

static double prof_begin(prof_ctx *p) {
    prof_wait(p);
    return moe_time_now();
}

/* dir: 0 forward (or only direction), 1 backward */
static void prof_end_op(prof_ctx *p, double t0, moe_op op, int dir) {
    prof_wait(p);
    p->st.op_seconds[op][dir] += moe_time_now() - t0;
    p->st.op_calls[op][dir]++;
}

static void prof_end_mem(prof_ctx *p, double t0) {
    prof_wait(p);
    p->st.mem_seconds += moe_time_now() - t0;
    p->st.mem_calls++;
}

/* ---- forwarded untimed ---- */

static int pr_supports(const moe_backend *be, moe_op op, const moe_op_dims *dims, moe_recipe prec) {
    const moe_backend *in = ctx_of(be)->inner;
    return in->supports(in, op, dims, prec);
}

static void pr_memory(const moe_backend *be, size_t *current, size_t *peak) {
    const moe_backend *in = ctx_of(be)->inner;
    in->memory(in, current, peak);
}

static void *pr_alloc(const moe_backend *be, size_t bytes) {
    const moe_backend *in = ctx_of(be)->inner;
    return in->alloc(in, bytes);
}

static void pr_free(const moe_backend *be, void *ptr) {
    const moe_backend *in = ctx_of(be)->inner;
    in->free(in, ptr);
}

static moe_status pr_synchronize(const moe_backend *be, moe_err *err) {
    prof_ctx *p = ctx_of(be);
    p->st.host_syncs++;
    moe_status st = p->inner->synchronize(p->inner, err);
    if (p->first_err.status != MOE_OK) {
        if (err && (err->status == MOE_OK || st == MOE_OK)) *err = p->first_err;
        return p->first_err.status;
    }
    return st;
}

/* ---- memory, timed as MOE_PROF_MEMORY ---- */

static void pr_memcpy_h2d(const moe_backend *be, void *dst, const void *src, size_t n) {
    prof_ctx *p = ctx_of(be);
    p->st.host_syncs++;
    double t0 = prof_begin(p);
    p->inner->memcpy_h2d(p->inner, dst, src, n);
    prof_end_mem(p, t0);
}

static void pr_memcpy_d2h(const moe_backend *be, void *dst, const void *src, size_t n) {
    prof_ctx *p = ctx_of(be);
    p->st.host_syncs++;
    double t0 = prof_begin(p);
    p->inner->memcpy_d2h(p->inner, dst, src, n);
    prof_end_mem(p, t0);
}

static void pr_memcpy_d2d(const moe_backend *be, void *dst, const void *src, size_t n) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->memcpy_d2d(p->inner, dst, src, n);
    prof_end_mem(p, t0);
}

static void pr_memset(const moe_backend *be, void *dst, int byte, size_t n) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->memset(p->inner, dst, byte, n);
    prof_end_mem(p, t0);
}

/* ---- ops ---- */

static void pr_embedding_forward(const moe_backend *be, moe_buf out, const int32_t *tokens,
                                 const float *wte, int64_t N, int64_t C) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->embedding_forward(p->inner, out, tokens, wte, N, C);
    prof_end_op(p, t0, MOE_OP_EMBEDDING, 0);
}

static void pr_embedding_backward(const moe_backend *be, float *dwte, const float *dout,
                                  const int32_t *tokens, int64_t N, int64_t C, int64_t V) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->embedding_backward(p->inner, dwte, dout, tokens, N, C, V);
    prof_end_op(p, t0, MOE_OP_EMBEDDING, 1);
}

static void pr_rmsnorm_forward(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf x,
                               const float *w, int64_t N, int64_t C, float eps, moe_recipe prec,
                               const moe_fp8_groups *pairs) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->rmsnorm_forward(p->inner, out, rstd, x, w, N, C, eps, prec, pairs);
    prof_end_op(p, t0, MOE_OP_RMSNORM, 0);
}

static void pr_rmsnorm_backward(const moe_backend *be, float *dx, float *dw, const float *dout,
                                moe_cbuf x, const float *w, const float *rstd, int64_t N,
                                int64_t C) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->rmsnorm_backward(p->inner, dx, dw, dout, x, w, rstd, N, C);
    prof_end_op(p, t0, MOE_OP_RMSNORM, 1);
}

static void pr_rope_forward(const moe_backend *be, moe_buf x, const int32_t *pos, int64_t p0,
                            int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->rope_forward(p->inner, x, pos, p0, B, T, NH, D, theta);
    prof_end_op(p, t0, MOE_OP_ROPE, 0);
}

static void pr_rope_backward(const moe_backend *be, moe_buf dx, const float *dy, const int32_t *pos,
                             int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->rope_backward(p->inner, dx, dy, pos, B, T, NH, D, theta);
    prof_end_op(p, t0, MOE_OP_ROPE, 1);
}

static void pr_attention_forward(const moe_backend *be, moe_buf out, float *lse, moe_cbuf q,
                                 moe_cbuf k, moe_cbuf v, const int32_t *doc_start, int64_t B,
                                 int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                                 moe_recipe prec) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->attention_forward(p->inner, out, lse, q, k, v, doc_start, B, T, Tk, H, KV, D, prec);
    prof_end_op(p, t0, MOE_OP_ATTENTION, 0);
}

static void pr_attention_backward(const moe_backend *be, float *dq, float *dk, float *dv,
                                  const float *dout, moe_cbuf q, moe_cbuf k, moe_cbuf v,
                                  moe_cbuf out, const float *lse, const int32_t *doc_start,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                  moe_recipe prec, moe_grad_store st) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->attention_backward(p->inner, dq, dk, dv, dout, q, k, v, out, lse, doc_start, B, T, H,
                                 KV, D, prec, st);
    prof_end_op(p, t0, MOE_OP_ATTENTION, 1);
}

static void pr_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N,
                              int64_t I, int64_t O, moe_recipe prec) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->matmul_forward(p->inner, y, x, w, N, I, O, prec);
    prof_end_op(p, t0, MOE_OP_MATMUL, 0);
}

static void pr_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy, moe_cbuf x,
                               moe_cbuf w, int64_t N, int64_t I, int64_t O, moe_recipe prec,
                               moe_grad_store dx_st, moe_grad_store dw_st) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->matmul_backward(p->inner, dx, dw, dy, x, w, N, I, O, prec, dx_st, dw_st);
    prof_end_op(p, t0, MOE_OP_MATMUL, 1);
}

static void pr_router_forward(const moe_backend *be, float *probs, float *lse, int32_t *topk_idx,
                              float *topk_w, int32_t *counts, float *stats, const float *logits,
                              int64_t N, int64_t E, int64_t K) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->router_forward(p->inner, probs, lse, topk_idx, topk_w, counts, stats, logits, N, E,
                             K);
    prof_end_op(p, t0, MOE_OP_ROUTER, 0);
}

static void pr_router_backward(const moe_backend *be, float *dlogits, const float *dtopk_w,
                               const float *dprob, float dz, const float *probs, const float *lse,
                               const int32_t *topk_idx, const float *topk_w, int64_t N, int64_t E,
                               int64_t K) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->router_backward(p->inner, dlogits, dtopk_w, dprob, dz, probs, lse, topk_idx, topk_w,
                              N, E, K);
    prof_end_op(p, t0, MOE_OP_ROUTER, 1);
}

static void pr_permute_forward(const moe_backend *be, moe_buf xp, int32_t *row_src,
                               int32_t *slot_row, int32_t *offsets, moe_cbuf x,
                               const int32_t *topk_idx, int64_t N, int64_t C, int64_t E,
                               int64_t K) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->permute_forward(p->inner, xp, row_src, slot_row, offsets, x, topk_idx, N, C, E, K);
    prof_end_op(p, t0, MOE_OP_PERMUTE, 0);
}

static void pr_permute_backward(const moe_backend *be, float *dx, moe_cbuf dxp,
                                const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                                moe_grad_store st) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->permute_backward(p->inner, dx, dxp, slot_row, N, C, K, st);
    prof_end_op(p, t0, MOE_OP_PERMUTE, 1);
}

static void pr_unpermute_forward(const moe_backend *be, moe_buf y, moe_cbuf res, moe_cbuf yp,
                                 const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                                 int64_t K) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->unpermute_forward(p->inner, y, res, yp, topk_w, slot_row, N, C, K);
    prof_end_op(p, t0, MOE_OP_UNPERMUTE, 0);
}

static void pr_unpermute_backward(const moe_backend *be, moe_buf dyp, float *dtopk_w,
                                  const float *dy, moe_cbuf yp, const float *topk_w,
                                  const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                                  moe_grad_store st) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->unpermute_backward(p->inner, dyp, dtopk_w, dy, yp, topk_w, slot_row, N, C, K, st);
    prof_end_op(p, t0, MOE_OP_UNPERMUTE, 1);
}

static void pr_grouped_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w,
                                      const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                      moe_recipe prec) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->grouped_matmul_forward(p->inner, y, x, w, offsets, E, I, O, prec);
    prof_end_op(p, t0, MOE_OP_GROUPED_MATMUL, 0);
}

static void pr_grouped_matmul_backward(const moe_backend *be, moe_buf dx, moe_buf dw, moe_cbuf dy,
                                       moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                       int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                                       moe_grad_store dw_st) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->grouped_matmul_backward(p->inner, dx, dw, dy, x, w, offsets, E, I, O, prec, dx_st,
                                      dw_st);
    prof_end_op(p, t0, MOE_OP_GROUPED_MATMUL, 1);
}

static void pr_grouped_dgrad_sum(const moe_backend *be, moe_buf dx, moe_cbuf dya, moe_cbuf wa,
                                 moe_cbuf dyb, moe_cbuf wb, const int32_t *offsets, int64_t E,
                                 int64_t I, int64_t O, moe_recipe prec) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->grouped_dgrad_sum(p->inner, dx, dya, wa, dyb, wb, offsets, E, I, O, prec);
    prof_end_op(p, t0, MOE_OP_GROUPED_MATMUL, 1);
}

static void pr_swiglu_forward(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                              moe_recipe prec, const moe_fp8_groups *pairs) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->swiglu_forward(p->inner, out, a, b, n, prec, pairs);
    prof_end_op(p, t0, MOE_OP_SWIGLU, 0);
}

static void pr_swiglu_backward(const moe_backend *be, moe_buf da, moe_buf db, moe_cbuf dout,
                               moe_cbuf a, moe_cbuf b, int64_t n, const moe_fp8_groups *pairs) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->swiglu_backward(p->inner, da, db, dout, a, b, n, pairs);
    prof_end_op(p, t0, MOE_OP_SWIGLU, 1);
}

static void pr_pool_forward(const moe_backend *be, float *out, const float *x, const int32_t *range,
                            int64_t B, int64_t T, int64_t C, int max) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->pool_forward(p->inner, out, x, range, B, T, C, max);
    prof_end_op(p, t0, MOE_OP_POOL, 0);
}

static void pr_cross_entropy_forward(const moe_backend *be, float *loss, float *lse,
                                     const float *logits, const int32_t *targets,
                                     const float *weights, int64_t N, int64_t V) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->cross_entropy_forward(p->inner, loss, lse, logits, targets, weights, N, V);
    prof_end_op(p, t0, MOE_OP_CROSS_ENTROPY, 0);
}

static void pr_cross_entropy_backward(const moe_backend *be, float *dlogits, const float *logits,
                                      const float *lse, const int32_t *targets,
                                      const float *weights, float dloss, int64_t N, int64_t V) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->cross_entropy_backward(p->inner, dlogits, logits, lse, targets, weights, dloss, N, V);
    prof_end_op(p, t0, MOE_OP_CROSS_ENTROPY, 1);
}

static void pr_add(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->add(p->inner, out, a, b, n);
    prof_end_op(p, t0, MOE_OP_ADD, 0);
}

static void pr_adamw(const moe_backend *be, float *param, uint16_t *param16, uint16_t *param_lo,
                     moe_cbuf grad, moe_buf m, moe_buf v, int64_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->adamw(p->inner, param, param16, param_lo, grad, m, v, n, lr, beta1, beta2, eps,
                    weight_decay, step, grad_scale);
    prof_end_op(p, t0, MOE_OP_ADAMW, 0);
}

static void pr_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->cast_bf16(p->inner, dst, src, n);
    prof_end_op(p, t0, MOE_OP_CAST, 0);
}

static void pr_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w,
                               int64_t E, int64_t O, int64_t I, moe_recipe prec) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->quantize_weight(p->inner, q, s, w, E, O, I, prec);
    prof_end_op(p, t0, MOE_OP_QUANTIZE, 0);
}

static void pr_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                             const moe_fp8_groups *pairs) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->quantize_pair(p->inner, out, x, pairs);
    prof_end_op(p, t0, MOE_OP_QUANTIZE, 0);
}

/* counted as AdamW: the pass that replaces AdamW and the quantization after it */
static void pr_adamw_quantize(const moe_backend *be, float *param, moe_cbuf grad, moe_buf m,
                              moe_buf v, uint8_t *q, float *s, int64_t E, int64_t O, int64_t I,
                              moe_recipe prec, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step, float grad_scale) {
    prof_ctx *p = ctx_of(be);
    double t0 = prof_begin(p);
    p->inner->adamw_quantize(p->inner, param, grad, m, v, q, s, E, O, I, prec, lr, beta1, beta2,
                             eps, weight_decay, step, grad_scale);
    prof_end_op(p, t0, MOE_OP_ADAMW, 0);
}

static double pr_sum_squares(const moe_backend *be, moe_cbuf x, int64_t n) {
    prof_ctx *p = ctx_of(be);
    p->st.host_syncs++;
    double t0 = prof_begin(p);
    double r = p->inner->sum_squares(p->inner, x, n);
    prof_end_op(p, t0, MOE_OP_SUM_SQUARES, 0);
    return r;
}

/* ---- public API ---- */

const moe_backend *moe_backend_prof_wrap(const moe_backend *inner, moe_err *err) {
    prof_ctx *p = calloc(1, sizeof *p);
    if (!p) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory for the profiling wrapper");
        return NULL;
    }
    p->inner = inner;
    moe_err_clear(&p->first_err);
    moe_backend *t = &p->table;
    t->name = inner->name;
    t->ctx = p;
    t->bf16_native = inner->bf16_native;
    t->mx_native = inner->mx_native;
    t->fp8_pairs = inner->fp8_pairs;
    t->supports = pr_supports;
    t->destroy = moe_backend_prof_free; /* the wrapper only: the inner backend is the caller's */
    t->memory = pr_memory;
    t->alloc = pr_alloc;
    t->free = pr_free;
    t->memcpy_h2d = pr_memcpy_h2d;
    t->memcpy_d2h = pr_memcpy_d2h;
    t->memcpy_d2d = pr_memcpy_d2d;
    t->memset = pr_memset;
    t->synchronize = pr_synchronize;
    t->embedding_forward = pr_embedding_forward;
    t->embedding_backward = pr_embedding_backward;
    t->rmsnorm_forward = pr_rmsnorm_forward;
    t->rmsnorm_backward = pr_rmsnorm_backward;
    t->rope_forward = pr_rope_forward;
    t->rope_backward = pr_rope_backward;
    t->attention_forward = pr_attention_forward;
    t->attention_backward = pr_attention_backward;
    t->matmul_forward = pr_matmul_forward;
    t->matmul_backward = pr_matmul_backward;
    t->router_forward = pr_router_forward;
    t->router_backward = pr_router_backward;
    t->permute_forward = pr_permute_forward;
    t->permute_backward = pr_permute_backward;
    t->unpermute_forward = pr_unpermute_forward;
    t->unpermute_backward = pr_unpermute_backward;
    t->grouped_matmul_forward = pr_grouped_matmul_forward;
    t->grouped_matmul_backward = pr_grouped_matmul_backward;
    t->grouped_dgrad_sum = pr_grouped_dgrad_sum;
    t->swiglu_forward = pr_swiglu_forward;
    t->swiglu_backward = pr_swiglu_backward;
    t->pool_forward = pr_pool_forward;
    t->cross_entropy_forward = pr_cross_entropy_forward;
    t->cross_entropy_backward = pr_cross_entropy_backward;
    t->add = pr_add;
    t->adamw = pr_adamw;
    t->cast_bf16 = pr_cast_bf16;
    t->quantize_weight = pr_quantize_weight;
    t->quantize_pair = pr_quantize_pair;
    t->adamw_quantize = pr_adamw_quantize;
    t->sum_squares = pr_sum_squares;
    return t;
}

const moe_backend *moe_backend_prof_inner(const moe_backend *prof) {
    return ctx_of(prof)->inner;
}

void moe_backend_prof_free(const moe_backend *prof) {
    if (prof) free(ctx_of(prof));
}

void moe_backend_prof_get(const moe_backend *prof, moe_backend_prof_stats *out) {
    *out = ctx_of(prof)->st;
}

void moe_backend_prof_reset(const moe_backend *prof) {
    memset(&ctx_of(prof)->st, 0, sizeof(moe_backend_prof_stats));
}

moe_prof_kind moe_backend_prof_kind_of(moe_op op) {
    switch (op) {
    case MOE_OP_ATTENTION:
        return MOE_PROF_ATTENTION;
    case MOE_OP_GROUPED_MATMUL:
        return MOE_PROF_EXPERT_GEMM;
    case MOE_OP_MATMUL:
        return MOE_PROF_DENSE_GEMM;
    default:
        return MOE_PROF_OTHER;
    }
}

const char *moe_backend_prof_kind_name(moe_prof_kind kind) {
    switch (kind) {
    case MOE_PROF_ATTENTION:
        return "attention";
    case MOE_PROF_EXPERT_GEMM:
        return "expert GEMMs";
    case MOE_PROF_DENSE_GEMM:
        return "dense GEMMs";
    case MOE_PROF_OTHER:
        return "other ops";
    case MOE_PROF_MEMORY:
        return "memory";
    default:
        return "?";
    }
}

double moe_backend_prof_kind_seconds(const moe_backend_prof_stats *s, moe_prof_kind kind,
                                     int64_t *calls) {
    double sec = 0.0;
    int64_t n = 0;
    if (kind == MOE_PROF_MEMORY) {
        sec = s->mem_seconds;
        n = s->mem_calls;
    } else {
        for (int op = 0; op < MOE_OP_COUNT; op++)
            if (moe_backend_prof_kind_of((moe_op)op) == kind)
                for (int d = 0; d < 2; d++) {
                    sec += s->op_seconds[op][d];
                    n += s->op_calls[op][d];
                }
    }
    if (calls) *calls = n;
    return sec;
}

void moe_backend_prof_print(const moe_backend_prof_stats *s, int steps, double wall_seconds,
                            FILE *f) {
    double per = steps > 0 ? 1.0 / steps : 1.0, timed = 0.0;
    double wall = wall_seconds > 0.0 ? wall_seconds : 1e-30;
    fprintf(f, "| op kind | ms/step | share of profiled step | calls/step |\n|---|---|---|---|\n");
    for (int k = 0; k < MOE_PROF_KIND_COUNT; k++) {
        int64_t n = 0;
        double sec = moe_backend_prof_kind_seconds(s, (moe_prof_kind)k, &n);
        timed += sec;
        fprintf(f, "| %s | %.2f | %.1f%% | %.0f |\n", moe_backend_prof_kind_name((moe_prof_kind)k),
                sec * per * 1e3, 100.0 * sec / wall, (double)n * per);
    }
    fprintf(f, "| host (outside the table) | %.2f | %.1f%% | - |\n",
            (wall_seconds - timed) * per * 1e3, 100.0 * (wall_seconds - timed) / wall);
    fprintf(f, "| profiled step | %.2f | 100%% | - |\n", wall_seconds * per * 1e3);
    fprintf(f,
            "\nhost synchronisations per step (synchronize, memcpy h2d/d2h, sum_squares): "
            "%.0f\n",
            (double)s->host_syncs * per);
    fprintf(f, "\n| op | direction | ms/step | calls/step |\n|---|---|---|---|\n");
    for (int op = 0; op < MOE_OP_COUNT; op++)
        for (int d = 0; d < 2; d++)
            if (s->op_calls[op][d] > 0)
                fprintf(f, "| %s | %s | %.3f | %.0f |\n", moe_op_name((moe_op)op),
                        d ? "backward" : "forward", s->op_seconds[op][d] * per * 1e3,
                        (double)s->op_calls[op][d] * per);
}
