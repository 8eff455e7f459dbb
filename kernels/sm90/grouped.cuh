/* grouped.cuh: what the grouped expert products of kernels/sm90/ share with their
 * playgrounds (bench/kernels/grouped_gemm.cu, grouped_fp8.cu): the TMA copies, the wgmma
 * accumulator operand lists, the tile list and walk (the scheduler: tiles expert by expert,
 * n-tile by n-tile, m-tile fastest, built in shared memory from the row offsets), the
 * producer's stage ring and the stores of a warpgroup's accumulators.
 *
 * The one thing a reader must know: a block is two consumer warpgroups and a producer, one
 * thread of which fills stage it % NS of the ring for the it-th K step of the block's walk
 * (tiles t = blockIdx.x, + gridDim.x, ...), waiting on the stage's empty mbarrier for the
 * readers of its previous use; consumers walk the same tiles and wait on the full mbarrier
 * with parity (it / NS) & 1. Rows of a tile past its expert's end (rend) belong to the next
 * expert: they are multiplied, never stored. */
#ifndef MOE_KERNELS_SM90_GROUPED_CUH
#define MOE_KERNELS_SM90_GROUPED_CUH

#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define GG_MAXE MOE_CUDA_GROUPED_MAXE /* experts the tile list holds */

/* one TMA box of a 2D map at (col, row) (col: elements along the contiguous dim) into dst,
 * completing on bar */
__device__ __forceinline__ void gg_tma(uint32_t dst, const CUtensorMap *map, int col, int row,
                                       uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}
/* the same for a 3D map at (col, row, c2) */
__device__ __forceinline__ void gg_tma3(uint32_t dst, const CUtensorMap *map, int col, int row,
                                        int c2, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(c2), "r"(bar)
                 : "memory");
}

/* The tile list of bm x bn tiles (thread 0): s_off [E + 1] the row offsets, s_pref [E + 1]
 * the number of the first tile of each expert (s_pref[E] tiles in all) */
__device__ __forceinline__ void gg_list(const int32_t *off, int E, int N, int bm, int bn,
                                        int *s_off, int *s_pref) {
    const int NT = (N + bn - 1) / bn;
    s_pref[0] = 0;
    for (int e = 0; e < E; e++) {
        s_off[e] = off[e];
        s_pref[e + 1] = s_pref[e] + (off[e + 1] - off[e] + bm - 1) / bm * NT;
    }
    s_off[E] = off[E];
}
/* The expert of tile t of a list whose experts' first tiles are pref [E + 1] (pref[E] tiles
 * in all); -1 past the end. */
__device__ __forceinline__ int gg_tile_expert(const int *pref, int E, int t) {
    if (t >= pref[E]) return -1;
    int e = 0;
    while (pref[e + 1] <= t)
        e++;
    return e;
}
/* Tile t of the list: expert e, first row r0 (global), the expert's end rend, first column
 * n0; 0 past the end. */
struct gg_tile {
    int e, r0, rend, n0;
};
__device__ __forceinline__ int gg_find(const int *pref, const int *off, int E, int t, int bm,
                                       int bn, gg_tile *tl) {
    const int e = gg_tile_expert(pref, E, t);
    if (e < 0) return 0;
    const int mt_e = (off[e + 1] - off[e] + bm - 1) / bm, local = t - pref[e];
    tl->e = e;
    tl->r0 = off[e] + (local % mt_e) * bm;
    tl->rend = off[e + 1];
    tl->n0 = (local / mt_e) * bn;
    return 1;
}

/* The stage ring's barriers (thread 0, before the block's barrier): ns full ones (one arrival,
 * the producer's expect_tx) and ns empty ones (`readers` arrivals: the threads that read a
 * stage). */
__device__ __forceinline__ void gg_ring_init(uint32_t bfull, uint32_t bempty, int ns, int readers) {
    for (int s = 0; s < ns; s++) {
        fa3_bar_init(bfull + 8 * s, 1);
        fa3_bar_init(bempty + 8 * s, readers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* The producer's walk (one thread): for the K steps kb < KB of each tile of the block's walk,
 * stage s = it % NS once the readers of its previous use have released it: `bytes` expected on
 * its full barrier bar, then load(tile, kb, s, bar) issues the copies that land them. */
template <int BM, int BN, int NS, typename L>
__device__ __forceinline__ void gg_produce_walk(const int *s_pref, const int *s_off, int E, int KB,
                                                uint32_t bytes, uint32_t bfull, uint32_t bempty,
                                                L load) {
    gg_tile tl;
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, t, BM, BN, &tl); t += gridDim.x)
        for (int kb = 0; kb < KB; kb++, it++) {
            const int s = it % NS;
            if (it >= NS) fa3_bar_wait(bempty + 8 * s, ((it / NS) - 1) & 1);
            fa3_bar_expect(bfull + 8 * s, bytes);
            load(tl, kb, s, bfull + 8 * s);
        }
}

/* The epilogue of one warpgroup's accumulator block acc [64 rows, 128 columns] whose first
 * row is r and first column c in y [M, N]: thread rows r + warp * 16 + g and + 8, columns
 * nt * 8 + 2 tq (+1), as bf16; rows from rend (the expert's end) and columns from N are
 * left alone. */
__device__ __forceinline__ void gg_store(bf16 *y, const float (&acc)[16][4], int r, int rend, int c,
                                         int N) {
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    r += warp * 16 + (lane >> 2);
    c += 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
        const int col = c + nt * 8;
        if (col >= N) continue;
        if (r < rend) fa_st2(y + (int64_t)r * N + col, acc[nt][0], acc[nt][1]);
        if (r + 8 < rend) fa_st2(y + (int64_t)(r + 8) * N + col, acc[nt][2], acc[nt][3]);
    }
}

/* gg_store through shared memory, for bf16 (written) and fp32 (written, or added with beta 1)
 * outputs: st is this warpgroup's buffer (GG_ST_WG bytes, 16-byte aligned) and bar its named
 * barrier (128 threads). The block goes out in passes of 128 bytes of each row (64 bf16 or 32
 * fp32 columns): written into st in the accumulator's layout (a row every P bytes, P chosen so
 * that a warp's stores meet every bank once: stmatrix's 16-byte rows of 8 rows at 144, 8-byte
 * stores of 4 rows a half-warp at 160), then read back 16 bytes a thread and stored as whole
 * 128-byte row segments, 8 threads a row, where gg_store's 4- or 8-byte stores touch 8 rows an
 * instruction. y 16-byte aligned, N a multiple of 8; rows from rend and columns from N are left
 * alone. */
#define GG_ST_WG (64 * 160)
template <typename T>
__device__ __forceinline__ void gg_store_staged(T *y, const float (&acc)[16][4], int r, int rend,
                                                int c, int N, int beta, uint32_t st, int bar) {
    constexpr int B2 = sizeof(T) == 2, P = B2 ? 144 : 160, CP = 128 / sizeof(T), NT = CP / 8;
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    /* this lane's first store: bf16, its row of 8 columns in stmatrix's four 8 x 8 blocks (block
     * lane / 8: rows 0-7, then 8-15 of the warp's 16, then the same of the next 8 columns; row
     * lane % 8); fp32, its accumulator rows' 2 columns */
    const uint32_t w0 =
        B2 ? st + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * P + 16 * (lane >> 4)
           : st + (warp * 16 + (lane >> 2)) * P + 8 * (lane & 3);
#pragma unroll
    for (int pass = 0; pass < 128 / CP; pass++) {
        /* the reads of the last pass (or the last tile's) are done */
        asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
#pragma unroll
        for (int j = 0; j < NT; j += 1 + B2) {
            const float *a = acc[NT * pass + j];
            if constexpr (B2) { /* columns 8 j .. 8 j + 15 of the warp's 16 rows: one stmatrix
                                   where four 4-byte stores a lane each took a slot of the
                                   shared-memory queue (ncu: the epilogue's first stall) */
                const float *b = acc[NT * pass + j + 1];
                asm volatile(
                    "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                        w0 + 16 * j),
                    "r"(pack_bf16(a[0], a[1])), "r"(pack_bf16(a[2], a[3])),
                    "r"(pack_bf16(b[0], b[1])), "r"(pack_bf16(b[2], b[3]))
                    : "memory");
            } else {
                const uint32_t w = w0 + 32 * j; /* 32 bytes an 8-column block */
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(w), "f"(a[0]), "f"(a[1])
                             : "memory");
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(w + 8 * P), "f"(a[2]),
                             "f"(a[3])
                             : "memory");
            }
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int q = t + 128 * i, row = q >> 3, ch = q & 7;
            const int col = c + CP * pass + ch * (CP / 8);
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(st + row * P + 16 * ch)
                         : "memory");
            if (r + row >= rend || col >= N) continue;
            uint4 *p = reinterpret_cast<uint4 *>(y + (int64_t)(r + row) * N + col);
            if constexpr (!B2)
                if (beta) {
                    const float4 o = *reinterpret_cast<const float4 *>(p);
                    v.x = __float_as_uint(__uint_as_float(v.x) + o.x);
                    v.y = __float_as_uint(__uint_as_float(v.y) + o.y);
                    v.z = __float_as_uint(__uint_as_float(v.z) + o.z);
                    v.w = __float_as_uint(__uint_as_float(v.w) + o.w);
                }
            *p = v;
        }
    }
}

/* The fp32 epilogue (the backward's): as gg_store into y [rows, N] as float2, written (beta
 * 0) or added (beta 1: every load of the block is issued before its first store). */
__device__ __forceinline__ void gg_store(float *y, float (&acc)[16][4], int r, int rend, int c,
                                         int N, int beta) {
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    r += warp * 16 + (lane >> 2);
    c += 2 * (lane & 3);
    float *y0 = y + (int64_t)r * N, *y1 = y0 + (int64_t)8 * N;
    if (beta) {
#pragma unroll
        for (int nt = 0; nt < 16; nt++) {
            const int col = c + nt * 8;
            if (col >= N) continue;
            if (r < rend) {
                const float2 v = *reinterpret_cast<const float2 *>(y0 + col);
                acc[nt][0] += v.x;
                acc[nt][1] += v.y;
            }
            if (r + 8 < rend) {
                const float2 v = *reinterpret_cast<const float2 *>(y1 + col);
                acc[nt][2] += v.x;
                acc[nt][3] += v.y;
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
        const int col = c + nt * 8;
        if (col >= N) continue;
        if (r < rend) fa_st2(y0 + col, acc[nt][0], acc[nt][1]);
        if (r + 8 < rend) fa_st2(y1 + col, acc[nt][2], acc[nt][3]);
    }
}

/* The row offsets of a grouped product's experts, passed by value (a kernel parameter: no
 * device buffer, no copy to order): offsets[e] .. offsets[e + 1] are expert e's rows. */
typedef struct {
    int32_t o[GG_MAXE + 1];
} gg_offsets;

#endif
