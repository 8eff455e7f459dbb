/* attention_flash: causal grouped-query flash attention, forward and backward, for the CUDA
 * backend - bf16 tensor-core products (mma.sync m16n8k16), fp32 softmax statistics, memory
 * linear in T (no T x T matrix is ever stored). Head dims 16, 32, 64, 96 and 128. The fp32
 * recipe goes to the plain-fp32 kernels of attention_fp32.cu instead.
 *
 * Forward (FlashAttention-2 style): a block owns 64 query rows of one head (16 per warp),
 * walks the key blocks 0..diagonal with an online softmax and keeps the output accumulator in
 * registers; it saves lse = logsumexp of each scaled score row. Backward recomputes the
 * probabilities from lse in two kernels so that every gradient element has one owner (no
 * atomics, deterministic): one block per 64 queries accumulates dq, one block per 64 keys of
 * a kv head accumulates dk and dv over the query heads of its group. Rounding matches the
 * CPU backend's bf16 emulation: q, k, v, dout, the probabilities and the score gradients
 * enter the products as bf16; the output is stored rounded to bf16; gradients stay fp32.
 *
 * The one thing a reader must know: fragment layouts are the PTX ISA's for
 * m16n8k16 (g = lane/4, t = lane%4): A holds rows g and g+8, columns 2t,2t+1 (+8); B holds
 * k rows 2t,2t+1 (+8) of column g; C holds rows g, g+8 and columns 2t, 2t+1. The loaders
 * below read shared-memory tiles of row stride D+8 bf16 with ldmatrix (conflict-free for
 * D = 64, 128). Tiles stream in with cp.async, double-buffered: the next key (or query)
 * block is in flight while the current one is multiplied. The first, simpler version (plain
 * loads, no pipelining) is kept in bench/kernels/attention_flash_v1.cu.
 *
 * Document mask (dstart = doc_start [B, T] or NULL, moe/ops.h): query t sees keys dstart[t]..t. As
 * the starts never decrease along a row, a query block's earliest start is its first row's,
 * so the forward and dq kernels begin at that start's key block (the blocks before it are
 * skipped, not loaded); the dk/dv kernel ends at the last query of the document holding the
 * block's last key. Inside the blocks that remain, keys before a row's start are masked like
 * those after its diagonal. NULL gives exactly the causal kernels' arithmetic.
 *
 * The forward also takes cached keys (Tk > T keys, the queries the last T positions:
 * moe/ops.h): rows are masked and key blocks bounded at their positions r + Tk - T. */
#include <math.h>

#include "flash_common.cuh"

typedef __nv_bfloat16 bf16;

/* Tile sizes. FA_BK, FA_BQ_KV and FA_MINB may be set at compile time (-D) to try variants
 * (bench/kernels/README: the op test verifies a variant, its --perf mode times it). */
#define FA_BQ 64  /* query rows per block of the forward and dq kernels (4 warps x 16) */
#define FA_BKV 64 /* key rows per block of the dk/dv kernel (4 warps x 16) */
#ifndef FA_BK
#define FA_BK 64 /* key rows per step of the forward and dq kernels (multiple of 16) */
#endif
#ifndef FA_BQ_KV
#define FA_BQ_KV 32 /* query rows per step of the dk/dv kernel (multiple of 16) */
#endif
#ifndef FA_MINB
#define FA_MINB 1 /* __launch_bounds__ minimum blocks per SM of the forward and dq kernels */
#endif
#define FA_THREADS 128

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major tile. ldmatrix matrices:
 * 0 = (rows +0, cols +0) -> a0, 1 = (+8, +0) -> a1, 2 = (+0, +8) -> a2, 3 = (+8, +8) -> a3. */
template <int LD>
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16 *s, int r0, int k0, int lane) {
    int mi = lane >> 3;
    ldsm_x4(a, s + (r0 + (lane & 7) + (mi & 1) * 8) * LD + k0 + (mi >> 1) * 8);
}

/* B fragments of two n-tiles (n0..n0+15) with B(k, n) = M[n0 + n][k0 + k]: b[0..1] for
 * n-tile n0/8, b[2..3] for the next. Matrix i covers rows +8*(i/2), cols +8*(i%2). */
template <int LD>
__device__ __forceinline__ void load_b_t2(uint32_t b[4], const bf16 *s, int n0, int k0, int lane) {
    int mi = lane >> 3;
    ldsm_x4(b, s + (n0 + (lane & 7) + (mi >> 1) * 8) * LD + k0 + (mi & 1) * 8);
}

/* B fragments of two n-tiles with B(k, n) = M[k0 + k][n0 + n] (transposing ldmatrix):
 * matrix i covers rows (k) +8*(i%2), cols (n) +8*(i/2). */
template <int LD>
__device__ __forceinline__ void load_b_n2(uint32_t b[4], const bf16 *s, int k0, int n0, int lane) {
    int mi = lane >> 3;
    ldsm_x4_t(b, s + (k0 + (lane & 7) + (mi & 1) * 8) * LD + n0 + (mi >> 1) * 8);
}

/* The backward's two score products of a warp's 16 rows: s [16, N] = A1 B1^T and dp [16, N]
 * = A2 B2^T over D, A1 and A2 from rows r0 .. r0 + 15 of a1, a2 [.., LD] and B1, B2 rows 0 .. N
 * - 1 of b1, b2 [N, LD] (shared memory, bf16); s and dp are overwritten. */
template <int N, int D, int LD>
__device__ __forceinline__ void score_pair(float (&s)[N / 8][4], float (&dp)[N / 8][4],
                                           const bf16 *a1, const bf16 *a2, const bf16 *b1,
                                           const bf16 *b2, int r0, int lane) {
    fa_zero<N / 8>(s);
    fa_zero<N / 8>(dp);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        uint32_t x1[4], x2[4];
        load_a<LD>(x1, a1, r0, ks * 16, lane);
        load_a<LD>(x2, a2, r0, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t y1[4], y2[4];
            load_b_t2<LD>(y1, b1, np * 16, ks * 16, lane);
            load_b_t2<LD>(y2, b2, np * 16, ks * 16, lane);
            mma16816(s[2 * np], x1, y1);
            mma16816(s[2 * np + 1], x1, y1 + 2);
            mma16816(dp[2 * np], x2, y2);
            mma16816(dp[2 * np + 1], x2, y2 + 2);
        }
    }
}

/* acc [16, D] += P B for a warp's 16 rows: P [16, N] the fp32 accumulator of an earlier product
 * (probabilities or dS, rounded to bf16 as an A operand), B rows 0 .. N - 1 of b [N, LD] (shared
 * memory, bf16). */
template <int N, int D, int LD>
__device__ __forceinline__ void acc_product(float (&acc)[D / 8][4], const float (&p)[N / 8][4],
                                            const bf16 *b, int lane) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        uint32_t pa[4];
        c_to_a(pa, p, kk);
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
            uint32_t bfr[4];
            load_b_n2<LD>(bfr, b, kk * 16, np * 16, lane);
            mma16816(acc[2 * np], pa, bfr);
            mma16816(acc[2 * np + 1], pa, bfr + 2);
        }
    }
}

/* Starts copying rows [row0, row0 + rows) of a [*, stride] bf16 tensor into a [rows][LD]
 * tile with cp.async (16 bytes per request); rows >= T are zero-filled (source size 0). The
 * caller commits the group and waits for it before reading. */
template <int D, int LD>
__device__ __forceinline__ void cp_tile(bf16 *s, const bf16 *g, int rows, int64_t row0, int64_t T,
                                        int64_t stride) {
    const int chunks = D / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        int r = i / chunks, c8 = (i % chunks) * 8;
        int ok = row0 + r < T;
        const bf16 *src = ok ? g + (row0 + r) * stride + c8 : g;
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s + r * LD + c8)),
            "l"(src), "r"(ok ? 16 : 0));
    }
}

/* ------------------------------------------------------------------------------------------
 * forward */

template <int D, typename TO>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB)
    k_fa_fwd(TO *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
             const bf16 *__restrict__ k, const bf16 *__restrict__ v,
             const int32_t *__restrict__ dstart, int64_t T, int64_t Tk, int H, int KV,
             float scale) {
    constexpr int LD = D + 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_smem);
    bf16 *sKb = sQ + FA_BQ * LD;      /* [2][FA_BK][LD] */
    bf16 *sVb = sKb + 2 * FA_BK * LD; /* [2][FA_BK][LD] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int qb = gridDim.x - 1 - blockIdx.x; /* longest (diagonal-most) blocks first */
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * FA_BQ;
    const int64_t qstride = (int64_t)H * D, kstride = (int64_t)KV * D;
    const bf16 *qg = q + (int64_t)b * T * qstride + (int64_t)h * D;
    const bf16 *kg = k + (int64_t)b * Tk * kstride + (int64_t)hk * D;
    const bf16 *vg = v + (int64_t)b * Tk * kstride + (int64_t)hk * D;
    const int64_t qoff = Tk - T; /* query row r sits at key position r + qoff */

    /* causal: the last key any row of this block sees is min(q0 + FA_BQ, T) - 1 + qoff; the
     * first is the document start of row q0 (0 without a mask) */
    const int kb_last = (int)(((q0 + FA_BQ < T ? q0 + FA_BQ : T) - 1 + qoff) / FA_BK);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int kb_first = dsb ? dsb[q0] / FA_BK : 0;
    cp_tile<D, LD>(sQ, qg, FA_BQ, q0, T, qstride);
    cp_tile<D, LD>(sKb, kg, FA_BK, (int64_t)kb_first * FA_BK, Tk, kstride);
    cp_tile<D, LD>(sVb, vg, FA_BK, (int64_t)kb_first * FA_BK, Tk, kstride);
    cp_commit();

    uint32_t qf[D / 16][4];
    float o[D / 8][4];
    fa_zero<D / 8>(o);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    /* the first key of each row's document (rows past T: 0, never stored) */
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float sl2 = scale * FA_LOG2E;

    /* it counts the blocks walked: buffer it & 1 holds block kb */
    for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) {
        const int64_t k0 = (int64_t)kb * FA_BK;
        if (kb < kb_last) { /* prefetch the next key block into the other buffer */
            int nb = (it + 1) & 1;
            cp_tile<D, LD>(sKb + nb * FA_BK * LD, kg, FA_BK, k0 + FA_BK, Tk, kstride);
            cp_tile<D, LD>(sVb + nb * FA_BK * LD, vg, FA_BK, k0 + FA_BK, Tk, kstride);
        }
        cp_commit(); /* possibly empty: keeps one group per iteration */
        cp_wait<1>();
        __syncthreads();
        const bf16 *sK = sKb + (it & 1) * FA_BK * LD, *sV = sVb + (it & 1) * FA_BK * LD;
        if (it == 0) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++)
                load_a<LD>(qf[ks], sQ, warp * 16, ks * 16, lane);
        }
        float s[FA_BK / 8][4];
        fa_zero<FA_BK / 8>(s);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
#pragma unroll
            for (int np = 0; np < FA_BK / 16; np++) {
                uint32_t bfr[4];
                load_b_t2<LD>(bfr, sK, np * 16, ks * 16, lane);
                mma16816(s[2 * np], qf[ks], bfr);
                mma16816(s[2 * np + 1], qf[ks], bfr + 2);
            }
        float a0, a1;
        fa_softmax_block<FA_BK>(s, m0, m1, l0, l1, a0, a1, k0, row0 + qoff, row1 + qoff, st0, st1,
                                sl2, t, dsb || k0 + FA_BK - 1 > q0 + warp * 16 + qoff);
        fa_rescale<D / 8>(o, a0, a1);
        acc_product<FA_BK, D, LD>(o, s, sV, lane);
        __syncthreads(); /* all reads of this buffer are done before it is refilled */
    }
    fa_store_rows<D>(out + (int64_t)b * T * qstride + (int64_t)h * D, lse + (int64_t)bh * T, o, m0,
                     m1, l0, l1, row0, row1, T, qstride, t);
}

/* ------------------------------------------------------------------------------------------
 * backward: Delta = rowsum(dout * out), then dq, then dk/dv */

/* delta[b, h, t] = sum_d dout * out over one row; one warp per row */
template <typename TO>
__global__ void k_fa_delta(float *__restrict__ delta, const float *__restrict__ dout,
                           const TO *__restrict__ out, int64_t B, int64_t T, int H, int D) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; /* (b*T + t)*H + h */
    int lane = threadIdx.x & 31;
    if (row >= B * T * H) return;
    const float *a = dout + row * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32)
        s += a[d] * moe_ld(out, row * D + d);
    s = moe_warp_sum(s);
    if (lane == 0) {
        int64_t h = row % H, bt = row / H, b = bt / T, tt = bt % T;
        delta[(b * H + h) * T + tt] = s;
    }
}

template <int D>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB)
    k_fa_bwd_dq(float *__restrict__ dq, const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                const bf16 *__restrict__ v, const bf16 *__restrict__ dout,
                const float *__restrict__ lse, const float *__restrict__ delta,
                const int32_t *__restrict__ dstart, int64_t T, int H, int KV, float scale,
                int add) {
    constexpr int LD = D + 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_smem);
    bf16 *sdO = sQ + FA_BQ * LD;
    bf16 *sKb = sdO + FA_BQ * LD;     /* [2][FA_BK][LD] */
    bf16 *sVb = sKb + 2 * FA_BK * LD; /* [2][FA_BK][LD] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * FA_BQ;
    const int64_t qstride = (int64_t)H * D, kstride = (int64_t)KV * D;
    const int64_t qoff = (int64_t)b * T * qstride + (int64_t)h * D;
    const bf16 *kg = k + (int64_t)b * T * kstride + (int64_t)hk * D;
    const bf16 *vg = v + (int64_t)b * T * kstride + (int64_t)hk * D;
    const int kb_last = (int)(((q0 + FA_BQ < T ? q0 + FA_BQ : T) - 1) / FA_BK);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL; /* the forward's key range */
    const int kb_first = dsb ? dsb[q0] / FA_BK : 0;
    cp_tile<D, LD>(sQ, q + qoff, FA_BQ, q0, T, qstride);
    cp_tile<D, LD>(sdO, dout + qoff, FA_BQ, q0, T, qstride);
    cp_tile<D, LD>(sKb, kg, FA_BK, (int64_t)kb_first * FA_BK, T, kstride);
    cp_tile<D, LD>(sVb, vg, FA_BK, (int64_t)kb_first * FA_BK, T, kstride);
    cp_commit();
    const int64_t row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float *lg = lse + (int64_t)bh * T, *dg = delta + (int64_t)bh * T;
    const float lse0 = row0 < T ? lg[row0] * FA_LOG2E : 0.0f,
                lse1 = row1 < T ? lg[row1] * FA_LOG2E : 0.0f;
    const float dl0 = row0 < T ? dg[row0] : 0.0f, dl1 = row1 < T ? dg[row1] : 0.0f;
    const float sl2 = scale * FA_LOG2E;
    float acc[D / 8][4];
    fa_zero<D / 8>(acc);

    for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) { /* buffer it & 1 holds kb */
        const int64_t k0 = (int64_t)kb * FA_BK;
        if (kb < kb_last) {
            int nb = (it + 1) & 1;
            cp_tile<D, LD>(sKb + nb * FA_BK * LD, kg, FA_BK, k0 + FA_BK, T, kstride);
            cp_tile<D, LD>(sVb + nb * FA_BK * LD, vg, FA_BK, k0 + FA_BK, T, kstride);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        const bf16 *sK = sKb + (it & 1) * FA_BK * LD, *sV = sVb + (it & 1) * FA_BK * LD;
        float s[FA_BK / 8][4], dp[FA_BK / 8][4];
        score_pair<FA_BK, D, LD>(s, dp, sQ, sdO, sK, sV, warp * 16, lane);
        fa_dscores_rows<FA_BK>(s, dp, k0, row0, row1, st0, st1, lse0, lse1, dl0, dl1, sl2, t,
                               dsb || k0 + FA_BK - 1 > q0 + warp * 16);
        acc_product<FA_BK, D, LD>(acc, s, sK, lane);
        __syncthreads();
    }
    fa_add_rows<D>(dq + qoff, acc, row0, row1, T, qstride, scale, t, add);
}

template <int D>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_bwd_dkv(float *__restrict__ dk, float *__restrict__ dv, const bf16 *__restrict__ q,
                 const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                 const bf16 *__restrict__ dout, const float *__restrict__ lse,
                 const float *__restrict__ delta, const int32_t *__restrict__ dstart, int64_t T,
                 int H, int KV, float scale, int add) {
    constexpr int LD = D + 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(fa_smem);
    bf16 *sV = sK + FA_BKV * LD;
    bf16 *sQb = sV + FA_BKV * LD;                                     /* [2][FA_BQ_KV][LD] */
    bf16 *sdOb = sQb + 2 * FA_BQ_KV * LD;                             /* [2][FA_BQ_KV][LD] */
    float *sLb = reinterpret_cast<float *>(sdOb + 2 * FA_BQ_KV * LD); /* [2][FA_BQ_KV] lse*log2e */
    float *sDb = sLb + 2 * FA_BQ_KV;                                  /* [2][FA_BQ_KV] delta */
    int32_t *sSb = reinterpret_cast<int32_t *>(sDb + 2 * FA_BQ_KV);   /* [2][FA_BQ_KV] doc start */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kb = gridDim.x - 1 - blockIdx.x;
    const int bk = blockIdx.y, b = bk / KV, hk = bk % KV, group = H / KV;
    const int64_t k0 = (int64_t)kb * FA_BKV;
    const int64_t qstride = (int64_t)H * D, kstride = (int64_t)KV * D;
    const int64_t koff = (int64_t)b * T * kstride + (int64_t)hk * D;
    /* the queries that see this block's keys */
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int64_t q_end = fa_query_end(dsb, (k0 + FA_BKV < T ? k0 + FA_BKV : T) - 1, T);
    /* the (query head, query block) tiles this key block sees, in order */
    const int64_t nqt = (q_end - k0 + FA_BQ_KV - 1) / FA_BQ_KV;
    const int64_t ntiles = nqt * group;

    /* loads tile i (head hh = i / nqt, queries q0..q0+31) into buffer buf */
    auto issue = [&](int64_t i, int buf) {
        int h = hk * group + (int)(i / nqt);
        int64_t q0 = k0 + (i % nqt) * FA_BQ_KV;
        int64_t qoff = (int64_t)b * T * qstride + (int64_t)h * D;
        cp_tile<D, LD>(sQb + buf * FA_BQ_KV * LD, q + qoff, FA_BQ_KV, q0, T, qstride);
        cp_tile<D, LD>(sdOb + buf * FA_BQ_KV * LD, dout + qoff, FA_BQ_KV, q0, T, qstride);
        const float *lg = lse + ((int64_t)b * H + h) * T, *dg = delta + ((int64_t)b * H + h) * T;
        for (int j = threadIdx.x; j < FA_BQ_KV; j += blockDim.x) {
            sLb[buf * FA_BQ_KV + j] = q0 + j < T ? lg[q0 + j] * FA_LOG2E : 0.0f;
            sDb[buf * FA_BQ_KV + j] = q0 + j < T ? dg[q0 + j] : 0.0f;
            sSb[buf * FA_BQ_KV + j] = dsb && q0 + j < T ? dsb[q0 + j] : 0;
        }
    };
    cp_tile<D, LD>(sK, k + koff, FA_BKV, k0, T, kstride);
    cp_tile<D, LD>(sV, v + koff, FA_BKV, k0, T, kstride);
    issue(0, 0);
    cp_commit();
    const int64_t key0 = k0 + warp * 16 + g, key1 = key0 + 8; /* this thread's accumulator rows */
    const float sl2 = scale * FA_LOG2E;
    float dka[D / 8][4], dva[D / 8][4];
    fa_zero<D / 8>(dka);
    fa_zero<D / 8>(dva);

    for (int64_t i = 0; i < ntiles; i++) {
        const int buf = (int)(i & 1);
        if (i + 1 < ntiles) issue(i + 1, buf ^ 1);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        const int64_t q0 = k0 + (i % nqt) * FA_BQ_KV;
        const bf16 *sQ = sQb + buf * FA_BQ_KV * LD, *sdO = sdOb + buf * FA_BQ_KV * LD;
        const float *sL = sLb + buf * FA_BQ_KV, *sD = sDb + buf * FA_BQ_KV;
        const int32_t *sS = sSb + buf * FA_BQ_KV;
        /* S^T [16 keys, 32 queries] = K_w Q^T ; dP^T = V_w dO^T */
        float s[FA_BQ_KV / 8][4], dp[FA_BQ_KV / 8][4];
        score_pair<FA_BQ_KV, D, LD>(s, dp, sK, sV, sQ, sdO, warp * 16, lane);
        float pt[FA_BQ_KV / 8][4];
        fa_dscores_cols<FA_BQ_KV>(s, dp, pt, q0, key0, key1, sL, sD, sS, T, sl2, t,
                                  dsb || q0 < k0 + warp * 16 + 15 || q0 + FA_BQ_KV > T);
#pragma unroll
        for (int kk = 0; kk < FA_BQ_KV / 16; kk++) {
            uint32_t pa[4], sa[4];
            c_to_a(pa, pt, kk);
            c_to_a(sa, s, kk);
#pragma unroll
            for (int np = 0; np < D / 16; np++) {
                uint32_t bd[4], bq[4];
                load_b_n2<LD>(bd, sdO, kk * 16, np * 16, lane);
                load_b_n2<LD>(bq, sQ, kk * 16, np * 16, lane);
                mma16816(dva[2 * np], pa, bd);
                mma16816(dva[2 * np + 1], pa, bd + 2);
                mma16816(dka[2 * np], sa, bq);
                mma16816(dka[2 * np + 1], sa, bq + 2);
            }
        }
        __syncthreads();
    }
    fa_add_rows<D>(dk + koff, dka, key0, key1, T, kstride, scale, t, add);
    fa_add_rows<D>(dv + koff, dva, key0, key1, T, kstride, 1.0f, t, add);
}

/* ------------------------------------------------------------------------------------------
 * host side */

int moe_cuda_attention_shape_ok(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                moe_recipe prec) {
    if (prec == MOE_RECIPE_FP32) return moe_cuda_attention_fp32_shape_ok(B, H, KV, D);
    if (prec != MOE_RECIPE_BF16) return 0;
    return (D == 16 || D == 32 || D == 64 || D == 96 || D == 128) && KV >= 1 && H % KV == 0 &&
           B * H <= 65535 && T <= (int64_t)FA_BQ * 0x7fffffff;
}

static int fa_shape_ok(moe_cuda_ctx *c, const char *op, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D, moe_recipe prec) {
    if (prec != MOE_RECIPE_BF16) {
        moe_cuda_check(
            c, cudaErrorNotSupported, op,
            "B=%lld T=%lld H=%lld KV=%lld D=%lld: fp8 recipes are not available in this build",
            (long long)B, (long long)T, (long long)H, (long long)KV, (long long)D);
        return 0;
    }
    if (!moe_cuda_attention_shape_ok(B, T, H, KV, D, prec)) {
        moe_cuda_check(c, cudaErrorNotSupported, op,
                       "B=%lld T=%lld H=%lld KV=%lld D=%lld: need D in {16, 32, 64, 96, 128}, "
                       "H %% KV == 0, B*H <= 65535",
                       (long long)B, (long long)T, (long long)H, (long long)KV, (long long)D);
        return 0;
    }
    return 1;
}

template <typename K>
static int fa_smem_attr(moe_cuda_ctx *c, K kernel, size_t bytes, const char *op) {
    if (bytes <= 48 * 1024) return 1;
    return moe_cuda_check(
        c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
        op, "shared memory %zu bytes", bytes);
}

/* out [B, T, H, D], lse [B, H, T], q [B, T, H, D], k/v [B, Tk, KV, D], dstart [B, T] or NULL */
template <int D, typename TO>
static void fa_forward_as(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                          const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t Tk,
                          int64_t H, int64_t KV) {
    const char *op = "attention_forward";
    size_t smem = (size_t)(FA_BQ + 4 * FA_BK) * (D + 8) * sizeof(bf16);
    if (!fa_smem_attr(c, k_fa_fwd<D, TO>, smem, op)) return;
    dim3 grid((unsigned)((T + FA_BQ - 1) / FA_BQ), (unsigned)(B * H));
    k_fa_fwd<D, TO><<<grid, FA_THREADS, smem, c->stream>>>(out, lse, q, k, v, dstart, T, Tk, (int)H,
                                                           (int)KV, 1.0f / sqrtf((float)D));
    MOE_CUDA_LAUNCHED(c, op, "B=%lld T=%lld Tk=%lld H=%lld KV=%lld D=%d", (long long)B,
                      (long long)T, (long long)Tk, (long long)H, (long long)KV, D);
}

/* out is F32 (holding bf16 values) or BF16. */
template <int D>
static void fa_forward(moe_cuda_ctx *c, moe_buf out, float *lse, const bf16 *q, const bf16 *k,
                       const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t Tk,
                       int64_t H, int64_t KV) {
    if (out.dt == MOE_DTYPE_BF16)
        fa_forward_as<D>(c, (bf16 *)out.p, lse, q, k, v, dstart, B, T, Tk, H, KV);
    else
        fa_forward_as<D>(c, (float *)out.p, lse, q, k, v, dstart, B, T, Tk, H, KV);
}

/* dq/q/dout [B, T, H, D], dk/dv/k/v [B, T, KV, D], lse/delta [B, H, T], dstart [B, T] or NULL */
template <int D>
static void fa_backward(moe_cuda_ctx *c, float *dq, float *dk, float *dv, const bf16 *q,
                        const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
                        const float *delta, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int add) {
    const char *op = "attention_backward";
    float scale = 1.0f / sqrtf((float)D);
    size_t smem_dq = (size_t)(2 * FA_BQ + 4 * FA_BK) * (D + 8) * sizeof(bf16);
    size_t smem_kv = (size_t)(2 * FA_BKV + 4 * FA_BQ_KV) * (D + 8) * sizeof(bf16) +
                     4 * FA_BQ_KV * sizeof(float) + 2 * FA_BQ_KV * sizeof(int32_t);
    if (!fa_smem_attr(c, k_fa_bwd_dq<D>, smem_dq, op) ||
        !fa_smem_attr(c, k_fa_bwd_dkv<D>, smem_kv, op))
        return;
    dim3 gq((unsigned)((T + FA_BQ - 1) / FA_BQ), (unsigned)(B * H));
    k_fa_bwd_dq<D><<<gq, FA_THREADS, smem_dq, c->stream>>>(dq, q, k, v, dout, lse, delta, dstart, T,
                                                           (int)H, (int)KV, scale, add);
    if (!MOE_CUDA_LAUNCHED(c, op, "dq: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B,
                           (long long)T, (long long)H, (long long)KV, D))
        return;
    dim3 gk((unsigned)((T + FA_BKV - 1) / FA_BKV), (unsigned)(B * KV));
    k_fa_bwd_dkv<D><<<gk, FA_THREADS, smem_kv, c->stream>>>(dk, dv, q, k, v, dout, lse, delta,
                                                            dstart, T, (int)H, (int)KV, scale, add);
    MOE_CUDA_LAUNCHED(c, op, "dk/dv: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B, (long long)T,
                      (long long)H, (long long)KV, D);
}

/* The bf16 operand of a typed q/k/v: a BF16 one as it is, an F32 one converted in `slot`. */
static const bf16 *fa_operand(moe_cuda_ctx *c, int slot, moe_cbuf x, int64_t n, const char *op) {
    if (x.dt == MOE_DTYPE_BF16) return (const bf16 *)x.p;
    if (!moe_cuda_typed_ok(c, x.dt, op)) return NULL;
    return moe_cuda_bf16_operand(c, slot, (const float *)x.p, n, op);
}

/* The fp32 kernel takes F32 operands only (BF16 ones exist under the bf16 recipe only). */
static int fa_all_f32(moe_cuda_ctx *c, const char *op, moe_cbuf a, moe_cbuf b, moe_cbuf d,
                      moe_cbuf e) {
    if (a.dt == MOE_DTYPE_F32 && b.dt == MOE_DTYPE_F32 && d.dt == MOE_DTYPE_F32 &&
        e.dt == MOE_DTYPE_F32)
        return 1;
    return moe_cuda_check(c, cudaErrorInvalidValue, op, "bf16 operands under the fp32 recipe");
}

void moe_cuda_attention_forward(const moe_backend *be, moe_buf out, float *lse, moe_cbuf q,
                                moe_cbuf k, moe_cbuf v, const int32_t *doc_start, int64_t B,
                                int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                                moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "attention_forward";
    if (moe_cuda_failed(c) || B <= 0 || T <= 0 || H <= 0 || !moe_cuda_typed_ok(c, out.dt, op))
        return;
    if (Tk < T) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "Tk=%lld keys for T=%lld queries",
                       (long long)Tk, (long long)T);
        return;
    }
    if (prec == MOE_RECIPE_FP32) {
        if (!fa_all_f32(c, op, moe_cbuf_from(out), q, k, v)) return;
        moe_cuda_attention_fp32_forward(c, (float *)out.p, lse, (const float *)q.p,
                                        (const float *)k.p, (const float *)v.p, doc_start, B, T, Tk,
                                        H, KV, D);
        return;
    }
    if (!fa_shape_ok(c, op, B, Tk, H, KV, D, prec)) return;
    const bf16 *qb = fa_operand(c, MOE_CUDA_SCRATCH_A, q, B * T * H * D, op);
    const bf16 *kb = qb ? fa_operand(c, MOE_CUDA_SCRATCH_B, k, B * Tk * KV * D, op) : NULL;
    const bf16 *vb = kb ? fa_operand(c, MOE_CUDA_SCRATCH_C, v, B * Tk * KV * D, op) : NULL;
    if (!vb) return;
#if MOE_HAVE_SM90A
    if (moe_cuda_fa3_supported(c, D, qb, kb, vb)) {
        moe_cuda_fa3_forward(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV, D);
        return;
    }
#endif
    switch (D) {
    case 16:
        fa_forward<16>(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV);
        break;
    case 32:
        fa_forward<32>(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV);
        break;
    case 64:
        fa_forward<64>(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV);
        break;
    case 96:
        fa_forward<96>(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV);
        break;
    default:
        fa_forward<128>(c, out, lse, qb, kb, vb, doc_start, B, T, Tk, H, KV);
        break;
    }
}

void moe_cuda_attention_backward(const moe_backend *be, float *dq, float *dk, float *dv,
                                 const float *dout, moe_cbuf q, moe_cbuf k, moe_cbuf v,
                                 moe_cbuf out, const float *lse, const int32_t *doc_start,
                                 int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                 moe_recipe prec, moe_grad_store st) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "attention_backward";
    const int add = st == MOE_GRAD_ADD;
    if (moe_cuda_failed(c) || B <= 0 || T <= 0 || H <= 0 || !moe_cuda_typed_ok(c, out.dt, op))
        return;
    if (prec == MOE_RECIPE_FP32) {
        if (!fa_all_f32(c, op, out, q, k, v)) return;
        moe_cuda_attention_fp32_backward(c, dq, dk, dv, dout, (const float *)q.p,
                                         (const float *)k.p, (const float *)v.p,
                                         (const float *)out.p, lse, doc_start, B, T, H, KV, D, add);
        return;
    }
    if (!fa_shape_ok(c, op, B, T, H, KV, D, prec)) return;
    float *delta =
        (float *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_E, (size_t)(B * H * T) * sizeof(float), op);
    if (!delta) return;
    int64_t rows = B * T * H;
    unsigned dgrid = (unsigned)((rows * 32 + 255) / 256);
    if (out.dt == MOE_DTYPE_BF16)
        k_fa_delta<<<dgrid, 256, 0, c->stream>>>(delta, dout, (const bf16 *)out.p, B, T, (int)H,
                                                 (int)D);
    else
        k_fa_delta<<<dgrid, 256, 0, c->stream>>>(delta, dout, (const float *)out.p, B, T, (int)H,
                                                 (int)D);
    if (!MOE_CUDA_LAUNCHED(c, op, "delta: B=%lld T=%lld H=%lld D=%lld", (long long)B, (long long)T,
                           (long long)H, (long long)D))
        return;
    const bf16 *qb = fa_operand(c, MOE_CUDA_SCRATCH_A, q, B * T * H * D, op);
    const bf16 *kb = qb ? fa_operand(c, MOE_CUDA_SCRATCH_B, k, B * T * KV * D, op) : NULL;
    const bf16 *vb = kb ? fa_operand(c, MOE_CUDA_SCRATCH_C, v, B * T * KV * D, op) : NULL;
    const bf16 *gb =
        vb ? moe_cuda_bf16_operand(c, MOE_CUDA_SCRATCH_D, dout, B * T * H * D, op) : NULL;
    if (!gb) return;
#if MOE_HAVE_SM90A
    /* dO's copy and dq go through tensor maps too (16-byte aligned) */
    if (moe_cuda_fa3_supported(c, D, qb, kb, vb) && (((uintptr_t)gb | (uintptr_t)dq) & 15) == 0) {
        moe_cuda_fa3_backward(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, D,
                              add);
        return;
    }
#endif
    switch (D) {
    case 16:
        fa_backward<16>(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, add);
        break;
    case 32:
        fa_backward<32>(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, add);
        break;
    case 64:
        fa_backward<64>(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, add);
        break;
    case 96:
        fa_backward<96>(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, add);
        break;
    default:
        fa_backward<128>(c, dq, dk, dv, qb, kb, vb, gb, lse, delta, doc_start, B, T, H, KV, add);
        break;
    }
}
