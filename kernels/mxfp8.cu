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
        const uint32_t w = moe_mx_encode4(v, &code);
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

int moe_cuda_mx_quantize(moe_cuda_ctx *c, __nv_bfloat16 *dst, moe_cbuf x, int64_t R, int64_t K,
                         int64_t group, int floor_rule, const char *op) {
    if (R <= 0 || K <= 0) return 1;
    if (x.mx) {
        if (!mx_ok(c, x.p, R * K, op)) return 0;
        mx_quantize(c, dst, ld_mx{(const uint8_t *)x.p, x.mx}, R, K, group, floor_rule);
    } else if (x.dt == MOE_DTYPE_BF16) {
        mx_quantize(c, dst, ld_bf16{(const __nv_bfloat16 *)x.p}, R, K, group, floor_rule);
    } else if (x.dt == MOE_DTYPE_F32) {
        mx_quantize(c, dst, ld_f32{(const float *)x.p}, R, K, group, floor_rule);
    } else {
        return moe_cuda_check(c, cudaErrorInvalidValue, op,
                              "an mxfp8 product operand of type %s (f32, bf16 or MXFP8 expected)",
                              moe_dtype_name(x.dt));
    }
    return MOE_CUDA_LAUNCHED(c, op, "MXFP8 operand R=%lld K=%lld group=%lld", (long long)R,
                             (long long)K, (long long)group);
}
