/* test_grad_store: the backward ops' moe_grad_store on the CPU reference - MOE_GRAD_SET
 * into garbage gives the bytes MOE_GRAD_ADD into zeros gives (matmul, grouped matmul with an
 * expert without rows, a product without rows, permute, unpermute with fp32 and bf16 dyp,
 * attention with GQA and a document mask; fp32, bf16 and fp8-block recipes), and the ops the
 * model runs in place (unpermute's dyp over yp, SwiGLU's da/db over a/b) give the bytes of
 * separate outputs; and bf16 expert weight gradients (test_bf16_grads). */
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/config.h"
#include "moe/ops.h"
#include "testlib.h"

static const moe_backend *be;

static int same(const void *a, const void *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

static void test_grad_store(void) {
    int64_t N = 40, I = 160, O = 136, E = 3, C = 24, K = 2;
    const int32_t off[4] = {0, 25, 25, 40}; /* expert 1 has no rows */
    float *x = gc_buf(N * I, 80, -1, 1), *w = gc_buf(E * O * I, 81, -1, 1),
          *dy = gc_buf(N * O, 82, -1, 1);
    const moe_recipe rs[3] = {MOE_RECIPE_FP32, MOE_RECIPE_BF16, MOE_RECIPE_FP8_BLOCK};
    for (int r = 0; r < 3; r++) {
        moe_cbuf w1 = gc_weight(be, w, 1, O, I, rs[r]), wE = gc_weight(be, w, E, O, I, rs[r]);
        /* ADD into zeros against SET into garbage (which SET must not read) */
        float *dxa = gc_buf(N * I, 0, 0, 0), *dwa = gc_buf(E * O * I, 0, 0, 0);
        float *dxs = gc_buf(N * I, 83, -9, 9), *dws = gc_buf(E * O * I, 84, -9, 9);
        be->matmul_backward(be, dxa, dwa, moe_cbuf_f32(dy), moe_cbuf_f32(x), w1, N, I, O, rs[r],
                            MOE_GRAD_ADD, MOE_GRAD_ADD);
        be->matmul_backward(be, dxs, dws, moe_cbuf_f32(dy), moe_cbuf_f32(x), w1, N, I, O, rs[r],
                            MOE_GRAD_SET, MOE_GRAD_SET);
        CHECK_MSG(same(dxa, dxs, N * I) && same(dwa, dws, O * I), "%s: matmul SET != ADD into 0",
                  moe_recipe_name(rs[r]));
        memset(dxa, 0, (size_t)(N * I) * 4), memset(dwa, 0, (size_t)(E * O * I) * 4);
        gc_fill(dxs, N * I, 85, -9, 9), gc_fill(dws, E * O * I, 86, -9, 9);
        be->grouped_matmul_backward(be, moe_buf_f32(dxa), moe_buf_f32(dwa), moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wE, off, E, I, O, rs[r], MOE_GRAD_ADD,
                                    MOE_GRAD_ADD);
        be->grouped_matmul_backward(be, moe_buf_f32(dxs), moe_buf_f32(dws), moe_cbuf_f32(dy),
                                    moe_cbuf_f32(x), wE, off, E, I, O, rs[r], MOE_GRAD_SET,
                                    MOE_GRAD_SET);
        /* expert 1's weight gradient: zeros under SET (ADD left the zeros it had) */
        CHECK_MSG(same(dxa, dxs, N * I) && same(dwa, dws, E * O * I),
                  "%s: grouped matmul SET != ADD into 0", moe_recipe_name(rs[r]));
        free(dxa), free(dwa), free(dxs), free(dws);
        gc_weight_free(w1), gc_weight_free(wE);
    }
    /* a product with no rows writes a zero weight gradient under SET, keeps it under ADD */
    float *dw = gc_buf(O * I, 87, 1, 2);
    be->matmul_backward(be, NULL, dw, moe_cbuf_f32(dy), moe_cbuf_f32(x), moe_cbuf_f32(w), 0, I, O,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    CHECK(dw[0] >= 1.0f && dw[O * I - 1] >= 1.0f);
    be->matmul_backward(be, NULL, dw, moe_cbuf_f32(dy), moe_cbuf_f32(x), moe_cbuf_f32(w), 0, I, O,
                        MOE_RECIPE_FP32, MOE_GRAD_SET, MOE_GRAD_SET);
    float *z = gc_buf(O * I, 0, 0, 0);
    CHECK(same(dw, z, O * I));
    free(dw), free(z);
    /* permute and unpermute backward (slot_row: the identity), fp32 and a bf16 dyp */
    int32_t *slot = malloc((size_t)(N * K) * sizeof(int32_t));
    for (int64_t i = 0; i < N * K; i++)
        slot[i] = (int32_t)i;
    float *dxp = gc_buf(N * K * C, 88, -1, 1), *g = gc_buf(N * C, 89, -1, 1);
    float *yp = gc_buf(N * K * C, 90, -1, 1), *tw = gc_buf(N * K, 91, 0, 1);
    float *pa = gc_buf(N * C, 0, 0, 0), *ps = gc_buf(N * C, 92, -9, 9);
    be->permute_backward(be, pa, moe_cbuf_f32(dxp), slot, N, C, K, MOE_GRAD_ADD);
    be->permute_backward(be, ps, moe_cbuf_f32(dxp), slot, N, C, K, MOE_GRAD_SET);
    CHECK_MSG(same(pa, ps, N * C), "permute_backward SET != ADD into 0");
    for (int bf = 0; bf < 2; bf++) {
        moe_dtype dt = bf ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        float *ya = gc_buf(N * K * C, 0, 0, 0), *ys = gc_buf(N * K * C, 93, -9, 9); /* bf16: half */
        float *ta = gc_buf(N * K, 0, 0, 0), *ts = gc_buf(N * K, 94, -9, 9);
        be->unpermute_backward(be, moe_buf_of(ya, dt), ta, g, moe_cbuf_f32(yp), tw, slot, N, C, K,
                               MOE_GRAD_ADD);
        be->unpermute_backward(be, moe_buf_of(ys, dt), ts, g, moe_cbuf_f32(yp), tw, slot, N, C, K,
                               MOE_GRAD_SET);
        int64_t words = bf ? N * K * C / 2 : N * K * C; /* a bf16 dyp fills half the buffer */
        CHECK_MSG(same(ya, ys, words) && same(ta, ts, N * K), "unpermute_backward (%s) SET != ADD",
                  moe_dtype_name(dt));
        if (!bf) { /* in place, as the model runs it: dyp over yp */
            float *yi = malloc((size_t)(N * K * C) * sizeof(float));
            memcpy(yi, yp, (size_t)(N * K * C) * sizeof(float));
            be->unpermute_backward(be, moe_buf_f32(yi), ts, g, moe_cbuf_f32(yi), tw, slot, N, C, K,
                                   MOE_GRAD_SET);
            CHECK_MSG(same(ya, yi, N * K * C) && same(ta, ts, N * K), "unpermute in place");
            free(yi);
        }
        free(ya), free(ys), free(ta), free(ts);
    }
    /* swiglu backward in place (da over a, db over b) gives the bytes of separate outputs */
    float *sa = gc_buf(N * C, 95, -4, 4), *sb = gc_buf(N * C, 96, -2, 2);
    float *da = gc_buf(N * C, 0, 0, 0), *db = gc_buf(N * C, 0, 0, 0);
    be->swiglu_backward(be, moe_buf_f32(da), moe_buf_f32(db), moe_cbuf_f32(g), moe_cbuf_f32(sa),
                        moe_cbuf_f32(sb), N * C, NULL);
    be->swiglu_backward(be, moe_buf_f32(sa), moe_buf_f32(sb), moe_cbuf_f32(g), moe_cbuf_f32(sa),
                        moe_cbuf_f32(sb), N * C, NULL);
    CHECK_MSG(same(da, sa, N * C) && same(db, sb, N * C), "swiglu_backward in place");
    free(sa), free(sb), free(da), free(db);
    /* attention backward (GQA 4/2, a document mask): SET into garbage = ADD into zeros */
    const int64_t aB = 2, aT = 9, aH = 4, aKV = 2, aD = 8, nq = aB * aT * aH * aD;
    const int64_t nk = aB * aT * aKV * aD;
    const int32_t ds[18] = {0, 0, 0, 3, 3, 3, 3, 7, 7, 0, 0, 0, 0, 0, 5, 5, 5, 5};
    float *q = gc_buf(nq, 97, -1, 1), *k = gc_buf(nk, 98, -1, 1), *v = gc_buf(nk, 99, -1, 1);
    float *o = gc_buf(nq, 0, 0, 0), *lse = gc_buf(aB * aH * aT, 0, 0, 0),
          *go = gc_buf(nq, 100, -1, 1);
    be->attention_forward(be, moe_buf_f32(o), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                          moe_cbuf_f32(v), ds, aB, aT, aT, aH, aKV, aD, MOE_RECIPE_FP32);
    float *ga[3] = {gc_buf(nq, 0, 0, 0), gc_buf(nk, 0, 0, 0), gc_buf(nk, 0, 0, 0)};
    float *gs[3] = {gc_buf(nq, 101, -9, 9), gc_buf(nk, 102, -9, 9), gc_buf(nk, 103, -9, 9)};
    be->attention_backward(be, ga[0], ga[1], ga[2], go, moe_cbuf_f32(q), moe_cbuf_f32(k),
                           moe_cbuf_f32(v), moe_cbuf_f32(o), lse, ds, aB, aT, aH, aKV, aD,
                           MOE_RECIPE_FP32, MOE_GRAD_ADD);
    be->attention_backward(be, gs[0], gs[1], gs[2], go, moe_cbuf_f32(q), moe_cbuf_f32(k),
                           moe_cbuf_f32(v), moe_cbuf_f32(o), lse, ds, aB, aT, aH, aKV, aD,
                           MOE_RECIPE_FP32, MOE_GRAD_SET);
    CHECK_MSG(same(ga[0], gs[0], nq) && same(ga[1], gs[1], nk) && same(ga[2], gs[2], nk),
              "attention_backward SET != ADD into 0");
    for (int i = 0; i < 3; i++)
        free(ga[i]), free(gs[i]);
    free(q), free(k), free(v), free(o), free(lse), free(go);
    free(slot), free(dxp), free(g), free(yp), free(tw), free(pa), free(ps);
    free(x), free(w), free(dy);
}

/* bf16 expert weight gradients (optim.expert_grads bf16) on the CPU: the grouped backward's
 * BF16 dw holds the fp32 result rounded (SET), or the rounded fp32 sum of its value and the
 * product (ADD, a second micro-batch), for each recipe; AdamW reading a BF16 gradient and
 * sum_squares over one give the bytes of their fp32 forms over the widened values. */
static void test_bf16_grads(void) {
    int64_t N = 40, I = 160, O = 136, E = 3, n = E * O * I;
    const int32_t off[4] = {0, 25, 25, 40}; /* expert 1 has no rows */
    float *x = gc_buf(N * I, 95, -1, 1), *w = gc_buf(n, 96, -1, 1), *dy = gc_buf(N * O, 97, -1, 1);
    const moe_recipe rs[4] = {MOE_RECIPE_FP32, MOE_RECIPE_BF16, MOE_RECIPE_FP8_BLOCK,
                              MOE_RECIPE_MXFP8};
    uint16_t *d16 = malloc((size_t)n * sizeof(uint16_t));
    for (int r = 0; r < 4; r++) {
        moe_cbuf wE = gc_weight(be, w, E, O, I, rs[r]);
        for (int st = 0; st < 2; st++) { /* SET into garbage, then ADD onto bf16 values */
            moe_grad_store gs = st ? MOE_GRAD_ADD : MOE_GRAD_SET;
            float *dw = gc_buf(n, 98, -9, 9);
            for (int64_t i = 0; i < n; i++) /* the bf16 values both start from */
                d16[i] = moe_f32_to_bf16(dw[i]), dw[i] = moe_bf16_to_f32(d16[i]);
            be->grouped_matmul_backward(be, moe_buf_f32(NULL), moe_buf_f32(dw), moe_cbuf_f32(dy),
                                        moe_cbuf_f32(x), wE, off, E, I, O, rs[r], gs, gs);
            be->grouped_matmul_backward(be, moe_buf_f32(NULL), moe_buf_of(d16, MOE_DTYPE_BF16),
                                        moe_cbuf_f32(dy), moe_cbuf_f32(x), wE, off, E, I, O, rs[r],
                                        gs, gs);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += d16[i] != moe_f32_to_bf16(dw[i]);
            CHECK_MSG(bad == 0, "%s %s: %lld bf16 weight gradients are not the rounded fp32 ones",
                      moe_recipe_name(rs[r]), st ? "ADD" : "SET", (long long)bad);
            free(dw);
        }
        gc_weight_free(wE);
    }
    /* AdamW and sum_squares on d16 (the last result) against its widened values */
    float *gw = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        gw[i] = moe_bf16_to_f32(d16[i]);
    CHECK(be->sum_squares(be, moe_cbuf_of(d16, MOE_DTYPE_BF16), n) ==
          be->sum_squares(be, moe_cbuf_f32(gw), n));
    float *p[2], *m[2], *v[2];
    for (int k = 0; k < 2; k++) {
        p[k] = gc_buf(n, 99, -1, 1), m[k] = gc_buf(n, 0, 0, 0), v[k] = gc_buf(n, 0, 0, 0);
        for (int64_t step = 1; step <= 2; step++)
            be->adamw(be, p[k], NULL, NULL, k ? moe_cbuf_of(d16, MOE_DTYPE_BF16) : moe_cbuf_f32(gw),
                      moe_buf_f32(m[k]), moe_buf_f32(v[k]), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      step, 0.5f);
    }
    CHECK(same(p[0], p[1], n) && same(m[0], m[1], n) && same(v[0], v[1], n));
    for (int k = 0; k < 2; k++)
        free(p[k]), free(m[k]), free(v[k]);
    free(gw), free(d16), free(x), free(w), free(dy);
}

int main(void) {
    be = moe_backend_cpu();
    test_grad_store();
    test_bf16_grads();
    return test_summary("test_grad_store");
}
