/* mxfp8: the MXFP8 activations and product operands of the CUDA backend under
 * precision.recipe mxfp8 (docs/dtypes.md), with the values of libcore's CPU emulation
 * (moe/quant.h, src/ops/cpu/ops_fp8.c).
 *
 * sm_90 has no MXFP8 tensor-core instruction, so the products run on bf16 tiles of the
 * fake-quantized values: each operand is quantized in blocks of 32 along the product's
 * reduction (E4M3 values, an E8M0 scale by the recipe's rule), decoded and stored as bf16, and
 * cuBLASLt's bf16 product accumulates them in fp32 as the CPU's fp32 GEMM does. Decoding into
 * bf16 is exact: an E4M3 value (4 significant bits) times a power of two is a bf16 value,
 * bar results below bf16's smallest subnormal (2^-133). The stored MXFP8 activations (the
 * layer's ln1 and expert path) are encoded from the bf16 value the op would have written, in a
 * pass of its own after the op (RMSNorm, permute, the grouped products), and read by the
 * products' quantization passes here and by SwiGLU's one-pass kernels (elementwise.cu).
 *
 * The one thing a reader must know: every scale comes from moe/quant.h's MOE_HD
 * moe_mx_block_scale (the CPU's own code), every E4M3 value from the hardware conversion
 * (round to nearest even, saturating: the CPU's bytes, a NaN's sign restored where bytes are
 * stored, moe_e4m3_scaled), so a block gets the CPU's values; non-finite values are left out
 * of a block's amax, and NaN stays NaN. */
#include "backend_cuda.cuh"

extern "C" {
#include "moe/backend_cuda.h"
}

#define MX 32 /* elements a block */

/* Element i of an operand as fp32: the loaders of the three element types. */
struct ld_f32 {
    const float *p;
    __device__ float operator()(int64_t i) const {
        return p[i];
    }
};
struct ld_bf16 {
    const __nv_bfloat16 *p;
    __device__ float operator()(int64_t i) const {
        return __bfloat162float(p[i]);
    }
};
struct ld_mx {
    const uint8_t *q, *mx; /* [n] e4m3, [n / 32] e8m0 */
    __device__ float operator()(int64_t i) const {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3))) *
               moe_e8m0_to_f32(mx[i / MX]);
    }
};

/* What the block's encoding of v decodes to, under the block's power-of-two scale (inv its
 * exact reciprocal): the hardware E4M3 conversions, the values of the CPU's
 * moe_e4m3_to_f32(moe_f32_to_e4m3(v / scale, 1)) * scale (a NaN's sign aside: NaN either way). */
__device__ __forceinline__ float mx_fake(float v, float scale, float inv) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(
        __nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3), __NV_E4M3);
    return __half2float(__half(h)) * scale;
}

/* Blocks of 32 along the rows of x [R, K] (a short last block where K % 32), one warp a
 * block, lane j its element j: dst [R, K] bf16. */
template <typename L>
__global__ void k_mx_fake_rows(__nv_bfloat16 *__restrict__ dst, L x, int64_t R, int64_t K,
                               int floor_rule) {
    const int64_t KB = (K + MX - 1) / MX, nblk = R * KB;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x & 31;
    for (int64_t b = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; b < nblk;
         b += warps) {
        const int64_t r = b / KB, k = b % KB * MX + lane, i = r * K + k;
        const float v = k < K ? x(i) : 0.0f;
        const float scale = moe_mx_block_scale(moe_warp_max(moe_finite_abs(v)), floor_rule);
        if (k < K) dst[i] = __float2bfloat16_rn(mx_fake(v, scale, 1.0f / scale));
    }
}

/* The same for K % 32 == 0, where the blocks of 32 are consecutive in memory: a warp 4 blocks
 * at a time, 4 values a lane (moe_mx_walk), dst [n] bf16 for x [n]. */
template <typename L>
__global__ void k_mx_fake_flat(__nv_bfloat16 *__restrict__ dst, L x, int64_t n, int floor_rule) {
    moe_mx_walk(n, [&](int64_t i) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < n)
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = x(i + j);
        const float scale = moe_mx_block_scale(moe_mx_amax4(v), floor_rule), inv = 1.0f / scale;
        if (i >= n) return;
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = mx_fake(v[j], scale, inv);
        moe_stv<4>(dst, i, v);
    });
}

/* Blocks of 32 along the columns of x [R, K], starting afresh every `group` rows (a short
 * block at each group's end): one thread a (block, column), columns fastest (coalesced), the
 * block's values read once into registers. */
template <typename L>
__global__ void k_mx_fake_cols(__nv_bfloat16 *__restrict__ dst, L x, int64_t R, int64_t K,
                               int64_t group, int floor_rule) {
    const int64_t gb = (group + MX - 1) / MX, ng = (R + group - 1) / group, n = ng * gb * K;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += stride) {
        const int64_t col = t % K, b = t / K, g = b / gb;
        const int64_t r0 = g * group + b % gb * MX;
        const int64_t gend = g * group + group < R ? g * group + group : R;
        const int cnt = (int)((r0 + MX < gend ? r0 + MX : gend) - r0);
        float v[MX], amax = 0.0f;
#pragma unroll
        for (int j = 0; j < MX; j++)
            if (j < cnt) v[j] = x((r0 + j) * K + col), amax = fmaxf(amax, moe_finite_abs(v[j]));
        const float scale = moe_mx_block_scale(amax, floor_rule), inv = 1.0f / scale;
#pragma unroll
        for (int j = 0; j < MX; j++)
            if (j < cnt) dst[(r0 + j) * K + col] = __float2bfloat16_rn(mx_fake(v[j], scale, inv));
    }
}

/* MXFP8 encoding of src [n] (n % 32 == 0) with the ceil rule (moe_mxfp8_encode_block): a warp
 * 4 blocks at a time, 4 values a lane (moe_mx_walk, moe_mx_encode4); q 4-byte aligned. */
__global__ void k_mx_encode(uint8_t *__restrict__ q, uint8_t *__restrict__ mx,
                            const __nv_bfloat16 *__restrict__ src, int64_t n) {
    moe_mx_walk(n, [&](int64_t i) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < n) moe_ldv<4>(src, i, v);
        uint8_t code;
        const uint32_t w = moe_mx_encode4(v, 0, &code);
        if (i < n) moe_mx_store4(q, mx, i, w, code);
    });
}

/* ------------------------------------------------------------------------------------------ */

/* 1 when an MXFP8 operand of n elements at q suits the kernels (n a multiple of 32, q 4-byte
 * aligned), else 0 after recording the error. */
static int mx_ok(moe_cuda_ctx *c, const void *q, int64_t n, const char *op) {
    if (n % MX == 0 && (uintptr_t)q % 4 == 0) return 1;
    return moe_cuda_check(c, cudaErrorInvalidValue, op,
                          "an MXFP8 operand of %lld elements at %p (a multiple of 32 at a 4-byte "
                          "boundary expected)",
                          (long long)n, q);
}

moe_buf moe_cuda_mx_stage(moe_cuda_ctx *c, int slot, moe_buf out, int64_t n, const char *op) {
    moe_buf none = moe_buf_of(NULL, MOE_DTYPE_BF16);
    if (!out.mx) return moe_cuda_typed_ok(c, out.dt, op) ? out : none;
    if (!mx_ok(c, out.p, n, op)) return none;
    void *d = moe_cuda_scratch(c, slot, (size_t)n * 2, op);
    return d ? moe_buf_of(d, MOE_DTYPE_BF16) : none;
}

int moe_cuda_mx_write(moe_cuda_ctx *c, moe_buf out, moe_buf staged, int64_t n, const char *op) {
    if (!out.mx || n <= 0) return 1;
    k_mx_encode<<<moe_cuda_grid(c, n / 4, 256), 256, 0, c->stream>>>(
        (uint8_t *)out.p, out.mx, (const __nv_bfloat16 *)staged.p, n);
    return MOE_CUDA_LAUNCHED(c, op, "MXFP8 encode n=%lld", (long long)n);
}

template <typename L>
static void mx_quantize(moe_cuda_ctx *c, __nv_bfloat16 *dst, L x, int64_t R, int64_t K,
                        int64_t group, int floor_rule) {
    if (group <= 0 && K % MX == 0)
        k_mx_fake_flat<<<moe_cuda_grid(c, R * K / 4, 256), 256, 0, c->stream>>>(dst, x, R * K,
                                                                                floor_rule);
    else if (group <= 0)
        k_mx_fake_rows<<<moe_cuda_grid(c, R * ((K + MX - 1) / MX) * 32, 256), 256, 0, c->stream>>>(
            dst, x, R, K, floor_rule);
    else
        k_mx_fake_cols<<<moe_cuda_grid(c, (R / group + 1) * ((group + MX - 1) / MX) * K, 256), 256,
                         0, c->stream>>>(dst, x, R, K, group, floor_rule);
}

/* f(loader) with the loader of x [n] (MXFP8, BF16 or F32): 1, or 0 after recording the error of
 * another type or of an MXFP8 x the kernels cannot read. */
template <typename F>
static int with_loader(moe_cuda_ctx *c, moe_cbuf x, int64_t n, const char *op, F f) {
    if (x.mx) {
        if (!mx_ok(c, x.p, n, op)) return 0;
        f(ld_mx{(const uint8_t *)x.p, x.mx});
    } else if (x.dt == MOE_DTYPE_BF16) {
        f(ld_bf16{(const __nv_bfloat16 *)x.p});
    } else if (x.dt == MOE_DTYPE_F32) {
        f(ld_f32{(const float *)x.p});
    } else {
        return moe_cuda_check(c, cudaErrorInvalidValue, op,
                              "an mxfp8 product operand of type %s (f32, bf16 or MXFP8 expected)",
                              moe_dtype_name(x.dt));
    }
    return 1;
}

int moe_cuda_mx_quantize(moe_cuda_ctx *c, __nv_bfloat16 *dst, moe_cbuf x, int64_t R, int64_t K,
                         int64_t group, int floor_rule, const char *op) {
    if (R <= 0 || K <= 0) return 1;
    if (!with_loader(c, x, R * K, op,
                     [&](auto ld) { mx_quantize(c, dst, ld, R, K, group, floor_rule); }))
        return 0;
    return MOE_CUDA_LAUNCHED(c, op, "MXFP8 operand R=%lld K=%lld group=%lld", (long long)R,
                             (long long)K, (long long)group);
}

/* ------------------------------------------------------------------------------------------
 * The operands of MXFP8 tensor-core products (cuBLASLt's VEC32_UE8M0, sm_100+): e4m3 bytes
 * and e8m0 scales in the 128 x 4 tiled layout, the bytes of moe_mx_encode_tiled (moe/quant.h).
 * Neither kernel is specific to sm_100: any GPU runs them, and gpu.quant_operands checks their
 * bytes there (passed on an H100, 2026-12-05 10:45 UTC). */

/* Rows: group rows x [n, K] from element i0 (K % 32 == 0) along K into q [n, K] and the
 * group's scales sc in the tiled layout: a warp 4 blocks at a time (moe_mx_walk). */
template <typename L>
__global__ void k_mx_native_rows(uint8_t *__restrict__ q, uint8_t *__restrict__ sc, L x, int64_t i0,
                                 int64_t n, int64_t K, int floor_rule) {
    moe_mx_walk(n * K, [&](int64_t i) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < n * K)
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = x(i0 + i + j);
        uint8_t code;
        const uint32_t w = moe_mx_encode4(v, floor_rule, &code);
        if (i >= n * K) return;
        *reinterpret_cast<uint32_t *>(q + i) = w;
        if ((threadIdx.x & 7) == 0) sc[moe_mx_tiled_index(i / K, i % K / MX, K)] = code;
    });
}

/* Columns: group rows x [n, K] from element i0 quantized along the rows, transposed: qt
 * [K, np] (np = moe_mx_pad(n), zeros past n) and the scales of that [K, np] operand in the
 * tiled layout. One thread a (column, block of 32 rows), columns fastest (coalesced reads),
 * its 32 bytes written as two 16-byte stores (qt 16-byte aligned). */
template <typename L>
__global__ void k_mx_native_cols(uint8_t *__restrict__ qt, uint8_t *__restrict__ sc, L x,
                                 int64_t i0, int64_t n, int64_t K, int floor_rule) {
    const int64_t np = moe_mx_pad(n), total = np / MX * K;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += stride) {
        const int64_t col = t % K, b = t / K, r0 = b * MX;
        float v[MX], amax = 0.0f;
#pragma unroll
        for (int j = 0; j < MX; j++) {
            v[j] = r0 + j < n ? x(i0 + (r0 + j) * K + col) : 0.0f;
            amax = fmaxf(amax, moe_finite_abs(v[j]));
        }
        const float scale = moe_mx_block_scale(amax, floor_rule), inv = 1.0f / scale;
        uint32_t w[MX / 4] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
#pragma unroll
        for (int j = 0; j < MX; j++)
            w[j / 4] |= moe_e4m3_scaled(v[j], inv) << 8 * (j % 4);
        uint4 *dst = reinterpret_cast<uint4 *>(qt + col * np + r0);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        sc[moe_mx_tiled_index(col, b, np)] = moe_f32_to_e8m0_ceil(scale); /* exact */
    }
}

moe_mx_groups moe_mx_groups_of(const int32_t *offsets, int64_t E, int64_t K, int transpose) {
    moe_mx_groups all = {0, 0};
    for (int64_t e = 0; e < E; e++) {
        const moe_mx_groups g = moe_mx_group_bytes(offsets[e + 1] - offsets[e], K, transpose);
        all.q += g.q, all.sc += g.sc;
    }
    return all;
}

int moe_cuda_mx_native(moe_cuda_ctx *c, uint8_t *q, uint8_t *sc, moe_cbuf x, const int32_t *offsets,
                       int64_t E, int64_t K, int transpose, int floor_rule, const char *op) {
    const int64_t M = offsets[E];
    const moe_mx_groups all = moe_mx_groups_of(offsets, E, K, transpose);
    if (M <= 0) return 1;
    if (K % MX != 0 || (uintptr_t)q % 16 != 0 || (uintptr_t)sc % 16 != 0)
        return moe_cuda_check(c, cudaErrorInvalidValue, op,
                              "a native MXFP8 operand K=%lld at %p, scales at %p (K a multiple "
                              "of 32, both 16-byte aligned expected)",
                              (long long)K, (void *)q, (void *)sc);
    /* padding scales 127 (2^0): a product never reads a NaN scale in a tile's unused slots */
    if (!moe_cuda_check(c, cudaMemsetAsync(sc, 127, (size_t)all.sc, c->stream), op,
                        "MXFP8 scales %lld bytes", (long long)all.sc))
        return 0;
    return with_loader(c, x, M * K, op,
                       [&](auto ld) {
                           moe_mx_groups at = {0, 0};
                           for (int64_t e = 0; e < E; e++) {
                               const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
                               if (n <= 0) continue;
                               if (!transpose)
                                   k_mx_native_rows<<<moe_cuda_grid(c, n * K / 4, 256), 256, 0,
                                                      c->stream>>>(q + at.q, sc + at.sc, ld, r0 * K,
                                                                   n, K, floor_rule);
                               else
                                   k_mx_native_cols<<<moe_cuda_grid(c, moe_mx_pad(n) / MX * K, 256),
                                                      256, 0, c->stream>>>(
                                       q + at.q, sc + at.sc, ld, r0 * K, n, K, floor_rule);
                               const moe_mx_groups g = moe_mx_group_bytes(n, K, transpose);
                               at.q += g.q, at.sc += g.sc;
                           }
                       }) &&
           MOE_CUDA_LAUNCHED(c, op, "native MXFP8 operand M=%lld K=%lld E=%lld%s", (long long)M,
                             (long long)K, (long long)E, transpose ? " transposed" : "");
}

extern "C" void moe_cuda_mx_native_operand(const moe_backend *be, uint8_t *q, uint8_t *sc,
                                           moe_cbuf x, const int32_t *offsets, int64_t E, int64_t K,
                                           int transpose, int floor_rule) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (!moe_cuda_failed(c))
        moe_cuda_mx_native(c, q, sc, x, offsets, E, K, transpose, floor_rule, "mx_native_operand");
}
