/* quant_fp8: the fp8-block quantizers of the CUDA backend - the operands of cuBLASLt's block-
 * scaled fp8 products, each the exact bytes of moe/quant.h's CPU emulation.
 *
 * A block's scale is amax / 448 over its finite values (1 for an all-zero block; with pow2,
 * the smallest power of two >= amax / 448: MOE_RECIPE_FP8_BLOCK_POW2) and each
 * value is e4m3(x / scale), rounded to nearest even and saturating (NaN stays NaN, sign included),
 * in IEEE fp32 arithmetic: the same values as libcore/src/num/quant.c, so a GPU product and the CPU
 * emulation differ only in the order of their fp32 sums.
 *
 * The one thing a reader must know is cuBLASLt's scale layouts (sm_90, checked on an H200
 * 2026-12-01 against a double-precision reference): for an operand stored row-major [R, K]
 * (K contiguous, the product reduces over K), 1 x 128 blocks (VEC128_32F) keep their scale
 * at s[kb * R + r] (and such an operand's R must be a multiple of 16), 128 x 128 tiles
 * (BLK128x128_32F) at s[rb * round_up(ceil(K / 128), 4) + kb]. */
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

/* One warp per 1 x 128 block (r, kb) of x [R, K]: q [R, K], s [kb * ls + r]. */
template <typename T>
__global__ void k_fp8_rows(uint8_t *__restrict__ q, float *__restrict__ s, const T *__restrict__ x,
                           int64_t R, int64_t K, int64_t ls, int pow2) {
    int64_t KB = (K + QB - 1) / QB;
    int64_t blk = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk >= R * KB) return;
    int lane = threadIdx.x & 31;
    int64_t r = blk / KB, kb = blk % KB, j0 = kb * QB + lane * 4;
    float v[4], amax = 0.0f;
    for (int t = 0; t < 4; t++) {
        v[t] = j0 + t < K ? moe_ld(x, r * K + j0 + t) : 0.0f;
        amax = fmaxf(amax, moe_finite_abs(v[t]));
    }
    float scale = fp8_scale(moe_warp_max(amax), pow2);
    for (int t = 0; t < 4; t++)
        if (j0 + t < K) q[r * K + j0 + t] = fp8_of(v[t], scale);
    if (lane == 0) s[kb * ls + r] = scale;
}

/* x [n, K] transposed into q [K, npad] (npad = round_up(n, 128); columns n.. are zero) with
 * one scale per 1 x 128 block along n: s [(m / 128) * K + k]. Block (32, 8) threads, tile of
 * 128 rows x 32 columns. */
template <typename T>
__global__ void k_fp8_cols_t(uint8_t *__restrict__ q, float *__restrict__ s,
                             const T *__restrict__ x, int64_t n, int64_t K, int64_t npad,
                             int pow2) {
    __shared__ float red[8][32];
    __shared__ __align__(16) uint8_t tile[32][QB + 16];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t k = (int64_t)blockIdx.x * 32 + tx, m0 = (int64_t)blockIdx.y * QB;
    float v[QB / 8], amax = 0.0f;
    for (int i = 0; i < QB / 8; i++) {
        int64_t m = m0 + ty + 8 * i;
        v[i] = m < n && k < K ? moe_ld(x, m * K + k) : 0.0f;
        amax = fmaxf(amax, moe_finite_abs(v[i]));
    }
    red[ty][tx] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < 8; i++)
        amax = fmaxf(amax, red[i][tx]);
    float scale = fp8_scale(amax, pow2);
    if (ty == 0 && k < K) s[(m0 / QB) * K + k] = scale;
    for (int i = 0; i < QB / 8; i++)
        tile[tx][ty + 8 * i] = fp8_of(v[i], scale); /* padding rows encode 0 */
    __syncthreads();
    /* 256 threads write 32 rows of 128 bytes, 16 bytes each */
    int t = ty * 32 + tx, row = t / 8, part = t % 8;
    int64_t kr = (int64_t)blockIdx.x * 32 + row;
    if (kr < K) *(uint4 *)(q + kr * npad + m0 + part * 16) = *(const uint4 *)&tile[row][part * 16];
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

#define TILE_THREADS 512                            /* 16 warps a 128 x 128 tile */
#define TILE_PATCHES (QB / 4 / (TILE_THREADS / 32)) /* 4 x 4 patches a thread: 2 */

/* One block of 512 threads per 128 x 128 tile (blockIdx.x = kb, .y = rb, .z = expert) of
 * w [E, R, K] fp32, R and K multiples of 16, w 16-byte aligned: the row-wise copy q [E, R, K]
 * with s [E, RB * KB4] at rb * KB4 + kb, and the transposed copy qt [E, K, R] with st
 * [E, KB * RB4] at kb * RB4 + rb (the same scale values; moe/ops.h's fp8-block weight
 * layout). The tile is read once: warp ty, lane tx holds the 4 x 4 patches g = ty + 16 p
 * (rows 4 g .. 4 g + 3 of columns 4 tx .. 4 tx + 3, one 16-byte load a row). Row-wise, a
 * patch row leaves as one 4-byte store; transposed, a patch's 4 columns become 4 words (a
 * byte transpose) in the shared tile tt [128 k][32 words], word (kl, g) kept at
 * kl * 32 + (g ^ tx) so that a warp's 32 stores meet 32 banks, and go out as 16-byte words,
 * each row's 8 chunks in 8 different bank groups. 2.6 -> 4.2 TB/s on an H200 against the
 * one-byte transpose of 256 threads it replaced (docs/performance-gpu.md, 2026-12-04). */
__global__ void __launch_bounds__(TILE_THREADS)
    k_fp8_tiles(uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                float *__restrict__ st, const float *__restrict__ w, int64_t R, int64_t K,
                int pow2) {
    constexpr int NW = TILE_THREADS / 32;
    __shared__ float sh[NW];
    __shared__ uint4 tt[QB * QB / 16];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const int64_t kb = blockIdx.x, rb = blockIdx.y, e = blockIdx.z;
    const int64_t k0 = kb * QB + 4 * tx, r0 = rb * QB;
    const float *we = w + e * R * K;
    float4 x[TILE_PATCHES][4];
    float amax = 0.0f;
#pragma unroll
    for (int p = 0; p < TILE_PATCHES; p++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = r0 + 4 * (ty + NW * p) + i;
            x[p][i] = k0 < K && r < R ? *(const float4 *)(we + r * K + k0)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            amax = fmaxf(fmaxf(amax, moe_finite_abs(x[p][i].x)), moe_finite_abs(x[p][i].y));
            amax = fmaxf(fmaxf(amax, moe_finite_abs(x[p][i].z)), moe_finite_abs(x[p][i].w));
        }
    /* the tile's amax: warp maxima, one barrier, every warp reduces them again (sh is
     * written once) */
    amax = moe_warp_max(amax);
    if (tx == 0) sh[ty] = amax;
    __syncthreads();
    const float scale = fp8_scale(moe_warp_max(sh[tx % NW]), pow2);
    if (threadIdx.x == 0) {
        const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
        s[e * RB * KB4 + rb * KB4 + kb] = scale;
        st[e * KB * RB4 + kb * RB4 + rb] = scale;
    }
    uint8_t *qe = q + e * R * K, *qte = qt + e * R * K;
    uint32_t *tw = (uint32_t *)tt;
#pragma unroll
    for (int p = 0; p < TILE_PATCHES; p++) {
        const int g = ty + NW * p;
        uint32_t rw[4], cw[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            rw[i] = fp8x4_of(x[p][i], scale);
            const int64_t r = r0 + 4 * g + i;
            if (k0 < K && r < R) *(uint32_t *)(qe + r * K + k0) = rw[i];
        }
        moe_transpose4x4_bytes(rw, cw);
#pragma unroll
        for (int j = 0; j < 4; j++)
            tw[(4 * tx + j) * 32 + (g ^ tx)] = cw[j];
    }
    __syncthreads();
    /* chunk c: 16 bytes, rows r0 + 16 (c % 8) .. + 15 of qt's row kb * QB + c / 8 (R % 16 ==
     * 0: all in or all out); its words (x = kl / 4) are the 16 bytes at (c % 8) ^ (x / 4) of
     * tt's row kl, word t at position t ^ (x % 4) */
#pragma unroll
    for (int u = 0; u < QB * QB / 16 / TILE_THREADS; u++) {
        const int c = threadIdx.x + TILE_THREADS * u, kl = c / 8, m = c % 8, xs = kl / 4;
        const int64_t k = kb * QB + kl, r = r0 + 16 * m;
        if (k >= K || r >= R) continue;
        uint4 a = tt[kl * 8 + (m ^ (xs / 4))];
        uint32_t t;
        if (xs & 1) t = a.x, a.x = a.y, a.y = t, t = a.z, a.z = a.w, a.w = t;
        if (xs & 2) t = a.x, a.x = a.z, a.z = t, t = a.y, a.y = a.w, a.w = t;
        *(uint4 *)(qte + k * R + r) = a;
    }
}

int moe_cuda_fp8_rows(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, int64_t R, int64_t K,
                      int64_t ls, int pow2, const char *op) {
    if (R <= 0 || K <= 0) return 1;
    int64_t blocks = (R * ((K + QB - 1) / QB) + 7) / 8;
    if (x.dt == MOE_DTYPE_BF16)
        k_fp8_rows<<<(unsigned)blocks, 256, 0, c->stream>>>(q, s, (const __nv_bfloat16 *)x.p, R, K,
                                                            ls, pow2);
    else
        k_fp8_rows<<<(unsigned)blocks, 256, 0, c->stream>>>(q, s, (const float *)x.p, R, K, ls,
                                                            pow2);
    return MOE_CUDA_LAUNCHED(c, op, "fp8 rows R=%lld K=%lld", (long long)R, (long long)K);
}

int moe_cuda_fp8_cols_t(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, int64_t n, int64_t K,
                        int pow2, const char *op) {
    if (n <= 0 || K <= 0) return 1;
    int64_t npad = moe_cuda_fp8_pad(n);
    dim3 grid((unsigned)((K + 31) / 32), (unsigned)(npad / QB)), block(32, 8);
    if (x.dt == MOE_DTYPE_BF16)
        k_fp8_cols_t<<<grid, block, 0, c->stream>>>(q, s, (const __nv_bfloat16 *)x.p, n, K, npad,
                                                    pow2);
    else
        k_fp8_cols_t<<<grid, block, 0, c->stream>>>(q, s, (const float *)x.p, n, K, npad, pow2);
    return MOE_CUDA_LAUNCHED(c, op, "fp8 columns n=%lld K=%lld", (long long)n, (long long)K);
}

void moe_cuda_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w,
                              int64_t E, int64_t O, int64_t I, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "quantize_weight";
    if (moe_cuda_failed(c) || E <= 0 || O <= 0 || I <= 0) return;
    if (moe_recipe_format(prec) != MOE_RECIPE_FP8_BLOCK || !moe_cuda_fp8_shape_ok(I, O) ||
        (uintptr_t)w % 16 != 0) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "E=%lld O=%lld I=%lld recipe %d (fp8-block, multiples of 16 and a "
                       "16-byte aligned weight expected)",
                       (long long)E, (long long)O, (long long)I, (int)prec);
        return;
    }
    dim3 grid((unsigned)((I + QB - 1) / QB), (unsigned)((O + QB - 1) / QB), (unsigned)E);
    k_fp8_tiles<<<grid, TILE_THREADS, 0, c->stream>>>(q, s, q + E * O * I,
                                                      s + E * moe_fp8_tile_scales(O, I), w, O, I,
                                                      prec == MOE_RECIPE_FP8_BLOCK_POW2);
    MOE_CUDA_LAUNCHED(c, op, "E=%lld O=%lld I=%lld", (long long)E, (long long)O, (long long)I);
}
