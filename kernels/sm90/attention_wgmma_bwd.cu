/* attention_wgmma_bwd: the backward of causal grouped-query flash attention for Hopper
 * (sm_90a) with warpgroup MMAs - the same two deterministic kernels as the portable backward
 * (attention_flash.cu; every gradient element has one owner, no atomics), each with the
 * producer/consumer structure of the Hopper forward (attention_wgmma.cu): a producer warp
 * loads tiles with TMA into mbarrier-guarded stages, two consumer warpgroups of 64 rows
 * multiply them from shared memory (layouts: wgmma.cuh); the producer's warpgroup hands its
 * registers to the consumers (setmaxnreg). Head dims 64 and 128, GQA, document
 * masks; delta = rowsum(dO * O) and the bf16 operands come from the caller.
 *
 * dq kernel, a block per 128 queries of one head: Q and dO resident; per block of 64 keys
 * S = Q K^T and dP = dO V^T (both operands from shared memory), dS = P * (dP - delta) in
 * registers (flash_common.cuh), dQ += dS K (dS as the register A operand, K N-major).
 * dk/dv kernel, a block per 128 keys of one kv head: K and V resident; per block of 64
 * queries of each query head of the group S^T = K Q^T and dP^T = V dO^T, then dV += P^T dO
 * and dK += dS^T Q. The producer warp also stages the queries' lse, delta and document
 * starts beside each tile. Rounding as the portable kernels: P and dS enter the products as
 * bf16, the gradients stay fp32 and are added to dq, dk, dv. */
#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define FB_THREADS 384 /* two consumer warpgroups and a producer warpgroup (one warp works) */
#define FB_ROWS 128    /* queries (dq) or keys (dk/dv) a block owns */
#define FB_STEP 64     /* keys (dq) or queries (dk/dv) a step */
#define FB_NS 2        /* stages */
/* FB_PINGPONG 1: the consumer warpgroups take turns (wgmma.cuh); a -D variant
 * (bench/kernels/attn_variants.sh) */
#ifndef FB_PINGPONG
#define FB_PINGPONG 0
#endif

/* Shared memory of both kernels: the two resident tiles [FB_ROWS][D], FB_NS stages of two
 * [FB_STEP][D] tiles, FB_NS stages of the side arrays (lse, delta, start [FB_STEP]), then the
 * barriers: resident, full[FB_NS], empty[FB_NS]. */
template <int D> struct fb_smem {
    static constexpr uint32_t RES = FB_ROWS * D * 2, TILE = FB_STEP * D * 2;
    static constexpr uint32_t SIDE = 3 * FB_STEP * 4;
    static constexpr size_t BYTES = 2 * RES + 2 * FB_NS * TILE + FB_NS * SIDE + 8 * (1 + 2 * FB_NS);
    uint32_t ra, rb, sa, sb, side, br, bf, be;
    __device__ explicit fb_smem(uint32_t base) {
        ra = base;
        rb = ra + RES;
        sa = rb + RES;
        sb = sa + FB_NS * TILE;
        side = sb + FB_NS * TILE;
        br = side + FB_NS * SIDE;
        bf = br + 8;
        be = bf + 8 * FB_NS;
    }
};

extern __shared__ __align__(16) unsigned char fb_raw[];

/* Registers per thread after the split (setmaxnreg): the producer warpgroup gives its share
 * to the consumers' accumulators (128 * 56 + 256 * 224 <= 65536). */
__device__ __forceinline__ void fb_regs_producer() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
}
__device__ __forceinline__ void fb_regs_consumer() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
}

/* Sets up the barriers (thread 0) and returns the layout; all threads call it. */
template <int D> __device__ __forceinline__ fb_smem<D> fb_begin() {
    fb_smem<D> m((smem_u32(fb_raw) + 1023u) & ~1023u);
    if (threadIdx.x == 0) {
        fa3_bar_init(m.br, 1);
        for (int s = 0; s < FB_NS; s++) {
            fa3_bar_init(m.bf + 8 * s, 32); /* every producer lane: its side-array stores */
            fa3_bar_init(m.be + 8 * s, 2 * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    return m;
}

/* The producer warp (all 32 lanes): lane 0 loads the resident tiles (maps ra, rb, head rh,
 * from row rrow) and then for each step i < n the two tiles of maps sa, sb at coord(i) ->
 * (head, row) into stage i % FB_NS, once the consumers have released it; before each step's
 * loads every lane runs side(i, stage address of the side arrays). */
template <int D, typename C, typename S>
__device__ __forceinline__ void
fb_produce(const fb_smem<D> &m, const CUtensorMap *ra, const CUtensorMap *rb, int rh, int64_t rrow,
           int b, const CUtensorMap *sa, const CUtensorMap *sb, int64_t n, C coord, S side) {
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        fa3_bar_expect(m.br, 2 * fb_smem<D>::RES);
        fa3_tma_tile<D>(m.ra, ra, FB_ROWS, rh, rrow, b, m.br);
        fa3_tma_tile<D>(m.rb, rb, FB_ROWS, rh, rrow, b, m.br);
    }
    for (int64_t i = 0; i < n; i++) {
        const int s = (int)(i % FB_NS);
        if (i >= FB_NS) fa3_bar_wait(m.be + 8 * s, (uint32_t)((i / FB_NS - 1) & 1));
        int head;
        int64_t row;
        coord(i, head, row);
        side(head, row, m.side + s * fb_smem<D>::SIDE);
        if (lane == 0) { /* the lanes' arrivals release their side-array stores */
            const uint32_t tile = s * fb_smem<D>::TILE;
            fa3_bar_expect(m.bf + 8 * s, 2 * fb_smem<D>::TILE);
            fa3_tma_tile<D>(m.sa + tile, sa, FB_STEP, head, row, b, m.bf + 8 * s);
            fa3_tma_tile<D>(m.sb + tile, sb, FB_STEP, head, row, b, m.bf + 8 * s);
        } else {
            fa3_bar_arrive(m.bf + 8 * s);
        }
    }
}

/* A warpgroup that skips a step still waits for its stage to fill before it releases it:
 * otherwise it could run more than FB_NS steps ahead (dk/dv: one query block per head, all
 * before its keys) and its releases would complete the other warpgroup's phase of the stage
 * while that one still reads it. */
template <int D>
__device__ __forceinline__ void fb_skip(const fb_smem<D> &m, int s, uint32_t parity) {
    fa3_bar_wait(m.bf + 8 * s, parity);
}

/* The two score-side products of a warpgroup (its 64 rows of the resident tiles):
 * x = RA_rows SA^T and y = RB_rows SB^T over D, both [64, FB_STEP]; with `turns` the turn
 * passes on once they are issued (`last`: the loop's last step). */
template <int D>
__device__ __forceinline__ void fb_scores(float (&x)[FB_STEP / 8][4], float (&y)[FB_STEP / 8][4],
                                          const fb_smem<D> &m, int wg, uint32_t tile, bool turns,
                                          bool last) {
    fa_zero<FB_STEP / 8>(x);
    fa_zero<FB_STEP / 8>(y);
    fa3_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint32_t a = (ks >> 2) * FB_ROWS * 128 + wg * 64 * 128 + (ks & 3) * 32;
        const uint32_t bo = (ks >> 2) * FB_STEP * 128 + (ks & 3) * 32;
        fa3_mma_ss(x, fa3_desc(m.ra + a, 16, 1024), fa3_desc(m.sa + tile + bo, 16, 1024), ks > 0);
        fa3_mma_ss(y, fa3_desc(m.rb + a, 16, 1024), fa3_desc(m.sb + tile + bo, 16, 1024), ks > 0);
    }
    if (turns) fa3_turn_pass(wg, last);
    fa3_commit_wait();
    fa3_hold(x);
    fa3_hold(y);
}

/* dq [B, T, H, D] (+= scale * dS K, or = under add 0); q/dout maps with boxes of FB_ROWS rows, k/v
 * maps with FB_STEP rows; lse/delta [B, H, T]; dstart [B, T] or NULL; grid (T / 128, B * H) */
template <int D>
__global__ void __launch_bounds__(FB_THREADS, 1)
    k_fb_dq(float *__restrict__ dq, const __grid_constant__ CUtensorMap mq,
            const __grid_constant__ CUtensorMap mdo, const __grid_constant__ CUtensorMap mk,
            const __grid_constant__ CUtensorMap mv, const float *__restrict__ lse,
            const float *__restrict__ delta, const int32_t *__restrict__ dstart, int64_t T, int H,
            int KV, float scale, int add) {
    const fb_smem<D> m = fb_begin<D>();
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * FB_ROWS;
    const int kb_last = (int)(((q0 + FB_ROWS < T ? q0 + FB_ROWS : T) - 1) / FB_STEP);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int kb_first = dsb ? dsb[q0] / FB_STEP : 0;
    if (threadIdx.x >= 256) {
        fb_regs_producer();
        if (threadIdx.x >= 288) return;
        fb_produce<D>(
            m, &mq, &mdo, h, q0, b, &mk, &mv, kb_last - kb_first + 1,
            [&](int64_t i, int &head, int64_t &row) {
                head = hk;
                row = (kb_first + i) * FB_STEP;
            },
            [](int, int64_t, uint32_t) {});
        return;
    }
    fb_regs_consumer();
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int64_t wrow = q0 + wg * 64, row0 = wrow + warp * 16 + g, row1 = row0 + 8;
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float *lg = lse + (int64_t)bh * T, *dg = delta + (int64_t)bh * T;
    const float lse0 = row0 < T ? lg[row0] * FA_LOG2E : 0.0f;
    const float lse1 = row1 < T ? lg[row1] * FA_LOG2E : 0.0f;
    const float dl0 = row0 < T ? dg[row0] : 0.0f, dl1 = row1 < T ? dg[row1] : 0.0f;
    const float sl2 = scale * FA_LOG2E;
    float acc[D / 8][4];
    fa_zero<D / 8>(acc);
    fa3_bar_wait(m.br, 0);
    if (FB_PINGPONG) fa3_turn_begin(wg);
    for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) {
        const int64_t k0 = (int64_t)kb * FB_STEP;
        const int s = it % FB_NS;
        if (FB_PINGPONG) fa3_turn_wait(wg);
        if (k0 <= wrow + 63) { /* a key block after all of this warpgroup's rows is skipped */
            const uint32_t tile = s * fb_smem<D>::TILE;
            fa3_bar_wait(m.bf + 8 * s, (uint32_t)((it / FB_NS) & 1));
            float sc[FB_STEP / 8][4], dp[FB_STEP / 8][4];
            fb_scores<D>(sc, dp, m, wg, tile, FB_PINGPONG, kb == kb_last); /* S, dP = dO V^T */
            fa_dscores_rows<FB_STEP>(sc, dp, k0, row0, row1, st0, st1, lse0, lse1, dl0, dl1, sl2, t,
                                     dsb || k0 + FB_STEP - 1 > wrow);
            uint32_t a[FB_STEP / 16][4];
#pragma unroll
            for (int kk = 0; kk < FB_STEP / 16; kk++)
                c_to_a(a[kk], sc, kk);
            fa3_fence();
#pragma unroll
            for (int kk = 0; kk < FB_STEP / 16; kk++) /* dQ += dS K: 16 keys a step */
                fa3_mma_rs(acc, a[kk], fa3_desc(m.sa + tile + kk * 16 * 128, FB_STEP * 128, 1024));
            fa3_commit_wait();
            fa3_hold(acc);
            fa3_hold(a);
        } else {
            fb_skip(m, s, (uint32_t)((it / FB_NS) & 1));
            if (FB_PINGPONG) fa3_turn_pass(wg, kb == kb_last);
        }
        fa3_bar_arrive(m.be + 8 * s);
    }
    const int64_t qstride = (int64_t)H * D;
    fa_add_rows<D>(dq + (int64_t)b * T * qstride + (int64_t)h * D, acc, row0, row1, T, qstride,
                   scale, t, add);
}

/* dk/dv [B, T, KV, D] (+= scale * dS^T Q, += P^T dO; = under add 0); k/v maps with boxes of FB_ROWS
 * rows, q/dout maps with FB_STEP rows; lse/delta [B, H, T]; dstart [B, T] or NULL; grid (T / 128, B
 * * KV) */
template <int D>
__global__ void __launch_bounds__(FB_THREADS, 1)
    k_fb_dkv(float *__restrict__ dk, float *__restrict__ dv, const __grid_constant__ CUtensorMap mk,
             const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mq,
             const __grid_constant__ CUtensorMap mdo, const float *__restrict__ lse,
             const float *__restrict__ delta, const int32_t *__restrict__ dstart, int64_t T, int H,
             int KV, float scale, int add) {
    const fb_smem<D> m = fb_begin<D>();
    const int kb = gridDim.x - 1 - blockIdx.x;
    const int bk = blockIdx.y, b = bk / KV, hk = bk % KV, group = H / KV;
    const int64_t k0 = (int64_t)kb * FB_ROWS;
    /* the queries that see this block's keys */
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int64_t q_end = fa_query_end(dsb, (k0 + FB_ROWS < T ? k0 + FB_ROWS : T) - 1, T);
    const int64_t nqt = (q_end - k0 + FB_STEP - 1) / FB_STEP, ntiles = nqt * group;
    if (threadIdx.x >= 256) {
        fb_regs_producer();
        if (threadIdx.x >= 288) return;
        const int lane = threadIdx.x & 31;
        fb_produce<D>(
            m, &mk, &mv, hk, k0, b, &mq, &mdo, ntiles,
            [&](int64_t i, int &head, int64_t &row) {
                head = hk * group + (int)(i / nqt);
                row = k0 + (i % nqt) * FB_STEP;
            },
            [&](int head, int64_t row,
                uint32_t side) { /* lse * log2e, delta, start */
                                 const float *lg = lse + ((int64_t)b * H + head) * T;
                                 const float *dg = delta + ((int64_t)b * H + head) * T;
                                 for (int j = lane; j < FB_STEP; j += 32) {
                                     const int64_t q = row + j;
                                     const float l = q < T ? lg[q] * FA_LOG2E : 0.0f,
                                                 d = q < T ? dg[q] : 0.0f;
                                     const int32_t st = dsb && q < T ? dsb[q] : 0;
                                     asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(side + 4 * j),
                                                  "f"(l));
                                     asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(
                                                      side + 4 * (FB_STEP + j)),
                                                  "f"(d));
                                     asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(
                                                      side + 4 * (2 * FB_STEP + j)),
                                                  "r"(st));
                                 }
            });
        return;
    }
    fb_regs_consumer();
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int64_t krow = k0 + wg * 64, key0 = krow + warp * 16 + g, key1 = key0 + 8;
    const float sl2 = scale * FA_LOG2E;
    float dka[D / 8][4], dva[D / 8][4];
    fa_zero<D / 8>(dka);
    fa_zero<D / 8>(dva);
    fa3_bar_wait(m.br, 0);
    if (FB_PINGPONG) fa3_turn_begin(wg);
    for (int64_t i = 0; i < ntiles; i++) {
        const int s = (int)(i % FB_NS);
        const int64_t q0 = k0 + (i % nqt) * FB_STEP;
        if (FB_PINGPONG) fa3_turn_wait(wg);
        if (q0 + FB_STEP - 1 >= krow) { /* a query block before all of this warpgroup's keys */
            const uint32_t tile = s * fb_smem<D>::TILE;
            fa3_bar_wait(m.bf + 8 * s, (uint32_t)((i / FB_NS) & 1));
            float sc[FB_STEP / 8][4], dp[FB_STEP / 8][4], pt[FB_STEP / 8][4];
            fb_scores<D>(sc, dp, m, wg, tile, FB_PINGPONG, i == ntiles - 1); /* S^T, dP^T */
            const unsigned char *side = fb_raw + (m.side + s * fb_smem<D>::SIDE - smem_u32(fb_raw));
            const float *sL = reinterpret_cast<const float *>(side);
            fa_dscores_cols<FB_STEP>(sc, dp, pt, q0, key0, key1, sL, sL + FB_STEP,
                                     reinterpret_cast<const int32_t *>(sL + 2 * FB_STEP), T, sl2, t,
                                     dsb || q0 < krow + 63 || q0 + FB_STEP > T);
            uint32_t pa[FB_STEP / 16][4], sa[FB_STEP / 16][4];
#pragma unroll
            for (int kk = 0; kk < FB_STEP / 16; kk++) {
                c_to_a(pa[kk], pt, kk);
                c_to_a(sa[kk], sc, kk);
            }
            fa3_fence();
#pragma unroll
            for (int kk = 0; kk < FB_STEP / 16; kk++) { /* 16 queries a step */
                const uint32_t r = tile + kk * 16 * 128;
                fa3_mma_rs(dva, pa[kk], fa3_desc(m.sb + r, FB_STEP * 128, 1024));
                fa3_mma_rs(dka, sa[kk], fa3_desc(m.sa + r, FB_STEP * 128, 1024));
            }
            fa3_commit_wait();
            fa3_hold(dva);
            fa3_hold(dka);
            fa3_hold(pa);
            fa3_hold(sa);
        } else {
            fb_skip(m, s, (uint32_t)((i / FB_NS) & 1));
            if (FB_PINGPONG) fa3_turn_pass(wg, i == ntiles - 1);
        }
        fa3_bar_arrive(m.be + 8 * s);
    }
    const int64_t kstride = (int64_t)KV * D, koff = (int64_t)b * T * kstride + (int64_t)hk * D;
    fa_add_rows<D>(dk + koff, dka, key0, key1, T, kstride, scale, t, add);
    fa_add_rows<D>(dv + koff, dva, key0, key1, T, kstride, 1.0f, t, add);
}

template <int D>
static void fb_launch(moe_cuda_ctx *c, float *dq, float *dk, float *dv, const bf16 *q,
                      const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
                      const float *delta, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                      int64_t KV, int add) {
    const char *op = "attention_backward";
    const float scale = 1.0f / sqrtf((float)D);
    const size_t smem = fb_smem<D>::BYTES + 1024;
    CUtensorMap rq, rdo, sk, sv, rk, rv, sq, sdo; /* r: resident (128 rows), s: streamed (64) */
    if (!fa3_map(c, &rq, q, B, T, H, D, FB_ROWS, op) ||
        !fa3_map(c, &rdo, dout, B, T, H, D, FB_ROWS, op) ||
        !fa3_map(c, &sk, k, B, T, KV, D, FB_STEP, op) ||
        !fa3_map(c, &sv, v, B, T, KV, D, FB_STEP, op) ||
        !fa3_map(c, &rk, k, B, T, KV, D, FB_ROWS, op) ||
        !fa3_map(c, &rv, v, B, T, KV, D, FB_ROWS, op) ||
        !fa3_map(c, &sq, q, B, T, H, D, FB_STEP, op) ||
        !fa3_map(c, &sdo, dout, B, T, H, D, FB_STEP, op))
        return;
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(
                            k_fb_dq<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        op, "shared memory %zu bytes", smem) ||
        !moe_cuda_check(c,
                        cudaFuncSetAttribute(
                            k_fb_dkv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        op, "shared memory %zu bytes", smem))
        return;
    const unsigned nb = (unsigned)((T + FB_ROWS - 1) / FB_ROWS);
    k_fb_dq<D><<<dim3(nb, (unsigned)(B * H)), FB_THREADS, smem, c->stream>>>(
        dq, rq, rdo, sk, sv, lse, delta, dstart, T, (int)H, (int)KV, scale, add);
    if (!MOE_CUDA_LAUNCHED(c, op, "wgmma dq: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B,
                           (long long)T, (long long)H, (long long)KV, D))
        return;
    k_fb_dkv<D><<<dim3(nb, (unsigned)(B * KV)), FB_THREADS, smem, c->stream>>>(
        dk, dv, rk, rv, sq, sdo, lse, delta, dstart, T, (int)H, (int)KV, scale, add);
    MOE_CUDA_LAUNCHED(c, op, "wgmma dk/dv: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B,
                      (long long)T, (long long)H, (long long)KV, D);
}

void moe_cuda_fa3_backward(moe_cuda_ctx *c, float *dq, float *dk, float *dv, const bf16 *q,
                           const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
                           const float *delta, const int32_t *dstart, int64_t B, int64_t T,
                           int64_t H, int64_t KV, int64_t D, int add) {
    if (D == 64)
        fb_launch<64>(c, dq, dk, dv, q, k, v, dout, lse, delta, dstart, B, T, H, KV, add);
    else
        fb_launch<128>(c, dq, dk, dv, q, k, v, dout, lse, delta, dstart, B, T, H, KV, add);
}
