/* attention_wgmma_bwd: the backward of causal grouped-query flash attention for Hopper
 * (sm_90a) with warpgroup MMAs, in one kernel: a block per 128 keys of one kv head holds the
 * keys' K and V in shared memory and walks the blocks of 64 queries of the group's query heads
 * that see them, so it loads K and V and writes dK and dV once for the whole group. (A block
 * per query head, the heads of a group adding dK and dV in turn, shortened the longest blocks
 * while the grid ended on them; with the longest blocks first it was 14% slower at T4096 H32,
 * 9% at T8192, 2% at T32768 and even at T131072, H100 2026-12-07, and was removed.) Per step it
 * forms S^T = K Q^T and dP^T = V dO^T, dS^T = P^T * (dP^T - delta) in registers (flash_common.cuh),
 * then dV += P^T dO, dK += dS^T Q and this step's share of dQ = dS K (dS^T through shared memory,
 * read as a transposed operand; each consumer warpgroup takes half of dQ's columns over all 128
 * keys, so both wait for the whole dS^T tile, one named barrier a step). Each product is issued
 * as soon as its operands exist and waited for only when its result is read: P^T is formed
 * while dP^T is on the tensor cores, dS^T while dV's product is, and dS^T stored and the other
 * warpgroup awaited while dK's is. Structure as the Hopper
 * forward (attention_wgmma.cu): a producer warp loads Q/dO tiles with TMA into
 * mbarrier-guarded stages, two consumer warpgroups of 64 keys multiply them from shared memory
 * (layouts: wgmma.cuh), and the producer's warpgroup hands its registers to the consumers
 * (setmaxnreg). Head dims 64 and 128, GQA, document masks; delta = rowsum(dO * O) and the bf16
 * operands come from the caller.
 *
 * dQ is deterministic without an owner per element: each step's dQ tile goes to shared memory
 * and a writer warp adds it into dq with a TMA reduce-add, and the key blocks of one query
 * block add in a fixed order, the first key block first (FlashAttention-3's deterministic
 * mode, in its order): a semaphore per query block counts the adds done, and a block waits
 * for its turn. The blocks start longest first - the first key blocks (every later query sees
 * them) of FB_ROWS_IN_TURN kv heads, those in turn, then the next ones - so that the grid
 * ends on short blocks (its tail: 8% at T <= 8,192 when each head's blocks went shortest first,
 * by bench/kernels/attn_tail.py), and a block only waits for blocks that started before it. A
 * block walks its queries from the last down to its diagonal (its query heads in turn at
 * each), so the blocks of a head that start together meet at the same query block in the same
 * step, each one add behind the block before it, and find its Q and dO in L2 (with all heads in
 * turn the blocks of a head were too far apart: 35% slower at T8192, 2x at T131072; head by
 * head, the key blocks of a head started two query blocks apart and walked the whole sequence:
 * 69% L2 hits at T131072 against 96%; H100 2026-12-07). The turns cost a block the adds of the
 * blocks of its head started with it, once (1-3% against adding in arrival order). Rounding as the
 * portable kernels: P and dS enter the products as bf16, the gradients stay fp32. */
#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define FB_THREADS 384 /* two consumer warpgroups; a producer warpgroup (a TMA warp, a dQ warp) */
#define FB_ROWS 128    /* keys a block owns */
#define FB_STEP 64     /* queries a step */
#define FB_NS 2        /* stages of Q and dO */
#define FB_DQ_BOX (64 * 128) /* bytes of one dQ box: [64 queries][32 fp32 columns] */
#define FB_ROWS_IN_TURN 8    /* (batch, kv head) rows whose blocks start in turn, longest first */
/* A variant (-D at compile time, bench/kernels/attn_variants.sh): FB_DQ_TURNS 0 adds each dQ
 * tile as soon as it is ready, in no fixed order: not deterministic, a measurement of what the
 * turns cost, never a build to ship */
#ifndef FB_DQ_TURNS
#define FB_DQ_TURNS 1
#endif

/* Shared memory: the resident K and V [FB_ROWS][D]; FB_NS stages of Q and dO [FB_STEP][D]; two
 * dS^T tiles [FB_ROWS keys][FB_STEP queries] bf16 (steps alternate); the dQ tile [FB_STEP][D]
 * fp32 as D/32 boxes of [FB_STEP][32] (128-byte swizzle; warpgroup w computes the D/2
 * columns from w D/2); FB_NS stages of the side arrays (lse, delta, start [FB_STEP]); then the
 * barriers: resident, full[FB_NS], empty[FB_NS], dQ full[2], dQ empty[2]. */
template <int D> struct fb_smem {
    static constexpr uint32_t RES = FB_ROWS * D * 2, TILE = FB_STEP * D * 2;
    static constexpr uint32_t DS = FB_ROWS * FB_STEP * 2, DQ = FB_STEP * D * 4;
    static constexpr uint32_t SIDE = 3 * FB_STEP * 4;
    static constexpr size_t BYTES =
        2 * RES + 2 * FB_NS * TILE + 2 * DS + DQ + FB_NS * SIDE + 8 * (1 + 2 * FB_NS + 4);
    uint32_t ra, rb, sa, sb, ds, dq, side, br, bf, be, bqf, bqe;
    __device__ explicit fb_smem(uint32_t base) {
        ra = base;
        rb = ra + RES;
        sa = rb + RES;
        sb = sa + FB_NS * TILE;
        ds = sb + FB_NS * TILE;
        dq = ds + 2 * DS;
        side = dq + DQ;
        br = side + FB_NS * SIDE;
        bf = br + 8;
        be = bf + 8 * FB_NS;
        bqf = be + 8 * FB_NS;
        bqe = bqf + 16;
    }
};

/* the dQ columns of each of the two consumer warpgroups */
#define FB_DQ_N(D) ((D) / 2)

extern __shared__ __align__(16) unsigned char fb_raw[];

/* Registers per thread after the split (setmaxnreg): the producer warpgroup gives its share
 * to the consumers' accumulators (128 * 40 + 256 * 232 <= 65536, CUTLASS's split; at 56/224 a
 * consumer thread spilled 16 bytes at D 128). */
__device__ __forceinline__ void fb_regs_producer() {
    fa3_regs_dec<40>();
}
__device__ __forceinline__ void fb_regs_consumer() {
    fa3_regs_inc<232>();
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
        for (int w = 0; w < 2; w++) {
            fa3_bar_init(m.bqf + 8 * w, 128); /* the warpgroup's dQ stores */
            fa3_bar_init(m.bqe + 8 * w, 1);   /* the writer, once TMA has read them */
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

/* One score-side product of a warpgroup (its 64 keys of the resident tile at res), issued
 * and committed as a group of its own: x [64, FB_STEP] = rows Q^T (or dO^T) over D, the
 * step's tile at st. */
template <int D>
__device__ __forceinline__ void fb_scores(float (&x)[FB_STEP / 8][4], uint32_t res, uint32_t st,
                                          int wg) {
    const uint64_t da = fa3_desc(res + wg * 64 * 128, 16, 1024), db = fa3_desc(st, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++)
        fa3_mma_ss(x, fa3_desc_add(da, (ks >> 2) * FB_ROWS * 128 + (ks & 3) * 32),
                   fa3_desc_add(db, (ks >> 2) * FB_STEP * 128 + (ks & 3) * 32), ks > 0);
    fa3_commit();
}

/* This thread's dS^T (a: the bf16 A fragments of dK += dS^T Q, from c_to_a) into the dS^T tile
 * at shared address tile ([FB_ROWS keys][FB_STEP queries], one 128-byte-swizzled column block):
 * key rows r and r + 8, query columns 16 kk + 2t (+1) and 16 kk + 8 + 2t (+1). */
__device__ __forceinline__ void fb_store_ds(uint32_t tile, const uint32_t (&a)[FB_STEP / 16][4],
                                            int r, int t) {
    const uint32_t row0 = tile + r * 128, row1 = row0 + 8 * 128, x = r & 7;
#pragma unroll
    for (int kk = 0; kk < FB_STEP / 16; kk++) {
        const uint32_t c0 = ((2 * kk) ^ x) * 16 + 4 * t, c1 = ((2 * kk + 1) ^ x) * 16 + 4 * t;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row0 + c0), "r"(a[kk][0]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row1 + c0), "r"(a[kk][1]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row0 + c1), "r"(a[kk][2]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row1 + c1), "r"(a[kk][3]) : "memory");
    }
}

/* This thread's part of a warpgroup's dQ [64 queries, 8 NT columns] (rows r and r + 8,
 * scaled) into its boxes at shared address dst ([64][32] fp32 each, 128-byte swizzle). The 16
 * lanes of a half-warp hold 4 rows (x = r & 7 takes 4 values), so the 8 columns nt alone fall
 * in 4 of a row's 8 swizzled 16-byte chunks (2-way bank conflicts); each store therefore takes
 * columns nt for lanes t < 2 and columns nt ^ 2 (the same box) for lanes t >= 2, which meet
 * all 8 chunks. Over the loop every lane stores each of its columns once. */
template <int NT>
__device__ __forceinline__ void fb_store_dq(uint32_t dst, const float (&d)[NT][4], int r, int t,
                                            float scale) {
    const uint32_t x = r & 7;
    const bool lo = t < 2;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int np = nt ^ 2, ns = lo ? nt : np; /* the columns this lane stores */
        const uint32_t box = dst + (nt >> 2) * FB_DQ_BOX;
        const uint32_t c = (((ns & 3) * 2 + (t >> 1)) ^ x) * 16 + (t & 1) * 8;
        const float v0 = lo ? d[nt][0] : d[np][0], v1 = lo ? d[nt][1] : d[np][1];
        const float v2 = lo ? d[nt][2] : d[np][2], v3 = lo ? d[nt][3] : d[np][3];
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(box + r * 128 + c), "f"(v0 * scale),
                     "f"(v1 * scale)
                     : "memory");
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(box + (r + 8) * 128 + c),
                     "f"(v2 * scale), "f"(v3 * scale)
                     : "memory");
    }
}

/* The dQ writer (one thread): for each step, once both warpgroups' dQ tiles are in shared
 * memory and this block's turn has come for the query block (sem [1]: the key blocks that
 * have added to it, the first first; want: how many come before this one), adds them into dq
 * (TMA reduce-add), frees the tiles and passes the turn on. */
template <int D>
__device__ __forceinline__ void fb_dq_turn(const fb_smem<D> &m, const CUtensorMap *mdq, int *sem,
                                           int want, int head, int64_t q0, int b, int64_t i) {
    for (int w = 0; w < 2; w++)
        fa3_bar_wait(m.bqf + 8 * w, (uint32_t)(i & 1));
#if FB_DQ_TURNS
    int seen;
    do
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
    while (seen != want);
    asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the acquire before the adds */
#else
    (void)sem, (void)want;
#endif
    for (int box = 0; box < D / 32; box++)
        fa3_tma_add(mdq, m.dq + box * FB_DQ_BOX, box * 32, head, (int)q0, b);
    fa3_bulk_commit_wait_read();
    for (int w = 0; w < 2; w++)
        fa3_bar_arrive(m.bqe + 8 * w);
    fa3_bulk_wait(); /* the adds are done before the next block's turn */
#if FB_DQ_TURNS
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
#endif
}

/* dq [B, T, H, D] += scale * dS K (through mdq: boxes of 32 columns, FB_STEP rows), dk/dv
 * [B, T, KV, D] += scale * dS^T Q, += P^T dO (= under add 0; dq is zeroed by the caller); k/v
 * maps with boxes of FB_ROWS rows, q/dout maps with FB_STEP rows; lse/delta [B, H, T]; dstart
 * [B, T] or NULL; sem [B, H, ceil(T / FB_STEP)] zeros; nb = ceil(T / FB_ROWS) key blocks; a
 * grid of nb * B * KV blocks, the first key block of each (batch, kv head) first, so that a
 * block only waits for blocks started before it. */
template <int D>
__global__ void __launch_bounds__(FB_THREADS, 1)
    k_fb_bwd(float *__restrict__ dk, float *__restrict__ dv,
             const __grid_constant__ CUtensorMap mdq, const __grid_constant__ CUtensorMap mk,
             const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mq,
             const __grid_constant__ CUtensorMap mdo, const float *__restrict__ lse,
             const float *__restrict__ delta, const int32_t *__restrict__ dstart,
             int *__restrict__ sem, int64_t T, int H, int KV, int nb, float scale, int add) {
    const fb_smem<D> m = fb_begin<D>();
    const int nh = H / KV; /* the query heads this block walks */
    /* the block's key block kb and row by (a batch and kv head): rows in groups of
     * FB_ROWS_IN_TURN, each group's blocks the first key block first, the rows in turn */
    const int nby = (int)(gridDim.x / nb), grp = (int)blockIdx.x / (FB_ROWS_IN_TURN * nb);
    const int rem = (int)blockIdx.x - grp * FB_ROWS_IN_TURN * nb;
    const int gsz = min(FB_ROWS_IN_TURN, nby - grp * FB_ROWS_IN_TURN);
    const int kb = rem / gsz, by = grp * FB_ROWS_IN_TURN + rem % gsz;
    const int b = by / KV, hk = by % KV, h0 = hk * nh; /* h0: the first query head */
    const int64_t k0 = (int64_t)kb * FB_ROWS;
    /* the queries that see this block's keys */
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int64_t q_end = fa_query_end(dsb, (k0 + FB_ROWS < T ? k0 + FB_ROWS : T) - 1, T);
    const int nqt = (int)((q_end - k0 + FB_STEP - 1) / FB_STEP); /* query blocks a head */
    const int64_t ntiles = (int64_t)nqt * nh;
    /* step i's head and first query: the query blocks from the last down, the heads in turn
     * at each (so that the blocks of a chain meet each head's query block in the same step) */
    const auto coord = [&](int64_t i, int &head, int64_t &row) {
        head = h0 + (int)(i % nh);
        row = k0 + (nqt - 1 - i / nh) * FB_STEP;
    };
    const int wg = fa3_warpgroup(); /* 2: the producer */
    if (wg == 2) {
        fb_regs_producer();
        const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
        if (warp == 1 && lane == 0) { /* the dQ writer */
            const int64_t nq = (T + FB_STEP - 1) / FB_STEP;
            for (int64_t i = 0; i < ntiles; i++) {
                int head;
                int64_t q0;
                coord(i, head, q0);
                /* the key blocks before this one that add to the query block: from the one
                 * holding its first row's document start */
                const int first = dsb ? dsb[q0] / FB_ROWS : 0;
                fb_dq_turn<D>(m, &mdq, sem + ((int64_t)b * H + head) * nq + q0 / FB_STEP,
                              kb - first, head, q0, b, i);
            }
        }
        if (warp != 0) return;
        /* a step's lse * log2e, delta and document starts into its side arrays */
        const auto side = [&](int head, int64_t row, uint32_t dst) {
            const float *lg = lse + ((int64_t)b * H + head) * T;
            const float *dg = delta + ((int64_t)b * H + head) * T;
            for (int j = lane; j < FB_STEP; j += 32) {
                const int64_t q = row + j;
                const float l = q < T ? lg[q] * FA_LOG2E : 0.0f, d = q < T ? dg[q] : 0.0f;
                const int32_t st = dsb && q < T ? dsb[q] : 0;
                asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(dst + 4 * j), "f"(l));
                asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(dst + 4 * (FB_STEP + j)), "f"(d));
                asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(dst + 4 * (2 * FB_STEP + j)),
                             "r"(st));
            }
        };
        fb_produce<D>(m, &mk, &mv, hk, k0, b, &mq, &mdo, ntiles, coord, side);
        return;
    }
    fb_regs_consumer();
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, r = wg * 64 + warp * 16 + g; /* r: key row in block */
    const int64_t krow = k0 + wg * 64, key0 = k0 + r, key1 = key0 + 8;
    /* this warpgroup's dQ columns: where they start in K's tile and in the dQ boxes */
    const uint32_t kcols = (wg * FB_DQ_N(D) / 64) * FB_ROWS * 128 + (wg * FB_DQ_N(D) % 64) * 2;
    const uint32_t dqbox = m.dq + wg * (FB_DQ_N(D) / 32) * FB_DQ_BOX;
    const float sl2 = scale * FA_LOG2E;
    float dka[D / 8][4], dva[D / 8][4];
    fa_zero<D / 8>(dka);
    fa_zero<D / 8>(dva);
    fa3_bar_wait(m.br, 0);
    for (int i = 0; i < (int)ntiles; i++) { /* 32-bit: no 64-bit division a step */
        const int s = i % FB_NS;
        const int64_t q0 = k0 + (int64_t)(nqt - 1 - i / nh) * FB_STEP;
        const uint32_t tile = s * fb_smem<D>::TILE, ds = m.ds + (uint32_t)(i & 1) * fb_smem<D>::DS;
        fa3_bar_wait(m.bf + 8 * s, (uint32_t)((i / FB_NS) & 1));
        /* The products are issued as soon as their operands exist, each group waited for
         * only when its result is read, so that the tensor cores work while the warpgroup
         * computes: S^T and dP^T; P^T from S^T while dP^T runs; dV += P^T dO while dS^T is
         * formed; dK += dS^T Q while dS^T is stored and the other half awaited; dQ. */
        float sc[FB_STEP / 8][4], dp[FB_STEP / 8][4];
        fa_zero<FB_STEP / 8>(sc);
        fa_zero<FB_STEP / 8>(dp);
        fa3_fence();
        fb_scores<D>(sc, m.ra, m.sa + tile, wg); /* S^T */
        fb_scores<D>(dp, m.rb, m.sb + tile, wg); /* dP^T */
        fa3_wait<1>();
        fa3_hold(sc);
        const unsigned char *side = fb_raw + (m.side + s * fb_smem<D>::SIDE - smem_u32(fb_raw));
        const float *sL = reinterpret_cast<const float *>(side);
        fa_probs_cols<FB_STEP>(sc, sc, q0, key0, key1, sL,
                               reinterpret_cast<const int32_t *>(sL + 2 * FB_STEP), T, sl2, t,
                               dsb || q0 < krow + 63 || q0 + FB_STEP > T); /* sc: P^T */
        uint32_t pa[FB_STEP / 16][4], sa[FB_STEP / 16][4];
#pragma unroll
        for (int kk = 0; kk < FB_STEP / 16; kk++)
            c_to_a(pa[kk], sc, kk);
        fa3_fence();
        /* the step's dO as an N-major B operand (16 queries: 16 rows of 128 bytes) */
        const uint64_t desc_do = fa3_desc(m.sb + tile, FB_STEP * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < FB_STEP / 16; kk++) /* dV += P^T dO, 16 queries at a time */
            fa3_mma_rs(dva, pa[kk], fa3_desc_add(desc_do, kk * 16 * 128));
        fa3_commit();
        fa3_wait<1>(); /* dP^T; dV may still run */
        fa3_hold(dp);
        fa_dgrad_cols<FB_STEP>(dp, sc, dp, sL + FB_STEP, t); /* dp: dS^T */
#pragma unroll
        for (int kk = 0; kk < FB_STEP / 16; kk++)
            c_to_a(sa[kk], dp, kk);
        /* dS^T into this step's tile: the other warpgroup finished reading it two steps ago
         * (before the barrier of the last step) */
        fb_store_ds(ds, sa, r, t);
        fa3_fence_smem();
        fa3_fence();
        const uint64_t desc_q = fa3_desc(m.sa + tile, FB_STEP * 128, 1024); /* Q, as dO above */
#pragma unroll
        for (int kk = 0; kk < FB_STEP / 16; kk++) /* dK += dS^T Q */
            fa3_mma_rs(dka, sa[kk], fa3_desc_add(desc_q, kk * 16 * 128));
        fa3_commit();
        asm volatile("bar.sync 3, 256;\n" ::: "memory"); /* both halves of dS^T are stored */
        float dqa[FB_DQ_N(D) / 8][4];
        fa_zero<FB_DQ_N(D) / 8>(dqa);
        fa3_fence();
        const uint64_t desc_ds = fa3_desc(ds, FB_ROWS * 128, 1024),
                       desc_k = fa3_desc(m.ra + kcols, FB_ROWS * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < FB_ROWS / 16; kk++) /* dQ [64 queries, this wg's columns] = dS K */
            fa3_mma_ss_t(dqa, fa3_desc_add(desc_ds, kk * 16 * 128),
                         fa3_desc_add(desc_k, kk * 16 * 128), kk > 0);
        fa3_commit_wait();
        fa3_hold(dva);
        fa3_hold(dka);
        fa3_hold(pa);
        fa3_hold(sa);
        fa3_bar_arrive(m.be + 8 * s); /* done with the stage's Q and dO */
        fa3_hold(dqa);
        fa3_bar_wait(m.bqe + 8 * wg, (uint32_t)((i & 1) ^ 1)); /* the writer took the last */
        fb_store_dq(dqbox, dqa, warp * 16 + g, t, scale);
        fa3_fence_smem();
        fa3_bar_arrive(m.bqf + 8 * wg);
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
    const int64_t nq = (T + FB_STEP - 1) / FB_STEP;
    CUtensorMap mdq, mk, mv, mq, mdo; /* k, v: resident (128 rows); q, dout, dq: a step's 64 */
    if (!fa3_map(c, &mdq, dq, B, T, H, D, FB_STEP, op) ||
        !fa3_map(c, &mk, k, B, T, KV, D, FB_ROWS, op) ||
        !fa3_map(c, &mv, v, B, T, KV, D, FB_ROWS, op) ||
        !fa3_map(c, &mq, q, B, T, H, D, FB_STEP, op) ||
        !fa3_map(c, &mdo, dout, B, T, H, D, FB_STEP, op))
        return;
    const unsigned nb = (unsigned)((T + FB_ROWS - 1) / FB_ROWS);
    const size_t nsem = (size_t)(B * H * nq); /* a query block's dQ adds */
    int *sem = (int *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_F, nsem * sizeof(int), op);
    if (!sem ||
        !moe_cuda_check(c, cudaMemsetAsync(sem, 0, nsem * sizeof(int), c->stream), op,
                        "semaphores") ||
        (!add && !moe_cuda_check(
                     c, cudaMemsetAsync(dq, 0, (size_t)(B * T * H * D) * sizeof(float), c->stream),
                     op, "dq")) ||
        !moe_cuda_check(c,
                        cudaFuncSetAttribute(
                            k_fb_bwd<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        op, "shared memory %zu bytes", smem))
        return;
    const int64_t blocks = (int64_t)nb * B * KV;
    if (blocks > INT_MAX) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "%lld blocks of %d keys: more than %d",
                       (long long)blocks, FB_ROWS, INT_MAX);
        return;
    }
    k_fb_bwd<D><<<(unsigned)blocks, FB_THREADS, smem, c->stream>>>(
        dk, dv, mdq, mk, mv, mq, mdo, lse, delta, dstart, sem, T, (int)H, (int)KV, (int)nb, scale,
        add);
    MOE_CUDA_LAUNCHED(c, op, "wgmma backward: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B,
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
