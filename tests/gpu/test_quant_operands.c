/* test_quant_operands: the quantized operands of the fp8 recipes' products, made by the CUDA
 * kernels, against their CPU references byte for byte:
 *   mxfp8: the native MXFP8 operands of the products on MXFP8 tensor cores (cuBLASLt's
 *     VEC32_UE8M0, sm_100+; moe_cuda_mx_native_operand) against moe_mx_encode_tiled: e4m3
 *     values and tiled e8m0 scales with their padding included;
 *   fp8-block: the activations' and gradients' 1 x 128 operands (moe_cuda_fp8_block_operand,
 *     kernels/quant_fp8.cu) against moe_fp8_encode_block: e4m3 values and fp32 scales, with
 *     blocks whose scale lies outside the kernels' quick division (2^-60 .. 2^60); and the
 *     fp8-block activation pairs SwiGLU's backward (dh1, dh3) and forward (g, its transposed
 *     copy in blocks or tiles) write in one pass (where be->fp8_pairs) against the CPU's
 *     moe_fp8_pair_encode of the same op's BF16 outputs, then the grouped products reading
 *     such a pair as dy or x against the same products on the BF16 values; and RMSNorm's ln1
 *     written as a pair of one group (fp8-block training), then the dense q-like product
 *     reading it as x (y, dw) against the same product on the BF16 ln1.
 *
 * Inputs of the types an operand has (F32; BF16; for mxfp8 also MXFP8, decoded by the
 * kernels) with outliers, zeros, E4M3 subnormals after scaling, fp32 subnormals, a row whose
 * scales are at their floor (2^-126), -0, NaN of both signs and infinities; groups of uneven sizes
 * (0, 1, 37, 130, 256 rows: empty groups, partial tiles, a group straddling two tiles), K = 96, 208
 * (fp8-block: a short last block) and 256; both scale rules; along the rows and transposed (each
 * group's tokens padded to 128 with zeros). Guard bytes after q and the scales must stay untouched
 * (and the fp8-block rows' padding scales). The kernels are not specific to sm_100, so this runs on
 * any GPU; the MXFP8 products themselves need one with MXFP8 tensor cores (be->mx_native, printed).
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/dtype.h"
#include "moe/quant.h"
#include "testlib.h"

#define GUARD 64 /* bytes after each output, 0xab before and after */

static uint64_t g_rng = 0x5eed;

static float urand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* n values of urand() scale (malloc'ed) */
static float *urand_array(int64_t n, float scale) {
    float *x = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = urand() * scale;
    return x;
}

/* x [M, K] with the special values and a row scale from 2^-span to 2^span (blocks of very
 * different scales, E4M3 subnormals in the small ones). */
static void fill(float *x, int64_t M, int64_t K, int span) {
    for (int64_t r = 0; r < M; r++) {
        const float rs = ldexpf(1.0f, (int)(r % (2 * span + 1)) - span);
        for (int64_t k = 0; k < K; k++) {
            float v = urand() * rs;
            if ((r * K + k) % 97 == 11) v *= 3e3f;     /* outliers */
            if ((r * K + k) % 53 == 7) v = rs * 1e-5f; /* far below their block's amax */
            x[r * K + k] = v;
        }
    }
    for (int64_t k = 0; k < K && M > 3; k++) /* a row of zeros */
        x[3 * K + k] = 0.0f;
    for (int64_t k = 0; k < K && M > 4; k++)  /* a row below 2^-128: its blocks' scales at */
        x[4 * K + k] = ldexpf(urand(), -128); /* their floor, 2^-126 */
    x[5] = NAN, x[K + 6] = -NAN, x[2 * K + 7] = INFINITY, x[M * K - 1] = -INFINITY;
    x[9] = 1e-40f, x[10] = -1e-42f, x[11] = -0.0f; /* fp32 (and bf16) subnormals, -0 */
}

static void *dev(const moe_backend *be, const void *host, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (p && host) be->memcpy_h2d(be, p, host, bytes);
    return p;
}

enum { MXFP8, FP8_BLOCK }; /* the operand's format */

/* The mxfp8 reference of x [M, K] over the groups: each group by moe_mx_encode_tiled, one
 * after another; *qn and *sn its sizes. */
static void reference_mx(uint8_t **rq, uint8_t **rs, int64_t *qn, int64_t *sn, const float *x,
                         const int32_t *off, int64_t E, int64_t K, int transpose, int rule) {
    *qn = *sn = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e], np = moe_mx_pad(n);
        *qn += transpose ? K * np : n * K;
        *sn += transpose ? moe_mx_tiled_bytes(K, np) : moe_mx_tiled_bytes(n, K);
    }
    *rq = malloc((size_t)*qn + 1), *rs = malloc((size_t)*sn + 1);
    int64_t aq = 0, as = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e], np = moe_mx_pad(n);
        if (n == 0) continue;
        moe_mx_encode_tiled(*rq + aq, *rs + as, x + off[e] * K, n, K, rule, transpose);
        aq += transpose ? K * np : n * K;
        as += transpose ? moe_mx_tiled_bytes(K, np) : moe_mx_tiled_bytes(n, K);
    }
}

/* The fp8-block reference (moe_cuda_fp8_block_operand's layouts) by moe_fp8_encode_block, or
 * for transpose 2 (x-tiles) by moe_quant_tiles_e4m3 on each group's rows: the padding scales
 * keep the guard pattern 0xab, as the device's must. */
static void reference_fp8(uint8_t **rq, uint8_t **rs, int64_t *qn, int64_t *sn, const float *x,
                          const int32_t *off, int64_t E, int64_t K, int transpose, int pow2) {
    const int64_t M = off[E], KB = (K + 127) / 128, ls = (M + 3) / 4 * 4;
    int64_t nb = 0; /* transposed: the groups' padded 128-token blocks */
    for (int64_t e = 0; e < E; e++)
        nb += moe_mx_pad(off[e + 1] - off[e]) / 128;
    int64_t nt = 0; /* x-tiles: the groups' tile scales */
    for (int64_t e = 0; e < E; e++)
        nt += moe_fp8_tile_scales(K, moe_mx_pad(off[e + 1] - off[e]));
    *qn = transpose ? nb * 128 * K : M * K;
    *sn = (int64_t)sizeof(float) * (transpose == 2 ? nt : transpose ? nb * K : KB * ls);
    *rq = malloc((size_t)*qn + 1), *rs = malloc((size_t)*sn + 1);
    memset(*rs, 0xab, (size_t)*sn);
    float sc, col[128];
    if (transpose == 2) {
        for (int64_t e = 0, aq = 0, as = 0; e < E; e++) {
            const int64_t n = off[e + 1] - off[e], np = moe_mx_pad(n);
            uint8_t *q = malloc((size_t)(n * K) + 1), *qt = malloc((size_t)(n * K) + 1);
            float *s = malloc((size_t)moe_fp8_tile_scales(n, K) * sizeof(float) + 1);
            moe_quant_tiles_e4m3(q, s, qt, (float *)(*rs) + as, x + off[e] * K, n, K, pow2);
            for (int64_t k = 0; k < K; k++) { /* qt [K, n] into q_e [K, np], zeros past n */
                memcpy(*rq + aq + k * np, qt + k * n, (size_t)n);
                memset(*rq + aq + k * np + n, 0, (size_t)(np - n));
            }
            aq += K * np, as += moe_fp8_tile_scales(K, np);
            free(q), free(qt), free(s);
        }
        return;
    }
    if (!transpose) {
        for (int64_t r = 0; r < M; r++)
            for (int64_t kb = 0; kb < KB; kb++) {
                const int64_t k0 = kb * 128, n = K - k0 < 128 ? K - k0 : 128;
                moe_fp8_encode_block(*rq + r * K + k0, &sc, x + r * K + k0, n, pow2);
                memcpy(*rs + (kb * ls + r) * sizeof sc, &sc, sizeof sc);
            }
        return;
    }
    for (int64_t e = 0, b = 0, aq = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e], np = moe_mx_pad(n);
        for (int64_t pb = 0; pb < np / 128; pb++, b++)
            for (int64_t k = 0; k < K; k++) {
                for (int64_t j = 0; j < 128; j++) {
                    const int64_t t = pb * 128 + j;
                    col[j] = t < n ? x[(off[e] + t) * K + k] : 0.0f;
                }
                moe_fp8_encode_block(*rq + aq + k * np + pb * 128, &sc, col, 128, pow2);
                memcpy(*rs + (b * K + k) * sizeof sc, &sc, sizeof sc);
            }
        aq += K * np;
    }
}

/* One case: x of type dt (1 F32, 2 BF16, 3 MXFP8) over groups `counts`, as format fmt's
 * operand, transposed or not, by the rule `rule` (mxfp8: floor; fp8-block: pow2). */
static void run_case(const moe_backend *be, const int64_t *counts, int64_t E, int64_t K, int dt,
                     int transpose, int rule, int fmt) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + (int32_t)counts[e];
    const int64_t M = off[E];
    float *x = malloc((size_t)(M * K) * sizeof *x);
    /* fp8-block: row scales 2^-100 .. 2^100, past the quick division's range both ways */
    fill(x, M, K, fmt == MXFP8 ? 20 : 100);
    /* the values the kernels read: the input as its type stores it */
    uint8_t *xq = malloc((size_t)(M * K + M * K / 32));
    if (dt == 2)
        for (int64_t i = 0; i < M * K; i++)
            x[i] = moe_bf16_to_f32(moe_f32_to_bf16(x[i]));
    if (dt == 3) {
        test_mxfp8_encode(xq, xq + M * K, x, M * K);
        test_mxfp8_decode(x, xq, xq + M * K, M * K);
    }
    uint8_t *rq, *rs;
    int64_t qn, sn;
    if (fmt == MXFP8)
        reference_mx(&rq, &rs, &qn, &sn, x, off, E, K, transpose, rule);
    else
        reference_fp8(&rq, &rs, &qn, &sn, x, off, E, K, transpose, rule);
    /* the device input */
    moe_cbuf dx;
    void *d_in = NULL, *d_mx = NULL;
    if (dt == 1) {
        d_in = dev(be, x, (size_t)(M * K) * 4);
        dx = moe_cbuf_f32(d_in);
    } else if (dt == 2) {
        uint16_t *h = malloc((size_t)(M * K) * 2);
        for (int64_t i = 0; i < M * K; i++)
            h[i] = moe_f32_to_bf16(x[i]);
        d_in = dev(be, h, (size_t)(M * K) * 2);
        free(h);
        dx = moe_cbuf_of(d_in, MOE_DTYPE_BF16);
    } else {
        d_in = dev(be, xq, (size_t)(M * K));
        d_mx = dev(be, xq + M * K, (size_t)(M * K / 32));
        dx = moe_cbuf_from(moe_buf_mxfp8(d_in, d_mx));
    }
    uint8_t *gq = malloc((size_t)qn + GUARD), *gs = malloc((size_t)sn + GUARD);
    memset(gq, 0xab, (size_t)qn + GUARD);
    memset(gs, 0xab, (size_t)sn + GUARD);
    uint8_t *d_q = dev(be, gq, (size_t)qn + GUARD), *d_s = dev(be, gs, (size_t)sn + GUARD);
    if (fmt == MXFP8)
        moe_cuda_mx_native_operand(be, d_q, d_s, dx, off, E, K, transpose, rule);
    else
        moe_cuda_fp8_block_operand(be, d_q, (float *)d_s, dx, off, E, K, transpose, rule);
    moe_err err;
    moe_err_clear(&err);
    const int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "%s operand: %s", fmt == MXFP8 ? "mxfp8" : "fp8-block", err.msg);
    be->memcpy_d2h(be, gq, d_q, (size_t)qn + GUARD);
    be->memcpy_d2h(be, gs, d_s, (size_t)sn + GUARD);
    int64_t bad_q = 0, bad_s = 0, first_q = -1, first_s = -1, guard = 0;
    for (int64_t i = 0; i < qn; i++) /* a NaN decoded from MXFP8 may lose its sign there */
        if (gq[i] != rq[i] && !(dt == 3 && (gq[i] & 0x7f) == 0x7f && (rq[i] & 0x7f) == 0x7f) &&
            bad_q++ == 0)
            first_q = i;
    for (int64_t i = 0; i < sn; i++)
        if (gs[i] != rs[i] && bad_s++ == 0) first_s = i;
    for (int64_t i = 0; i < GUARD; i++)
        guard += (gq[qn + i] != 0xab) + (gs[sn + i] != 0xab);
    static const char *names[] = {"", "f32", "bf16", "mxfp8"}, *fmts[] = {"mxfp8", "fp8-block"},
                      *forms[] = {"rows", "transposed", "x-tiles"};
    CHECK_MSG(ok && bad_q == 0 && bad_s == 0 && guard == 0,
              "%s %s K=%lld %s rule %d: %lld of %lld bytes differ (first %lld: %02x vs %02x), "
              "%lld of %lld scale bytes (first %lld: %02x vs %02x), %lld guard bytes written",
              fmts[fmt], names[dt], (long long)K, forms[transpose], rule, (long long)bad_q,
              (long long)qn, (long long)first_q, first_q >= 0 ? gq[first_q] : 0,
              first_q >= 0 ? rq[first_q] : 0, (long long)bad_s, (long long)sn, (long long)first_s,
              first_s >= 0 ? gs[first_s] : 0, first_s >= 0 ? rs[first_s] : 0, (long long)guard);
    printf("  %-9s %-5s K=%-3lld %-10s rule %d: %lld bytes, %lld scale bytes%s\n", fmts[fmt],
           names[dt], (long long)K, forms[transpose], rule, (long long)qn, (long long)sn,
           bad_q || bad_s || guard ? "  FAILED" : "  identical");
    be->free(be, d_q);
    be->free(be, d_s);
    be->free(be, d_in);
    if (d_mx) be->free(be, d_mx);
    free(gq), free(gs), free(rq), free(rs), free(xq), free(x), free(off);
}

/* The values of an array of type dt (1 F32, 2 BF16) on the device, from x (rounded to bf16
 * in place when BF16). */
static moe_cbuf dev_typed(const moe_backend *be, float *x, int64_t n, int dt, void **d) {
    if (dt == 1) {
        *d = dev(be, x, (size_t)n * 4);
        return moe_cbuf_f32(*d);
    }
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = moe_f32_to_bf16(x[i]), x[i] = moe_bf16_to_f32(h[i]);
    *d = dev(be, h, (size_t)n * 2);
    free(h);
    return moe_cbuf_of(*d, MOE_DTYPE_BF16);
}

/* n bytes of device p and host h compared: the count that differ, the first at *first. */
static int64_t bytes_differ(const moe_backend *be, const void *p, const uint8_t *h, int64_t n,
                            int64_t *first) {
    uint8_t *g = malloc((size_t)n);
    be->memcpy_d2h(be, g, p, (size_t)n);
    int64_t bad = 0;
    *first = -1;
    for (int64_t i = 0; i < n; i++)
        if (g[i] != h[i] && bad++ == 0) *first = i;
    free(g);
    return bad;
}

/* 1 when device buffers a and b hold the same n bytes. */
static int same_on_dev(const moe_backend *be, const void *a, const void *b, size_t n) {
    uint8_t *ha = malloc(n), *hb = malloc(n);
    be->memcpy_d2h(be, ha, a, n), be->memcpy_d2h(be, hb, b, n);
    const int same = memcmp(ha, hb, n) == 0;
    free(ha), free(hb);
    return same;
}

/* A weight [E, O, I] on the device as the fp8-block products read it: the e4m3 copies and
 * scales quantize_weight makes of w (fp32, host) under prec. Free with dev_weight_free. */
static moe_cbuf dev_weight(const moe_backend *be, const float *w, int64_t E, int64_t O, int64_t I,
                           moe_recipe prec) {
    void *d32 = dev(be, w, (size_t)(E * O * I) * 4);
    uint8_t *q = be->alloc(be, (size_t)(2 * E * O * I));
    float *s = be->alloc(be, (size_t)moe_fp8_weight_scales(E, O, I) * 4);
    be->quantize_weight(be, q, s, d32, E, O, I, prec);
    be->free(be, d32); /* (cudaFree waits for the quantizer) */
    return moe_cbuf_e4m3(q, s);
}
static void dev_weight_free(const moe_backend *be, moe_cbuf w) {
    be->free(be, (void *)w.p);
    be->free(be, (void *)w.s);
}

/* grouped_dgrad_sum, dx = dh1 W1 + dh3 W3, on the pairs p1 and p3 (the sm_90 kernel's single
 * launch over both products' blocks) against w1's dgrad written and w3's added (two launches,
 * the same block products summed in another order): the NMSE of its F32 dx, returned; its BF16
 * dx must be that F32 dx rounded, bit for bit; and on the BF16 dh1, dh3 (d1, d3: the two
 * launches inside the op) the two launches' very bits. W1 is w (of host values hw [E, K, I]), W3
 * another weight; x is unread (no weight gradients). */
static double run_dgrad_sum(const moe_backend *be, void *p1, void *p3, void *d1, void *d3,
                            moe_cbuf w, const float *hw, moe_cbuf x, const int32_t *off, int64_t E,
                            int64_t I, int64_t K, moe_recipe prec) {
    const int64_t M = off[E], nw = E * K * I;
    float *hw3 = malloc((size_t)nw * 4);
    for (int64_t i = 0; i < nw; i++)
        hw3[i] = hw[(i * 7 + 3) % nw] * -1.5f; /* another weight of the same range */
    const moe_cbuf w3 = dev_weight(be, hw3, E, K, I, prec);
    const moe_cbuf q1 = moe_cbuf_from(moe_buf_fp8_pair(p1)),
                   q3 = moe_cbuf_from(moe_buf_fp8_pair(p3));
    const moe_cbuf b1 = moe_cbuf_of(d1, MOE_DTYPE_BF16), b3 = moe_cbuf_of(d3, MOE_DTYPE_BF16);
    const size_t n4 = (size_t)(M * I) * 4;
    float *two = be->alloc(be, n4), *sum = be->alloc(be, n4), *sumb = be->alloc(be, n4);
    uint16_t *sum16 = be->alloc(be, n4 / 2);
    be->grouped_matmul_backward(be, moe_buf_f32(two), moe_buf_f32(NULL), q1, x, w, off, E, I, K,
                                prec, MOE_GRAD_SET, MOE_GRAD_SET);
    be->grouped_matmul_backward(be, moe_buf_f32(two), moe_buf_f32(NULL), q3, x, w3, off, E, I, K,
                                prec, MOE_GRAD_ADD, MOE_GRAD_SET);
    be->grouped_dgrad_sum(be, moe_buf_f32(sum), q1, w, q3, w3, off, E, I, K, prec);
    be->grouped_dgrad_sum(be, moe_buf_of(sum16, MOE_DTYPE_BF16), q1, w, q3, w3, off, E, I, K, prec);
    be->grouped_dgrad_sum(be, moe_buf_f32(sumb), b1, w, b3, w3, off, E, I, K, prec);
    moe_err err;
    moe_err_clear(&err);
    const int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "grouped_dgrad_sum: %s", err.msg);
    float *h2 = malloc(n4), *hs = malloc(n4);
    uint16_t *h16 = malloc(n4 / 2);
    be->memcpy_d2h(be, h2, two, n4);
    be->memcpy_d2h(be, hs, sum, n4);
    be->memcpy_d2h(be, h16, sum16, n4 / 2);
    /* dout's NaN and infinities reach whole rows of dx: those must be non-finite in both */
    double num = 0, den = 0;
    int64_t bad16 = 0;
    for (int64_t i = 0; i < M * I; i++) {
        if (!isfinite(h2[i]) || !isfinite(hs[i])) {
            num += isfinite(h2[i]) != isfinite(hs[i]);
            continue;
        }
        num += ((double)hs[i] - h2[i]) * ((double)hs[i] - h2[i]);
        den += (double)h2[i] * h2[i];
        bad16 += h16[i] != moe_f32_to_bf16(hs[i]);
    }
    const double e = den > 0 ? num / den : (num > 0 ? 1.0 : 0.0);
    const int same_b = same_on_dev(be, sumb, two, n4);
    CHECK_MSG(ok && e < 1e-10 && den > 0 && bad16 == 0 && same_b,
              "grouped_dgrad_sum K=%lld: nmse %.3g against two products (bound 1e-10), %lld bf16 "
              "values not the f32 sum rounded, on bf16 dy %s",
              (long long)K, e, (long long)bad16, same_b ? "identical" : "DIFFERENT");
    be->free(be, two), be->free(be, sum), be->free(be, sumb), be->free(be, sum16);
    dev_weight_free(be, w3);
    free(hw3), free(h2), free(hs), free(h16);
    return e;
}

/* fp8-block activation pairs (moe/quant.h): SwiGLU's backward written as pairs in one pass
 * (be->swiglu_backward with groups) against the same op's BF16 dh1, dh3 encoded by the CPU
 * (moe_fp8_pair_encode), the whole buffer byte for byte (gaps and the rows' padding scales
 * untouched, guard bytes after it); then the grouped backward reading a pair as dy against
 * the same product on the BF16 dh1, dx and dw bit for bit (the same bytes reach the same
 * kernels). a, b of type dta, dout of dtd (1 F32, 2 BF16); dout's rows scaled 2^-90 .. 2^90
 * so that both division paths run, with its NaN, infinities and zeros. */
static void run_pairs(const moe_backend *be, const int64_t *counts, int64_t E, int64_t K, int dta,
                      int dtd, int rule) {
    const int64_t I = 128; /* the w1 product's input width */
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + (int32_t)counts[e];
    const int64_t M = off[E], n = M * K;
    const moe_fp8_groups pg = {off, E, K, rule, 0};
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(off, E, K, 0);
    const size_t pbytes = l.bytes + GUARD;
    float *ha = malloc((size_t)n * 4), *hb = malloc((size_t)n * 4), *hg = malloc((size_t)n * 4);
    fill(ha, M, K, 2);
    fill(hb, M, K, 2);
    fill(hg, M, K, 90);
    void *da_, *db_, *dg_;
    moe_cbuf a = dev_typed(be, ha, n, dta, &da_), b = dev_typed(be, hb, n, dta, &db_),
             g = dev_typed(be, hg, n, dtd, &dg_);
    /* the BF16 outputs, and the CPU's pairs of them */
    uint16_t *h1 = malloc((size_t)n * 2), *h3 = malloc((size_t)n * 2);
    void *d1 = be->alloc(be, (size_t)n * 2), *d3 = be->alloc(be, (size_t)n * 2);
    be->swiglu_backward(be, moe_buf_of(d1, MOE_DTYPE_BF16), moe_buf_of(d3, MOE_DTYPE_BF16), g, a, b,
                        n, NULL);
    be->memcpy_d2h(be, h1, d1, (size_t)n * 2);
    be->memcpy_d2h(be, h3, d3, (size_t)n * 2);
    uint8_t *ref[2];
    const uint16_t *hv[2] = {h1, h3};
    float *v = malloc((size_t)n * 4);
    for (int j = 0; j < 2; j++) {
        ref[j] = malloc(pbytes);
        memset(ref[j], 0xab, pbytes);
        for (int64_t i = 0; i < n; i++)
            v[i] = moe_bf16_to_f32(hv[j][i]);
        moe_fp8_pair_encode(ref[j], v, off, E, K, rule, 0);
    }
    /* the pairs in one pass */
    uint8_t *fillb = malloc(pbytes);
    memset(fillb, 0xab, pbytes);
    void *p1 = dev(be, fillb, pbytes), *p3 = dev(be, fillb, pbytes);
    be->swiglu_backward(be, moe_buf_fp8_pair(p1), moe_buf_fp8_pair(p3), g, a, b, n, &pg);
    moe_err err;
    moe_err_clear(&err);
    int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "swiglu_backward pairs: %s", err.msg);
    int64_t f1, f3, bad1 = bytes_differ(be, p1, ref[0], (int64_t)pbytes, &f1),
                    bad3 = bytes_differ(be, p3, ref[1], (int64_t)pbytes, &f3);
    static const char *names[] = {"", "f32", "bf16"};
    CHECK_MSG(
        ok && bad1 == 0 && bad3 == 0,
        "pairs a %s dout %s K=%lld rule %d: %lld and %lld of %zu bytes differ (first at %lld, "
        "%lld; parts at 0, %zu, %zu, %zu)",
        names[dta], names[dtd], (long long)K, rule, (long long)bad1, (long long)bad3, pbytes,
        (long long)f1, (long long)f3, l.s_rows, l.q_cols, l.s_cols);
    /* the w1 product's backward, dy the pair or the BF16 dh1 */
    const int64_t nw = E * K * I;
    float *hw = urand_array(nw, 0.05f), *hx = urand_array(M * I, 1.0f);
    void *dxin;
    moe_cbuf x = dev_typed(be, hx, M * I, 2, &dxin);
    const moe_recipe prec = rule ? MOE_RECIPE_FP8_BLOCK_POW2 : MOE_RECIPE_FP8_BLOCK;
    const moe_cbuf w = dev_weight(be, hw, E, K, I, prec);
    float *ox[2], *ow[2];
    const moe_cbuf dys[2] = {moe_cbuf_of(d1, MOE_DTYPE_BF16), moe_cbuf_from(moe_buf_fp8_pair(p1))};
    for (int j = 0; j < 2; j++) {
        ox[j] = be->alloc(be, (size_t)(M * I) * 4);
        ow[j] = be->alloc(be, (size_t)nw * 4);
        be->grouped_matmul_backward(be, moe_buf_f32(ox[j]), moe_buf_f32(ow[j]), dys[j], x, w, off,
                                    E, I, K, prec, MOE_GRAD_SET, MOE_GRAD_SET);
    }
    ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "grouped_matmul_backward on a pair: %s", err.msg);
    const int same_x = same_on_dev(be, ox[0], ox[1], (size_t)(M * I) * 4),
              same_w = same_on_dev(be, ow[0], ow[1], (size_t)nw * 4);
    CHECK_MSG(ok && same_x && same_w, "grouped backward K=%lld rule %d: dx %s, dw %s", (long long)K,
              rule, same_x ? "identical" : "DIFFERS", same_w ? "identical" : "DIFFERS");
    const double dsum = run_dgrad_sum(be, p1, p3, d1, d3, w, hw, x, off, E, I, K, prec);
    printf("  pairs     a %-4s dout %-4s K=%-3lld rule %d: %zu bytes a pair%s; grouped backward "
           "dx, dw%s; dgrad sum nmse %.2e\n",
           names[dta], names[dtd], (long long)K, rule, l.bytes,
           bad1 || bad3 ? "  FAILED" : "  identical", same_x && same_w ? " identical" : " DIFFER",
           dsum);
    for (int j = 0; j < 2; j++)
        be->free(be, ox[j]), be->free(be, ow[j]), free(ref[j]);
    dev_weight_free(be, w), be->free(be, dxin);
    be->free(be, p1), be->free(be, p3), be->free(be, d1), be->free(be, d3);
    be->free(be, da_), be->free(be, db_), be->free(be, dg_);
    free(hw), free(hx), free(fillb), free(v), free(h1), free(h3);
    free(ha), free(hb), free(hg), free(off);
}

/* The fp8-block recipe of a scale rule (pow2) and precision.fp8_wgrad form (x-tiles). */
static moe_recipe fp8_recipe(int pow2, int tiles) {
    return pow2 ? (tiles ? MOE_RECIPE_FP8_BLOCK_POW2_XT : MOE_RECIPE_FP8_BLOCK_POW2)
                : (tiles ? MOE_RECIPE_FP8_BLOCK_XT : MOE_RECIPE_FP8_BLOCK);
}

/* Bytes of pair p (device, pbytes with its guard) that differ from the CPU's encoding
 * (moe_fp8_pair_encode) of the n = offsets[E] K bf16 values at device address d16; *first the
 * first such byte. */
static int64_t pair_vs_cpu(const moe_backend *be, const void *p, size_t pbytes, const void *d16,
                           const int32_t *off, int64_t E, int64_t K, int rule, int tiles,
                           int64_t *first) {
    const int64_t n = off[E] * K;
    uint16_t *h16 = malloc((size_t)n * 2);
    be->memcpy_d2h(be, h16, d16, (size_t)n * 2);
    uint8_t *ref = malloc(pbytes);
    memset(ref, 0xab, pbytes);
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        v[i] = moe_bf16_to_f32(h16[i]);
    moe_fp8_pair_encode(ref, v, off, E, K, rule, tiles);
    const int64_t bad = bytes_differ(be, p, ref, (int64_t)pbytes, first);
    free(h16), free(ref), free(v);
    return bad;
}

/* A grouped product's forward y and weight gradient (dy [M, O] BF16) with x the pair p or the
 * BF16 x at d16 [M, K], bit for bit: 1 when both are identical (what names the product). */
static int grouped_on_pair(const moe_backend *be, const void *d16, void *p, const int32_t *off,
                           int64_t E, int64_t K, int rule, int tiles, const char *what) {
    const int64_t O = 128, M = off[E], nw = E * O * K;
    float *hw = urand_array(nw, 0.05f), *hdy = urand_array(M * O, 1.0f);
    void *ddy;
    moe_cbuf dy = dev_typed(be, hdy, M * O, 2, &ddy);
    const moe_recipe prec = fp8_recipe(rule, tiles);
    const moe_cbuf w = dev_weight(be, hw, E, O, K, prec);
    float *oy[2], *ow[2];
    const moe_cbuf xs[2] = {moe_cbuf_of(d16, MOE_DTYPE_BF16), moe_cbuf_from(moe_buf_fp8_pair(p))};
    for (int j = 0; j < 2; j++) {
        oy[j] = be->alloc(be, (size_t)(M * O) * 4);
        ow[j] = be->alloc(be, (size_t)nw * 4);
        be->grouped_matmul_forward(be, moe_buf_f32(oy[j]), xs[j], w, off, E, K, O, prec);
        be->grouped_matmul_backward(be, moe_buf_f32(NULL), moe_buf_f32(ow[j]), dy, xs[j], w, off, E,
                                    K, O, prec, MOE_GRAD_SET, MOE_GRAD_SET);
    }
    moe_err err;
    moe_err_clear(&err);
    const int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "%s's products on a pair: %s", what, err.msg);
    const int same_y = same_on_dev(be, oy[0], oy[1], (size_t)(M * O) * 4),
              same_w = same_on_dev(be, ow[0], ow[1], (size_t)nw * 4);
    CHECK_MSG(ok && same_y && same_w, "%s on a pair K=%lld rule %d tiles %d: y %s, dw %s", what,
              (long long)K, rule, tiles, same_y ? "identical" : "DIFFERS",
              same_w ? "identical" : "DIFFERS");
    for (int j = 0; j < 2; j++)
        be->free(be, oy[j]), be->free(be, ow[j]);
    dev_weight_free(be, w), be->free(be, ddy);
    free(hw), free(hdy);
    return ok && same_y && same_w;
}

/* The offsets [E + 1] of groups of counts[e] rows (malloc'ed). */
static int32_t *offsets_of(const int64_t *counts, int64_t E) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + (int32_t)counts[e];
    return off;
}

/* SwiGLU's output g as an fp8-block activation pair (be->swiglu_forward with groups; its
 * transposed copy in blocks or, tiles, in 128 x 128 tiles) against the same op's BF16 g encoded
 * by the CPU (pair_vs_cpu), the whole buffer byte for byte (guard bytes after it); then w2's
 * products reading the pair as x against the same products on the BF16 g (grouped_on_pair).
 * a, b of type dta (1 F32, 2 BF16), with fill's NaN, infinities, zeros and outliers. */
static void run_g_pair(const moe_backend *be, const int64_t *counts, int64_t E, int64_t K, int dta,
                       int rule, int tiles) {
    int32_t *off = offsets_of(counts, E);
    const int64_t M = off[E], n = M * K;
    const moe_fp8_groups pg = {off, E, K, rule, tiles};
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(off, E, K, tiles);
    const size_t pbytes = l.bytes + GUARD;
    float *ha = malloc((size_t)n * 4), *hb = malloc((size_t)n * 4);
    fill(ha, M, K, 3);
    fill(hb, M, K, 3);
    void *da_, *db_;
    moe_cbuf a = dev_typed(be, ha, n, dta, &da_), b = dev_typed(be, hb, n, dta, &db_);
    void *dg = be->alloc(be, (size_t)n * 2);
    be->swiglu_forward(be, moe_buf_of(dg, MOE_DTYPE_BF16), a, b, n, MOE_RECIPE_BF16, NULL);
    uint8_t *fillb = malloc(pbytes);
    memset(fillb, 0xab, pbytes);
    void *p = dev(be, fillb, pbytes);
    be->swiglu_forward(be, moe_buf_fp8_pair(p), a, b, n, MOE_RECIPE_BF16, &pg);
    moe_err err;
    moe_err_clear(&err);
    int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "swiglu_forward pair: %s", err.msg);
    int64_t first, bad = pair_vs_cpu(be, p, pbytes, dg, off, E, K, rule, tiles, &first);
    static const char *names[] = {"", "f32", "bf16"};
    CHECK_MSG(ok && bad == 0,
              "g pair a %s K=%lld rule %d tiles %d: %lld of %zu bytes differ (first at %lld; parts "
              "at 0, %zu, %zu, %zu)",
              names[dta], (long long)K, rule, tiles, (long long)bad, pbytes, (long long)first,
              l.s_rows, l.q_cols, l.s_cols);
    const int same = grouped_on_pair(be, dg, p, off, E, K, rule, tiles, "w2");
    printf("  g pair    a %-4s K=%-3lld rule %d %s: %zu bytes%s; w2 forward y, dw%s\n", names[dta],
           (long long)K, rule, tiles ? "tiles " : "blocks", l.bytes,
           bad ? "  FAILED" : "  identical", same ? " identical" : " DIFFER");
    be->free(be, p), be->free(be, dg), be->free(be, da_), be->free(be, db_);
    free(fillb), free(ha), free(hb), free(off);
}

/* The expert inputs xe as an fp8-block activation pair (be->quantize_pair; fp8-block training)
 * from BF16 x [M, K] with fill's special values, against the CPU's encoding of the same values
 * byte for byte (guard bytes after it); then w1's products reading the pair as x against the
 * same products on the BF16 x (grouped_on_pair). */
static void run_xe_pair(const moe_backend *be, const int64_t *counts, int64_t E, int64_t K,
                        int rule, int tiles) {
    int32_t *off = offsets_of(counts, E);
    const int64_t M = off[E], n = M * K;
    const moe_fp8_groups pg = {off, E, K, rule, tiles};
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(off, E, K, tiles);
    const size_t pbytes = l.bytes + GUARD;
    float *hx = malloc((size_t)n * 4);
    fill(hx, M, K, 3);
    void *d16;
    const moe_cbuf x = dev_typed(be, hx, n, 2, &d16);
    uint8_t *fillb = malloc(pbytes);
    memset(fillb, 0xab, pbytes);
    void *p = dev(be, fillb, pbytes);
    be->quantize_pair(be, moe_buf_fp8_pair(p), x, &pg);
    moe_err err;
    moe_err_clear(&err);
    const int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "quantize_pair: %s", err.msg);
    int64_t first, bad = pair_vs_cpu(be, p, pbytes, d16, off, E, K, rule, tiles, &first);
    CHECK_MSG(ok && bad == 0,
              "xe pair K=%lld rule %d tiles %d: %lld of %zu bytes differ (first at %lld; parts at "
              "0, %zu, %zu, %zu)",
              (long long)K, rule, tiles, (long long)bad, pbytes, (long long)first, l.s_rows,
              l.q_cols, l.s_cols);
    const int same = grouped_on_pair(be, d16, p, off, E, K, rule, tiles, "w1");
    printf("  xe pair   K=%-3lld rule %d %s: %zu bytes%s; w1 forward y, dw%s\n", (long long)K, rule,
           tiles ? "tiles " : "blocks", l.bytes, bad ? "  FAILED" : "  identical",
           same ? " identical" : " DIFFER");
    be->free(be, p), be->free(be, d16);
    free(fillb), free(hx), free(off);
}

/* RMSNorm's ln1 as an fp8-block activation pair of one group (be->rmsnorm_forward with
 * groups; fp8-block training) against the same op's BF16 ln1 encoded by the CPU
 * (moe_fp8_pair_encode), the whole buffer byte for byte (guard bytes after it), rstd bit for
 * bit; then the q/k/v-like dense products reading the pair as x against the same products on
 * the BF16 ln1: y and dw bit for bit (N a multiple of 16: cuBLASLt reads the pair's row-wise
 * copy as it reads x's own quantization). x [N, C] of type dtx (1 F32, 2 BF16) with fill's
 * special values; the norm's weight spans 2^-90 .. 2^90 by columns, so that both division
 * paths run. */
static void run_ln1_pair(const moe_backend *be, int64_t N, int64_t C, int dtx, int rule,
                         int tiles) {
    const int64_t O = 128; /* the q projection's output width */
    const int32_t rows[2] = {0, (int32_t)N};
    const moe_fp8_groups pg = {rows, 1, C, rule, tiles};
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(rows, 1, C, tiles);
    const size_t pbytes = l.bytes + GUARD;
    float *hx = malloc((size_t)(N * C) * 4), *hw = malloc((size_t)C * 4);
    fill(hx, N, C, 4);
    for (int64_t c = 0; c < C; c++)
        hw[c] = (0.5f + 0.5f * fabsf(urand())) * ldexpf(1.0f, (int)((c / 16) % 13) * 15 - 90);
    void *dxin, *dnw = dev(be, hw, (size_t)C * 4);
    moe_cbuf x = dev_typed(be, hx, N * C, dtx, &dxin);
    /* the BF16 ln1, and the CPU's pair of it */
    uint16_t *h16 = malloc((size_t)(N * C) * 2);
    void *d16 = be->alloc(be, (size_t)(N * C) * 2);
    float *r16 = be->alloc(be, (size_t)N * 4), *rp = be->alloc(be, (size_t)N * 4);
    be->rmsnorm_forward(be, moe_buf_of(d16, MOE_DTYPE_BF16), r16, x, dnw, N, C, 1e-5f,
                        MOE_RECIPE_BF16, NULL);
    be->memcpy_d2h(be, h16, d16, (size_t)(N * C) * 2);
    uint8_t *ref = malloc(pbytes), *fillb = malloc(pbytes);
    memset(ref, 0xab, pbytes), memset(fillb, 0xab, pbytes);
    float *v = malloc((size_t)(N * C) * 4);
    for (int64_t i = 0; i < N * C; i++)
        v[i] = moe_bf16_to_f32(h16[i]);
    moe_fp8_pair_encode(ref, v, rows, 1, C, rule, tiles);
    /* the pair in one op */
    void *p = dev(be, fillb, pbytes);
    be->rmsnorm_forward(be, moe_buf_fp8_pair(p), rp, x, dnw, N, C, 1e-5f, MOE_RECIPE_BF16, &pg);
    moe_err err;
    moe_err_clear(&err);
    int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "rmsnorm_forward pair: %s", err.msg);
    int64_t first, fr, bad = bytes_differ(be, p, ref, (int64_t)pbytes, &first);
    float *hr = malloc((size_t)N * 4);
    be->memcpy_d2h(be, hr, r16, (size_t)N * 4);
    const int64_t bad_r = bytes_differ(be, rp, (const uint8_t *)hr, N * 4, &fr);
    static const char *names[] = {"", "f32", "bf16"};
    CHECK_MSG(ok && bad == 0 && bad_r == 0,
              "ln1 pair x %s N=%lld C=%lld rule %d tiles %d: %lld of %zu bytes differ (first at "
              "%lld; parts at 0, %zu, %zu, %zu), rstd %lld bytes",
              names[dtx], (long long)N, (long long)C, rule, tiles, (long long)bad, pbytes,
              (long long)first, l.s_rows, l.q_cols, l.s_cols, (long long)bad_r);
    /* the dense products, x the pair or the BF16 ln1 */
    const int64_t nw = O * C;
    float *hq = urand_array(nw, 0.05f), *hdy = urand_array(N * O, 1.0f);
    void *ddy = dev(be, hdy, (size_t)(N * O) * 4);
    const moe_recipe prec = fp8_recipe(rule, tiles);
    const moe_cbuf w = dev_weight(be, hq, 1, O, C, prec);
    float *oy[2], *ow[2];
    const moe_cbuf xs[2] = {moe_cbuf_of(d16, MOE_DTYPE_BF16), moe_cbuf_from(moe_buf_fp8_pair(p))};
    for (int j = 0; j < 2; j++) {
        oy[j] = be->alloc(be, (size_t)(N * O) * 4);
        ow[j] = be->alloc(be, (size_t)nw * 4);
        be->matmul_forward(be, moe_buf_f32(oy[j]), xs[j], w, N, C, O, prec);
        be->matmul_backward(be, NULL, ow[j], moe_cbuf_f32(ddy), xs[j], w, N, C, O, prec,
                            MOE_GRAD_SET, MOE_GRAD_SET);
    }
    ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "the dense products on an ln1 pair: %s", err.msg);
    const int same_y = same_on_dev(be, oy[0], oy[1], (size_t)(N * O) * 4),
              same_w = same_on_dev(be, ow[0], ow[1], (size_t)nw * 4);
    CHECK_MSG(ok && same_y && same_w,
              "dense products on an ln1 pair N=%lld C=%lld rule %d tiles %d: y %s, dw %s",
              (long long)N, (long long)C, rule, tiles, same_y ? "identical" : "DIFFERS",
              same_w ? "identical" : "DIFFERS");
    printf("  ln1 pair  x %-4s N=%-3lld C=%-3lld rule %d %s: %zu bytes%s; q forward y, dw%s\n",
           names[dtx], (long long)N, (long long)C, rule, tiles ? "tiles " : "blocks", l.bytes,
           bad || bad_r ? "  FAILED" : "  identical", same_y && same_w ? " identical" : " DIFFER");
    for (int j = 0; j < 2; j++)
        be->free(be, oy[j]), be->free(be, ow[j]);
    dev_weight_free(be, w), be->free(be, ddy), be->free(be, p), be->free(be, d16);
    be->free(be, r16), be->free(be, rp), be->free(be, dxin), be->free(be, dnw);
    free(hq), free(hdy), free(ref), free(fillb), free(v), free(h16);
    free(hr), free(hx), free(hw);
}

int main(void) {
    const moe_backend *be = test_cuda_backend("gpu_test_quant_operands");
    if (!be) return 77;
    printf("MXFP8 products on this GPU's tensor cores (cuBLASLt VEC32_UE8M0): %s\n",
           be->mx_native ? "yes" : "no (sm_90 and older: bf16 products of the quantized values)");
    static const int64_t counts[] = {37, 0, 130, 1, 256, 0};
    const int64_t E = sizeof counts / sizeof counts[0];
    static const int64_t Ks[] = {96, 208, 256};
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < 3; t++) /* rows, transposed, transposed in tiles (fp8-block) */
            for (int rule = 0; rule < 2; rule++) {
                for (int dt = 1; dt <= 3 && Ks[k] % 32 == 0 && t < 2; dt++)
                    run_case(be, counts, E, Ks[k], dt, t, rule, MXFP8);
                for (int dt = 1; dt <= 2; dt++)
                    run_case(be, counts, E, Ks[k], dt, t, rule, FP8_BLOCK);
            }
    if (be->fp8_pairs >= E) /* h1, h3 bf16 as the model has them; once f32 */
        for (int k = 0; k < 3; k++)
            for (int rule = 0; rule < 2; rule++)
                for (int dt = 1; dt <= 2; dt++)
                    run_pairs(be, counts, E, Ks[k], 2 - (k == 1 && rule == 0 && dt == 1), dt, rule);
    if (be->fp8_pairs >= E) /* a, b bf16 as the model has them; once f32 */
        for (int k = 0; k < 3; k++)
            for (int rule = 0; rule < 2; rule++)
                for (int tiles = 0; tiles < 2; tiles++)
                    run_g_pair(be, counts, E, Ks[k], 2 - (k == 1 && rule == tiles), rule, tiles);
    if (be->fp8_pairs >= E)
        for (int k = 0; k < 3; k++)
            for (int rule = 0; rule < 2; rule++)
                for (int tiles = 0; tiles < 2; tiles++)
                    run_xe_pair(be, counts, E, Ks[k], rule, tiles);
    static const int64_t ln1_shapes[2][2] = {{304, 48}, {208, 256}}; /* N, C */
    if (be->fp8_pairs >= 1)
        for (int sh = 0; sh < 2; sh++)
            for (int rule = 0; rule < 2; rule++)
                for (int tiles = 0; tiles < 2; tiles++)
                    for (int dt = 1; dt <= 2; dt++)
                        run_ln1_pair(be, ln1_shapes[sh][0], ln1_shapes[sh][1], dt, rule, tiles);
    if (be->fp8_pairs < E)
        printf("fp8-block pairs: not on this GPU (be->fp8_pairs %d: sm_90 only)\n", be->fp8_pairs);
    be->destroy(be);
    return test_summary("gpu_test_quant_operands");
}
