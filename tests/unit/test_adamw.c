/* test_adamw: the CPU backend's AdamW (moe/ops.h adamw) with fp32 and bf16 moments, an fp32
 * or a split master (optim.master split), and cast_bf16, bit for bit.
 *
 * fp32 moments: the new weights, moments and bf16 copies equal a scalar float reference of
 * the op's expressions (each product and sum rounded on its own: C11 without FP_CONTRACT, the
 * arithmetic the op always had) and agree with a double-precision AdamW within 1e-5.
 * bf16 moments (optim.moments bf16): the stored m and v are the new moments rounded to
 * nearest even and the update is computed from those stored values, checked step by step
 * against a straightforward scalar reference; a reference that updates from the unrounded
 * moments differs in most weights, so the check can tell the two rules apart. 1 and 2 OpenMP
 * threads give the same bytes. And the reason for the config's beta limit: a bf16 moment of 1
 * fed a new term of 2 every step stays at 1 for good under beta 0.999 (its fp32 twin moves)
 * and moves under beta 0.99. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "testlib.h"

static const moe_backend *be;

typedef struct hparams {
    float lr, b1, b2, eps, wd, gs;
} hparams;

static const hparams k_hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};

/* One AdamW step by its definition, element by element, in float: the new moments rounded
 * to bf16 when dt is BF16 (mf, vf [n] hold the moments' values), the update from the
 * rounded (stored) values when from_stored, else from the unrounded ones. */
static void ref_step(float *p, uint16_t *p16, const float *g, float *mf, float *vf, int64_t n,
                     moe_dtype dt, const hparams *h, int64_t step, int from_stored) {
    const float bc1 = (float)(1.0 - pow((double)h->b1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)h->b2, (double)step));
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * h->gs;
        float mi = h->b1 * mf[i] + (1.0f - h->b1) * gi;
        float vi = h->b2 * vf[i] + (1.0f - h->b2) * gi * gi;
        float ms = dt == MOE_DTYPE_BF16 ? moe_round_bf16(mi) : mi;
        float vs = dt == MOE_DTYPE_BF16 ? moe_round_bf16(vi) : vi;
        mf[i] = ms, vf[i] = vs;
        float um = from_stored ? ms : mi, uv = from_stored ? vs : vi;
        p[i] = p[i] - h->lr * ((um / bc1) / (sqrtf(uv / bc2) + h->eps) + h->wd * p[i]);
        p16[i] = moe_f32_to_bf16(p[i]);
    }
}

/* The values in x [n] as moments of type dt: a copy (F32) or the bf16 codes (BF16). */
static void *to_moments(const float *x, int64_t n, moe_dtype dt) {
    void *b = malloc((size_t)n * moe_dtype_size(dt));
    moe_err err;
    moe_err_clear(&err);
    if (!b || moe_convert(b, dt, x, MOE_DTYPE_F32, n, &err) != MOE_OK) abort();
    return b;
}

/* A gradient of many magnitudes (2^-10 .. 2^9 times a uniform [-1, 1) value, some zeros), so
 * the moments spread over many binades and round in every way. */
static float *gradient(int64_t n, uint64_t seed) {
    float *g = gc_buf(n, seed, -1, 1);
    for (int64_t i = 0; i < n; i++)
        g[i] = i % 97 == 0 ? 0.0f : ldexpf(g[i], (int)(i % 20) - 10);
    return g;
}

/* Four steps (each with its own gradient) of the op and of the reference with moments of type
 * dt, starting from nonzero moments: identical bytes after every step. */
static void test_exact(moe_dtype dt) {
    const int64_t n = 4099;
    float *p = gc_buf(n, 41, -1, 1), *mf = gc_buf(n, 42, -0.1, 0.1), *vf = gc_buf(n, 43, 0, 0.01);
    if (dt == MOE_DTYPE_BF16) /* stored moments hold bf16 values */
        for (int64_t i = 0; i < n; i++)
            mf[i] = moe_round_bf16(mf[i]), vf[i] = moe_round_bf16(vf[i]);
    float *rp = malloc((size_t)n * sizeof(float)), *wp = malloc((size_t)n * sizeof(float));
    float *wm = malloc((size_t)n * sizeof(float)), *wv = malloc((size_t)n * sizeof(float));
    uint16_t *p16 = malloc((size_t)n * 2), *r16 = malloc((size_t)n * 2),
             *w16 = malloc((size_t)n * 2);
    memcpy(rp, p, (size_t)n * sizeof(float));
    memcpy(wp, p, (size_t)n * sizeof(float));
    memcpy(wm, mf, (size_t)n * sizeof(float));
    memcpy(wv, vf, (size_t)n * sizeof(float));
    moe_buf m = moe_buf_of(to_moments(mf, n, dt), dt), v = moe_buf_of(to_moments(vf, n, dt), dt);
    size_t mb = (size_t)n * moe_dtype_size(dt);
    for (int64_t step = 1; step <= 4; step++) {
        float *g = gradient(n, 50 + (uint64_t)step);
        be->adamw(be, p, p16, NULL, moe_cbuf_f32(g), m, v, n, k_hp.lr, k_hp.b1, k_hp.b2, k_hp.eps,
                  k_hp.wd, step, k_hp.gs);
        ref_step(rp, r16, g, mf, vf, n, dt, &k_hp, step, 1);
        ref_step(wp, w16, g, wm, wv, n, dt, &k_hp, step, 0);
        void *rm = to_moments(mf, n, dt), *rv = to_moments(vf, n, dt);
        CHECK_MSG(memcmp(p, rp, (size_t)n * sizeof(float)) == 0, "%s moments step %lld: weights",
                  moe_dtype_name(dt), (long long)step);
        CHECK_MSG(memcmp(p16, r16, (size_t)n * 2) == 0, "%s moments step %lld: bf16 copies",
                  moe_dtype_name(dt), (long long)step);
        CHECK_MSG(memcmp(m.p, rm, mb) == 0 && memcmp(v.p, rv, mb) == 0,
                  "%s moments step %lld: stored moments", moe_dtype_name(dt), (long long)step);
        int64_t moved = 0;
        for (int64_t i = 0; i < n; i++)
            moved += rp[i] != wp[i];
        if (dt == MOE_DTYPE_BF16) /* updating from the unrounded moments gives other weights */
            CHECK_MSG(moved > n / 2, "step %lld: only %lld of %lld weights tell the rules apart",
                      (long long)step, (long long)moved, (long long)n);
        else /* fp32: nothing is rounded, both rules are one */
            CHECK_INT_EQ(moved, 0);
        free(g), free(rm), free(rv);
        memcpy(wp, rp, (size_t)n * sizeof(float)); /* the next step from the same state */
        memcpy(wm, mf, (size_t)n * sizeof(float));
        memcpy(wv, vf, (size_t)n * sizeof(float));
    }
    free(p), free(mf), free(vf), free(rp), free(wp), free(wm), free(wv), free(p16), free(r16);
    free(w16), free(m.p), free(v.p);
}

/* A split master (optim.master split: param NULL, the master in param16 and param_lo) against
 * an fp32 one, moments of type dt and a gradient of type gdt, four steps from the same state:
 * after every step the halves join to the fp32 run's weights bit for bit, the high half is
 * the split of that weight (moe_f32_split_bf16), it differs from the fp32 run's bf16 copy only
 * at ties, and the moments are the same bytes. The first step has lr 0 and keeps every
 * weight, and a third of them start as ties (low 16 bits 0x8000): their high halves round
 * away from zero where the copy rounds to even. */
static void test_split_master(moe_dtype dt, moe_dtype gdt) {
    const int64_t n = 4099;
    float *p = gc_buf(n, 61, -1, 1), *mf = gc_buf(n, 62, -0.1, 0.1), *vf = gc_buf(n, 63, 0, 0.01);
    for (int64_t i = 0; i < n; i += 3) { /* a tie: bits 0x8000 below the bf16 ones */
        uint32_t u = moe_f32_bits(p[i]);
        p[i] = moe_f32_from_bits((u & 0xffff0000u) | 0x8000u);
    }
    if (dt == MOE_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            mf[i] = moe_round_bf16(mf[i]), vf[i] = moe_round_bf16(vf[i]);
    uint16_t *p16 = malloc((size_t)n * 2), *hi = malloc((size_t)n * 2), *lo = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        moe_f32_split_bf16(p[i], hi + i, lo + i);
    moe_buf m = moe_buf_of(to_moments(mf, n, dt), dt), v = moe_buf_of(to_moments(vf, n, dt), dt);
    moe_buf sm = moe_buf_of(to_moments(mf, n, dt), dt), sv = moe_buf_of(to_moments(vf, n, dt), dt);
    size_t mb = (size_t)n * moe_dtype_size(dt);
    int64_t away = 0; /* ties whose high half is above the even copy */
    for (int64_t step = 1; step <= 5; step++) {
        float *g = gradient(n, 70 + (uint64_t)step), lr = step == 1 ? 0.0f : k_hp.lr;
        moe_cbuf cg = moe_cbuf_of(to_moments(g, n, gdt), gdt);
        be->adamw(be, p, p16, NULL, cg, m, v, n, lr, k_hp.b1, k_hp.b2, k_hp.eps, k_hp.wd, step,
                  k_hp.gs);
        be->adamw(be, NULL, hi, lo, cg, sm, sv, n, lr, k_hp.b1, k_hp.b2, k_hp.eps, k_hp.wd, step,
                  k_hp.gs);
        int64_t bad_join = 0, bad_hi = 0, bad_copy = 0;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h, l;
            moe_f32_split_bf16(p[i], &h, &l);
            bad_join += moe_f32_bits(moe_f32_join_bf16(hi[i], lo[i])) != moe_f32_bits(p[i]);
            bad_hi += hi[i] != h || lo[i] != l;
            int tie = (moe_f32_bits(p[i]) & 0xffffu) == 0x8000u;
            bad_copy += hi[i] != p16[i] && !tie;
            away += step == 1 && tie && hi[i] == p16[i] + 1;
        }
        CHECK_MSG(bad_join == 0 && bad_hi == 0 && bad_copy == 0,
                  "%s moments, %s gradient, step %lld: %lld masters differ, %lld halves, %lld "
                  "copies away from a tie",
                  moe_dtype_name(dt), moe_dtype_name(gdt), (long long)step, (long long)bad_join,
                  (long long)bad_hi, (long long)bad_copy);
        CHECK(memcmp(m.p, sm.p, mb) == 0 && memcmp(v.p, sv.p, mb) == 0);
        free(g), free((void *)cg.p);
    }
    /* the ties whose lower bf16 neighbour is even: about half of the n / 3 */
    CHECK_MSG(away > n / 8 && away < n / 4, "%lld ties rounded away from the even copy",
              (long long)away);
    free(p), free(mf), free(vf), free(p16), free(hi), free(lo);
    free(m.p), free(v.p), free(sm.p), free(sv.p);
}

/* fp32 moments against AdamW in double (the definition, to rounding), three steps. */
static void test_double_reference(void) {
    int64_t n = 1000;
    float *p = gc_buf(n, 32, -1, 1), *g = gc_buf(n, 33, -1, 1), *m = gc_buf(n, 0, 0, 0),
          *v = gc_buf(n, 0, 0, 0);
    uint16_t *p16 = malloc((size_t)n * sizeof(uint16_t));
    double *pr = malloc((size_t)n * sizeof(double)), *mr = calloc((size_t)n, sizeof(double)),
           *vr = calloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++)
        pr[i] = p[i];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int step = 1; step <= 3; step++) {
        be->adamw(be, p, p16, NULL, moe_cbuf_f32(g), moe_buf_f32(m), moe_buf_f32(v), n, (float)lr,
                  (float)b1, (float)b2, (float)eps, (float)wd, step, (float)gs);
        for (int64_t i = 0; i < n; i++) /* the copy is the new weight, rounded */
            CHECK(p16[i] == moe_f32_to_bf16(p[i]));
        for (int64_t i = 0; i < n; i++) {
            double gi = g[i] * gs;
            mr[i] = b1 * mr[i] + (1 - b1) * gi;
            vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
            double mh = mr[i] / (1 - pow(b1, step)), vh = vr[i] / (1 - pow(b2, step));
            pr[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pr[i]);
        }
    }
    double maxerr = 0;
    for (int64_t i = 0; i < n; i++)
        maxerr = fmax(maxerr, fabs(pr[i] - p[i]));
    CHECK_NEAR(maxerr, 0.0, 1e-5);
    free(p), free(g), free(m), free(v), free(pr), free(mr), free(vr), free(p16);
}

/* bf16 moments with 1 and 2 threads: the same bytes. */
static void test_threads(void) {
    const int64_t n = 3 * 4096 + 5;
    float *g = gradient(n, 61), *p[2];
    uint16_t *m[2], *v[2];
    for (int t = 0; t < 2; t++) {
        p[t] = gc_buf(n, 62, -1, 1);
        m[t] = calloc((size_t)n, 2), v[t] = calloc((size_t)n, 2);
        omp_set_num_threads(t + 1);
        for (int64_t step = 1; step <= 2; step++)
            be->adamw(be, p[t], NULL, NULL, moe_cbuf_f32(g), moe_buf_of(m[t], MOE_DTYPE_BF16),
                      moe_buf_of(v[t], MOE_DTYPE_BF16), n, k_hp.lr, k_hp.b1, k_hp.b2, k_hp.eps,
                      k_hp.wd, step, k_hp.gs);
    }
    omp_set_num_threads(2);
    CHECK(memcmp(p[0], p[1], (size_t)n * sizeof(float)) == 0);
    CHECK(memcmp(m[0], m[1], (size_t)n * 2) == 0 && memcmp(v[0], v[1], (size_t)n * 2) == 0);
    for (int t = 0; t < 2; t++)
        free(p[t]), free(m[t]), free(v[t]);
    free(g);
}

/* A first moment of 1 and a gradient of 2 every step, 100 steps: under beta1 0.999 each new
 * moment 1.001 rounds back to the bf16 value 1 (half an ulp there is 2^-8), so it never moves,
 * while fp32 moments reach 1 + (1 - 0.999^100) = 1.095; under beta1 0.99 (1.01) it moves at
 * once. Hence optim.moments bf16 needs betas <= 0.99 (config.c). */
static void test_stall(void) {
    const float betas[2] = {0.999f, 0.99f};
    for (int k = 0; k < 2; k++) {
        float p = 0.0f, pf = 0.0f, g = 2.0f, mf = 1.0f, vf = 4.0f;
        uint16_t m = moe_f32_to_bf16(1.0f), v = moe_f32_to_bf16(4.0f);
        for (int64_t step = 1; step <= 100; step++) {
            be->adamw(be, &p, NULL, NULL, moe_cbuf_f32(&g), moe_buf_of(&m, MOE_DTYPE_BF16),
                      moe_buf_of(&v, MOE_DTYPE_BF16), 1, 1e-3f, betas[k], 0.95f, 1e-8f, 0.0f, step,
                      1.0f);
            be->adamw(be, &pf, NULL, NULL, moe_cbuf_f32(&g), moe_buf_f32(&mf), moe_buf_f32(&vf), 1,
                      1e-3f, betas[k], 0.95f, 1e-8f, 0.0f, step, 1.0f);
            if (k == 1) break; /* 0.99: one step is enough to see it move */
        }
        if (k == 0) {
            CHECK_MSG(moe_bf16_to_f32(m) == 1.0f, "beta1 0.999: bf16 m moved to %g",
                      moe_bf16_to_f32(m));
            CHECK_NEAR(mf, 2.0 - pow(0.999, 100), 1e-5);
        } else {
            CHECK_MSG(moe_bf16_to_f32(m) == moe_round_bf16(1.01f) && moe_bf16_to_f32(m) > 1.0f,
                      "beta1 0.99: bf16 m is %g, not bf16(1.01)", moe_bf16_to_f32(m));
        }
    }
}

/* cast_bf16 rounds like moe_f32_to_bf16. */
static void test_cast(void) {
    int64_t n = 1000;
    float *g = gradient(n, 71);
    uint16_t *c16 = malloc((size_t)n * 2);
    be->cast_bf16(be, c16, g, n);
    for (int64_t i = 0; i < n; i++)
        CHECK(c16[i] == moe_f32_to_bf16(g[i]));
    free(g), free(c16);
}

int main(void) {
    be = moe_backend_cpu();
    test_exact(MOE_DTYPE_F32);
    test_exact(MOE_DTYPE_BF16);
    for (int k = 0; k < 4; k++)
        test_split_master(k & 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32,
                          k & 2 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32);
    test_double_reference();
    test_threads();
    test_stall();
    test_cast();
    return test_summary("test_adamw");
}
