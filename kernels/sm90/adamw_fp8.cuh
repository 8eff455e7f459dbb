/* adamw_fp8.cuh: the fp8-block optimizer step in one pass over a weight (issue 14) - AdamW on
 * the fp32 master w with bf16 moments m, v, and the weight's two e4m3 copies of the new values
 * with their 128 x 128 tile scales (moe/ops.h's adamw_quantize_weight): 22 bytes a weight
 * element where AdamW then quantize_weight move 26. Launched by sm90/adamw_fp8.cu for the CUDA
 * backend and timed by bench/kernels/adamw_fp8.cu (where it was written as ring<NST>, beside
 * the designs that lost and the two passes).
 *
 * The design (ring): one block of 544 threads a SM, persistent over the tiles (columns
 * fastest). A producer warp streams each tile as 8 stages of 16 rows of w, g, m, v (24 KB in
 * 64 1-D bulk copies) into a ring of NST stages in shared memory, running ahead across tiles;
 * 16 consumer warps hold k_fp8_tiles's 4 x 4 patches, update them from the ring with
 * adamw.cuh's arithmetic (the flat kernel's and the CPU's bits), store w, m, v, and after the
 * tile's amax barrier write both copies with k_fp8_tiles's output stage (quant_fp8.cuh: the
 * same bytes). The one thing a reader must know: the loads never wait for the
 * arithmetic, the barrier or the stores - the first one-pass kernel (025b5f4) loaded, computed
 * and stored by turns and ran at 1,550 GB/s on an H100 against the two passes' 2,876.
 *
 * NOT RUN ON A GPU YET (written 2026-12-05): predicted 2.6-2.8 TB/s for NST 8 on an H100
 * (bench/kernels/adamw_fp8.cu's header says why). */
#ifndef MOE_KERNELS_SM90_ADAMW_FP8_CUH
#define MOE_KERNELS_SM90_ADAMW_FP8_CUH

#include "../adamw.cuh"
#include "../quant_fp8.cuh"
#include "wgmma.cuh" /* mbarriers (fa3_bar_*), 1-D bulk copies (fa3_bulk), smem_u32 */

/* ---- a tile's scale, persistent over tiles (its copies: quant_fp8.cuh's tile_patch_out and
 * tile_qt_out, k_fp8_tiles's output stage) ---- */

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

/* ---- ring<NST>: bulk copies into a ring of stages, warp-specialized ---- */

#define RING_THREADS 544                   /* 16 consumer warps, then the producer warp */
#define STAGE_ROWS 16                      /* a tile is 8 stages */
#define STAGE_BYTES (STAGE_ROWS * QB * 12) /* w, g [16][128] fp32, then m, v [16][128] bf16 */
#define RING_SMEM(nst) ((nst)*STAGE_BYTES + QB * QB + 64 + 16 * (nst)) /* + tt, sh, barriers */

/* w, g [E, R, K] fp32 and m, v [E, R, K] bf16 codes: one AdamW step in place (adamw.cuh's
 * arithmetic, the flat kernel's bits); q [E, R, K] and qt [E, K, R] e4m3 with scales s [E, RB *
 * KB4] and st [E, KB * RB4]: quantize_weight's copies of the new w (k_fp8_tiles's bytes). R, K
 * multiples of 16, every array 16-byte aligned; RING_THREADS threads, RING_SMEM(NST) bytes of
 * dynamic shared memory, at most one block a tile (a grid of min(tiles, SMs)). Stage n of the
 * block's walk (tile it, stage n % 8) sits in slot n % NST; full[slot] completes on its bytes,
 * empty[slot] on its 4 consumer warps' releases. */
template <int NST>
__global__ void __launch_bounds__(RING_THREADS, 1)
    k_adamw_fp8_ring(float *__restrict__ w, const float *__restrict__ g, uint16_t *__restrict__ m,
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
                    fa3_bulk(d + ri * QB * 4, w + at, (uint32_t)kc * 4, bar);
                    fa3_bulk(d + (16 + ri) * QB * 4, g + at, (uint32_t)kc * 4, bar);
                } else {
                    fa3_bulk(d + 16384 + ri * QB * 2, m + at, (uint32_t)kc * 2, bar);
                    fa3_bulk(d + 20480 + ri * QB * 2, v + at, (uint32_t)kc * 2, bar);
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
                float4 mm = adamw_bf16::of4(((const uint2 *)(d + 16384))[rs * 32 + tx]),
                       vv = adamw_bf16::of4(((const uint2 *)(d + 20480))[rs * 32 + tx]);
                adamw4<adamw_bf16>(x[pp][i], ((const float4 *)d)[(16 + rs) * 32 + tx], mm, vv, h);
                __stcs((float4 *)(w + at), x[pp][i]);
                __stcs((uint2 *)(m + at), adamw_bf16::codes4(mm));
                __stcs((uint2 *)(v + at), adamw_bf16::codes4(vv));
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

#endif
