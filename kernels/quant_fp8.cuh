/* quant_fp8.cuh: the fp8-block encoding shared by the CUDA backend's quantizers - the
 * activation operands (quant_fp8.cu) and the weight copies (quant_tiles.cu) - so that every
 * one of them writes the bytes of moe/quant.h's CPU emulation.
 *
 * A block's scale is amax / 448 over its finite values (1 for an all-zero block; with pow2,
 * the smallest power of two >= amax / 448) and each value is e4m3 of moe_fp8_quot's quotient
 * (x times the scale's reciprocal, rounded once a block), rounded to nearest even and
 * saturating (NaN stays NaN, sign included), in IEEE fp32 arithmetic. The one thing a reader
 * must know: the branch of moe_fp8_quot (x / scale where the reciprocal overflows) is taken
 * once a block (fp8_quot_of's `quick`), not once a value. */
#ifndef MOE_KERNELS_QUANT_FP8_CUH
#define MOE_KERNELS_QUANT_FP8_CUH

#include <cuda_fp8.h>
#include <float.h>

#include "backend_cuda.cuh"

#define QB 128 /* elements per block, tiles are QB x QB */

/* amax / 448, or (pow2) the smallest power of two >= it (its E8M0 ceil, as the CPU). */
__device__ __forceinline__ float fp8_scale(float amax, int pow2) {
    if (!(amax > 0.0f)) return 1.0f;
    float s = __fdiv_rn(amax, 448.0f);
    return pow2 ? moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(s)) : s;
}

/* A block's scale s and its reciprocal y (correctly rounded), and whether y is finite
 * (`quick`: the quotient is x y; else x / s, moe_fp8_quot's two branches). */
struct fp8_quot {
    float s, y;
    bool quick;
};
__device__ __forceinline__ fp8_quot fp8_quot_of(float scale) {
    const float y = __frcp_rn(scale);
    return {scale, y, y <= FLT_MAX};
}
/* moe_fp8_quot: with QUICK the caller knows that d is quick; else d.quick decides (a caller
 * whose encoding covers several blocks takes one path for all, so this one must hold each
 * block's) */
template <bool QUICK> __device__ __forceinline__ float fp8_div(float x, const fp8_quot &d) {
    if (QUICK || d.quick) return __fmul_rn(x, d.y);
    return __fdiv_rn(x, d.s);
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

/* N values of a block (N a multiple of 4) as N / 4 words w of e4m3 bytes (v[4 i] in the low
 * byte of w[i]), rounded to nearest even and saturating, two a conversion. A NaN converts to
 * 0x7f whatever its sign and nothing else does, so the CPU's sign of a NaN (0xff for a negative
 * one) is put back only where a byte is 0x7f (a zero byte of w ^ 0x7f7f7f7f); without NANS the
 * caller knows there is none and the check is left out. */
template <bool QUICK, int N, bool NANS = true>
__device__ __forceinline__ void fp8_encode(const float *v, const fp8_quot &d, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const float *x = v + 4 * i;
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(
                           make_float2(fp8_div<QUICK>(x[0], d), fp8_div<QUICK>(x[1], d)),
                           __NV_SATFINITE, __NV_E4M3),
                       hi = __nv_cvt_float2_to_fp8x2(
                           make_float2(fp8_div<QUICK>(x[2], d), fp8_div<QUICK>(x[3], d)),
                           __NV_SATFINITE, __NV_E4M3);
        w[i] = lo | hi << 16;
        if constexpr (!NANS) continue; /* the caller knows the values hold no NaN */
        const uint32_t t = w[i] ^ 0x7f7f7f7fu;
        if ((t - 0x01010101u) & ~t & 0x80808080u)
            w[i] |= moe_e4m3_neg_nan(x[0]) | moe_e4m3_neg_nan(x[1]) << 8 |
                    moe_e4m3_neg_nan(x[2]) << 16 | moe_e4m3_neg_nan(x[3]) << 24;
    }
}
/* fp8_encode on the block's path */
template <int N>
__device__ __forceinline__ void fp8_encode_by(const float *v, const fp8_quot &d, uint32_t *w) {
    if (d.quick)
        fp8_encode<true, N>(v, d, w);
    else
        fp8_encode<false, N>(v, d, w);
}

#endif
