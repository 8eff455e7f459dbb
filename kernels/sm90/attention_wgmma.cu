/* attention_wgmma: the causal grouped-query flash-attention forward for Hopper (sm_90a), in
 * the FlashAttention-3 design - warpgroup MMAs (wgmma) that read Q and K, and V, straight from
 * 128-byte-swizzled shared memory, the probabilities fed back from registers, fp32 softmax
 * statistics; head dims 64 and 128, GQA any ratio, document masks. The portable kernel of
 * attention_flash.cu serves every other GPU and head dim, and the whole backward.
 *
 * A block owns 64 NWG query rows of one head: NWG consumer warpgroups of 64 rows (two at head
 * dim 128, three at 64, FlashAttention-3's tiles: at 64 a key block's K and V serve 192 rows)
 * and a producer warpgroup, which gives up most of its registers (setmaxnreg: 240 a consumer
 * thread with two, 160 with three, so that a warpgroup's scores, probabilities and output fit
 * at once). The producer's first thread loads Q once and each key block's K and V with TMA
 * into NS stages (mbarriers: "full" when the bytes have landed, "empty" when all consumer
 * threads are done with a stage's K, or its V).
 * Each consumer warpgroup computes S = Q K^T for the block with wgmma (m64 x BK), the online
 * softmax in registers (flash_common.cuh: the same step as the portable kernel), and O += P V
 * with P as the register A operand, in FlashAttention-3's order: step j issues the score
 * product of block j and then the value product of block j-1 (its P from the last softmax, O
 * rescaled by that softmax's factors), so the softmax of block j runs while the value product
 * is on the tensor cores (the same operations in the same order as one block at a time: the
 * same bits). The warpgroups take turns to issue their products (ping-pong, in a ring), so
 * one's softmax also overlaps the others' products. Key blocks before the first row's document
 * start are skipped, and so are, for each warpgroup, those after all of its rows (the last
 * block of a 192-row block for its first warpgroups; with cached keys). Output and lse as the
 * portable forward: bf16 values, natural-log lse of the scaled scores; cached keys (Tk > T) as the
 * portable forward: row r masked at position r + Tk - T. Compiled for sm_90a only (CMakeLists.txt);
 * moe_cuda_fa3_supported says when it runs. The shared-memory layout of every tile is the one of
 * wgmma.cuh. */
#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

/* Variants (-D at compile time, bench/kernels/attn_variants.sh checks and times them):
 * FA3_NS key/value stages in flight; FA3_PINGPONG 1 makes the consumer warpgroups take turns
 * to issue their products (wgmma.cuh), so that one's softmax runs while the others' products
 * use the tensor cores. */
#ifndef FA3_NS
#define FA3_NS 2
#endif
#ifndef FA3_PINGPONG
#define FA3_PINGPONG 1
#endif
/* the consumer warpgroups of a block at head dim D (64 query rows each), and its threads:
 * theirs and a producer warpgroup's (one thread loads) */
#define FA3_NWG(D) ((D) == 64 ? 3 : 2)
#define FA3_THREADS(D) (128 * (FA3_NWG(D) + 1))

/* out [B, T, H, D] (TO: float holding bf16 values, or bf16), lse [B, H, T]; q/k/v: tensor
 * maps of [B, T, H or KV, D] bf16 (fa3_map); dstart [B, T] or NULL; a block per tile of BQ =
 * 64 NWG query rows of one head, ceil(T / BQ) * B * H blocks; G heads a group of blocks
 * (fa3_tile_group).
 * Threads 0 .. 128 NWG - 1 are the consumer warpgroups, the next 128 the producer: its first
 * thread issues the TMA loads of Q and of each key block's K and V into NS stages (full
 * barriers: the bytes have landed; empty barriers: all consumer threads are done with a
 * stage's K, its V). */
template <int D, int BK, int NS, typename TO>
__global__ void __launch_bounds__(FA3_THREADS(D), 1)
    k_fa3_fwd(TO *__restrict__ out, float *__restrict__ lse, const __grid_constant__ CUtensorMap mq,
              const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv,
              const int32_t *__restrict__ dstart, int64_t T, int64_t Tk, int BH, int H, int KV,
              int G, float scale) {
    extern __shared__ __align__(16) unsigned char fa3_smem[];
    constexpr int NWG = FA3_NWG(D), BQ = 64 * NWG;
    /* swizzled tiles start on 1024 bytes: Q [BQ][D], K [NS][BK][D], V [NS][BK][D], then the
     * barriers: q_full, k_full[NS], v_full[NS], k_empty[NS], v_empty[NS] */
    constexpr uint32_t TILE = BK * D * 2;
    const uint32_t sQ = (smem_u32(fa3_smem) + 1023u) & ~1023u;
    const uint32_t sKb = sQ + BQ * D * 2, sVb = sKb + NS * TILE;
    const uint32_t bq = sVb + NS * TILE, bk = bq + 8, bv = bk + 8 * NS, bek = bv + 8 * NS,
                   bev = bek + 8 * NS;
    /* the blocks of a group of G heads (g0..: the last group may be smaller) go longest
     * (diagonal-most) first, the group's heads in turn at each query block */
    const int nqb = (int)((T + BQ - 1) / BQ), L = (int)blockIdx.x;
    const int g0 = L / (G * nqb) * G, gl = G < BH - g0 ? G : BH - g0, j = L - g0 * nqb;
    const int qb = nqb - 1 - j / gl;
    const int bh = g0 + j % gl, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * BQ, qoff = Tk - T; /* row r at key position r + qoff */
    const int kb_last = (int)(((q0 + BQ < T ? q0 + BQ : T) - 1 + qoff) / BK);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int kb_first = dsb ? dsb[q0] / BK : 0;
    if (threadIdx.x == 0) {
        fa3_bar_init(bq, 1);
        for (int s = 0; s < NS; s++) {
            fa3_bar_init(bk + 8 * s, 1);
            fa3_bar_init(bv + 8 * s, 1);
            fa3_bar_init(bek + 8 * s, NWG * 128);
            fa3_bar_init(bev + 8 * s, NWG * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    const int wg = fa3_warpgroup();
    if (wg == NWG) { /* the producer warpgroup gives its registers to the consumers */
        fa3_regs_dec<24>();
        if (threadIdx.x != 128 * NWG) return;
        fa3_bar_expect(bq, BQ * D * 2);
        fa3_tma_tile<D>(sQ, &mq, BQ, h, q0, b, bq);
        for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) {
            const int s = it % NS;
            const uint32_t parity = ((it / NS) - 1) & 1;
            if (it >= NS) fa3_bar_wait(bek + 8 * s, parity);
            fa3_bar_expect(bk + 8 * s, TILE);
            fa3_tma_tile<D>(sKb + s * TILE, &mk, BK, hk, (int64_t)kb * BK, b, bk + 8 * s);
            if (it >= NS) fa3_bar_wait(bev + 8 * s, parity);
            fa3_bar_expect(bv + 8 * s, TILE);
            fa3_tma_tile<D>(sVb + s * TILE, &mv, BK, hk, (int64_t)kb * BK, b, bv + 8 * s);
        }
        return;
    }

    /* 2 x 128 x 240 (3 x 128 x 160) + 128 x 24 registers: the SM's 64 K */
    fa3_regs_inc<NWG == 2 ? 240 : 160>();
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const uint64_t desc_q = fa3_desc(sQ + wg * 64 * 128, 16, 1024); /* this warpgroup's Q rows */
    float o[D / 8][4];
    fa_zero<D / 8>(o);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t wrow = q0 + wg * 64, wpos = wrow + qoff; /* this warpgroup's first row */
    const int64_t row0 = wrow + warp * 16 + g, row1 = row0 + 8;
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float sl2 = scale * FA_LOG2E;
    fa3_bar_wait(bq, 0);
    if (FA3_PINGPONG) fa3_turn_begin<NWG>(wg);

    /* one key block's scores into sc, issued (not waited for) */
    const auto issue_s = [&](float(&sc)[BK / 8][4], int st, uint32_t parity) {
        fa_zero<BK / 8>(sc);
        fa3_bar_wait(bk + 8 * st, parity);
        fa3_fence();
        const uint64_t desc_k = fa3_desc(sKb + st * TILE, 16, 1024);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) { /* 16 columns of D: 32 bytes in a 128-byte row */
            const uint32_t col = (uint32_t)(ks & 3) * 32;
            fa3_mma_ss(sc, fa3_desc_add(desc_q, (ks >> 2) * BQ * 128 + col),
                       fa3_desc_add(desc_k, (ks >> 2) * BK * 128 + col), ks > 0);
        }
        fa3_commit();
        fa3_hold(sc);
    };
    /* O += P V of the block in stage st, O first rescaled by the factors of the softmax that
     * made P (skipped where they are all exactly 1 in the warp - no row's max moved, as in most
     * blocks of a long row: the same bits); issued */
    uint32_t p[BK / 16][4];
    float a0, a1;
    const auto issue_pv = [&](int st, uint32_t parity) {
        if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) fa_rescale<D / 8>(o, a0, a1);
        fa3_bar_wait(bv + 8 * st, parity);
        fa3_fence();
        const uint64_t desc_v = fa3_desc(sVb + st * TILE, BK * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) /* 16 keys: 16 rows of 128 bytes */
            fa3_mma_rs(o, p[kk], fa3_desc_add(desc_v, kk * 16 * 128));
        fa3_commit();
    };
    /* the softmax of a block's scores (waited for) into p; the stage's K is released */
    const auto softmax = [&](float(&sc)[BK / 8][4], int64_t k0, int st) {
        fa3_hold(sc);
        fa3_bar_arrive(bek + 8 * st); /* this thread is done with the stage's K */
        fa_softmax_block<BK>(sc, m0, m1, l0, l1, a0, a1, k0, row0 + qoff, row1 + qoff, st0, st1,
                             sl2, t, dsb || k0 + BK - 1 > wpos);
    };
    /* after fa3_wait: O and p are free again */
    const auto retire_pv = [&](int st) {
        fa3_hold(o);
        fa3_hold(p);
        fa3_bar_arrive(bev + 8 * st); /* this thread is done with the stage's V */
    };
    /* The blocks this warpgroup's rows see, kb_first .. kb_wl (kb_wl below kb_last for the first
     * warpgroups of a 192-row block, or with cached keys; kb_first - 1 for a warpgroup whose
     * rows all lie past T; never less: a row's document starts at or before it), multiplied; then
     * its turns for the blocks after all of its rows, each stage released once it has landed (so
     * that its release counts for this use of it). */
    const int kb_wl =
        wrow < T ? (int)(((wrow + 63 < T ? wrow + 63 : T - 1) + qoff) / BK) : kb_first - 1;
    if (kb_wl >= kb_first) {
        float sc[BK / 8][4];
        if (FA3_PINGPONG) fa3_turn_wait(wg);
        issue_s(sc, 0, 0);
        if (FA3_PINGPONG) fa3_turn_pass<NWG>(wg, kb_first == kb_last);
        fa3_wait<0>();
        softmax(sc, (int64_t)kb_first * BK, 0);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            c_to_a(p[kk], sc, kk);
        for (int kb = kb_first + 1, it = 1; kb <= kb_wl; kb++, it++) {
            const int s = it % NS, sp = (it - 1) % NS;
            const uint32_t parity = (it / NS) & 1, pp = ((it - 1) / NS) & 1;
            float sc[BK / 8][4];
            if (FA3_PINGPONG) fa3_turn_wait(wg);
            issue_s(sc, s, parity);
            issue_pv(sp, pp); /* the last block's values, while this block's softmax runs */
            if (FA3_PINGPONG) fa3_turn_pass<NWG>(wg, kb == kb_last);
            fa3_wait<1>(); /* the score product */
            softmax(sc, (int64_t)kb * BK, s);
            fa3_wait<0>();
            retire_pv(sp);
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                c_to_a(p[kk], sc, kk);
        }
        const int it = kb_wl - kb_first, s = it % NS;
        issue_pv(s, (uint32_t)(it / NS) & 1);
        fa3_wait<0>();
        retire_pv(s);
    }
    for (int kb = kb_wl + 1; kb <= kb_last; kb++) { /* kb_wl >= kb_first - 1: see above */
        const int it = kb - kb_first, s = it % NS;
        const uint32_t parity = (it / NS) & 1;
        if (FA3_PINGPONG) {
            fa3_turn_wait(wg);
            fa3_turn_pass<NWG>(wg, kb == kb_last);
        }
        fa3_bar_wait(bk + 8 * s, parity);
        fa3_bar_arrive(bek + 8 * s);
        fa3_bar_wait(bv + 8 * s, parity);
        fa3_bar_arrive(bev + 8 * s);
    }
    const int64_t qstride = (int64_t)H * D;
    fa_store_rows<D>(out + (int64_t)b * T * qstride + (int64_t)h * D, lse + (int64_t)bh * T, o, m0,
                     m1, l0, l1, row0, row1, T, qstride, t);
}

int sm90_tmap(moe_cuda_ctx *c, CUtensorMap *m, const void *p, CUtensorMapDataType dt, int rank,
              const int64_t *dims, const int64_t *strides, const int *box, CUtensorMapSwizzle sw,
              const char *op) {
    if (!c->tmap_encode) {
        cudaDriverEntryPointQueryResult res;
        if (!moe_cuda_check(c,
                            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled",
                                                             &c->tmap_encode, 12000,
                                                             cudaEnableDefault, &res),
                            op, "cuTensorMapEncodeTiled"))
            return 0;
    }
    cuuint64_t d[5], st[4];
    cuuint32_t bx[5], estr[5];
    for (int i = 0; i < rank; i++) {
        d[i] = (cuuint64_t)dims[i], bx[i] = (cuuint32_t)box[i], estr[i] = 1;
        if (i + 1 < rank) st[i] = (cuuint64_t)strides[i];
    }
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode)(
        m, dt, (cuuint32_t)rank, (void *)p, d, st, bx, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return 1;
    return moe_cuda_check(c, cudaErrorInvalidValue, op,
                          "tensor map of rank %d, dims %lld x %lld: CUresult %d", rank,
                          (long long)dims[0], (long long)dims[1], (int)r);
}

/* both fa3_map: a [B, T, NH, D] tensor of `esize`-byte elements of type dt, boxes of 128 bytes
 * of a row ({128 / esize columns, 1 head, rows, 1}) */
static int fa3_map_as(moe_cuda_ctx *c, CUtensorMap *m, const void *p, CUtensorMapDataType dt,
                      int esize, int64_t B, int64_t T, int64_t NH, int64_t D, int rows,
                      const char *op) {
    const int64_t dims[4] = {D, NH, T, B};
    const int64_t strides[3] = {D * esize, NH * D * esize, T * NH * D * esize};
    const int box[4] = {128 / esize, 1, rows, 1};
    return sm90_tmap(c, m, p, dt, 4, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, op);
}

int fa3_map(moe_cuda_ctx *c, CUtensorMap *m, const bf16 *p, int64_t B, int64_t T, int64_t NH,
            int64_t D, int rows, const char *op) {
    return fa3_map_as(c, m, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B, T, NH, D, rows, op);
}

int fa3_map(moe_cuda_ctx *c, CUtensorMap *m, const float *p, int64_t B, int64_t T, int64_t NH,
            int64_t D, int rows, const char *op) {
    return fa3_map_as(c, m, p, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, B, T, NH, D, rows, op);
}

int moe_cuda_fa3_supported(const moe_cuda_ctx *c, int64_t D, const void *q, const void *k,
                           const void *v) {
    return c->sm == 90 && (D == 64 || D == 128) &&
           (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0; /* TMA: 16-byte aligned */
}

/* The heads of a group of blocks (k_fa3_fwd), which take turns at each query block. Head by
 * head (each head's blocks longest first), the last heads' long blocks start when most SMs are
 * nearly done, and the grid ends on a tail: 6-15% over the ideal at T <= 8,192 by a simulation
 * of 132 SMs (bench/kernels/attn_tail.py). Heads taking turns leave every head's short blocks
 * for last. A group holds as many heads as keep their keys and values (Tk x D x 4 bytes a kv
 * head) within FA3_GROUP_BYTES, half the 50 MB of an H100's or H200's L2, in whole groups of
 * the `group` query heads that share a kv head; at least one such group. */
#define FA3_GROUP_BYTES (24 << 20)
static int fa3_tile_group(int64_t BH, int64_t group, int64_t Tk, int64_t D) {
    const int64_t kv = FA3_GROUP_BYTES / (Tk * D * 4), g = (kv > 1 ? kv : 1) * group;
    return (int)(g < BH ? g : BH);
}

template <int D, int BK, int NS, typename TO>
static void fa3_launch(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                       const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t Tk,
                       int64_t H, int64_t KV) {
    const char *op = "attention_forward";
    const int BQ = 64 * FA3_NWG(D); /* query rows a block */
    CUtensorMap mq, mk, mv;
    if (!fa3_map(c, &mq, q, B, T, H, D, BQ, op) || !fa3_map(c, &mk, k, B, Tk, KV, D, BK, op) ||
        !fa3_map(c, &mv, v, B, Tk, KV, D, BK, op))
        return;
    const size_t smem = (size_t)(BQ + 2 * NS * BK) * D * sizeof(bf16) + 1024 + 8 * (1 + 4 * NS);
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_fa3_fwd<D, BK, NS, TO>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        op, "shared memory %zu bytes", smem))
        return;
    const int64_t blocks = (T + BQ - 1) / BQ * B * H;
    if (blocks > INT_MAX) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "%lld blocks of %d query rows: more than %d",
                       (long long)blocks, BQ, INT_MAX);
        return;
    }
    k_fa3_fwd<D, BK, NS, TO><<<(unsigned)blocks, FA3_THREADS(D), smem, c->stream>>>(
        out, lse, mq, mk, mv, dstart, T, Tk, (int)(B * H), (int)H, (int)KV,
        fa3_tile_group(B * H, H / KV, Tk, D), 1.0f / sqrtf((float)D));
    MOE_CUDA_LAUNCHED(c, op, "wgmma: B=%lld T=%lld Tk=%lld H=%lld KV=%lld D=%d", (long long)B,
                      (long long)T, (long long)Tk, (long long)H, (long long)KV, D);
}

template <typename TO>
static void fa3_forward_as(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                           const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t Tk,
                           int64_t H, int64_t KV, int64_t D) {
    if (D == 64)
        fa3_launch<64, 128, FA3_NS>(c, out, lse, q, k, v, dstart, B, T, Tk, H, KV);
    else
        fa3_launch<128, 128, FA3_NS>(c, out, lse, q, k, v, dstart, B, T, Tk, H, KV);
}

void moe_cuda_fa3_forward(moe_cuda_ctx *c, moe_buf out, float *lse, const bf16 *q, const bf16 *k,
                          const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t Tk,
                          int64_t H, int64_t KV, int64_t D) {
    if (out.dt == MOE_DTYPE_BF16)
        fa3_forward_as(c, (bf16 *)out.p, lse, q, k, v, dstart, B, T, Tk, H, KV, D);
    else
        fa3_forward_as(c, (float *)out.p, lse, q, k, v, dstart, B, T, Tk, H, KV, D);
}
