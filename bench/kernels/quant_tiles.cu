/* quant_tiles.cu: faster fp8-block weight copies with the same bytes. After each AdamW step
 * kernels/quant_fp8.cu's k_fp8_tiles writes, for every weight w [E, R, K] fp32, the e4m3 copy
 * q [E, R, K] and the transposed copy qt [E, K, R] with one scale per 128 x 128 tile (s and st,
 * cuBLASLt's BLK128x128_32F layouts): measured on an H200 at 2.6 TB/s against about 4.3 TB/s
 * for a copy (6.7 ms of a mixtral8x7b-2L fp8 step). The production kernel is copied below as
 * the baseline; the variants must write the same bytes of q, qt, s and st.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Ilibcore/include -Ikernels bench/kernels/quant_tiles.cu \
 *        -o /tmp/quant_tiles && /tmp/quant_tiles
 *
 * Not built by CMake, not run by CI (bench/kernels/README.md).
 *
 * Status: written without a GPU on 2026-12-04, not yet run.
 *
 * Where the baseline loses time (read from the code and ptxas -v): 108 registers a thread
 * (64 of them the thread's values), so 2 blocks of 256 per SM, 2 tiles in flight; each block
 * runs load -> block max -> quantize -> transpose -> store with nothing of its own in flight
 * between its loads and its stores, and nothing keeps the two blocks of an SM out of phase.
 * 2.6 TB/s is 5.0 us per tile per SM where the tile's 96 KB take 3.0 us at the copy rate and
 * its ALU work (about 17 instructions a value, 11 of them the IEEE division) about 1.1 us
 * of issue: the time is lost waiting, not computing. The transpose adds, per thread, 64
 * one-byte shared stores, 64 one-byte shared loads and the shifts to pack them, and there
 * are 64 cvt instructions where 32 do.
 * The variants (each value's arithmetic is the baseline's: fp8_scale, finite_abs and
 * __fdiv_rn(x, scale), so the bytes are the same by construction; the harness checks it):
 *   reg<NT, MINB>  the baseline's structure (one block of NT threads per tile, the tile in
 *       registers) with a cheaper transpose: a thread owns 4 x 4 patches (4 consecutive
 *       rows of its 4 columns), so a column's 4 bytes leave as one 32-bit word (4 byte-
 *       permutes per 4 words) into a swizzled shared tile free of bank conflicts on either
 *       side, read back as 16-byte words; two values per cvt; one barrier for the tile max.
 *       reg<256, 1>: the transpose alone, 96 registers, 2 tiles per SM as the baseline;
 *       reg<256, 3>: 80 registers (3-word spill), 3 tiles per SM; reg<512, 1>: 62
 *       registers, 2 tiles per SM but twice the warps, half the values per thread.
 *   pipe<NT, NS>   persistent: one block per SM walks the tiles (kb fastest) with the
 *       tile's fp32 values staged in shared memory by cp.async, NS stages of 64 KB: the
 *       next tiles' loads are in flight while this one is quantized and stored, so the DRAM
 *       does not wait for the ALUs nor for the barriers; 3 barriers a tile, the patch
 *       arithmetic and transpose of reg. pipe<512, 2>: 122 registers; pipe<1024, 2> and
 *       pipe<1024, 3>: 56, 16 values a thread. No spills but reg<256, 3>'s.
 * Kept, with the reasons: __fdiv_rn (x * (1 / scale) is another value for a scale that is
 * not a power of two; the reciprocal is the same for the whole tile, which ptxas may hoist);
 * the output layouts (cuBLASLt's); plain loads and stores, no cache hints (the baseline's,
 * so that the comparison is of the structure).
 *
 * Prediction (H200, GB/s as printed, the baseline about 2,600): reg<256, 1> about 2,800,
 * reg<512, 1> about 3,000, reg<256, 3> about 3,200; pipe<512, 2> about 3,700, pipe<1024, 2>
 * and pipe<1024, 3> about 3,900 (90% of the copy printed beside them, the third stage worth
 * little once the ALU time per tile is well below the DRAM time), so the 14 calls of a
 * mixtral8x7b-2L fp8 step (17.4 GB) 6.7 -> about 4.5 ms, -2.2 ms a step. If pipe stays
 * below 3,500, the ALU work is not hidden after all (then 1024 threads should beat 512
 * clearly and the division is the next suspect); if reg<256, 3> comes close to pipe, tiles
 * in flight were the whole story and the simpler kernel is the one to move into kernels/.
 *
 * What it checks first: on E3 R272 K144 (edge tiles in both dimensions), E1 R384 K656 and the
 * two mixtral expert shapes (E8 R14336 K4096, E8 R4096 K14336), with and without the pow2
 * scale rule, weights holding an all-zero tile (scale 1), an all-subnormal tile, a tile near
 * FLT_MAX, a tile of only NaN / +-Inf / 0, and in the others outliers, zeros, subnormals,
 * NaN and +-Inf: every variant's q, qt, s and st byte-identical to the baseline's, every
 * byte of the output buffers compared (prefilled 0xa5 on both sides, so a stray write shows
 * too). A variant that differs prints its first differing byte (which array, which element)
 * and FAIL, gets no rate, and the program exits 1. Then the mixtral shapes are timed (pow2
 * off; kernels taking turns, 3 warm-up rounds, median of 21): GB/s counting 4 bytes read and
 * 2 written per weight, beside a cudaMemcpy D2D moving the same 6 bytes per weight. */
#include <cuda_fp8.h>
#include <string.h>

#include "playground.cuh"

#include "backend_cuda.cuh"

/* ---- baseline: kernels/quant_fp8.cu QB, fp8_scale, fp8_of, finite_abs and k_fp8_tiles as of
 * commit 4d85b94 ---- */
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

/* ---- end of baseline ---- */

/* ---- what both variants share ---- */

/* e4m3 of x / scale for 4 values, byte j from component j: fp8_of's bytes, two per
 * instruction. __nv_cvt_float2_to_fp8x2 issues the instruction fp8_of's __nv_cvt_float_to_fp8
 * issues for one value (cvt.rn.satfinite.e4m3x2.f32, sm_89 and later: cuda_fp8.hpp), which
 * converts its two halves independently; below sm_89 it calls __nv_cvt_float_to_fp8 per value.
 * Same bytes either way. */
__device__ __forceinline__ uint32_t fp8x4_of(float4 x, float scale) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(
                       make_float2(__fdiv_rn(x.x, scale), __fdiv_rn(x.y, scale)), __NV_SATFINITE,
                       __NV_E4M3),
                   hi = __nv_cvt_float2_to_fp8x2(
                       make_float2(__fdiv_rn(x.z, scale), __fdiv_rn(x.w, scale)), __NV_SATFINITE,
                       __NV_E4M3);
    return lo | hi << 16;
}

/* The tile's amax from every thread's (NW warps): warp maxima to sh [NW], one barrier, then
 * every warp reduces the NW maxima again. The same value as moe_block_max (a maximum of
 * non-negative numbers, in any order), one barrier instead of two: the callers guarantee
 * that no thread rewrites sh before all have read it. */
template <int NW> __device__ __forceinline__ float tile_max(float v, float *sh) {
    v = moe_warp_max(v);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    return moe_warp_max(sh[threadIdx.x % NW]);
}

/* One thread's patch at scale: x [4] the rows r0 + 4 g + i of columns k0 .. k0 + 3 of the
 * tile (k0 = the tile's first column + 4 tx). Row-wise into qe [R, K] as 4-byte stores (a
 * warp, tx = 0..31, writes a row's 128 bytes); transposed into tt, the tile's [128 k][128 r]
 * bytes as [128][32] words, word (kl, g) = rows 4 g .. 4 g + 3 of column kl, kept at
 * kl * 32 + (g ^ (kl / 4)): the 32 lanes of one store have kl / 4 = tx, 32 different banks. */
__device__ __forceinline__ void put_patch(uint8_t *__restrict__ qe, uint32_t *__restrict__ tt,
                                          const float4 x[4], float scale, int tx, int g, int64_t r0,
                                          int64_t k0, int64_t R, int64_t K) {
    uint32_t rw[4], cw[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        rw[i] = fp8x4_of(x[i], scale);
        const int64_t r = r0 + 4 * g + i;
        if (k0 < K && r < R) *(uint32_t *)(qe + r * K + k0) = rw[i];
    }
    pg_transpose4x4(rw, cw);
#pragma unroll
    for (int j = 0; j < 4; j++)
        tt[(4 * tx + j) * 32 + (g ^ tx)] = cw[j];
}

/* Chunk c (0 .. 1023) of the transposed tile to qte [K, R]: 16 bytes, rows r0 + 16 (c % 8)
 * .. + 15 of qt's row kq0 + c / 8 (R % 16 == 0: a chunk is all in or all out). Its 4 words
 * t (x = kl / 4) are the aligned 16 bytes at (c % 8) ^ (x / 4) of tt's row kl, word t at
 * position t ^ (x % 4): one 16-byte load and up to two swaps. The 8 chunks of a row (one
 * quarter-warp's loads) sit in 8 different 16-byte bank groups. */
__device__ __forceinline__ void put_qt(uint8_t *__restrict__ qte, const uint4 *__restrict__ tt,
                                       int c, int64_t kq0, int64_t r0, int64_t R, int64_t K) {
    const int kl = c / 8, m = c % 8, x = kl / 4;
    const int64_t k = kq0 + kl, r = r0 + 16 * m;
    if (k >= K || r >= R) return;
    uint4 a = tt[kl * 8 + (m ^ (x / 4))];
    uint32_t t;
    if (x & 1) t = a.x, a.x = a.y, a.y = t, t = a.z, a.z = a.w, a.w = t;
    if (x & 2) t = a.x, a.x = a.z, a.z = t, t = a.y, a.y = a.w, a.w = t;
    *(uint4 *)(qte + k * R + r) = a;
}

/* The scales of tile (e, rb, kb) in both layouts (as the baseline writes them). */
__device__ __forceinline__ void put_scales(float *s, float *st, float scale, int64_t e, int64_t rb,
                                           int64_t kb, int64_t RB, int64_t KB) {
    const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
    s[e * RB * KB4 + rb * KB4 + kb] = scale;
    st[e * KB * RB4 + kb * RB4 + rb] = scale;
}

/* The larger of amax and the finite magnitudes of a patch's 4 rows x 4 columns. */
__device__ __forceinline__ float patch_amax(const float4 (&x)[4], float amax) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        amax = fmaxf(fmaxf(amax, finite_abs(x[i].x)), finite_abs(x[i].y));
        amax = fmaxf(fmaxf(amax, finite_abs(x[i].z)), finite_abs(x[i].w));
    }
    return amax;
}

/* Everything after a tile's values are in registers (reg and pipe alike): the tile's scale
 * from the thread's amax, both scale layouts, the row-wise copy from the P patches x, and the
 * transposed copy through tt (one barrier between; tile (e, rb, kb) of w [E, R, K]). */
template <int NT, int P>
__device__ __forceinline__ void put_tile(uint8_t *q, float *s, uint8_t *qt, float *st,
                                         const float4 (&x)[P][4], float amax, float *sh, uint4 *tt,
                                         int64_t e, int64_t rb, int64_t kb, int64_t RB, int64_t KB,
                                         int64_t R, int64_t K, int pow2) {
    constexpr int NW = NT / 32;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t k0 = kb * QB + 4 * tx, r0 = rb * QB;
    const float scale = fp8_scale(tile_max<NW>(amax, sh), pow2);
    if (threadIdx.x == 0) put_scales(s, st, scale, e, rb, kb, RB, KB);
#pragma unroll
    for (int p = 0; p < P; p++)
        put_patch(q + e * R * K, (uint32_t *)tt, x[p], scale, tx, ty + NW * p, r0, k0, R, K);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < QB * QB / 16 / NT; u++)
        put_qt(qt + e * R * K, tt, threadIdx.x + NT * u, kb * QB, r0, R, K);
}

/* ---- variant reg<NT, MINB>: one block of NT threads per tile, the tile in registers ---- */

/* Grid and arguments as k_fp8_tiles (blockIdx.x = kb, .y = rb, .z = expert; q [E, R, K],
 * s [E, RB * KB4], qt [E, K, R], st [E, KB * RB4], w [E, R, K] 16-byte aligned, R and K
 * multiples of 16). Thread (tx, ty) of NT / 32 warps holds the patches g = ty + NW p
 * (p < P): rows 4 g .. 4 g + 3 of columns 4 tx .. 4 tx + 3, one float4 load per row (a warp
 * reads a row's 512 bytes). MINB: the blocks per SM asked of ptxas - reg<256, 3> caps it at
 * 80 registers (3 tiles per SM instead of 2, for a spill of 3 words). */
template <int NT, int MINB>
__global__ void __launch_bounds__(NT, MINB)
    k_tiles_reg(uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                float *__restrict__ st, const float *__restrict__ w, int64_t R, int64_t K,
                int pow2) {
    constexpr int NW = NT / 32, P = QB / 4 / NW; /* warps; patches per thread */
    __shared__ float sh[NW];
    __shared__ uint4 tt[QB * QB / 16];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const int64_t kb = blockIdx.x, rb = blockIdx.y, e = blockIdx.z;
    const int64_t k0 = kb * QB + 4 * tx, r0 = rb * QB;
    const float *we = w + e * R * K;
    float4 x[P][4];
    float amax = 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = r0 + 4 * (ty + NW * p) + i;
            x[p][i] = k0 < K && r < R ? *(const float4 *)(we + r * K + k0)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
    for (int p = 0; p < P; p++)
        amax = patch_amax(x[p], amax);
    put_tile<NT, P>(q, s, qt, st, x, amax, sh, tt, e, rb, kb, RB, KB, R, K, pow2);
}

/* ---- variant pipe<NT, NS>: persistent, the tiles staged by cp.async ---- */

/* 16 bytes global -> shared, asynchronously; src_bytes 0 writes 16 zeros (and reads nothing). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* A block's place in the tile order (kb fastest, then rb, then the expert): tile t and its
 * (e, rb, kb). 32-bit: the host checks the count. */
typedef struct {
    unsigned t, e, rb, kb;
} tile_pos;

/* Steps p by g tiles, (ge, gr, gk) = g as (experts, row blocks, column blocks): carries
 * instead of three integer divisions per tile and cursor, which would be (estimated) a
 * third of a thread's instructions at 1024 threads. */
__device__ __forceinline__ void tile_step(tile_pos *p, unsigned g, unsigned ge, unsigned gr,
                                          unsigned gk, unsigned RB, unsigned KB) {
    p->t += g;
    p->kb += gk;
    const unsigned ck = p->kb >= KB;
    p->kb -= ck ? KB : 0;
    p->rb += gr + ck;
    const unsigned cr = p->rb >= RB;
    p->rb -= cr ? RB : 0;
    p->e += ge + cr;
}

/* Issues tile p's values into S [QB][QB] fp32 when p.t < ntiles: 16-byte cp.async copies, a
 * warp's 32 one row's 512 bytes; columns >= K and rows >= R become zeros (K % 4 == 0: a
 * copy is all in or all out). */
template <int NT>
__device__ __forceinline__ void load_tile(float *S, const float *w, tile_pos p, unsigned ntiles,
                                          int64_t R, int64_t K) {
    if (p.t >= ntiles) return;
    const float *we = w + p.e * R * K;
#pragma unroll
    for (int u = 0; u < QB * QB / 4 / NT; u++) {
        const int c = threadIdx.x + NT * u, row = c / 32, ch = c % 32;
        const int64_t r = (int64_t)p.rb * QB + row, k = (int64_t)p.kb * QB + 4 * ch;
        const bool in = r < R && k < K;
        cp_async16(S + row * QB + 4 * ch, in ? we + r * K + k : w, in ? 16 : 0);
    }
}

/* Arguments as k_fp8_tiles plus E; grid: at most one block per SM (NS * 64 KB + 16 KB of
 * dynamic shared memory), block b taking tiles b, b + gridDim.x, ... Iteration i issues the
 * copies of the tile NS - 1 ahead into the stage freed by iteration i - 1, waits for its own
 * tile's, then works as reg. Barriers per tile: (1) the stage's copies visible to all,
 * (2) the tile max, (3) tt complete; (3) also means every thread has read its values from
 * the stage, so the next iteration may refill it, and the next iteration's (1) and (2) come
 * after every thread's reads of tt and sh, so neither needs a barrier of its own. */
template <int NT, int NS>
__global__ void __launch_bounds__(NT, 1)
    k_tiles_pipe(uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                 float *__restrict__ st, const float *__restrict__ w, int64_t E, int64_t R,
                 int64_t K, int pow2) {
    constexpr int NW = NT / 32, P = QB / 4 / NW;
    extern __shared__ uint4 smem[]; /* [NS][QB][QB] fp32 stages, then tt [QB * QB / 16] */
    float *stages = (float *)smem;
    uint4 *tt = smem + NS * QB * QB / 4;
    __shared__ float sh[NW];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const unsigned RB = (unsigned)((R + QB - 1) / QB), KB = (unsigned)((K + QB - 1) / QB);
    const unsigned ntiles = (unsigned)E * RB * KB, g = gridDim.x;
    const unsigned gk = g % KB, gr = g / KB % RB, ge = g / KB / RB;
    const unsigned b = blockIdx.x;
    tile_pos cur = {b, b / KB / RB, b / KB % RB, b % KB}, next = cur; /* worked on, loaded */
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        load_tile<NT>(stages + i * QB * QB, w, next, ntiles, R, K);
        cp_async_commit();
        tile_step(&next, g, ge, gr, gk, RB, KB);
    }
    for (int slot = 0; cur.t < ntiles; slot = (slot + 1) % NS) {
        /* always commit, an empty group past the end: wait_group counts groups */
        load_tile<NT>(stages + (slot + NS - 1) % NS * QB * QB, w, next, ntiles, R, K);
        cp_async_commit();
        tile_step(&next, g, ge, gr, gk, RB, KB);
        cp_async_wait<NS - 1>();
        __syncthreads();
        const float *S = stages + slot * QB * QB;
        const int64_t e = cur.e, rb = cur.rb, kb = cur.kb;
        float4 x[P][4];
        float amax = 0.0f;
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                x[p][i] = *(const float4 *)(S + (4 * (ty + NW * p) + i) * QB + 4 * tx);
#pragma unroll
        for (int p = 0; p < P; p++)
            amax = patch_amax(x[p], amax);
        put_tile<NT, P>(q, s, qt, st, x, amax, sh, tt, e, rb, kb, RB, KB, R, K, pow2);
        tile_step(&cur, g, ge, gr, gk, RB, KB);
    }
}

/* ---- harness ---- */

__device__ __forceinline__ unsigned mix(unsigned h) {
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

/* w [E, R, K]: per tile a class, from a hash of the tile (the first four tiles of expert 0,
 * (rb, kb) in {0, 1}^2, one of each special class; elsewhere 1/64 special): 0 all zeros
 * (amax 0, scale 1); 1 all f32 subnormals (a subnormal scale); 2 up to 3e38 (near FLT_MAX);
 * 3 only NaN (either sign), +-Inf and zeros (amax 0); otherwise uniform in [-1, 1) times
 * 2^-12 .. 2^12, with 0.1% outliers (x300), 0.05% zeros, and 0.005% subnormals, 0.001% NaN
 * and 0.001% +-Inf: rare enough that the division's slow path (taken for subnormals) does
 * not weigh in the times, as it would not for real weights. */
__global__ void k_fill_w(float *__restrict__ w, int64_t E, int64_t R, int64_t K) {
    const int64_t n = E * R * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = i / (R * K), rb = i / K % R / QB, kb = i % K / QB;
        const unsigned th = mix((unsigned)(e * 1000003 + rb * 7919 + kb) ^ 0x5bd1e995u);
        const unsigned h = mix((unsigned)i ^ mix((unsigned)(i >> 32) + 0x9e3779b9u));
        const float u = (h >> 8) / 8388608.0f - 1.0f;
        unsigned cls = e == 0 && rb < 2 && kb < 2 ? (unsigned)(2 * rb + kb) : th % 256;
        const unsigned sp = mix(h ^ 0xdeadbeefu) % 100000;
        float x;
        if (cls == 0)
            x = 0.0f;
        else if (cls == 1)
            x = u * 1e-39f;
        else if (cls == 2)
            x = u * 3e38f;
        else if (cls == 3) {
            const unsigned bits[4] = {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u};
            x = h % 3 == 0 ? 0.0f : __uint_as_float(bits[(h >> 4) % 4]);
        } else {
            x = ldexpf(u, (int)(th >> 8) % 25 - 12);
            if (sp < 100)
                x *= 300.0f;
            else if (sp < 150)
                x = 0.0f;
            else if (sp < 155)
                x = u * 1e-40f;
            else if (sp < 156)
                x = __uint_as_float(h & 1 ? 0xffc00000u : 0x7fc00000u);
            else if (sp < 157)
                x = h & 1 ? INFINITY : -INFINITY;
        }
        w[i] = x;
    }
}

typedef struct {
    const char *name;
    int kind; /* 0 baseline, 1 reg, 2 pipe */
    int threads, min_blocks, stages;
} variant;
static const variant variants[] = {
    {"baseline k_fp8_tiles", 0, 256, 0, 0},  {"reg<256, 1>", 1, 256, 1, 0},
    {"reg<256, 3>", 1, 256, 3, 0},           {"reg<512, 1>", 1, 512, 1, 0},
    {"pipe<512, 2 stages>", 2, 512, 1, 2},   {"pipe<1024, 2 stages>", 2, 1024, 1, 2},
    {"pipe<1024, 3 stages>", 2, 1024, 1, 3},
};
enum { NVAR = sizeof variants / sizeof variants[0] };

static int num_sms;

static size_t pipe_smem(int stages) {
    return (size_t)stages * QB * QB * sizeof(float) + QB * QB;
}

/* The pipe variants' kernels, their shared memory set, and their resident blocks per SM
 * (pipe_setup, once: no runtime queries between the timing events). */
static void *pipe_fn[NVAR];
static int pipe_per_sm[NVAR];
static int pipe_setup(void) {
    for (int v = 0; v < NVAR; v++) {
        const variant *p = &variants[v];
        if (p->kind != 2) continue;
        void *k = p->threads == 512 ? (void *)k_tiles_pipe<512, 2>
                  : p->stages == 2  ? (void *)k_tiles_pipe<1024, 2>
                                    : (void *)k_tiles_pipe<1024, 3>;
        const size_t sm = pipe_smem(p->stages);
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&pipe_per_sm[v], k, p->threads, sm));
        pipe_fn[v] = k;
        printf("  %-22s %d block(s) per SM, %zu bytes of shared memory each\n", p->name,
               pipe_per_sm[v], sm);
        if (pipe_per_sm[v] < 1) {
            fprintf(stderr, "%s does not fit on this GPU\n", p->name);
            return 0;
        }
    }
    return 1;
}

/* The copies of w [E, R, K] by variant v into buf (q, then qt: 2 E R K bytes) and sc (s,
 * then st), laid out as moe_cuda_quantize_weight does. */
static void launch(const variant *v, uint8_t *buf, float *sc, const float *w, int64_t E, int64_t R,
                   int64_t K, int pow2) {
    uint8_t *q = buf, *qt = buf + E * R * K;
    float *s = sc, *st = sc + E * moe_fp8_tile_scales(R, K);
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const dim3 grid((unsigned)KB, (unsigned)RB, (unsigned)E);
    if (v->kind == 0) {
        k_fp8_tiles<<<grid, 256>>>(q, s, qt, st, w, R, K, pow2);
    } else if (v->kind == 1) {
        if (v->threads == 512)
            k_tiles_reg<512, 1><<<grid, 512>>>(q, s, qt, st, w, R, K, pow2);
        else if (v->min_blocks == 3)
            k_tiles_reg<256, 3><<<grid, 256>>>(q, s, qt, st, w, R, K, pow2);
        else
            k_tiles_reg<256, 1><<<grid, 256>>>(q, s, qt, st, w, R, K, pow2);
    } else {
        const int i = (int)(v - variants);
        const int64_t tiles = E * RB * KB, cap = (int64_t)pipe_per_sm[i] * num_sms;
        const unsigned blocks = (unsigned)(tiles < cap ? tiles : cap);
        void *args[] = {&q, &s, &qt, &st, (void *)&w, &E, &R, &K, &pow2};
        CK(cudaLaunchKernel(pipe_fn[i], dim3(blocks), dim3(v->threads), args, pipe_smem(v->stages),
                            0));
    }
    CK(cudaGetLastError());
}

/* Where byte d of the compared buffers is, as text: q[e][r][k], qt[e][k][r], s or st
 * (tile of expert e). */
static void where(char *out, size_t cap, long long d, int scales, int64_t E, int64_t R, int64_t K) {
    const int64_t n = E * R * K, RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
    const int64_t ts = moe_fp8_tile_scales(R, K), tst = moe_fp8_tile_scales(K, R);
    if (!scales && d < n)
        snprintf(out, cap, "q[e %lld][r %lld][k %lld]", (long long)(d / (R * K)),
                 (long long)(d / K % R), (long long)(d % K));
    else if (!scales)
        d -= n, snprintf(out, cap, "qt[e %lld][k %lld][r %lld]", (long long)(d / (R * K)),
                         (long long)(d / R % K), (long long)(d % R));
    else if (d / 4 < E * ts)
        d /= 4,
            snprintf(out, cap, "s[e %lld] entry %lld (tile rb %lld kb %lld)", (long long)(d / ts),
                     (long long)(d % ts), (long long)(d % ts / KB4), (long long)(d % ts % KB4));
    else
        d = d / 4 - E * ts,
        snprintf(out, cap, "st[e %lld] entry %lld (tile kb %lld rb %lld)", (long long)(d / tst),
                 (long long)(d % tst), (long long)(d % tst / RB4), (long long)(d % tst % RB4));
}

typedef struct {
    int64_t E, R, K;
    int timed;
} shape;
static const shape shapes[] = {
    {3, 272, 144, 0}, {1, 384, 656, 0}, {8, 14336, 4096, 1}, {8, 4096, 14336, 1}};
enum { NSHAPE = sizeof shapes / sizeof shapes[0] };

/* Checks every variant against the baseline on shape sh, pow2 off and on; ok[v] = 0 for one
 * that differs (its first differing byte printed). */
static void check(const shape *sh, const float *w, uint8_t *qb, float *sb, uint8_t *qc, float *sc,
                  int *ok, unsigned long long *d_first) {
    const int64_t E = sh->E, R = sh->R, K = sh->K, n = E * R * K;
    const size_t qbytes = (size_t)(2 * n), sbytes = moe_fp8_weight_scales(E, R, K) * sizeof(float);
    for (int pow2 = 0; pow2 <= 1; pow2++) {
        CK(cudaMemset(qb, 0xa5, qbytes));
        CK(cudaMemset(sb, 0xa5, sbytes));
        launch(&variants[0], qb, sb, w, E, R, K, pow2);
        for (int v = 1; v < NVAR; v++) {
            CK(cudaMemset(qc, 0xa5, qbytes));
            CK(cudaMemset(sc, 0xa5, sbytes));
            launch(&variants[v], qc, sc, w, E, R, K, pow2);
            CK(cudaDeviceSynchronize());
            long long dq = pg_first_diff(qb, qc, qbytes, d_first, num_sms);
            long long ds = dq < 0 ? pg_first_diff(sb, sc, sbytes, d_first, num_sms) : -1;
            if (dq < 0 && ds < 0) {
                printf("  E%lld R%lld K%lld pow2 %d  %-22s q, qt, s, st identical  ok\n",
                       (long long)E, (long long)R, (long long)K, pow2, variants[v].name);
                continue;
            }
            const int scales = dq < 0;
            const long long d = scales ? ds : dq;
            const uint8_t *a = scales ? (const uint8_t *)sb : qb,
                          *b = scales ? (const uint8_t *)sc : qc;
            uint8_t x, y;
            char at[128];
            CK(cudaMemcpy(&x, a + d, 1, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&y, b + d, 1, cudaMemcpyDeviceToHost));
            where(at, sizeof at, d, scales, E, R, K);
            printf("  E%lld R%lld K%lld pow2 %d  %-22s differs first at %s (byte %lld: baseline "
                   "%02x, variant %02x)  FAIL\n",
                   (long long)E, (long long)R, (long long)K, pow2, variants[v].name, at, d, x, y);
            ok[v] = 0;
        }
    }
}

/* Times the baseline, every variant that passed everywhere and a D2D copy of 3n bytes
 * (6n moved, as the quantizer's 4n read + 2n written), taking turns, pow2 off. */
static void timing(const shape *sh, const float *w, uint8_t *qc, float *sc, uint8_t *scratch,
                   const int *ok) {
    enum { WARM = 3, ROUNDS = 21, NK = NVAR + 1 };
    const int64_t E = sh->E, R = sh->R, K = sh->K, n = E * R * K;
    const double bytes = 6.0 * (double)n;
    int on[NK];
    for (int k = 0; k < NK; k++)
        on[k] = k == NVAR || ok[k];
    float med[NK];
    pg_time_turns(
        NK, on, WARM, ROUNDS, [](int) {},
        [&](int k) {
            if (k < NVAR)
                launch(&variants[k], qc, sc, w, E, R, K, 0);
            else
                CK(cudaMemcpyAsync(scratch, w, (size_t)(3 * n), cudaMemcpyDeviceToDevice));
        },
        med);
    printf(
        "\n  E%lld R%lld K%lld: %.2f GB moved a call (4 B read + 2 B written per weight); median "
        "of %d, taking turns\n",
        (long long)E, (long long)R, (long long)K, bytes / 1e9, ROUNDS);
    printf("  %-28s %8s %8s %8s %22s\n", "kernel", "ms", "GB/s", "of copy",
           "mixtral step (17.4 GB)");
    printf("  %-28s %8.3f %8.0f %7.1f%%\n", "copy D2D (same bytes moved)", med[NVAR],
           bytes / med[NVAR] / 1e6, 100.0);
    for (int k = 0; k < NVAR; k++) {
        if (!ok[k]) {
            printf("  %-28s %8s %8s %8s\n", variants[k].name, "-", "FAIL", "-");
            continue;
        }
        const double gbs = bytes / med[k] / 1e6;
        printf("  %-28s %8.3f %8.0f %7.1f%% %19.2f ms\n", variants[k].name, med[k], gbs,
               100.0 * med[NVAR] / med[k], 17.4e9 / gbs / 1e6);
    }
}

int main(void) {
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    num_sms = prop.multiProcessorCount;
    printf("quant_tiles: %s, %d SMs; fp8-block weight copies (k_fp8_tiles and variants)\n",
           prop.name, num_sms);
    if (!pipe_setup()) return 1;
    int ok[NVAR];
    for (int v = 0; v < NVAR; v++)
        ok[v] = 1;
    unsigned long long *d_first;
    CK(cudaMalloc(&d_first, sizeof *d_first));
    for (int i = 0; i < NSHAPE; i++) {
        const shape *sh = &shapes[i];
        const int64_t n = sh->E * sh->R * sh->K;
        const size_t sbytes = moe_fp8_weight_scales(sh->E, sh->R, sh->K) * sizeof(float);
        if (n >= (1LL << 32) || sh->R % 16 || sh->K % 16) {
            fprintf(stderr, "shape E%lld R%lld K%lld not supported here\n", (long long)sh->E,
                    (long long)sh->R, (long long)sh->K);
            return 1;
        }
        float *w, *sb, *sc;
        uint8_t *qb, *qc, *scratch = NULL;
        CK(cudaMalloc(&w, n * sizeof(float)));
        CK(cudaMalloc(&qb, 2 * n));
        CK(cudaMalloc(&qc, 2 * n));
        CK(cudaMalloc(&sb, sbytes));
        CK(cudaMalloc(&sc, sbytes));
        k_fill_w<<<8 * num_sms, 256>>>(w, sh->E, sh->R, sh->K);
        CK(cudaGetLastError());
        check(sh, w, qb, sb, qc, sc, ok, d_first);
        if (sh->timed) {
            CK(cudaMalloc(&scratch, 3 * n));
            timing(sh, w, qc, sc, scratch, ok);
            CK(cudaFree(scratch));
        }
        CK(cudaFree(w));
        CK(cudaFree(qb));
        CK(cudaFree(qc));
        CK(cudaFree(sb));
        CK(cudaFree(sc));
    }
    int all = 1;
    for (int v = 0; v < NVAR; v++)
        all &= ok[v];
    printf("\nquant_tiles: %s\n",
           all ? "every variant byte-identical to the baseline" : "FAIL (see above)");
    CK(cudaFree(d_first));
    return all ? 0 : 1;
}
