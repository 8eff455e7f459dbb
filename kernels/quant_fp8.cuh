/* quant_fp8.cuh: the fp8-block scale rule, the e4m3 conversion and the output stage of a 128 x
 * 128 weight tile's two copies, shared by the quantizers of quant_fp8.cu and the one-pass
 * optimizer step of sm90/adamw_fp8.cuh (AdamW and the weight copies), so that both write the
 * bytes of moe/quant.h's CPU emulation (quant_fp8.cu's banner says how). */
#ifndef MOE_KERNELS_QUANT_FP8_CUH
#define MOE_KERNELS_QUANT_FP8_CUH

#include <cuda_fp8.h>

#include "backend_cuda.cuh"

#define QB 128 /* elements per block, tiles are QB x QB */

/* amax / 448, or (pow2) the smallest power of two >= it (its E8M0 ceil, as the CPU). */
__device__ __forceinline__ float fp8_scale(float amax, int pow2) {
    if (!(amax > 0.0f)) return 1.0f;
    float s = __fdiv_rn(amax, 448.0f);
    return pow2 ? moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(s)) : s;
}

__device__ __forceinline__ uint8_t fp8_of(float x, float scale) {
    return (uint8_t)(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3) |
                     moe_e4m3_neg_nan(x));
}

/* Four values at one scale as four e4m3 bytes (x.x in the low byte): fp8_of's bytes, two
 * values to a conversion. */
__device__ __forceinline__ uint32_t fp8x4_of(float4 x, float scale) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(
                       make_float2(__fdiv_rn(x.x, scale), __fdiv_rn(x.y, scale)), __NV_SATFINITE,
                       __NV_E4M3),
                   hi = __nv_cvt_float2_to_fp8x2(
                       make_float2(__fdiv_rn(x.z, scale), __fdiv_rn(x.w, scale)), __NV_SATFINITE,
                       __NV_E4M3);
    return (lo | hi << 16) | moe_e4m3_neg_nan(x.x) | moe_e4m3_neg_nan(x.y) << 8 |
           moe_e4m3_neg_nan(x.z) << 16 | moe_e4m3_neg_nan(x.w) << 24;
}

/* ---- a 128 x 128 tile's two copies (k_fp8_tiles's output stage; sm90/adamw_fp8.cuh's too) ---- */

/* Lane tx's 4 x 4 patch g of a tile: x[i] = row r0 + 4 g + i, columns k0 .. k0 + 3 (k0 = kb *
 * QB + 4 tx; zeros outside the matrix) at `scale`: the row words into qe [R, K], the columns
 * byte-transposed into the shared tile tt [128 k][32 words] at word (4 tx + j) * 32 + (g ^ tx). */
__device__ __forceinline__ void tile_patch_out(uint8_t *qe, uint32_t *tw, const float4 (&x)[4],
                                               int g, int64_t r0, int64_t kb, int64_t R, int64_t K,
                                               float scale) {
    const int tx = threadIdx.x % 32;
    const int64_t k0 = kb * QB + 4 * tx;
    uint32_t rw[4], cw[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        rw[i] = fp8x4_of(x[i], scale);
        const int64_t r = r0 + 4 * g + i;
        if (k0 < K && r < R) *(uint32_t *)(qe + r * K + k0) = rw[i];
    }
    moe_transpose4x4_bytes(rw, cw);
#pragma unroll
    for (int j = 0; j < 4; j++)
        tw[(4 * tx + j) * 32 + (g ^ tx)] = cw[j];
}

/* After a barrier over tt: the tile's transposed bytes into qte [K, R] as 16-byte chunks c =
 * tid, tid + NT, ... (NT threads): chunk c is rows r0 + 16 (c % 8) .. + 15 of qt's row kb * QB
 * + c / 8 (R % 16 == 0: all in or all out); its words (x = kl / 4) are the 16 bytes at (c % 8)
 * ^ (x / 4) of tt's row kl, word t at position t ^ (x % 4). */
template <int NT>
__device__ __forceinline__ void tile_qt_out(uint8_t *qte, const uint4 *tt, int tid, int64_t r0,
                                            int64_t kb, int64_t R, int64_t K) {
#pragma unroll
    for (int u = 0; u < QB * QB / 16 / NT; u++) {
        const int c = tid + NT * u, kl = c / 8, mc = c % 8, xs = kl / 4;
        const int64_t k = kb * QB + kl, r = r0 + 16 * mc;
        if (k >= K || r >= R) continue;
        uint4 a = tt[kl * 8 + (mc ^ (xs / 4))];
        uint32_t t;
        if (xs & 1) t = a.x, a.x = a.y, a.y = t, t = a.z, a.z = a.w, a.w = t;
        if (xs & 2) t = a.x, a.x = a.z, a.z = t, t = a.y, a.y = a.w, a.w = t;
        *(uint4 *)(qte + k * R + r) = a;
    }
}

#endif
