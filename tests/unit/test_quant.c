/* test_quant: the fp8 recipes' fake quantization (moe/quant.h): exact round trip of values
 * E4M3 holds at scale 1, zero blocks, NaN kept without touching its block's scale, the
 * error bound of E4M3 (3 mantissa bits: half an ulp is 2^-4 relative) for every value in
 * the normal range of its block, mxfp8's two scale rules (ceil: powers of two and nothing
 * saturates; ocp-floor: 2^(floor(log2 amax) - 8)), blocks that do not straddle the end of a
 * vector, strided (column) vectors, 128 x 128 tiles that keep a small tile small next to a
 * large one, and the same bits for any thread count; the stored MXFP8 form (encode, decode:
 * the fake quantization's values, and encoding them again keeps them) and the stored
 * fp8-block form of an activation block and of activation pairs (both operands of a grouped
 * product in one buffer, with its layout and size bound). */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "moe/dtype.h"
#include "moe/quant.h"
#include "testlib.h"

static float urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static const moe_quant_opts FP8 = {MOE_RECIPE_FP8_BLOCK, 0, 0}, MX = {MOE_RECIPE_MXFP8, 0, 0},
                            MXF = {MOE_RECIPE_MXFP8, 1, 0}, P2 = {MOE_RECIPE_FP8_BLOCK, 0, 1};

static void test_exact_and_special(void) {
    float x[128], y[128];
    uint64_t s = 1;
    for (int i = 0; i < 128; i++) /* E4M3 values, the largest 448: the scale is exactly 1 */
        x[i] = moe_e4m3_to_f32((uint8_t)((s = s * 6364136223846793005ull + 1) >> 57 & 0x7e));
    x[7] = 448.0f;
    moe_quant_fake_vectors(y, x, 1, 128, 128, 1, &FP8);
    CHECK(memcmp(x, y, sizeof x) == 0);
    float z[32] = {0}, zq[32];
    moe_quant_fake_vectors(zq, z, 1, 32, 32, 1, &MX);
    CHECK(memcmp(z, zq, sizeof z) == 0);
    float n[32], nq[32];
    for (int i = 0; i < 32; i++)
        n[i] = urand(&s);
    n[3] = NAN;
    float ref[32];
    memcpy(ref, n, sizeof n);
    ref[3] = 0.0f; /* the block without its NaN: the same scale */
    moe_quant_fake_vectors(nq, n, 1, 32, 32, 1, &MX);
    moe_quant_fake_vectors(ref, ref, 1, 32, 32, 1, &MX);
    CHECK(isnan(nq[3]));
    for (int i = 0; i < 32; i++)
        if (i != 3) CHECK(nq[i] == ref[i]);
}

/* max |q - x| / |x| over values at least 2^-6 of their block's amax / 448 scale (E4M3's
 * normal range), for blocks of b along vectors of len */
static double worst_rel(const float *x, const float *q, int64_t len, int64_t b) {
    double worst = 0;
    for (int64_t b0 = 0; b0 < len; b0 += b) {
        double amax = 0;
        for (int64_t j = b0; j < b0 + b && j < len; j++)
            amax = fmax(amax, fabs(x[j]));
        for (int64_t j = b0; j < b0 + b && j < len; j++)
            if (fabs(x[j]) * 448.0 >= amax * 0x1.0p-6) /* E4M3 normals: x / scale >= 2^-6 */
                worst = fmax(worst, fabs(q[j] - x[j]) / fabs(x[j]));
    }
    return worst;
}

/* 1 when every block of bs values of q [n] (quantized x) fits under 448 x the power of two
 * at or above its amax / 448 (nothing saturated) and reaches amax within E4M3 precision. */
static int pow2_unsaturated(const float *x, const float *q, int n, int bs) {
    for (int b0 = 0; b0 < n; b0 += bs) {
        double amax = 0, qmax = 0;
        for (int j = b0; j < b0 + bs && j < n; j++)
            amax = fmax(amax, fabs(x[j])), qmax = fmax(qmax, fabs(q[j]));
        if (!(qmax <= 448.0 * exp2(ceil(log2(amax / 448.0))) && qmax >= amax * (1 - 0x1.0p-4)))
            return 0;
    }
    return 1;
}

static void test_error_and_rules(void) {
    enum { LEN = 1000 };
    float x[LEN], q[LEN];
    uint64_t s = 7;
    for (int i = 0; i < LEN; i++)
        x[i] = urand(&s) * (i % 97 == 0 ? 300.0f : 1.0f); /* outliers */
    moe_quant_fake_vectors(q, x, 1, LEN, LEN, 1, &FP8);
    CHECK_MSG(worst_rel(x, q, LEN, 128) <= 0x1.0p-4, "fp8-block error %g",
              worst_rel(x, q, LEN, 128));
    moe_quant_fake_vectors(q, x, 1, LEN, LEN, 1, &MX);
    CHECK_MSG(worst_rel(x, q, LEN, 32) <= 0x1.0p-4, "mxfp8 error %g", worst_rel(x, q, LEN, 32));
    /* ceil: the scale is a power of two and no value saturates (|q| <= 448 scale >= amax) */
    CHECK(pow2_unsaturated(x, q, LEN, 32));
    /* ocp-floor: scale 2^(floor(log2 amax) - 8); the block's largest values saturate at 448
     * times it when amax / scale > 448 */
    float one[32];
    for (int i = 0; i < 32; i++)
        one[i] = 0.5f;
    one[0] = 500.0f; /* floor(log2 500) = 8: scale 1, 500 saturates to 448 */
    moe_quant_fake_vectors(one, one, 1, 32, 32, 1, &MXF);
    CHECK(one[0] == 448.0f && one[1] == 0.5f);
    /* fp8-block pow2: blocks of 128 with a power-of-two scale >= amax / 448 (nothing
     * saturates), a different result from amax / 448, the same error bound */
    moe_quant_fake_vectors(q, x, 1, LEN, LEN, 1, &P2);
    CHECK_MSG(worst_rel(x, q, LEN, 128) <= 0x1.0p-4, "pow2 error %g", worst_rel(x, q, LEN, 128));
    CHECK(pow2_unsaturated(x, q, LEN, 128));
    float q2[LEN];
    moe_quant_fake_vectors(q2, x, 1, LEN, LEN, 1, &FP8);
    CHECK(memcmp(q, q2, sizeof q) != 0);
    /* the recipes' options */
    moe_quant_opts o = moe_quant_opts_of(MOE_RECIPE_FP8_BLOCK_POW2);
    CHECK(o.recipe == MOE_RECIPE_FP8_BLOCK && o.pow2 && !o.mx_floor);
    o = moe_quant_opts_of(MOE_RECIPE_MXFP8_FLOOR);
    CHECK(o.recipe == MOE_RECIPE_MXFP8 && o.mx_floor && !o.pow2);
    o = moe_quant_opts_of(MOE_RECIPE_MXFP8);
    CHECK(o.recipe == MOE_RECIPE_MXFP8 && !o.mx_floor && !o.pow2);
}

static void test_blocks_strides_tiles(void) {
    /* a vector of 130: the last 2 elements are their own block (their own scale) */
    float v[130], vq[130];
    for (int i = 0; i < 130; i++)
        v[i] = i < 128 ? 100.0f : 0.001f;
    moe_quant_fake_vectors(vq, v, 1, 130, 130, 1, &FP8);
    CHECK(fabs(vq[129] - 0.001f) <= 0.001 * 0x1.0p-4);
    /* columns of a [4, 3] matrix (estride 3) equal the rows of its transpose */
    float m[12], t[12], mq[12], tq[12];
    uint64_t s = 3;
    for (int i = 0; i < 12; i++)
        m[i] = urand(&s);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++)
            t[c * 4 + r] = m[r * 3 + c];
    moe_quant_fake_vectors(mq, m, 3, 1, 4, 3, &MX);
    moe_quant_fake_vectors(tq, t, 3, 4, 4, 1, &MX);
    int same = 1;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++)
            same &= mq[r * 3 + c] == tq[c * 4 + r];
    CHECK(same);
    /* the same at size: [300, 600] (more than one chunk of columns, a short last block of
     * rows), outliers, NaN, both formats */
    enum { CR = 300, CK = 600 };
    float *cm = malloc(CR * CK * 4), *ct = malloc(CR * CK * 4), *cq = malloc(CR * CK * 4),
          *ctq = malloc(CR * CK * 4);
    for (int i = 0; i < CR * CK; i++)
        cm[i] = urand(&s) * (i % 61 == 7 ? 5e3f : 1.0f);
    cm[1234] = NAN, cm[4321] = INFINITY;
    for (int r = 0; r < CR; r++)
        for (int c = 0; c < CK; c++)
            ct[c * CR + r] = cm[r * CK + c];
    const moe_quant_opts *fm[2] = {&FP8, &MX};
    for (int f = 0; f < 2; f++) {
        moe_quant_fake_vectors(cq, cm, CK, 1, CR, CK, fm[f]);
        moe_quant_fake_vectors(ctq, ct, CK, CR, CR, 1, fm[f]);
        int csame = 1;
        for (int r = 0; r < CR; r++)
            for (int c = 0; c < CK; c++) {
                float a = cq[r * CK + c], b = ctq[c * CR + r];
                csame &= a == b || (isnan(a) && isnan(b));
            }
        CHECK_MSG(csame, "columns differ from the transpose's rows (%s)",
                  f ? "mxfp8" : "fp8-block");
    }
    free(cm), free(ct), free(cq), free(ctq);
    /* tiles: a [256, 256] matrix with 1e-3 in its first tile and 1e3 elsewhere keeps the small
     * tile to E4M3 precision; its transpose gives the transposed values */
    int64_t R = 256, K = 256;
    float *w = malloc(R * K * 4), *wq = malloc(R * K * 4), *wt = malloc(R * K * 4),
          *wtq = malloc(R * K * 4);
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++)
            w[r * K + k] = (r < 128 && k < 128 ? 1e-3f : 1e3f) * (1.0f + urand(&s) * 0.5f);
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++)
            wt[k * R + r] = w[r * K + k];
    moe_quant_fake_tiles(wq, w, R, K, 0);
    moe_quant_fake_tiles(wtq, wt, K, R, 0);
    double worst = 0;
    int tsame = 1;
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++) {
            worst = fmax(worst, fabs(wq[r * K + k] - w[r * K + k]) / fabs(w[r * K + k]));
            tsame &= wq[r * K + k] == wtq[k * R + r];
        }
    CHECK_MSG(worst <= 0x1.0p-4, "tile error %g", worst);
    CHECK(tsame);
    /* thread-count independent */
    float *a = malloc(R * K * 4), *b = malloc(R * K * 4);
    omp_set_num_threads(1);
    moe_quant_fake_vectors(a, w, R, K, K, 1, &FP8);
    omp_set_num_threads(2);
    moe_quant_fake_vectors(b, w, R, K, K, 1, &FP8);
    CHECK(memcmp(a, b, (size_t)(R * K) * 4) == 0);
    free(w), free(wq), free(wt), free(wtq), free(a), free(b);
}

/* The stored MXFP8 form (moe_mxfp8_encode_block, decoded as moe_cbuf_get reads it): decoding gives
 * exactly mxfp8's fake quantization in blocks of 32 (outliers, an all-zero block with scale code
 * 127, E4M3 subnormals, NaN kept in its slot, values past 448 x scale impossible under ceil), and
 * encoding decoded values returns the same values (what the model's re-stores rely on). */
static void test_mxfp8_stored(void) {
    enum { n = 32 * 40 };
    float x[n], fake[n], dec[n], dec2[n];
    uint8_t q[n], mx[n / 32], q2[n], mx2[n / 32];
    uint64_t s = 9;
    for (int i = 0; i < n; i++)
        x[i] = urand(&s) * (i % 97 == 5 ? 3e4f : 1.0f); /* outliers */
    for (int i = 64; i < 96; i++)
        x[i] = 0.0f; /* block 2: all zero */
    for (int i = 96; i < 128; i++)
        x[i] = i == 96 ? 1.0f : 1e-5f; /* block 3: E4M3 subnormals under a scale of 2^-8 */
    x[200] = NAN, x[201] = -1e-30f, x[202] = -0.0f;
    moe_quant_fake_vectors(fake, x, 1, n, n, 1, &MX);
    test_mxfp8_encode(q, mx, x, n);
    test_mxfp8_decode(dec, q, mx, n);
    int same = 1;
    for (int i = 0; i < n; i++)
        same &= i == 200 ? isnan(dec[i]) : dec[i] == fake[i];
    CHECK_MSG(same, "decoded MXFP8 differs from the fake quantization");
    CHECK(mx[2] == 127 && mx[3] == 127 - 8);
    CHECK(dec[100] != 0.0f && dec[100] < 0x1.0p-14f); /* a subnormal E4M3 x 2^-8, kept */
    test_mxfp8_encode(q2, mx2, dec, n);
    test_mxfp8_decode(dec2, q2, mx2, n);
    same = 1;
    for (int i = 0; i < n; i++)
        same &= i == 200 ? isnan(dec2[i]) : dec2[i] == dec[i];
    CHECK_MSG(same, "encoding decoded MXFP8 values changed them");
}

/* The stored fp8-block form of an activation block (moe_fp8_encode_block, the bytes of the
 * CUDA backend's operands): decoding gives exactly fp8-block's fake quantization, either rule,
 * for full and short blocks with outliers, an all-zero block (scale 1), infinities (left out
 * of the amax, saturated), E4M3 subnormals, -0 and NaN of both signs (sign kept). */
static void test_fp8_block_stored(void) {
    enum { n = 128 * 4 + 72 };
    float x[n], fake[n], sc;
    uint8_t q[n];
    uint64_t s = 11;
    for (int i = 0; i < n; i++)
        x[i] = urand(&s) * (i % 89 == 3 ? 3e4f : 1.0f);
    for (int i = 128; i < 256; i++)
        x[i] = 0.0f; /* block 1: all zero */
    x[260] = INFINITY, x[261] = -INFINITY, x[262] = 1e-7f, x[263] = -0.0f, x[264] = NAN;
    x[265] = -NAN;
    /* block 4: values below 2^-128, whose amax / 448 has no finite reciprocal: the scale is
     * 2^-126 (a zero stays 0, where 0 * Inf would be NaN) */
    for (int i = 512; i < n; i++)
        x[i] = ldexpf(urand(&s), -128);
    x[512] = 0.0f;
    for (int rule = 0; rule < 2; rule++) {
        moe_quant_fake_vectors(fake, x, 1, n, n, 1, rule ? &P2 : &FP8);
        int same = 1;
        for (int b = 0; b * 128 < n; b++) {
            const int k0 = b * 128, len = n - k0 < 128 ? n - k0 : 128;
            moe_fp8_encode_block(q + k0, &sc, x + k0, len, rule);
            CHECK(b != 1 || sc == 1.0f);
            CHECK(b != 4 || sc == FLT_MIN);
            for (int j = k0; j < k0 + len; j++) {
                const float d = moe_e4m3_to_f32(q[j]) * sc;
                same &= isnan(x[j]) ? isnan(d) && signbit(d) == signbit(x[j]) : d == fake[j];
            }
        }
        CHECK_MSG(same, "decoded fp8-block bytes differ from the fake quantization (rule %d)",
                  rule);
        CHECK(q[263] == 0x80 && q[264] == 0x7f && q[265] == 0xff && q[260] == 0x7e);
        CHECK(q[512] == 0x00);
    }
}

/* ---- fp8-block activation pairs (moe_fp8_pair_*) ---- */

/* the rows copy of pair (layout l) of x [M, K]: each 1 x 128 block moe_fp8_encode_block's bytes
 * and scale (compared as bits) */
static int pair_rows_are_blocks(const uint8_t *pair, const moe_fp8_pair_layout *l, const float *x,
                                int pow2) {
    const float *s = (const float *)(pair + l->s_rows);
    uint8_t q[128];
    float sc;
    int same = 1;
    for (int64_t r = 0; r < l->M; r++)
        for (int64_t kb = 0; kb < l->KB; kb++) {
            const int64_t k0 = kb * 128, len = l->K - k0 < 128 ? l->K - k0 : 128;
            moe_fp8_encode_block(q, &sc, x + r * l->K + k0, len, pow2);
            same &= memcmp(q, pair + r * l->K + k0, (size_t)len) == 0 &&
                    memcmp(&sc, &s[kb * l->lds + r], 4) == 0;
        }
    return same;
}

/* the transposed copies: block b of group e's column k is moe_fp8_encode_block of the group's
 * rows b * 128 .. (at most 128 of them), the bytes past the group's end zero */
static int pair_cols_are_blocks(const uint8_t *pair, const moe_fp8_pair_layout *l, const float *x,
                                const int32_t *off, int64_t E, int pow2) {
    const int64_t K = l->K;
    const float *s = (const float *)(pair + l->s_cols);
    float v[128], sc;
    uint8_t q[128];
    int same = 1;
    int64_t pb = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e], nb = (n + 127) / 128;
        const uint8_t *qe = pair + l->q_cols + 128 * pb * K;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t k = 0; k < K; k++) {
                const int64_t len = n - b * 128 < 128 ? n - b * 128 : 128;
                for (int64_t j = 0; j < len; j++)
                    v[j] = x[(off[e] + b * 128 + j) * K + k];
                moe_fp8_encode_block(q, &sc, v, len, pow2);
                const uint8_t *col = qe + k * 128 * nb + b * 128;
                same &=
                    memcmp(q, col, (size_t)len) == 0 && memcmp(&sc, &s[(pb + b) * K + k], 4) == 0;
                for (int64_t j = len; j < 128; j++)
                    same &= col[j] == 0;
            }
        pb += nb;
    }
    return same && pb == l->PB;
}

/* The layout's offsets as moe/quant.h states them (the CUDA quantizers' parts, each 256-byte
 * aligned) for groups off [E + 1], and moe_fp8_pair_bytes_max at least its bytes. */
static int pair_layout_is_spec(const int32_t *off, int64_t E, int64_t K) {
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(off, E, K, 0);
    const int64_t M = off[E], KB = (K + 127) / 128, lds = (M + 3) / 4 * 4;
    int64_t PB = 0;
    for (int64_t e = 0; e < E; e++)
        PB += (off[e + 1] - off[e] + 127) / 128;
    const size_t s_rows = ((size_t)(M * K) + 255) / 256 * 256;
    const size_t q_cols = (s_rows + 4 * (size_t)(KB * lds) + 255) / 256 * 256;
    const size_t s_cols = (q_cols + (size_t)(128 * PB * K) + 255) / 256 * 256;
    return l.M == M && l.K == K && l.KB == KB && l.lds == lds && l.PB == PB && l.s_rows == s_rows &&
           l.q_cols == q_cols && l.s_cols == s_cols && l.bytes >= s_cols + 4 * (size_t)(PB * K) &&
           l.bytes <= moe_fp8_pair_bytes_max(M, E, K);
}

static int cmp_i32(const void *a, const void *b) {
    return (*(const int32_t *)a > *(const int32_t *)b) -
           (*(const int32_t *)a < *(const int32_t *)b);
}

/* bytes_max bounds every split of M rows into E groups (random cuts, all rows in one group),
 * and is reached where every group ends in a block of one row (one row a group; 129 each) */
static void test_fp8_pair_bytes_max(void) {
    enum { E = 6 };
    static const int64_t Ks[3] = {208, 256, 96}, Ms[8] = {0, 1, 6, 127, 128, 129, 557, 1000};
    static const int32_t ones[E + 1] = {0, 1, 2, 3, 4, 5, 6},
                                  worst[E + 1] = {0, 129, 258, 387, 516, 645, 646};
    int32_t off[E + 1];
    uint64_t s = 21;
    for (int ki = 0; ki < 3; ki++) {
        const int64_t K = Ks[ki];
        int ok = 1;
        for (int split = 0; split < 48; split++) {
            const int32_t M = (int32_t)(split < 8 ? Ms[split] : (urand(&s) + 1.0f) * 600.0f);
            off[0] = 0, off[E] = M;
            for (int e = 1; e < E; e++) /* odd splits: all rows in group split % E */
                off[e] = split % 2 ? (e <= split % E ? 0 : M)
                                   : (int32_t)((urand(&s) + 1.0f) * 0.5f * (float)M);
            qsort(off + 1, E - 1, sizeof *off, cmp_i32);
            ok &= pair_layout_is_spec(off, E, K);
        }
        ok &= pair_layout_is_spec(ones, E, K) && pair_layout_is_spec(worst, E, K);
        ok &= moe_fp8_pair_layout_of(ones, E, K, 0).bytes == moe_fp8_pair_bytes_max(E, E, K);
        ok &= moe_fp8_pair_layout_of(worst, E, K, 0).bytes == moe_fp8_pair_bytes_max(646, E, K);
        CHECK_MSG(ok, "pair layout or bytes_max off the spec (K = %lld)", (long long)K);
    }
}

/* A pair of uneven groups (an empty one, one of 129 rows: a block of a single token) for K
 * not a multiple of 128, a multiple, and under one block, both scale rules, values with
 * outliers, zero blocks both ways, E4M3 and fp32 subnormals, NaN of both signs and +-Inf: each
 * block is moe_fp8_encode_block's, padding tokens zero, and decoding gives the fake
 * quantization bit for bit (rows along K; each group's columns along its own rows), the same
 * bytes for any thread count. */
static void test_fp8_pairs(void) {
    enum { E = 4, M = 557 };
    const int32_t off[E + 1] = {0, 300, 300, 429, 557};
    const int64_t Ks[3] = {208, 256, 96};
    const int threads = omp_get_max_threads();
    uint64_t s = 19;
    for (int ki = 0; ki < 3; ki++) {
        const int64_t K = Ks[ki];
        float *x = malloc(M * K * 4), *dec = malloc(M * K * 4), *fake = malloc(M * K * 4);
        for (int64_t i = 0; i < M * K; i++)
            x[i] = urand(&s) * (i % 97 == 5 ? 4e3f : 1.0f);
        for (int64_t k = 0; k < 128 && k < K; k++)
            x[7 * K + k] = 0.0f; /* row 7's first block: all zero */
        for (int64_t r = 300; r < 429; r++)
            x[r * K + 3] = 0.0f;                      /* column 3 of group 2: both blocks zero */
        x[1 * K + 1] = 1e-5f, x[1 * K + 2] = -1e-40f; /* an E4M3 and an fp32 subnormal */
        x[2 * K + 4] = NAN, x[310 * K + 4] = -NAN, x[3 * K + 5] = INFINITY;
        x[428 * K + 6] = -INFINITY, x[556 * K + 95] = -0.0f;
        const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(off, E, K, 0);
        CHECK(l.PB == 6 && l.lds == 560 && pair_layout_is_spec(off, E, K));
        uint8_t *pair = malloc(l.bytes), *pair1 = malloc(l.bytes);
        for (int pow2 = 0; pow2 < 2; pow2++) {
            const moe_quant_opts o = {MOE_RECIPE_FP8_BLOCK, 0, pow2};
            memset(pair, 0xa5, l.bytes), memset(pair1, 0xa5, l.bytes);
            omp_set_num_threads(3);
            moe_fp8_pair_encode(pair, x, off, E, K, pow2, 0);
            omp_set_num_threads(1);
            moe_fp8_pair_encode(pair1, x, off, E, K, pow2, 0);
            CHECK(memcmp(pair, pair1, l.bytes) == 0);
            CHECK_MSG(pair_rows_are_blocks(pair, &l, x, pow2), "rows copy K %lld pow2 %d",
                      (long long)K, pow2);
            CHECK_MSG(pair_cols_are_blocks(pair, &l, x, off, E, pow2), "cols copy K %lld pow2 %d",
                      (long long)K, pow2);
            moe_fp8_pair_rows(dec, pair, &l);
            moe_quant_fake_vectors(fake, x, M, K, K, 1, &o);
            CHECK_MSG(memcmp(dec, fake, M * K * 4) == 0, "rows values K %lld pow2 %d", (long long)K,
                      pow2);
            int same = 1;
            for (int64_t e = 0; e < E; e++) {
                const int64_t n = off[e + 1] - off[e];
                moe_fp8_pair_cols(dec, pair, &l, off, e);
                moe_quant_fake_vectors(fake, x + off[e] * K, K, 1, n, K, &o);
                same &= memcmp(dec, fake, (size_t)(n * K) * 4) == 0;
            }
            CHECK_MSG(same, "cols values K %lld pow2 %d", (long long)K, pow2);
            CHECK(pair[2 * K + 4] == 0x7f && pair[310 * K + 4] == 0xff &&
                  pair[556 * K + 95] == 0x80); /* NaN of either sign, -0 kept */
            /* tiles: the rows copy as before; each group's transposed copy and its tile scales
             * moe_quant_tiles_e4m3's of the group's rows zero-padded to whole tiles, at the
             * layout's offsets; decoding gives moe_quant_fake_tiles's values */
            const moe_fp8_pair_layout lt = moe_fp8_pair_layout_of(off, E, K, 1);
            CHECK(lt.tiles && lt.q_cols == l.q_cols && lt.s_cols == l.s_cols &&
                  lt.bytes <= l.bytes);
            uint8_t *tp = malloc(lt.bytes), *tp1 = malloc(lt.bytes);
            memset(tp, 0xa5, lt.bytes), memset(tp1, 0xa5, lt.bytes);
            omp_set_num_threads(3);
            moe_fp8_pair_encode(tp, x, off, E, K, pow2, 1);
            omp_set_num_threads(1);
            moe_fp8_pair_encode(tp1, x, off, E, K, pow2, 1);
            CHECK(memcmp(tp, tp1, lt.bytes) == 0 && memcmp(tp, pair, l.q_cols) == 0);
            int tiled = 1;
            int64_t pb = 0, ts = 0;
            for (int64_t e = 0; e < E; e++) {
                const int64_t n = off[e + 1] - off[e], np = (n + 127) / 128 * 128;
                const int64_t nts = (K + 127) / 128 * ((np / 128 + 3) / 4 * 4);
                float *xe = calloc((size_t)(np * K) + 1, 4), *st = malloc(4 * (size_t)nts + 4);
                uint8_t *q = malloc((size_t)(np * K) + 1), *qt = malloc((size_t)(np * K) + 1);
                float *sr = malloc(4 * (size_t)(np / 128 * ((K + 127) / 128 + 3)) + 4);
                memcpy(xe, x + off[e] * K, 4 * (size_t)(n * K));
                memcpy(st, tp + lt.s_cols + 4 * ts, 4 * (size_t)nts); /* padding entries kept */
                moe_quant_tiles_e4m3(q, sr, qt, st, xe, np, K, pow2);
                tiled &= memcmp(qt, tp + lt.q_cols + 128 * pb * K, (size_t)(np * K)) == 0 &&
                         memcmp(st, tp + lt.s_cols + 4 * ts, 4 * (size_t)nts) == 0;
                moe_fp8_pair_cols(dec, tp, &lt, off, e);
                moe_quant_fake_tiles(fake, x + off[e] * K, n, K, pow2);
                tiled &= memcmp(dec, fake, (size_t)(n * K) * 4) == 0;
                pb += np / 128, ts += nts;
                free(xe), free(st), free(q), free(qt), free(sr);
            }
            CHECK_MSG(tiled && lt.s_cols + 4 * (size_t)ts <= lt.bytes, "tiled cols K %lld pow2 %d",
                      (long long)K, pow2);
            free(tp), free(tp1);
        }
        free(x), free(dec), free(fake), free(pair), free(pair1);
    }
    omp_set_num_threads(threads);
}

/* The 128 x 4 scale layout of MXFP8 tensor-core operands (moe_mx_tiled_index): the offsets
 * nvmath-python documents for cuBLASLt (get_block_scale_offset: an operand of 128 rows and 8
 * scale columns, row 5's scales 2 and 5 at 82 and 593), and the whole layout against its
 * construction as PyTorch's to_blocked writes it (the padded [R, KB] scales cut into 128 x 4
 * tiles taken row-major, each tile's rows interleaved as [32][4 row groups][4]), for a shape
 * with padding in both directions. Then moe_mx_encode_tiled: along the rows, each block's bytes
 * and scale as the stored form encodes them and decoding gives the fake quantization under
 * either rule; transposed, the columns quantized along the rows (zeros past R), padding scales
 * 127. */
static void test_mx_tiled(void) {
    CHECK(moe_mx_tiled_index(5, 2, 8 * 32) == 82 && moe_mx_tiled_index(5, 5, 8 * 32) == 593);
    CHECK(moe_mx_tiled_bytes(128, 8 * 32) == 1024 && moe_mx_tiled_bytes(129, 32) == 1024);
    CHECK(moe_mx_pad(0) == 0 && moe_mx_pad(1) == 128 && moe_mx_pad(256) == 256);
    enum { R = 300, KB = 6, RP = 384, KBP = 8 };
    static int64_t where[RP * KBP];
    int64_t pos = 0;
    for (int64_t rt = 0; rt < RP / 128; rt++)
        for (int64_t ct = 0; ct < KBP / 4; ct++)
            for (int64_t i = 0; i < 32; i++)
                for (int64_t g = 0; g < 4; g++)
                    for (int64_t j = 0; j < 4; j++)
                        where[(rt * 128 + g * 32 + i) * KBP + ct * 4 + j] = pos++;
    int same = pos == moe_mx_tiled_bytes(R, KB * 32);
    for (int64_t r = 0; r < RP; r++)
        for (int64_t kb = 0; kb < KBP; kb++)
            same &= moe_mx_tiled_index(r, kb, KB * 32) == where[r * KBP + kb];
    CHECK_MSG(same, "the tiled scale layout differs from its to_blocked construction");

    enum { M = 70, K = 96 }; /* 3 blocks a row; transposed: 96 rows of 128 tokens (70 real) */
    float x[M * K], fake[M * K], dec[32];
    uint8_t q[K * 128], sc[1024], qb[32], code;
    uint64_t s = 17;
    for (int i = 0; i < M * K; i++)
        x[i] = urand(&s) * (i % 89 == 3 ? 5e3f : 1.0f);
    x[7] = NAN, x[K + 40] = -INFINITY;
    for (int rule = 0; rule < 2; rule++) {
        const moe_quant_opts *o = rule ? &MXF : &MX;
        moe_mx_encode_tiled(q, sc, x, M, K, rule, 0);
        moe_quant_fake_vectors(fake, x, M, K, K, 1, o);
        same = 1;
        for (int64_t r = 0; r < M; r++)
            for (int64_t kb = 0; kb < K / 32; kb++) {
                moe_mxfp8_encode_block(qb, &code, x + r * K + kb * 32, rule);
                same &= memcmp(qb, q + r * K + kb * 32, 32) == 0 &&
                        sc[moe_mx_tiled_index(r, kb, K)] == code;
                for (int j = 0; j < 32; j++) {
                    const float d = moe_e4m3_to_f32(qb[j]) * moe_e8m0_to_f32(code);
                    const float f = fake[r * K + kb * 32 + j];
                    same &= isnan(f) ? isnan(d) : d == f;
                }
            }
        for (int64_t r = M; r < 128; r++) /* padding rows of the tile */
            same &=
                sc[moe_mx_tiled_index(r, 0, K)] == 127 && sc[moe_mx_tiled_index(r, 3, K)] == 127;
        CHECK_MSG(same, "rows: moe_mx_encode_tiled differs from the block encoding (rule %d)",
                  rule);
        moe_mx_encode_tiled(q, sc, x, M, K, rule, 1);
        moe_quant_fake_vectors(fake, x, K, 1, M, K, o); /* the columns, along the rows */
        same = 1;
        for (int64_t c = 0; c < K; c++)
            for (int64_t tb = 0; tb < 4; tb++) { /* 128 tokens: 70 real, then zeros */
                code = sc[moe_mx_tiled_index(c, tb, 128)];
                for (int j = 0; j < 32; j++) {
                    const int64_t t = tb * 32 + j;
                    dec[j] = moe_e4m3_to_f32(q[c * 128 + t]) * moe_e8m0_to_f32(code);
                    same &=
                        t < M ? (isnan(fake[t * K + c]) ? isnan(dec[j]) : dec[j] == fake[t * K + c])
                              : q[c * 128 + t] == 0;
                }
                same &= tb < 3 || code == 127; /* tokens 96..127: padding only */
            }
        CHECK_MSG(same,
                  "transposed: moe_mx_encode_tiled differs from the fake quantization of "
                  "the columns (rule %d)",
                  rule);
    }
}

int main(void) {
    test_exact_and_special();
    test_error_and_rules();
    test_blocks_strides_tiles();
    test_mxfp8_stored();
    test_fp8_block_stored();
    test_fp8_pairs();
    test_fp8_pair_bytes_max();
    test_mx_tiled();
    CHECK(moe_quant_block(&FP8) == 128 && moe_quant_block(&MX) == 32);
    return test_summary("test_quant");
}
