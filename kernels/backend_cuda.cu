/* backend_cuda: the CUDA backend table - context (device, stream, cuBLASLt handle, one GEMM
 * workspace, scratch buffers), memory functions, error recording, the fp32<->bf16 operand
 * conversions, and the small ops (add, AdamW, sum of squares).
 *
 * The one thing a reader must know: op entries cannot return an error (ops.h gives them
 * void), so every CUDA/cuBLASLt status is checked and the first failure is stored in the
 * context with the op name, its shape and the CUDA error string; synchronize() reports it.
 * Everything runs on one stream in submission order. */
#include <cuda_profiler_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.cuh"
#include "backend_cuda.cuh"
#include "ops/cuda_scratch.h"

extern "C" {
#include "moe/backend_cuda.h"
}

/* ------------------------------------------------------------------------------------------
 * error recording and scratch. Errors go through libmoe_base's moe_err_set (first error
 * wins), which libmoe_cuda links directly. */

static int moe_cuda_record(moe_cuda_ctx *c, const char *op, const char *what, const char *fmt,
                           va_list ap) {
    if (c->err.status != MOE_OK) return 0;
    char shape[256];
    vsnprintf(shape, sizeof shape, fmt, ap);
    moe_err_set(&c->err, MOE_ERR_RUNTIME, NULL, "cuda: %s [%s]: %s", op, shape, what);
    moe_err_hint(&c->err, "check the GPU with nvidia-smi; CUDA_LAUNCH_BLOCKING=1 pins an "
                          "asynchronous error to the op that caused it");
    return 0;
}

int moe_cuda_check(moe_cuda_ctx *c, cudaError_t e, const char *op, const char *shape_fmt, ...) {
    if (e == cudaSuccess) return 1;
    va_list ap;
    va_start(ap, shape_fmt);
    char what[256];
    snprintf(what, sizeof what, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    moe_cuda_record(c, op, what, shape_fmt, ap);
    va_end(ap);
    return 0;
}

int moe_cublas_check(moe_cuda_ctx *c, cublasStatus_t s, const char *op, const char *shape_fmt,
                     ...) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    va_list ap;
    va_start(ap, shape_fmt);
    char what[256];
    snprintf(what, sizeof what, "cuBLASLt status %d (%s)", (int)s, cublasLtGetStatusString(s));
    moe_cuda_record(c, op, what, shape_fmt, ap);
    va_end(ap);
    return 0;
}

int moe_cuda_typed_ok(moe_cuda_ctx *c, moe_dtype dt, const char *op) {
    if (dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16) return 1;
    return moe_cuda_check(c, cudaErrorInvalidValue, op, "operand of type %s (f32 or bf16 expected)",
                          moe_dtype_name(dt));
}

void *moe_cuda_scratch(moe_cuda_ctx *c, int slot, size_t bytes, const char *op) {
    if (bytes == 0) bytes = 16;
    if (c->scratch_bytes[slot] >= bytes) return c->scratch[slot];
    size_t want = MOE_CUDA_SCRATCH_GROW(bytes);
    if (c->scratch[slot]) {
        /* the old buffer may still be read by queued work */
        if (!moe_cuda_check(c, cudaStreamSynchronize(c->stream), op, "scratch %zu bytes", want))
            return NULL;
        cudaFree(c->scratch[slot]);
        moe_cuda_account(c, -(long long)c->scratch_bytes[slot]);
        c->scratch[slot] = NULL;
        c->scratch_bytes[slot] = 0;
    }
    void *p = NULL;
    if (!moe_cuda_check(c, cudaMalloc(&p, want), op, "scratch buffer of %zu bytes", want))
        return NULL;
    c->scratch[slot] = p;
    c->scratch_bytes[slot] = want;
    moe_cuda_account(c, (long long)want);
    return p;
}

/* ------------------------------------------------------------------------------------------
 * fp32 <-> bf16 */

__global__ void k_f32_to_bf16(__nv_bfloat16 *__restrict__ dst, const float *__restrict__ src,
                              int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t n4 = n / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4 *>(src)[i];
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        reinterpret_cast<__nv_bfloat162 *>(dst)[2 * i] = lo;
        reinterpret_cast<__nv_bfloat162 *>(dst)[2 * i + 1] = hi;
    }
    for (int64_t i = 4 * n4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void k_f32_to_bf16_unaligned(__nv_bfloat16 *__restrict__ dst,
                                        const float *__restrict__ src, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void k_round_bf16(float *__restrict__ x, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = moe_dev_round_bf16(x[i]);
}

int moe_cuda_f32_to_bf16(moe_cuda_ctx *c, __nv_bfloat16 *dst, const float *src, int64_t n,
                         const char *op) {
    if (n <= 0) return 1;
    int aligned = ((uintptr_t)src % 16 == 0) && ((uintptr_t)dst % 8 == 0);
    if (aligned)
        k_f32_to_bf16<<<moe_cuda_grid(c, n / 4 + 1, 256), 256, 0, c->stream>>>(dst, src, n);
    else
        k_f32_to_bf16_unaligned<<<moe_cuda_grid(c, n, 256), 256, 0, c->stream>>>(dst, src, n);
    return MOE_CUDA_LAUNCHED(c, op, "bf16 conversion of %lld values", (long long)n);
}

int moe_cuda_round_bf16(moe_cuda_ctx *c, float *x, int64_t n, const char *op) {
    if (n <= 0) return 1;
    k_round_bf16<<<moe_cuda_grid(c, n, 256), 256, 0, c->stream>>>(x, n);
    return MOE_CUDA_LAUNCHED(c, op, "bf16 rounding of %lld values", (long long)n);
}

__global__ void k_bf16_to_f32(float *__restrict__ dst, const __nv_bfloat16 *__restrict__ src,
                              int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __bfloat162float(src[i]);
}

float *moe_cuda_f32_operand(moe_cuda_ctx *c, int slot, const __nv_bfloat16 *src, int64_t n,
                            const char *op) {
    float *p = (float *)moe_cuda_scratch(c, slot, (size_t)n * sizeof(float), op);
    if (!p || n <= 0) return p;
    k_bf16_to_f32<<<moe_cuda_grid(c, n, 256), 256, 0, c->stream>>>(p, src, n);
    return MOE_CUDA_LAUNCHED(c, op, "bf16 widening of %lld values", (long long)n) ? p : NULL;
}

__nv_bfloat16 *moe_cuda_bf16_operand(moe_cuda_ctx *c, int slot, const float *src, int64_t n,
                                     const char *op) {
    __nv_bfloat16 *p = (__nv_bfloat16 *)moe_cuda_scratch(c, slot, (size_t)n * 2, op);
    if (!p) return NULL;
    if (!moe_cuda_f32_to_bf16(c, p, src, n, op)) return NULL;
    return p;
}

/* ------------------------------------------------------------------------------------------
 * memory functions */

static void *cu_alloc(const moe_backend *be, size_t bytes) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        moe_cuda_check(c, e, "alloc", "%zu bytes; %zu of %zu bytes free on the device", bytes,
                       free_b, total_b);
        return NULL;
    }
    if (!moe_cuda_check(c, cudaMemsetAsync(p, 0, bytes, c->stream), "alloc", "zero %zu bytes",
                        bytes)) {
        cudaFree(p);
        return NULL;
    }
    if (c->n_alloc == c->cap_alloc) {
        int cap = c->cap_alloc ? 2 * c->cap_alloc : 64;
        void **np_ = (void **)realloc(c->alloc_ptr, (size_t)cap * sizeof(void *));
        if (np_) c->alloc_ptr = np_;
        size_t *ns = (size_t *)realloc(c->alloc_size, (size_t)cap * sizeof(size_t));
        if (ns) c->alloc_size = ns;
        if (!np_ || !ns) {
            cudaFree(p);
            moe_cuda_check(c, cudaErrorMemoryAllocation, "alloc", "host bookkeeping");
            return NULL;
        }
        c->cap_alloc = cap;
    }
    c->alloc_ptr[c->n_alloc] = p;
    c->alloc_size[c->n_alloc++] = bytes;
    moe_cuda_account(c, (long long)bytes);
    return p;
}

static void cu_free(const moe_backend *be, void *p) {
    if (!p) return;
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    for (int i = c->n_alloc - 1; i >= 0; i--)
        if (c->alloc_ptr[i] == p) {
            moe_cuda_account(c, -(long long)c->alloc_size[i]);
            c->alloc_ptr[i] = c->alloc_ptr[c->n_alloc - 1];
            c->alloc_size[i] = c->alloc_size[c->n_alloc - 1];
            c->n_alloc--;
            break;
        }
    moe_cuda_check(c, cudaFree(p), "free", "%p", p);
}

static void cu_memcpy_h2d(const moe_backend *be, void *dst, const void *src, size_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n == 0 || moe_cuda_failed(c)) return;
    /* synchronous: the caller may reuse its host buffer as soon as we return */
    if (moe_cuda_check(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream),
                       "memcpy_h2d", "%zu bytes", n))
        moe_cuda_check(c, cudaStreamSynchronize(c->stream), "memcpy_h2d", "%zu bytes", n);
}

static void cu_memcpy_d2h(const moe_backend *be, void *dst, const void *src, size_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n == 0) return;
    if (moe_cuda_failed(c)) {
        memset(dst, 0, n); /* never hand back uninitialised memory; synchronize() reports */
        return;
    }
    if (moe_cuda_check(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream),
                       "memcpy_d2h", "%zu bytes", n))
        moe_cuda_check(c, cudaStreamSynchronize(c->stream), "memcpy_d2h", "%zu bytes", n);
}

static void cu_memcpy_d2d(const moe_backend *be, void *dst, const void *src, size_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n == 0 || moe_cuda_failed(c)) return;
    moe_cuda_check(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream),
                   "memcpy_d2d", "%zu bytes", n);
}

static void cu_memset(const moe_backend *be, void *dst, int byte, size_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n == 0 || moe_cuda_failed(c)) return;
    moe_cuda_check(c, cudaMemsetAsync(dst, byte, n, c->stream), "memset", "%zu bytes", n);
}

static moe_status cu_synchronize(const moe_backend *be, moe_err *err) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (!moe_cuda_failed(c))
        moe_cuda_check(c, cudaStreamSynchronize(c->stream), "synchronize", "stream");
    if (moe_cuda_failed(c)) {
        if (err && err->status == MOE_OK) *err = c->err;
        return c->err.status;
    }
    return MOE_OK;
}

/* The recipes and sizes the kernels take; the shape predicates are the ones the kernels
 * check at launch, so supports() and a refused launch never disagree. */
static int cu_supports(const moe_backend *be, moe_op op, const moe_op_dims *d, moe_recipe prec) {
    (void)be;
    if (op < 0 || op >= MOE_OP_COUNT) return 0;
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) { /* its products in fp8, the rest bf16 */
        if (d && op == MOE_OP_MATMUL) /* the attention projections C -> H*D, KV*D, and back */
            return moe_cuda_fp8_shape_ok(d->C, d->H * d->D) &&
                   moe_cuda_fp8_shape_ok(d->C, d->KV * d->D);
        if (d && op == MOE_OP_GROUPED_MATMUL) return moe_cuda_fp8_shape_ok(d->C, d->F);
        prec = MOE_RECIPE_BF16;
    }
    /* mxfp8: its products on bf16 tiles of the quantized values (mxfp8.cu), any shape; the
     * rest bf16 */
    if (moe_recipe_format(prec) == MOE_RECIPE_MXFP8) prec = MOE_RECIPE_BF16;
    if (prec != MOE_RECIPE_BF16 && prec != MOE_RECIPE_FP32) return 0;
    if (!d) return 1;
    switch (op) {
    case MOE_OP_ATTENTION:
        return moe_cuda_attention_shape_ok(d->B, d->T, d->H, d->KV, d->D, prec);
    case MOE_OP_ROPE:
        return d->D % 2 == 0;
    case MOE_OP_ROUTER:
        return d->K >= 1 && d->K <= d->E;
    case MOE_OP_PERMUTE:
        return d->E >= 1 && d->E <= MOE_CUDA_MAX_EXPERTS;
    default:
        return 1;
    }
}

static void cu_memory(const moe_backend *be, size_t *current, size_t *peak) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (current) *current = c->mem_current;
    if (peak) *peak = c->mem_peak;
}

/* ------------------------------------------------------------------------------------------
 * add, AdamW, sum of squares */

template <int V, typename TO, typename TA, typename TB>
__global__ void k_add(TO *out, const TA *a, const TB *b, int64_t n) { /* out may be a or b */
    int64_t stride = (int64_t)gridDim.x * blockDim.x * V;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n; i += stride) {
        float av[V], bv[V];
        moe_ldv<V>(a, i, av);
        moe_ldv<V>(b, i, bv);
#pragma unroll
        for (int j = 0; j < V; j++)
            av[j] += bv[j];
        moe_stv<V>(out, i, av);
    }
}

template <typename TO, typename TA, typename TB>
static void add_launch(moe_cuda_ctx *c, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    if (moe_cuda_vec_ok(n, out.p, a.p, b.p))
        k_add<MOE_VEC><<<moe_cuda_grid(c, n / MOE_VEC, 256), 256, 0, c->stream>>>(
            (TO *)out.p, (const TA *)a.p, (const TB *)b.p, n);
    else
        k_add<1><<<moe_cuda_grid(c, n, 256), 256, 0, c->stream>>>((TO *)out.p, (const TA *)a.p,
                                                                  (const TB *)b.p, n);
}

/* the launch for b's element type, then a's (out's chosen by the caller) */
template <typename TO, typename TA>
static void add_typed_b(moe_cuda_ctx *c, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    if (b.dt == MOE_DTYPE_BF16)
        add_launch<TO, TA, __nv_bfloat16>(c, out, a, b, n);
    else
        add_launch<TO, TA, float>(c, out, a, b, n);
}
template <typename TO>
static void add_typed_a(moe_cuda_ctx *c, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    if (a.dt == MOE_DTYPE_BF16)
        add_typed_b<TO, __nv_bfloat16>(c, out, a, b, n);
    else
        add_typed_b<TO, float>(c, out, a, b, n);
}

void moe_cuda_add(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n <= 0 || moe_cuda_failed(c) || !moe_cuda_typed_ok(c, out.dt, "add") ||
        !moe_cuda_typed_ok(c, a.dt, "add") || !moe_cuda_typed_ok(c, b.dt, "add"))
        return;
    if (out.dt == MOE_DTYPE_BF16)
        add_typed_a<__nv_bfloat16>(c, out, a, b, n);
    else
        add_typed_a<float>(c, out, a, b, n);
    MOE_CUDA_LAUNCHED(c, "add", "n=%lld", (long long)n);
}

/* 4 split masters (optim.master split) from their halves: hi and lo hold 4 codes each,
 * element j in bits 16 (j % 2) of word j / 2 (moe/dtype.h's join: the CPU's bits). */
__device__ __forceinline__ float4 adamw_join4(uint2 hi, uint2 lo) {
    return make_float4(moe_f32_join_bf16((uint16_t)hi.x, (uint16_t)lo.x),
                       moe_f32_join_bf16((uint16_t)(hi.x >> 16), (uint16_t)(lo.x >> 16)),
                       moe_f32_join_bf16((uint16_t)hi.y, (uint16_t)lo.y),
                       moe_f32_join_bf16((uint16_t)(hi.y >> 16), (uint16_t)(lo.y >> 16)));
}
/* The halves of 4 new masters, packed as adamw_join4 reads them. */
__device__ __forceinline__ void adamw_split4(float4 p, uint2 *hi, uint2 *lo) {
    uint16_t h[4], l[4];
    moe_f32_split_bf16(p.x, h + 0, l + 0);
    moe_f32_split_bf16(p.y, h + 1, l + 1);
    moe_f32_split_bf16(p.z, h + 2, l + 2);
    moe_f32_split_bf16(p.w, h + 3, l + 3);
    hi->x = h[0] | (uint32_t)h[1] << 16, hi->y = h[2] | (uint32_t)h[3] << 16;
    lo->x = l[0] | (uint32_t)l[1] << 16, lo->y = l[2] | (uint32_t)l[3] << 16;
}

/* Elements [0, n), one at a time: the unaligned head and tail, or arrays that cannot be
 * read in vectors. SPLIT: the master is param16 and param_lo (param unused); else param,
 * with its bf16 copy in param16 when that is not NULL. */
template <class M, class G, bool SPLIT>
__global__ void k_adamw(float *__restrict__ param, __nv_bfloat16 *__restrict__ param16,
                        uint16_t *__restrict__ param_lo, const typename G::T *__restrict__ grad,
                        typename M::T *__restrict__ m, typename M::T *__restrict__ v, int64_t n,
                        adamw_hp h) {
    uint16_t *hi = reinterpret_cast<uint16_t *>(param16); /* SPLIT: the master's high half */
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        float p = SPLIT ? moe_f32_join_bf16(hi[i], param_lo[i]) : param[i];
        float mi = M::ld(m, i), vi = M::ld(v, i);
        adamw_moments<M>(G::ld(grad, i), &mi, &vi, h);
        M::st(m, i, mi);
        M::st(v, i, vi);
        p = adamw_update<M>(p, mi, vi, h);
        if (SPLIT) {
            moe_f32_split_bf16(p, hi + i, param_lo + i);
            continue;
        }
        param[i] = p;
        if (param16) param16[i] = __float2bfloat16_rn(p);
    }
}

/* Groups of 4 elements [0, 4 * n4): 16-byte loads and stores of param, 4 gradients and 4
 * moments of m and v per access (G::ld4, M::ld4; streamed: each byte is touched once per
 * step) and 8-byte stores of the bf16 copy; SPLIT: 8-byte loads and stores of the master's
 * two halves instead of param. */
template <class M, class G, bool SPLIT>
__global__ void k_adamw_vec4(float4 *__restrict__ param, uint2 *__restrict__ param16,
                             uint2 *__restrict__ param_lo, const typename G::T *__restrict__ grad,
                             typename M::T *__restrict__ m, typename M::T *__restrict__ v,
                             int64_t n4, adamw_hp h) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 p =
            SPLIT ? adamw_join4(__ldcs(param16 + i), __ldcs(param_lo + i)) : __ldcs(param + i);
        float4 g = G::ld4(grad, i), mi = M::ld4(m, i), vi = M::ld4(v, i);
        float *pp = &p.x, *gg = &g.x, *mm = &mi.x, *vv = &vi.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            adamw_moments<M>(gg[j], mm + j, vv + j, h);
            pp[j] = adamw_update<M>(pp[j], mm[j], vv[j], h);
        }
        if (SPLIT) {
            uint2 hi, lo;
            adamw_split4(p, &hi, &lo);
            __stcs(param16 + i, hi);
            __stcs(param_lo + i, lo);
        } else {
            __stcs(param + i, p);
        }
        M::st4(m, i, mi);
        M::st4(v, i, vi);
        if (!SPLIT && param16) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y),
                           hi = __floats2bfloat162_rn(p.z, p.w);
            uint2 u;
            u.x = *(const uint32_t *)&lo;
            u.y = *(const uint32_t *)&hi;
            __stcs(param16 + i, u);
        }
    }
}

/* Byte address modulo 16 of p + i elements of size es. */
static unsigned phase16(const void *p, int64_t i, size_t es) {
    return (unsigned)(((uintptr_t)p + (uintptr_t)i * es) % 16u);
}

/* p + i, or NULL for p NULL. */
template <class T> static T *adamw_at(T *p, int64_t i) {
    return p ? p + i : NULL;
}

/* The scalar head (until the master's main array, param or a split master's high half, is
 * aligned to a 4-element access), the vectors and the scalar tail; the vectors need the
 * gradients, moments and the other 2-byte array (the bf16 copy, or the split master's low
 * half) at the same element aligned to their 4-element access too, else every element runs
 * one at a time. */
template <class M, class G, bool SPLIT>
static void adamw_launch(moe_cuda_ctx *c, float *param, __nv_bfloat16 *p16, uint16_t *lo,
                         const typename G::T *grad, typename M::T *m, typename M::T *v, int64_t n,
                         const adamw_hp &h) {
    const size_t ms = sizeof(typename M::T), gs = sizeof(typename G::T);
    const void *w = SPLIT ? (const void *)p16 : (const void *)param;
    const size_t ws = SPLIT ? 2 : 4, wv = 4 * ws; /* the main array's element, its vector */
    int64_t head = (int64_t)((wv - phase16(w, 0, ws) % wv) % wv / ws);
    if (head > n) head = n;
    int vec = phase16(w, 0, ws) % ws == 0 && phase16(grad, head, gs) % (4 * gs) == 0 &&
              phase16(m, head, ms) % (4 * ms) == 0 && phase16(v, head, ms) % (4 * ms) == 0 &&
              (SPLIT ? phase16(lo, head, 2) % 8u == 0 : !p16 || phase16(p16, head, 2) % 8u == 0);
    int64_t n4 = vec ? (n - head) / 4 : 0, tail0 = head + 4 * n4;
    if (!vec) head = 0, tail0 = 0;
    if (head > 0)
        k_adamw<M, G, SPLIT><<<1, 32, 0, c->stream>>>(param, p16, lo, grad, m, v, head, h);
    if (n4 > 0) /* flat, blocks of 128: 4,174 GB/s on an H200 against 3,926 for 16 blocks of
                   256 a SM walking the array (the same bits; docs/performance-gpu.md) */
        k_adamw_vec4<M, G, SPLIT><<<moe_cuda_grid_flat(n4, 128), 128, 0, c->stream>>>(
            (float4 *)adamw_at(param, head), (uint2 *)adamw_at(p16, head),
            (uint2 *)adamw_at(lo, head), grad + head, m + head, v + head, n4, h);
    if (n - tail0 > 0)
        k_adamw<M, G, SPLIT><<<moe_cuda_grid(c, n - tail0, 256), 256, 0, c->stream>>>(
            adamw_at(param, tail0), adamw_at(p16, tail0), adamw_at(lo, tail0), grad + tail0,
            m + tail0, v + tail0, n - tail0, h);
}

/* adamw_launch for the moments' type M, the gradient's type and the master's form */
template <class M>
static void adamw_launch_g(moe_cuda_ctx *c, float *param, __nv_bfloat16 *p16, uint16_t *lo,
                           moe_cbuf grad, typename M::T *m, typename M::T *v, int64_t n,
                           const adamw_hp &h) {
    const uint16_t *g16 = (const uint16_t *)grad.p;
    const float *g32 = (const float *)grad.p;
    if (grad.dt == MOE_DTYPE_BF16 && lo)
        adamw_launch<M, grad_bf16, true>(c, param, p16, lo, g16, m, v, n, h);
    else if (grad.dt == MOE_DTYPE_BF16)
        adamw_launch<M, grad_bf16, false>(c, param, p16, lo, g16, m, v, n, h);
    else if (lo)
        adamw_launch<M, grad_f32, true>(c, param, p16, lo, g32, m, v, n, h);
    else
        adamw_launch<M, grad_f32, false>(c, param, p16, lo, g32, m, v, n, h);
}

void moe_cuda_adamw(const moe_backend *be, float *param, uint16_t *param16, uint16_t *param_lo,
                    moe_cbuf grad, moe_buf m, moe_buf v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n <= 0 || moe_cuda_failed(c)) return;
    if (!moe_cuda_typed_ok(c, m.dt, "adamw") || !moe_cuda_typed_ok(c, v.dt, "adamw") ||
        !moe_cuda_typed_ok(c, grad.dt, "adamw"))
        return;
    if (m.dt != v.dt) {
        moe_cuda_check(c, cudaErrorInvalidValue, "adamw", "moments m %s, v %s (one type expected)",
                       moe_dtype_name(m.dt), moe_dtype_name(v.dt));
        return;
    }
    if (param_lo ? !param16 || param : !param) {
        moe_cuda_check(c, cudaErrorInvalidValue, "adamw",
                       "a master is param alone or param16 with param_lo (a split master)");
        return;
    }
    const adamw_hp h = adamw_params(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    __nv_bfloat16 *p16 = (__nv_bfloat16 *)param16;
    if (m.dt == MOE_DTYPE_BF16)
        adamw_launch_g<adamw_bf16>(c, param, p16, param_lo, grad, (uint16_t *)m.p, (uint16_t *)v.p,
                                   n, h);
    else
        adamw_launch_g<adamw_f32>(c, param, p16, param_lo, grad, (float *)m.p, (float *)v.p, n, h);
    MOE_CUDA_LAUNCHED(c, "adamw", "n=%lld step=%lld moments %s grad %s master %s", (long long)n,
                      (long long)step, moe_dtype_name(m.dt), moe_dtype_name(grad.dt),
                      param_lo ? "split" : "fp32");
}

void moe_cuda_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (n <= 0 || moe_cuda_failed(c)) return;
    moe_cuda_f32_to_bf16(c, (__nv_bfloat16 *)dst, src, n, "cast_bf16");
}

#define MOE_SUMSQ_CHUNK 65536 /* elements per partial: fixed, so the sum order is fixed */

/* *out = the sum of every thread's s over the block (fixed order) */
__device__ __forceinline__ void sumsq_block_store(double *out, double s) {
    __shared__ double sh[32];
    s = moe_warp_sum_d(s);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0;
        t = moe_warp_sum_d(t);
        if (threadIdx.x == 0) *out = t;
    }
}

/* x [n] fp32 or bf16 (T float or __nv_bfloat16), one element a load */
template <class T>
__global__ void k_sumsq_partial(double *__restrict__ part, const T *__restrict__ x, int64_t n) {
    int64_t c0 = (int64_t)blockIdx.x * MOE_SUMSQ_CHUNK;
    int64_t c1 = c0 + MOE_SUMSQ_CHUNK < n ? c0 + MOE_SUMSQ_CHUNK : n;
    double s = 0.0;
    for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        double xi = (double)moe_ld(x, i);
        s += xi * xi;
    }
    sumsq_block_store(part + blockIdx.x, s);
}

/* x [n] bf16, 16-byte aligned: 8 values a streamed 16-byte load (2-byte loads leave too few
 * bytes in flight: 1,223 GB/s on an H100 against 2,939 for fp32, 2026-12-06), each chunk's
 * last (c1 - c0) % 8 one at a time */
__global__ void k_sumsq_partial_bf16x8(double *__restrict__ part,
                                       const __nv_bfloat16 *__restrict__ x, int64_t n) {
    int64_t c0 = (int64_t)blockIdx.x * MOE_SUMSQ_CHUNK;
    int64_t c1 = c0 + MOE_SUMSQ_CHUNK < n ? c0 + MOE_SUMSQ_CHUNK : n;
    const int64_t n8 = (c1 - c0) / 8;
    const uint4 *x8 = reinterpret_cast<const uint4 *>(x + c0);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n8; j += blockDim.x) {
        const uint4 q = __ldcs(x8 + j);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const double lo = moe_f32_from_bits(w[k] << 16);
            const double hi = moe_f32_from_bits(w[k] & 0xffff0000u);
            s += lo * lo;
            s += hi * hi;
        }
    }
    for (int64_t i = c0 + 8 * n8 + threadIdx.x; i < c1; i += blockDim.x) {
        double xi = (double)moe_ld(x, i);
        s += xi * xi;
    }
    sumsq_block_store(part + blockIdx.x, s);
}

__global__ void k_sumsq_final(double *__restrict__ out, const double *__restrict__ part,
                              int64_t nparts) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x)
        s += part[i];
    sumsq_block_store(out, s);
}

double moe_cuda_sum_squares(const moe_backend *be, moe_cbuf x, int64_t n) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, x.dt, "sum_squares")) return NAN;
    if (n <= 0) return 0.0;
    int64_t nparts = (n + MOE_SUMSQ_CHUNK - 1) / MOE_SUMSQ_CHUNK;
    double *part = (double *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_RED,
                                              (size_t)(nparts + 1) * sizeof(double), "sum_squares");
    if (!part) return NAN;
    if (x.dt == MOE_DTYPE_BF16 && (uintptr_t)x.p % 16 == 0) /* the experts' gradients */
        k_sumsq_partial_bf16x8<<<(unsigned)nparts, 256, 0, c->stream>>>(
            part + 1, (const __nv_bfloat16 *)x.p, n);
    else if (x.dt == MOE_DTYPE_BF16)
        k_sumsq_partial<<<(unsigned)nparts, 256, 0, c->stream>>>(part + 1,
                                                                 (const __nv_bfloat16 *)x.p, n);
    else
        k_sumsq_partial<<<(unsigned)nparts, 256, 0, c->stream>>>(part + 1, (const float *)x.p, n);
    if (!MOE_CUDA_LAUNCHED(c, "sum_squares", "n=%lld", (long long)n)) return NAN;
    k_sumsq_final<<<1, 1024, 0, c->stream>>>(part, part + 1, nparts);
    if (!MOE_CUDA_LAUNCHED(c, "sum_squares", "n=%lld (final)", (long long)n)) return NAN;
    if (!moe_cuda_check(
            c,
            cudaMemcpyAsync(c->host_red, part, sizeof(double), cudaMemcpyDeviceToHost, c->stream),
            "sum_squares", "n=%lld", (long long)n))
        return NAN;
    if (!moe_cuda_check(c, cudaStreamSynchronize(c->stream), "sum_squares", "n=%lld", (long long)n))
        return NAN;
    return *c->host_red;
}

/* ------------------------------------------------------------------------------------------
 * the table */

static void moe_cuda_ctx_release(moe_cuda_ctx *c) {
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    moe_gemm_cache_free(c);
    for (int i = 0; i < MOE_CUDA_SCRATCH_COUNT; i++)
        if (c->scratch[i]) cudaFree(c->scratch[i]);
    if (c->workspace) cudaFree(c->workspace);
    if (c->host_red) cudaFreeHost(c->host_red);
    free(c->alloc_ptr);
    free(c->alloc_size);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" int moe_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* reset the error state so later calls start clean */
        return 0;
    }
    return n;
}

extern "C" void moe_cuda_profile_range(const moe_backend *be, int on) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || !moe_cuda_check(c, cudaStreamSynchronize(c->stream), "profile",
                                              "waiting for the queued work"))
        return;
    moe_cuda_check(c, on ? cudaProfilerStart() : cudaProfilerStop(), "profile",
                   on ? "cudaProfilerStart" : "cudaProfilerStop");
}

static void cu_destroy(const moe_backend *be) {
    if (!be) return;
    moe_cuda_ctx_release(moe_cuda_ctx_of(be));
    free((void *)be);
}

extern "C" const moe_backend *moe_backend_cuda_on(int device, moe_err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (e != cudaSuccess) (void)cudaGetLastError();
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "no CUDA device available: %s",
                    e != cudaSuccess ? cudaGetErrorString(e) : "0 devices visible");
        moe_err_hint(err, "run on a machine with an NVIDIA GPU and driver, check "
                          "CUDA_VISIBLE_DEVICES, or use device: cpu");
        return NULL;
    }
    if (device < 0 || device >= n) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "CUDA device %d does not exist (%d visible)", device,
                    n);
        moe_err_hint(err, "device numbers start at 0; check CUDA_VISIBLE_DEVICES");
        return NULL;
    }
    moe_cuda_ctx *c = (moe_cuda_ctx *)calloc(1, sizeof *c);
    moe_backend *be = (moe_backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(c);
        free(be);
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory creating the CUDA backend");
        return NULL;
    }
    memset(&c->err, 0, sizeof c->err); /* status MOE_OK */
    c->device = device;
    int ok = moe_cuda_check(c, cudaSetDevice(device), "init", "device %d", device);
    cudaDeviceProp prop;
    if (ok)
        ok = moe_cuda_check(c, cudaGetDeviceProperties(&prop, device), "init", "device %d", device);
    if (ok && prop.major < 8) {
        moe_err_set(&c->err, MOE_ERR_RUNTIME, NULL,
                    "CUDA device %d (%s) has compute capability %d.%d; bf16 kernels need 8.0+",
                    device, prop.name, prop.major, prop.minor);
        moe_err_hint(&c->err, "use a GPU of the Ampere generation or newer");
        ok = 0;
    }
    if (ok) {
        c->num_sms = prop.multiProcessorCount;
        c->sm = prop.major * 10 + prop.minor;
        c->smem_optin = (int)prop.sharedMemPerBlockOptin;
        ok = moe_cuda_check(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "init",
                            "stream");
    }
    if (ok) ok = moe_cublas_check(c, cublasLtCreate(&c->lt), "init", "cuBLASLt handle");
    if (ok) {
        c->workspace_bytes = MOE_CUDA_WORKSPACE_BYTES;
        ok = moe_cuda_check(c, cudaMalloc(&c->workspace, c->workspace_bytes), "init",
                            "cuBLASLt workspace %zu bytes", c->workspace_bytes);
        if (ok) moe_cuda_account(c, (long long)c->workspace_bytes);
    }
    if (ok)
        ok = moe_cuda_check(c, cudaMallocHost((void **)&c->host_red, sizeof(double)), "init",
                            "pinned host word");
    if (ok) c->mx_native = moe_cuda_mx_probe(c);
    if (!ok) {
        if (err && err->status == MOE_OK) *err = c->err;
        moe_cuda_ctx_release(c);
        free(be);
        return NULL;
    }
    be->name = "cuda";
    be->ctx = c;
    be->bf16_native = 1;
    be->mx_native = c->mx_native;
#if MOE_HAVE_SM90A /* the pairs' row-wise copy is read by the grouped fp8 kernel (cuBLASLt reads   \
                      one group of a multiple of 16 rows: ln1's, gemm_cublaslt.cu) */
    be->fp8_pairs = c->sm == 90 ? MOE_CUDA_GROUPED_MAXE : 0;
#endif
    be->supports = cu_supports;
    be->destroy = cu_destroy;
    be->memory = cu_memory;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->memcpy_h2d = cu_memcpy_h2d;
    be->memcpy_d2h = cu_memcpy_d2h;
    be->memcpy_d2d = cu_memcpy_d2d;
    be->memset = cu_memset;
    be->synchronize = cu_synchronize;
    be->embedding_forward = moe_cuda_embedding_forward;
    be->embedding_backward = moe_cuda_embedding_backward;
    be->rmsnorm_forward = moe_cuda_rmsnorm_forward;
    be->rmsnorm_backward = moe_cuda_rmsnorm_backward;
    be->rope_forward = moe_cuda_rope_forward;
    be->rope_backward = moe_cuda_rope_backward;
    be->attention_forward = moe_cuda_attention_forward;
    be->attention_backward = moe_cuda_attention_backward;
    be->matmul_forward = moe_cuda_matmul_forward;
    be->matmul_backward = moe_cuda_matmul_backward;
    be->router_forward = moe_cuda_router_forward;
    be->router_backward = moe_cuda_router_backward;
    be->permute_forward = moe_cuda_permute_forward;
    be->permute_backward = moe_cuda_permute_backward;
    be->unpermute_forward = moe_cuda_unpermute_forward;
    be->unpermute_backward = moe_cuda_unpermute_backward;
    be->grouped_matmul_forward = moe_cuda_grouped_matmul_forward;
    be->grouped_matmul_backward = moe_cuda_grouped_matmul_backward;
    be->grouped_dgrad_sum = moe_cuda_grouped_dgrad_sum;
    be->swiglu_forward = moe_cuda_swiglu_forward;
    be->swiglu_backward = moe_cuda_swiglu_backward;
    be->cross_entropy_forward = moe_cuda_cross_entropy_forward;
    be->cross_entropy_backward = moe_cuda_cross_entropy_backward;
    be->add = moe_cuda_add;
    be->adamw = moe_cuda_adamw;
    be->cast_bf16 = moe_cuda_cast_bf16;
    be->quantize_weight = moe_cuda_quantize_weight;
    be->quantize_pair = moe_cuda_quantize_pair;
    be->adamw_quantize = moe_cuda_adamw_quantize;
    be->sum_squares = moe_cuda_sum_squares;
    be->pool_forward = moe_cuda_pool_forward;
    return be;
}

extern "C" const moe_backend *moe_backend_cuda(moe_err *err) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    return moe_backend_cuda_on(dev, err);
}
