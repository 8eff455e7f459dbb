/* test_ops: the CPU backend's ops one by one - finite-difference checks of every backward
 * (gradcheck.h), the GEMM fallback against cblas, sum_squares against a double reference
 * and thread-count independence. That the bf16 recipe really rounds, and the bf16, mxfp8 and
 * fp8-block products and activations, are test_ops_lowp.c (AdamW and cast_bf16: test_adamw.c).
 *
 * Every gradient case uses loss = sum(out * R) with a fixed random R (dL/dout = R), inputs
 * of magnitude ~1 and h = 1e-2 or 1e-3: fp32 rounding noise in the quotient is then
 * ~1e-7 * sum|out*R| / h <= 1e-4 and truncation ~h^2 <= 1e-4, so atol 2e-3 + rtol 1e-2 is
 * ample while a wrong formula (errors O(1)) fails. Attention, router/permute/expert and
 * whole-model checks have their own files. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "ops/cpu/cpu_ops.h"
#include "testlib.h"

#define ATOL 2e-3
#define RTOL 1e-2

static const moe_backend *be;

/* ---------------- embedding ---------------- */
typedef struct {
    float *wte, *out, *r;
    int32_t *tok;
    int64_t N, C, V;
} emb_st;
static double emb_loss(void *p) {
    emb_st *s = p;
    be->embedding_forward(be, moe_buf_f32(s->out), s->tok, s->wte, s->N, s->C);
    return gc_dot(s->out, s->r, s->N * s->C);
}
static void test_embedding(void) {
    emb_st s = {.N = 9, .C = 70, .V = 7};
    int32_t tok[9] = {3, 1, 3, 0, 6, 3, 2, 1, 5};
    s.tok = tok;
    s.wte = gc_buf(s.V * s.C, 1, -1, 1);
    s.out = gc_buf(s.N * s.C, 0, 0, 0);
    s.r = gc_buf(s.N * s.C, 2, -1, 1);
    float *g = gc_buf(s.V * s.C, 0, 0, 0);
    be->embedding_backward(be, g, s.r, tok, s.N, s.C, s.V);
    gc_check("embedding dwte", &s, emb_loss, s.wte, g, s.V * s.C, 200, 1e-2, ATOL, RTOL);
    free(s.wte), free(s.out), free(s.r), free(g);
}

/* ---------------- rmsnorm ---------------- */
typedef struct {
    float *x, *w, *out, *rstd, *r;
    int64_t N, C;
} rms_st;
static double rms_loss(void *p) {
    rms_st *s = p;
    be->rmsnorm_forward(be, moe_buf_f32(s->out), s->rstd, moe_cbuf_f32(s->x), s->w, s->N, s->C,
                        1e-5f, MOE_RECIPE_FP32, NULL);
    return gc_dot(s->out, s->r, s->N * s->C);
}
static void test_rmsnorm(void) {
    rms_st s = {.N = 4, .C = 70};
    s.x = gc_buf(s.N * s.C, 3, -1, 1);
    s.w = gc_buf(s.C, 4, 0.5, 1.5);
    s.out = gc_buf(s.N * s.C, 0, 0, 0);
    s.rstd = gc_buf(s.N, 0, 0, 0);
    s.r = gc_buf(s.N * s.C, 5, -1, 1);
    float *gx = gc_buf(s.N * s.C, 0, 0, 0), *gw = gc_buf(s.C, 0, 0, 0);
    rms_loss(&s);
    /* the forward itself: out = x / sqrt(mean(x^2) + eps) * w */
    double ss = 0;
    for (int c = 0; c < s.C; c++)
        ss += (double)s.x[c] * s.x[c];
    CHECK_NEAR(s.out[5], s.x[5] / sqrt(ss / s.C + 1e-5) * s.w[5], 1e-5);
    be->rmsnorm_backward(be, gx, gw, s.r, moe_cbuf_f32(s.x), s.w, s.rstd, s.N, s.C);
    gc_check("rmsnorm dx", &s, rms_loss, s.x, gx, s.N * s.C, 120, 1e-2, ATOL, RTOL);
    gc_check("rmsnorm dw", &s, rms_loss, s.w, gw, s.C, 70, 1e-2, ATOL, RTOL);
    free(s.x), free(s.w), free(s.out), free(s.rstd), free(s.r), free(gx), free(gw);
}

/* ---------------- rope ---------------- */
typedef struct {
    float *x, *tmp, *r;
    const int32_t *pos; /* [B, T] positions or NULL */
    int64_t B, T, NH, D;
} rope_st;
static double rope_loss(void *p) {
    rope_st *s = p;
    int64_t n = s->B * s->T * s->NH * s->D;
    memcpy(s->tmp, s->x, (size_t)n * sizeof(float));
    be->rope_forward(be, moe_buf_f32(s->tmp), s->pos, 0, s->B, s->T, s->NH, s->D, 10000.0);
    return gc_dot(s->tmp, s->r, n);
}
static void test_rope(void) {
    rope_st s = {.B = 2, .T = 5, .NH = 3, .D = 8};
    int64_t n = s.B * s.T * s.NH * s.D;
    s.x = gc_buf(n, 6, -1, 1);
    s.tmp = gc_buf(n, 0, 0, 0);
    s.r = gc_buf(n, 7, -1, 1);
    rope_loss(&s);
    /* HF convention: b=1, t=3, head 2, i=1: angle = 3 * 10000^(-2/8) */
    int64_t base = ((1 * s.T + 3) * s.NH + 2) * s.D;
    double ang = 3.0 * pow(10000.0, -2.0 / 8.0);
    CHECK_NEAR(s.tmp[base + 1], s.x[base + 1] * cos(ang) - s.x[base + 5] * sin(ang), 1e-5);
    CHECK_NEAR(s.tmp[base + 5], s.x[base + 5] * cos(ang) + s.x[base + 1] * sin(ang), 1e-5);
    /* position 0 is the identity */
    CHECK_NEAR(s.tmp[3], s.x[3], 0.0);
    float *g = gc_buf(n, 0, 0, 0);
    memcpy(g, s.r, (size_t)n * sizeof(float));
    be->rope_backward(be, moe_buf_f32(g), g, NULL, s.B, s.T, s.NH, s.D, 10000.0);
    gc_check("rope dx", &s, rope_loss, s.x, g, n, 150, 1e-2, ATOL, RTOL);
    /* out of place into bf16: the in-place fp32 values rounded */
    uint16_t *g16 = calloc((size_t)n, sizeof *g16);
    be->rope_backward(be, moe_buf_of(g16, MOE_DTYPE_BF16), s.r, NULL, s.B, s.T, s.NH, s.D, 10000.0);
    int rounded = 1;
    for (int64_t i = 0; i < n; i++)
        rounded &= g16[i] == moe_f32_to_bf16(g[i]);
    CHECK(rounded);
    free(g16);
    /* positions restarting inside a row (document mask): row 1 holds documents [0, 2) and
     * [2, 5), so each document is rotated as if alone (bit for bit: the same table rows) */
    const int32_t pos[10] = {0, 1, 2, 3, 4, 0, 1, 0, 1, 2};
    float *alone = gc_buf(n, 0, 0, 0);
    rope_loss(&s); /* positions t */
    memcpy(alone, s.tmp, (size_t)n * sizeof(float));
    s.pos = pos;
    rope_loss(&s);
    int64_t row = s.NH * s.D;                                            /* elements per position */
    CHECK(memcmp(s.tmp, alone, (size_t)(7 * row) * sizeof(float)) == 0); /* row 0, [5, 7) */
    CHECK(memcmp(s.tmp + 7 * row, alone, (size_t)(3 * row) * sizeof(float)) != 0);
    float *x7 = gc_buf(n, 0, 0, 0); /* [7, 10) alone: x moved to the row start */
    memcpy(x7, s.x + 7 * row, (size_t)(3 * row) * sizeof(float));
    be->rope_forward(be, moe_buf_f32(x7), NULL, 0, 1, 3, s.NH, s.D, 10000.0);
    CHECK(memcmp(x7, s.tmp + 7 * row, (size_t)(3 * row) * sizeof(float)) == 0);
    /* a row continuing cached keys at p0 = 2: row 0's positions [2, 5) rotated alone */
    float *x2 = gc_buf(n, 0, 0, 0);
    memcpy(x2, s.x + 2 * row, (size_t)(3 * row) * sizeof(float));
    be->rope_forward(be, moe_buf_f32(x2), NULL, 2, 1, 3, s.NH, s.D, 10000.0);
    CHECK(memcmp(x2, alone + 2 * row, (size_t)(3 * row) * sizeof(float)) == 0);
    memcpy(g, s.r, (size_t)n * sizeof(float));
    be->rope_backward(be, moe_buf_f32(g), g, pos, s.B, s.T, s.NH, s.D, 10000.0);
    gc_check("rope dx (positions)", &s, rope_loss, s.x, g, n, 150, 1e-2, ATOL, RTOL);
    free(s.x), free(s.tmp), free(s.r), free(g), free(alone), free(x7), free(x2);
}

/* ---------------- matmul ---------------- */
typedef struct {
    float *x, *w, *y, *r;
    int64_t N, I, O;
} mm_st;
static double mm_loss(void *p) {
    mm_st *s = p;
    be->matmul_forward(be, moe_buf_f32(s->y), moe_cbuf_f32(s->x), moe_cbuf_f32(s->w), s->N, s->I,
                       s->O, MOE_RECIPE_FP32);
    return gc_dot(s->y, s->r, s->N * s->O);
}
static void test_matmul(void) {
    mm_st s = {.N = 5, .I = 7, .O = 6};
    s.x = gc_buf(s.N * s.I, 8, -1, 1);
    s.w = gc_buf(s.O * s.I, 9, -1, 1);
    s.y = gc_buf(s.N * s.O, 0, 0, 0);
    s.r = gc_buf(s.N * s.O, 10, -1, 1);
    mm_loss(&s);
    double ref = 0;
    for (int i = 0; i < s.I; i++)
        ref += (double)s.x[2 * s.I + i] * s.w[4 * s.I + i];
    CHECK_NEAR(s.y[2 * s.O + 4], ref, 1e-5); /* y = x W^T with W [out, in] */
    float *gx = gc_buf(s.N * s.I, 0, 0, 0), *gw = gc_buf(s.O * s.I, 0, 0, 0);
    gx[0] = 1.0f; /* backward accumulates: the 1 must survive */
    be->matmul_backward(be, gx, gw, moe_cbuf_f32(s.r), moe_cbuf_f32(s.x), moe_cbuf_f32(s.w), s.N,
                        s.I, s.O, MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    gx[0] -= 1.0f;
    gc_check("matmul dx", &s, mm_loss, s.x, gx, s.N * s.I, 100, 1e-2, ATOL, RTOL);
    gc_check("matmul dw", &s, mm_loss, s.w, gw, s.O * s.I, 100, 1e-2, ATOL, RTOL);
    free(s.x), free(s.w), free(s.y), free(s.r), free(gx), free(gw);
}

/* ---------------- grouped matmul (expert 1 and 4 receive no rows) ---------------- */
typedef struct {
    float *x, *w, *y, *r;
    int32_t off[6];
    int64_t E, I, O;
} gm_st;
static double gm_loss(void *p) {
    gm_st *s = p;
    be->grouped_matmul_forward(be, moe_buf_f32(s->y), moe_cbuf_f32(s->x), moe_cbuf_f32(s->w),
                               s->off, s->E, s->I, s->O, MOE_RECIPE_FP32);
    return gc_dot(s->y, s->r, s->off[s->E] * s->O);
}
static void test_grouped_matmul(void) {
    gm_st s = {.off = {0, 3, 3, 7, 9, 9}, .E = 5, .I = 5, .O = 6};
    int64_t M = s.off[s.E];
    s.x = gc_buf(M * s.I, 11, -1, 1);
    s.w = gc_buf(s.E * s.O * s.I, 12, -1, 1);
    s.y = gc_buf(M * s.O, 0, 0, 0);
    s.r = gc_buf(M * s.O, 13, -1, 1);
    gm_loss(&s);
    /* row 5 belongs to expert 2 */
    double ref = 0;
    for (int i = 0; i < s.I; i++)
        ref += (double)s.x[5 * s.I + i] * s.w[(2 * s.O + 1) * s.I + i];
    CHECK_NEAR(s.y[5 * s.O + 1], ref, 1e-5);
    float *gx = gc_buf(M * s.I, 0, 0, 0), *gw = gc_buf(s.E * s.O * s.I, 0, 0, 0);
    be->grouped_matmul_backward(be, moe_buf_f32(gx), moe_buf_f32(gw), moe_cbuf_f32(s.r),
                                moe_cbuf_f32(s.x), moe_cbuf_f32(s.w), s.off, s.E, s.I, s.O,
                                MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    gc_check("grouped dx", &s, gm_loss, s.x, gx, M * s.I, 100, 1e-2, ATOL, RTOL);
    gc_check("grouped dw", &s, gm_loss, s.w, gw, s.E * s.O * s.I, 150, 1e-2, ATOL, RTOL);
    int zero = 1;
    for (int64_t i = 0; i < s.O * s.I; i++)
        zero &= gw[1 * s.O * s.I + i] == 0.0f && gw[4 * s.O * s.I + i] == 0.0f;
    CHECK_MSG(zero, "experts without tokens must get zero weight gradient");
    free(s.x), free(s.w), free(s.y), free(s.r), free(gx), free(gw);
}

/* ---------------- swiglu ---------------- */
typedef struct {
    float *a, *b, *out, *r;
    int64_t n;
} sw_st;
static double sw_loss(void *p) {
    sw_st *s = p;
    be->swiglu_forward(be, moe_buf_f32(s->out), moe_cbuf_f32(s->a), moe_cbuf_f32(s->b), s->n,
                       MOE_RECIPE_FP32, NULL);
    return gc_dot(s->out, s->r, s->n);
}
static void test_swiglu(void) {
    sw_st s = {.n = 40};
    s.a = gc_buf(s.n, 14, -3, 3);
    s.b = gc_buf(s.n, 15, -2, 2);
    s.out = gc_buf(s.n, 0, 0, 0);
    s.r = gc_buf(s.n, 16, -1, 1);
    sw_loss(&s);
    CHECK_NEAR(s.out[3], s.a[3] / (1.0 + exp(-s.a[3])) * s.b[3], 1e-6);
    float *ga = gc_buf(s.n, 0, 0, 0), *gb = gc_buf(s.n, 0, 0, 0);
    be->swiglu_backward(be, moe_buf_f32(ga), moe_buf_f32(gb), moe_cbuf_f32(s.r), moe_cbuf_f32(s.a),
                        moe_cbuf_f32(s.b), s.n, NULL);
    gc_check("swiglu da", &s, sw_loss, s.a, ga, s.n, 40, 1e-3, ATOL, RTOL);
    gc_check("swiglu db", &s, sw_loss, s.b, gb, s.n, 40, 1e-3, ATOL, RTOL);
    free(s.a), free(s.b), free(s.out), free(s.r), free(ga), free(gb);
}

/* ---------------- cross-entropy ---------------- */
typedef struct {
    float *z, *loss, *lse, *w;
    int32_t *t;
    int64_t N, V;
} ce_st;
static double ce_loss(void *p) {
    ce_st *s = p;
    be->cross_entropy_forward(be, s->loss, s->lse, s->z, s->t, s->w, s->N, s->V);
    double sum = 0;
    for (int64_t n = 0; n < s->N; n++)
        sum += s->loss[n];
    return 0.7 * sum;
}
static void test_cross_entropy(void) {
    ce_st s = {.N = 6, .V = 9};
    int32_t t[6] = {2, -1, 8, 0, 4, -1};
    s.t = t;
    s.z = gc_buf(s.N * s.V, 17, -2, 2);
    s.loss = gc_buf(s.N, 0, 0, 0);
    s.lse = gc_buf(s.N, 0, 0, 0);
    s.w = gc_buf(s.N, 18, 0.2, 1.0);
    ce_loss(&s);
    double mx = -1e30, se = 0;
    for (int v = 0; v < s.V; v++)
        mx = fmax(mx, s.z[2 * s.V + v]);
    for (int v = 0; v < s.V; v++)
        se += exp(s.z[2 * s.V + v] - mx);
    CHECK_NEAR(s.loss[2], s.w[2] * (mx + log(se) - s.z[2 * s.V + 8]), 1e-5);
    CHECK(s.loss[1] == 0.0f && s.loss[5] == 0.0f);
    float *g = gc_buf(s.N * s.V, 19, -1, 1); /* garbage: backward writes, not accumulates */
    be->cross_entropy_backward(be, g, s.z, s.lse, s.t, s.w, 0.7f, s.N, s.V);
    gc_check("cross_entropy dlogits", &s, ce_loss, s.z, g, s.N * s.V, 54, 1e-2, ATOL, RTOL);
    /* in place (dlogits aliasing logits) gives the same bits */
    float *z2 = gc_buf(s.N * s.V, 0, 0, 0);
    memcpy(z2, s.z, (size_t)(s.N * s.V) * sizeof(float));
    be->cross_entropy_backward(be, z2, z2, s.lse, s.t, s.w, 0.7f, s.N, s.V);
    CHECK(memcmp(z2, g, (size_t)(s.N * s.V) * sizeof(float)) == 0);
    /* NULL weights = 1 */
    be->cross_entropy_forward(be, s.loss, s.lse, s.z, s.t, NULL, s.N, s.V);
    CHECK_NEAR(s.loss[2], mx + log(se) - s.z[2 * s.V + 8], 1e-5);
    free(s.z), free(s.loss), free(s.lse), free(s.w), free(g), free(z2);
}

/* ---------------- router ---------------- */
typedef struct {
    float *z, *p, *lse, *tw, *st, *r, *dprob;
    int32_t *idx, *cnt;
    float dz;
    int64_t N, E, K;
} rt_st;
static double rt_loss(void *p) {
    rt_st *s = p;
    be->router_forward(be, s->p, s->lse, s->idx, s->tw, s->cnt, s->st, s->z, s->N, s->E, s->K);
    double L = gc_dot(s->tw, s->r, s->N * s->K);
    for (int64_t n = 0; n < s->N; n++) {
        for (int64_t e = 0; e < s->E; e++)
            L += (double)s->dprob[e] * s->p[n * s->E + e];
        L += (double)s->dz * s->lse[n] * s->lse[n];
    }
    return L;
}
static void test_router(void) {
    rt_st s = {.N = 7, .E = 5, .K = 2, .dz = 0.3f};
    s.z = gc_buf(s.N * s.E, 0, 0, 0);
    uint64_t seed = 20;
    for (int64_t n = 0; n < s.N; n++) /* well-separated logits: top-k stable under +-h */
        for (int64_t e = 0; e < s.E; e++)
            s.z[n * s.E + e] = (float)(0.5 * ((e * 3 + n) % s.E) + gc_uniform(&seed, -0.1, 0.1));
    s.p = gc_buf(s.N * s.E, 0, 0, 0);
    s.lse = gc_buf(s.N, 0, 0, 0);
    s.tw = gc_buf(s.N * s.K, 0, 0, 0);
    s.st = gc_buf(s.E + 2, 0, 0, 0);
    s.r = gc_buf(s.N * s.K, 21, -1, 1);
    s.dprob = gc_buf(s.E, 22, -1, 1);
    s.idx = calloc((size_t)(s.N * s.K), sizeof(int32_t));
    s.cnt = calloc((size_t)s.E, sizeof(int32_t));
    rt_loss(&s);
    /* forward semantics */
    for (int64_t n = 0; n < s.N; n++) {
        const float *p = s.p + n * s.E;
        int32_t best = 0;
        for (int e = 1; e < s.E; e++)
            best = p[e] > p[best] ? e : best;
        CHECK_INT_EQ(s.idx[n * s.K], best);
        CHECK(p[s.idx[n * s.K + 1]] <= p[s.idx[n * s.K]]);
        CHECK_NEAR(s.tw[n * s.K] + s.tw[n * s.K + 1], 1.0, 1e-6);
        CHECK_NEAR(s.tw[n * s.K] / s.tw[n * s.K + 1], p[s.idx[n * s.K]] / p[s.idx[n * s.K + 1]],
                   1e-5);
    }
    int64_t tot = 0;
    for (int e = 0; e < s.E; e++)
        tot += s.cnt[e];
    CHECK_INT_EQ(tot, s.N * s.K);
    double psum = 0, z2 = 0;
    for (int64_t n = 0; n < s.N; n++)
        psum += s.p[n * s.E + 3], z2 += (double)s.lse[n] * s.lse[n];
    CHECK_NEAR(s.st[3], psum, 1e-5);
    CHECK_NEAR(s.st[s.E], z2, 1e-4);
    float *g = gc_buf(s.N * s.E, 0, 0, 0);
    be->router_backward(be, g, s.r, s.dprob, s.dz, s.p, s.lse, s.idx, s.tw, s.N, s.E, s.K);
    gc_check("router dlogits", &s, rt_loss, s.z, g, s.N * s.E, 35, 1e-3, ATOL, RTOL);
    /* ties go to the lower index */
    float zt[4] = {1.0f, 2.0f, 2.0f, 0.0f}, pt[4], lt[1], twt[2], stt[6];
    int32_t it[2], ct[4];
    be->router_forward(be, pt, lt, it, twt, ct, stt, zt, 1, 4, 2);
    CHECK(it[0] == 1 && it[1] == 2);
    free(s.z), free(s.p), free(s.lse), free(s.tw), free(s.st), free(s.r), free(s.dprob);
    free(s.idx), free(s.cnt), free(g);
}

/* ---------------- permute / unpermute ---------------- */
typedef struct {
    float *x, *xp, *r, *yp, *tw, *y, *ry;
    int32_t *idx, *src, *slot, *off;
    int64_t N, C, E, K;
} pm_st;
static double pm_loss(void *p) {
    pm_st *s = p;
    be->permute_forward(be, moe_buf_f32(s->xp), s->src, s->slot, s->off, moe_cbuf_f32(s->x), s->idx,
                        s->N, s->C, s->E, s->K);
    return gc_dot(s->xp, s->r, s->N * s->K * s->C);
}
static double up_loss(void *p) {
    pm_st *s = p;
    be->unpermute_forward(be, moe_buf_f32(s->y), moe_cbuf_f32(NULL), moe_cbuf_f32(s->yp), s->tw,
                          s->slot, s->N, s->C, s->K);
    return gc_dot(s->y, s->ry, s->N * s->C);
}
static void test_permute(void) {
    pm_st s = {.N = 5, .C = 6, .E = 4, .K = 2};
    int32_t idx[10] = {2, 0, 0, 2, 3, 2, 0, 3, 2, 0}; /* expert 1 receives nothing */
    s.idx = idx;
    int64_t NK = s.N * s.K;
    s.x = gc_buf(s.N * s.C, 23, -1, 1);
    s.xp = gc_buf(NK * s.C, 0, 0, 0);
    s.r = gc_buf(NK * s.C, 24, -1, 1);
    s.src = calloc((size_t)NK, sizeof(int32_t));
    s.slot = calloc((size_t)NK, sizeof(int32_t));
    s.off = calloc((size_t)(s.E + 1), sizeof(int32_t));
    pm_loss(&s);
    int32_t want_off[5] = {0, 4, 4, 8, 10};
    for (int e = 0; e <= s.E; e++)
        CHECK_INT_EQ(s.off[e], want_off[e]);
    int32_t want_src[10] = {1, 2, 6, 9, 0, 3, 5, 8, 4, 7}; /* stable (n, k) order per expert */
    for (int r = 0; r < NK; r++) {
        CHECK_INT_EQ(s.src[r], want_src[r]);
        CHECK_INT_EQ(s.slot[s.src[r]], r);
        CHECK(memcmp(s.xp + r * s.C, s.x + (s.src[r] / s.K) * s.C, (size_t)s.C * sizeof(float)) ==
              0);
    }
    float *gx = gc_buf(s.N * s.C, 0, 0, 0);
    be->permute_backward(be, gx, moe_cbuf_f32(s.r), s.slot, s.N, s.C, s.K, MOE_GRAD_ADD);
    gc_check("permute dx", &s, pm_loss, s.x, gx, s.N * s.C, 30, 1e-2, ATOL, RTOL);
    /* unpermute */
    s.yp = gc_buf(NK * s.C, 25, -1, 1);
    s.tw = gc_buf(NK, 26, 0.1, 0.9);
    s.y = gc_buf(s.N * s.C, 0, 0, 0);
    s.ry = gc_buf(s.N * s.C, 27, -1, 1);
    up_loss(&s);
    CHECK_NEAR(s.y[3 * s.C + 2],
               s.tw[6] * s.yp[s.slot[6] * s.C + 2] + s.tw[7] * s.yp[s.slot[7] * s.C + 2], 1e-6);
    float *gyp = gc_buf(NK * s.C, 0, 0, 0), *gtw = gc_buf(NK, 0, 0, 0);
    be->unpermute_backward(be, moe_buf_f32(gyp), gtw, s.ry, moe_cbuf_f32(s.yp), s.tw, s.slot, s.N,
                           s.C, s.K, MOE_GRAD_ADD);
    gc_check("unpermute dyp", &s, up_loss, s.yp, gyp, NK * s.C, 60, 1e-2, ATOL, RTOL);
    gc_check("unpermute dw", &s, up_loss, s.tw, gtw, NK, 10, 1e-2, ATOL, RTOL);
    /* with the residual: res + y, the same fp32 sum as the add after it, bf16 out rounded */
    up_loss(&s);
    float *res = gc_buf(s.N * s.C, 28, -4, 4), *yr = gc_buf(s.N * s.C, 0, 0, 0);
    uint16_t *y16 = calloc((size_t)(s.N * s.C), sizeof *y16);
    be->unpermute_forward(be, moe_buf_f32(yr), moe_cbuf_f32(res), moe_cbuf_f32(s.yp), s.tw, s.slot,
                          s.N, s.C, s.K);
    be->unpermute_forward(be, moe_buf_of(y16, MOE_DTYPE_BF16), moe_cbuf_f32(res),
                          moe_cbuf_f32(s.yp), s.tw, s.slot, s.N, s.C, s.K);
    int same = 1;
    for (int64_t i = 0; i < s.N * s.C; i++)
        same &= yr[i] == res[i] + s.y[i] && y16[i] == moe_f32_to_bf16(yr[i]);
    CHECK(same);
    free(res), free(yr), free(y16);
    free(s.x), free(s.xp), free(s.r), free(s.src), free(s.slot), free(s.off), free(gx);
    free(s.yp), free(s.tw), free(s.y), free(s.ry), free(gyp), free(gtw);
}

/* ---------------- attention (small; the thorough checks are in test_attention) ---------- */
typedef struct {
    float *q, *k, *v, *o, *lse, *r;
    const int32_t *ds; /* [B, T] document starts or NULL */
    int64_t B, T, H, KV, D;
} at_st;
static double at_loss(void *p) {
    at_st *s = p;
    be->attention_forward(be, moe_buf_f32(s->o), s->lse, moe_cbuf_f32(s->q), moe_cbuf_f32(s->k),
                          moe_cbuf_f32(s->v), s->ds, s->B, s->T, s->T, s->H, s->KV, s->D,
                          MOE_RECIPE_FP32);
    return gc_dot(s->o, s->r, s->B * s->T * s->H * s->D);
}
/* ds: document starts [1, 5] or NULL (plain causal) */
static void test_attention_grad(const int32_t *ds) {
    at_st s = {.B = 1, .T = 5, .H = 4, .KV = 2, .D = 4, .ds = ds};
    int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    s.q = gc_buf(nq, 28, -1, 1), s.k = gc_buf(nk, 29, -1, 1), s.v = gc_buf(nk, 30, -1, 1);
    s.o = gc_buf(nq, 0, 0, 0), s.lse = gc_buf(s.B * s.H * s.T, 0, 0, 0),
    s.r = gc_buf(nq, 31, -1, 1);
    at_loss(&s);
    float *gq = gc_buf(nq, 0, 0, 0), *gk = gc_buf(nk, 0, 0, 0), *gv = gc_buf(nk, 0, 0, 0);
    be->attention_backward(be, gq, gk, gv, s.r, moe_cbuf_f32(s.q), moe_cbuf_f32(s.k),
                           moe_cbuf_f32(s.v), moe_cbuf_f32(s.o), s.lse, ds, s.B, s.T, s.H, s.KV,
                           s.D, MOE_RECIPE_FP32, MOE_GRAD_ADD);
    gc_check("attention dq", &s, at_loss, s.q, gq, nq, 60, 1e-2, ATOL, RTOL);
    gc_check("attention dk", &s, at_loss, s.k, gk, nk, 40, 1e-2, ATOL, RTOL);
    gc_check("attention dv", &s, at_loss, s.v, gv, nk, 40, 1e-2, ATOL, RTOL);
    free(s.q), free(s.k), free(s.v), free(s.o), free(s.lse), free(s.r), free(gq), free(gk),
        free(gv);
}

/* ---------------- add, sum_squares ---------------- */
static void test_add_sumsq(void) {
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {0.5f, -1, 2, 0, 1};
    be->add(be, moe_buf_f32(a), moe_cbuf_f32(a), moe_cbuf_f32(b), 5);
    CHECK(a[0] == 1.5f && a[1] == 1.0f && a[4] == 6.0f);

    int64_t ns = 3 * MOE_CPU_CHUNK + 77;
    float *x = gc_buf(ns, 34, -2, 2);
    double ref = 0;
    for (int64_t i = 0; i < ns; i++)
        ref += (double)x[i] * x[i];
    omp_set_num_threads(1);
    double s1 = be->sum_squares(be, moe_cbuf_f32(x), ns);
    omp_set_num_threads(2);
    double s2 = be->sum_squares(be, moe_cbuf_f32(x), ns);
    CHECK_NEAR(s1, ref, 1e-9 * ref);
    CHECK(memcmp(&s1, &s2, sizeof s1) == 0);
    CHECK(be->sum_squares(be, moe_cbuf_f32(x), 0) == 0.0);
    free(x);
}

/* ---------------- gemm fallback vs cblas, all transpose combinations ---------------- */
static void test_gemm_ref(void) {
    int64_t M = 37, N = 70, K = 45;
    float *A = gc_buf(M * K, 35, -1, 1), *B = gc_buf(K * N, 36, -1, 1);
    float *C1 = gc_buf(M * N, 37, -1, 1), *C2 = gc_buf(M * N, 0, 0, 0);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gc_fill(C1, M * N, 37, -1, 1);
            memcpy(C2, C1, (size_t)(M * N) * sizeof(float));
            moe_cpu_gemm(ta, tb, M, N, K, 0.5f, A, B, 1.0f, C1);
            /* naive double reference */
            double maxerr = 0;
            float *C0 = gc_buf(M * N, 0, 0, 0);
            memcpy(C0, C2, (size_t)(M * N) * sizeof(float));
            moe_cpu_gemm_ref(ta, tb, M, N, K, 0.5f, A, B, 1.0f, C2);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++)
                        s += (double)(ta ? A[k * M + i] : A[i * K + k]) *
                             (tb ? B[j * K + k] : B[k * N + j]);
                    double want = 0.5 * s + C0[i * N + j];
                    maxerr = fmax(maxerr, fabs(want - C1[i * N + j]));
                    maxerr = fmax(maxerr, fabs(want - C2[i * N + j]));
                }
            CHECK_MSG(maxerr < 1e-4, "gemm ta=%d tb=%d: max error %g", ta, tb, maxerr);
            free(C0);
        }
    free(A), free(B), free(C1), free(C2);
    /* large enough for OpenBLAS to use its thread pool: bits must not depend on threads */
    int64_t S = 384;
    float *X = gc_buf(S * S, 40, -1, 1), *Y = gc_buf(S * S, 41, -1, 1);
    float *Z1 = gc_buf(S * S, 0, 0, 0), *Z2 = gc_buf(S * S, 0, 0, 0);
    float *W1 = gc_buf(S * S, 0, 0, 0), *W2 = gc_buf(S * S, 0, 0, 0);
    moe_backend_cpu_set_threads(1);
    be->matmul_forward(be, moe_buf_f32(Z1), moe_cbuf_f32(X), moe_cbuf_f32(Y), S, S, S,
                       MOE_RECIPE_FP32);
    be->matmul_backward(be, NULL, W1, moe_cbuf_f32(X), moe_cbuf_f32(Y), moe_cbuf_f32(X), S, S, S,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    moe_backend_cpu_set_threads(2);
    be->matmul_forward(be, moe_buf_f32(Z2), moe_cbuf_f32(X), moe_cbuf_f32(Y), S, S, S,
                       MOE_RECIPE_FP32);
    be->matmul_backward(be, NULL, W2, moe_cbuf_f32(X), moe_cbuf_f32(Y), moe_cbuf_f32(X), S, S, S,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    CHECK_MSG(memcmp(Z1, Z2, (size_t)(S * S) * sizeof(float)) == 0,
              "matmul bits depend on threads");
    CHECK_MSG(memcmp(W1, W2, (size_t)(S * S) * sizeof(float)) == 0, "dW bits depend on threads");
    free(W1), free(W2);
    free(X), free(Y), free(Z1), free(Z2);
}

/* ---------------- the branch-free exp used by attention, softmax CE and swiglu -------- */
static void test_expf(void) {
    double maxrel = 0;
    for (double x = -87.0; x <= 88.0; x += 0.00731) {
        float xf = (float)x;
        double want = exp((double)xf), got = moe_cpu_expf(xf);
        maxrel = fmax(maxrel, fabs(got - want) / want);
    }
    CHECK_MSG(maxrel < 2.5e-7, "moe_cpu_expf max relative error %g (> ~2 ulp)", maxrel);
    CHECK(moe_cpu_expf(0.0f) == 1.0f);
    CHECK(moe_cpu_expf(-INFINITY) == 0.0f);
    CHECK(moe_cpu_expf(-100.0f) == 0.0f);
    CHECK(isnan(moe_cpu_expf(NAN)));
}

/* pool: x[b, t, c] = 10 b + t + c / 2 gives exact means and maxima to check against */
static void test_pool(void) {
    enum { B = 3, T = 5, C = 4 };
    float x[B * T * C], out[B * C];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                x[(b * T + t) * C + c] = (float)(10 * b + t) + 0.5f * (float)c;
    const int32_t range[2 * B] = {1, 2, 4, 1, 0, 5}; /* [1, 3), [4, 5), [0, 5) */
    be->pool_forward(be, out, x, range, B, T, C, 0);
    for (int c = 0; c < C; c++) {
        CHECK_NEAR(out[0 * C + c], 1.5 + 0.5 * c, 0.0);
        CHECK_NEAR(out[1 * C + c], 14.0 + 0.5 * c, 0.0);
        CHECK_NEAR(out[2 * C + c], 22.0 + 0.5 * c, 0.0);
    }
    be->pool_forward(be, out, x, range, B, T, C, 1);
    for (int c = 0; c < C; c++) {
        CHECK_NEAR(out[0 * C + c], 2.0 + 0.5 * c, 0.0);
        CHECK_NEAR(out[1 * C + c], 14.0 + 0.5 * c, 0.0);
        CHECK_NEAR(out[2 * C + c], 24.0 + 0.5 * c, 0.0);
    }
}

int main(void) {
    be = moe_backend_cpu();
    test_pool();
    test_expf();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_matmul();
    test_grouped_matmul();
    test_swiglu();
    test_cross_entropy();
    test_router();
    test_permute();
    test_attention_grad(NULL);
    const int32_t docs[5] = {0, 0, 2, 3, 3}; /* documents [0, 2), [2, 3), [3, 5) */
    test_attention_grad(docs);
    test_add_sumsq();
    test_gemm_ref();
    return test_summary("test_ops");
}
