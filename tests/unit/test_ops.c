/* test_ops: the CPU backend's ops one by one - finite-difference checks of every backward
 * (gradcheck.h), the GEMM fallback against cblas, sum_squares against a double reference,
 * thread-count independence, and that the bf16 recipe really rounds (AdamW and cast_bf16:
 * test_adamw.c).
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
                        1e-5f, MOE_RECIPE_FP32);
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
    be->rope_backward(be, g, NULL, s.B, s.T, s.NH, s.D, 10000.0);
    gc_check("rope dx", &s, rope_loss, s.x, g, n, 150, 1e-2, ATOL, RTOL);
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
    be->rope_backward(be, g, pos, s.B, s.T, s.NH, s.D, 10000.0);
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
    be->matmul_backward(be, gx, gw, s.r, moe_cbuf_f32(s.x), moe_cbuf_f32(s.w), s.N, s.I, s.O,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
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
    be->grouped_matmul_backward(be, moe_buf_f32(gx), gw, moe_cbuf_f32(s.r), moe_cbuf_f32(s.x),
                                moe_cbuf_f32(s.w), s.off, s.E, s.I, s.O, MOE_RECIPE_FP32,
                                MOE_GRAD_ADD, MOE_GRAD_ADD);
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
                       MOE_RECIPE_FP32);
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
                        moe_cbuf_f32(s.b), s.n);
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
    be->unpermute_forward(be, s->y, moe_cbuf_f32(s->yp), s->tw, s->slot, s->N, s->C, s->K);
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
    be->permute_backward(be, gx, s.r, s.slot, s.N, s.C, s.K, MOE_GRAD_ADD);
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
    be->add(be, moe_buf_f32(a), moe_cbuf_f32(a), b, 5);
    CHECK(a[0] == 1.5f && a[1] == 1.0f && a[4] == 6.0f);

    int64_t ns = 3 * MOE_CPU_CHUNK + 77;
    float *x = gc_buf(ns, 34, -2, 2);
    double ref = 0;
    for (int64_t i = 0; i < ns; i++)
        ref += (double)x[i] * x[i];
    omp_set_num_threads(1);
    double s1 = be->sum_squares(be, x, ns);
    omp_set_num_threads(2);
    double s2 = be->sum_squares(be, x, ns);
    CHECK_NEAR(s1, ref, 1e-9 * ref);
    CHECK(memcmp(&s1, &s2, sizeof s1) == 0);
    CHECK(be->sum_squares(be, x, 0) == 0.0);
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
    be->matmul_backward(be, NULL, W1, X, moe_cbuf_f32(Y), moe_cbuf_f32(X), S, S, S, MOE_RECIPE_FP32,
                        MOE_GRAD_ADD, MOE_GRAD_ADD);
    moe_backend_cpu_set_threads(2);
    be->matmul_forward(be, moe_buf_f32(Z2), moe_cbuf_f32(X), moe_cbuf_f32(Y), S, S, S,
                       MOE_RECIPE_FP32);
    be->matmul_backward(be, NULL, W2, X, moe_cbuf_f32(Y), moe_cbuf_f32(X), S, S, S, MOE_RECIPE_FP32,
                        MOE_GRAD_ADD, MOE_GRAD_ADD);
    CHECK_MSG(memcmp(Z1, Z2, (size_t)(S * S) * sizeof(float)) == 0,
              "matmul bits depend on threads");
    CHECK_MSG(memcmp(W1, W2, (size_t)(S * S) * sizeof(float)) == 0, "dW bits depend on threads");
    free(W1), free(W2);
    free(X), free(Y), free(Z1), free(Z2);
}

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
        be->matmul_backward(be, r[k][1], r[k][2], dy, moe_cbuf_f32(x), wk[k], N, I, O,
                            MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
        be->grouped_matmul_forward(be, moe_buf_f32(r[k][3]), moe_cbuf_f32(x), wk[k], off, E, I, O,
                                   MOE_RECIPE_BF16);
        be->grouped_matmul_backward(be, moe_buf_f32(r[k][4]), r[k][5], moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wk[k], off, E, I, O, MOE_RECIPE_BF16,
                                    MOE_GRAD_ADD, MOE_GRAD_ADD);
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
                           MOE_RECIPE_BF16);
        be->grouped_matmul_forward(be, moe_buf_of(yp, dt), moe_cbuf_of(g, dt), moe_cbuf_f32(w2),
                                   off, E, F, C, MOE_RECIPE_BF16);
        be->unpermute_forward(be, r[k][0], moe_cbuf_of(yp, dt), tw, slot, N, C, K);
        be->unpermute_backward(be, moe_buf_of(dyp, dt), r[k][2], dy, moe_cbuf_of(yp, dt), tw, slot,
                               N, C, K, MOE_GRAD_ADD);
        be->grouped_matmul_backward(be, moe_buf_f32(dg), r[k][4], moe_cbuf_of(dyp, dt),
                                    moe_cbuf_of(g, dt), moe_cbuf_f32(w2), off, E, F, C,
                                    MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
        be->swiglu_backward(be, moe_buf_of(dh, dt), moe_buf_of(dh3, dt), moe_cbuf_f32(dg),
                            moe_cbuf_of(h, dt), moe_cbuf_of(h, dt), NK * F);
        be->grouped_matmul_backward(be, moe_buf_f32(r[k][1]), r[k][3], moe_cbuf_of(dh, dt),
                                    moe_cbuf_of(xp, dt), moe_cbuf_f32(w1), off, E, C, F,
                                    MOE_RECIPE_BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
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
    be->swiglu_forward(be, gb, moe_cbuf_from(h1b), moe_cbuf_from(h3b), NK * F, MOE_RECIPE_BF16);
    be->swiglu_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), moe_cbuf_f32(h1v), moe_cbuf_f32(h3v),
                       NK * F, MOE_RECIPE_BF16);
    CHECK_MSG(mx_is(g, g + NK * F, r16, NK * F), "swiglu forward into MXFP8");
    /* the weight gradients read MXFP8 operands as their values */
    float *dw[2] = {gc_buf(E * F * C, 0, 0, 0), gc_buf(E * F * C, 0, 0, 0)};
    float *dx[2] = {gc_buf(NK * C, 0, 0, 0), gc_buf(NK * C, 0, 0, 0)};
    float *gv = mx_values(g, NK * F);
    be->grouped_matmul_backward(be, moe_buf_f32(dx[0]), dw[0], moe_cbuf_from(gb),
                                moe_cbuf_from(xpb), moe_cbuf_f32(w1), off, E, C, F, mx,
                                MOE_GRAD_SET, MOE_GRAD_SET);
    be->grouped_matmul_backward(be, moe_buf_f32(dx[1]), dw[1], moe_cbuf_f32(gv), moe_cbuf_f32(xv),
                                moe_cbuf_f32(w1), off, E, C, F, mx, MOE_GRAD_SET, MOE_GRAD_SET);
    CHECK(memcmp(dw[0], dw[1], (size_t)(E * F * C) * 4) == 0);
    CHECK(memcmp(dx[0], dx[1], (size_t)(NK * C) * 4) == 0);
    /* swiglu backward in place over its MXFP8 inputs */
    be->swiglu_backward(be, moe_buf_of(r16, MOE_DTYPE_BF16), moe_buf_of(r16b, MOE_DTYPE_BF16),
                        moe_cbuf_f32(dg), moe_cbuf_f32(h1v), moe_cbuf_f32(h3v), NK * F);
    be->swiglu_backward(be, h1b, h3b, moe_cbuf_f32(dg), moe_cbuf_from(h1b), moe_cbuf_from(h3b),
                        NK * F);
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
    be->rmsnorm_forward(be, lnb, rstd, moe_cbuf_f32(x), w, N, C, 1e-5f, MOE_RECIPE_BF16);
    be->rmsnorm_forward(be, moe_buf_of(r16, MOE_DTYPE_BF16), rstd, moe_cbuf_f32(x), w, N, C, 1e-5f,
                        MOE_RECIPE_BF16);
    CHECK_MSG(mx_is(ln, ln + N * C, r16, N * C), "rmsnorm into MXFP8");
    float *lv = mx_values(ln, N * C);
    float *y[2], *dx[2], *dw[2];
    for (int k = 0; k < 2; k++) {
        moe_cbuf xin = k ? moe_cbuf_f32(lv) : moe_cbuf_from(lnb);
        y[k] = gc_buf(N * O, 0, 0, 0), dx[k] = gc_buf(N * C, 0, 0, 0),
        dw[k] = gc_buf(O * C, 0, 0, 0);
        be->matmul_forward(be, moe_buf_f32(y[k]), xin, moe_cbuf_f32(wq), N, C, O, mx);
        be->matmul_backward(be, dx[k], dw[k], dy, xin, moe_cbuf_f32(wq), N, C, O, mx, MOE_GRAD_SET,
                            MOE_GRAD_SET);
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
    be->matmul_backward(be, dx32, dw32, dy, moe_cbuf_f32(x), moe_cbuf_f32(w), N, I, O,
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
        be->matmul_backward(be, dx, dw, dy, moe_cbuf_f32(x), w1, N, I, O, rs[r], MOE_GRAD_ADD,
                            MOE_GRAD_ADD);
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
        be->grouped_matmul_backward(be, moe_buf_f32(gdx), gdw, moe_cbuf_f32(dy), moe_cbuf_f32(x),
                                    wE, off, E, I, O, rs[r], MOE_GRAD_ADD, MOE_GRAD_ADD);
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
    be->swiglu_forward(be, moe_buf_f32(o16), moe_cbuf_f32(a), moe_cbuf_f32(b), 3, MOE_RECIPE_BF16);
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
    test_bf16();
    return test_summary("test_ops");
}
