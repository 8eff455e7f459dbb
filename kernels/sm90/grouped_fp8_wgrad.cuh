/* grouped_fp8_wgrad.cuh: the weight gradient of the fp8-block experts on Hopper (sm_90a),
 * dW_e [O, I] (+)= dequant(dy_e)^T dequant(x_e) for every expert in one persistent launch - used
 * by the backend (kernels/sm90/grouped_fp8_wgrad.cu) and compared with cuBLASLt per expert in
 * bench/kernels/grouped_fp8.cu's `wgrad` part.
 *
 * The operands are quant_fp8.cu's transposed quantizations (moe_cuda_fp8_cols_t), all experts
 * in one layout:
 *   dyt [O, Mpad] e4m3: column 128 pb_e + t is token t of expert e (t < n_e; zeros up to np_e =
 *       round_up(n_e, 128)), Mpad = the sum of np_e; ds [Mpad / 128, O]: the scale of the 128
 *       tokens of block b (counted over all experts) of row o at ds[b O + o];
 *   xt [I, Mpad] and xs [Mpad / 128, I] the same for x.
 * So both operands are K-major with per-row 1 x 128 scales, the reduction (an expert's padded
 * tokens) has its own length per expert, and the tile's scale factor differs per element:
 * scale_dy[row] x scale_x[column].
 * Design: the forward's (grouped_fp8.cuh: 384 threads, producer warpgroup, cooperative 128 x
 * 128 NH tiles, wgmma e4m3 per 128-token block into p, promoted by the CUDA cores), with:
 *   tiles: every expert with tokens has ceil(O / 128) x ceil(I / BN) of them (m fastest), its
 *     K steps np_e / 128 (the producer's and consumers' walks count them per tile);
 *   a stage: the A box {128 tokens, 128 rows of dyt}, the B box {128 tokens, BN rows of xt},
 *     and the two scale vectors as bulk copies (ds's 128 of this block's rows, xs's BN: rows
 *     and columns past O and I not copied, their products never stored);
 *   the promotion: acc += (sa[row] sb[col]) p with sb read as float2 per 8 columns (16 shared
 *     loads, 64 multiplies and 64 FMAs a thread a 128-column batch, twice the forward's), the
 *     stage released after the last batch's promotion (sb is read from it);
 *   the epilogue: fp32 into dW_e, written (beta 0) or added (beta 1), in one of three forms
 *     (EPI, below); experts without tokens are not touched (the backend zeroes them under SET).
 * Measured (H200, 2026-12-05 03:22 UTC, the playground, the registers epilogue): 128 x 256 735 /
 * 666 TFLOP/s (w1 even / uneven), 739 / 753 (w2), against cuBLASLt per expert 750 / 756 and
 * 774 / 804. At 2,048 tokens an expert a 128 x 256 tile is 16 K steps (about 15.5 us at the
 * forward's main-loop rate), then writes 128 KB of fp32 (the forward's w1 tile: 64 KB of bf16
 * after 32 steps); with all SMs in their epilogues together that is about 5 us at 3.5 TB/s,
 * while the tensor cores idle. The TMA epilogue takes the writes off the consumers' path
 * (expected ~850-900 TFLOP/s, beta 1 as fast as beta 0). Not run yet. */
#ifndef MOE_KERNELS_SM90_GROUPED_FP8_WGRAD_CUH
#define MOE_KERNELS_SM90_GROUPED_FP8_WGRAD_CUH

#include "grouped_fp8.cuh"

#define GW_SC_BYTES(NH) (512 * (1 + (NH))) /* a stage's scales: 128 of ds, 128 NH of xs */
/* The epilogues (EPI), all three compared by the playground: GW_REGS, gg_store's 8-byte stores
 * from the registers (the form measured above); GW_STAGED, gg_store_staged (the forward's
 * since 2026-12-05: whole 128-byte row segments, +9% on w1's forward); GW_TMA, gw_store_tma
 * below, the backend's: the block leaves by TMA stores (beta 0) or TMA reduce-adds (beta 1)
 * and the consumers go on to the next tile's main loop while it drains. */
enum { GW_REGS, GW_STAGED, GW_TMA };
#define GW_TMA_BYTES (64 * 128) /* a warpgroup's TMA box: 64 rows of 32 fp32 */
#define GW_EPI_BYTES(EPI)                                                                          \
    ((EPI) == GW_STAGED ? 2 * GG_ST_WG + 16 : (EPI) == GW_TMA ? 2 * GW_TMA_BYTES + 1024 : 0)
#define GW_SMEM(NH, EPI)                                                                           \
    (GF_NS(NH) * (GF_A_BYTES + GF_B_BYTES(NH) + GW_SC_BYTES(NH) + 16) + 1024 + GW_EPI_BYTES(EPI))

/* two floats from shared address a (8-byte aligned), as gf_lds */
__device__ __forceinline__ float2 gw_lds2(uint32_t a) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}

/* The wgrad's tile t: expert e (its padded tokens from p0, ks K steps), rows m0 of O, columns
 * n0 of I; 0 past the end. pref [E + 1]: the first tile of each expert. */
struct gw_tile {
    int e, p0, ks, m0, n0;
};
__device__ __forceinline__ int gw_find(const int *pref, const int *poff, int E, int t, int MT,
                                       int BN, gw_tile *tl) {
    const int e = gg_tile_expert(pref, E, t);
    if (e < 0) return 0;
    const int local = t - pref[e];
    tl->e = e, tl->p0 = poff[e], tl->ks = (poff[e + 1] - poff[e]) / 128;
    tl->m0 = (local % MT) * 128, tl->n0 = (local / MT) * BN;
    return 1;
}

/* GW_TMA's epilogue of one warpgroup's accumulators acc [NH][64 rows, 128 columns] (rows r..,
 * columns c.. of expert e's dW through mdw: [E, O, I] fp32, boxes {32, 64, 1} with the
 * 128-byte swizzle; rows past O and columns past I are dropped by the TMA unit): in boxes of
 * 32 columns through this warpgroup's buffer buf (GW_TMA_BYTES, 1024-byte aligned; named
 * barrier bar, 128 threads), each stored (add 0) or added in L2 (add 1) by its thread 0 and
 * left to drain: the thread waits only for the box's reads of buf before the next box
 * overwrites it. A box row is 128 bytes: the 16-byte chunk q of row y sits at q ^ (y & 7)
 * (the swizzle), and the lanes t >= 2 of a quad store the column block j ^ 2 where the lanes
 * t < 2 store j (attention's dQ store, fb_store_dq: a half-warp's 8-byte stores then meet 8
 * different chunks). */
template <int NH>
__device__ __forceinline__ void gw_store_tma(const CUtensorMap *mdw, const float (&acc)[NH][16][4],
                                             int e, int r, int c, int add, uint32_t buf, int bar) {
    const int t = threadIdx.x & 127, lane = t & 31, y = (t >> 5) * 16 + (lane >> 2), q = lane & 3;
    const bool lo = q < 2;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int box = 0; box < 4; box++) {
            if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory"); /* buf is free */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                /* the column block this lane stores, chosen by value: an index that depends
                 * on the lane would put acc in local memory */
                const int js = lo ? j : j ^ 2;
                const float *a = acc[h][4 * box + j], *b = acc[h][4 * box + (j ^ 2)];
                const uint32_t o = ((((uint32_t)js * 2 + (q >> 1)) ^ (y & 7)) << 4) + 8 * (q & 1);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + y * 128 + o),
                             "f"(lo ? a[0] : b[0]), "f"(lo ? a[1] : b[1])
                             : "memory");
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + (y + 8) * 128 + o),
                             "f"(lo ? a[2] : b[2]), "f"(lo ? a[3] : b[3])
                             : "memory");
            }
            fa3_fence_smem(); /* the writes before the TMA unit's reads */
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
            if (t != 0) continue;
            const int col = c + 128 * h + 32 * box;
            if (add)
                asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
                             " [%0, {%1, %2, %3}], [%4];\n" ::"l"((uint64_t)mdw),
                             "r"(col), "r"(r), "r"(e), "r"(buf)
                             : "memory");
            else
                asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group"
                             " [%0, {%1, %2, %3}], [%4];\n" ::"l"((uint64_t)mdw),
                             "r"(col), "r"(r), "r"(e), "r"(buf)
                             : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
}

/* dw [E, O, I] fp32 (+)= per expert dyt_e xt_e^T (see above); poff [E + 1] the padded token
 * offsets (multiples of 128), by value; maps: mdy dyt [O, Mpad] boxes {128, 128}, mx xt
 * [I, Mpad] boxes {128, BN}, both e4m3 with the 128-byte swizzle; mdw dw for GW_TMA's stores
 * (gw_store_tma; the other epilogues write through dw). */
template <int NH, int EPI>
__global__ void __launch_bounds__(GF_THREADS, 1)
    k_grouped_fp8_wgrad(float *__restrict__ dw /* [E, O, I] */,
                        const __grid_constant__ CUtensorMap mdy,
                        const __grid_constant__ CUtensorMap mx,
                        const __grid_constant__ CUtensorMap mdw,
                        const float *__restrict__ ds /* [Mpad / 128, O] */,
                        const float *__restrict__ xs /* [Mpad / 128, I] */,
                        const __grid_constant__ gg_offsets poff, int E, int O, int I, int beta) {
    constexpr int BN = GF_BN(NH), NS = GF_NS(NH);
    constexpr uint32_t B_BYTES = GF_B_BYTES(NH), SC = GW_SC_BYTES(NH);
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_pref[GG_MAXE + 1], s_poff[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + NS * GF_A_BYTES;
    const uint32_t sS = sB + NS * B_BYTES, bfull = sS + NS * SC, bempty = bfull + 8 * NS;
    /* the epilogue's two buffers (GW_STAGED, GW_TMA), one a warpgroup */
    const uint32_t sT =
        EPI == GW_TMA ? (bempty + 8 * NS + 1023) & ~1023u : (bempty + 8 * NS + 15) & ~15u;
    const int MT = (O + 127) / 128, NT = (I + BN - 1) / BN;
    if (threadIdx.x == 0) {
        s_pref[0] = 0;
        for (int e = 0; e < E; e++) {
            s_poff[e] = poff.o[e];
            s_pref[e + 1] = s_pref[e] + (poff.o[e + 1] > poff.o[e] ? MT * NT : 0);
        }
        s_poff[E] = poff.o[E];
        gg_ring_init(bfull, bempty, NS, 256);
    }
    __syncthreads();

    gw_tile tl;
    if (threadIdx.x >= 256) { /* the producer warpgroup: thread 256 issues every load */
        fa3_regs_dec<40>();
        if (threadIdx.x != 256) return;
        for (int t = blockIdx.x, it = 0; gw_find(s_pref, s_poff, E, t, MT, BN, &tl);
             t += gridDim.x) {
            const uint32_t na = 4u * min(128, O - tl.m0), nb = 4u * min(BN, I - tl.n0);
            for (int k = 0; k < tl.ks; k++, it++) {
                const int s = it % NS;
                const uint32_t bar = bfull + 8 * s, sc = sS + s * SC;
                const int64_t blk = tl.p0 / 128 + k; /* the token block's row of ds and xs */
                if (it >= NS) fa3_bar_wait(bempty + 8 * s, ((it / NS) - 1) & 1);
                fa3_bar_expect(bar, GF_A_BYTES + B_BYTES + na + nb);
                gg_tma(sA + s * GF_A_BYTES, &mdy, tl.p0 + 128 * k, tl.m0, bar);
                gg_tma(sB + s * B_BYTES, &mx, tl.p0 + 128 * k, tl.n0, bar);
                gf_bulk(sc, ds + blk * O + tl.m0, na, bar);
                gf_bulk(sc + 512, xs + blk * I + tl.n0, nb, bar);
            }
        }
        return;
    }

    fa3_regs_inc<232>();
    const int wg = threadIdx.x >> 7;
    const int row = wg * 64 + ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
    const int cq = 2 * (threadIdx.x & 3); /* this thread's first column of each 8 */
    float acc[NH][16][4];
    float p[16][4];
    for (int t = blockIdx.x, it = 0; gw_find(s_pref, s_poff, E, t, MT, BN, &tl); t += gridDim.x) {
#pragma unroll
        for (int h = 0; h < NH; h++)
            fa_zero<16>(acc[h]);
        for (int k = 0; k < tl.ks; k++, it++) {
            const int s = it % NS;
            const uint32_t sc = sS + s * SC;
            fa3_bar_wait(bfull + 8 * s, (it / NS) & 1);
            const uint32_t a = sA + s * GF_A_BYTES + wg * 64 * 128, b = sB + s * B_BYTES;
            float sa0, sa1;
#pragma unroll
            for (int h = 0; h < NH; h++) {
                fa3_hold(p);
                fa3_fence();
#pragma unroll
                for (int kk = 0; kk < GF_BK / 32; kk++)
                    gf_mma(p, fa3_desc(a + kk * 32, 16, 1024),
                           fa3_desc(b + h * 128 * 128 + kk * 32, 16, 1024), kk);
                fa3_commit();
                if (h == 0) {
                    sa0 = gf_lds(sc + 4 * row);
                    sa1 = gf_lds(sc + 4 * (row + 8));
                }
                fa3_wait<0>();
                fa3_hold(p);
#pragma unroll
                for (int nt = 0; nt < 16; nt++) {
                    const float2 sb = gw_lds2(sc + 512 + 4 * (128 * h + 8 * nt + cq));
                    acc[h][nt][0] = fmaf(sa0 * sb.x, p[nt][0], acc[h][nt][0]);
                    acc[h][nt][1] = fmaf(sa0 * sb.y, p[nt][1], acc[h][nt][1]);
                    acc[h][nt][2] = fmaf(sa1 * sb.x, p[nt][2], acc[h][nt][2]);
                    acc[h][nt][3] = fmaf(sa1 * sb.y, p[nt][3], acc[h][nt][3]);
                }
            }
            fa3_bar_arrive(bempty + 8 * s); /* after the last read of the stage's scales */
        }
        float *dwe = dw + (int64_t)tl.e * O * I;
        if constexpr (EPI == GW_TMA)
            gw_store_tma<NH>(&mdw, acc, tl.e, tl.m0 + wg * 64, tl.n0, beta, sT + wg * GW_TMA_BYTES,
                             3 + wg);
        else
#pragma unroll
            for (int h = 0; h < NH; h++)
                if constexpr (EPI == GW_STAGED)
                    gg_store_staged(dwe, acc[h], tl.m0 + wg * 64, O, tl.n0 + 128 * h, I, beta,
                                    sT + wg * GG_ST_WG, 3 + wg);
                else
                    gg_store(dwe, acc[h], tl.m0 + wg * 64, O, tl.n0 + 128 * h, I, beta);
    }
    /* the last boxes are performed before the block's shared memory goes */
    if (EPI == GW_TMA && (threadIdx.x & 127) == 0) fa3_bulk_wait();
}

#endif
