/* test_attention: the blocked online-softmax attention of the CPU backend against a naive
 * O(T^2) reference computed in double (forward, lse and all three gradients), for causal
 * grouped-query and multi-head layouts, T = 1, exactly one block, and lengths spanning
 * several blocks with a ragged last block; the same with document masks (documents of length
 * 1, boundaries on and off the 64-key block edges, documents longer than a block); a packed
 * row equal, bit for bit, to its documents run alone; queries over cached keys equal, bit
 * for bit, the whole forward's rows; plus thread-count independence and
 * the bf16 recipe staying close to fp32 while differing from it.
 *
 * Tolerances: the kernel accumulates in fp32 over <= 150 terms of magnitude ~1, so 1e-5
 * absolute on outputs/lse and 1e-4 on gradients (which sum over more terms) is ~100x the
 * expected rounding and far below the O(1e-1) error of any masking or indexing bug. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/dtype.h"
#include "moe/ops.h"
#include "testlib.h"

static const moe_backend *be;

typedef struct {
    double *o, *lse, *dq, *dk, *dv;
} ref_out;

/* Document starts [B, T] (malloc'ed) of rows cut into documents of the lengths lens[0..n)
 * taken in turn, row b starting with lens[b % n] (the last document of a row is cut short). */
static int32_t *make_docs(int64_t B, int64_t T, const int *lens, int n) {
    int32_t *ds = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, start = 0, d = b % n; t < T; t++) {
            if (t - start == lens[d]) start = t, d = (d + 1) % n;
            ds[b * T + t] = (int32_t)start;
        }
    return ds;
}

/* The reference in double; dstart [B, T] or NULL as the op's doc_start. */
static void naive(const float *q, const float *k, const float *v, const float *dout,
                  const int32_t *dstart, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                  ref_out *r) {
    double scale = 1.0 / sqrt((double)D);
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    int64_t grp = H / KV;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t g = h / grp, j0 = dstart ? dstart[b * T + i] : 0;
                const float *qi = q + ((b * T + i) * H + h) * D;
                const float *gi = dout + ((b * T + i) * H + h) * D;
                double mx = -1e300, sum = 0;
                for (int64_t j = j0; j <= i; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)qi[d] * k[((b * T + j) * KV + g) * D + d];
                    p[j] = s * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = j0; j <= i; j++)
                    sum += exp(p[j] - mx);
                r->lse[(b * H + h) * T + i] = mx + log(sum);
                double *oi = r->o + ((b * T + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++)
                    oi[d] = 0;
                double pdp = 0;
                for (int64_t j = j0; j <= i; j++) {
                    p[j] = exp(p[j] - mx) / sum;
                    const float *vj = v + ((b * T + j) * KV + g) * D;
                    dp[j] = 0;
                    for (int64_t d = 0; d < D; d++) {
                        oi[d] += p[j] * vj[d];
                        dp[j] += (double)gi[d] * vj[d];
                    }
                    pdp += p[j] * dp[j];
                }
                for (int64_t j = j0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - pdp);
                    int64_t ok = ((b * T + j) * KV + g) * D;
                    for (int64_t d = 0; d < D; d++) {
                        r->dq[((b * T + i) * H + h) * D + d] += scale * ds * k[ok + d];
                        r->dk[ok + d] += scale * ds * qi[d];
                        r->dv[ok + d] += p[j] * gi[d];
                    }
                }
            }
    free(p);
    free(dp);
}

static double maxdiff(const float *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* One case against the reference; ds [B, T] document starts or NULL. */
static void run_case(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, uint64_t seed,
                     const int32_t *ds) {
    int64_t nq = B * T * H * D, nk = B * T * KV * D, nl = B * H * T;
    float *q = calloc((size_t)nq, 4), *k = calloc((size_t)nk, 4), *v = calloc((size_t)nk, 4);
    float *g = calloc((size_t)nq, 4), *o = calloc((size_t)nq, 4), *lse = calloc((size_t)nl, 4);
    float *dq = calloc((size_t)nq, 4), *dk = calloc((size_t)nk, 4), *dv = calloc((size_t)nk, 4);
    gc_fill(q, nq, seed, -1.5, 1.5);
    gc_fill(k, nk, seed + 1, -1.5, 1.5);
    gc_fill(v, nk, seed + 2, -1, 1);
    gc_fill(g, nq, seed + 3, -1, 1);
    ref_out r = {calloc((size_t)nq, 8), calloc((size_t)nl, 8), calloc((size_t)nq, 8),
                 calloc((size_t)nk, 8), calloc((size_t)nk, 8)};
    naive(q, k, v, g, ds, B, T, H, KV, D, &r);
    be->attention_forward(be, moe_buf_f32(o), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                          moe_cbuf_f32(v), ds, B, T, T, H, KV, D, MOE_RECIPE_FP32);
    be->attention_backward(be, dq, dk, dv, g, moe_cbuf_f32(q), moe_cbuf_f32(k), moe_cbuf_f32(v),
                           moe_cbuf_f32(o), lse, ds, B, T, H, KV, D, MOE_RECIPE_FP32, MOE_GRAD_ADD);
    double eo = maxdiff(o, r.o, nq), el = maxdiff(lse, r.lse, nl);
    double eq = maxdiff(dq, r.dq, nq), ek = maxdiff(dk, r.dk, nk), ev = maxdiff(dv, r.dv, nk);
    CHECK_MSG(eo < 1e-5 && el < 1e-5, "B%lld T%lld H%lld KV%lld D%lld%s: out err %g lse err %g",
              (long long)B, (long long)T, (long long)H, (long long)KV, (long long)D,
              ds ? " docs" : "", eo, el);
    CHECK_MSG(eq < 1e-4 && ek < 1e-4 && ev < 1e-4, "B%lld T%lld H%lld KV%lld%s: dq %g dk %g dv %g",
              (long long)B, (long long)T, (long long)H, (long long)KV, ds ? " docs" : "", eq, ek,
              ev);
    /* causality: changing the last key/value changes no earlier output */
    if (T > 1) {
        float *o2 = calloc((size_t)nq, 4);
        for (int64_t d = 0; d < KV * D; d++)
            k[(B * T - 1) * KV * D + d] += 1.0f, v[(B * T - 1) * KV * D + d] -= 1.0f;
        be->attention_forward(be, moe_buf_f32(o2), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                              moe_cbuf_f32(v), ds, B, T, T, H, KV, D, MOE_RECIPE_FP32);
        CHECK(memcmp(o2, o, (size_t)((B * T - 1) * H * D) * 4) == 0);
        free(o2);
    }
    free(q), free(k), free(v), free(g), free(o), free(lse), free(dq), free(dk), free(dv);
    free(r.o), free(r.lse), free(r.dq), free(r.dk), free(r.dv);
}

static void test_threads_and_bf16(void) {
    int64_t B = 2, T = 130, H = 4, KV = 1, D = 16;
    int64_t nq = B * T * H * D, nk = B * T * KV * D, nl = B * H * T;
    float *q = calloc((size_t)nq, 4), *k = calloc((size_t)nk, 4), *v = calloc((size_t)nk, 4);
    float *g = calloc((size_t)nq, 4), *lse = calloc((size_t)nl, 4);
    float *o[3], *dq[3], *dk[3], *dv[3];
    gc_fill(q, nq, 90, -1, 1), gc_fill(k, nk, 91, -1, 1), gc_fill(v, nk, 92, -1, 1),
        gc_fill(g, nq, 93, -1, 1);
    for (int c = 0; c < 3; c++) {
        o[c] = calloc((size_t)nq, 4), dq[c] = calloc((size_t)nq, 4);
        dk[c] = calloc((size_t)nk, 4), dv[c] = calloc((size_t)nk, 4);
        omp_set_num_threads(c == 0 ? 1 : 2);
        moe_recipe pr = c == 2 ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
        be->attention_forward(be, moe_buf_f32(o[c]), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                              moe_cbuf_f32(v), NULL, B, T, T, H, KV, D, pr);
        be->attention_backward(be, dq[c], dk[c], dv[c], g, moe_cbuf_f32(q), moe_cbuf_f32(k),
                               moe_cbuf_f32(v), moe_cbuf_f32(o[c]), lse, NULL, B, T, H, KV, D, pr,
                               MOE_GRAD_ADD);
    }
    CHECK(memcmp(o[0], o[1], (size_t)nq * 4) == 0);
    CHECK(memcmp(dq[0], dq[1], (size_t)nq * 4) == 0);
    CHECK(memcmp(dk[0], dk[1], (size_t)nk * 4) == 0);
    CHECK(memcmp(dv[0], dv[1], (size_t)nk * 4) == 0);
    double d16 = 0;
    int rounded = 1;
    for (int64_t i = 0; i < nq; i++) {
        d16 = fmax(d16, fabs(o[2][i] - o[0][i]));
        rounded &= (moe_f32_bits(o[2][i]) & 0xffffu) == 0;
    }
    CHECK_MSG(d16 > 1e-5 && d16 < 3e-2, "bf16 attention vs fp32: max diff %g", d16);
    CHECK_MSG(rounded, "bf16 attention output must be bf16-representable");
    for (int c = 0; c < 3; c++)
        free(o[c]), free(dq[c]), free(dk[c]), free(dv[c]);
    free(q), free(k), free(v), free(g), free(lse);
}

/* A packed row under the mask gives, bit for bit, what each of its documents gives alone
 * (out, lse, dq, dk, dv): a document's keys are walked in the same blocks either way. */
static void test_packed_equals_alone(void) {
    const int64_t T = 200, H = 4, KV = 2, D = 16;
    const int lens[] = {1, 63, 64, 1, 71}; /* starts 0, 1, 64, 128, 129 */
    int64_t nq = T * H * D, nk = T * KV * D;
    float *q = calloc((size_t)nq, 4), *k = calloc((size_t)nk, 4), *v = calloc((size_t)nk, 4);
    float *g = calloc((size_t)nq, 4), *o = calloc((size_t)nq, 4), *lse = calloc((size_t)(H * T), 4);
    float *dq = calloc((size_t)nq, 4), *dk = calloc((size_t)nk, 4), *dv = calloc((size_t)nk, 4);
    gc_fill(q, nq, 50, -1.5, 1.5), gc_fill(k, nk, 51, -1.5, 1.5), gc_fill(v, nk, 52, -1, 1);
    gc_fill(g, nq, 53, -1, 1);
    int32_t *ds = make_docs(1, T, lens, 5);
    be->attention_forward(be, moe_buf_f32(o), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                          moe_cbuf_f32(v), ds, 1, T, T, H, KV, D, MOE_RECIPE_FP32);
    be->attention_backward(be, dq, dk, dv, g, moe_cbuf_f32(q), moe_cbuf_f32(k), moe_cbuf_f32(v),
                           moe_cbuf_f32(o), lse, ds, 1, T, H, KV, D, MOE_RECIPE_FP32, MOE_GRAD_ADD);
    for (int64_t s0 = 0, d = 0; s0 < T; s0 += lens[d], d++) {
        int64_t n = s0 + lens[d] <= T ? lens[d] : T - s0, mq = n * H * D, mk = n * KV * D;
        float *o1 = calloc((size_t)mq, 4), *l1 = calloc((size_t)(H * n), 4);
        float *q1 = calloc((size_t)mq, 4), *k1 = calloc((size_t)mk, 4), *v1 = calloc((size_t)mk, 4);
        moe_cbuf qa = moe_cbuf_f32(q + s0 * H * D), ka = moe_cbuf_f32(k + s0 * KV * D);
        moe_cbuf va = moe_cbuf_f32(v + s0 * KV * D);
        be->attention_forward(be, moe_buf_f32(o1), l1, qa, ka, va, NULL, 1, n, n, H, KV, D,
                              MOE_RECIPE_FP32);
        be->attention_backward(be, q1, k1, v1, g + s0 * H * D, qa, ka, va, moe_cbuf_f32(o1), l1,
                               NULL, 1, n, H, KV, D, MOE_RECIPE_FP32, MOE_GRAD_ADD);
        int same = memcmp(o1, o + s0 * H * D, (size_t)mq * 4) == 0;
        for (int64_t h = 0; h < H; h++)
            same &= memcmp(l1 + h * n, lse + h * T + s0, (size_t)n * 4) == 0;
        same &= memcmp(q1, dq + s0 * H * D, (size_t)mq * 4) == 0;
        same &= memcmp(k1, dk + s0 * KV * D, (size_t)mk * 4) == 0;
        same &= memcmp(v1, dv + s0 * KV * D, (size_t)mk * 4) == 0;
        CHECK_MSG(same, "document at %lld (length %lld): packed and alone differ", (long long)s0,
                  (long long)n);
        free(o1), free(l1), free(q1), free(k1), free(v1);
    }
    free(q), free(k), free(v), free(g), free(o), free(lse), free(dq), free(dk), free(dv), free(ds);
}

/* Queries that continue cached keys (Tk > T) give, bit for bit, the last T rows of the whole
 * forward (out and lse), fp32 and bf16, with and without a document mask (ds [B, Tk]: the
 * continued rows take its last T columns). */
static void test_cached_keys_equal_whole(void) {
    const int64_t B = 2, Tk = 200, H = 4, KV = 2, D = 16, P[] = {1, 64, 137};
    const int lens[] = {1, 63, 64, 1, 71};
    int64_t nq = B * Tk * H * D, nk = B * Tk * KV * D;
    float *q = calloc((size_t)nq, 4), *k = calloc((size_t)nk, 4), *v = calloc((size_t)nk, 4);
    float *o = calloc((size_t)nq, 4), *lse = calloc((size_t)(B * H * Tk), 4);
    gc_fill(q, nq, 60, -1.5, 1.5), gc_fill(k, nk, 61, -1.5, 1.5), gc_fill(v, nk, 62, -1, 1);
    int32_t *docs = make_docs(B, Tk, lens, 5);
    for (int c = 0; c < 4; c++) {
        moe_recipe pr = c & 1 ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
        const int32_t *ds = c & 2 ? docs : NULL;
        be->attention_forward(be, moe_buf_f32(o), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                              moe_cbuf_f32(v), ds, B, Tk, Tk, H, KV, D, pr);
        for (int i = 0; i < 3; i++) {
            int64_t T = Tk - P[i], mq = B * T * H * D;
            float *qs = calloc((size_t)mq, 4), *os = calloc((size_t)mq, 4);
            float *ls = calloc((size_t)(B * H * T), 4);
            int32_t *dss = ds ? malloc((size_t)(B * T) * sizeof(int32_t)) : NULL;
            for (int64_t b = 0; b < B; b++) {
                memcpy(qs + b * T * H * D, q + (b * Tk + P[i]) * H * D, (size_t)(T * H * D) * 4);
                if (dss) memcpy(dss + b * T, ds + b * Tk + P[i], (size_t)T * sizeof(int32_t));
            }
            be->attention_forward(be, moe_buf_f32(os), ls, moe_cbuf_f32(qs), moe_cbuf_f32(k),
                                  moe_cbuf_f32(v), dss, B, T, Tk, H, KV, D, pr);
            int same = 1;
            for (int64_t b = 0; b < B; b++) {
                same &= memcmp(os + b * T * H * D, o + (b * Tk + P[i]) * H * D,
                               (size_t)(T * H * D) * 4) == 0;
                for (int64_t h = 0; h < H; h++)
                    same &= memcmp(ls + (b * H + h) * T, lse + (b * H + h) * Tk + P[i],
                                   (size_t)T * 4) == 0;
            }
            CHECK_MSG(same, "case %d, %lld cached keys: the continued rows differ", c,
                      (long long)P[i]);
            free(qs), free(os), free(ls), free(dss);
        }
    }
    free(q), free(k), free(v), free(o), free(lse), free(docs);
}

int main(void) {
    be = moe_backend_cpu();
    run_case(1, 1, 2, 1, 8, 10, NULL);    /* single position */
    run_case(1, 64, 2, 2, 8, 20, NULL);   /* exactly one block, multi-head */
    run_case(2, 150, 4, 2, 16, 30, NULL); /* three blocks, ragged last (22), GQA 2:1 */
    run_case(1, 70, 6, 1, 8, 40, NULL);   /* multi-query (one kv head) */
    /* document masks: lengths 1 (also first and last of a row), boundaries on the block
     * edges 64 and 128, documents spanning blocks; rows starting at different documents */
    const int lens[] = {1, 63, 64, 1, 9, 90, 2};
    int32_t *ds = make_docs(3, 230, lens, 7);
    run_case(3, 230, 4, 2, 16, 60, ds);
    free(ds);
    const int one[] = {1}; /* every position its own document: attends to itself only */
    ds = make_docs(1, 70, one, 1);
    run_case(1, 70, 2, 1, 8, 70, ds);
    free(ds);
    test_packed_equals_alone();
    test_cached_keys_equal_whole();
    test_threads_and_bf16();
    return test_summary("test_attention");
}
