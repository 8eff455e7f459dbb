/* backend_cuda.cuh: what every CUDA backend file shares - the backend context, error recording,
 * scratch buffers and the small device helpers (bf16 packing, warp reductions).
 *
 * The one thing a reader must know: the op entries of moe_backend return void, so a failed
 * CUDA or cuBLASLt call is RECORDED in the context (the first failure wins, naming the op,
 * its shape and the CUDA error string) and reported by be->synchronize(). After a failure
 * every later op returns at once without launching anything, so the first error is the one
 * the user sees. All work is queued on one stream (ctx->stream), so scratch buffers can be
 * reused from one op to the next without extra synchronisation. */
#ifndef MOE_KERNELS_BACKEND_CUDA_CUH
#define MOE_KERNELS_BACKEND_CUDA_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "moe/err.h"
#include "moe/ops.h"
#include "moe/quant.h"
#include "ops/cuda_scratch.h" /* MOE_CUDA_GROUPED_MAXE */
}

/* Scratch slots: an op may hold several at once (e.g. attention backward converts q, k, v
 * and dout to bf16). Each slot grows on demand and is reused by every later op. */
enum moe_cuda_scratch_slot {
    MOE_CUDA_SCRATCH_A,
    MOE_CUDA_SCRATCH_B,
    MOE_CUDA_SCRATCH_C,
    MOE_CUDA_SCRATCH_D,
    MOE_CUDA_SCRATCH_E,
    MOE_CUDA_SCRATCH_F,
    MOE_CUDA_SCRATCH_RED, /* reduction partials */
    MOE_CUDA_SCRATCH_COUNT
};

struct moe_gemm_cache; /* gemm_plan.cu */

typedef struct moe_cuda_ctx {
    int device;
    int num_sms;
    int sm;         /* compute capability, major * 10 + minor */
    int smem_optin; /* max dynamic shared memory per block after opt-in, bytes */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt workspace, one for all GEMMs */
    size_t workspace_bytes;
    void *scratch[MOE_CUDA_SCRATCH_COUNT];
    size_t scratch_bytes[MOE_CUDA_SCRATCH_COUNT];
    double *host_red; /* pinned host word for sum_squares results */
    struct moe_gemm_cache *gemm_cache;
    void *tmap_encode; /* the driver's cuTensorMapEncodeTiled, looked up on first use */
    int mx_native;     /* cuBLASLt multiplies MXFP8 here (sm_100+: moe_cuda_mx_probe) */
    /* memory accounting: live allocations of be->alloc (pointer, size), plus scratch and
     * workspace, for moe_backend_cuda_memory */
    void **alloc_ptr;
    size_t *alloc_size;
    int n_alloc, cap_alloc;
    size_t mem_current, mem_peak;
    moe_err err; /* first recorded failure; status MOE_OK while none */
} moe_cuda_ctx;

/* Adds (bytes > 0) or removes (bytes < 0) device memory from the accounting. */
static inline void moe_cuda_account(moe_cuda_ctx *c, long long bytes) {
    c->mem_current = (size_t)((long long)c->mem_current + bytes);
    if (c->mem_current > c->mem_peak) c->mem_peak = c->mem_current;
}

static inline moe_cuda_ctx *moe_cuda_ctx_of(const moe_backend *be) {
    return (moe_cuda_ctx *)be->ctx;
}

/* 1 when an earlier failure was recorded (ops then do nothing). */
static inline int moe_cuda_failed(const moe_cuda_ctx *c) {
    return c->err.status != MOE_OK;
}

/* Records "cuda: <op> [<shape>]: <what>" as the context's first error. Returns 0 on a recorded
 * failure, 1 when e is cudaSuccess. The shape is a printf format for the op's sizes. */
int moe_cuda_check(moe_cuda_ctx *c, cudaError_t e, const char *op, const char *shape_fmt, ...)
    __attribute__((format(printf, 4, 5)));
int moe_cublas_check(moe_cuda_ctx *c, cublasStatus_t s, const char *op, const char *shape_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Checks the last kernel launch (cudaGetLastError). */
#define MOE_CUDA_LAUNCHED(c, op, ...) moe_cuda_check((c), cudaGetLastError(), (op), __VA_ARGS__)

/* Returns a device buffer of at least `bytes` for the slot, or NULL after recording an error. */
void *moe_cuda_scratch(moe_cuda_ctx *c, int slot, size_t bytes, const char *op);

/* fp32 -> bf16 copy (round to nearest even), n elements; on ctx->stream. 0 on failure. */
int moe_cuda_f32_to_bf16(moe_cuda_ctx *c, __nv_bfloat16 *dst, const float *src, int64_t n,
                         const char *op);
/* x[i] = round_bf16(x[i]) in place. 0 on failure. */
int moe_cuda_round_bf16(moe_cuda_ctx *c, float *x, int64_t n, const char *op);
/* Widens bf16 src to fp32 in scratch slot `slot` (exact); NULL after a recorded error. */
float *moe_cuda_f32_operand(moe_cuda_ctx *c, int slot, const __nv_bfloat16 *src, int64_t n,
                            const char *op);
/* Converts src to bf16 in scratch slot `slot`; returns it, or NULL after recording an error. */
__nv_bfloat16 *moe_cuda_bf16_operand(moe_cuda_ctx *c, int slot, const float *src, int64_t n,
                                     const char *op);

/* Blocks of `threads` for n items, one item per thread: no cap but the grid's (the kernel's
 * grid-stride loop takes what is past it). For streaming kernels a flat grid keeps more
 * loads in flight than a capped one walking the array (AdamW, 2026-12-04). */
static inline unsigned moe_cuda_grid_flat(int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > INT32_MAX) blocks = INT32_MAX;
    if (blocks < 1) blocks = 1;
    return (unsigned)blocks;
}

/* Grid size for a grid-stride elementwise loop over n items with `threads` per block: the
 * flat grid capped at 16 blocks a SM. */
static inline unsigned moe_cuda_grid(const moe_cuda_ctx *c, int64_t n, int threads) {
    const unsigned blocks = moe_cuda_grid_flat(n, threads), cap = (unsigned)c->num_sms * 16u;
    return blocks < cap ? blocks : cap;
}

/* ---- device helpers ---- */
#ifdef __CUDACC__
__device__ __forceinline__ float moe_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float moe_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double moe_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
 * `sh` holds 32 floats. Fixed order: deterministic. */
__device__ __forceinline__ float moe_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = moe_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return moe_warp_sum(t);
}
__device__ __forceinline__ float moe_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = moe_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return moe_warp_max(t);
}
/* 4 x 4 bytes: in[i] byte j -> out[j] byte i (4 rows of 4 columns -> 4 columns of 4 rows). */
__device__ __forceinline__ void moe_transpose4x4_bytes(const uint32_t in[4], uint32_t out[4]) {
    const uint32_t a = __byte_perm(in[0], in[1], 0x5140), b = __byte_perm(in[0], in[1], 0x7362),
                   c = __byte_perm(in[2], in[3], 0x5140), d = __byte_perm(in[2], in[3], 0x7362);
    out[0] = __byte_perm(a, c, 0x5410), out[1] = __byte_perm(a, c, 0x7632);
    out[2] = __byte_perm(b, d, 0x5410), out[3] = __byte_perm(b, d, 0x7632);
}
__device__ __forceinline__ float moe_dev_round_bf16(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}
/* SwiGLU's value and gradients at one element: the formulas of every SwiGLU kernel
 * (elementwise.cu, and the fp8-block pairs' in quant_fp8.cu); s = sigmoid(a), 1 / (1 + e)
 * correctly rounded (the division's bits), e = exp(-a). fast: the kernel's outputs are
 * rounded to bf16 (or below), and e comes from the hardware's exp2 (__expf: 2 instructions
 * where expf takes about 8; within 2 + 1.2 |a| ulps of exp(-a), s within about as many of
 * the sigmoid, far below a bf16 rounding); else from expf (fp32 outputs). */
__device__ __forceinline__ float swiglu_exp_neg(float a, bool fast) {
    return fast ? __expf(-a) : expf(-a);
}
__device__ __forceinline__ float swiglu_sigmoid(float a, bool fast) {
    return __frcp_rn(1.0f + swiglu_exp_neg(a, fast));
}
__device__ __forceinline__ float swiglu_val(float a, float b, bool fast) {
    return a * swiglu_sigmoid(a, fast) * b;
}
__device__ __forceinline__ void swiglu_grad_s(float g, float a, float b, float s, float *da,
                                              float *db) {
    const float silu = a * s;
    *da = g * b * (s + silu * (1.0f - s));
    *db = g * silu;
}
__device__ __forceinline__ void swiglu_grad(float g, float a, float b, bool fast, float *da,
                                            float *db) {
    swiglu_grad_s(g, a, b, swiglu_sigmoid(a, fast), da, db);
}
/* swiglu_sigmoid without __frcp_rn's branch a value: its inline path (the approximate
 * reciprocal and one Newton step, the same bits) where it applies, x = 1 + e with an exponent
 * field 1 .. 252; *ok = 0 elsewhere (a < about -87, or NaN), where the caller must take
 * swiglu_sigmoid. */
__device__ __forceinline__ float swiglu_sigmoid_quick(float a, bool fast, bool *ok) {
    const float x = 1.0f + swiglu_exp_neg(a, fast);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    *ok = x < 0x1p126f; /* x >= 1 or NaN: its exponent field in 1 .. 252, one comparison */
    return __fmaf_rn(r, -__fmaf_rn(x, r, -1.0f), r);
}
/* swiglu_val through swiglu_sigmoid_quick: its bits where *ok, else the caller's to take */
__device__ __forceinline__ float swiglu_val_quick(float a, float b, bool fast, bool *ok) {
    return a * swiglu_sigmoid_quick(a, fast, ok) * b;
}
/* |x| for finite x, 0 for NaN and +-Inf: a block's amax is over its finite values. */
__device__ __forceinline__ float moe_finite_abs(float x) {
    return isfinite(x) ? fabsf(x) : 0.0f;
}
/* An MXFP8 block of 32 held in registers by 8 consecutive lanes (lanes 8g .. 8g + 7 of the
 * warp), 4 consecutive values each, its 4 e4m3 bytes in one little-endian word. Decoding:
 * v[j] = e4m3(byte j of q4) * 2^(scale - 127), exact. */
__device__ __forceinline__ void moe_mx_decode4(uint32_t q4, uint8_t scale, float v[4]) {
    const float s = moe_e8m0_to_f32(scale);
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
        const float2 f = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(q4 >> 8 * j), __NV_E4M3)));
        v[j] = f.x * s, v[j + 1] = f.y * s;
    }
}
/* The sign bit of x's e4m3 byte when x is a negative NaN, else 0: the hardware conversion writes
 * every NaN as 0x7f, the CPU keeps a NaN's sign (0xff for -NaN; measured on an H200,
 * 2026-12-04). */
__device__ __forceinline__ uint32_t moe_e4m3_neg_nan(float x) {
    return __float_as_uint(x) > 0xff800000u ? 0x80u : 0u;
}
/* The e4m3 byte of x / scale for a power-of-two scale, inv = 1 / scale (exact, so x * inv is
 * the division's value): round to nearest even, saturating, NaN kept with its sign: the byte
 * of the CPU's moe_f32_to_e4m3(x / scale, 1). */
__device__ __forceinline__ uint32_t moe_e4m3_scaled(float x, float inv) {
    return (uint32_t)__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3) |
           moe_e4m3_neg_nan(x);
}
/* The amax of such a block over its finite values, from the lane's 4 values v: every lane of
 * the warp calls it together (the shuffles cross the block's 8 lanes, and order every lane's
 * reads of the block before any write: an in-place update is safe). */
__device__ __forceinline__ float moe_mx_amax4(const float v[4]) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++)
        amax = fmaxf(amax, moe_finite_abs(v[j]));
    for (int o = 1; o < 8; o <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    return amax;
}
/* Encoding such a block of values v (their bf16 roundings where an op stores an MXFP8 output,
 * with the ceil rule, floor_rule 0) by the rule, the bytes of moe_mxfp8_encode_block: returns
 * the lane's 4 e4m3 bytes and sets *code to the block's e8m0 scale. Every lane of the warp
 * calls it together (moe_mx_amax4). */
__device__ __forceinline__ uint32_t moe_mx_encode4(const float v[4], int floor_rule,
                                                   uint8_t *code) {
    const float scale = moe_mx_block_scale(moe_mx_amax4(v), floor_rule), inv = 1.0f / scale;
    *code = moe_f32_to_e8m0_ceil(scale); /* a power of two: exact */
    uint32_t q = 0;
#pragma unroll
    for (int j = 0; j < 4; j++)
        q |= moe_e4m3_scaled(v[j], inv) << 8 * j;
    return q;
}
/* The lane's 4 values of an MXFP8 array q [n] (scales mx [n / 32]) from element i (a multiple
 * of 4), and the store of its 4 encoded bytes w with the block's scale code (by the block's
 * first lane). */
__device__ __forceinline__ void moe_mx_load4(const uint8_t *q, const uint8_t *mx, int64_t i,
                                             float v[4]) {
    moe_mx_decode4(*reinterpret_cast<const uint32_t *>(q + i), mx[i / 32], v);
}
__device__ __forceinline__ void moe_mx_store4(uint8_t *q, uint8_t *mx, int64_t i, uint32_t w,
                                              uint8_t code) {
    *reinterpret_cast<uint32_t *>(q + i) = w;
    if ((threadIdx.x & 7) == 0) mx[i / 32] = code;
}
/* The walk of the kernels that take MXFP8 blocks 4 values a lane: a warp takes 128 elements
 * (4 blocks of 32) of [0, n) at a time, grid-stride, and f(i) runs with i the lane's first
 * element. The walk is warp-uniform: lanes past n (i >= n) still call f, so that every lane
 * takes part in a block's shuffles (moe_mx_amax4). */
template <typename F> __device__ __forceinline__ void moe_mx_walk(int64_t n, F f) {
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t base = (blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32) * 128;
         base < n; base += warps * 128)
        f(base + (threadIdx.x & 31) * 4);
}
/* Loads and stores of the two element types of typed operands (moe_cbuf / moe_buf), so that
 * one kernel template serves both: fp32 values, bf16 rounded to nearest even on store. */
__device__ __forceinline__ float moe_ld(const float *p, int64_t i) {
    return p[i];
}
__device__ __forceinline__ float moe_ld(const __nv_bfloat16 *p, int64_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void moe_st(float *p, int64_t i, float v) {
    p[i] = v;
}
__device__ __forceinline__ void moe_st(__nv_bfloat16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
/* V consecutive elements p[i .. i + V) as floats (moe_ldv) and back (moe_stv, the same
 * rounding as moe_st). V is 1 or MOE_VEC: with MOE_VEC, p + i must be 16-byte aligned
 * (moe_cuda_vec_ok) and each 4 floats or 8 bf16 move in one 16-byte access. */
#define MOE_VEC 8
template <int V> __device__ __forceinline__ void moe_ldv(const float *p, int64_t i, float *v) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 4) {
            const float4 q = *reinterpret_cast<const float4 *>(p + i + j);
            v[j] = q.x, v[j + 1] = q.y, v[j + 2] = q.z, v[j + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            v[j] = p[i + j];
    }
}
template <int V>
__device__ __forceinline__ void moe_ldv(const __nv_bfloat16 *p, int64_t i, float *v) {
    if constexpr (V % 8 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 8) {
            const uint4 q = *reinterpret_cast<const uint4 *>(p + i + j);
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&q);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = __bfloat1622float2(h[k]);
                v[j + 2 * k] = f.x, v[j + 2 * k + 1] = f.y;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            v[j] = __bfloat162float(p[i + j]);
    }
}
template <int V> __device__ __forceinline__ void moe_stv(float *p, int64_t i, const float *v) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 4)
            *reinterpret_cast<float4 *>(p + i + j) =
                make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            p[i + j] = v[j];
    }
}
template <int V>
__device__ __forceinline__ void moe_stv(__nv_bfloat16 *p, int64_t i, const float *v) {
    if constexpr (V % 8 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 8) {
            uint4 q;
            __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&q);
#pragma unroll
            for (int k = 0; k < 4; k++)
                h[k] = __floats2bfloat162_rn(v[j + 2 * k], v[j + 2 * k + 1]);
            *reinterpret_cast<uint4 *>(p + i + j) = q;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            p[i + j] = __float2bfloat16_rn(v[j]);
    }
}
#endif

/* 1 when n (an element count or a row length) is a multiple of MOE_VEC and every pointer
 * given (NULL ends the list; NULLs cannot be operands) is 16-byte aligned: the kernels may
 * then move MOE_VEC elements at a time. */
static inline int moe_cuda_vec_ok(int64_t n, const void *p0, const void *p1 = NULL,
                                  const void *p2 = NULL, const void *p3 = NULL,
                                  const void *p4 = NULL) {
    const void *ps[5] = {p0, p1, p2, p3, p4};
    if (n % MOE_VEC) return 0;
    for (int i = 0; i < 5 && ps[i]; i++)
        if ((uintptr_t)ps[i] % 16) return 0;
    return 1;
}

/* 1 for the element types typed operands may have (F32, BF16), else 0 after recording an
 * error naming the op. */
int moe_cuda_typed_ok(moe_cuda_ctx *c, moe_dtype dt, const char *op);
/* ---- MXFP8 activations and the mxfp8 recipe's product operands (mxfp8.cu; the values of
 * moe/quant.h's CPU emulation) ---- */
/* Where an op's kernels write out [n]: for an MXFP8 out a bf16 stand-in in scratch slot
 * `slot`, which moe_cuda_mx_write then encodes into out; an F32 or BF16 out itself. .p NULL
 * after a recorded error. */
moe_buf moe_cuda_mx_stage(moe_cuda_ctx *c, int slot, moe_buf out, int64_t n, const char *op);
/* out [n] = the MXFP8 encoding (ceil rule) of staged's bf16 values when out is MXFP8; else
 * nothing (staged was out). 0 after a recorded error. */
int moe_cuda_mx_write(moe_cuda_ctx *c, moe_buf out, moe_buf staged, int64_t n, const char *op);
/* dst [R, K] bf16 = x [R, K] (F32, BF16 or MXFP8) fake-quantized as an mxfp8 product
 * operand: blocks of 32 along each row (group 0: the product reduces over K) or along the
 * columns, in blocks of 32 rows that start afresh every `group` rows (the product reduces
 * over R: a weight's experts of `group` rows each, or one expert's tokens); floor_rule: OCP's
 * scale rule (MOE_RECIPE_MXFP8_FLOOR) instead of ceil. 0 after a recorded error. */
int moe_cuda_mx_quantize(moe_cuda_ctx *c, __nv_bfloat16 *dst, moe_cbuf x, int64_t R, int64_t K,
                         int64_t group, int floor_rule, const char *op);

/* The native MXFP8 operands of mxfp8's products on MXFP8 tensor cores (cuBLASLt's
 * VEC32_UE8M0, sm_100+; mxfp8.cu), the bytes of moe_mx_encode_tiled (moe/quant.h): grouped
 * rows x [M, K] (offsets [E + 1] host; K a multiple of 32) quantized by floor_rule, each group
 * its own tiles, the groups one after another in q and sc: along the rows, group e's q [n, K]
 * and its scales moe_mx_tiled_bytes(n, K); with transpose, along the rows of each column, group
 * e's qt [K, moe_mx_pad(n)] (zeros past n) and moe_mx_tiled_bytes(K, moe_mx_pad(n)) of scales.
 * q and sc 16-byte aligned, sized by moe_mx_groups_of. 0 after a recorded error. */
typedef struct moe_mx_groups {
    int64_t q, sc; /* bytes */
} moe_mx_groups;
static inline moe_mx_groups moe_mx_group_bytes(int64_t n, int64_t K, int transpose) {
    moe_mx_groups g;
    g.q = transpose ? K * moe_mx_pad(n) : n * K;
    g.sc = transpose ? moe_mx_tiled_bytes(K, moe_mx_pad(n)) : moe_mx_tiled_bytes(n, K);
    return g;
}
moe_mx_groups moe_mx_groups_of(const int32_t *offsets, int64_t E, int64_t K, int transpose);
int moe_cuda_mx_native(moe_cuda_ctx *c, uint8_t *q, uint8_t *sc, moe_cbuf x, const int32_t *offsets,
                       int64_t E, int64_t K, int transpose, int floor_rule, const char *op);

/* ---- fp8-block operands (quant_fp8.cu): e4m3 values q and fp32 scales s in cuBLASLt's
 * layouts (see there); the same bytes as moe/quant.h's CPU emulation ---- */

/* Rows of a product's reduction padded to whole 128-blocks (transposed operands). */
static inline int64_t moe_cuda_fp8_pad(int64_t n) {
    return (n + 127) / 128 * 128;
}
/* Every quantizer takes pow2: the scales rounded up to powers of two (fp8-block's pow2 rule).
 * x [R, K] (f32 or bf16; K a multiple of 16, x 16-byte aligned) in 1 x 128 blocks along K: q
 * [R, K], the scale of block kb of row r at s[kb * ls + r] (ls >= R; cuBLASLt reads ls = the
 * product's row count). */
int moe_cuda_fp8_rows(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, int64_t R, int64_t K,
                      int64_t ls, int pow2, const char *op);
/* Each group's rows of x [M, K] (rows offsets[e] .. offsets[e + 1], offsets [E + 1] host)
 * transposed, in 1 x 128 blocks along the tokens, in one launch for up to 128 groups: group e
 * into q_e [K, np_e] (np_e = moe_cuda_fp8_pad(n_e), zero past n_e) at q + p_e K, p_e the
 * earlier groups' np summed, its scales s_e [np_e / 128, K] at s + p_e / 128 K. With tiles
 * one scale per 128 x 128 tile of q_e instead (precision.fp8_wgrad x-tiles), s_e
 * [moe_fp8_tile_scales(K, np_e)] at s + the earlier groups' such sizes summed. K a
 * multiple of 4; x, q and s 16-byte aligned. */
int moe_cuda_fp8_cols_t(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, const int32_t *offsets,
                        int64_t E, int64_t K, int pow2, int tiles, const char *op);
/* swiglu_backward's fp8-block activation pairs (ops.h, moe/quant.h): da and db [M, K] (M =
 * pairs->offsets[E], K = pairs->K) as pairs from dout, a and b [M, K] (F32 or BF16; K a
 * multiple of 16, every array 16-byte aligned), in one pass: the bytes of the BF16 swiglu
 * backward followed by moe_cuda_fp8_rows (ls = the pair's lds) and moe_cuda_fp8_cols_t. */
void moe_cuda_swiglu_backward_pairs(moe_cuda_ctx *c, uint8_t *da, uint8_t *db, moe_cbuf dout,
                                    moe_cbuf a, moe_cbuf b, const moe_fp8_groups *pairs,
                                    const char *op);
/* swiglu_forward's fp8-block activation pair: out [M, K] as a pair (its transposed copy in
 * tiles where pairs->tiles) from a and b [M, K] (as above), in one pass: the bytes of the BF16
 * swiglu forward followed by moe_cuda_fp8_rows and moe_cuda_fp8_cols_t. */
void moe_cuda_swiglu_forward_pair(moe_cuda_ctx *c, uint8_t *out, moe_cbuf a, moe_cbuf b,
                                  const moe_fp8_groups *pairs, const char *op);
/* An fp8-block activation pair out of pairs' groups [M, K] (moe/quant.h; its transposed copy in
 * tiles where pairs->tiles) from x [M, K] BF16 (K a multiple of 16, 16-byte aligned), in one pass:
 * the bytes of moe_cuda_fp8_rows and moe_cuda_fp8_cols_t on x. RMSNorm's ln1 under fp8-block
 * training, the norm staged in bf16; quantize_pair's (the expert inputs). */
void moe_cuda_fp8_pair(moe_cuda_ctx *c, uint8_t *out, moe_cbuf x, const moe_fp8_groups *pairs,
                       const char *op);
/* quantize_pair (ops.h): moe_cuda_fp8_pair of x into out, with the op's checks. */
void moe_cuda_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                            const moe_fp8_groups *pairs);
/* quantize_weight (ops.h): the fp8-block copies of w [E, O, I] fp32 (O and I multiples of
 * 16), row-wise and transposed with their tile scales, in one kernel that reads w once. */
void moe_cuda_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w,
                              int64_t E, int64_t O, int64_t I, moe_recipe prec);
/* adamw_quantize (ops.h): AdamW on a whole weight w [E, O, I] and its fp8-block copies from
 * the new values, one kernel a 128 x 128 tile that reads the master once (k_adamw_tiles); the
 * bytes of moe_cuda_adamw then moe_cuda_quantize_weight, which it runs instead where an
 * array is not aligned to its 4-element access. */
void moe_cuda_adamw_quantize(const moe_backend *be, float *param, moe_cbuf grad, moe_buf m,
                             moe_buf v, uint8_t *q, float *s, int64_t E, int64_t O, int64_t I,
                             moe_recipe prec, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int64_t step, float grad_scale);
/* fp8-block products need both dimensions of every weight to be multiples of 16 (cuBLASLt's
 * fp8 alignment of the reduction dimension and of the rows). */
static inline int moe_cuda_fp8_shape_ok(int64_t I, int64_t O) {
    return I > 0 && O > 0 && I % 16 == 0 && O % 16 == 0;
}

/* ---- the sizes the kernels take (cu_supports answers with these; launches check them) ---- */

/* Most experts (keys) the grouping kernels of moe_permute.cu handle. */
#define MOE_CUDA_MAX_EXPERTS 1024
/* 1 when attention runs at these sizes under prec: bf16 flash attention needs D in {16, 32,
 * 64, 96, 128}, the fp32 kernel D <= 256; both need H % KV == 0 and B*H <= 65535. */
int moe_cuda_attention_shape_ok(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                moe_recipe prec);
/* The fp32 kernel's part of the rule above (attention_fp32.cu). */
int moe_cuda_attention_fp32_shape_ok(int64_t B, int64_t H, int64_t KV, int64_t D);

/* Stable counting sort of n keys in [0, nkeys) (nkeys <= MOE_CUDA_MAX_EXPERTS), moe_permute.cu:
 * order[r] = index of the r-th element in (key, index) order, inverse[i] = its position,
 * offsets[k]..offsets[k+1] = positions of key k. Uses the RED scratch slot. 0 on failure. */
int moe_cuda_group_by_key(moe_cuda_ctx *c, int32_t *order, int32_t *inverse, int32_t *offsets,
                          const int32_t *keys, int64_t n, int64_t nkeys, const char *op);

/* ---- entry points of the other files, assembled into the table by backend_cuda.cu ---- */
void moe_gemm_cache_free(moe_cuda_ctx *c);
/* gemm_plan.cu: the cuBLASLt calls of the matrix products. vary names the dimension that is
 * an expert's row count (a plan serves a bucket of counts): */
enum { GEMM_EXACT = 0, GEMM_VARY_M = 1, GEMM_VARY_K = 2 };
/* Bytes per element of a product's operand or output type (e4m3, bf16, fp32). */
static inline size_t moe_gemm_esize(cudaDataType dt) {
    return dt == CUDA_R_8F_E4M3 ? 1 : dt == CUDA_R_16BF ? 2 : 4;
}
/* Row-major C[M,N] = alpha op(A) op(B) + beta C. A is [M,K] ([K,M] if ta), B is [K,N]
 * ([N,K] if tb), both of dtype (CUDA_R_16BF or CUDA_R_32F); C of ctype (CUDA_R_32F, or
 * CUDA_R_16BF with beta = 0: the fp32 result rounded to nearest). 0 after a recorded error. */
int moe_gemm_rm(moe_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                float alpha, const void *A, const void *B, cudaDataType dtype, float beta, void *C,
                cudaDataType ctype, int vary);
/* The block-scaled fp8 product C[M,N] = A[M,K] B[N,K]^T (both K-contiguous, e4m3) with
 * their scales as and bs in the modes ma and mb (cuBLASLt's scale modes). C of ctype (fp32,
 * or bf16 with beta = 0), accumulated in fp32. 0 after a recorded error. */
int moe_gemm_fp8(moe_cuda_ctx *c, const char *op, int64_t M, int64_t N, int64_t K, const uint8_t *A,
                 const void *as, cublasLtMatmulMatrixScale_t ma, const uint8_t *B, const void *bs,
                 cublasLtMatmulMatrixScale_t mb, float beta, void *C, cudaDataType ctype, int vary);
/* 1 when cuBLASLt offers an MXFP8 product (VEC32_UE8M0 scales) on this GPU (sm_100 and later;
 * it refuses on sm_90), asked once at start-up without recording an error. */
int moe_cuda_mx_probe(moe_cuda_ctx *c);

/* gemm_skinny.cu: the fp32 recipe's products of few outputs (the router's gate). ok: 1 when
 * they take this one: prec fp32, moe_cuda_skinny_shape(I, O), x F32 or BF16 and w F32, both
 * 16-byte aligned, out (the forward's y type; F32 for the backward) F32 or BF16, dx (the
 * backward's, or NULL) 16-byte aligned. forward: y = x w^T; backward: dx (+)= dy w (NULL:
 * none) and dw (+)= dy^T x (NULL: none) as betas bx, bw say (1 adds, 0 writes); N >= 1. Both
 * return 0 after a recorded error. */
int moe_cuda_skinny_ok(moe_recipe prec, moe_cbuf x /* [N, I] */, moe_cbuf w /* [O, I] */, int64_t I,
                       int64_t O, moe_dtype out, const float *dx /* [N, I] */);
int moe_cuda_skinny_forward(moe_cuda_ctx *c, moe_buf y /* [N, O] */, moe_cbuf x /* [N, I] */,
                            const float *w /* [O, I] */, int64_t N, int64_t I, int64_t O,
                            const char *op);
int moe_cuda_skinny_backward(moe_cuda_ctx *c, float *dx /* [N, I] */, float *dw /* [O, I] */,
                             const float *dy /* [N, O] */, moe_cbuf x /* [N, I] */,
                             const float *w /* [O, I] */, int64_t N, int64_t I, int64_t O, float bx,
                             float bw, const char *op);

void moe_cuda_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N,
                             int64_t I, int64_t O, moe_recipe prec);
void moe_cuda_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy, moe_cbuf x,
                              moe_cbuf w, int64_t N, int64_t I, int64_t O, moe_recipe prec,
                              moe_grad_store dx_st, moe_grad_store dw_st);
void moe_cuda_grouped_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w,
                                     const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                     moe_recipe prec);
void moe_cuda_grouped_matmul_backward(const moe_backend *be, moe_buf dx, moe_buf dw, moe_cbuf dy,
                                      moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                      int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                                      moe_grad_store dw_st);
void moe_cuda_grouped_dgrad_sum(const moe_backend *be, moe_buf dx, moe_cbuf dya, moe_cbuf wa,
                                moe_cbuf dyb, moe_cbuf wb, const int32_t *offsets, int64_t E,
                                int64_t I, int64_t O, moe_recipe prec);

void moe_cuda_embedding_forward(const moe_backend *be, moe_buf out, const int32_t *tokens,
                                const float *wte, int64_t N, int64_t C);
void moe_cuda_embedding_backward(const moe_backend *be, float *dwte, const float *dout,
                                 const int32_t *tokens, int64_t N, int64_t C, int64_t V);
void moe_cuda_rmsnorm_forward(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf x,
                              const float *w, int64_t N, int64_t C, float eps, moe_recipe prec,
                              const moe_fp8_groups *pairs);
void moe_cuda_rmsnorm_backward(const moe_backend *be, float *dx, float *dw, const float *dout,
                               moe_cbuf x, const float *w, const float *rstd, int64_t N, int64_t C);
void moe_cuda_rope_forward(const moe_backend *be, moe_buf x, const int32_t *pos, int64_t p0,
                           int64_t B, int64_t T, int64_t NH, int64_t D, double theta);
void moe_cuda_rope_backward(const moe_backend *be, moe_buf dx, const float *dy, const int32_t *pos,
                            int64_t B, int64_t T, int64_t NH, int64_t D, double theta);
void moe_cuda_swiglu_forward(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                             moe_recipe prec, const moe_fp8_groups *pairs);
void moe_cuda_swiglu_backward(const moe_backend *be, moe_buf da, moe_buf db, moe_cbuf dout,
                              moe_cbuf a, moe_cbuf b, int64_t n, const moe_fp8_groups *pairs);
void moe_cuda_add(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n);
void moe_cuda_pool_forward(const moe_backend *be, float *out, const float *x, const int32_t *range,
                           int64_t B, int64_t T, int64_t C, int max);

void moe_cuda_attention_forward(const moe_backend *be, moe_buf out, float *lse, moe_cbuf q,
                                moe_cbuf k, moe_cbuf v, const int32_t *doc_start, int64_t B,
                                int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                                moe_recipe prec);
void moe_cuda_attention_backward(const moe_backend *be, float *dq, float *dk, float *dv,
                                 const float *dout, moe_cbuf q, moe_cbuf k, moe_cbuf v,
                                 moe_cbuf out, const float *lse, const int32_t *doc_start,
                                 int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                 moe_recipe prec, moe_grad_store st);

/* sm90/attention_wgmma.cu, in the build when it targets sm_90 (MOE_HAVE_SM90A): the Hopper
 * forward of bf16 flash attention, same contract as the portable one (attention_flash.cu).
 * supported: 1 when it runs head dim D on this device (compute capability 9.0, D 64 or 128)
 * with these bf16 q, k, v (16-byte aligned, as its TMA loads need).
 * out [B, T, H, D] F32 or BF16, lse [B, H, T], q [B, T, H, D], k/v [B, T, KV, D],
 * dstart [B, T] or NULL. */
int moe_cuda_fa3_supported(const moe_cuda_ctx *c, int64_t D, const void *q, const void *k,
                           const void *v);
void moe_cuda_fa3_forward(moe_cuda_ctx *c, moe_buf out, float *lse, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *dstart,
                          int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D);

/* sm90/attention_wgmma_bwd.cu: the Hopper backward, same contract and rule as the portable
 * one: dq/q/dout [B, T, H, D], dk/dv/k/v [B, T, KV, D] (gradients fp32, added to),
 * lse/delta [B, H, T], dstart [B, T] or NULL. */
void moe_cuda_fa3_backward(moe_cuda_ctx *c, float *dq, float *dk, float *dv, const __nv_bfloat16 *q,
                           const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                           const __nv_bfloat16 *dout, const float *lse, const float *delta,
                           const int32_t *dstart, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, int add);

/* sm90/grouped_fp8.cu (MOE_HAVE_SM90A): the grouped block-scaled fp8 product, one launch
 * over all experts: y[r] (+)= dequant(xq[r]) dequant(wq_e)^T for the rows r of expert e.
 * supported: 1 on a compute capability 9.0 device for 2 <= E <= MOE_CUDA_GROUPED_MAXE and a
 * 16-byte aligned
 * output, weight copy and scales (the quantized activations are scratch or an fp8-block pair,
 * always aligned); fits: the same from E = 1 (one group runs too, but as a dense product
 * cuBLASLt is faster: an fp8-block pair's row-wise copy, whose scales cuBLASLt cannot read,
 * is the one user). y [M, N]
 * dev, BF16 (written; beta must be 0) or F32 (beta 0 writes, 1 adds); xq [M, K] e4m3 with sx
 * [ceil(K / 128), lds] (moe_cuda_fp8_rows with ls = lds, a multiple of 4); wq [E, N, K] e4m3 with
 * sw [E, moe_fp8_tile_scales(N, K)] (a quantize_weight copy); offsets [E + 1] HOST; K and N
 * multiples of 16. 0 after a recorded error. */
int moe_cuda_grouped_fp8_supported(const moe_cuda_ctx *c, int64_t E, const void *y, const void *wq,
                                   const float *sw);
int moe_cuda_grouped_fp8_fits(const moe_cuda_ctx *c, int64_t E, const void *y, const void *wq,
                              const float *sw);
/* The sum of two such products of the same groups and shapes in one launch and one fp32
 * accumulator, y = dequant(xq[0]) dequant(wq[0]_e)^T + dequant(xq[1]) dequant(wq[1]_e)^T,
 * written (the activations' scales of the same lds); the experts' w1 and w3 dgrad. */
int moe_cuda_grouped_fp8_sum(moe_cuda_ctx *c, moe_buf y /* [M, N] */,
                             const uint8_t *const xq[2] /* [M, K] each */,
                             const float *const sx[2] /* [KB, lds] each */, int64_t lds,
                             const uint8_t *const wq[2] /* [E, N, K] each */,
                             const float *const sw[2] /* [E, moe_fp8_tile_scales(N, K)] each */,
                             const int32_t *offsets /* [E + 1] host */, int64_t E, int64_t N,
                             int64_t K, const char *op);
int moe_cuda_grouped_fp8(moe_cuda_ctx *c, moe_buf y /* [M, N] */, float beta,
                         const uint8_t *xq /* [M, K] */, const float *sx /* [KB, lds] */,
                         int64_t lds, const uint8_t *wq /* [E, N, K] */,
                         const float *sw /* [E, moe_fp8_tile_scales(N, K)] */,
                         const int32_t *offsets /* [E + 1] host */, int64_t E, int64_t N, int64_t K,
                         const char *op);

/* attention_fp32.cu: the fp32 recipe's attention (any D <= 256), same contract as above:
 * q/out/dq/dout [B, T, H, D], k/v/dk/dv [B, T, KV, D], lse [B, H, T], doc_start [B, T] or
 * NULL, all device memory */
void moe_cuda_attention_fp32_forward(moe_cuda_ctx *c, float *out, float *lse, const float *q,
                                     const float *k, const float *v, const int32_t *doc_start,
                                     int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t KV,
                                     int64_t D);
void moe_cuda_attention_fp32_backward(moe_cuda_ctx *c, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse,
                                      const int32_t *doc_start, int64_t B, int64_t T, int64_t H,
                                      int64_t KV, int64_t D, int add);

void moe_cuda_router_forward(const moe_backend *be, float *probs, float *lse, int32_t *topk_idx,
                             float *topk_w, int32_t *counts, float *stats, const float *logits,
                             int64_t N, int64_t E, int64_t K);
void moe_cuda_router_backward(const moe_backend *be, float *dlogits, const float *dtopk_w,
                              const float *dprob, float dz, const float *probs, const float *lse,
                              const int32_t *topk_idx, const float *topk_w, int64_t N, int64_t E,
                              int64_t K);
void moe_cuda_permute_forward(const moe_backend *be, moe_buf xp, int32_t *row_src,
                              int32_t *slot_row, int32_t *offsets, moe_cbuf x,
                              const int32_t *topk_idx, int64_t N, int64_t C, int64_t E, int64_t K);
void moe_cuda_permute_backward(const moe_backend *be, float *dx, moe_cbuf dxp,
                               const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                               moe_grad_store st);
void moe_cuda_unpermute_forward(const moe_backend *be, moe_buf y, moe_cbuf res, moe_cbuf yp,
                                const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                                int64_t K);
void moe_cuda_unpermute_backward(const moe_backend *be, moe_buf dyp, float *dtopk_w,
                                 const float *dy, moe_cbuf yp, const float *topk_w,
                                 const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                                 moe_grad_store st);

void moe_cuda_cross_entropy_forward(const moe_backend *be, float *loss, float *lse,
                                    const float *logits, const int32_t *targets,
                                    const float *weights, int64_t N, int64_t V);
void moe_cuda_cross_entropy_backward(const moe_backend *be, float *dlogits, const float *logits,
                                     const float *lse, const int32_t *targets, const float *weights,
                                     float dloss, int64_t N, int64_t V);

void moe_cuda_adamw(const moe_backend *be, float *param, uint16_t *param16, uint16_t *param_lo,
                    moe_cbuf grad, moe_buf m, moe_buf v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
void moe_cuda_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n);
double moe_cuda_sum_squares(const moe_backend *be, moe_cbuf x, int64_t n);

#endif
