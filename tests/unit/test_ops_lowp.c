/* test_ops_lowp: the CPU backend's ops under the low-precision recipes, split from
 * test_ops.c - that the bf16 recipe really rounds (AdamW and cast_bf16: test_adamw.c), that
 * a BF16 weight or BF16 activations give the same bits as the F32 values they hold, that the
 * ops writing MXFP8 activations store the encoding of their bf16 output and read one as its
 * values, that the fp8 recipes' emulated products stay close to fp32, and that fp8-block
 * activation pairs give the products the bits of the BF16 activations and gradients they
 * encode (SwiGLU's, RMSNorm's ln1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "moe/quant.h"
#include "testlib.h"

static const moe_backend *be;

/* ---------------- bf16 emulation actually rounds ---------------- */
static int all_bf16(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (moe_f32_bits(x[i]) & 0xffffu) return 0;
    return 1;
}
/* A BF16 weight (the model's copy) gives the same bits as the F32 weight it was rounded from,
 * in every product that takes one: dense and grouped, forward and both backward products. */
static void test_bf16_weights(void) {
    int64_t N = 6, I = 40, O = 12, E = 3;
    const int32_t off[4] = {0, 2, 2, 6}; /* expert 1 has no rows */
    float *x = gc_buf(N * I, 40, -1, 1), *w = gc_buf(E * O * I, 41, -1, 1),
          *dy = gc_buf(N * O, 42, -1, 1);
    uint16_t *w16 = malloc((size_t)(E * O * I) * sizeof(uint16_t));
    be->cast_bf16(be, w16, w, E * O * I);
    const moe_cbuf wk[2] = {moe_cbuf_f32(w), moe_cbuf_of(w16, MOE_DTYPE_BF16)};
    /* per weight kind: y, dx, dw of the dense product, then the same of the grouped one */
    const int64_t len[6] = {N * O, N * I, O * I, N * O, N * I, E * O * I};
    float *r[2][6];
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 6; j++)
            r[k][j] = gc_buf(len[j], 0, 0, 0);
        be->matmul_forward(be, moe_buf_f32(r[k][0]), moe_cbuf_f32(x), wk[k], N, I, O,
                           MOE_RECIPE_BF16);
        be->matmul_backward(be, r[k][1], r[k][2], moe_cbuf_f32(dy), moe_cbuf_f32(x), wk[k], N, I, O,
                            MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
        be->grouped_matmul_forward(be, moe_buf_f32(r[k][3]), moe_cbuf_f32(x), wk[k], off, E, I, O,
                                   MOE_RECIPE_BF16);
        be->grouped_matmul_backward(be, moe_buf_f32(r[k][4]), moe_buf_f32(r[k][5]),
                                    moe_cbuf_f32(dy), moe_cbuf_f32(x), wk[k], off, E, I, O,
                                    MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
    }
    for (int j = 0; j < 6; j++) {
        CHECK_MSG(memcmp(r[0][j], r[1][j], (size_t)len[j] * sizeof(float)) == 0,
                  "output %d differs between the F32 weight and its BF16 copy", j);
        free(r[0][j]), free(r[1][j]);
    }
    free(x), free(w), free(dy), free(w16);
}

/* The expert path with BF16 activations (what the model stores under the bf16 recipe) gives
 * the same bits as with F32 ones holding the same values: permute, grouped matmul in and
 * out, swiglu, unpermute, forward and backward. */
static void test_bf16_activations(void) {
    enum { N = 5, K = 2, C = 24, F = 16, E = 3, NK = N * K };
    const int32_t idx[NK] = {0, 2, 1, 0, 2, 1, 0, 2, 0, 1};
    float *x = gc_buf(N * C, 50, -1, 1), *w1 = gc_buf(E * F * C, 51, -1, 1);
    float *w2 = gc_buf(E * C * F, 52, -1, 1), *tw = gc_buf(NK, 53, 0, 1),
          *dy = gc_buf(N * C, 54, -1, 1);
    for (int64_t i = 0; i < N * C; i++) /* the permute input is a rounded norm output */
        x[i] = moe_round_bf16(x[i]);
    int32_t src[NK], slot[NK], off[E + 1];
    /* per run: y, then the gradients dxp (via w1), dtw, dw1, dw2 */
    const int64_t len[5] = {N * C, NK * C, NK, E * F * C, E * C * F};
    float *r[2][5];
    for (int k = 0; k < 2; k++) {
        moe_dtype dt = k ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        size_t es = moe_dtype_size(dt);
        void *xp = calloc(NK * C, es), *h = calloc(NK * F, es), *g = calloc(NK * F, es);
        void *yp = calloc(NK * C, es);
        for (int j = 0; j < 5; j++)
            r[k][j] = gc_buf(len[j], 0, 0, 0);
        /* the gradients only a product reads (dyp, dh1, dh3) take the activations' type too */
        void *dyp = calloc(NK * C, es), *dh = calloc(NK * F, es), *dh3 = calloc(NK * F, es);
        float *dg = gc_buf(NK * F, 0, 0, 0);
        be->permute_forward(be, moe_buf_of(xp, dt), src, slot, off, moe_cbuf_f32(x), idx, N, C, E,
                            K);
        be->grouped_matmul_forward(be, moe_buf_of(h, dt), moe_cbuf_of(xp, dt), moe_cbuf_f32(w1),
                                   off, E, C, F, MOE_RECIPE_BF16);
        be->swiglu_forward(be, moe_buf_of(g, dt), moe_cbuf_of(h, dt), moe_cbuf_of(h, dt), NK * F,
                           MOE_RECIPE_BF16, NULL);
        be->grouped_matmul_forward(be, moe_buf_of(yp, dt), moe_cbuf_of(g, dt), moe_cbuf_f32(w2),
                                   off, E, F, C, MOE_RECIPE_BF16);
        be->unpermute_forward(be, moe_buf_f32(r[k][0]), moe_cbuf_f32(NULL), moe_cbuf_of(yp, dt), tw,
                              slot, N, C, K);
        be->unpermute_backward(be, moe_buf_of(dyp, dt), r[k][2], dy, moe_cbuf_of(yp, dt), tw, slot,
                               N, C, K, MOE_GRAD_ADD);
        be->grouped_matmul_backward(be, moe_buf_f32(dg), moe_buf_f32(r[k][4]), moe_cbuf_of(dyp, dt),
                                    moe_cbuf_of(g, dt), moe_cbuf_f32(w2), off, E, F, C,
                                    MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
        be->swiglu_backward(be, moe_buf_of(dh, dt), moe_buf_of(dh3, dt), moe_cbuf_f32(dg),
                            moe_cbuf_of(h, dt), moe_cbuf_of(h, dt), NK * F, NULL);
        be->grouped_matmul_backward(be, moe_buf_f32(r[k][1]), moe_buf_f32(r[k][3]),
                                    moe_cbuf_of(dh, dt), moe_cbuf_of(xp, dt), moe_cbuf_f32(w1), off,
                                    E, C, F, MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
        free(xp), free(h), free(g), free(yp), free(dyp), free(dg), free(dh), free(dh3);
    }
    for (int j = 0; j < 5; j++) {
        CHECK_MSG(memcmp(r[0][j], r[1][j], (size_t)len[j] * sizeof(float)) == 0,
                  "output %d differs between F32 and BF16 expert activations", j);
        free(r[0][j]), free(r[1][j]);
    }
    free(x), free(w1), free(w2), free(tw), free(dy);
}

/* MXFP8 activations (what the model stores under mxfp8, moe_buf_mxfp8): each op that writes
 * one stores the encoding (moe_mxfp8_encode_block) of the bf16 output it writes given the same
 * input values - permute, the grouped forward, swiglu both ways (in place, over its
 * inputs, as the model runs it) - and the grouped backward reads one as its values. */
static int mx_is(const uint8_t *q, const uint8_t *mx, const uint16_t *ref16, int64_t n) {
    float *v = malloc((size_t)n * sizeof(float));
    uint8_t *rq = malloc((size_t)n), *rmx = malloc((size_t)n / 32);
    for (int64_t i = 0; i < n; i++)
        v[i] = moe_bf16_to_f32(ref16[i]);
    test_mxfp8_encode(rq, rmx, v, n);
    int same = memcmp(rq, q, (size_t)n) == 0 && memcmp(rmx, mx, (size_t)n / 32) == 0;
    free(v), free(rq), free(rmx);
    return same;
}

/* q [n] + its scales after it: a malloc'ed MXFP8 activation; values decoded into a new F32 */
static float *mx_values(const uint8_t *q, int64_t n) {
    float *v = malloc((size_t)n * sizeof(float));
    test_mxfp8_decode(v, q, q + n, n);
    return v;
}

static void test_mxfp8_activations(void) {
    enum { N = 5, K = 2, C = 32, F = 64, E = 3, NK = N * K };
    const moe_recipe mx = MOE_RECIPE_MXFP8;
    const int32_t idx[NK] = {0, 2, 1, 0, 2, 1, 0, 2, 0, 1};
    float *x = gc_buf(N * C, 70, -1, 1), *w1 = gc_buf(E * F * C, 71, -1, 1);
    float *w3 = gc_buf(E * F * C, 72, -1, 1), *dg = gc_buf(NK * F, 73, -1, 1);
    x[7] = 40.0f, x[40] = 0.0f; /* an outlier in one block */
    for (int64_t i = 0; i < N * C; i++)
        x[i] = moe_round_bf16(x[i]);
    int32_t src[NK], slot[NK], off[E + 1];
    uint8_t *xp = calloc(NK * C + NK * C / 32, 1), *h1 = calloc(NK * F + NK * F / 32, 1);
    uint8_t *h3 = calloc(NK * F + NK * F / 32, 1), *g = calloc(NK * F + NK * F / 32, 1);
    uint16_t *r16 = calloc(NK * F, 2), *r16b = calloc(NK * F, 2);
    moe_buf xpb = moe_buf_mxfp8(xp, xp + NK * C), h1b = moe_buf_mxfp8(h1, h1 + NK * F);
    moe_buf h3b = moe_buf_mxfp8(h3, h3 + NK * F), gb = moe_buf_mxfp8(g, g + NK * F);
    be->permute_forward(be, xpb, src, slot, off, moe_cbuf_f32(x), idx, N, C, E, K);
    be->permute_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), src, slot, off, moe_cbuf_f32(x), idx,
                        N, C, E, K);
    CHECK_MSG(mx_is(xp, xp + NK * C, r16, NK * C), "permute into MXFP8");
    float *xv = mx_values(xp, NK * C);
    be->grouped_matmul_forward(be, h1b, moe_cbuf_from(xpb), moe_cbuf_f32(w1), off, E, C, F, mx);
    be->grouped_matmul_forward(be, h3b, moe_cbuf_from(xpb), moe_cbuf_f32(w3), off, E, C, F, mx);
    be->grouped_matmul_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), moe_cbuf_f32(xv),
                               moe_cbuf_f32(w1), off, E, C, F, mx);
    CHECK_MSG(mx_is(h1, h1 + NK * F, r16, NK * F), "grouped forward into MXFP8");
    float *h1v = mx_values(h1, NK * F), *h3v = mx_values(h3, NK * F);
    be->swiglu_forward(be, gb, moe_cbuf_from(h1b), moe_cbuf_from(h3b), NK * F, MOE_RECIPE_BF16,
                       NULL);
    be->swiglu_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), moe_cbuf_f32(h1v), moe_cbuf_f32(h3v),
                       NK * F, MOE_RECIPE_BF16, NULL);
    CHECK_MSG(mx_is(g, g + NK * F, r16, NK * F), "swiglu forward into MXFP8");
    /* the weight gradients read MXFP8 operands as their values */
    float *dw[2] = {gc_buf(E * F * C, 0, 0, 0), gc_buf(E * F * C, 0, 0, 0)};
    float *dx[2] = {gc_buf(NK * C, 0, 0, 0), gc_buf(NK * C, 0, 0, 0)};
    float *gv = mx_values(g, NK * F);
    be->grouped_matmul_backward(be, moe_buf_f32(dx[0]), moe_buf_f32(dw[0]), moe_cbuf_from(gb),
                                moe_cbuf_from(xpb), moe_cbuf_f32(w1), off, E, C, F, mx,
                                MOE_GRAD_SET, MOE_GRAD_SET);
    be->grouped_matmul_backward(be, moe_buf_f32(dx[1]), moe_buf_f32(dw[1]), moe_cbuf_f32(gv),
                                moe_cbuf_f32(xv), moe_cbuf_f32(w1), off, E, C, F, mx, MOE_GRAD_SET,
                                MOE_GRAD_SET);
    CHECK(memcmp(dw[0], dw[1], (size_t)(E * F * C) * 4) == 0);
    CHECK(memcmp(dx[0], dx[1], (size_t)(NK * C) * 4) == 0);
    /* swiglu backward in place over its MXFP8 inputs */
    be->swiglu_backward(be, moe_buf_of(r16, MOE_DTYPE_BF16), moe_buf_of(r16b, MOE_DTYPE_BF16),
                        moe_cbuf_f32(dg), moe_cbuf_f32(h1v), moe_cbuf_f32(h3v), NK * F, NULL);
    be->swiglu_backward(be, h1b, h3b, moe_cbuf_f32(dg), moe_cbuf_from(h1b), moe_cbuf_from(h3b),
                        NK * F, NULL);
    CHECK_MSG(mx_is(h1, h1 + NK * F, r16, NK * F) && mx_is(h3, h3 + NK * F, r16b, NK * F),
              "swiglu backward in place into MXFP8");
    free(x), free(w1), free(w3), free(dg), free(xp), free(h1), free(h3), free(g), free(r16);
    free(r16b), free(xv), free(h1v), free(h3v), free(gv);
    for (int k = 0; k < 2; k++)
        free(dw[k]), free(dx[k]);
}

/* ln1 under mxfp8: RMSNorm stores the encoding of its bf16 output, and the attention
 * projections read that operand as its values - the forward's row-wise quantization keeps
 * them (the same bits as the decoded values), the weight gradient quantizes them again along
 * the tokens. */
static void test_mxfp8_norm_output(void) {
    enum { N = 6, C = 64, O = 96 };
    const moe_recipe mx = MOE_RECIPE_MXFP8;
    float *x = gc_buf(N * C, 80, -2, 2), *w = gc_buf(C, 81, 0.5f, 1.5f);
    float *wq = gc_buf(O * C, 82, -1, 1), *dy = gc_buf(N * O, 83, -1, 1), rstd[N];
    x[9] = 90.0f; /* an outlier in one block */
    uint8_t *ln = calloc(N * C + N * C / 32, 1);
    uint16_t *r16 = calloc(N * C, 2);
    moe_buf lnb = moe_buf_mxfp8(ln, ln + N * C);
    be->rmsnorm_forward(be, lnb, rstd, moe_cbuf_f32(x), w, N, C, 1e-5f, MOE_RECIPE_BF16, NULL);
    be->rmsnorm_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), rstd, moe_cbuf_f32(x), w, N, C, 1e-5f,
                        MOE_RECIPE_BF16, NULL);
    CHECK_MSG(mx_is(ln, ln + N * C, r16, N * C), "rmsnorm into MXFP8");
    float *lv = mx_values(ln, N * C);
    float *y[2], *dx[2], *dw[2];
    for (int k = 0; k < 2; k++) {
        moe_cbuf xin = k ? moe_cbuf_f32(lv) : moe_cbuf_from(lnb);
        y[k] = gc_buf(N * O, 0, 0, 0), dx[k] = gc_buf(N * C, 0, 0, 0),
        dw[k] = gc_buf(O * C, 0, 0, 0);
        be->matmul_forward(be, moe_buf_f32(y[k]), xin, moe_cbuf_f32(wq), N, C, O, mx);
        be->matmul_backward(be, dx[k], dw[k], moe_cbuf_f32(dy), xin, moe_cbuf_f32(wq), N, C, O, mx,
                            MOE_GRAD_SET, MOE_GRAD_SET);
    }
    CHECK(memcmp(y[0], y[1], (size_t)(N * O) * 4) == 0);
    CHECK(memcmp(dx[0], dx[1], (size_t)(N * C) * 4) == 0);
    CHECK(memcmp(dw[0], dw[1], (size_t)(O * C) * 4) == 0);
    free(x), free(w), free(wq), free(dy), free(ln), free(r16), free(lv);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dx[k]), free(dw[k]);
}

/* The fp8 recipes' emulated products (ops_fp8.c) stay close to fp32 (E4M3 with block scales:
 * nmse about 1e-3), store bf16 forward outputs, leave an expert without rows untouched, and
 * are not just bf16 (they differ from it). */
static double nmse(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++)
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), den += (double)ref[i] * ref[i];
    return num / den;
}

static void test_fp8_products(void) {
    int64_t N = 40, I = 160, O = 136, E = 3;
    const int32_t off[4] = {0, 25, 25, 40}; /* expert 1 has no rows */
    float *x = gc_buf(N * I, 60, -1, 1), *w = gc_buf(E * O * I, 61, -1, 1),
          *dy = gc_buf(N * O, 62, -1, 1);
    const moe_recipe rs[2] = {MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_MXFP8};
    float *y32 = gc_buf(N * O, 0, 0, 0), *dx32 = gc_buf(N * I, 0, 0, 0),
          *dw32 = gc_buf(O * I, 0, 0, 0);
    be->matmul_forward(be, moe_buf_f32(y32), moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
                       MOE_RECIPE_FP32);
    be->matmul_backward(be, dx32, dw32, moe_cbuf_f32(dy), moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    float *y16 = gc_buf(N * O, 0, 0, 0);
    be->matmul_forward(be, moe_buf_f32(y16), moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
                       MOE_RECIPE_BF16);
    for (int r = 0; r < 2; r++) {
        /* fp8-block reads the weight's e4m3 copies, mxfp8 the fp32 master */
        moe_cbuf w1 = gc_weight(be, w, 1, O, I, rs[r]), wE = gc_weight(be, w, E, O, I, rs[r]);
        float *y = gc_buf(N * O, 0, 0, 0), *dx = gc_buf(N * I, 0, 0, 0),
              *dw = gc_buf(O * I, 0, 0, 0);
        be->matmul_forward(be, moe_buf_f32(y), moe_cbuf_f32(x), w1, N, I, O, rs[r]);
        be->matmul_backward(be, dx, dw, moe_cbuf_f32(dy), moe_cbuf_f32(x), w1, N, I, O, rs[r],
                            MOE_GRAD_ADD, MOE_GRAD_ADD);
        CHECK_MSG(nmse(y, y32, N * O) < 2e-3 && nmse(dx, dx32, N * I) < 2e-3 &&
                      nmse(dw, dw32, O * I) < 2e-3,
                  "%s: nmse y %g dx %g dw %g", moe_recipe_name(rs[r]), nmse(y, y32, N * O),
                  nmse(dx, dx32, N * I), nmse(dw, dw32, O * I));
        CHECK(all_bf16(y, N * O) && memcmp(y, y16, (size_t)(N * O) * 4) != 0);
        float *gy = gc_buf(N * O, 0, 0, 0), *gdx = gc_buf(N * I, 0, 0, 0),
              *gdw = gc_buf(E * O * I, 0, 0, 0);
        for (int64_t i = O * I; i < 2 * O * I; i++)
            gdw[i] = 7.0f; /* expert 1's gradient must stay as it is */
        be->grouped_matmul_forward(be, moe_buf_f32(gy), moe_cbuf_f32(x), wE, off, E, I, O, rs[r]);
        be->grouped_matmul_backward(be, moe_buf_f32(gdx), moe_buf_f32(gdw), moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wE, off, E, I, O, rs[r], MOE_GRAD_ADD,
                                    MOE_GRAD_ADD);
        int kept = 1;
        for (int64_t i = O * I; i < 2 * O * I; i++)
            kept &= gdw[i] == 7.0f;
        CHECK(kept && all_bf16(gy, N * O));
        /* expert 0's rows give what the dense product of its weight gives */
        float *y0 = gc_buf(25 * O, 0, 0, 0);
        be->matmul_forward(be, moe_buf_f32(y0), moe_cbuf_f32(x), w1, 25, I, O, rs[r]);
        CHECK(memcmp(y0, gy, (size_t)(25 * O) * 4) == 0);
        free(y), free(dx), free(dw), free(gy), free(gdx), free(gdw), free(y0);
        gc_weight_free(w1), gc_weight_free(wE);
    }
    CHECK(be->supports(be, MOE_OP_MATMUL, NULL, MOE_RECIPE_FP8_BLOCK));
    free(x), free(w), free(dy), free(y32), free(dx32), free(dw32), free(y16);
}

/* precision.fp8_wgrad x-tiles (MOE_RECIPE_FP8_BLOCK_XT and _POW2_XT): the wgrad reads x in
 * 128 x 128 tiles from each group's first row and nothing else changes: dx is fp8-block's bit
 * for bit, dw is dy^T (along the tokens) times x (tiles) as moe/quant.h's fake quantizers give
 * them, and differs from fp8-block's (the check could tell them apart: the same reference is
 * far from fp8-block's dw). Groups of 130 (a partial second tile), 0 and 70 rows; I 208 (a
 * partial tile along the features). */
static void test_fp8_wgrad_tiles(void) {
    enum { E = 3, N = 200, I = 208, O = 144 };
    const int32_t off[E + 1] = {0, 130, 130, 200};
    float *x = gc_buf(N * I, 70, -1, 1), *w = gc_buf(E * O * I, 71, -1, 1),
          *dy = gc_buf(N * O, 72, -1, 1);
    for (int64_t r = 0; r < N; r++) /* an outlier feature: its tiles' other features lose bits */
        x[r * I + 5] *= 300.0f;
    for (int pow2 = 0; pow2 < 2; pow2++) {
        const moe_recipe rb = pow2 ? MOE_RECIPE_FP8_BLOCK_POW2 : MOE_RECIPE_FP8_BLOCK,
                         rt = pow2 ? MOE_RECIPE_FP8_BLOCK_POW2_XT : MOE_RECIPE_FP8_BLOCK_XT;
        CHECK(moe_recipe_format(rt) == MOE_RECIPE_FP8_BLOCK && moe_recipe_pow2(rt) == pow2 &&
              moe_recipe_wgrad_tiles(rt) && !moe_recipe_wgrad_tiles(rb));
        moe_cbuf wE = gc_weight(be, w, E, O, I, rt);
        float *dxb = gc_buf(N * I, 0, 0, 0), *dwb = gc_buf(E * O * I, 0, 0, 0),
              *dxt = gc_buf(N * I, 0, 0, 0), *dwt = gc_buf(E * O * I, 0, 0, 0),
              *ref = gc_buf(E * O * I, 0, 0, 0);
        be->grouped_matmul_backward(be, moe_buf_f32(dxb), moe_buf_f32(dwb), moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wE, off, E, I, O, rb, MOE_GRAD_SET,
                                    MOE_GRAD_SET);
        be->grouped_matmul_backward(be, moe_buf_f32(dxt), moe_buf_f32(dwt), moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wE, off, E, I, O, rt, MOE_GRAD_SET,
                                    MOE_GRAD_SET);
        CHECK(memcmp(dxb, dxt, sizeof(float) * N * I) == 0);
        /* the reference: each group's dy along its tokens, its x in tiles, summed in double */
        const moe_quant_opts ob = moe_quant_opts_of(rb);
        float *dq = gc_buf(N * O, 0, 0, 0), *xq = gc_buf(N * I, 0, 0, 0);
        for (int e = 0; e < E; e++) {
            const int64_t r0 = off[e], n = off[e + 1] - r0;
            if (n == 0) continue;
            moe_quant_fake_vectors(dq + r0 * O, dy + r0 * O, O, 1, n, O, &ob);
            moe_quant_fake_tiles(xq + r0 * I, x + r0 * I, n, I, pow2);
            for (int64_t o = 0; o < O; o++)
                for (int64_t i = 0; i < I; i++) {
                    double a = 0;
                    for (int64_t r = r0; r < r0 + n; r++)
                        a += (double)dq[r * O + o] * xq[r * I + i];
                    ref[(e * O + o) * I + i] = (float)a;
                }
        }
        const double et = nmse(dwt, ref, E * O * I), eb = nmse(dwb, ref, E * O * I);
        CHECK_MSG(et < 1e-12 && eb > 1e4 * et && eb > 0,
                  "pow2 %d: x-tiles dw nmse %g to its reference, "
                  "fp8-block's %g",
                  pow2, et, eb);
        /* the dense product: one group */
        float *ddt = gc_buf(O * I, 0, 0, 0);
        moe_cbuf w1 = gc_weight(be, w, 1, O, I, rt);
        be->matmul_backward(be, NULL, ddt, moe_cbuf_f32(dy), moe_cbuf_f32(x), w1, 130, I, O, rt,
                            MOE_GRAD_SET, MOE_GRAD_SET);
        CHECK_MSG(nmse(ddt, ref, O * I) < 1e-12, "dense x-tiles dw nmse %g", nmse(ddt, ref, O * I));
        free(dxb), free(dwb), free(dxt), free(dwt), free(ref), free(dq), free(xq), free(ddt);
        gc_weight_free(wE), gc_weight_free(w1);
    }
    free(x), free(w), free(dy);
}

/* fp8-block activation pairs (moe_buf_fp8_pair): SwiGLU's backward writing dh1 and dh3 as
 * pairs and the grouped backward reading one as dy give the bits of the unfused path (BF16
 * dh1/dh3 quantized by the grouped backward itself) - dx written then added, an F32 and a BF16
 * dw - under both scale rules, for uneven groups (an empty one, one of 129 rows) and widths F
 * not a multiple of 128 and a multiple; and grouped_dgrad_sum on the two pairs gives that dx,
 * as it is (F32) and rounded (BF16). */
static void test_fp8_pairs(void) {
    enum { E = 4, M = 300, C = 48 };
    const int32_t off[E + 1] = {0, 150, 150, 279, 300};
    const int64_t Fs[2] = {208, 256};
    const moe_recipe rs[2] = {MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK_POW2};
    CHECK(be->fp8_pairs >= E);
    for (int fi = 0; fi < 2; fi++)
        for (int ri = 0; ri < 2; ri++) {
            const int64_t F = Fs[fi];
            const moe_recipe prec = rs[ri];
            float *h1 = gc_buf(M * F, 90, -3, 3), *h3 = gc_buf(M * F, 91, -2, 2);
            float *dg = gc_buf(M * F, 92, -1, 1), *x = gc_buf(M * C, 93, -1, 1);
            float *w1 = gc_buf(E * F * C, 94, -1, 1), *w3 = gc_buf(E * F * C, 95, -1, 1);
            for (int64_t i = 0; i < M * F; i += 211)
                dg[i] *= 500.0f; /* outliers: blocks of very different scales */
            moe_cbuf w1q = gc_weight(be, w1, E, F, C, prec), w3q = gc_weight(be, w3, E, F, C, prec);
            /* per path: dx (w1's SET, then w3's ADD), dw1 F32, dw3 BF16; with pairs also dx as
             * grouped_dgrad_sum writes it, F32 (dxs) and BF16 (dxs16) */
            float *dx[2], *dw1[2], *dxs = gc_buf(M * C, 0, 0, 0);
            uint16_t *dw3[2], *dxs16 = calloc((size_t)(M * C), 2);
            for (int k = 0; k < 2; k++) {
                dx[k] = gc_buf(M * C, 0, 0, 0), dw1[k] = gc_buf(E * F * C, 0, 0, 0);
                dw3[k] = calloc((size_t)(E * F * C), 2);
                /* k = 0 unfused: BF16 gradients, quantized by the products; k = 1 pairs */
                const moe_fp8_groups grp = {off, E, F, prec == MOE_RECIPE_FP8_BLOCK_POW2, 0};
                const size_t bytes = k ? moe_fp8_pair_bytes_max(M, E, F) : (size_t)(M * F) * 2;
                void *g1 = be->alloc(be, bytes), *g3 = be->alloc(be, bytes);
                const moe_buf dh1 = k ? moe_buf_fp8_pair(g1) : moe_buf_of(g1, MOE_DTYPE_BF16);
                const moe_buf dh3 = k ? moe_buf_fp8_pair(g3) : moe_buf_of(g3, MOE_DTYPE_BF16);
                be->swiglu_backward(be, dh1, dh3, moe_cbuf_f32(dg), moe_cbuf_f32(h1),
                                    moe_cbuf_f32(h3), M * F, k ? &grp : NULL);
                be->grouped_matmul_backward(be, moe_buf_f32(dx[k]), moe_buf_f32(dw1[k]),
                                            moe_cbuf_from(dh1), moe_cbuf_f32(x), w1q, off, E, C, F,
                                            prec, MOE_GRAD_SET, MOE_GRAD_SET);
                be->grouped_matmul_backward(
                    be, moe_buf_f32(dx[k]), moe_buf_of(dw3[k], MOE_DTYPE_BF16), moe_cbuf_from(dh3),
                    moe_cbuf_f32(x), w3q, off, E, C, F, prec, MOE_GRAD_ADD, MOE_GRAD_SET);
                if (k) {
                    be->grouped_dgrad_sum(be, moe_buf_f32(dxs), moe_cbuf_from(dh1), w1q,
                                          moe_cbuf_from(dh3), w3q, off, E, C, F, prec);
                    be->grouped_dgrad_sum(be, moe_buf_of(dxs16, MOE_DTYPE_BF16), moe_cbuf_from(dh1),
                                          w1q, moe_cbuf_from(dh3), w3q, off, E, C, F, prec);
                }
                be->free(be, g1), be->free(be, g3);
            }
            int64_t bad16 = 0;
            for (int64_t i = 0; i < M * C; i++)
                bad16 += dxs16[i] != moe_f32_to_bf16(dx[1][i]);
            CHECK_MSG(memcmp(dxs, dx[1], (size_t)(M * C) * 4) == 0 && bad16 == 0,
                      "%s F %lld: grouped_dgrad_sum differs from w1's dgrad plus w3's (F32), or "
                      "from their sum rounded (BF16: %lld values)",
                      moe_recipe_name(prec), (long long)F, (long long)bad16);
            CHECK_MSG(memcmp(dx[0], dx[1], (size_t)(M * C) * 4) == 0 &&
                          memcmp(dw1[0], dw1[1], (size_t)(E * F * C) * 4) == 0 &&
                          memcmp(dw3[0], dw3[1], (size_t)(E * F * C) * 2) == 0,
                      "%s F %lld: the pair path differs from the BF16 one", moe_recipe_name(prec),
                      (long long)F);
            CHECK(dx[0][0] != 0.0f && dw1[0][0] != 0.0f); /* the products ran */
            for (int k = 0; k < 2; k++)
                free(dx[k]), free(dw1[k]), free(dw3[k]);
            free(dxs), free(dxs16);
            gc_weight_free(w1q), gc_weight_free(w3q);
            free(h1), free(h3), free(dg), free(x), free(w1), free(w3);
        }
}

/* SwiGLU's output g as an fp8-block activation pair (swiglu_forward with groups) read by w2's
 * products as x give the bits of the unfused path (BF16 g quantized by the products): the
 * forward's y and the weight gradient (F32 and BF16), under both scale rules and both
 * precision.fp8_wgrad forms (the pair's transposed copy in blocks or in tiles), for uneven
 * groups (an empty one, one of 129 rows) and widths F not a multiple of 128 and a multiple. */
static void test_fp8_g_pairs(void) {
    enum { E = 4, M = 300, C = 48 };
    const int32_t off[E + 1] = {0, 150, 150, 279, 300};
    const int64_t Fs[2] = {208, 256};
    const moe_recipe rs[4] = {MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK_POW2,
                              MOE_RECIPE_FP8_BLOCK_XT, MOE_RECIPE_FP8_BLOCK_POW2_XT};
    for (int fi = 0; fi < 2; fi++)
        for (int ri = 0; ri < 4; ri++) {
            const int64_t F = Fs[fi];
            const moe_recipe prec = rs[ri];
            float *h1 = gc_buf(M * F, 96, -3, 3), *h3 = gc_buf(M * F, 97, -2, 2);
            float *dy = gc_buf(M * C, 98, -1, 1), *w2 = gc_buf(E * C * F, 99, -1, 1);
            for (int64_t i = 0; i < M * F; i += 173)
                h3[i] *= 300.0f; /* outliers: blocks and tiles of very different scales */
            moe_cbuf w2q = gc_weight(be, w2, E, C, F, prec);
            float *y[2], *dw[2];
            uint16_t *dw16[2];
            for (int k = 0; k < 2; k++) { /* k = 0 unfused: BF16 g; k = 1 the pair */
                y[k] = gc_buf(M * C, 0, 0, 0), dw[k] = gc_buf(E * C * F, 0, 0, 0);
                dw16[k] = calloc((size_t)(E * C * F), 2);
                const moe_fp8_groups grp = {off, E, F, moe_recipe_pow2(prec),
                                            moe_recipe_wgrad_tiles(prec)};
                const size_t bytes = k ? moe_fp8_pair_bytes_max(M, E, F) : (size_t)(M * F) * 2;
                void *gm = be->alloc(be, bytes);
                const moe_buf g = k ? moe_buf_fp8_pair(gm) : moe_buf_of(gm, MOE_DTYPE_BF16);
                be->swiglu_forward(be, g, moe_cbuf_f32(h1), moe_cbuf_f32(h3), M * F,
                                   MOE_RECIPE_BF16, k ? &grp : NULL);
                be->grouped_matmul_forward(be, moe_buf_f32(y[k]), moe_cbuf_from(g), w2q, off, E, F,
                                           C, prec);
                be->grouped_matmul_backward(be, moe_buf_f32(NULL), moe_buf_f32(dw[k]),
                                            moe_cbuf_f32(dy), moe_cbuf_from(g), w2q, off, E, F, C,
                                            prec, MOE_GRAD_SET, MOE_GRAD_SET);
                be->grouped_matmul_backward(
                    be, moe_buf_f32(NULL), moe_buf_of(dw16[k], MOE_DTYPE_BF16), moe_cbuf_f32(dy),
                    moe_cbuf_from(g), w2q, off, E, F, C, prec, MOE_GRAD_SET, MOE_GRAD_SET);
                be->free(be, gm);
            }
            CHECK_MSG(memcmp(y[0], y[1], (size_t)(M * C) * 4) == 0 &&
                          memcmp(dw[0], dw[1], (size_t)(E * C * F) * 4) == 0 &&
                          memcmp(dw16[0], dw16[1], (size_t)(E * C * F) * 2) == 0,
                      "%s%s F %lld: the g pair path differs from the BF16 one",
                      moe_recipe_name(prec), moe_recipe_wgrad_tiles(prec) ? " x-tiles" : "",
                      (long long)F);
            CHECK(y[0][0] != 0.0f && dw[0][0] != 0.0f); /* the products ran */
            for (int k = 0; k < 2; k++)
                free(y[k]), free(dw[k]), free(dw16[k]);
            gc_weight_free(w2q);
            free(h1), free(h3), free(dy), free(w2);
        }
}

/* The expert inputs xe as an fp8-block activation pair (quantize_pair, fp8-block training) read
 * by w1's and w3's products as x: the pair holds byte for byte moe_fp8_pair_encode of x's BF16
 * values (the bytes past it untouched), and the forward's y and the weight gradients (F32 and
 * BF16) are those of the BF16 xe - under both scale rules and both precision.fp8_wgrad forms,
 * for uneven groups (an empty one, one of 129 rows) and widths C 208 (a partial block) and
 * 256. */
static void test_fp8_xe_pair(void) {
    enum { E = 4, M = 300, F = 144 };
    const int32_t off[E + 1] = {0, 150, 150, 279, 300};
    const int64_t Cs[2] = {208, 256};
    const moe_recipe rs[4] = {MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK_POW2,
                              MOE_RECIPE_FP8_BLOCK_XT, MOE_RECIPE_FP8_BLOCK_POW2_XT};
    CHECK(be->fp8_pairs >= E);
    for (int ci = 0; ci < 2; ci++)
        for (int ri = 0; ri < 4; ri++) {
            const int64_t C = Cs[ci];
            const moe_recipe prec = rs[ri];
            const int pow2 = moe_recipe_pow2(prec), tiles = moe_recipe_wgrad_tiles(prec);
            float *x = gc_buf(M * C, 120, -2, 2), *w1 = gc_buf(E * F * C, 121, -1, 1);
            float *dy = gc_buf(M * F, 122, -1, 1);
            for (int64_t r = 0; r < M; r += 5) /* rows, blocks and tiles of different scales */
                x[r * C + (r * 7) % C] *= 300.0f;
            uint16_t *x16 = calloc((size_t)(M * C), 2);
            float *v = gc_buf(M * C, 0, 0, 0);
            for (int64_t i = 0; i < M * C; i++)
                x16[i] = moe_f32_to_bf16(x[i]), v[i] = moe_bf16_to_f32(x16[i]);
            const moe_fp8_groups grp = {off, E, C, pow2, tiles};
            const size_t bytes = moe_fp8_pair_bytes_max(M, E, C) + 64;
            uint8_t *pair = be->alloc(be, bytes), *ref = be->alloc(be, bytes);
            memset(pair, 0xa5, bytes), memset(ref, 0xa5, bytes);
            be->quantize_pair(be, moe_buf_fp8_pair(pair), moe_cbuf_of(x16, MOE_DTYPE_BF16), &grp);
            moe_fp8_pair_encode(ref, v, off, E, C, pow2, tiles);
            CHECK_MSG(memcmp(pair, ref, bytes) == 0,
                      "%s%s%s C %lld: the xe pair is not the encoding of x's bf16 values",
                      moe_recipe_name(prec), pow2 ? " pow2" : "", tiles ? " x-tiles" : "",
                      (long long)C);
            moe_cbuf w1q = gc_weight(be, w1, E, F, C, prec);
            float *y[2], *dw[2];
            uint16_t *dw16[2];
            for (int k = 0; k < 2; k++) { /* k = 0 the BF16 xe, k = 1 the pair */
                const moe_cbuf xe =
                    k ? moe_cbuf_from(moe_buf_fp8_pair(pair)) : moe_cbuf_of(x16, MOE_DTYPE_BF16);
                y[k] = gc_buf(M * F, 0, 0, 0), dw[k] = gc_buf(E * F * C, 0, 0, 0);
                dw16[k] = calloc((size_t)(E * F * C), 2);
                be->grouped_matmul_forward(be, moe_buf_f32(y[k]), xe, w1q, off, E, C, F, prec);
                be->grouped_matmul_backward(be, moe_buf_f32(NULL), moe_buf_f32(dw[k]),
                                            moe_cbuf_f32(dy), xe, w1q, off, E, C, F, prec,
                                            MOE_GRAD_SET, MOE_GRAD_SET);
                be->grouped_matmul_backward(
                    be, moe_buf_f32(NULL), moe_buf_of(dw16[k], MOE_DTYPE_BF16), moe_cbuf_f32(dy),
                    xe, w1q, off, E, C, F, prec, MOE_GRAD_SET, MOE_GRAD_SET);
            }
            CHECK_MSG(memcmp(y[0], y[1], (size_t)(M * F) * 4) == 0 &&
                          memcmp(dw[0], dw[1], (size_t)(E * F * C) * 4) == 0 &&
                          memcmp(dw16[0], dw16[1], (size_t)(E * F * C) * 2) == 0,
                      "%s%s%s C %lld: the products on the xe pair differ from the bf16 ones",
                      moe_recipe_name(prec), pow2 ? " pow2" : "", tiles ? " x-tiles" : "",
                      (long long)C);
            CHECK(y[0][0] != 0.0f && dw[0][0] != 0.0f); /* the products ran */
            for (int k = 0; k < 2; k++)
                free(y[k]), free(dw[k]), free(dw16[k]);
            gc_weight_free(w1q);
            be->free(be, pair), be->free(be, ref);
            free(x), free(w1), free(dy), free(x16), free(v);
        }
}

/* RMSNorm's output ln1 as an fp8-block activation pair of one group (rmsnorm_forward with
 * groups, fp8-block training) and the dense products reading it as x: the pair holds byte for
 * byte moe_fp8_pair_encode of the BF16 norm (its gaps and the bytes past it untouched), rstd is
 * the BF16 path's, and the q/k/v-like product's y, dx and dw (F32 and BF16 y; dw written then
 * added) are those of the BF16 ln1 - under both scale rules and both precision.fp8_wgrad forms,
 * widths C 208 (a partial block) and 256, an input x of F32 and of BF16 values, N = 300 rows
 * (a partial block of tokens, not a multiple of 16). */
static void test_fp8_ln1_pair(void) {
    enum { N = 300, O = 144 };
    const int32_t rows[2] = {0, N};
    const int64_t Cs[2] = {208, 256};
    const moe_recipe rs[4] = {MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK_POW2,
                              MOE_RECIPE_FP8_BLOCK_XT, MOE_RECIPE_FP8_BLOCK_POW2_XT};
    CHECK(be->fp8_pairs >= 1);
    for (int ci = 0; ci < 2; ci++)
        for (int ri = 0; ri < 4; ri++)
            for (int xb = 0; xb < 2; xb++) {
                const int64_t C = Cs[ci];
                const moe_recipe prec = rs[ri];
                const int pow2 = moe_recipe_pow2(prec), tiles = moe_recipe_wgrad_tiles(prec);
                float *x = gc_buf(N * C, 110, -2, 2), *g = gc_buf(C, 111, 0.5, 1.5);
                float *w = gc_buf(O * C, 112, -1, 1), *dy = gc_buf(N * O, 113, -1, 1);
                for (int64_t r = 0; r < N; r += 7) /* rows and blocks of very different scales */
                    x[r * C + r % C] *= 400.0f;
                uint16_t *x16 = calloc((size_t)(N * C), 2);
                for (int64_t i = 0; i < N * C; i++)
                    x16[i] = moe_f32_to_bf16(x[i]);
                const moe_cbuf xin = xb ? moe_cbuf_of(x16, MOE_DTYPE_BF16) : moe_cbuf_f32(x);
                /* the BF16 ln1 and the pair from the same op */
                uint16_t *ln16 = calloc((size_t)(N * C), 2);
                float *rs16 = gc_buf(N, 0, 0, 0), *rsp = gc_buf(N, 0, 0, 0);
                be->rmsnorm_forward(be, moe_buf_of(ln16, MOE_DTYPE_BF16), rs16, xin, g, N, C, 1e-5f,
                                    MOE_RECIPE_BF16, NULL);
                const moe_fp8_groups grp = {rows, 1, C, pow2, tiles};
                const size_t bytes = moe_fp8_pair_bytes_max(N, 1, C) + 64;
                uint8_t *pair = be->alloc(be, bytes), *ref = be->alloc(be, bytes);
                memset(pair, 0xa5, bytes), memset(ref, 0xa5, bytes);
                be->rmsnorm_forward(be, moe_buf_fp8_pair(pair), rsp, xin, g, N, C, 1e-5f,
                                    MOE_RECIPE_BF16, &grp);
                float *v = gc_buf(N * C, 0, 0, 0);
                for (int64_t i = 0; i < N * C; i++)
                    v[i] = moe_bf16_to_f32(ln16[i]);
                moe_fp8_pair_encode(ref, v, rows, 1, C, pow2, tiles);
                CHECK_MSG(memcmp(pair, ref, bytes) == 0 && memcmp(rsp, rs16, N * 4) == 0,
                          "%s%s%s C %lld x %s: the ln1 pair is not the bf16 norm's encoding",
                          moe_recipe_name(prec), pow2 ? " pow2" : "", tiles ? " x-tiles" : "",
                          (long long)C, xb ? "bf16" : "f32");
                /* the dense product on either: y (F32, BF16), dx, dw written then added */
                moe_cbuf wq = gc_weight(be, w, 1, O, C, prec);
                float *y[2], *dx[2], *dw[2];
                uint16_t *y16[2];
                for (int k = 0; k < 2; k++) { /* k = 0 the BF16 ln1, k = 1 the pair */
                    const moe_cbuf ln = k ? moe_cbuf_from(moe_buf_fp8_pair(pair))
                                          : moe_cbuf_of(ln16, MOE_DTYPE_BF16);
                    y[k] = gc_buf(N * O, 0, 0, 0), dx[k] = gc_buf(N * C, 0, 0, 0);
                    dw[k] = gc_buf(O * C, 0, 0, 0), y16[k] = calloc((size_t)(N * O), 2);
                    be->matmul_forward(be, moe_buf_f32(y[k]), ln, wq, N, C, O, prec);
                    be->matmul_forward(be, moe_buf_of(y16[k], MOE_DTYPE_BF16), ln, wq, N, C, O,
                                       prec);
                    be->matmul_backward(be, dx[k], dw[k], moe_cbuf_f32(dy), ln, wq, N, C, O, prec,
                                        MOE_GRAD_SET, MOE_GRAD_SET);
                    be->matmul_backward(be, NULL, dw[k], moe_cbuf_f32(dy), ln, wq, N, C, O, prec,
                                        MOE_GRAD_SET, MOE_GRAD_ADD);
                }
                CHECK_MSG(memcmp(y[0], y[1], (size_t)(N * O) * 4) == 0 &&
                              memcmp(y16[0], y16[1], (size_t)(N * O) * 2) == 0 &&
                              memcmp(dx[0], dx[1], (size_t)(N * C) * 4) == 0 &&
                              memcmp(dw[0], dw[1], (size_t)(O * C) * 4) == 0,
                          "%s%s%s C %lld x %s: the product on the ln1 pair differs from the "
                          "bf16 one",
                          moe_recipe_name(prec), pow2 ? " pow2" : "", tiles ? " x-tiles" : "",
                          (long long)C, xb ? "bf16" : "f32");
                CHECK(y[0][0] != 0.0f && dw[0][0] != 0.0f); /* the products ran */
                for (int k = 0; k < 2; k++)
                    free(y[k]), free(dx[k]), free(dw[k]), free(y16[k]);
                gc_weight_free(wq);
                be->free(be, pair), be->free(be, ref);
                free(x), free(g), free(w), free(dy), free(x16), free(ln16), free(rs16), free(rsp);
                free(v);
            }
}

static void test_bf16(void) {
    int64_t N = 4, I = 64, O = 8;
    float *x = gc_buf(N * I, 38, -1, 1), *w = gc_buf(O * I, 39, -1, 1);
    float *y32 = gc_buf(N * O, 0, 0, 0), *y16 = gc_buf(N * O, 0, 0, 0);
    CHECK(!all_bf16(x, N * I)); /* the inputs carry low mantissa bits */
    be->matmul_forward(be, moe_buf_f32(y32), moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
                       MOE_RECIPE_FP32);
    be->matmul_forward(be, moe_buf_f32(y16), moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
                       MOE_RECIPE_BF16);
    CHECK_MSG(all_bf16(y16, N * O), "bf16 matmul output must be bf16-representable");
    double maxd = 0, maxref = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < O; o++) {
            double s = 0;
            for (int64_t k = 0; k < I; k++)
                s += (double)moe_round_bf16(x[i * I + k]) * moe_round_bf16(w[o * I + k]);
            maxref = fmax(maxref, fabs(moe_round_bf16((float)s) - y16[i * O + o]));
            maxd = fmax(maxd, fabs(y32[i * O + o] - y16[i * O + o]));
        }
    CHECK_MSG(maxd > 1e-4, "bf16 recipe gave fp32 results (max diff %g)", maxd);
    /* equals rounding the exact product of rounded operands (up to one bf16 ulp of the
     * fp32-accumulated sum landing on the other side of a rounding boundary) */
    CHECK_MSG(maxref < 4e-2, "bf16 matmul vs reference: %g", maxref);
    test_bf16_weights();
    test_bf16_activations();
    test_mxfp8_activations();
    test_mxfp8_norm_output();
    test_fp8_products();
    float a[3] = {1.00390625f, -2.5f, 3.14159f}, b[3] = {1, 1, 1}, o16[3];
    be->swiglu_forward(be, moe_buf_f32(o16), moe_cbuf_f32(a), moe_cbuf_f32(b), 3, MOE_RECIPE_BF16,
                       NULL);
    CHECK(all_bf16(o16, 3));
    /* supports */
    CHECK(be->supports(be, MOE_OP_MATMUL, NULL, MOE_RECIPE_BF16));
    CHECK(be->supports(be, MOE_OP_MATMUL, NULL, MOE_RECIPE_MXFP8)); /* emulated */
    moe_op_dims odd = {.B = 1, .T = 7, .C = 96, .H = 3, .KV = 1, .D = 32, .V = 5, .E = 3, .K = 2};
    CHECK(be->supports(be, MOE_OP_ATTENTION, &odd, MOE_RECIPE_BF16)); /* any shape (test_backend) */
    CHECK(strcmp(moe_op_name(MOE_OP_GROUPED_MATMUL), "grouped_matmul") == 0);
    CHECK(strcmp(moe_op_name(MOE_OP_COUNT), "?") == 0);
    free(x), free(w), free(y32), free(y16);
}

int main(void) {
    be = moe_backend_cpu();
    test_bf16();
    test_fp8_pairs();
    test_fp8_g_pairs();
    test_fp8_xe_pair();
    test_fp8_ln1_pair();
    test_fp8_wgrad_tiles();
    return test_summary("test_ops_lowp");
}
