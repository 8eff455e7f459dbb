/* grouped_gemm.cu: a playground for issue 12's grouped expert product - one persistent launch
 * over all experts, the experts' row offsets read on the device (no host synchronisation, no
 * plan per row count) - against cuBLASLt called once per expert (kernels/gemm_cublaslt.cu's
 * way, both with a plan made for each call, as when the row counts changed since the last
 * step, and with cached plans), on the mixtral8x7b-2L expert shapes with even and uneven
 * counts; it also prints the host time of one plan (descriptor, layouts, heuristic query).
 *
 * Status: the cooperative form was written without a GPU on 2026-12-01 and first ran on an
 * H200 on 2026-12-02 (07:58 UTC): the check passed on every case (NMSE 0 to 7.9e-11 against
 * cuBLASLt, every element written) at 622-734 TFLOP/s on the 16,384-row products (15:5x UTC:
 * 641-642 w1, 718-737 w2), against 746-828 for cuBLASLt per expert. A B-multicast form over
 * 2-CTA clusters ran correct and much slower (355-418) and was dropped (git show
 * 4d85b94:bench/kernels/grouped_gemm.cu). The two ping-pong forms were written without a GPU
 * on 2026-12-04 and have not run yet. Each form checks its own output against cuBLASLt before
 * it is timed; a failed check prints FAILED and no rate (the kernel is wrong, not the rate).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include -Ilibcore/src -Ikernels \
 *       bench/kernels/grouped_gemm.cu -lcublasLt -o /tmp/grouped_gemm && timeout 300 /tmp/grouped_gemm
 *
 * (-Xptxas -v prints each kernel's registers and spills. The output is line-buffered, so a
 * kernel that hangs, which the timeout ends, still leaves every line printed before it.)
 *
 * The product (forward of w1/w3 and w2): Y[r, :] = X[r, :] W_e^T for the rows r in
 * [off[e], off[e + 1]) of expert e; X [M, K] and W [E, N, K] bf16, both K-contiguous, Y [M, N]
 * bf16, fp32 accumulation. Every form: a block of two consumer warpgroups and a producer warp
 * whose lane 0 streams the A tile [rows][64] and the B tile [columns][64] of each K step into
 * stages by TMA (the 128-byte swizzle of kernels/sm90/wgmma.cuh; full/empty mbarriers as the
 * attention kernels). Each block walks the tiles t = blockIdx.x, + gridDim.x, ... of the list
 * expert by expert, n-tile by n-tile, m-tile fastest (so neighbouring blocks share a weight tile
 * in L2), built in shared memory from the device offsets. Rows of the next expert that a tile
 * reads are multiplied but never stored; the consumers keep one wgmma group in flight
 * (wait_group 1) and release a stage when the group that read it has completed.
 *
 * Cooperative (k_grouped): both warpgroups on one 128 x 256 tile, 64 rows each (wgmma
 * m64n128k16 twice per 16 columns of K), 4 stages of 48 KB. At the end of a tile both drain
 * their products and store their rows while the tensor cores wait for the next tile.
 *
 * Ping-pong (k_grouped_pp<MI>, the design of CUTLASS's KernelTmaWarpSpecializedPingpong): each
 * warpgroup computes whole tiles of its own, the block's tiles alternately (warpgroup 0 its
 * tiles 0, 2, 4, ..., warpgroup 1 tiles 1, 3, ...); the producer streams the stages in tile
 * order, so their owners alternate. An ordering barrier (named barriers 1 and 2, the attention
 * forward's turns) makes the mainloops alternate: a warpgroup passes the turn as soon as its
 * tile's last products are issued, so the other's products follow them on the tensor cores,
 * while the first drains, converts and stores its tile and then waits for its next turn: the
 * store overlaps the other's mainloop instead of stalling the tensor cores. A warpgroup's tile
 * is bounded by its fp32 accumulator (a 128 x 256 tile would need 256 registers a thread);
 * the two tiles of 128 registers a thread are built and timed, because they trade two costs:
 *   MI 1: 64 x 256, one m64n256k16 per 16 columns of K (A read from shared memory once);
 *         40 KB of operands a K step of 2.1 MFLOP (1.67x the cooperative form's bytes per
 *         flop, 48 KB a 4.2-MFLOP step), 5 stages;
 *   MI 2: 128 x 128, two m64n128k16 sharing B (CUTLASS's bf16 ping-pong tile); 32 KB a K step
 *         (1.33x), 7 stages (224 KB).
 * Registers: 288 threads and one block a SM leave 224 registers a thread, more than the 128
 * accumulators and the addressing need, so there is no setmaxnreg split (it takes whole
 * warpgroups, and the producer is one warp).
 *
 * Prediction (2026-12-04, not measured): the cooperative form ran 641 TFLOP/s at K = 4096 (w1)
 * and about 727 at K = 14336 (w2). A cost a tile that does not grow with K, beside a mainloop
 * that does, fits both: the mainloop runs at 768 TFLOP/s and is 83% of a tile's time at
 * K = 4096 (46 us for a 128 x 256 tile: 268 MFLOP at 768 / 132 TFLOP/s a SM) and 95% at
 * K = 14336; the other 9 us a tile are the drain of the products, the store of 64 KB as 4-byte
 * stores (all 132 SMs at once: the blocks keep in step) and the restart. The ping-pong forms
 * run a warpgroup's drain and 32 KB store under the other's mainloop (23 us at K = 4096), so at
 * the same mainloop rate w1 reaches about 760 TFLOP/s (+19%) and w2 about 765 (+5%), within
 * cuBLASLt's 746-828. The risk is the operand bytes from L2: at 700 TFLOP/s the cooperative
 * form streams 8.0 TB/s of tiles into shared memory, 128 x 128 streams 10.7 and 64 x 256 13.4;
 * where that binds, 128 x 128 gains less and 64 x 256 can fall below the cooperative form.
 * Expected: 128 x 128 >= 64 x 256 > cooperative at K = 4096, the three within a few percent
 * at K = 14336. */
#include <chrono>
#include <vector>

#include "playground.cuh"
#include "sm90/wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define GG_BK 64 /* K per stage: one 128-byte swizzled column block */
#define GG_MAXE 128
#define GG_THREADS 288 /* two consumer warpgroups and the producer warp */
/* the cooperative form: 128 x 256 tiles (64 rows a warpgroup), GG_NS stages */
#define GG_BM 128
#define GG_BN 256
#define GG_NS 4
#define GG_A_BYTES (GG_BM * GG_BK * 2)
#define GG_B_BYTES (GG_BN * GG_BK * 2)
/* the ping-pong form: a warpgroup's tile PP_BM x PP_BN (MI 1: 64 x 256, MI 2: 128 x 128), as
 * many stages as fit in 224 KB (the block's limit is 227 KB with the tile list and barriers) */
#define PP_BM(MI) (64 * (MI))
#define PP_BN(MI) (256 / (MI))
#define PP_STAGE_BYTES(MI) ((PP_BM(MI) + PP_BN(MI)) * GG_BK * 2)
#define PP_NS(MI) ((224 << 10) / PP_STAGE_BYTES(MI))

/* one TMA box {64 columns, rows} of a 2D map at (col, row) into dst, completing on bar */
__device__ __forceinline__ void gg_tma(uint32_t dst, const CUtensorMap *map, int col, int row,
                                       uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}

/* d [64 rows, 256] (+)= A [64, 16] B [16, 256], both from shared memory (K-major): d0 holds
 * columns [0, 128), d1 [128, 256) (m64n256's fragment is the two m64n128 ones side by side) */
#define GG_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define GG_F16(d, j) GG_F4(d, j), GG_F4(d, j + 1), GG_F4(d, j + 2), GG_F4(d, j + 3)
#define GG_F64(d) GG_F16(d, 0), GG_F16(d, 4), GG_F16(d, 8), GG_F16(d, 12)
__device__ __forceinline__ void gg_mma_n256(float (&d0)[16][4], float (&d1)[16][4], uint64_t a,
                                            uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
                 "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
                 "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "
                 "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "
                 "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "
                 "%124, %125, %126, %127}, "
                 "%128, %129, p, 1, 1, 0, 0;\n}\n"
                 : GG_F64(d0), GG_F64(d1)
                 : "l"(a), "l"(b), "r"(acc));
}

/* The ping-pong turn: warpgroup wg hands the mainloop to the other one, which waits for it
 * with fa3_turn_wait (named barrier 1 + its number, 256 threads: 128 arrive, 128 sync) */
__device__ __forceinline__ void gg_turn_pass(int wg) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
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
/* Tile t of the list: expert e, first row r0 (global), the expert's end rend, first column
 * n0; 0 past the end. */
struct gg_tile {
    int e, r0, rend, n0;
};
__device__ __forceinline__ int gg_find(const int *pref, const int *off, int E, int t, int bm,
                                       int bn, gg_tile *tl) {
    if (t >= pref[E]) return 0;
    int e = 0;
    while (pref[e + 1] <= t)
        e++;
    const int mt_e = (off[e + 1] - off[e] + bm - 1) / bm, local = t - pref[e];
    tl->e = e;
    tl->r0 = off[e] + (local % mt_e) * bm;
    tl->rend = off[e + 1];
    tl->n0 = (local / mt_e) * bn;
    return 1;
}

/* The producer (one thread): the A tile [BM][64] of x and the B tile [BN][64] of w of each K
 * step of each tile of the block's walk into stage it % NS, once the stage's last reader has
 * released it (mx, mw: the kernel's maps) */
template <int BM, int BN, int NS>
__device__ __forceinline__ void
gg_produce(const CUtensorMap *mx, const CUtensorMap *mw, const int *s_pref, const int *s_off, int E,
           int N, int KB, uint32_t sA, uint32_t sB, uint32_t bfull, uint32_t bempty) {
    constexpr uint32_t A_BYTES = BM * GG_BK * 2, B_BYTES = BN * GG_BK * 2;
    gg_tile tl;
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, t, BM, BN, &tl); t += gridDim.x)
        for (int kb = 0; kb < KB; kb++, it++) {
            const int s = it % NS;
            if (it >= NS) fa3_bar_wait(bempty + 8 * s, ((it / NS) - 1) & 1);
            fa3_bar_expect(bfull + 8 * s, A_BYTES + B_BYTES);
            gg_tma(sA + s * A_BYTES, mx, kb * GG_BK, tl.r0, bfull + 8 * s);
            gg_tma(sB + s * B_BYTES, mw, kb * GG_BK, tl.e * N + tl.n0, bfull + 8 * s);
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

/* The cooperative form: y = x W_e^T per expert; off on the device. */
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped(bf16 *__restrict__ y /* [M, N] */,
              const __grid_constant__ CUtensorMap mx /* x [M, K], boxes of 128 rows */,
              const __grid_constant__ CUtensorMap mw /* w [E * N, K], boxes of 256 rows */,
              const int32_t *__restrict__ off /* [E + 1] */, int E, int N, int K) {
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + GG_NS * GG_A_BYTES;
    const uint32_t bfull = sB + GG_NS * GG_B_BYTES, bempty = bfull + 8 * GG_NS;
    const int KB = (K + GG_BK - 1) / GG_BK;
    if (threadIdx.x == 0) {
        gg_list(off, E, N, GG_BM, GG_BN, s_off, s_pref);
        for (int s = 0; s < GG_NS; s++) {
            fa3_bar_init(bfull + 8 * s, 1);
            fa3_bar_init(bempty + 8 * s, 2 * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x == 256)
            gg_produce<GG_BM, GG_BN, GG_NS>(&mx, &mw, s_pref, s_off, E, N, KB, sA, sB, bfull,
                                            bempty);
        return;
    }

    const int wg = threadIdx.x >> 7;
    float acc0[16][4], acc1[16][4]; /* columns n0 + [0, 128) and n0 + [128, 256) */
    gg_tile tl;
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, t, GG_BM, GG_BN, &tl);
         t += gridDim.x) {
        for (int kb = 0; kb < KB; kb++, it++) {
            const int s = it % GG_NS;
            fa3_bar_wait(bfull + 8 * s, (it / GG_NS) & 1);
            fa3_hold(acc0); /* the accumulators stay in registers across the asynchronous products */
            fa3_hold(acc1);
            fa3_fence();
            const uint32_t a = sA + s * GG_A_BYTES + wg * 64 * 128, b = sB + s * GG_B_BYTES;
#pragma unroll
            for (int ks = 0; ks < GG_BK / 16; ks++) { /* 16 columns: 32 bytes of a 128-byte row */
                const uint64_t da = fa3_desc(a + ks * 32, 16, 1024);
                fa3_mma_ss(acc0, da, fa3_desc(b + ks * 32, 16, 1024), kb > 0 || ks > 0);
                fa3_mma_ss(acc1, da, fa3_desc(b + 128 * 128 + ks * 32, 16, 1024), kb > 0 || ks > 0);
            }
            fa3_commit();
            fa3_wait<1>(); /* the previous stage's products are done: release it */
            fa3_hold(acc0);
            fa3_hold(acc1);
            if (kb > 0) fa3_bar_arrive(bempty + 8 * ((it - 1) % GG_NS));
        }
        fa3_wait<0>();
        fa3_hold(acc0);
        fa3_hold(acc1);
        fa3_bar_arrive(bempty + 8 * ((it - 1) % GG_NS));
        gg_store(y, acc0, tl.r0 + wg * 64, tl.rend, tl.n0, N);
        gg_store(y, acc1, tl.r0 + wg * 64, tl.rend, tl.n0 + 128, N);
    }
}

/* The ping-pong form (see the header): y = x W_e^T per expert; off on the device. Each warpgroup
 * computes a PP_BM x PP_BN tile: MI 1: 64 x 256, acc[0] and acc[1] its columns [0, 128) and
 * [128, 256); MI 2: 128 x 128, acc[0] and acc[1] its rows [0, 64) and [64, 128). */
template <int MI>
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped_pp(bf16 *__restrict__ y /* [M, N] */,
                 const __grid_constant__ CUtensorMap mx /* x [M, K], boxes of PP_BM rows */,
                 const __grid_constant__ CUtensorMap mw /* w [E * N, K], boxes of PP_BN rows */,
                 const int32_t *__restrict__ off /* [E + 1] */, int E, int N, int K) {
    constexpr int BM = PP_BM(MI), BN = PP_BN(MI), NS = PP_NS(MI);
    constexpr uint32_t A_BYTES = BM * GG_BK * 2, B_BYTES = BN * GG_BK * 2;
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + NS * A_BYTES;
    const uint32_t bfull = sB + NS * B_BYTES, bempty = bfull + 8 * NS;
    const int KB = (K + GG_BK - 1) / GG_BK;
    if (threadIdx.x == 0) {
        gg_list(off, E, N, BM, BN, s_off, s_pref);
        for (int s = 0; s < NS; s++) {
            fa3_bar_init(bfull + 8 * s, 1);
            fa3_bar_init(bempty + 8 * s, 128); /* a stage has one reader: its tile's warpgroup */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x == 256)
            gg_produce<BM, BN, NS>(&mx, &mw, s_pref, s_off, E, N, KB, sA, sB, bfull, bempty);
        return;
    }

    const int wg = threadIdx.x >> 7, ntiles = s_pref[E];
    float acc[2][16][4];
    gg_tile tl;
    /* Turn j is the mainloop of the block's tile j (warpgroup j % 2's): it begins with its
     * owner's fa3_turn_wait, and its owner passes the turn on when tile j + 1 exists. Warpgroup
     * 1 passes turn -1 (warpgroup 0 goes first), so every arrival is waited for. */
    if (wg == 1 && (int)blockIdx.x < ntiles) gg_turn_pass(1);
    /* the block's tile j starts at stage number it0 = j * KB */
    for (int t = blockIdx.x + wg * gridDim.x, it0 = wg * KB;
         gg_find(s_pref, s_off, E, t, BM, BN, &tl); t += 2 * gridDim.x, it0 += 2 * KB) {
        const bool next = t + (int)gridDim.x < ntiles; /* tile j + 1 exists */
        /* Once it is this warpgroup's turn, every earlier stage has been loaded (the other
         * warpgroup waited for them), so no full barrier below is waited on a phase early. */
        fa3_turn_wait(wg);
        for (int kb = 0; kb < KB; kb++) {
            const int it = it0 + kb, s = it % NS;
            fa3_bar_wait(bfull + 8 * s, (it / NS) & 1);
            /* the accumulators stay in registers across the asynchronous products */
            fa3_hold(acc[0]);
            fa3_hold(acc[1]);
            fa3_fence();
            const uint32_t a = sA + s * A_BYTES, b = sB + s * B_BYTES;
#pragma unroll
            for (int ks = 0; ks < GG_BK / 16; ks++) { /* 16 columns: 32 bytes of a 128-byte row */
                const uint64_t da = fa3_desc(a + ks * 32, 16, 1024);
                const uint64_t db = fa3_desc(b + ks * 32, 16, 1024);
                if (MI == 1) {
                    gg_mma_n256(acc[0], acc[1], da, db, kb > 0 || ks > 0);
                } else {
                    fa3_mma_ss(acc[0], da, db, kb > 0 || ks > 0);
                    fa3_mma_ss(acc[1], fa3_desc(a + 64 * 128 + ks * 32, 16, 1024), db,
                               kb > 0 || ks > 0);
                }
            }
            fa3_commit();
            /* the tile's products are all issued: the other warpgroup's queue behind them,
             * with two stages' products (this one and the last) still to run as slack */
            if (kb == KB - 1 && next) gg_turn_pass(wg);
            fa3_wait<1>(); /* the previous stage's products are done: release it */
            fa3_hold(acc[0]);
            fa3_hold(acc[1]);
            if (kb > 0) fa3_bar_arrive(bempty + 8 * ((it - 1) % NS));
        }
        fa3_wait<0>();
        fa3_hold(acc[0]);
        fa3_hold(acc[1]);
        fa3_bar_arrive(bempty + 8 * ((it0 + KB - 1) % NS));
        /* the store, while the other warpgroup's mainloop has the tensor cores */
        gg_store(y, acc[0], tl.r0, tl.rend, tl.n0, N);
        gg_store(y, acc[1], tl.r0 + (MI == 2 ? 64 : 0), tl.rend, tl.n0 + (MI == 1 ? 128 : 0), N);
    }
}

/* ---- host ---- */

/* The 2D map of a [rows, cols] bf16 row-major tensor for boxes {64 columns, box_rows}. */
static CUtensorMap map2d(const bf16 *p, int64_t rows, int64_t cols, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc;
    if (!enc) {
        cudaDriverEntryPointQueryResult res;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                            cudaEnableDefault, &res));
    }
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(cols * 2)};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return m;
}

/* The forms, in the harness's order: 0 cooperative, 1 and 2 ping-pong with MI 1 and 2. */
#define GG_FORMS 3
static const char *const gg_form_name[GG_FORMS] = {"cooperative, 128 x 256 tiles",
                                                   "ping-pong, 64 x 256 a warpgroup",
                                                   "ping-pong, 128 x 128 a warpgroup"};

/* One grouped product y [M, N] = x [M, K] W_e^T (w [E, N, K], doff [E + 1] on the device) by
 * form `form`, one persistent block a SM. */
static void grouped(bf16 *y, const bf16 *x, const bf16 *w, const int32_t *doff, int64_t M, int E,
                    int N, int K, int sms, int form) {
    static const size_t smem[GG_FORMS] = {GG_NS * (GG_A_BYTES + GG_B_BYTES) + 1024 + 16 * GG_NS,
                                          PP_NS(1) * PP_STAGE_BYTES(1) + 1024 + 16 * PP_NS(1),
                                          PP_NS(2) * PP_STAGE_BYTES(2) + 1024 + 16 * PP_NS(2)};
    static int once;
    if (!once++) {
        CK(cudaFuncSetAttribute(k_grouped, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[0]));
        CK(cudaFuncSetAttribute(k_grouped_pp<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[1]));
        CK(cudaFuncSetAttribute(k_grouped_pp<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[2]));
    }
    const int bm = form == 0 ? GG_BM : PP_BM(form), bn = form == 0 ? GG_BN : PP_BN(form);
    CUtensorMap mx = map2d(x, M, K, bm), mw = map2d(w, (int64_t)E * N, K, bn);
    if (form == 0)
        k_grouped<<<sms, GG_THREADS, smem[0]>>>(y, mx, mw, doff, E, N, K);
    else if (form == 1)
        k_grouped_pp<1><<<sms, GG_THREADS, smem[1]>>>(y, mx, mw, doff, E, N, K);
    else
        k_grouped_pp<2><<<sms, GG_THREADS, smem[2]>>>(y, mx, mw, doff, E, N, K);
    CK(cudaGetLastError());
}

/* The cuBLASLt plan of one expert's row-major y_e [n, N] = x_e [n, K] W_e^T, as
 * kernels/gemm_cublaslt.cu builds it (descriptor, layouts, the heuristic's first algorithm). */
struct plan {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
static plan plan_make(cublasLtHandle_t lt, size_t wsb, int n, int N, int K) {
    plan q;
    CB(cublasLtMatmulDescCreate(&q.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CB(cublasLtMatrixLayoutCreate(&q.la, CUDA_R_16BF, K, N, K));
    CB(cublasLtMatrixLayoutCreate(&q.lb, CUDA_R_16BF, K, n, K));
    CB(cublasLtMatrixLayoutCreate(&q.lc, CUDA_R_16BF, N, n, N));
    cublasLtMatmulPreference_t p;
    CB(cublasLtMatmulPreferenceCreate(&p));
    CB(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, q.d, q.la, q.lb, q.lc, q.lc, p, 1, &res, &found));
    if (found < 1) {
        fprintf(stderr, "no cuBLASLt algorithm for n=%d N=%d K=%d\n", n, N, K);
        exit(1);
    }
    q.algo = res.algo;
    cublasLtMatmulPreferenceDestroy(p);
    return q;
}
static void plan_free(plan *q) {
    cublasLtMatrixLayoutDestroy(q->la);
    cublasLtMatrixLayoutDestroy(q->lb);
    cublasLtMatrixLayoutDestroy(q->lc);
    cublasLtMatmulDescDestroy(q->d);
}

/* cuBLASLt per expert, as kernels/gemm_cublaslt.cu: with `plans` (one per expert, made
 * beforehand) as a cache hit, without (NULL) as a miss: a plan made and freed for each call,
 * which is what the backend does when an expert's row count changed since the last step. */
static void per_expert(cublasLtHandle_t lt, void *ws, size_t wsb, bf16 *y, const bf16 *x,
                       const bf16 *w, const std::vector<int> &off, int N, int K, plan *plans) {
    for (size_t e = 0; e + 1 < off.size(); e++) {
        int n = off[e + 1] - off[e];
        if (n <= 0) continue;
        plan q = plans ? plans[e] : plan_make(lt, wsb, n, N, K);
        float one = 1.0f, zero = 0.0f;
        CB(cublasLtMatmul(lt, q.d, &one, w + (size_t)e * N * K, q.la, x + (size_t)off[e] * K, q.lb,
                          &zero, y + (size_t)off[e] * N, q.lc, y + (size_t)off[e] * N, q.lc, &q.algo,
                          ws, wsb, 0));
        if (!plans) plan_free(&q);
    }
}

static float bf(bf16 v) {
    return __bfloat162float(v);
}

/* One case: E experts with these row counts, product [n, K] x [N, K]^T. cuBLASLt first (its
 * line), then each form: its check, and its time only if the check passed. */
static void run(const char *name, const std::vector<int> &counts, int N, int K, cublasLtHandle_t lt,
                void *ws, size_t wsb, int sms) {
    int E = (int)counts.size();
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + counts[e];
    int64_t M = off[E];
    bf16 *x, *w, *y0, *y1;
    int32_t *doff;
    CK(cudaMalloc(&x, (size_t)M * K * 2));
    CK(cudaMalloc(&w, (size_t)E * N * K * 2));
    CK(cudaMalloc(&y0, (size_t)M * N * 2));
    CK(cudaMalloc(&y1, (size_t)M * N * 2));
    CK(cudaMalloc(&doff, (E + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    pg_fill<<<1024, 256>>>(x, (size_t)M * K, 1);
    pg_fill<<<1024, 256>>>(w, (size_t)E * N * K, 2);
    per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL);
    CK(cudaDeviceSynchronize());
    std::vector<bf16> h0((size_t)M * N), h1((size_t)M * N);
    CK(cudaMemcpy(h0.data(), y0, h0.size() * 2, cudaMemcpyDeviceToHost));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double fl = 2.0 * M * N * K;
    const int reps = 10;
    /* as in a training step: the queue is empty when the products are issued (the layer's
     * offsets were just synchronised), so the host's plan building shows in the time */
    /* ms per call of f, each call waited for (the queue empty before the next) */
    auto time_ms = [&](auto f) {
        float ms = 0;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) {
            f();
            CK(cudaStreamSynchronize(0));
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms / reps;
    };
    float ms_miss = time_ms([&] { per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL); });
    std::vector<plan> plans(E);
    auto h0t = std::chrono::steady_clock::now();
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plans[e] = plan_make(lt, wsb, counts[e], N, K);
    double us_plan = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0t)
                         .count();
    int nonempty = 0;
    for (int e = 0; e < E; e++)
        nonempty += counts[e] > 0;
    float ms_hit = time_ms([&] { per_expert(lt, ws, wsb, y0, x, w, off, N, K, plans.data()); });
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plan_free(&plans[e]);
    printf("%-28s M=%6lld N=%5d K=%5d | cuBLASLt per expert: plans made per call %.3f ms %4.0f "
           "TFLOP/s, cached %.3f ms %4.0f TFLOP/s (%.0f us of host a plan)\n",
           name, (long long)M, N, K, ms_miss, fl / ms_miss / 1e9, ms_hit, fl / ms_hit / 1e9,
           nonempty ? us_plan / nonempty : 0.0);
    for (int f = 0; f < GG_FORMS; f++) {
        CK(cudaMemset(y1, 0xff, (size_t)M * N * 2)); /* NaN: every element must be written */
        grouped(y1, x, w, doff, M, E, N, K, sms, f);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h1.data(), y1, h1.size() * 2, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        size_t bad = 0;
        for (size_t i = 0; i < h0.size(); i++) {
            double a = bf(h0[i]), b = bf(h1[i]);
            if (b != b) bad++;
            num += (a - b) * (a - b);
            den += a * a;
        }
        const double nmse = den > 0 ? num / den : num;
        if (bad != 0 || !(nmse < 1e-4)) {
            printf("    grouped, %s: check FAILED (nmse %.2e, %zu unwritten), not timed\n",
                   gg_form_name[f], nmse, bad);
            continue;
        }
        float ms = time_ms([&] { grouped(y1, x, w, doff, M, E, N, K, sms, f); });
        printf("    grouped, %s: check ok (nmse %.2e, %zu unwritten) %.3f ms %4.0f TFLOP/s\n",
               gg_form_name[f], nmse, bad, ms, fl / ms / 1e9);
    }
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y0));
    CK(cudaFree(y1));
    CK(cudaFree(doff));
}

int main() {
    /* each line out at once: a kernel that hangs leaves the lines before it */
    setvbuf(stdout, NULL, _IOLBF, 0);
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    size_t wsb = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const std::vector<int> even(8, 2048);
    const std::vector<int> uneven = {2048, 1900, 2200, 100, 0, 3000, 1500, 5636};
    const std::vector<int> small = {1, 127, 129, 0, 255, 64, 3, 300};
    /* fewer tiles than blocks: blocks with one tile (the ping-pong's warpgroup 1 only passes
     * the first turn) and with none */
    const std::vector<int> tiny = {3, 0, 125};
    run("tiny counts (check only)", tiny, 384, 256, lt, ws, wsb, sms);
    run("small counts (check only)", small, 4096 + 128, 512, lt, ws, wsb, sms);
    run("w1 forward, even", even, 14336, 4096, lt, ws, wsb, sms);
    run("w1 forward, uneven", uneven, 14336, 4096, lt, ws, wsb, sms);
    run("w2 forward, even", even, 4096, 14336, lt, ws, wsb, sms);
    run("w2 forward, uneven", uneven, 4096, 14336, lt, ws, wsb, sms);
    /* The plans above were timed on row counts cuBLASLt had seen (its own heuristic cache
     * answered). A training step meets new counts: the host time of a plan for 64 counts
     * never queried before, the first time and again. */
    for (int pass = 0; pass < 2; pass++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int n = 3001; n < 3065; n++) {
            plan q = plan_make(lt, wsb, n, 14336, 4096);
            plan_free(&q);
        }
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count();
        printf("plan for a %s row count (w1 forward shape): %.1f us of host each\n",
               pass ? "repeated" : "new", us / 64);
    }
    return 0;
}
