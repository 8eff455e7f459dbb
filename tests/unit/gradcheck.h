/* gradcheck: finite-difference gradient checking shared by the op and model tests.
 *
 * A case supplies loss(state) - runs the forward and returns a scalar in double (usually
 * sum(out * R) for a fixed random R, so dL/dout = R) - and has already computed the
 * analytic gradient of that scalar with respect to an input array. gc_check perturbs
 * sampled elements of the input by +-h, takes central differences of loss() and compares.
 * Ops compute in fp32, so the difference quotient carries about eps_f32 * |terms| / h of
 * rounding noise on top of the O(h^2) truncation error; each caller states its h and the
 * tolerance that follows from it. */
#ifndef MOE_GRADCHECK_H
#define MOE_GRADCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe/ops.h"
#include "testlib.h"

/* splitmix64-based uniform in [lo, hi): a test-local generator, independent of moe/rng.h */
static inline double gc_uniform(uint64_t *s, double lo, double hi) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static inline void gc_fill(float *x, int64_t n, uint64_t seed, double lo, double hi) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)gc_uniform(&s, lo, hi);
}

/* A calloc'ed [n] (at least one element, the caller frees it): gc_fill of seed in [lo, hi),
 * or zeros for seed 0. */
static inline float *gc_buf(int64_t n, uint64_t seed, double lo, double hi) {
    float *x = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (seed) gc_fill(x, n, seed, lo, hi);
    return x;
}

/* The weight operand a product under prec reads for w [E, O, I] (host; be the CPU backend):
 * under fp8-block its e4m3 copies from be->quantize_weight (values and scales in one
 * malloc'ed block: release with gc_weight_free), else the fp32 w itself. */
static inline moe_cbuf gc_weight(const moe_backend *be, const float *w, int64_t E, int64_t O,
                                 int64_t I, moe_recipe prec) {
    if (moe_recipe_format(prec) != MOE_RECIPE_FP8_BLOCK) return moe_cbuf_f32(w);
    size_t qb = ((size_t)(2 * E * O * I) + 63) / 64 * 64;
    uint8_t *q = calloc(qb + (size_t)moe_fp8_weight_scales(E, O, I) * sizeof(float), 1);
    if (!q) abort();
    float *sc = (float *)(q + qb);
    be->quantize_weight(be, q, sc, w, E, O, I, prec);
    return moe_cbuf_e4m3(q, sc);
}
static inline void gc_weight_free(moe_cbuf w) {
    if (w.dt == MOE_DTYPE_E4M3) free((void *)w.p);
}

typedef double (*gc_loss_fn)(void *state);

/* Compares g[i] with (loss(x+h e_i) - loss(x-h e_i)) / 2h on up to `samples` indices
 * (all when n <= samples). Passes when |fd - g| <= atol + rtol * max(|fd|, |g|).
 * Returns the number of mismatches (each is also a failed CHECK with the values). */
static inline int gc_check(const char *what, void *state, gc_loss_fn loss, float *x, const float *g,
                           int64_t n, int samples, double h, double atol, double rtol) {
    int bad = 0;
    uint64_t s = 12345 + (uint64_t)n;
    int64_t count = n <= samples ? n : samples;
    for (int64_t t = 0; t < count; t++) {
        int64_t i = n <= samples ? t : (int64_t)gc_uniform(&s, 0.0, (double)n);
        if (i >= n) i = n - 1;
        float orig = x[i];
        x[i] = (float)(orig + h);
        double hp = (double)x[i] - orig;
        double lp = loss(state);
        x[i] = (float)(orig - h);
        double hm = orig - (double)x[i];
        double lm = loss(state);
        x[i] = orig;
        double fd = (lp - lm) / (hp + hm);
        double an = g[i];
        double tol = atol + rtol * fmax(fabs(fd), fabs(an));
        test_checks++;
        if (!(fabs(fd - an) <= tol)) {
            bad++;
            test_fail(__FILE__, __LINE__,
                      "%s: d/dx[%lld]: finite difference %.8g vs analytic %.8g (tol %.3g)", what,
                      (long long)i, fd, an, tol);
        }
    }
    return bad;
}

/* sum_i out[i] * r[i] in double */
static inline double gc_dot(const float *out, const float *r, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)out[i] * r[i];
    return s;
}

#endif
