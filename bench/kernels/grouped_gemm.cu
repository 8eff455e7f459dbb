/* grouped_gemm.cu: a playground for issue 12's grouped expert product - one persistent launch
 * over all experts, the experts' row offsets read on the device (no host synchronisation, no
 * plan per row count) - against cuBLASLt called once per expert (kernels/gemm_cublaslt.cu's
 * way, both with a plan made for each call, as when the row counts changed since the last
 * step, and with cached plans), on the mixtral8x7b-2L expert shapes with even and uneven
 * counts; it also prints the host time of one plan (descriptor, layouts, heuristic query).
 * Beside the forward, the two backward products (dgrad and wgrad, fp32 out) that
 * moe_cuda_grouped_matmul_backward runs per expert, against it with cached plans.
 *
 * Status: the cooperative form was written without a GPU on 2026-12-01 and first ran on an
 * H200 on 2026-12-02 (07:58 UTC): the check passed on every case (NMSE 0 to 7.9e-11 against
 * cuBLASLt, every element written) at 622-734 TFLOP/s on the 16,384-row products (15:5x UTC:
 * 641-642 w1, 718-737 w2), against 746-828 for cuBLASLt per expert. A B-multicast form over
 * 2-CTA clusters ran correct and much slower (355-418) and was dropped (git show
 * 4d85b94:bench/kernels/grouped_gemm.cu). The two ping-pong forms were written without a GPU
 * on 2026-12-04 and first ran on 2026-12-04 at 21:03 UTC, correct and slower than the
 * cooperative form (557-676 TFLOP/s). The dgrad and wgrad forms (below), written without a
 * GPU on 2026-12-04, ran correct at the same time (dgrad 690-756, wgrad 414-623). Each form checks
 * its own output against cuBLASLt before it is timed; a failed check prints FAILED and no rate (the
 * kernel is wrong, not the rate).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include -Ilibcore/src
 * -Ikernels \ bench/kernels/grouped_gemm.cu -lcublasLt -o /tmp/grouped_gemm && timeout 240
 * /tmp/grouped_gemm
 *
 * (-Xptxas -v prints each kernel's registers and spills. The output is line-buffered, so a
 * kernel that hangs, which the timeout ends, still leaves every line printed before it.
 * Arguments name the parts to run, in this order: fwd, dgrad, wgrad (all without any), so
 * that a hang in one part need not hide the others:
 * for p in fwd dgrad wgrad; do timeout 80 /tmp/grouped_gemm $p; done. The three parts are
 * predicted at 1-1.5 minutes together on an H200, most of it the host's checks.)
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
 * (wait_group 1) and release a stage when the group that read it has completed. The TMA
 * copies, the tile list and walk, the producer's stage ring, the bf16 store and the tensor-map
 * encoder are in grouped_common.cuh, shared with grouped_fp8.cu (moved there on 2026-12-04:
 * this program's device code compiles to the same cubin, byte for byte).
 *
 * Cooperative (k_grouped<0, bf16>): both warpgroups on one 128 x 256 tile, 64 rows each (wgmma
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
 * at K = 14336.
 *
 * The backward (written without a GPU on 2026-12-04, not yet run), fp32 out, written (beta 0)
 * or added (beta 1), per expert e with rows [off[e], off[e + 1]), n of them (O: the forward's
 * output width, I: its input's; w [E, O, I]):
 *   dgrad: dx [M, I] (+)= dy_e [n, O] w_e [O, I]: A = dy, K-major (K = O) as the forward's x;
 *          B = w_e read over its rows: N-major (I contiguous).
 *   wgrad: dw_e [O, I] (+)= dy_e^T x_e: the reduction runs over the expert's own n rows
 *          (any count, 0 included); A = dy_e^T M-major, B = x_e N-major.
 * An MN-major operand is loaded as boxes {64 columns, 64 rows} of the row-major tensor: each
 * lands as [64 rows of K][64 columns of M or N] with the 128-byte swizzle, one swizzle atom
 * wide, so an operand 128 (256) wide is 2 (4) boxes side by side, GG_BOX = 8 KB apart. Its
 * descriptor (gg_desc_mn; as attention_wgmma_bwd.cu's P^T dO, whose operands are at most 64
 * wide, so that lbo is exercised here first): start + 2048 bytes per 16 rows of K (1024-byte
 * aligned: base offset 0), sbo 1024 (the next 8 rows of K), lbo 8192 (the next 64 columns of
 * M or N); the transpose bit (imm-trans-a / -b) 1. PTX ISA 9.7.15.5.1.2: for MN-major swizzled
 * layouts lbo is "the offset from the first (swizzle-byte-size/16) rows to the next" and sbo
 * "from the first 8 columns to the next 8 columns" (rows and columns of the 128-bit-element
 * picture, where MN runs along the rows), canonical ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)).
 *
 * dgrad (k_grouped<1, float>): the cooperative form with an N-major B: the forward's tile list,
 * 128 x 256 tiles and 4 stages of 48 KB (dy [128][64] as the forward's x; w_e as four boxes
 * from a 3D map of w [E, O, I], so that rows past O read as zeros, not as the next expert's).
 * Cooperative because K = O is long (4,096 or 14,336: the epilogue is 5-20% of a tile) and
 * because it is the form that has run: only B's major and the epilogue differ from it, so a
 * failed check points at them.
 *
 * wgrad (k_grouped_wgrad): ping-pong (k_grouped_pp's turns), 128 x 128 a warpgroup (two
 * m64n128k16 with both operands transposed, sharing B), 7 stages of 32 KB (two boxes of dy,
 * columns m0.., then two of x, columns n0.., all from the rows off[e] + 64 kb). Its tiles: E x
 * (O/128) x (I/128), the expert slowest, then the dim with fewer tiles fastest (a wave shares
 * the smaller operand whole in L2: w1's x_e, not its 3.5x larger dy_e). A tile runs ceil(n /
 * 64) stages, so each warpgroup counts the stages of the tiles before its own; an expert
 * without rows has tiles of no stages, which take their turn and store zeros (beta 0) or
 * nothing (beta 1). Ping-pong because K is short (n = 2,048) against an fp32 epilogue: as a
 * cooperative 128 x 256 tile, 23 us of mainloop would stop for the drain and 128 KB of stores
 * (256 KB of traffic under beta 1), about 6-10 us by the forward's 9 us for 64 KB; in turns,
 * a warpgroup's 64 KB run under the other's 11.5-us mainloop. And a stage has one reader, so
 * the expert's end is that warpgroup's business alone:
 *   Boundary: the last stage of a tile holds rows [off[e] + 64 kb, + 64), of which those past
 *   off[e + 1] are the next expert's (or zeros past M). Once its TMA has landed, the owning
 *   warpgroup zeroes them in all four boxes (whole 128-byte rows: no swizzle arithmetic),
 *   fences the proxy and syncs its 128 threads (named barrier 3 + wg), then multiplies all 64
 *   rows. Both operands are zeroed, so not even a NaN in the next expert's rows reaches this
 *   one. Cost: only where n % 64 != 0, once a tile: at most 63 rows x 4 boxes = 32 KB of
 *   16-byte stores, 16 a thread, about 0.2 us against an 11.5-us tile, mostly under the
 *   previous stage's products (still in flight). Skipping the 16-row slices past the end
 *   instead put a wgmma under a branch on shared data, and ptxas then serialised every wgmma
 *   of the kernel (C7520). A tensor map per expert (its end as the map's bound) would need the
 *   maps written on the device, the offsets being there (tensormap.replace and a
 *   tensormap proxy fence before each expert's first load): more machinery for a cost that is
 *   already small.
 * ptxas (nvcc 13.0, sm_90a): k_grouped<1, float> (dgrad) 155 registers, k_grouped_wgrad 166, no
 * spills, no serialised wgmma; the forward kernels' PTX is unchanged (up to register and label
 * names).
 *
 * Prediction (2026-12-04, not measured; cuBLASLt per expert at 2,048 rows ran 790-842 TFLOP/s
 * for the dgrad and 742-751 for the wgrad on 2026-12-02, docs/performance-gpu.md): dgrad w1 (K
 * = 14,336, N = 4,096: the forward w2's shape, which ran 718-737) about 710 at beta 0 and 700
 * at beta 1 (the fp32 store is 128 KB a tile, 3-4 us more of a 170-us tile); dgrad w2 (K =
 * 4,096, N = 14,336: the forward w1's, 641) about 600 and 575, both 10-25% below cuBLASLt, the
 * uneven counts about 3% lower (m-tiles rounded up per expert). wgrad about 650 (600-700) at
 * either beta, even counts; the uneven ones 3-5% lower (the 97-row expert's tiles are bound by
 * storing its 235 MB dw_e, the empty expert's by zeroing it). The risk there is the 128 x 128
 * tile's operand stream from L2 (10.7 TB/s at 700 TFLOP/s): the forward's 128 x 128 ping-pong
 * row in the same run measures the same tile and turns at K = 4,096.
 *
 * What the GPU run must check first: (1) the dgrad tiny/small checks (nothing else changes
 * against the forward that has run): if they fail with NMSE near 1 while the forward passes,
 * the N-major descriptor is wrong, first suspect lbo/sbo swapped (then the wgrad fails too);
 * (2) the wgrad tiny/small checks: a failure with the dgrad passing points at the M-major A
 * (trans-a) or the boundary (the small counts 1, 127, 129, 255, 3 and 300 end inside a stage,
 * 64 does not; unwritten elements under beta 0 point at the empty expert's tiles); (3) a
 * hang in the wgrad part (the turns with tiles of no stages), which `wgrad` alone isolates;
 * (4) then the rates against the prediction, and the wgrad against the forward's 128 x 128
 * ping-pong. */
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "grouped_common.cuh"

#define GG_BK 64 /* K per stage: one 128-byte swizzled column block */
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
/* An MN-major operand (the backward's) arrives as boxes of [64 rows of K][64 columns of M or
 * N], one swizzle atom wide: GG_BOX bytes each, side by side. The dgrad form: the cooperative
 * tile and stages, B as GG_BN / 64 boxes. The wgrad form: a warpgroup's tile WG_BM x WG_BN, a
 * stage of two boxes of A then two of B, WG_NS stages. */
#define GG_BOX (64 * 128)
#define WG_BM 128
#define WG_BN 128
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * GG_BK * 2)
#define WG_NS ((224 << 10) / WG_STAGE_BYTES)

/* d [64 rows, 256] (+)= A [64, 16] B [16, 256], both from shared memory (K-major): d0 holds
 * columns [0, 128), d1 [128, 256) (m64n256's fragment is the two m64n128 ones side by side) */
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
                 : WG_F64(d0), WG_F64(d1)
                 : "l"(a), "l"(b), "r"(acc));
}
/* d [64 rows, 128] (+)= A [64, 16] B [16, 128] from shared memory, A K-major or with TA 1
 * M-major, B K-major or with TB 1 N-major (imm-trans-a / imm-trans-b: the operand's rows in
 * shared memory are the reduction dim; PTX ISA 9.7.15.5.1.2) */
template <int TA, int TB>
__device__ __forceinline__ void gg_mma_n128(float (&d)[16][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, %67, %68;\n}\n"
                 : WG_F64(d)
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
}
/* The descriptor of an MN-major operand at shared address a: boxes [64 rows of K][64
 * columns] side by side GG_BOX bytes apart (lbo: the next 64 columns of M or N, "the offset
 * from the first (swizzle-byte-size/16) rows to the next" of the PTX ISA's MN-major
 * table), sbo 1024 (the next 8 rows of K); the k-th 16 rows of K start at a + k * 2048 */
__device__ __forceinline__ uint64_t gg_desc_mn(uint32_t a) {
    return fa3_desc(a, GG_BOX, 1024);
}

/* The ping-pong turn: warpgroup wg hands the mainloop to the other one, which waits for it
 * with fa3_turn_wait (named barrier 1 + its number, 256 threads: 128 arrive, 128 sync) */
__device__ __forceinline__ void gg_turn_pass(int wg) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
}

/* The producer (one thread, gg_produce_walk's ring): the A tile [BM][64] of x and the B tile of
 * w of each K step of each tile of the block's walk (mx, mw: the kernel's maps). TB 0 (the
 * forward): B K-major, [BN][64] from w [E * N, K]; TB 1 (the dgrad, w [E, K, N] read over its
 * rows): B N-major, BN / 64 boxes [64 rows of K][64 columns] from the 3D map of w, whose rows
 * past K read as zeros. */
template <int BM, int BN, int NS, int TB>
__device__ __forceinline__ void
gg_produce(const CUtensorMap *mx, const CUtensorMap *mw, const int *s_pref, const int *s_off, int E,
           int N, int KB, uint32_t sA, uint32_t sB, uint32_t bfull, uint32_t bempty) {
    constexpr uint32_t A_BYTES = BM * GG_BK * 2, B_BYTES = BN * GG_BK * 2;
    auto load = [&](const gg_tile &tl, int kb, int s, uint32_t bar) {
        gg_tma(sA + s * A_BYTES, mx, kb * GG_BK, tl.r0, bar);
        if (TB == 0) {
            gg_tma(sB + s * B_BYTES, mw, kb * GG_BK, tl.e * N + tl.n0, bar);
        } else {
#pragma unroll
            for (int j = 0; j < BN / 64; j++)
                gg_tma3(sB + s * B_BYTES + j * GG_BOX, mw, tl.n0 + j * 64, kb * GG_BK, tl.e, bar);
        }
    };
    gg_produce_walk<BM, BN, NS>(s_pref, s_off, E, KB, A_BYTES + B_BYTES, bfull, bempty, load);
}

/* The cooperative mainloop of one 128 x 256 tile: warpgroup wg's rows [64 wg, 64 wg + 64) of it
 * into acc0 (columns [0, 128)) and acc1 ([128, 256)) over the KB >= 1 stages from stage number
 * it on (it is left past them), each released once its products are done. A K-major as the
 * forward's x; B K-major ([256 rows][64], TB 0: the forward) or N-major (TB 1: the dgrad,
 * four boxes [64 rows of K][64 columns]). */
template <int TB>
__device__ __forceinline__ void gg_coop_tile(float (&acc0)[16][4], float (&acc1)[16][4],
                                             uint32_t sA, uint32_t sB, uint32_t bfull,
                                             uint32_t bempty, int KB, int &it, int wg) {
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
            if (TB == 0) {
                fa3_mma_ss(acc0, da, fa3_desc(b + ks * 32, 16, 1024), kb > 0 || ks > 0);
                fa3_mma_ss(acc1, da, fa3_desc(b + 128 * 128 + ks * 32, 16, 1024), kb > 0 || ks > 0);
            } else { /* 16 rows of K: 2048 bytes down boxes 0-1 (acc0) and 2-3 (acc1) */
                gg_mma_n128<0, 1>(acc0, da, gg_desc_mn(b + ks * 2048), kb > 0 || ks > 0);
                gg_mma_n128<0, 1>(acc1, da, gg_desc_mn(b + 2 * GG_BOX + ks * 2048),
                                  kb > 0 || ks > 0);
            }
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
}

/* A cooperative tile's epilogue: the forward's bf16 store, or the backward's fp32 one with its
 * beta (the overload picks by the output's type). */
__device__ __forceinline__ void gg_coop_out(bf16 *y, float (&acc)[16][4], int r, int rend, int c,
                                            int N, int beta) {
    (void)beta; /* the forward writes */
    gg_store(y, acc, r, rend, c, N);
}
__device__ __forceinline__ void gg_coop_out(float *y, float (&acc)[16][4], int r, int rend, int c,
                                            int N, int beta) {
    gg_store(y, acc, r, rend, c, N, beta);
}

/* The cooperative forms (see the header), per expert's rows, off on the device:
 *   TB 0, T bf16: the forward, y = x W_e^T (mx: x [M, K], boxes of 128 rows; mw: w [E * N, K],
 *     boxes of 256 rows; beta unused);
 *   TB 1, T float: dgrad, y (+)= dy W_e (beta 0 or 1; mx: dy [M, K], boxes of 128 rows; mw:
 *     w [E, K, N], boxes {64, 64, 1}): the forward's tiles, stages and walk with K = O, N = I. */
template <int TB, class T>
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped(T *__restrict__ y /* [M, N] */, const __grid_constant__ CUtensorMap mx,
              const __grid_constant__ CUtensorMap mw, const int32_t *__restrict__ off /* [E + 1] */,
              int E, int N, int K, int beta) {
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + GG_NS * GG_A_BYTES;
    const uint32_t bfull = sB + GG_NS * GG_B_BYTES, bempty = bfull + 8 * GG_NS;
    const int KB = (K + GG_BK - 1) / GG_BK;
    if (threadIdx.x == 0) {
        gg_list(off, E, N, GG_BM, GG_BN, s_off, s_pref);
        gg_ring_init(bfull, bempty, GG_NS, 2 * 128);
    }
    __syncthreads();

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x == 256)
            gg_produce<GG_BM, GG_BN, GG_NS, TB>(&mx, &mw, s_pref, s_off, E, N, KB, sA, sB, bfull,
                                                bempty);
        return;
    }

    const int wg = threadIdx.x >> 7;
    float acc0[16][4], acc1[16][4]; /* columns n0 + [0, 128) and n0 + [128, 256) */
    gg_tile tl;
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, t, GG_BM, GG_BN, &tl);
         t += gridDim.x) {
        gg_coop_tile<TB>(acc0, acc1, sA, sB, bfull, bempty, KB, it, wg);
        gg_coop_out(y, acc0, tl.r0 + wg * 64, tl.rend, tl.n0, N, beta);
        gg_coop_out(y, acc1, tl.r0 + wg * 64, tl.rend, tl.n0 + 128, N, beta);
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
        gg_ring_init(bfull, bempty, NS, 128); /* a stage has one reader: its tile's warpgroup */
    }
    __syncthreads();

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x == 256)
            gg_produce<BM, BN, NS, 0>(&mx, &mw, s_pref, s_off, E, N, KB, sA, sB, bfull, bempty);
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

/* A tile of the wgrad list: expert e, its rows [r0, rend) (the reduction), kb = ceil((rend -
 * r0) / 64) stages, first row m0 of dw_e and first column n0. */
struct gg_wtile {
    int e, r0, rend, kb, m0, n0;
};
/* Tile t of E experts' MT x NT tiles of WG_BM x WG_BN: the expert slowest, then the dim with
 * fewer tiles fastest, so that the blocks of a wave share the smaller operand whole in L2 (w1's
 * x_e [n, 4096] rather than its dy_e [n, 14336]; w2's dy_e [n, 4096]) and each read a few
 * slices of the larger one. */
__device__ __forceinline__ void gg_wfind(const int *off, int MT, int NT, int t, gg_wtile *w) {
    const int e = t / (MT * NT), l = t - e * MT * NT;
    w->e = e;
    w->r0 = off[e];
    w->rend = off[e + 1];
    w->kb = (w->rend - w->r0 + GG_BK - 1) / GG_BK;
    w->m0 = (MT <= NT ? l % MT : l / NT) * WG_BM;
    w->n0 = (MT <= NT ? l / MT : l % NT) * WG_BN;
}

/* The expert's end inside a stage at st (four boxes [64 rows][64 columns]: two of dy^T, two of
 * x) whose first `rows` < 64 rows are the expert's: the rest, the next expert's rows (or zeros
 * past M), are zeroed in every box, so that neither they nor a NaN among them reaches this
 * expert. By warpgroup wg (every thread; rows is the same for all), after the stage's TMA has
 * landed and before the products: the stores, the proxy fence that orders them before the
 * tensor cores' reads, and a barrier of the warpgroup (named barrier 3 + wg). (Multiplying
 * only the 16-row slices that hold the expert's rows would zero less, but a product under a
 * branch on shared data makes ptxas serialise every wgmma of the kernel.) */
__device__ __forceinline__ void gg_zero_tail(uint32_t st, int rows, int wg) {
#pragma unroll
    for (int box = 0; box < 4; box++) /* the box's rows from `rows` on: its bytes from rows * 128 */
        for (int i = threadIdx.x & 127; i < 8 * (GG_BK - rows); i += 128)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(st + box * GG_BOX +
                                                                            rows * 128 + i * 16),
                         "r"(0)
                         : "memory");
    fa3_fence_smem();
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory");
}

/* The wgrad form (ping-pong, see the header): dw_e (+)= dy_e^T x_e over each expert's rows
 * (beta 0 or 1; an expert without rows gets beta * dw_e); off on the device. Each warpgroup
 * computes a 128 x 128 tile of dw_e, acc[0] and acc[1] its rows [0, 64) and [64, 128). */
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped_wgrad(float *__restrict__ dw /* [E, O, I] */,
                    const __grid_constant__ CUtensorMap mdy /* dy [M, O], boxes of 64 rows */,
                    const __grid_constant__ CUtensorMap mx /* x [M, I], boxes of 64 rows */,
                    const int32_t *__restrict__ off /* [E + 1] */, int E, int O, int I, int beta) {
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1];
    /* stage s at st0 + s * WG_STAGE_BYTES: dy^T's columns m0 + [0, 64), m0 + [64, 128), then
     * x's n0 + [0, 64), n0 + [64, 128), each box [64 rows][64 columns] */
    const uint32_t st0 = (smem_u32(gg_smem) + 1023u) & ~1023u;
    const uint32_t bfull = st0 + WG_NS * WG_STAGE_BYTES, bempty = bfull + 8 * WG_NS;
    const int MT = (O + WG_BM - 1) / WG_BM, NT = (I + WG_BN - 1) / WG_BN, ntiles = E * MT * NT;
    if (threadIdx.x == 0) {
        for (int e = 0; e <= E; e++)
            s_off[e] = off[e];
        gg_ring_init(bfull, bempty, WG_NS, 128); /* a stage has one reader: its tile's warpgroup */
    }
    __syncthreads();

    gg_wtile w;
    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x != 256) return;
        for (int t = blockIdx.x, it = 0; t < ntiles; t += gridDim.x) {
            gg_wfind(s_off, MT, NT, t, &w);
            for (int kb = 0; kb < w.kb; kb++, it++) {
                const int s = it % WG_NS, row = w.r0 + kb * GG_BK;
                const uint32_t st = st0 + s * WG_STAGE_BYTES, bar = bfull + 8 * s;
                if (it >= WG_NS) fa3_bar_wait(bempty + 8 * s, ((it / WG_NS) - 1) & 1);
                fa3_bar_expect(bar, WG_STAGE_BYTES);
                gg_tma(st, &mdy, w.m0, row, bar);
                gg_tma(st + GG_BOX, &mdy, w.m0 + 64, row, bar);
                gg_tma(st + 2 * GG_BOX, &mx, w.n0, row, bar);
                gg_tma(st + 3 * GG_BOX, &mx, w.n0 + 64, row, bar);
            }
        }
        return;
    }

    const int wg = threadIdx.x >> 7;
    float acc[2][16][4];
    /* The turns as k_grouped_pp's: turn j is the mainloop of the block's tile j (warpgroup j %
     * 2's); a tile without stages (an expert without rows) takes its turn and passes it on at
     * once. Each warpgroup walks every tile of the block to count the stages before its own
     * (it0: the stage number of tile j's first stage). */
    if (wg == 1 && (int)blockIdx.x < ntiles) gg_turn_pass(1);
    for (int t = blockIdx.x, j = 0, it0 = 0; t < ntiles; t += gridDim.x, j++, it0 += w.kb) {
        gg_wfind(s_off, MT, NT, t, &w);
        if ((j & 1) != wg) continue;
        const bool next = t + (int)gridDim.x < ntiles; /* tile j + 1 exists */
        fa3_turn_wait(wg);
        if (w.kb == 0 && next) gg_turn_pass(wg);
        fa_zero<16>(acc[0]); /* the products add to zeros; a tile without stages stores them */
        fa_zero<16>(acc[1]);
        for (int kb = 0; kb < w.kb; kb++) {
            const int it = it0 + kb, s = it % WG_NS;
            const uint32_t st = st0 + s * WG_STAGE_BYTES;
            /* the expert's rows in this stage; the rest are the next expert's or past M */
            const int rows = w.rend - (w.r0 + kb * GG_BK);
            fa3_bar_wait(bfull + 8 * s, (it / WG_NS) & 1);
            if (rows < GG_BK) gg_zero_tail(st, rows, wg);
            fa3_hold(acc[0]);
            fa3_hold(acc[1]);
            fa3_fence();
#pragma unroll
            for (int ks = 0; ks < GG_BK / 16; ks++) { /* 16 rows of K: 2048 bytes down the boxes */
                const uint64_t db = gg_desc_mn(st + 2 * GG_BOX + ks * 2048);
                gg_mma_n128<1, 1>(acc[0], gg_desc_mn(st + ks * 2048), db, 1);
                gg_mma_n128<1, 1>(acc[1], gg_desc_mn(st + GG_BOX + ks * 2048), db, 1);
            }
            fa3_commit();
            if (kb == w.kb - 1 && next) gg_turn_pass(wg);
            fa3_wait<1>(); /* the previous stage's products are done: release it */
            fa3_hold(acc[0]);
            fa3_hold(acc[1]);
            if (kb > 0) fa3_bar_arrive(bempty + 8 * ((it - 1) % WG_NS));
        }
        fa3_wait<0>(); /* (also with no stages: no register is then read while a product runs) */
        fa3_hold(acc[0]);
        fa3_hold(acc[1]);
        if (w.kb > 0)
            fa3_bar_arrive(bempty + 8 * ((it0 + w.kb - 1) % WG_NS));
        else if (beta)
            continue; /* dw_e stays as it is */
        /* the store, while the other warpgroup's mainloop has the tensor cores */
        float *dwe = dw + (int64_t)w.e * O * I;
        gg_store(dwe, acc[0], w.m0, O, w.n0, I, beta);
        gg_store(dwe, acc[1], w.m0 + 64, O, w.n0, I, beta);
    }
}

/* ---- host ---- */

/* The TMA map of a row-major bf16 tensor p of `rank` (2 or 3) dims, dims[0] the contiguous one,
 * for boxes {64 columns, box_rows(, 1)} with the 128-byte swizzle; what lies past the dims
 * reads as zeros. */
static CUtensorMap map_bf16(const bf16 *p, int rank, const int64_t *dims, int box_rows) {
    const int64_t strides[2] = {dims[0] * 2, dims[0] * dims[1] * 2};
    return gg_map(p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, dims, strides, 64, box_rows,
                  CU_TENSOR_MAP_SWIZZLE_128B);
}
/* The 2D map of a [rows, cols] bf16 row-major tensor for boxes {64 columns, box_rows}. */
static CUtensorMap map2d(const bf16 *p, int64_t rows, int64_t cols, int box_rows) {
    const int64_t dims[2] = {cols, rows};
    return map_bf16(p, 2, dims, box_rows);
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
        CK(cudaFuncSetAttribute(k_grouped<0, bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[0]));
        CK(cudaFuncSetAttribute(k_grouped_pp<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[1]));
        CK(cudaFuncSetAttribute(k_grouped_pp<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem[2]));
    }
    const int bm = form == 0 ? GG_BM : PP_BM(form), bn = form == 0 ? GG_BN : PP_BN(form);
    CUtensorMap mx = map2d(x, M, K, bm), mw = map2d(w, (int64_t)E * N, K, bn);
    if (form == 0)
        k_grouped<0, bf16><<<sms, GG_THREADS, smem[0]>>>(y, mx, mw, doff, E, N, K, 0);
    else if (form == 1)
        k_grouped_pp<1><<<sms, GG_THREADS, smem[1]>>>(y, mx, mw, doff, E, N, K);
    else
        k_grouped_pp<2><<<sms, GG_THREADS, smem[2]>>>(y, mx, mw, doff, E, N, K);
    CK(cudaGetLastError());
}

/* One grouped backward product, one persistent block a SM: wgrad 0, the dgrad form: dx [M, I]
 * (+)= dy_e w_e per expert's rows with xw = w [E, O, I]; wgrad 1, the wgrad form: dw [E, O, I]
 * (+)= dy_e^T x_e with xw = x [M, I]; dy [M, O], beta 0 or 1, doff [E + 1] on the device. */
static void grouped_bwd(int wgrad, float *out, const bf16 *dy, const bf16 *xw, const int32_t *doff,
                        int64_t M, int E, int O, int I, int beta, int sms) {
    static const size_t smem_dg = GG_NS * (GG_A_BYTES + GG_B_BYTES) + 1024 + 16 * GG_NS;
    static const size_t smem_wg = WG_NS * WG_STAGE_BYTES + 1024 + 16 * WG_NS;
    static int once;
    if (!once++) {
        CK(cudaFuncSetAttribute(k_grouped<1, float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem_dg));
        CK(cudaFuncSetAttribute(k_grouped_wgrad, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem_wg));
    }
    if (wgrad) {
        CUtensorMap mdy = map2d(dy, M, O, 64), mx = map2d(xw, M, I, 64);
        k_grouped_wgrad<<<sms, GG_THREADS, smem_wg>>>(out, mdy, mx, doff, E, O, I, beta);
    } else {
        const int64_t wdims[3] = {I, O, E};
        CUtensorMap mdy = map2d(dy, M, O, GG_BM), mw = map_bf16(xw, 3, wdims, 64);
        k_grouped<1, float><<<sms, GG_THREADS, smem_dg>>>(out, mdy, mw, doff, E, I, O, beta);
    }
    CK(cudaGetLastError());
}

/* The cuBLASLt plan of one expert's row-major c [M, N] = op(a) op(b) over K, as
 * kernels/gemm_plan.cu builds it (descriptor, layouts of its column-major view c^T =
 * op(b)^T op(a)^T, the heuristic's first algorithm): a bf16 [M, K] or (ta) [K, M], b bf16 [K, N]
 * or (tb) [N, K], c of type ct; al: the alignment of the expert's pointers in bytes, a
 * preference as the backend's (256, cuBLASLt's default, sets none). The forward y_e = x_e W_e^T
 * is (ta, tb) = (0, 1), the dgrad dx_e = dy_e W_e (0, 0) and the wgrad dw_e = dy_e^T x_e (1, 0). */
struct plan {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
static plan plan_make(cublasLtHandle_t lt, size_t wsb, int ta, int tb, int M, int N, int K,
                      cudaDataType ct, int al) {
    plan q;
    CB(cublasLtMatmulDescCreate(&q.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    CB(cublasLtMatrixLayoutCreate(&q.la, CUDA_R_16BF, tb ? K : N, tb ? N : K, tb ? K : N));
    CB(cublasLtMatrixLayoutCreate(&q.lb, CUDA_R_16BF, ta ? M : K, ta ? K : M, ta ? M : K));
    CB(cublasLtMatrixLayoutCreate(&q.lc, ct, N, M, N));
    cublasLtMatmulPreference_t p;
    CB(cublasLtMatmulPreferenceCreate(&p));
    CB(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    if (al < 256) {
        const uint32_t a = (uint32_t)al;
        const cublasLtMatmulPreferenceAttributes_t at[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            CB(cublasLtMatmulPreferenceSetAttribute(p, at[i], &a, sizeof a));
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, q.d, q.la, q.lb, q.lc, q.lc, p, 1, &res, &found));
    if (found < 1) {
        fprintf(stderr, "no cuBLASLt algorithm for M=%d N=%d K=%d ta=%d tb=%d\n", M, N, K, ta, tb);
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
 * which is what the backend does when an expert's row count changed since the last step. (The
 * forward's operands have rows of multiples of 128 elements here: 256-byte aligned.) */
static void per_expert(cublasLtHandle_t lt, void *ws, size_t wsb, bf16 *y, const bf16 *x,
                       const bf16 *w, const std::vector<int> &off, int N, int K, plan *plans) {
    for (size_t e = 0; e + 1 < off.size(); e++) {
        int n = off[e + 1] - off[e];
        if (n <= 0) continue;
        plan q = plans ? plans[e] : plan_make(lt, wsb, 0, 1, n, N, K, CUDA_R_16BF, 256);
        float one = 1.0f, zero = 0.0f;
        CB(cublasLtMatmul(lt, q.d, &one, w + (size_t)e * N * K, q.la, x + (size_t)off[e] * K, q.lb,
                          &zero, y + (size_t)off[e] * N, q.lc, y + (size_t)off[e] * N, q.lc,
                          &q.algo, ws, wsb, 0));
        if (!plans) plan_free(&q);
    }
}

/* The backward per expert by cuBLASLt with plans made beforehand (one per expert with rows),
 * as the backend's moe_cuda_grouped_matmul_backward: wgrad 0, the dgrad dx_e [n, I] (+)= dy_e
 * [n, O] w_e [O, I] (xw = w [E, O, I]); wgrad 1, dw_e [O, I] (+)= dy_e^T x_e [n, I] (xw = x [M,
 * I]); beta 0 or 1; under beta 0 an expert without rows gets its dw_e zeroed (the backend's
 * zero_unreached). */
static void per_expert_bwd(cublasLtHandle_t lt, void *ws, size_t wsb, int wgrad, float *out,
                           const bf16 *dy, const bf16 *xw, const std::vector<int> &off, int O,
                           int I, float beta, const plan *plans) {
    for (size_t e = 0; e + 1 < off.size(); e++) {
        const int n = off[e + 1] - off[e];
        float *c = wgrad ? out + e * O * I : out + (size_t)off[e] * I;
        if (n <= 0) {
            if (wgrad && beta == 0.0f) CK(cudaMemsetAsync(c, 0, (size_t)O * I * sizeof(float)));
            continue;
        }
        const bf16 *a = dy + (size_t)off[e] * O;
        const bf16 *b = wgrad ? xw + (size_t)off[e] * I : xw + e * O * I;
        const plan &q = plans[e];
        float one = 1.0f;
        CB(cublasLtMatmul(lt, q.d, &one, b, q.la, a, q.lb, &beta, c, q.lc, c, q.lc, &q.algo, ws,
                          wsb, 0));
    }
}

/* ms per call of f over 10 calls, each waited for: as in a training step, the queue is empty
 * when the products are issued (the layer's offsets were just synchronised), so the host's
 * plan building shows in the time */
template <typename F> static float time_ms(F f) {
    const int reps = 10;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) {
        f();
        CK(cudaStreamSynchronize(0));
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms / reps;
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
    double fl = 2.0 * M * N * K;
    float ms_miss = time_ms([&] { per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL); });
    std::vector<plan> plans(E);
    auto h0t = std::chrono::steady_clock::now();
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plans[e] = plan_make(lt, wsb, 0, 1, counts[e], N, K, CUDA_R_16BF, 256);
    double us_plan =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0t).count();
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

/* One backward case: E experts with these row counts, dy [M, O] bf16 and, wgrad 0, the dgrad
 * dx [M, I] (+)= dy_e w_e (w [E, O, I]) or, wgrad 1, the wgrad dw [E, O, I] (+)= dy_e^T x_e (x
 * [M, I]), fp32 out, under beta 0 and then beta 1 (both outputs starting from the same random
 * values). For each beta: cuBLASLt per expert (the reference), the grouped form's check against
 * it (the worst NMSE over the experts' parts of the output, so that one small expert's error
 * is not averaged away; under beta 0 the grouped output starts as NaN, so every element must
 * be written), and when `timed` cuBLASLt's time with cached plans and the grouped form's if its
 * check passed. The bound 1e-6: the two differ only in the order of fp32 sums (far below
 * 1e-10), while one row lost from or added to an expert's reduction of n rows moves its NMSE by
 * about 1 / n (2e-4 at n = 5,636; a 16-column slice of the dgrad's 14,336, 1e-3). */
static void run_bwd(const char *name, const std::vector<int> &counts, int O, int I, int wgrad,
                    bool timed, cublasLtHandle_t lt, void *ws, size_t wsb, int sms) {
    const int E = (int)counts.size();
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + counts[e];
    const int64_t M = off[E];
    const size_t nxw = wgrad ? (size_t)M * I : (size_t)E * O * I;
    const size_t nout = wgrad ? (size_t)E * O * I : (size_t)M * I;
    bf16 *dy, *xw;
    float *out0, *out1, *start;
    int32_t *doff;
    CK(cudaMalloc(&dy, (size_t)M * O * 2));
    CK(cudaMalloc(&xw, nxw * 2));
    CK(cudaMalloc(&out0, nout * 4));
    CK(cudaMalloc(&out1, nout * 4));
    CK(cudaMalloc(&start, nout * 4));
    CK(cudaMalloc(&doff, (E + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    pg_fill<<<1024, 256>>>(dy, (size_t)M * O, 3);
    pg_fill<<<1024, 256>>>(xw, nxw, 4);
    pg_fill<<<1024, 256>>>(start, nout, 5); /* the fp32 gradient that beta 1 adds to */
    CK(cudaGetLastError());
    /* the plans, and each expert's part of the output [part[e], part[e + 1]) */
    std::vector<plan> plans(E);
    std::vector<size_t> part(E + 1, nout);
    for (int e = 0; e < E; e++) {
        part[e] = wgrad ? (size_t)e * O * I : (size_t)off[e] * I;
        if (counts[e] <= 0) continue;
        const bf16 *a = dy + (size_t)off[e] * O;
        const bf16 *b = wgrad ? xw + (size_t)off[e] * I : xw + (size_t)e * O * I;
        const int al =
            std::min(std::min(pg_align_of(a), pg_align_of(b)), pg_align_of(out0 + part[e]));
        plans[e] = wgrad ? plan_make(lt, wsb, 1, 0, O, I, counts[e], CUDA_R_32F, al)
                         : plan_make(lt, wsb, 0, 0, counts[e], I, O, CUDA_R_32F, al);
    }
    std::vector<float> h0(nout), h1(nout);
    const double fl = 2.0 * M * O * I;
    const char *form =
        wgrad ? "wgrad, ping-pong, 128 x 128 a warpgroup" : "dgrad, cooperative, 128 x 256 tiles";
    for (int beta = 0; beta < 2; beta++) {
        if (beta) {
            CK(cudaMemcpy(out0, start, nout * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(out1, start, nout * 4, cudaMemcpyDeviceToDevice));
        } else {
            CK(cudaMemset(out1, 0xff, nout * 4)); /* NaN: every element must be written */
        }
        per_expert_bwd(lt, ws, wsb, wgrad, out0, dy, xw, off, O, I, (float)beta, plans.data());
        grouped_bwd(wgrad, out1, dy, xw, doff, M, E, O, I, beta, sms);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h0.data(), out0, nout * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h1.data(), out1, nout * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        size_t bad = 0;
        for (int e = 0; e < E; e++) {
            double num = 0, den = 0;
            for (size_t i = part[e]; i < part[e + 1]; i++) {
                const double a = h0[i], b = h1[i];
                if (b != b) bad++;
                num += (a - b) * (a - b);
                den += a * a;
            }
            const double nmse = den > 0 ? num / den : num;
            if (!(nmse <= worst)) worst = nmse; /* a NaN sticks */
        }
        const bool ok = bad == 0 && worst < 1e-6;
        if (timed) {
            const float ms = time_ms([&] {
                per_expert_bwd(lt, ws, wsb, wgrad, out0, dy, xw, off, O, I, (float)beta,
                               plans.data());
            });
            printf("%-28s beta %d M=%6lld O=%5d I=%5d | cuBLASLt per expert, cached plans: %.3f "
                   "ms %4.0f TFLOP/s\n",
                   name, beta, (long long)M, O, I, ms, fl / ms / 1e9);
        } else {
            printf("%-28s beta %d M=%6lld O=%5d I=%5d\n", name, beta, (long long)M, O, I);
        }
        if (!ok) {
            printf("    grouped %s: check FAILED (worst expert nmse %.2e, %zu unwritten)%s\n", form,
                   worst, bad, timed ? ", not timed" : "");
            continue;
        }
        if (!timed) {
            printf("    grouped %s: check ok (worst expert nmse %.2e, %zu unwritten)\n", form,
                   worst, bad);
            continue;
        }
        const float ms =
            time_ms([&] { grouped_bwd(wgrad, out1, dy, xw, doff, M, E, O, I, beta, sms); });
        printf("    grouped %s: check ok (worst expert nmse %.2e, %zu unwritten) %.3f ms %4.0f "
               "TFLOP/s\n",
               form, worst, bad, ms, fl / ms / 1e9);
    }
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plan_free(&plans[e]);
    CK(cudaFree(dy));
    CK(cudaFree(xw));
    CK(cudaFree(out0));
    CK(cudaFree(out1));
    CK(cudaFree(start));
    CK(cudaFree(doff));
}

/* The parts of the harness, in order: fwd (the forward's cases and the plan times), dgrad,
 * wgrad; those named on the command line, or all. */
static bool run_part(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return argc < 2;
}

int main(int argc, char **argv) {
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
    /* as in a training step of bench_train_gpu (random-init router, ncu 2026-12-02): one expert
     * with about half of the rows, some with a few dozen (bound by reading their weights) */
    const std::vector<int> skewed = {8000, 40, 45, 3500, 0, 2000, 1800, 999};
    const std::vector<int> small = {1, 127, 129, 0, 255, 64, 3, 300};
    /* fewer tiles than blocks: blocks with one tile (the ping-pong's warpgroup 1 only passes
     * the first turn) and with none */
    const std::vector<int> tiny = {3, 0, 125};
    /* the backward's uneven counts are odd too: experts that end inside a 16-row slice */
    const std::vector<int> uneven_odd = {2047, 1901, 2203, 97, 0, 3001, 1499, 5636};
    if (run_part(argc, argv, "fwd")) {
        run("tiny counts (check only)", tiny, 384, 256, lt, ws, wsb, sms);
        run("small counts (check only)", small, 4096 + 128, 512, lt, ws, wsb, sms);
        run("w1 forward, even", even, 14336, 4096, lt, ws, wsb, sms);
        run("w1 forward, uneven", uneven, 14336, 4096, lt, ws, wsb, sms);
        run("w2 forward, even", even, 4096, 14336, lt, ws, wsb, sms);
        run("w2 forward, uneven", uneven, 4096, 14336, lt, ws, wsb, sms);
        run("w1 forward, skewed", skewed, 14336, 4096, lt, ws, wsb, sms);
        run("w2 forward, skewed", skewed, 4096, 14336, lt, ws, wsb, sms);
        /* The plans above were timed on row counts cuBLASLt had seen (its own heuristic cache
         * answered). A training step meets new counts: the host time of a plan for 64 counts
         * never queried before, the first time and again. */
        for (int pass = 0; pass < 2; pass++) {
            auto t0 = std::chrono::steady_clock::now();
            for (int n = 3001; n < 3065; n++) {
                plan q = plan_make(lt, wsb, 0, 1, n, 14336, 4096, CUDA_R_16BF, 256);
                plan_free(&q);
            }
            double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count();
            printf("plan for a %s row count (w1 forward shape): %.1f us of host each\n",
                   pass ? "repeated" : "new", us / 64);
        }
    }
    /* The backward (O: the forward's output width, I: its input's): tiny as above; small with
     * O = 456 (dgrad: a K tail of 8; wgrad: a 72-row last tile) and I = 4160 (a 64-column last
     * tile); w1's products have O = F, I = H, w2's O = H, I = F. */
    for (int wgrad = 0; wgrad < 2; wgrad++) {
        if (!run_part(argc, argv, wgrad ? "wgrad" : "dgrad")) continue;
        const char *const names[6][2] = {{"dgrad tiny (check only)", "wgrad tiny (check only)"},
                                         {"dgrad small (check only)", "wgrad small (check only)"},
                                         {"w1 dgrad, even", "w1 wgrad, even"},
                                         {"w1 dgrad, uneven", "w1 wgrad, uneven"},
                                         {"w2 dgrad, even", "w2 wgrad, even"},
                                         {"w2 dgrad, uneven", "w2 wgrad, uneven"}};
        run_bwd(names[0][wgrad], tiny, 256, 384, wgrad, false, lt, ws, wsb, sms);
        run_bwd(names[1][wgrad], small, 456, 4160, wgrad, false, lt, ws, wsb, sms);
        run_bwd(names[2][wgrad], even, 14336, 4096, wgrad, true, lt, ws, wsb, sms);
        run_bwd(names[3][wgrad], uneven_odd, 14336, 4096, wgrad, true, lt, ws, wsb, sms);
        run_bwd(names[4][wgrad], even, 4096, 14336, wgrad, true, lt, ws, wsb, sms);
        run_bwd(names[5][wgrad], uneven_odd, 4096, 14336, wgrad, true, lt, ws, wsb, sms);
    }
    return 0;
}
