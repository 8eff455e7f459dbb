/* quant_fp8: the fp8-block activation quantizers of the CUDA backend - the operands of
 * cuBLASLt's block-scaled fp8 products and of the grouped fp8 kernel (row-wise, transposed per
 * expert, in tiles under precision.fp8_wgrad x-tiles, and activation pairs: SwiGLU's forward
 * and backward and RMSNorm's ln1 written as both copies in one pass), each the exact bytes of
 * moe/quant.h's CPU emulation: the encoding of quant_fp8.cuh (the weights' copies: quant_tiles.cu),
 * so a GPU product and the CPU emulation differ only in the order of their fp32 sums.
 *
 * The one thing a reader must know is cuBLASLt's scale layouts (sm_90, checked on an H200
 * 2026-12-01 against a double-precision reference): for an operand stored row-major [R, K]
 * (K contiguous, the product reduces over K), 1 x 128 blocks (VEC128_32F) keep their scale
 * at s[kb * R + r] (and such an operand's R must be a multiple of 16), 128 x 128 tiles
 * (BLK128x128_32F) at s[rb * round_up(ceil(K / 128), 4) + kb]. */
#include "moe/backend_cuda.h"
#include "quant_fp8.cuh"

/* 1 x 128 blocks (r, kb) of x [R, K] (KB = ceil(K / 128) a row), 8 lanes a block and 16
 * values a lane in two 16-byte loads (K a multiple of 16, x 16-byte aligned, R KB < 2^30):
 * q [R, K] (16 bytes a lane), s [kb * ls + r]. Each group of 8 lanes takes FP8_ROWS_U blocks,
 * FP8_ROWS_U * H8 apart (H8: the grid's groups of 8 lanes), all loaded before any is
 * reduced, so that a thread keeps 2 FP8_ROWS_U loads in flight (one a thread ran at 0.9 TB/s
 * on an H100, 2026-12-06); a warp's four groups read neighbouring blocks. A thread finds its
 * first block's row and column with one division and steps to the next ones (64-bit
 * divisions at every block were a third of the kernel's instructions). */
#define FP8_ROWS_U 2
template <typename T>
__global__ void k_fp8_rows(uint8_t *__restrict__ q, float *__restrict__ s, const T *__restrict__ x,
                           int R, int K, int KB, int64_t ls, int pow2) {
    const int l8 = threadIdx.x & 7;
    const unsigned g = (blockIdx.x * blockDim.x + threadIdx.x) / 8, H8 = gridDim.x * blockDim.x / 8;
    int r[FP8_ROWS_U], kb[FP8_ROWS_U];
    r[0] = (int)(g / KB), kb[0] = (int)(g % KB);
#pragma unroll
    for (int u = 1; u < FP8_ROWS_U; u++) {
        r[u] = r[u - 1] + (int)(H8 / KB), kb[u] = kb[u - 1] + (int)(H8 % KB);
        if (kb[u] >= KB) kb[u] -= KB, r[u]++;
    }
    float v[FP8_ROWS_U][16] = {};
#pragma unroll
    for (int u = 0; u < FP8_ROWS_U; u++) {
        const int j0 = kb[u] * QB + l8 * 16;
        if (r[u] < R && j0 < K) moe_ldv<16>(x, (int64_t)r[u] * K + j0, v[u]);
    }
#pragma unroll
    for (int u = 0; u < FP8_ROWS_U; u++) {
        float amax = fp8_lane_amax<16>(v[u]);
#pragma unroll
        for (int o = 4; o > 0; o /= 2) /* within the 8 lanes of the block; every lane takes
                                          part, live or not */
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (r[u] >= R) continue;
        const int j0 = kb[u] * QB + l8 * 16;
        const fp8_quot d = fp8_quot_of(fp8_scale(amax, pow2));
        uint32_t w[4];
        fp8_encode<16>(v[u], d.y, w);
        if (j0 < K) *(uint4 *)(q + (int64_t)r[u] * K + j0) = make_uint4(w[0], w[1], w[2], w[3]);
        if (l8 == 0) s[kb[u] * ls + r[u]] = d.s;
    }
}

/* The groups of a transposed quantization (moe_cuda_fp8_cols_t), passed by value: group e's
 * rows of x are off[e] .. off[e + 1], its padded 128-token blocks pb[e] .. pb[e + 1]. */
#define FP8_COLS_MAXE 128
typedef struct {
    int32_t off[FP8_COLS_MAXE + 1], pb[FP8_COLS_MAXE + 1];
} fp8_groups;

/* 4 consecutive values of x at p (8 bytes of bf16, 16 of fp32), kept as loaded, and as floats */
template <typename T> struct fp8_x4;
template <> struct fp8_x4<__nv_bfloat16> {
    uint2 w;
    __device__ __forceinline__ void load(const __nv_bfloat16 *p) {
        w = *(const uint2 *)p;
    }
    __device__ __forceinline__ void get(float *v) const {
        v[0] = __uint_as_float(w.x << 16), v[1] = __uint_as_float(w.x & 0xffff0000u);
        v[2] = __uint_as_float(w.y << 16), v[3] = __uint_as_float(w.y & 0xffff0000u);
    }
    /* bit 15 or 31 set where a value is +-Inf or NaN (all exponent bits set) */
    __device__ __forceinline__ uint32_t special() const {
        return (((w.x & 0x7f807f80u) + 0x00800080u) | ((w.y & 0x7f807f80u) + 0x00800080u)) &
               0x80008000u;
    }
    /* v rounded to bf16 as the elementwise kernels store it (moe_stv) */
    __device__ __forceinline__ void set(const float *v) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]),
                             hi = __floats2bfloat162_rn(v[2], v[3]);
        w.x = *(const uint32_t *)&lo, w.y = *(const uint32_t *)&hi;
    }
};
template <> struct fp8_x4<float> {
    float4 w;
    __device__ __forceinline__ void load(const float *p) {
        w = *(const float4 *)p;
    }
    __device__ __forceinline__ void get(float *v) const {
        v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    }
};

/* feature f (of 4) of 16 tokens' loads, as floats */
template <typename T>
__device__ __forceinline__ void fp8_cols_feature(const fp8_x4<T> (&raw)[16], int f, float *v) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float t[4];
        raw[i].get(t);
        v[i] = t[f];
    }
}

/* Where block (blockIdx.x, blockIdx.y) of a transposed quantization falls: the tile of 128
 * tokens (padded block b = blockIdx.y, counted over all groups) by 128 features (k0 =
 * 128 blockIdx.x) of group e, whose rows start at off[e] and whose block starts at token m0 of
 * the group (np padded tokens in all); thread (tx, ty) takes features k .. k + 3 (k = k0 +
 * 4 tx) of the tile's tokens 16 ty .. 16 ty + 15, of which `rows` are live (0 past the
 * group's end or past K). */
struct fp8_tile_at {
    int e, b, m0, np, k0, k, rows;
    int64_t row0; /* x's row of the thread's first token */
};
__device__ __forceinline__ fp8_tile_at fp8_tile_of(const fp8_groups &g, int E, int K) {
    fp8_tile_at t;
    const int ty = threadIdx.x / 32;
    /* e: the groups after the first whose blocks start at or before b (pb never decreases),
     * counted 32 at a time by the warp */
    t.b = blockIdx.y, t.e = 0;
    for (int j = 1 + threadIdx.x % 32; j - threadIdx.x % 32 < E; j += 32)
        t.e += __popc(__ballot_sync(0xffffffffu, j < E && g.pb[j] <= t.b));
    const int n = g.off[t.e + 1] - g.off[t.e];
    t.m0 = (t.b - g.pb[t.e]) * QB;
    t.np = (g.pb[t.e + 1] - g.pb[t.e]) * QB;
    t.k0 = blockIdx.x * 128, t.k = t.k0 + 4 * (threadIdx.x % 32);
    t.rows = t.k < K ? max(0, min(16, n - t.m0 - 16 * ty)) : 0;
    t.row0 = g.off[t.e] + t.m0 + 16 * ty;
    return t;
}

/* The thread's 4 features of its 16 tokens encoded by their scales d, each feature's 16 bytes
 * into chunk ch of its row of the shared tile tt (4 rows from tt's first). */
template <bool NANS, typename T>
__device__ __forceinline__ void fp8_cols_encode(const fp8_x4<T> (&raw)[16], const fp8_quot (&d)[4],
                                                uint4 (*tt)[8], int ch) {
#pragma unroll
    for (int f = 0; f < 4; f++) {
        float v[16];
        fp8_cols_feature(raw, f, v);
        uint32_t w[4];
        fp8_encode<16, NANS>(v, d[f].y, w);
        tt[f][ch] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* The tile's transposed copy from the values raw the 256 threads hold (fp8_tile_of's; zeros
 * where no token is live): group e's q_e [K, np] at q + 128 pb[e] K, columns past the group's
 * rows zero, one scale per 1 x 128 block along the tokens, block b of feature k at s[b * K +
 * k]; or, with st (thread 0's: where the tile's scale goes; NULL elsewhere), one scale for the
 * whole tile, s unused. The column amax goes through red (one barrier), and each thread's 16
 * bytes of a feature go into the shared tile tt [128 features][8 chunks of 16 tokens] at chunk
 * ty ^ (tx & 7) (8 lanes of a 16-byte store phase meet 8 bank groups), from which each
 * feature's 128 bytes leave as 8 16-byte stores. Starts and ends with every thread's shared
 * accesses behind a barrier, so that a block may call it again. With CLEAN the caller says whether
 * the thread's values are all finite (clean): then the encoding leaves out the NaN checks. */
template <bool CLEAN, typename T>
__device__ __forceinline__ void
fp8_cols_store(const fp8_x4<T> (&raw)[16], const fp8_tile_at &t, uint8_t *q, float *s, int K,
               const fp8_groups &g, int pow2, bool clean, bool tile = false, float *st = nullptr) {
    __shared__ float red[8][128];
    __shared__ uint4 tt[128][8];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    /* the amax of each of the thread's 4 features over its 16 tokens */
    float a[4];
#pragma unroll
    for (int f = 0; f < 4; f++) {
        float v[16];
        fp8_cols_feature(raw, f, v);
        a[f] = fp8_lane_amax<16>(v);
    }
    *(float4 *)&red[ty][4 * tx] = make_float4(a[0], a[1], a[2], a[3]);
    __syncthreads();
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sc[4];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 r = *(const float4 *)&red[i][4 * tx];
        m[0] = fmaxf(m[0], r.x), m[1] = fmaxf(m[1], r.y);
        m[2] = fmaxf(m[2], r.z), m[3] = fmaxf(m[3], r.w);
    }
    if (tile) { /* every warp holds all 128 columns' amax: the tile's is their max */
        float mt = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
#pragma unroll
        for (int o = 16; o >= 1; o /= 2)
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
        m[0] = m[1] = m[2] = m[3] = mt;
    }
    fp8_quot d[4];
#pragma unroll
    for (int f = 0; f < 4; f++) {
        d[f] = fp8_quot_of(fp8_scale(m[f], pow2));
        sc[f] = d[f].s;
    }
    /* one branch a thread, around the whole encoding (its code stays small) */
    if (CLEAN && clean)
        fp8_cols_encode<false>(raw, d, &tt[4 * tx], ty ^ (tx & 7));
    else
        fp8_cols_encode<true>(raw, d, &tt[4 * tx], ty ^ (tx & 7));
    if (st)
        *st = sc[0];
    else if (!tile && ty == 0 && t.k < K)
        *(float4 *)(s + (int64_t)t.b * K + t.k) = make_float4(sc[0], sc[1], sc[2], sc[3]);
    __syncthreads();
    uint8_t *qe = q + (int64_t)g.pb[t.e] * QB * K + t.m0;
#pragma unroll
    for (int u = threadIdx.x; u < 128 * 8; u += 256) {
        const int row = u / 8, ch = u % 8;
        if (t.k0 + row < K)
            *(uint4 *)(qe + (int64_t)(t.k0 + row) * t.np + 16 * ch) = tt[row][ch ^ ((row / 4) & 7)];
    }
    __syncthreads();
}

/* The max over a warp's lanes of each of the 16 values a[i] a lane holds, in 16 shuffles (16
 * warp maxima take 80): each step keeps half of a lane's values and takes the other half of its
 * partner's, so that lanes 2 i and 2 i + 1 end with the max of value i. */
__device__ __forceinline__ float fp8_warp_max16(float (&a)[16]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 8; h >= 1; h /= 2) {
        const bool up = lane & (2 * h);
#pragma unroll
        for (int j = 0; j < h; j++) {
            const float keep = up ? a[j + h] : a[j], send = up ? a[j] : a[j + h];
            a[j] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, 2 * h));
        }
    }
    return fmaxf(a[0], __shfl_xor_sync(0xffffffffu, a[0], 1));
}

/* The warp's n live tokens of raw encoded row by row into q [M, K], token i by the quotient
 * d of lanes 2 i and 2 i + 1 (fp8_rows_store); every token is encoded (the dead ones hold
 * zeros) and only the stores depend on liveness, so that no branch splits the warp. */
template <bool NANS, typename T>
__device__ __forceinline__ void fp8_rows_encode(const fp8_x4<T> (&raw)[16], const fp8_quot &d,
                                                uint8_t *q, const fp8_tile_at &t, int n, int K) {
    uint8_t *qr = q + t.row0 * K + t.k; /* the thread's first token; the next ones K apart */
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float v[4];
        raw[i].get(v);
        uint32_t w;
        fp8_encode<4, NANS>(v, __shfl_sync(0xffffffffu, d.y, 2 * i), &w);
        if (i < n && t.k < K) *(uint32_t *)(qr + (unsigned)(i * K)) = w;
    }
}

/* The same tile's row-wise copy (the 1 x 128 blocks along K are the tile's rows, each held by
 * one warp): q [M, K] and block (r, kb = blockIdx.x)'s scale at s[kb * ls + r]. A row's amax
 * comes from fp8_warp_max16, its scale from lane 2 i (which stores it), and the warp takes one
 * branch for all its rows, without NaN checks where every lane's values are finite (clean). */
template <typename T>
__device__ __forceinline__ void fp8_rows_store(const fp8_x4<T> (&raw)[16], const fp8_tile_at &t,
                                               uint8_t *q, float *s, int64_t ls, int K, int pow2,
                                               bool clean) {
    const int lane = threadIdx.x % 32;
    const int n = __shfl_sync(0xffffffffu, t.rows, 0); /* the warp's live tokens (lane 0: k < K) */
    float a[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float v[4];
        raw[i].get(v);
        a[i] = fp8_lane_amax<4>(v);
    }
    const fp8_quot d = fp8_quot_of(fp8_scale(fp8_warp_max16(a), pow2));
    if (lane % 2 == 0 && lane / 2 < n) s[(int64_t)blockIdx.x * ls + t.row0 + lane / 2] = d.s;
    if (__all_sync(0xffffffffu, clean))
        fp8_rows_encode<false>(raw, d, q, t, n, K);
    else
        fp8_rows_encode<true>(raw, d, q, t, n, K);
}

/* With the transposed copy in tiles: thread 0's address of its tile's scale in s (the launch's
 * first group's tile scales; moe_cuda_fp8_cols_t's layout), NULL in the other threads. */
__device__ __forceinline__ float *fp8_tile_scale_at(const fp8_tile_at &t, const fp8_groups &g,
                                                    float *s) {
    if (threadIdx.x != 0) return nullptr;
    int64_t ts = 0; /* the tile scales of the groups before t.e */
    for (int j = 0; j < t.e; j++)
        ts += (int64_t)gridDim.x * ((g.pb[j + 1] - g.pb[j] + 3) / 4 * 4);
    const int nb4 = (g.pb[t.e + 1] - g.pb[t.e] + 3) / 4 * 4;
    return s + ts + (int64_t)blockIdx.x * nb4 + (t.b - g.pb[t.e]);
}

/* Each group's rows of x [M, K] transposed into its own q_e [K, np_e] at q + 128 pb[e] K
 * (np_e = 128 (pb[e + 1] - pb[e]), columns past the group's n_e rows zero), one scale per
 * 1 x 128 block along the tokens: block b (b counted over all groups) of feature k at
 * s[b * K + k]; with TILES one scale per 128 x 128 tile of q_e, group e's tiles as a weight's
 * [K, np_e] (moe_fp8_tile_scales) after the earlier groups': tile (kt, j) at s[ts_e + kt *
 * round4(nb_e) + j], nb_e = pb[e + 1] - pb[e], ts_e the sum of ceil(K / 128) round4(nb) over
 * the groups before e. One block of 256 threads a tile of 128 tokens by 128 features (fp8_tile_of),
 * one 8-byte (bf16) or 16-byte (fp32) load a token (a warp a token's 128 features: 256 or
 * 512 contiguous bytes) kept as loaded, then fp8_cols_store. K a multiple of 4; q and x
 * 16-byte aligned. */
template <typename T, bool TILES>
__global__ void __launch_bounds__(256)
    k_fp8_cols_t(uint8_t *__restrict__ q, float *__restrict__ s, const T *__restrict__ x, int K,
                 const __grid_constant__ fp8_groups g, int E, int pow2) {
    const fp8_tile_at t = fp8_tile_of(g, E, K);
    float *st = TILES ? fp8_tile_scale_at(t, g, s) : nullptr;
    const T *xs = x + t.row0 * K + t.k;
    fp8_x4<T> raw[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        if (i < t.rows)
            raw[i].load(xs + (unsigned)(i * K));
        else
            raw[i] = {};
    fp8_cols_store<false>(raw, t, q, s, K, g, pow2, false, TILES, st);
}

/* An fp8-block activation pair's parts (moe/quant.h's layout) as one launch writes them: the
 * row-wise copy q [M, K] with its scales s [KB, ls], and the launch's groups' transposed
 * copies qt with their scales st (from its first group's). */
struct fp8_pair_out {
    uint8_t *q, *qt;
    float *s, *st;
};

/* Both copies of pair po from the bf16 values r the block's 256 threads hold (fp8_tile_of's
 * tile): the transposed one (in tiles where tiles), then the row-wise one, without NaN checks
 * where a thread's values are all finite. */
__device__ __forceinline__ void fp8_pair_store(const fp8_x4<__nv_bfloat16> (&r)[16],
                                               const fp8_tile_at &t, fp8_pair_out po, int64_t ls,
                                               int K, const fp8_groups &g, int pow2, bool tiles) {
    uint32_t sp = 0;
#pragma unroll
    for (int i = 0; i < 16; i++)
        sp |= r[i].special();
    const bool clean = sp == 0; /* no NaN to sign, no infinity */
    fp8_cols_store<true>(r, t, po.qt, po.st, K, g, pow2, clean, tiles,
                         tiles ? fp8_tile_scale_at(t, g, po.st) : nullptr);
    fp8_rows_store(r, t, po.q, po.s, ls, K, pow2, clean);
}

/* Tokens c .. c + 7 of a pair kernel's tile (rows live ones) of one input, x at the tile's
 * first token and column, tokens K apart: the 8 loads issued at once, each from a live
 * row (the dead tokens read the last live one and are never used; no rows: nothing loaded). A
 * load under its token's condition waited for the token before it to be computed: 16 memory
 * latencies a tile. */
template <typename T>
__device__ __forceinline__ void tile_chunk_load(fp8_x4<T> (&v)[8], const T *__restrict__ x, int c,
                                                int rows, int K) {
    if (rows > 0)
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u].load(x + (unsigned)(min(c + u, rows - 1) * K));
}

/* SwiGLU's backward (elementwise.cu's swiglu_grad) written as two fp8-block activation pairs,
 * pa for a's gradient and pb for b's: each value rounded to bf16 (what the BF16 outputs would
 * hold) and both copies of each written from the tile of fp8_tile_of, the rows and
 * transposed bytes of moe_cuda_fp8_rows and moe_cuda_fp8_cols_t on those bf16 values. A
 * thread loads its 16 tokens' 4 values of dout, a and b (K a multiple of 4; every array
 * 16-byte aligned). */
template <typename TA, typename TD>
__global__ void __launch_bounds__(256, 2) /* two blocks a SM: 128 registers */
    k_swiglu_bwd_pairs(fp8_pair_out pa, fp8_pair_out pb, int64_t ls, const TD *__restrict__ dout,
                       const TA *__restrict__ a, const TA *__restrict__ b, int K,
                       const __grid_constant__ fp8_groups g, int E, int pow2) {
    /* b's values while a's pair is written (32 registers): [16][256], dynamic (the static
     * limit is 48 KB) */
    extern __shared__ uint2 keep_[];
    uint2(*keep)[256] = (uint2(*)[256])keep_;
    const fp8_tile_at t = fp8_tile_of(g, E, K);
    const int64_t at = t.row0 * K + t.k;
    fp8_x4<__nv_bfloat16> ra[16];
#pragma unroll
    for (int c = 0; c < 16; c += 8) {
        fp8_x4<TD> gd[8];
        fp8_x4<TA> av[8], bv[8];
        tile_chunk_load(gd, dout + at, c, t.rows, K);
        tile_chunk_load(av, a + at, c, t.rows, K);
        tile_chunk_load(bv, b + at, c, t.rows, K);
        /* the chunk's gradients through swiglu_sigmoid_quick; again through swiglu_sigmoid
         * where it did not apply to a value (a < -87: rare), one branch a chunk */
        bool ok = true;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            fp8_x4<__nv_bfloat16> rb = {};
            ra[c + u] = {};
            if (c + u < t.rows) {
                float gf[4], af[4], bf[4], da[4], db[4];
                gd[u].get(gf), av[u].get(af), bv[u].get(bf);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    bool okj;
                    const float sj = swiglu_sigmoid_quick(af[j], true, &okj);
                    swiglu_grad_s(gf[j], af[j], bf[j], sj, &da[j], &db[j]);
                    ok &= okj;
                }
                ra[c + u].set(da), rb.set(db);
            }
            keep[c + u][threadIdx.x] = rb.w;
        }
        if (!ok)
            for (int u = 0; u < 8 && c + u < t.rows; u++) {
                float gf[4], af[4], bf[4], da[4], db[4];
                gd[u].get(gf), av[u].get(af), bv[u].get(bf);
                for (int j = 0; j < 4; j++)
                    swiglu_grad(gf[j], af[j], bf[j], true, &da[j], &db[j]);
                fp8_x4<__nv_bfloat16> rb;
                ra[c + u].set(da), rb.set(db);
                keep[c + u][threadIdx.x] = rb.w;
            }
    }
    /* a's pair, then b's (its values brought back into ra): one copy of the code, which is
     * large; fp8_cols_store's barriers order keep's accesses */
#pragma unroll 1
    for (int j = 0; j < 2; j++) {
        if (j)
#pragma unroll
            for (int i = 0; i < 16; i++)
                ra[i].w = keep[i][threadIdx.x];
        const fp8_pair_out po = {j ? pb.q : pa.q, j ? pb.qt : pa.qt, j ? pb.s : pa.s,
                                 j ? pb.st : pa.st}; /* field by field: no local copies */
        fp8_pair_store(ra, t, po, ls, K, g, pow2, false);
    }
}

/* SwiGLU's forward (swiglu_val) written as an fp8-block activation pair po: each value rounded
 * to bf16 (what a BF16 output would hold) and both copies written from the tile of
 * fp8_tile_of, the transposed one in blocks or (tiles) in 128 x 128 tiles: the bytes of
 * moe_cuda_fp8_rows and moe_cuda_fp8_cols_t on those bf16 values. A thread loads its 16
 * tokens' 4 values of a and b (K a multiple of 4; every array 16-byte aligned). */
template <typename TA>
__global__ void __launch_bounds__(256, 2)
    k_swiglu_fwd_pair(fp8_pair_out po, int64_t ls, const TA *__restrict__ a,
                      const TA *__restrict__ b, int K, const __grid_constant__ fp8_groups g, int E,
                      int pow2, int tiles) {
    const fp8_tile_at t = fp8_tile_of(g, E, K);
    const int64_t at = t.row0 * K + t.k;
    fp8_x4<__nv_bfloat16> r[16];
#pragma unroll
    for (int c = 0; c < 16; c += 8) {
        fp8_x4<TA> av[8], bv[8];
        tile_chunk_load(av, a + at, c, t.rows, K);
        tile_chunk_load(bv, b + at, c, t.rows, K);
        /* through swiglu_val_quick; again through swiglu_val where it did not apply, one
         * branch a chunk (as k_swiglu_bwd_pairs) */
        bool ok = true;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            r[c + u] = {};
            if (c + u < t.rows) {
                float af[4], bf[4], v[4];
                av[u].get(af), bv[u].get(bf);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    bool okj;
                    v[j] = swiglu_val_quick(af[j], bf[j], true, &okj);
                    ok &= okj;
                }
                r[c + u].set(v);
            }
        }
        if (!ok)
            for (int u = 0; u < 8 && c + u < t.rows; u++) {
                float af[4], bf[4], v[4];
                av[u].get(af), bv[u].get(bf);
                for (int j = 0; j < 4; j++)
                    v[j] = swiglu_val(af[j], bf[j], true);
                r[c + u].set(v);
            }
    }
    fp8_pair_store(r, t, po, ls, K, g, pow2, tiles);
}

/* x, the bf16 values an op would have stored (RMSNorm's ln1), written as an fp8-block
 * activation pair po: both copies from the tile of fp8_tile_of, the transposed one in blocks or
 * (tiles) in 128 x 128 tiles, the bytes of moe_cuda_fp8_rows and moe_cuda_fp8_cols_t on x, in one
 * pass where they take two. A thread loads its 16 tokens' 4 values (K a multiple of 4; x
 * 16-byte aligned); the dead tokens hold zeros, as fp8_pair_store expects. */
__global__ void __launch_bounds__(256, 2)
    k_fp8_pair(fp8_pair_out po, int64_t ls, const __nv_bfloat16 *__restrict__ x, int K,
               const __grid_constant__ fp8_groups g, int E, int pow2, int tiles) {
    const fp8_tile_at t = fp8_tile_of(g, E, K);
    fp8_x4<__nv_bfloat16> r[16];
#pragma unroll
    for (int c = 0; c < 16; c += 8) {
        fp8_x4<__nv_bfloat16> v[8];
        tile_chunk_load(v, x + t.row0 * K + t.k, c, t.rows, K);
#pragma unroll
        for (int u = 0; u < 8; u++)
            r[c + u] = c + u < t.rows ? v[u] : fp8_x4<__nv_bfloat16>{};
    }
    fp8_pair_store(r, t, po, ls, K, g, pow2, tiles);
}

int moe_cuda_fp8_rows(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, int64_t R, int64_t K,
                      int64_t ls, int pow2, const char *op) {
    if (R <= 0 || K <= 0) return 1;
    const int64_t KB = (K + QB - 1) / QB, nblk = R * KB;
    const int64_t groups = (nblk + FP8_ROWS_U - 1) / FP8_ROWS_U;
    if (K % 16 != 0 || (uintptr_t)x.p % 16 != 0 || nblk >= (1LL << 30))
        return moe_cuda_check(c, cudaErrorInvalidValue, op,
                              "fp8 rows: R=%lld K=%lld (K a multiple of 16, a 16-byte aligned "
                              "input and fewer than 2^30 blocks expected)",
                              (long long)R, (long long)K);
    const unsigned blocks = (unsigned)((groups * 8 + 255) / 256);
    if (x.dt == MOE_DTYPE_BF16)
        k_fp8_rows<<<blocks, 256, 0, c->stream>>>(q, s, (const __nv_bfloat16 *)x.p, (int)R, (int)K,
                                                  (int)KB, ls, pow2);
    else
        k_fp8_rows<<<blocks, 256, 0, c->stream>>>(q, s, (const float *)x.p, (int)R, (int)K, (int)KB,
                                                  ls, pow2);
    return MOE_CUDA_LAUNCHED(c, op, "fp8 rows R=%lld K=%lld", (long long)R, (long long)K);
}

/* The transposed quantizers' launches over groups offsets [E + 1] (host) of K columns,
 * FP8_COLS_MAXE groups a launch: launch(g, ne, pb0, ts0) for each chunk with a padded block, g
 * its ne groups (rows absolute), pb0 the padded blocks and ts0 the tile scales of the groups
 * before it (its part of a transposed copy starts at 128 pb0 K bytes, of the scales at pb0 K,
 * or ts0 in tiles). 0 after a failed launch. */
template <typename F>
static int fp8_group_chunks(const int32_t *offsets, int64_t E, int64_t K, F launch) {
    int64_t pb0 = 0, ts0 = 0;
    for (int64_t e0 = 0; e0 < E; e0 += FP8_COLS_MAXE) {
        const int ne = (int)(E - e0 < FP8_COLS_MAXE ? E - e0 : FP8_COLS_MAXE);
        fp8_groups g;
        g.pb[0] = 0;
        for (int e = 0; e <= ne; e++)
            g.off[e] = offsets[e0 + e];
        for (int e = 0; e < ne; e++)
            g.pb[e + 1] = g.pb[e] + (int32_t)(moe_cuda_fp8_pad(g.off[e + 1] - g.off[e]) / QB);
        if (g.pb[ne] > 0 && !launch(g, ne, pb0, ts0)) return 0;
        pb0 += g.pb[ne];
        for (int e = 0; e < ne; e++)
            ts0 += moe_fp8_tile_scales(K, (int64_t)(g.pb[e + 1] - g.pb[e]) * QB);
    }
    return 1;
}

int moe_cuda_fp8_cols_t(moe_cuda_ctx *c, uint8_t *q, float *s, moe_cbuf x, const int32_t *offsets,
                        int64_t E, int64_t K, int pow2, int tiles, const char *op) {
    if (K <= 0) return 1;
    if (K % 4 != 0 || K >= (1LL << 31) || ((uintptr_t)x.p | (uintptr_t)q | (uintptr_t)s) % 16 != 0)
        return moe_cuda_check(c, cudaErrorInvalidValue, op,
                              "fp8 columns: K=%lld a multiple of 4 and 16-byte aligned buffers "
                              "expected",
                              (long long)K);
    const int64_t KT = (K + 127) / 128;
    return fp8_group_chunks(
        offsets, E, K, [&](const fp8_groups &g, int ne, int64_t pb0, int64_t ts0) {
            const dim3 grid((unsigned)KT, (unsigned)g.pb[ne]);
            uint8_t *qc = q + pb0 * QB * K;
            float *sc = tiles ? s + ts0 : s + pb0 * K;
            const __nv_bfloat16 *xh = (const __nv_bfloat16 *)x.p;
            const float *xf = (const float *)x.p;
            const int k = (int)K;
            if (x.dt == MOE_DTYPE_BF16 && tiles)
                k_fp8_cols_t<__nv_bfloat16, true>
                    <<<grid, 256, 0, c->stream>>>(qc, sc, xh, k, g, ne, pow2);
            else if (x.dt == MOE_DTYPE_BF16)
                k_fp8_cols_t<__nv_bfloat16, false>
                    <<<grid, 256, 0, c->stream>>>(qc, sc, xh, k, g, ne, pow2);
            else if (tiles)
                k_fp8_cols_t<float, true><<<grid, 256, 0, c->stream>>>(qc, sc, xf, k, g, ne, pow2);
            else
                k_fp8_cols_t<float, false><<<grid, 256, 0, c->stream>>>(qc, sc, xf, k, g, ne, pow2);
            return MOE_CUDA_LAUNCHED(c, op, "fp8 columns E=%d K=%lld", ne, (long long)K);
        });
}

/* ---- the pair launchers: one block a 128 x 128 tile (fp8_tile_of), FP8_COLS_MAXE groups a
 * launch ---- */

/* 1 when the pair kernels take a pair of layout l (K a multiple of 16, fewer than 2^30 row
 * blocks, K < 2^31) with arrays whose addresses or-ed are al (each 16-byte aligned). */
static bool pair_shape_ok(const moe_fp8_pair_layout &l, uintptr_t al) {
    return l.K % 16 == 0 && l.M * l.KB < (1LL << 30) && l.K < (1LL << 31) && al % 16 == 0;
}

/* The parts of pair p (layout l) that a launch over the groups after pb0 padded blocks and
 * ts0 tile scales writes (fp8_group_chunks' chunk). */
static fp8_pair_out pair_out_at(uint8_t *p, const moe_fp8_pair_layout &l, int64_t pb0,
                                int64_t ts0) {
    fp8_pair_out po;
    po.q = p;
    po.s = (float *)(p + l.s_rows);
    po.qt = p + l.q_cols + pb0 * QB * l.K;
    po.st = (float *)(p + l.s_cols) + (l.tiles ? ts0 : pb0 * l.K);
    return po;
}

/* The launches writing pair out (layout l) over pairs' groups: launch(po, grid, g, ne) a
 * chunk of ne groups g, po its parts of out, grid one block a tile. 0 after a failed launch. */
template <typename F>
static int pair_chunks(uint8_t *out, const moe_fp8_pair_layout &l, const moe_fp8_groups *pairs,
                       F launch) {
    return fp8_group_chunks(pairs->offsets, pairs->E, l.K,
                            [&](const fp8_groups &g, int ne, int64_t pb0, int64_t ts0) {
                                return launch(pair_out_at(out, l, pb0, ts0),
                                              dim3((unsigned)l.KB, (unsigned)g.pb[ne]), g, ne);
                            });
}

/* k_swiglu_bwd_pairs for a's and dout's types */
#define PAIRS_KEEP (16 * 256 * sizeof(uint2)) /* k_swiglu_bwd_pairs's dynamic shared memory */
template <typename TA, typename TD>
static int swiglu_pairs_launch(moe_cuda_ctx *c, dim3 grid, const fp8_pair_out &pa,
                               const fp8_pair_out &pb, int64_t ls, moe_cbuf dout, moe_cbuf a,
                               moe_cbuf b, int K, const fp8_groups &g, int ne, int pow2,
                               const char *op) {
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_swiglu_bwd_pairs<TA, TD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)PAIRS_KEEP),
                        op, "shared memory %d bytes", (int)PAIRS_KEEP))
        return 0;
    k_swiglu_bwd_pairs<TA, TD><<<grid, 256, PAIRS_KEEP, c->stream>>>(
        pa, pb, ls, (const TD *)dout.p, (const TA *)a.p, (const TA *)b.p, K, g, ne, pow2);
    return 1;
}

void moe_cuda_swiglu_backward_pairs(moe_cuda_ctx *c, uint8_t *da, uint8_t *db, moe_cbuf dout,
                                    moe_cbuf a, moe_cbuf b, const moe_fp8_groups *pairs,
                                    const char *op) {
    const int64_t K = pairs->K;
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(pairs->offsets, pairs->E, K, 0);
    if (l.M <= 0 || K <= 0) return;
    if (pairs->tiles) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "fp8-block pairs of gradients (dy operands) in tiles: blocks expected");
        return;
    }
    const uintptr_t al =
        (uintptr_t)da | (uintptr_t)db | (uintptr_t)dout.p | (uintptr_t)a.p | (uintptr_t)b.p;
    if (!pair_shape_ok(l, al) || a.dt != b.dt || !moe_cuda_typed_ok(c, a.dt, op) ||
        !moe_cuda_typed_ok(c, dout.dt, op)) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "fp8-block pairs: K=%lld (a multiple of 16), M=%lld, inputs %s/%s/%s (F32 "
                       "or BF16, a and b of one type) and 16-byte aligned arrays expected",
                       (long long)K, (long long)l.M, moe_dtype_name(dout.dt), moe_dtype_name(a.dt),
                       moe_dtype_name(b.dt));
        return;
    }
    fp8_group_chunks(
        pairs->offsets, pairs->E, K, [&](const fp8_groups &g, int ne, int64_t pb0, int64_t) {
            const fp8_pair_out pa = pair_out_at(da, l, pb0, 0), pb = pair_out_at(db, l, pb0, 0);
            const dim3 grid((unsigned)l.KB, (unsigned)g.pb[ne]);
            const int bf_a = a.dt == MOE_DTYPE_BF16, bf_d = dout.dt == MOE_DTYPE_BF16;
            typedef __nv_bfloat16 bf;
            const int ok =
                bf_a && bf_d ? swiglu_pairs_launch<bf, bf>(c, grid, pa, pb, l.lds, dout, a, b,
                                                           (int)K, g, ne, pairs->pow2, op)
                : bf_a ? swiglu_pairs_launch<bf, float>(c, grid, pa, pb, l.lds, dout, a, b, (int)K,
                                                        g, ne, pairs->pow2, op)
                : bf_d ? swiglu_pairs_launch<float, bf>(c, grid, pa, pb, l.lds, dout, a, b, (int)K,
                                                        g, ne, pairs->pow2, op)
                       : swiglu_pairs_launch<float, float>(c, grid, pa, pb, l.lds, dout, a, b,
                                                           (int)K, g, ne, pairs->pow2, op);
            return ok && MOE_CUDA_LAUNCHED(c, op, "fp8-block pairs E=%d K=%lld", ne, (long long)K);
        });
}

void moe_cuda_swiglu_forward_pair(moe_cuda_ctx *c, uint8_t *out, moe_cbuf a, moe_cbuf b,
                                  const moe_fp8_groups *pairs, const char *op) {
    const int64_t K = pairs->K;
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(pairs->offsets, pairs->E, K, pairs->tiles);
    if (l.M <= 0 || K <= 0) return;
    if (!pair_shape_ok(l, (uintptr_t)out | (uintptr_t)a.p | (uintptr_t)b.p) || a.dt != b.dt ||
        !moe_cuda_typed_ok(c, a.dt, op)) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "fp8-block pair: K=%lld (a multiple of 16), M=%lld, inputs %s/%s (F32 or "
                       "BF16, of one type) and 16-byte aligned arrays expected",
                       (long long)K, (long long)l.M, moe_dtype_name(a.dt), moe_dtype_name(b.dt));
        return;
    }
    pair_chunks(out, l, pairs, [&](const fp8_pair_out &po, dim3 grid, const fp8_groups &g, int ne) {
        if (a.dt == MOE_DTYPE_BF16)
            k_swiglu_fwd_pair<<<grid, 256, 0, c->stream>>>(po, l.lds, (const __nv_bfloat16 *)a.p,
                                                           (const __nv_bfloat16 *)b.p, (int)K, g,
                                                           ne, pairs->pow2, pairs->tiles);
        else
            k_swiglu_fwd_pair<<<grid, 256, 0, c->stream>>>(po, l.lds, (const float *)a.p,
                                                           (const float *)b.p, (int)K, g, ne,
                                                           pairs->pow2, pairs->tiles);
        return MOE_CUDA_LAUNCHED(c, op, "fp8-block pair E=%d K=%lld", ne, (long long)K);
    });
}

void moe_cuda_fp8_pair(moe_cuda_ctx *c, uint8_t *out, moe_cbuf x, const moe_fp8_groups *pairs,
                       const char *op) {
    const int64_t K = pairs->K;
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(pairs->offsets, pairs->E, K, pairs->tiles);
    if (l.M <= 0 || K <= 0) return;
    if (!pair_shape_ok(l, (uintptr_t)out | (uintptr_t)x.p) || x.dt != MOE_DTYPE_BF16) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "fp8-block pair: K=%lld (a multiple of 16), M=%lld, input %s (BF16) and "
                       "16-byte aligned arrays expected",
                       (long long)K, (long long)l.M, moe_dtype_name(x.dt));
        return;
    }
    pair_chunks(out, l, pairs, [&](const fp8_pair_out &po, dim3 grid, const fp8_groups &g, int ne) {
        k_fp8_pair<<<grid, 256, 0, c->stream>>>(po, l.lds, (const __nv_bfloat16 *)x.p, (int)K, g,
                                                ne, pairs->pow2, pairs->tiles);
        return MOE_CUDA_LAUNCHED(c, op, "fp8-block pair E=%d K=%lld", ne, (long long)K);
    });
}

void moe_cuda_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                            const moe_fp8_groups *pairs) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "quantize_pair";
    if (moe_cuda_failed(c)) return;
    if (!pairs || !moe_cbuf_is_fp8_pair(moe_cbuf_from(out)) || x.mx || pairs->E > be->fp8_pairs) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "an fp8-block pair output with its groups (at most %d) expected, got %s "
                       "with %lld groups",
                       be->fp8_pairs, moe_dtype_name(out.dt), pairs ? (long long)pairs->E : 0LL);
        return;
    }
    moe_cuda_fp8_pair(c, (uint8_t *)out.p, x, pairs, op);
}

extern "C" void moe_cuda_fp8_block_operand(const moe_backend *be, uint8_t *q, float *s, moe_cbuf x,
                                           const int32_t *offsets, int64_t E, int64_t K,
                                           int transpose, int pow2) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "fp8_block_operand";
    if (moe_cuda_failed(c)) return;
    if (transpose)
        moe_cuda_fp8_cols_t(c, q, s, x, offsets, E, K, pow2, transpose == 2, op);
    else
        moe_cuda_fp8_rows(c, q, s, x, offsets[E], K, (offsets[E] + 3) / 4 * 4, pow2, op);
}
