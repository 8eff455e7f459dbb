/* quant_fp8: the fp8-block quantizers of the CUDA backend - the operands of cuBLASLt's block-
 * scaled fp8 products, each the exact bytes of moe/quant.h's CPU emulation.
 *
 * A block's scale is amax / 448 over its finite values (1 for an all-zero block; with pow2,
 * the smallest power of two >= amax / 448: MOE_RECIPE_FP8_BLOCK_POW2) and each
 * value is e4m3(x / scale), rounded to nearest even and saturating (NaN stays NaN), in IEEE
 * fp32 arithmetic: the same values as libcore/src/num/quant.c, so a GPU product and the CPU
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
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float finite_abs(float x) {
    return isfinite(x) ? fabsf(x) : 0.0f;
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
        amax = fmaxf(amax, finite_abs(v[t]));
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
        amax = fmaxf(amax, finite_abs(v[i]));
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

/* One block of 256 threads, 32 x 8, per 128 x 128 tile (blockIdx.x = kb, .y = rb, .z =
 * expert) of w [E, R, K] fp32, R and K multiples of 16: the row-wise copy q [E, R, K] with s
 * [E, RB * KB4] at rb * KB4 + kb, and the transposed copy qt [E, K, R] with st [E, KB * RB4]
 * at kb * RB4 + rb (the same scale values; moe/ops.h's fp8-block weight layout). The tile is
 * read once: thread (tx, ty) holds columns 4 tx .. 4 tx + 3 of rows ty + 8 i in registers
 * (one 16-byte load each: K % 4 == 0 and w 16-byte aligned, as the parameter table aligns
 * tensors), writes them row-wise as 4-byte stores, and the transposed tile goes out through
 * shared memory as 16-byte stores. */
__global__ void __launch_bounds__(256)
    k_fp8_tiles(uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                float *__restrict__ st, const float *__restrict__ w, int64_t R, int64_t K,
                int pow2) {
    __shared__ float sh[32];
    __shared__ uint8_t tile[QB][QB + 1]; /* [k][r], odd stride: no bank conflicts on store */
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const int64_t kb = blockIdx.x, rb = blockIdx.y, e = blockIdx.z;
    const int64_t k0 = kb * QB + tx * 4, r0 = rb * QB;
    const float *we = w + e * R * K;
    const bool kin = k0 < K; /* K % 4 == 0: the 4 columns are in or out together */
    float v[QB / 8][4], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < QB / 8; i++) {
        int64_t r = r0 + ty + 8 * i;
        const float4 f =
            kin && r < R ? *(const float4 *)(we + r * K + k0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[i][0] = f.x, v[i][1] = f.y, v[i][2] = f.z, v[i][3] = f.w;
#pragma unroll
        for (int j = 0; j < 4; j++)
            amax = fmaxf(amax, finite_abs(v[i][j]));
    }
    float scale = fp8_scale(moe_block_max(amax, sh), pow2);
    if (threadIdx.x == 0) {
        const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
        s[e * RB * KB4 + rb * KB4 + kb] = scale;
        st[e * KB * RB4 + kb * RB4 + rb] = scale;
    }
    uint8_t *qe = q + e * R * K, *qte = qt + e * R * K;
#pragma unroll
    for (int i = 0; i < QB / 8; i++) {
        int64_t r = r0 + ty + 8 * i;
        uint32_t packed = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint8_t b = fp8_of(v[i][j], scale);
            packed |= (uint32_t)b << (8 * j);
            tile[tx * 4 + j][ty + 8 * i] = b;
        }
        if (kin && r < R) *(uint32_t *)(qe + r * K + k0) = packed;
    }
    __syncthreads();
    /* qt [K, R]: thread t writes 64 bytes of row t / 2, as 16-byte stores (R % 16 == 0) */
    const int kl = threadIdx.x / 2, half = threadIdx.x % 2;
    const int64_t k = kb * QB + kl;
    if (k >= K) return;
    for (int u = 0; u < 4; u++) {
        int rl = half * 64 + u * 16;
        if (r0 + rl >= R) break;
        uint32_t wv[4];
        for (int b = 0; b < 4; b++)
            wv[b] = (uint32_t)tile[kl][rl + 4 * b] | (uint32_t)tile[kl][rl + 4 * b + 1] << 8 |
                    (uint32_t)tile[kl][rl + 4 * b + 2] << 16 |
                    (uint32_t)tile[kl][rl + 4 * b + 3] << 24;
        *(uint4 *)(qte + k * R + r0 + rl) = make_uint4(wv[0], wv[1], wv[2], wv[3]);
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
    k_fp8_tiles<<<grid, 256, 0, c->stream>>>(q, s, q + E * O * I, s + E * moe_fp8_tile_scales(O, I),
                                             w, O, I, prec == MOE_RECIPE_FP8_BLOCK_POW2);
    MOE_CUDA_LAUNCHED(c, op, "E=%lld O=%lld I=%lld", (long long)E, (long long)O, (long long)I);
}
