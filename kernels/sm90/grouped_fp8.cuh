/* grouped_fp8.cuh: the grouped block-scaled fp8 expert product on Hopper (sm_90a) - one
 * persistent launch over all experts, the tile list and walk of grouped.cuh - used by the
 * backend's fp8-block recipe (kernels/sm90/grouped_fp8.cu) and timed beside cuBLASLt in
 * bench/kernels/grouped_fp8.cu.
 *
 * The product: y[r, :] (+)= dequant(xq[r, :]) dequant(wq_e)^T for the rows r of expert e,
 * fp32 accumulation, y [M, N] bf16 (written) or fp32 (written, or added with beta 1). The
 * operands are quant_fp8.cu's, in cuBLASLt's layouts:
 *   xq [M, K] e4m3 with one fp32 scale per 1 x 128 block along K, sx [KB, lds]: block kb of
 *      row r at sx[kb * lds + r], lds = round_up(M, 4) (a TMA row stride is a multiple of 16
 *      bytes): moe_cuda_fp8_rows over all M rows at once.
 *   wq [E, N, K] e4m3 with one fp32 scale per 128 x 128 tile, sw [E, RB * KB4] (RB = N / 128,
 *      KB4 = round_up(KB, 4)): tile (rb, kb) of expert e at sw[e * RB * KB4 + rb * KB4 + kb] -
 *      quantize_weight's row-wise copy for the forward (N = O, K = I), its transposed copy
 *      for dgrad (N = I, K = O).
 *
 * Design (DeepGEMM's, read not copied: per 128-K block, the tensor cores' fp32 result is
 * scaled by scale_x[row] * scale_w[tile] and added into the main accumulator by the CUDA
 * cores - the "promotion", which also bounds the fp8 tensor cores' limited-precision
 * accumulation to 128 products). One persistent block a SM: two consumer warpgroups and a
 * producer warpgroup whose thread 256 issues every load (a whole warpgroup, so that
 * setmaxnreg can move its registers to the consumers: 40 / 232, CUTLASS's split). Tiles 128 x
 * 128 NH, cooperative: both warpgroups on one tile, 64 rows each.
 *   Stage (K step) = 128 columns of K = one scale block: A [128 rows][128 B] and B [BN
 *   rows][128 B] e4m3 by TMA with the 128-byte swizzle (a row of e4m3 is exactly one swizzle
 *   row, so the K-major descriptors are the bf16 ones: start + 32 bytes per k32 slice, sbo
 *   1024); the x scales of the tile's rows at this kb (a TMA box {132, 1} of sx from row
 *   r0 & ~3: a box's first element must be 16-byte aligned in global memory - a box at an
 *   expert's first row 3 was an illegal instruction on the H200 - so the consumers read them
 *   from r0 & 3 on); the w scales of each 128 columns (16-byte bulk copies of sw from
 *   kb & ~3: aligned because KB4 is a multiple of 4, why cuBLASLt's layout pads to it). All
 *   on the stage's one full barrier.
 *   Consumer, each stage, each 128 columns h of the tile: wgmma m64n128k32 e4m3 x4 into a
 *   temporary p [64 x 128], commit; under the first batch the stage's scales are read into
 *   registers; wait for the batch, then acc_h += (sx[row] sw[h]) p. The stage is released
 *   after its last batch. While one warpgroup promotes, the other's batch runs.
 *   Epilogue: gg_store_staged, each warpgroup's block through its own shared buffer
 *   (GG_ST_WG bytes after the ring) and out as whole 128-byte row segments (rows past the
 *   expert's end and columns past N left alone): the w1 forward with uneven counts 993 ->
 *   1,086 TFLOP/s, the step -1 ms against gg_store's 4-byte stores from the registers (H200,
 *   2026-12-05, docs/performance-gpu.md).
 * Measured on an H200 (2026-12-04, the playground): bit-identical to cuBLASLt's block-scaled
 * product per expert, 998-1,223 TFLOP/s on the mixtral expert shapes (docs/performance-gpu.md). */
#ifndef MOE_KERNELS_SM90_GROUPED_FP8_CUH
#define MOE_KERNELS_SM90_GROUPED_FP8_CUH

#include "grouped.cuh"

#define GF_BK 128 /* K per stage: one scale block, one 128-byte swizzled row of e4m3 */
#define GF_BM 128 /* rows a tile, 64 a consumer warpgroup */
#define GF_BN(NH) (128 * (NH))
#define GF_A_BYTES (GF_BM * GF_BK)
#define GF_B_BYTES(NH) (GF_BN(NH) * GF_BK)
#define GF_SX_BOX (GF_BM + 4) /* x scales a stage: 128 rows from r0 & ~3 */
#define GF_SX_BYTES (GF_SX_BOX * 4)
/* a stage's scales: the x scales of the tile's 128 rows (528 B), then 4 w scales (16 B, from
 * kb & ~3) for each 128 columns; 640 keeps every stage's box on 128 bytes */
#define GF_SC_BYTES 640
#define GF_NS(NH) ((192 << 10) / (GF_A_BYTES + GF_B_BYTES(NH)))
#define GF_SMEM(NH)                                                                                \
    (GF_NS(NH) * (GF_A_BYTES + GF_B_BYTES(NH) + GF_SC_BYTES + 16) + 1024 + 2 * GG_ST_WG + 16)
/* two consumer warpgroups and a producer warpgroup (one thread loads): a whole producer
 * warpgroup, so that setmaxnreg can hand its registers to the consumers (at 288 threads ptxas
 * caps a thread at 168, below NH 2's 128 + 64 accumulators and what the loop needs) */
#define GF_THREADS 384

/* d [64 rows, 128] (+)= A [64, 32] B [32, 128] e4m3, both from shared memory, K-major (the
 * only major fp8 wgmma takes); acc 0: d = A B */
__device__ __forceinline__ void gf_mma(float (&d)[16][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1;\n}\n"
                 : WG_F64(d)
                 : "l"(a), "l"(b), "r"(acc));
}

/* `bytes` (a multiple of 16) from global src (16-byte aligned) into shared dst, completing on
 * bar: the bulk copy without a tensor map */
__device__ __forceinline__ void gf_bulk(uint32_t dst, const void *src, uint32_t bytes,
                                        uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* a float from shared address a; volatile with a memory clobber so that it stays after the
 * barrier wait that makes it valid */
__device__ __forceinline__ float gf_lds(uint32_t a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
    return v;
}

/* One product's operands: the tensor maps of xq, wq and sx, and sw (see the header). */
struct gf_source {
    CUtensorMap mx;  /* xq [M, K] e4m3, boxes {128, 128} */
    CUtensorMap mw;  /* wq [E * N, K] e4m3, boxes {128, BN} */
    CUtensorMap ms;  /* sx [KB, lds] fp32, boxes {132, 1} */
    const float *sw; /* [E, RB * KB4] */
};

/* The grouped block-scaled product (see the header): y (+)= dequant(xq) dequant(wq_e)^T per
 * expert's rows, 128 x 128 NH tiles; TO bf16 (written) or float (beta 1 adds). With nsrc 2
 * the sum of two such products of the same shapes, a's and b's, in one accumulator: a tile's
 * K steps walk a's blocks, then b's (the experts' w1 and w3 dgrad, dxe = dh1 W1 + dh3 W3). */
template <int NH, typename TO>
__global__ void __launch_bounds__(GF_THREADS, 1)
    k_grouped_fp8(TO *__restrict__ y /* [M, N] */, const __grid_constant__ gf_source a,
                  const __grid_constant__ gf_source b, const __grid_constant__ gg_offsets off,
                  int E, int N, int K, int beta, int nsrc) {
    constexpr int BN = GF_BN(NH), NS = GF_NS(NH);
    constexpr uint32_t B_BYTES = GF_B_BYTES(NH);
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + NS * GF_A_BYTES;
    const uint32_t sS = sB + NS * B_BYTES, bfull = sS + NS * GF_SC_BYTES, bempty = bfull + 8 * NS;
    const uint32_t sT = (bempty + 8 * NS + 15) & ~15u; /* the staged epilogue's 2 buffers */
    const int KB = (K + GF_BK - 1) / GF_BK;
    if (threadIdx.x == 0) {
        gg_list(off.o, E, N, GF_BM, BN, s_off, s_pref);
        gg_ring_init(bfull, bempty, NS, 2 * 128);
    }
    __syncthreads();

    const int wg = fa3_warpgroup();
    if (wg == 2) {          /* the producer warpgroup: thread 256 issues every load */
        fa3_regs_dec<40>(); /* 128 x 40 + 2 x 128 x 232 <= 64 K: CUTLASS's split */
        if (threadIdx.x != 256) return;
        const int RB = (N + 127) / 128, KB4 = (KB + 3) / 4 * 4;
        auto load = [&](const gg_tile &tl, int kt, int s, uint32_t bar) {
            const gf_source &src = kt < KB ? a : b;
            const int kb = kt < KB ? kt : kt - KB; /* the block of src's K */
            const uint32_t sc = sS + s * GF_SC_BYTES;
            gg_tma(sA + s * GF_A_BYTES, &src.mx, kb * GF_BK, tl.r0, bar);
            gg_tma(sB + s * B_BYTES, &src.mw, kb * GF_BK, tl.e * N + tl.n0, bar);
            gg_tma(sc, &src.ms, tl.r0 & ~3, kb, bar);
            const float *we = src.sw + (int64_t)tl.e * RB * KB4 + (kb & ~3);
#pragma unroll
            for (int h = 0; h < NH; h++) /* columns past N: any tile's scales, not stored */
                gf_bulk(sc + GF_SX_BYTES + 16 * h, we + min(tl.n0 / 128 + h, RB - 1) * KB4, 16,
                        bar);
        };
        gg_produce_walk<GF_BM, BN, NS>(s_pref, s_off, E, nsrc * KB,
                                       GF_A_BYTES + B_BYTES + GF_SX_BYTES + 16 * NH, bfull, bempty,
                                       load);
        return;
    }

    fa3_regs_inc<232>();
    /* this thread's rows of the tile: row and row + 8 (the accumulator fragment's) */
    const int row = wg * 64 + ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
    float acc[NH][16][4]; /* columns n0 + 128 h + [0, 128) */
    float p[16][4];       /* one batch's product: 128 columns of K, not yet scaled */
    gg_tile tl;
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, t, GF_BM, BN, &tl); t += gridDim.x) {
#pragma unroll
        for (int h = 0; h < NH; h++)
            fa_zero<16>(acc[h]);
        for (int kt = 0, kb = 0; kt < nsrc * KB; kt++, it++, kb = kb + 1 < KB ? kb + 1 : 0) {
            const int s = it % NS; /* kb: the block of the current source's K */
            const uint32_t sc = sS + s * GF_SC_BYTES;
            fa3_bar_wait(bfull + 8 * s, (it / NS) & 1);
            const uint64_t da = fa3_desc(sA + s * GF_A_BYTES + wg * 64 * 128, 16, 1024),
                           db = fa3_desc(sB + s * B_BYTES, 16, 1024);
            float sa0, sa1, sb[NH];
#pragma unroll
            for (int h = 0; h < NH; h++) {
                /* the promotion's reads of p are done before the products rewrite it */
                fa3_hold(p);
                fa3_fence();
#pragma unroll
                for (int ks = 0; ks < GF_BK / 32; ks++) /* 32 columns of K: 32 bytes of a row */
                    gf_mma(p, fa3_desc_add(da, ks * 32), fa3_desc_add(db, h * 128 * 128 + ks * 32),
                           ks);
                fa3_commit();
                if (h == 0) { /* the stage's scales, read under the first batch (their latency
                                 off the path from one batch to the next) and before the
                                 stage's release below */
                    sa0 = gf_lds(sc + 4 * ((tl.r0 & 3) + row));
                    sa1 = gf_lds(sc + 4 * ((tl.r0 & 3) + row + 8));
#pragma unroll
                    for (int j = 0; j < NH; j++)
                        sb[j] = gf_lds(sc + GF_SX_BYTES + 16 * j + 4 * (kb & 3));
                }
                fa3_wait<0>(); /* the promotion reads p: the batch must be done */
                fa3_hold(p);
                if (h == NH - 1) fa3_bar_arrive(bempty + 8 * s);
                const float f0 = sa0 * sb[h], f1 = sa1 * sb[h];
#pragma unroll
                for (int nt = 0; nt < 16; nt++) {
                    acc[h][nt][0] = fmaf(f0, p[nt][0], acc[h][nt][0]);
                    acc[h][nt][1] = fmaf(f0, p[nt][1], acc[h][nt][1]);
                    acc[h][nt][2] = fmaf(f1, p[nt][2], acc[h][nt][2]);
                    acc[h][nt][3] = fmaf(f1, p[nt][3], acc[h][nt][3]);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < NH; h++)
            gg_store_staged(y, acc[h], tl.r0 + wg * 64, tl.rend, tl.n0 + 128 * h, N, beta,
                            sT + wg * GG_ST_WG, 3 + wg);
    }
}

#endif
