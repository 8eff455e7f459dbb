/* adamw_fp8.cu: the fp8-block optimizer step in one pass - AdamW (fp32 master w and gradient g,
 * bf16 moments m, v) and the weight's two e4m3 copies with their 128 x 128 tile scales (q [E, O,
 * I], qt [E, I, O]) - against the production two passes (AdamW, then quantize_weight), checked
 * byte for byte and timed on mixtral8x7b-2L's expert weights beside a copy of the same bytes.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include -Ilibcore/src \
 *       -Ikernels -Xptxas -v bench/kernels/adamw_fp8.cu -lcublasLt -o /tmp/pg_adamw_fp8
 *   timeout 120 /tmp/pg_adamw_fp8       (or: bench/kernels/run_playgrounds.sh OUT adamw_fp8)
 *
 * Status: run on an H100 on 2026-12-05 13:44 UTC: every form writes the two passes' bytes, none
 * is faster (ring<8> 74%, flat<1> 77% of a device copy's rate against the two passes' 98.5%;
 * docs/performance-gpu.md, "The one-pass AdamW + fp8 copies: run and dropped").
 *
 * Why. Two passes move 26 bytes a weight element (AdamW 20; the copies 6: w read again, q and qt
 * written), one pass 22. The first fused form (025b5f4, reverted by 956fa77) ran at 1,550 GB/s
 * against the two passes' 2,876 on an H100: one block of 512 threads (112 registers: one a SM)
 * a tile loaded 4 rows of the four arrays, did the f32_rn arithmetic (three IEEE divisions and a
 * square root an element), then the next 4 rows, then the amax barrier and the copies - the
 * SM's loads stood still while it computed, reduced and stored.
 *
 * Baseline: quant_fp8.cu is included and its moe_cuda_quantize_weight called (k_fp8_tiles and
 * its launch). backend_cuda.cu cannot be included alone (it assembles the whole backend table),
 * so its bf16-moment AdamW (k_adamw_vec4<adamw_bf16>, flat 128-thread blocks) is COPIED below:
 * its PTX has production's 70 rounded operations in the same order (compared 2026-12-05), and
 * the small shapes check it against the CPU backend's bits. A winner moving to kernels/ takes
 * the arithmetic into a header both include (as 025b5f4's kernels/adamw.cuh did).
 *
 * Variants, persistent over the tiles (columns fastest: resident blocks read neighbouring
 * rows), quantizing with k_fp8_tiles's output stage as functions (tile_patch_out, tile_qt_out):
 *   ring<NST>   1 block a SM: a producer warp streams each tile as 8 stages of 16 rows (w, g,
 *               m, v: 24 KB in 64 1-D bulk copies) into a ring of NST stages, running ahead
 *               across tiles; 16 consumer warps hold k_fp8_tiles's patches (rows 4c .. and 64 +
 *               4c .. for warp c), update them from the ring, store w, m, v, and after the amax
 *               barrier write the copies. NST 4 or 8: 96 or 192 KB of loads ahead of them.
 *   flat<STASH> 256 threads, 2 blocks a SM: phase 1 updates the tile in 4 batches of 32 rows
 *               (a warp a 512-byte row, 4 rows a thread, all 16 loads first: 48 KB a block in
 *               flight) storing w, m, v; phase 2, after the amax barrier, reads the new tile back
 *               - from L2, just written (STASH 0), or from a 64 KB shared copy (1) - and writes
 *               the copies. The two blocks overlap each other's phases.
 * Registers (-Xptxas -v; no spills, no stack): k_fused_ring 96 (544 threads: 5 warps on one
 * sub-partition cap it there), k_fused_flat 114 (at 3 blocks a SM, 80, it spilled 44 bytes),
 * k_adamw_vec4 40, k_fp8_tiles 53. Shared bytes: ring<4> 114,816, <8> 213,184; flat<0> 16,416,
 * <1> 81,952.
 *
 * Prediction (H100 SXM, copy ~2.9-3.0 TB/s; not measured). About 100 instructions an element
 * (the AdamW ~70, the copies' division and conversion ~20): at 2.9 TB/s and 22 bytes, 45% of
 * the SMs' issue rate, so a form whose loads never stop stays memory-bound. ring<8> 2.6-2.8
 * TB/s (88-94% of the copy), ring<4> within 3% of it (well behind: the consumers' barrier
 * phases are longer than estimated); flat<1> 2.3-2.7 (its two blocks can compute at once);
 * flat<0> the same or a little lower (w's lines must survive 20-30 us in L2; the other streams
 * are evict-first). Two passes about 2.85 TB/s. The step's 6 expert weights: two passes about
 * 25.5 ms, ring<8> 22-24 ms (-1.5 to -3.5 ms); at the copy's rate 21.3 ms (-4).
 *
 * Prints each variant's registers, local and shared bytes and blocks a SM; per shape and scale
 * rule (amax / 448, pow2) the two passes' AdamW against the CPU's bits (small shapes) and each
 * variant against the two passes byte for byte (w, m, v, q and qt, both scale arrays; outputs
 * prefilled with 0xa5, so an unwritten byte differs); then the rates of the variants that
 * passed (median of 21 rounds taking turns, each behind an untimed memset) and a line per
 * variant for the step. Shapes: small 2 x 256 x 384, edges 3 x 272 x 208 (16-row and 80-column
 * tiles, fewer tiles than SMs), w1/w3 8 x 14336 x 4096, w2 8 x 4096 x 14336. Data: w in [-0.05,
 * 0.05) with zeros (1 in 64) and outliers x 1000 (1 in 65,536), g with zeros and NaN (1 in
 * 4,096), bf16 moments; the first and last tile zero in all four arrays (it stays zero: scale
 * 1). Exit 1 on any FAIL. About 10-20 s and 26 GB of device memory. */
#include <math.h>
#include <string.h>

#include "playground.cuh"
#include "quant_fp8.cu"   /* the production quantizer: moe_cuda_quantize_weight, fp8x4_of, QB */
#include "sm90/wgmma.cuh" /* mbarriers: fa3_bar_init, _expect, _arrive, _wait; smem_u32 */

/* quant_fp8.cu's host entries record errors through backend_cuda.cu's moe_cuda_check, which is
 * not built here: an error ends the program. */
int moe_cuda_check(moe_cuda_ctx *c, cudaError_t e, const char *op, const char *fmt, ...) {
    (void)c, (void)fmt;
    if (e == cudaSuccess) return 1;
    fprintf(stderr, "%s: %s\n", op, cudaGetErrorString(e));
    exit(1);
}

/* ---- AdamW with bf16 moments: kernels/backend_cuda.cu's, copied (see above) ---- */

struct adamw_hp {
    float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};

/* One element: adamw_moments then adamw_update with M = adamw_bf16, f32_rn's operators written
 * out as the intrinsics they call (each rounds on its own, none contracts: the CPU's C11 bits).
 * *m, *v: the stored moments in, the new stored ones out; returns the new weight, computed from
 * the stored moments as on the CPU. */
__device__ __forceinline__ float adamw1(float p, float grad, float *m, float *v,
                                        const adamw_hp &h) {
    const float g = __fmul_rn(grad, h.grad_scale);
    *m = moe_round_bf16(__fadd_rn(__fmul_rn(h.beta1, *m), __fmul_rn(__fsub_rn(1.0f, h.beta1), g)));
    *v = moe_round_bf16(
        __fadd_rn(__fmul_rn(h.beta2, *v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, h.beta2), g), g)));
    const float upd =
        __fdiv_rn(__fdiv_rn(*m, h.bc1), __fadd_rn(__fsqrt_rn(__fdiv_rn(*v, h.bc2)), h.eps));
    return __fsub_rn(p, __fmul_rn(h.lr, __fadd_rn(upd, __fmul_rn(h.wd, p))));
}

/* The AdamW step of 4 consecutive elements in registers: w (fp32) and m, v (4 bf16 codes each,
 * element 0 in the low half of .x) updated from the gradient g - k_adamw_vec4's body, its
 * adamw_bf16::ld4 / st4 without the memory access (a stored moment's upper half is its code). */
__device__ __forceinline__ void adamw4(float4 &w, float4 g, uint2 &m, uint2 &v, const adamw_hp &h) {
    float4 mi = make_float4(moe_f32_from_bits(m.x << 16), moe_f32_from_bits(m.x & 0xffff0000u),
                            moe_f32_from_bits(m.y << 16), moe_f32_from_bits(m.y & 0xffff0000u));
    float4 vi = make_float4(moe_f32_from_bits(v.x << 16), moe_f32_from_bits(v.x & 0xffff0000u),
                            moe_f32_from_bits(v.y << 16), moe_f32_from_bits(v.y & 0xffff0000u));
    float *pp = &w.x, *gg = &g.x, *mm = &mi.x, *vv = &vi.x;
#pragma unroll
    for (int j = 0; j < 4; j++)
        pp[j] = adamw1(pp[j], gg[j], mm + j, vv + j, h);
    m = make_uint2(moe_f32_bits(mi.x) >> 16 | (moe_f32_bits(mi.y) & 0xffff0000u),
                   moe_f32_bits(mi.z) >> 16 | (moe_f32_bits(mi.w) & 0xffff0000u));
    v = make_uint2(moe_f32_bits(vi.x) >> 16 | (moe_f32_bits(vi.y) & 0xffff0000u),
                   moe_f32_bits(vi.z) >> 16 | (moe_f32_bits(vi.w) & 0xffff0000u));
}

/* The production AdamW pass over 4 n4 elements (k_adamw_vec4<adamw_bf16>, no bf16 weight copy):
 * w, g [4 n4] fp32, m, v [n4] groups of 4 bf16 moments, every access streamed. */
__global__ void k_adamw_vec4(float4 *__restrict__ w, const float4 *__restrict__ g,
                             uint2 *__restrict__ m, uint2 *__restrict__ v, int64_t n4, adamw_hp h) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 p = __ldcs(w + i), gi = __ldcs(g + i);
        uint2 mi = __ldcs(m + i), vi = __ldcs(v + i);
        adamw4(p, gi, mi, vi, h);
        __stcs(w + i, p);
        __stcs(m + i, mi);
        __stcs(v + i, vi);
    }
}

/* ---- a tile's copies: k_fp8_tiles's output stage as functions (the same bytes) ---- */

struct tile_pos {
    int64_t e, rb, kb; /* expert, row block, column block of [E, R, K] */
};
__device__ __forceinline__ tile_pos tile_of(int64_t t, int64_t RB, int64_t KB) {
    tile_pos p;
    p.kb = t % KB, p.rb = t / KB % RB, p.e = t / KB / RB;
    return p;
}

/* named barrier 1 over the nt threads that quantize (a kernel's producer warp stays out) */
__device__ __forceinline__ void tile_sync(int nt) {
    asm volatile("bar.sync 1, %0;\n" ::"r"(nt) : "memory");
}

/* Tile p's scale from every quantizing thread's amax (threads 0 .. nt - 1): warp maxima into sh
 * [nt / 32], the barrier, every warp reduces them again (as k_fp8_tiles); thread 0 stores it in
 * s [E, RB * KB4] at rb * KB4 + kb and st [E, KB * RB4] at kb * RB4 + rb (moe_fp8_tile_scales's
 * layouts, padding untouched). */
__device__ __forceinline__ float tile_scale(float amax, float *sh, int nt, int pow2, float *s,
                                            float *st, tile_pos p, int64_t RB, int64_t KB) {
    const int tx = threadIdx.x % 32;
    const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
    amax = moe_warp_max(amax);
    if (tx == 0) sh[threadIdx.x / 32] = amax;
    tile_sync(nt);
    const float scale = fp8_scale(moe_warp_max(sh[tx % (nt / 32)]), pow2);
    if (threadIdx.x == 0)
        s[p.e * RB * KB4 + p.rb * KB4 + p.kb] = st[p.e * KB * RB4 + p.kb * RB4 + p.rb] = scale;
    return scale;
}

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
 * tid, tid + NT, ... (chunk c: rows r0 + 16 (c % 8) .. + 15 of qt's row kb * QB + c / 8). */
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

/* ---- ring<NST>: bulk copies into a ring of stages, warp-specialized ---- */

#define RING_THREADS 544                   /* 16 consumer warps, then the producer warp */
#define STAGE_ROWS 16                      /* a tile is 8 stages */
#define STAGE_BYTES (STAGE_ROWS * QB * 12) /* w, g [16][128] fp32, then m, v [16][128] bf16 */
#define RING_SMEM(nst) ((nst)*STAGE_BYTES + QB * QB + 64 + 16 * (nst)) /* + tt, sh, barriers */

/* A 1-D bulk copy (TMA without a tensor map) of `bytes` (a multiple of 16, both ends 16-byte
 * aligned) from global src to shared dst, counted on the mbarrier bar. */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* w, g [E, R, K] fp32 and m, v [E, R, K] bf16 codes: one AdamW step in place; q [E, R, K] and
 * qt [E, K, R] e4m3 with scales s [E, RB * KB4] and st [E, KB * RB4]: quantize_weight's copies of
 * the new w. R, K multiples of 16, every array 16-byte aligned. Stage n of the block's walk
 * (tile it, stage n % 8) sits in slot n % NST; full[slot] completes on its bytes, empty[slot] on
 * its 4 consumer warps' releases. */
template <int NST>
__global__ void __launch_bounds__(RING_THREADS, 1)
    k_fused_ring(float *__restrict__ w, const float *__restrict__ g, uint16_t *__restrict__ m,
                 uint16_t *__restrict__ v, uint8_t *__restrict__ q, uint8_t *__restrict__ qt,
                 float *__restrict__ s, float *__restrict__ st, int64_t E, int64_t R, int64_t K,
                 adamw_hp h, int pow2) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint4 *tt = (uint4 *)(smem + NST * STAGE_BYTES);
    float *sh = (float *)(smem + NST * STAGE_BYTES + QB * QB);
    const uint32_t ring = smem_u32(smem), full = smem_u32(sh + 16), empty = full + 8 * NST;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB, tiles = E * RB * KB;
    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++)
            fa3_bar_init(full + 8 * i, 1), fa3_bar_init(empty + 8 * i, 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (ty == 16) { /* the producer: lanes 0-15 copy row tx of w and g, lanes 16-31 of m and v */
        int n = 0;
        for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
            const tile_pos p = tile_of(t, RB, KB);
            const int64_t kc = K - p.kb * QB < QB ? K - p.kb * QB : QB, ri = tx % 16;
            for (int sg = 0; sg < 8; sg++, n++) {
                const int slot = n % NST;
                const int64_t r = p.rb * QB + STAGE_ROWS * sg, rows = R - r < 16 ? R - r : 16;
                const uint32_t d = ring + slot * STAGE_BYTES, bar = full + 8 * slot;
                fa3_bar_wait(empty + 8 * slot, (n / NST & 1) ^ 1);
                if (tx == 0) fa3_bar_expect(bar, rows > 0 ? (uint32_t)(rows * kc * 12) : 0u);
                __syncwarp();
                if (ri >= rows) continue;
                const int64_t at = (p.e * R + r + ri) * K + p.kb * QB;
                if (tx < 16) {
                    bulk_load(d + ri * QB * 4, w + at, (uint32_t)kc * 4, bar);
                    bulk_load(d + (16 + ri) * QB * 4, g + at, (uint32_t)kc * 4, bar);
                } else {
                    bulk_load(d + 16384 + ri * QB * 2, m + at, (uint32_t)kc * 2, bar);
                    bulk_load(d + 20480 + ri * QB * 2, v + at, (uint32_t)kc * 2, bar);
                }
            }
        }
        return;
    }
    /* the consumers: warp ty holds patches ty and 16 + ty, stages ty / 4 and 4 + ty / 4 */
    int it = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, it++) {
        const tile_pos p = tile_of(t, RB, KB);
        const int64_t r0 = p.rb * QB, k = p.kb * QB + 4 * tx;
        float4 x[2][4];
        float amax = 0.0f;
#pragma unroll
        for (int pp = 0; pp < 2; pp++) {
            const int sg = ty / 4 + 4 * pp, n = 8 * it + sg, slot = n % NST;
            const uint8_t *d = smem + slot * STAGE_BYTES;
            fa3_bar_wait(full + 8 * slot, n / NST & 1);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int rs = 4 * (ty % 4) + i;
                const int64_t r = r0 + STAGE_ROWS * sg + rs, at = (p.e * R + r) * K + k;
                x[pp][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r >= R || k >= K) continue;
                x[pp][i] = ((const float4 *)d)[rs * 32 + tx];
                uint2 mm = ((const uint2 *)(d + 16384))[rs * 32 + tx],
                      vv = ((const uint2 *)(d + 20480))[rs * 32 + tx];
                adamw4(x[pp][i], ((const float4 *)d)[(16 + rs) * 32 + tx], mm, vv, h);
                __stcs((float4 *)(w + at), x[pp][i]);
                __stcs((uint2 *)(m + at), mm);
                __stcs((uint2 *)(v + at), vv);
                amax = fmaxf(fmaxf(amax, moe_finite_abs(x[pp][i].x)), moe_finite_abs(x[pp][i].y));
                amax = fmaxf(fmaxf(amax, moe_finite_abs(x[pp][i].z)), moe_finite_abs(x[pp][i].w));
            }
            __syncwarp();
            if (tx == 0) fa3_bar_arrive(empty + 8 * slot);
        }
        const float scale = tile_scale(amax, sh, 512, pow2, s, st, p, RB, KB);
#pragma unroll
        for (int pp = 0; pp < 2; pp++)
            tile_patch_out(q + p.e * R * K, (uint32_t *)tt, x[pp], ty + 16 * pp, r0, p.kb, R, K,
                           scale);
        tile_sync(512);
        tile_qt_out<512>(qt + p.e * R * K, tt, threadIdx.x, r0, p.kb, R, K);
    }
}

/* ---- flat<STASH>: the update as flat batches, the copies from the tile written back ---- */

#define FLAT_THREADS 256
#define FLAT_SMEM(stash) (QB * QB + 32 + ((stash) ? QB * QB * 4 : 0)) /* tt, sh, the stash */

/* The arrays and their contract as k_fused_ring's. */
template <bool STASH>
__global__ void __launch_bounds__(FLAT_THREADS, 2)
    k_fused_flat(float *__restrict__ w, const float *__restrict__ g, uint16_t *__restrict__ m,
                 uint16_t *__restrict__ v, uint8_t *__restrict__ q, uint8_t *__restrict__ qt,
                 float *__restrict__ s, float *__restrict__ st, int64_t E, int64_t R, int64_t K,
                 adamw_hp h, int pow2) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint4 *tt = (uint4 *)smem;
    float *sh = (float *)(smem + QB * QB);
    float4 *stash = (float4 *)(smem + QB * QB + 32); /* [128 rows][32]: the tile's new w */
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB, tiles = E * RB * KB;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const tile_pos p = tile_of(t, RB, KB);
        const int64_t r0 = p.rb * QB, k = p.kb * QB + 4 * tx;
        /* the tile's rows this lane updates (none past K) */
        const int rows = k < K ? (int)(R - r0 < QB ? R - r0 : QB) : 0;
        float amax = 0.0f;
#pragma unroll 1
        for (int b = 0; b < 4; b++) { /* phase 1: rows 32 b + 8 j + ty, j < 4 */
            const int64_t at0 = (p.e * R + r0 + 32 * b + ty) * K + k; /* item j: at0 + 8 j K */
            float4 x[4], gg[4];
            uint2 mm[4], vv[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t at = at0 + 8 * j * K;
                const bool in = 32 * b + 8 * j + ty < rows;
                /* the L2 form keeps w's lines at normal priority for phase 2 */
                x[j] = !in     ? zero
                       : STASH ? __ldcs((const float4 *)(w + at))
                               : __ldcg((const float4 *)(w + at));
                gg[j] = in ? __ldcs((const float4 *)(g + at)) : zero;
                mm[j] = in ? __ldcs((const uint2 *)(m + at)) : make_uint2(0u, 0u);
                vv[j] = in ? __ldcs((const uint2 *)(v + at)) : make_uint2(0u, 0u);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t at = at0 + 8 * j * K;
                if (32 * b + 8 * j + ty < rows) {
                    adamw4(x[j], gg[j], mm[j], vv[j], h);
                    if (STASH)
                        __stcs((float4 *)(w + at), x[j]);
                    else
                        __stcg((float4 *)(w + at), x[j]);
                    __stcs((uint2 *)(m + at), mm[j]);
                    __stcs((uint2 *)(v + at), vv[j]);
                    amax = fmaxf(fmaxf(amax, moe_finite_abs(x[j].x)), moe_finite_abs(x[j].y));
                    amax = fmaxf(fmaxf(amax, moe_finite_abs(x[j].z)), moe_finite_abs(x[j].w));
                }
                if (STASH) stash[(32 * b + 8 * j + ty) * 32 + tx] = x[j];
            }
        }
        /* the barrier in tile_scale also makes phase 1's stores visible to the whole block */
        const float scale = tile_scale(amax, sh, FLAT_THREADS, pow2, s, st, p, RB, KB);
#pragma unroll
        for (int p0 = 0; p0 < 4; p0 += 2) { /* phase 2: patches ty + 8 p, two at a time */
            float4 x[2][4];
#pragma unroll
            for (int pp = 0; pp < 2; pp++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int rl = 4 * (ty + 8 * (p0 + pp)) + i;
                    const int64_t r = r0 + rl;
                    x[pp][i] = STASH ? stash[rl * 32 + tx]
                               : r < R && k < K
                                   ? __ldcg((const float4 *)(w + (p.e * R + r) * K + k))
                                   : zero;
                }
#pragma unroll
            for (int pp = 0; pp < 2; pp++)
                tile_patch_out(q + p.e * R * K, (uint32_t *)tt, x[pp], ty + 8 * (p0 + pp), r0, p.kb,
                               R, K, scale);
        }
        tile_sync(FLAT_THREADS);
        tile_qt_out<FLAT_THREADS>(qt + p.e * R * K, tt, threadIdx.x, r0, p.kb, R, K);
    }
}

/* ---- host ---- */

typedef void (*fused_fn)(float *, const float *, uint16_t *, uint16_t *, uint8_t *, uint8_t *,
                         float *, float *, int64_t, int64_t, int64_t, adamw_hp, int);
enum { OP_COPY, OP_ADAMW, OP_QUANT, OP_TWO, OP_FUSED, NFUSED = 4, NOP = OP_FUSED + NFUSED };
static struct {
    const char *name;
    fused_fn fn;
    int threads, smem, per_sm; /* per_sm: blocks a SM, from the occupancy query */
} fused[NFUSED] = {
    {"ring<4>", k_fused_ring<4>, RING_THREADS, RING_SMEM(4), 0},
    {"ring<8>", k_fused_ring<8>, RING_THREADS, RING_SMEM(8), 0},
    {"flat<0> (L2)", k_fused_flat<false>, FLAT_THREADS, FLAT_SMEM(0), 0},
    {"flat<1> (stash)", k_fused_flat<true>, FLAT_THREADS, FLAT_SMEM(1), 0},
};
static const char *op_name[OP_FUSED] = {"copy D2D (the fused bytes)", "adamw (production copy)",
                                        "quantize_weight (production)", "two passes"};
static int num_sms;

typedef struct {
    const char *name;
    int64_t E, O, I;
    int per_step; /* the step's expert weights of this shape (timed); 0: checked only */
} shape;
static const shape shapes[] = {
    {"small", 2, 256, 384, 0},
    {"edges", 3, 272, 208, 0}, /* 2 x 128 + 16 rows, 128 + 80 columns */
    {"w1/w3", 8, 14336, 4096, 4},
    {"w2", 8, 4096, 14336, 2},
};

typedef struct {
    int64_t E, O, I, n, S;  /* the weight [E, O, I], n = E O I elements, S scales */
    float *w, *g, *w0, *wr; /* [n]: master (worked on), gradient, before, after (two passes) */
    uint16_t *m, *v, *m0, *v0, *mr, *vr; /* [n] bf16 moments: worked on, before, after */
    uint8_t *q, *qr;                     /* [2 n]: q [E, O, I] then qt [E, I, O]; the two passes' */
    float *s, *sr;    /* [S]: the tile scales of q, then of qt; the two passes' */
    uint8_t *scratch; /* [22 n] for the copy (timed shapes) */
} bufs;

__device__ __forceinline__ unsigned mix(int64_t i, unsigned seed) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    return h;
}
/* The state before the step, w, g [n] fp32 and m, v [n] bf16 codes, from a hash of (i, seed):
 * the data of the banner comment. */
__global__ void k_fill(float *w, float *g, uint16_t *m, uint16_t *v, int64_t n, unsigned seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const unsigned a = mix(i, seed), b = mix(i, seed ^ 0x9e3779b9u), c = mix(i, ~seed);
        float wi = ((a >> 8) & 0xffff) / 65536.0f * 0.1f - 0.05f;
        if ((a & 0xffff) == 0) wi *= 1000.0f;
        if ((b & 63) == 0) wi = 0.0f;
        float gi = ((b >> 8) & 0xffff) / 65536.0f * 0.02f - 0.01f;
        if ((c & 63) == 0) gi = 0.0f;
        if ((c >> 6 & 4095) == 0) gi = moe_f32_from_bits(c >> 31 ? 0xffc00001u : 0x7fc00000u);
        const float u = ((c >> 12) & 0xfff) / 4096.0f;
        w[i] = wi, g[i] = gi;
        m[i] = moe_f32_to_bf16(gi * (u - 0.5f)), v[i] = moe_f32_to_bf16(gi * gi * u);
    }
}

/* Zeros tile (e, rb, kb) of an [E, O, I] array of es-byte elements. */
static void zero_tile(void *p, size_t es, const bufs *d, int64_t e, int64_t rb, int64_t kb) {
    const int64_t rows = d->O - rb * QB < QB ? d->O - rb * QB : QB;
    const int64_t cols = d->I - kb * QB < QB ? d->I - kb * QB : QB;
    CK(cudaMemset2D((uint8_t *)p + ((e * d->O + rb * QB) * d->I + kb * QB) * es, d->I * es, 0,
                    cols * es, rows));
}

/* d: the buffers of shape sh, the state before the step from the seed (k_fill, then the first
 * and the last tile zero in all four arrays); state_free releases them. */
static void state_new(bufs *d, const shape *sh, unsigned seed) {
    d->E = sh->E, d->O = sh->O, d->I = sh->I, d->n = sh->E * sh->O * sh->I;
    d->S = moe_fp8_weight_scales(sh->E, sh->O, sh->I);
    const size_t n = (size_t)d->n;
    CK(cudaMalloc(&d->w, 16 * n)); /* w, g, w0, wr */
    d->g = d->w + n, d->w0 = d->g + n, d->wr = d->w0 + n;
    CK(cudaMalloc(&d->m, 12 * n)); /* m, v, m0, v0, mr, vr */
    d->v = d->m + n, d->m0 = d->v + n, d->v0 = d->m0 + n, d->mr = d->v0 + n, d->vr = d->mr + n;
    CK(cudaMalloc(&d->q, 4 * n));
    d->qr = d->q + 2 * n;
    CK(cudaMalloc(&d->s, 8 * (size_t)d->S));
    d->sr = d->s + d->S;
    d->scratch = NULL;
    if (sh->per_step) CK(cudaMalloc(&d->scratch, 22 * n));
    k_fill<<<4 * num_sms, 256>>>(d->w0, d->g, d->m0, d->v0, d->n, seed);
    CK(cudaGetLastError());
    const int64_t RB = (d->O + QB - 1) / QB, KB = (d->I + QB - 1) / QB;
    for (int z = 0; z < 2; z++) {
        const int64_t e = z ? d->E - 1 : 0, rb = z ? RB - 1 : 0, kb = z ? KB - 1 : 0;
        zero_tile(d->w0, 4, d, e, rb, kb), zero_tile(d->g, 4, d, e, rb, kb);
        zero_tile(d->m0, 2, d, e, rb, kb), zero_tile(d->v0, 2, d, e, rb, kb);
    }
}
static void state_free(bufs *d) {
    void *p[5] = {d->w, d->m, d->q, d->s, d->scratch};
    for (int i = 0; i < 5; i++)
        if (p[i]) CK(cudaFree(p[i]));
}

/* Operation op on the state in d: the copy, the production passes, or a fused variant. */
static void launch(int op, const bufs *d, const adamw_hp &h, int pow2) {
    const int64_t n = d->n, tiles = d->E * ((d->O + QB - 1) / QB) * ((d->I + QB - 1) / QB);
    if (op == OP_COPY) {
        CK(cudaMemcpyAsync(d->scratch, d->scratch + 11 * n, (size_t)(11 * n),
                           cudaMemcpyDeviceToDevice));
        return;
    }
    if (op == OP_ADAMW || op == OP_TWO)
        k_adamw_vec4<<<moe_cuda_grid_flat(n / 4, 128), 128>>>(
            (float4 *)d->w, (const float4 *)d->g, (uint2 *)d->m, (uint2 *)d->v, n / 4, h);
    if (op == OP_QUANT || op == OP_TWO) {
        static moe_cuda_ctx c; /* zero: stream 0, no error recorded */
        static moe_backend be;
        be.ctx = &c;
        moe_cuda_quantize_weight(&be, d->q, d->s, d->w, d->E, d->O, d->I,
                                 pow2 ? MOE_RECIPE_FP8_BLOCK_POW2 : MOE_RECIPE_FP8_BLOCK);
    }
    if (op >= OP_FUSED) {
        const int k = op - OP_FUSED;
        const int64_t cap = (int64_t)num_sms * fused[k].per_sm;
        fused[k].fn<<<(unsigned)(tiles < cap ? tiles : cap), fused[k].threads, fused[k].smem>>>(
            d->w, d->g, d->m, d->v, d->q, d->q + n, d->s,
            d->s + d->E * moe_fp8_tile_scales(d->O, d->I), d->E, d->O, d->I, h, pow2);
    }
    CK(cudaGetLastError());
}

/* The state before the step back in place, the outputs prefilled with 0xa5. */
static void restore(const bufs *d) {
    CK(cudaMemcpy(d->w, d->w0, sizeof(float) * d->n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->m, d->m0, 2 * d->n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->v, d->v0, 2 * d->n, cudaMemcpyDeviceToDevice));
    CK(cudaMemset(d->q, 0xa5, 2 * d->n));
    CK(cudaMemset(d->s, 0xa5, sizeof(float) * d->S));
}

/* The first output array where the worked-on state differs from the two passes', as "m byte
 * 123" into at; 0 when none does. */
static int differs(const bufs *d, unsigned long long *d_first, char *at, size_t cap) {
    const char *name[5] = {"w", "m", "v", "q/qt", "s/st"};
    const void *a[5] = {d->w, d->m, d->v, d->q, d->s}, *b[5] = {d->wr, d->mr, d->vr, d->qr, d->sr};
    const int64_t bytes[5] = {4 * d->n, 2 * d->n, 2 * d->n, 2 * d->n, 4 * d->S};
    for (int i = 0; i < 5; i++) {
        const long long j = pg_first_diff(a[i], b[i], (size_t)bytes[i], d_first, num_sms);
        if (j < 0) continue;
        snprintf(at, cap, "%s byte %lld", name[i], j);
        return 1;
    }
    return 0;
}

/* Elements where the two passes' AdamW differs from the CPU backend's (moe_cpu_adamw: C11, every
 * operation rounded on its own - volatile stores keep this compiler from contracting; a NaN
 * matches any NaN, the GPU's being canonical); the first is printed. */
static float rnd(float x) {
    volatile float y = x;
    return y;
}
static int64_t check_adamw_cpu(const bufs *d, const adamw_hp &h) {
    const int64_t n = d->n;
    float *f = (float *)malloc(12 * n);      /* w0, g, wr */
    uint16_t *u = (uint16_t *)malloc(8 * n); /* m0, v0, mr, vr */
    const void *src[7] = {d->w0, d->g, d->wr, d->m0, d->v0, d->mr, d->vr};
    for (int i = 0; i < 7; i++)
        CK(cudaMemcpy(i < 3 ? (void *)(f + i * n) : (void *)(u + (i - 3) * n), src[i],
                      (i < 3 ? 4 : 2) * n, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float w = f[i], gs = rnd(f[n + i] * h.grad_scale);
        const float m = moe_round_bf16(
            rnd(rnd(h.beta1 * moe_bf16_to_f32(u[i])) + rnd(rnd(1.0f - h.beta1) * gs)));
        const float v = moe_round_bf16(rnd(rnd(h.beta2 * moe_bf16_to_f32(u[n + i])) +
                                           rnd(rnd(rnd(1.0f - h.beta2) * gs) * gs)));
        const float upd = rnd(rnd(m / h.bc1) / rnd(sqrtf(rnd(v / h.bc2)) + h.eps));
        const float want[3] = {rnd(w - rnd(h.lr * rnd(upd + rnd(h.wd * w)))), m, v};
        const float got[3] = {f[2 * n + i], moe_bf16_to_f32(u[2 * n + i]),
                              moe_bf16_to_f32(u[3 * n + i])};
        for (int j = 0; j < 3; j++) {
            if (moe_f32_bits(want[j]) == moe_f32_bits(got[j]) ||
                (want[j] != want[j] && got[j] != got[j]))
                continue;
            if (bad++ == 0)
                printf("      first difference: element %lld, %s: CPU %08x GPU %08x\n",
                       (long long)i, j ? j == 1 ? "m" : "v" : "w", moe_f32_bits(want[j]),
                       moe_f32_bits(got[j]));
            break;
        }
    }
    free(f), free(u);
    return bad;
}

/* Bytes operation op moves on d's shape (the copy: the fused pass's, without the scales). */
static double op_bytes(int op, const bufs *d) {
    const double n = (double)d->n, sc = 4.0 * d->S;
    const double per[OP_FUSED] = {22 * n, 20 * n, 6 * n + sc, 26 * n + sc};
    return op < OP_FUSED ? per[op] : 22 * n + sc;
}

/* The two passes onto the state before the step as the reference, then every variant that can
 * run against it byte for byte (and, once, the reference's AdamW against the CPU's); var_ok[k]
 * cleared on a difference. Returns the number of FAILs. */
static int check_rule(const bufs *d, const shape *sh, const adamw_hp &h, int pow2, int *var_ok,
                      unsigned long long *d_first) {
    const char *rule = pow2 ? "pow2" : "amax/448";
    int fails = 0;
    restore(d);
    launch(OP_TWO, d, h, pow2);
    CK(cudaMemcpy(d->wr, d->w, 4 * d->n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->mr, d->m, 4 * d->n, cudaMemcpyDeviceToDevice)); /* m, v -> mr, vr */
    CK(cudaMemcpy(d->qr, d->q, 2 * d->n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->sr, d->s, 4 * d->S, cudaMemcpyDeviceToDevice));
    if (!sh->per_step && !pow2) {
        const int64_t bad = check_adamw_cpu(d, h);
        printf("  %-9s two passes' AdamW against the CPU's bits: %lld elements differ  %s\n", rule,
               (long long)bad, bad ? "FAIL" : "ok");
        fails += bad != 0;
    }
    for (int k = 0; k < NFUSED; k++) {
        char at[64] = "";
        if (!fused[k].per_sm) continue;
        restore(d);
        launch(OP_FUSED + k, d, h, pow2);
        const int bad = differs(d, d_first, at, sizeof at);
        printf("  %-9s %-16s %s%s  %s\n", rule, fused[k].name,
               bad ? "differs from the two passes at " : "the two passes' bytes", at,
               bad ? "FAIL" : "ok");
        var_ok[k] &= !bad, fails += bad;
    }
    return fails;
}

/* Times the copy, the production passes and the variants with var_ok on d's state (plain rule;
 * 3 warm-up rounds, median of 21, taking turns, each round behind an untimed memset long enough
 * for the host to queue the round, the L2 cold), prints them, and adds per_step times each to
 * step_ms (ops not timed get -1e30, so the step shows them as missing). */
static void time_shape(const bufs *d, const shape *sh, const adamw_hp &h, const int *var_ok,
                       float *step_ms) {
    int on[NOP];
    float ms[NOP];
    for (int op = 0; op < NOP; op++)
        on[op] = op < OP_FUSED || var_ok[op - OP_FUSED];
    restore(d);
    pg_time_turns(
        NOP, on, 3, 21,
        [&](int r) { CK(cudaMemsetAsync(d->scratch, r & 0xff, (size_t)(11 * d->n))); },
        [&](int op) { launch(op, d, h, 0); }, ms);
    printf("  median of 21, taking turns:   %9s %9s %9s %8s\n", "GB moved", "ms", "GB/s",
           "of copy");
    for (int op = 0; op < NOP; op++) {
        step_ms[op] += on[op] ? sh->per_step * ms[op] : -1e30f;
        if (!on[op]) continue;
        const double b = op_bytes(op, d), copy = op_bytes(OP_COPY, d) / ms[OP_COPY];
        printf("  %-30s %9.2f %9.3f %9.0f %7.1f%%\n",
               op < OP_FUSED ? op_name[op] : fused[op - OP_FUSED].name, b / 1e9, ms[op],
               b / ms[op] / 1e6, 100.0 * (b / ms[op]) / copy);
    }
}

int main(void) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    num_sms = prop.multiProcessorCount;
    printf("adamw_fp8: %s, %d SMs, %.0f GB\n", prop.name, num_sms, prop.totalGlobalMem / 1e9);
    int fails = 0, var_ok[NFUSED];
    for (int k = 0; k < NFUSED; k++) {
        const void *fn = (const void *)fused[k].fn;
        cudaFuncAttributes fa;
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, fused[k].smem));
        CK(cudaFuncGetAttributes(&fa, fn));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fused[k].per_sm, fn, fused[k].threads,
                                                         fused[k].smem));
        var_ok[k] = fused[k].per_sm > 0, fails += !var_ok[k];
        printf("  %-16s %3d registers, %zu bytes local, %d bytes shared, %d blocks of %d a SM%s\n",
               fused[k].name, fa.numRegs, fa.localSizeBytes, fused[k].smem, fused[k].per_sm,
               fused[k].threads, var_ok[k] ? "" : "  FAIL");
    }
    adamw_hp h;
    const double step = 7;
    h.lr = 3e-4f, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1e-8f, h.wd = 0.1f, h.grad_scale = 0.5f;
    h.bc1 = (float)(1.0 - pow((double)h.beta1, step)); /* as moe_cuda_adamw */
    h.bc2 = (float)(1.0 - pow((double)h.beta2, step));
    unsigned long long *d_first;
    CK(cudaMalloc(&d_first, sizeof *d_first));
    float step_ms[NOP] = {0};
    double step_n = 0, step_sc = 0; /* the step's elements and scale bytes */
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        const shape *sh = &shapes[si];
        bufs d;
        state_new(&d, sh, 0x5eed0000u + (unsigned)si);
        printf("\n%s [%lld, %lld, %lld]: %.1f M elements\n", sh->name, (long long)d.E,
               (long long)d.O, (long long)d.I, d.n / 1e6);
        for (int pow2 = 0; pow2 < 2; pow2++)
            fails += check_rule(&d, sh, h, pow2, var_ok, d_first);
        if (sh->per_step) {
            time_shape(&d, sh, h, var_ok, step_ms);
            step_n += sh->per_step * (double)d.n, step_sc += sh->per_step * 4.0 * d.S;
        }
        state_free(&d);
    }
    /* the step: 2 layers x (w1, w3 [8, 14336, 4096], w2 [8, 4096, 14336]) */
    const double copy_gbs = 22 * step_n / step_ms[OP_COPY] / 1e6;
    const double two_gbs = (26 * step_n + step_sc) / step_ms[OP_TWO] / 1e6;
    printf("\nthe step's expert weights (2 layers x 3 matrices, %.2f G elements):\n", step_n / 1e9);
    for (int k = 0; k < NFUSED; k++) {
        const float ms = step_ms[OP_FUSED + k];
        const double gbs = (22 * step_n + step_sc) / ms / 1e6;
        if (ms > 0)
            printf("adamw_fp8 %-16s %7.2f ms, %5.0f GB/s, %5.1f%% of copy (%4.0f GB/s); two "
                   "passes %7.2f ms, %5.0f GB/s: %+.2f ms\n",
                   fused[k].name, ms, gbs, 100.0 * gbs / copy_gbs, copy_gbs, step_ms[OP_TWO],
                   two_gbs, ms - step_ms[OP_TWO]);
        else
            printf("adamw_fp8 %-16s not timed (FAIL above)\n", fused[k].name);
    }
    CK(cudaFree(d_first));
    printf("%s\n", fails ? "adamw_fp8: FAIL" : "adamw_fp8: all checks passed");
    return fails ? 1 : 0;
}
