/* quant_fp8.cuh: the fp8-block encoding shared by the CUDA backend's quantizers - the
 * activation operands (quant_fp8.cu) and the weight copies (quant_tiles.cu) - so that every
 * one of them writes the bytes of moe/quant.h's CPU emulation.
 *
 * A block's scale is amax / 448 over its finite values, at least 2^-126 (1 for an all-zero
 * block; with pow2, the smallest power of two >= that) and each value is e4m3(x * y), y the
 * scale's reciprocal rounded once a block (finite: the scale is normal), rounded to nearest
 * even and saturating (NaN stays NaN, sign included), in IEEE fp32 arithmetic: the bytes of
 * the CPU's (libcore/src/num/quant.c), as moe/quant.h defines them. */
#ifndef MOE_KERNELS_QUANT_FP8_CUH
#define MOE_KERNELS_QUANT_FP8_CUH

#include <cuda_fp8.h>
#include <float.h>

#include "backend_cuda.cuh"

#define QB 128 /* elements per block, tiles are QB x QB */

/* amax / 448 at least 2^-126, or (pow2) the smallest power of two >= it (its E8M0 ceil, as
 * the CPU's moe_fp8_block_scale). */
__device__ __forceinline__ float fp8_scale(float amax, int pow2) {
    if (!(amax > 0.0f)) return 1.0f;
    const float s = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
    return pow2 ? moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(s)) : s;
}

/* A block's scale s and its reciprocal y, correctly rounded (the CPU's rcp) */
struct fp8_quot {
    float s, y;
};
__device__ __forceinline__ fp8_quot fp8_quot_of(float scale) {
    return {scale, __frcp_rn(scale)};
}

/* The amax over the finite ones of a lane's N values: one max a value (fmaxf drops a NaN),
 * taken again without the infinities where the max is one. */
template <int N> __device__ __forceinline__ float fp8_lane_amax(const float *v) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < N; j++)
        a = fmaxf(a, fabsf(v[j]));
    if (isinf(a)) {
        a = 0.0f;
#pragma unroll
        for (int j = 0; j < N; j++)
            a = fmaxf(a, moe_finite_abs(v[j]));
    }
    return a;
}

/* N values of a block (N a multiple of 4) as N / 4 words w of e4m3 bytes of x y, y the block
 * scale's reciprocal (v[4 i] in the low byte of w[i]), rounded to nearest even and saturating, two
 * a conversion. A NaN converts to 0x7f whatever its sign and nothing else does, so the CPU's sign
 * of a NaN (0xff for a negative one) is put back only where a byte is 0x7f (a zero byte of w ^
 * 0x7f7f7f7f); without NANS the caller knows there is none and the check is left out. */
template <int N, bool NANS = true>
__device__ __forceinline__ void fp8_encode(const float *v, float y, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const float *x = v + 4 * i;
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(
                           make_float2(__fmul_rn(x[0], y), __fmul_rn(x[1], y)), __NV_SATFINITE,
                           __NV_E4M3),
                       hi = __nv_cvt_float2_to_fp8x2(
                           make_float2(__fmul_rn(x[2], y), __fmul_rn(x[3], y)), __NV_SATFINITE,
                           __NV_E4M3);
        w[i] = lo | hi << 16;
        if constexpr (!NANS) continue; /* the caller knows the values hold no NaN */
        const uint32_t t = w[i] ^ 0x7f7f7f7fu;
        if ((t - 0x01010101u) & ~t & 0x80808080u)
            w[i] |= moe_e4m3_neg_nan(x[0]) | moe_e4m3_neg_nan(x[1]) << 8 |
                    moe_e4m3_neg_nan(x[2]) << 16 | moe_e4m3_neg_nan(x[3]) << 24;
    }
}

#endif
