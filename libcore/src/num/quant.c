/* quant: fake quantization for the fp8 recipes (moe/quant.h), and the stored forms the GPU's
 * products read (fp8-block blocks, activation pairs and tiles; MXFP8 blocks and tiled operands).
 * Each block: its amax over the finite values, its scale by the recipe's rule, then every
 * element through E4M3 (saturating) and back, times the scale. Blocks are independent: OpenMP
 * over vectors, bit-identical for any thread count. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/dtype.h"
#include "moe/ops.h" /* moe_fp8_tile_scales */
#include "moe/quant.h"

#define FP8_MAX 448.0f /* largest finite E4M3 */

/* max(m, |v|) over finite v: NaN and +-Inf fail the comparison (no libm call in the loops) */
static inline float amax_step(float m, float v) {
    float a = fabsf(v);
    return a <= FLT_MAX && a > m ? a : m;
}

moe_quant_opts moe_quant_opts_of(moe_recipe r) {
    moe_quant_opts o = {moe_recipe_format(r), r == MOE_RECIPE_MXFP8_FLOOR, moe_recipe_pow2(r)};
    return o;
}

int64_t moe_quant_block(const moe_quant_opts *o) {
    return o->recipe == MOE_RECIPE_MXFP8 ? 32 : 128;
}

/* The scale of a block whose finite values have magnitude at most amax (fp8-block's at least
 * FLT_MIN, 2^-126: its reciprocal is finite). */
static float block_scale(float amax, const moe_quant_opts *o) {
    if (!(amax > 0.0f)) return 1.0f; /* all zero (or nothing finite): any scale gives 0 */
    if (o->recipe == MOE_RECIPE_MXFP8) return moe_mx_block_scale(amax, o->mx_floor);
    const float s = fmaxf(amax / FP8_MAX, FLT_MIN);
    return o->pow2 ? moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(s)) : s;
}

static float fake(float x, float scale, float rcp) {
    return moe_e4m3_to_f32(moe_f32_to_e4m3(x * rcp, 1)) * scale;
}

/* Adjacent vectors (vstride 1: the columns of a row-major matrix whose rows are estride
 * apart) in chunks of COLS of them, one block of rows at a time: each row's run of the chunk
 * is read contiguously, where walking one column at a time would touch a cache line an
 * element. The same amax and values as the general walk. */
#define COLS 256
static void fake_columns(float *dst, const float *src, int64_t nvec, int64_t len, int64_t estride,
                         int64_t bs, const moe_quant_opts *o) {
    const int64_t nblk = (len + bs - 1) / bs, nch = (nvec + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nblk * nch; t++) {
        const int64_t b0 = t / nch * bs, b1 = b0 + bs < len ? b0 + bs : len;
        const int64_t c0 = t % nch * COLS, nc = nvec - c0 < COLS ? nvec - c0 : COLS;
        float scale[COLS], rcp[COLS];
        for (int64_t c = 0; c < nc; c++)
            scale[c] = 0.0f; /* the amax first */
        for (int64_t j = b0; j < b1; j++)
            for (int64_t c = 0; c < nc; c++)
                scale[c] = amax_step(scale[c], src[j * estride + c0 + c]);
        for (int64_t c = 0; c < nc; c++)
            scale[c] = block_scale(scale[c], o), rcp[c] = 1.0f / scale[c];
        for (int64_t j = b0; j < b1; j++)
            for (int64_t c = 0; c < nc; c++)
                dst[j * estride + c0 + c] = fake(src[j * estride + c0 + c], scale[c], rcp[c]);
    }
}

void moe_quant_fake_vectors(float *dst, const float *src, int64_t nvec, int64_t vstride,
                            int64_t len, int64_t estride, const moe_quant_opts *o) {
    int64_t bs = moe_quant_block(o);
    if (vstride == 1 && estride >= nvec && nvec > 1) {
        fake_columns(dst, src, nvec, len, estride, bs, o);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t v = 0; v < nvec; v++) {
        const float *s = src + v * vstride;
        float *d = dst + v * vstride;
        for (int64_t b0 = 0; b0 < len; b0 += bs) {
            int64_t b1 = b0 + bs < len ? b0 + bs : len;
            float amax = 0.0f;
            for (int64_t j = b0; j < b1; j++)
                amax = amax_step(amax, s[j * estride]);
            const float scale = block_scale(amax, o), rcp = 1.0f / scale;
            for (int64_t j = b0; j < b1; j++)
                d[j * estride] = fake(s[j * estride], scale, rcp);
        }
    }
}

void moe_fp8_encode_block(uint8_t *q, float *scale, const float *src, int64_t n, int pow2) {
    const moe_quant_opts o = {MOE_RECIPE_FP8_BLOCK, 0, pow2};
    float amax = 0.0f;
    for (int64_t j = 0; j < n; j++)
        amax = amax_step(amax, src[j]);
    *scale = block_scale(amax, &o);
    const float rcp = 1.0f / *scale;
    for (int64_t j = 0; j < n; j++)
        q[j] = moe_f32_to_e4m3(src[j] * rcp, 1);
}

/* ---- fp8-block activation pairs (moe/quant.h's layout, kernels/quant_fp8.cu's bytes) ---- */

static size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

/* The layout of M rows of K columns whose groups take PB padded blocks of 128 tokens, with
 * ncs scales in the transposed copy. */
static moe_fp8_pair_layout pair_layout(int64_t M, int64_t K, int64_t PB, int64_t ncs, int tiles) {
    moe_fp8_pair_layout l;
    l.M = M, l.K = K, l.KB = (K + 127) / 128, l.lds = (M + 3) / 4 * 4, l.PB = PB, l.tiles = tiles;
    l.s_rows = align256((size_t)(M * K));
    l.q_cols = align256(l.s_rows + sizeof(float) * (size_t)(l.KB * l.lds));
    l.s_cols = align256(l.q_cols + (size_t)(128 * PB * K));
    l.bytes = align256(l.s_cols + sizeof(float) * (size_t)ncs);
    return l;
}

/* The padded 128-token blocks of group e, and of the groups before it. */
static int64_t group_blocks(const int32_t *offsets, int64_t e) {
    return (offsets[e + 1] - offsets[e] + 127) / 128;
}
static int64_t blocks_before(const int32_t *offsets, int64_t e) {
    int64_t pb = 0;
    for (int64_t g = 0; g < e; g++)
        pb += group_blocks(offsets, g);
    return pb;
}
/* The tile scales of the transposed copies of the groups before e (K columns). */
static int64_t tile_scales_before(const int32_t *offsets, int64_t e, int64_t K) {
    int64_t ts = 0;
    for (int64_t g = 0; g < e; g++)
        ts += moe_fp8_tile_scales(K, 128 * group_blocks(offsets, g));
    return ts;
}

moe_fp8_pair_layout moe_fp8_pair_layout_of(const int32_t *offsets, int64_t E, int64_t K,
                                           int tiles) {
    const int64_t PB = blocks_before(offsets, E);
    return pair_layout(offsets[E], K, PB, tiles ? tile_scales_before(offsets, E, K) : PB * K,
                       tiles);
}

/* sum_e ceil(n_e / 128) = sum_e floor((n_e + 127) / 128) <= floor((M + 127 E) / 128): the sum of
 * floors is at most the floor of the sum, and every part of the layout grows with PB. Tiles
 * take ceil(K / 128) round4(nb_e) <= 4 ceil(K / 128) nb_e <= K nb_e scales (K >= 4). */
size_t moe_fp8_pair_bytes_max(int64_t M, int64_t E, int64_t K) {
    const int64_t PB = (M + 127 * E) / 128;
    return pair_layout(M, K, PB, PB * K, 0).bytes;
}

/* One group's transposed copy q_e [K, 128 nb] from its rows x_e [n, K] (nb = ceil(n / 128)
 * blocks, the tokens past n zero bytes): 1 x 128 blocks along the tokens, block b of column k
 * at s[b * K + k] */
static void group_cols_blocks(uint8_t *qe, float *s, const float *xe, int64_t n, int64_t nb,
                              int64_t K, int pow2) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nb * K; t++) { /* column k of block b */
        const int64_t b = t / K, k = t % K, j0 = b * 128, len = n - j0 < 128 ? n - j0 : 128;
        float v[128];
        uint8_t q[128] = {0}; /* the tokens past the group's end stay zero bytes */
        for (int64_t j = 0; j < len; j++)
            v[j] = xe[(j0 + j) * K + k];
        moe_fp8_encode_block(q, &s[b * K + k], v, len, pow2);
        memcpy(qe + k * 128 * nb + j0, q, 128);
    }
}

/* The same in 128 x 128 tiles: the group's rows, zero-padded to 128 nb, quantized as a
 * weight's tiles (moe_quant_tiles_e4m3's transposed copy and its scales s) */
static void group_cols_tiles(uint8_t *qe, float *s, const float *xe, int64_t n, int64_t nb,
                             int64_t K, int pow2) {
    const int64_t np = 128 * nb;
    if (np == 0) return;
    float *xp = calloc((size_t)(np * K), sizeof(float));
    uint8_t *qr = malloc((size_t)(np * K)); /* the row-wise copy, not kept */
    float *sr = malloc(sizeof(float) * (size_t)moe_fp8_tile_scales(np, K));
    if (!xp || !qr || !sr) abort();
    memcpy(xp, xe, sizeof(float) * (size_t)(n * K));
    moe_quant_tiles_e4m3(qr, sr, qe, s, xp, np, K, pow2);
    free(xp), free(qr), free(sr);
}

void moe_fp8_pair_encode(uint8_t *pair, const float *x, const int32_t *offsets, int64_t E,
                         int64_t K, int pow2, int tiles) {
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(offsets, E, K, tiles);
    float *s_rows = (float *)(pair + l.s_rows), *s_cols = (float *)(pair + l.s_cols);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < l.M; r++)
        for (int64_t kb = 0; kb < l.KB; kb++) {
            const int64_t k0 = kb * 128, len = K - k0 < 128 ? K - k0 : 128;
            moe_fp8_encode_block(pair + r * K + k0, &s_rows[kb * l.lds + r], x + r * K + k0, len,
                                 pow2);
        }
    int64_t pb = 0, ts = 0; /* the blocks and tile scales of the groups before e */
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = offsets[e], n = offsets[e + 1] - r0, nb = group_blocks(offsets, e);
        uint8_t *qe = pair + l.q_cols + 128 * pb * K; /* q_e [K, 128 nb] */
        if (tiles)
            group_cols_tiles(qe, s_cols + ts, x + r0 * K, n, nb, K, pow2);
        else
            group_cols_blocks(qe, s_cols + pb * K, x + r0 * K, n, nb, K, pow2);
        pb += nb, ts += moe_fp8_tile_scales(K, 128 * nb);
    }
}

void moe_fp8_pair_rows(float *x, const uint8_t *pair, const moe_fp8_pair_layout *l) {
    const float *s = (const float *)(pair + l->s_rows);
    const int64_t K = l->K;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < l->M; r++)
        for (int64_t k = 0; k < K; k++)
            x[r * K + k] = moe_e4m3_to_f32(pair[r * K + k]) * s[k / 128 * l->lds + r];
}

void moe_fp8_pair_cols(float *x, const uint8_t *pair, const moe_fp8_pair_layout *l,
                       const int32_t *offsets, int64_t e) {
    const int64_t K = l->K, n = offsets[e + 1] - offsets[e], nb = group_blocks(offsets, e);
    const int64_t np = 128 * nb, pb = blocks_before(offsets, e), nb4 = (nb + 3) / 4 * 4;
    const uint8_t *q = pair + l->q_cols + 128 * pb * K; /* q_e [K, np] */
    const float *s =
        (const float *)(pair + l->s_cols) + (l->tiles ? tile_scales_before(offsets, e, K) : pb * K);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++)
        for (int64_t k = 0; k < K; k++)
            x[j * K + k] = moe_e4m3_to_f32(q[k * np + j]) *
                           (l->tiles ? s[k / 128 * nb4 + j / 128] : s[j / 128 * K + k]);
}

/* The scale of the tile [r0, r1) x [k0, k1) of src [R, K]. */
static float tile_scale(const float *src, int64_t K, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                        const moe_quant_opts *o) {
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = k0; k < k1; k++)
            amax = amax_step(amax, src[r * K + k]);
    return block_scale(amax, o);
}

#define TILE 128

void moe_quant_fake_tiles(float *dst, const float *src, int64_t R, int64_t K, int pow2) {
    const moe_quant_opts o = {MOE_RECIPE_FP8_BLOCK, 0, pow2};
    const int64_t tr = (R + TILE - 1) / TILE, tk = (K + TILE - 1) / TILE;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tr * tk; i++) {
        int64_t r0 = (i / tk) * TILE, k0 = (i % tk) * TILE;
        int64_t r1 = r0 + TILE < R ? r0 + TILE : R, k1 = k0 + TILE < K ? k0 + TILE : K;
        const float scale = tile_scale(src, K, r0, r1, k0, k1, &o), rcp = 1.0f / scale;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t k = k0; k < k1; k++)
                dst[r * K + k] = fake(src[r * K + k], scale, rcp);
    }
}

void moe_quant_tiles_e4m3(uint8_t *q, float *s, uint8_t *qt, float *st, const float *src, int64_t R,
                          int64_t K, int pow2) {
    const moe_quant_opts o = {MOE_RECIPE_FP8_BLOCK, 0, pow2};
    const int64_t tr = (R + TILE - 1) / TILE, tk = (K + TILE - 1) / TILE;
    const int64_t ls = (tk + 3) / 4 * 4, lst = (tr + 3) / 4 * 4; /* padded rows of scales */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tr * tk; i++) {
        int64_t rb = i / tk, kb = i % tk, r0 = rb * TILE, k0 = kb * TILE;
        int64_t r1 = r0 + TILE < R ? r0 + TILE : R, k1 = k0 + TILE < K ? k0 + TILE : K;
        const float scale = tile_scale(src, K, r0, r1, k0, k1, &o), rcp = 1.0f / scale;
        s[rb * ls + kb] = scale;
        st[kb * lst + rb] = scale;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t k = k0; k < k1; k++) {
                uint8_t b = moe_f32_to_e4m3(src[r * K + k] * rcp, 1);
                q[r * K + k] = b;
                qt[k * R + r] = b;
            }
    }
}

void moe_quant_tiles_decode(float *dst, const uint8_t *q, const float *s, int64_t R, int64_t K,
                            int transpose) {
    const int64_t tk = (K + TILE - 1) / TILE, ls = (tk + 3) / 4 * 4;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++) {
            float v = moe_e4m3_to_f32(q[r * K + k]) * s[(r / TILE) * ls + k / TILE];
            dst[transpose ? k * R + r : r * K + k] = v;
        }
}

void moe_mxfp8_encode_block(uint8_t *q, uint8_t *mx, const float *src, int floor_rule) {
    const moe_quant_opts o = {MOE_RECIPE_MXFP8, floor_rule, 0};
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = amax_step(amax, src[j]);
    float scale = block_scale(amax, &o);
    *mx = moe_f32_to_e8m0_ceil(scale); /* a power of two: exact */
    for (int j = 0; j < 32; j++)
        q[j] = moe_f32_to_e4m3(src[j] / scale, 1);
}

void moe_mx_encode_tiled(uint8_t *q, uint8_t *sc, const float *x, int64_t R, int64_t K,
                         int floor_rule, int transpose) {
    const int64_t rows = transpose ? K : R, cols = transpose ? moe_mx_pad(R) : K;
    memset(sc, 127, (size_t)moe_mx_tiled_bytes(rows, cols));
    float v[32];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t kb = 0; kb < cols / 32; kb++) {
            for (int j = 0; j < 32; j++) { /* element j of block kb of the operand's row r */
                const int64_t k = kb * 32 + j;
                v[j] = !transpose ? x[r * K + k] : k < R ? x[k * K + r] : 0.0f;
            }
            moe_mxfp8_encode_block(q + r * cols + kb * 32, sc + moe_mx_tiled_index(r, kb, cols), v,
                                   floor_rule);
        }
}
