/* ops_harness: the core of gpu.backend_ops (test_backend_ops.c): random numbers, device
 * buffers with guard bytes on both sides, the comparisons (NMSE, exact integers, bytes) and the
 * typed operands (bf16, MXFP8) of a case, with the weight operands each backend reads. The one
 * thing to know: every buffer dup_dev makes is guarded and listed in the gctx, so
 * check_sync_guards after each op catches an out-of-bounds write, and free_bufs releases them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "ops_harness.h"
#include "testlib.h"

/* ------------------------------------------------------------------------------------------
 * random numbers (splitmix64), timing */

uint64_t g_rng;

static uint64_t rng_next(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}
int64_t rng_int(int64_t n) {
    return (int64_t)(rng_next() % (uint64_t)n);
}
double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_backend_ops: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
float *frand(int64_t n, float lo, float hi) {
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = rng_uniform(lo, hi);
    return p;
}

/* ------------------------------------------------------------------------------------------
 * device buffers with guards */

#define GUARD 256 /* bytes on each side; keeps the data 256-byte aligned */
#define GUARD_BYTE 0xA5

/* Device copy of host (bytes), or poisoned with 0xFF (NaN floats) when host is NULL. */
void *dup_dev(gctx *g, const char *name, const void *host, size_t bytes) {
    if (g->nbufs == MAX_BUFS) {
        fprintf(stderr, "test_backend_ops: too many buffers in one case\n");
        exit(1);
    }
    size_t total = bytes + 2 * GUARD;
    unsigned char *staging = xmalloc(total);
    memset(staging, GUARD_BYTE, GUARD);
    memset(staging + GUARD + bytes, GUARD_BYTE, GUARD);
    if (host)
        memcpy(staging + GUARD, host, bytes);
    else
        memset(staging + GUARD, 0xFF, bytes);
    unsigned char *base = g->gpu->alloc(g->gpu, total);
    if (!base) {
        fprintf(stderr, "test_backend_ops: device allocation of %zu bytes failed\n", total);
        exit(1);
    }
    g->gpu->memcpy_h2d(g->gpu, base, staging, total);
    free(staging);
    g->bufs[g->nbufs].base = base;
    g->bufs[g->nbufs].bytes = bytes;
    g->bufs[g->nbufs].name = name;
    g->bufs[g->nbufs].part = "";
    g->nbufs++;
    return base + GUARD;
}

void *down(gctx *g, const void *dev, size_t bytes) {
    void *h = xmalloc(bytes);
    g->gpu->memcpy_d2h(g->gpu, h, dev, bytes);
    return h;
}

/* Synchronises (reporting any recorded CUDA error) and checks every guard. */
void check_sync_guards(gctx *g, const char *after) {
    moe_err err;
    moe_err_clear(&err);
    if (g->gpu->synchronize(g->gpu, &err) != MOE_OK) {
        moe_err_print(&err, "test_backend_ops", stderr);
        fprintf(stderr, "%s: CUDA error after %s: giving up\n", g->label, after);
        exit(1);
    }
    for (int i = 0; i < g->nbufs; i++) {
        dbuf *b = &g->bufs[i];
        size_t total = b->bytes + 2 * GUARD;
        unsigned char *h = down(g, b->base, total);
        int bad = 0;
        for (size_t j = 0; j < GUARD; j++)
            bad |= h[j] != GUARD_BYTE || h[GUARD + b->bytes + j] != GUARD_BYTE;
        CHECK_MSG(!bad, "%s: %s: guard bytes of '%s%s' overwritten (out-of-bounds write)", g->label,
                  after, b->name, b->part);
        if (bad) g->fails++;
        free(h);
    }
}

void free_bufs(gctx *g) {
    for (int i = 0; i < g->nbufs; i++)
        g->gpu->free(g->gpu, g->bufs[i].base);
    g->nbufs = 0;
}

/* ------------------------------------------------------------------------------------------
 * comparisons */

double g_worst_nmse; /* over the whole run, for the summary */

static void cmp_host(gctx *g, const char *what, const float *h, const float *ref, int64_t n,
                     double tol) {
    double num = 0.0, den = 0.0;
    int64_t nan = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(h[i]) || isinf(h[i])) {
            nan++;
            continue;
        }
        double d = (double)h[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double nmse = den > 0.0 ? num / den : num;
    int ok = nan == 0 && nmse <= tol;
    printf("  %-28s %-16s n=%-9lld nmse=%.3e tol=%.0e %s\n", g->label, what, (long long)n, nmse,
           tol, ok ? "ok" : "FAIL");
    CHECK_MSG(nan == 0, "%s %s: %lld NaN/Inf values (unwritten or overflowed)", g->label, what,
              (long long)nan);
    CHECK_MSG(nmse <= tol, "%s %s: nmse %.3e > %.0e", g->label, what, nmse, tol);
    if (!ok) g->fails++;
    if (nmse > g_worst_nmse && nan == 0) g_worst_nmse = nmse;
}

void cmp_f32(gctx *g, const char *what, const float *dev, const float *ref, int64_t n, double tol) {
    float *h = down(g, dev, (size_t)n * sizeof(float));
    cmp_host(g, what, h, ref, n, tol);
    free(h);
}

void cmp_i32(gctx *g, const char *what, const int32_t *dev, const int32_t *ref, int64_t n) {
    int32_t *h = down(g, dev, (size_t)n * sizeof(int32_t));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (h[i] != ref[i] && bad++ == 0) first = i;
    printf("  %-28s %-16s n=%-9lld mismatches=%lld %s\n", g->label, what, (long long)n,
           (long long)bad, bad ? "FAIL" : "ok");
    CHECK_MSG(bad == 0, "%s %s: %lld of %lld differ (first at %lld: gpu %d cpu %d)", g->label, what,
              (long long)bad, (long long)n, (long long)first, first >= 0 ? h[first] : 0,
              first >= 0 ? ref[first] : 0);
    if (bad) g->fails++;
    free(h);
}

/* 1 when the device bytes dev equal host ref [bytes]; prints and counts a difference. */
int same_bytes(gctx *g, const char *what, const void *dev, const void *ref, size_t bytes) {
    void *h = down(g, dev, bytes);
    int same = memcmp(h, ref, bytes) == 0;
    free(h);
    CHECK_MSG(same, "%s: %s differs from the CPU's bytes", g->label, what);
    if (!same) g->fails++;
    return same;
}

/* An accumulated (+=) output that equals its initial values would make a comparison
 * vacuous (both backends doing nothing agree): the reference must have changed most of it. */
void check_changed(gctx *g, const char *what, const float *ref, const float *init, int64_t n,
                   double min_frac) {
    int64_t changed = 0;
    for (int64_t i = 0; i < n; i++)
        changed += ref[i] != init[i];
    CHECK_MSG((double)changed >= min_frac * (double)n,
              "%s %s: the reference changed only %lld of %lld values", g->label, what,
              (long long)changed, (long long)n);
}

float *fdup(const float *x, int64_t n) {
    float *p = xmalloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

/* ------------------------------------------------------------------------------------------
 * typed operands */

/* x[i] = round_bf16(x[i]): the values a bf16 operand can hold, so both sides see them. */
static void round_host(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = moe_round_bf16(x[i]);
}

/* bf16 where a TYPED case makes the operand so, else fp32. */
moe_dtype typed_dt(const tcase *tc) {
    return tc->types & TYPED ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
}

/* The type of case tc's operands of role `role`: the case's choice, or dflt (the runner's:
 * typed_dt for an operand that TYPED cases make bf16, fp32 for one they do not). MXFP8 is
 * MOE_DTYPE_E4M3 here: the harness's E4M3 activations always carry their scales. */
moe_dtype role_dt(const tcase *tc, int role, moe_dtype dflt) {
    static const moe_dtype k_dt[4] = {MOE_DTYPE_F32, MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_E4M3};
    const int t = tc->types >> (1 + 2 * role) & 3;
    return t ? k_dt[t] : dflt;
}

/* The MXFP8 form of x [n] (n a multiple of 32) as the ops store it: each value's bf16 rounding
 * encoded 32 at a time (moe_mxfp8_encode_block), q [n] followed by the scales [n / 32] in one
 * malloc'ed block. */
uint8_t *mx_encode(const float *x, int64_t n) {
    float *r = fdup(x, n);
    round_host(r, n);
    uint8_t *q = xmalloc((size_t)(n + n / 32));
    test_mxfp8_encode(q, q + n, r, n);
    free(r);
    return q;
}

/* x[i] = the value an operand of type dt holds after x [n] is stored in it: x itself (F32), its
 * bf16 rounding (BF16), or the decoded MXFP8 encoding of that rounding (E4M3). Inputs made so
 * hold the same values on both sides; a reference made so is what the GPU's output must hold. */
void as_stored(float *x, int64_t n, moe_dtype dt) {
    if (dt == MOE_DTYPE_F32) return;
    if (dt == MOE_DTYPE_BF16) {
        round_host(x, n);
        return;
    }
    uint8_t *q = mx_encode(x, n);
    test_mxfp8_decode(x, q, q + n, n);
    free(q);
}

/* A device copy of host [n] as an operand of type dt: fp32, bf16 (of values the caller
 * rounded) or MXFP8 (of values the caller made so with as_stored: the encoding in one guarded
 * buffer, its scales in another). host NULL: a poisoned output, 0xFF bytes (NaN in each type,
 * the e4m3 values and the e8m0 scales alike). */
moe_buf dev_operand(gctx *g, moe_dtype dt, const char *name, const float *host, int64_t n) {
    if (dt == MOE_DTYPE_F32) return moe_buf_f32(dup_dev(g, name, host, F(n)));
    if (dt == MOE_DTYPE_E4M3) {
        uint8_t *h = host ? mx_encode(host, n) : NULL;
        uint8_t *q = dup_dev(g, name, h, (size_t)n);
        uint8_t *mx = dup_dev(g, name, h ? h + n : NULL, (size_t)(n / 32));
        g->bufs[g->nbufs - 1].part = " scales";
        free(h);
        return moe_buf_mxfp8(q, mx);
    }
    uint16_t *h = NULL;
    if (host) {
        h = xmalloc((size_t)n * sizeof(uint16_t));
        for (int64_t i = 0; i < n; i++)
            h[i] = moe_f32_to_bf16(host[i]);
    }
    moe_buf b = moe_buf_of(dup_dev(g, name, h, (size_t)n * sizeof(uint16_t)), MOE_DTYPE_BF16);
    free(h);
    return b;
}

/* The bound for an output stored in bf16 or MXFP8 whose value the GPU computes in another
 * order than the CPU (a gradient, an accumulated sum): one at a rounding boundary rounds the
 * other way (nmse about 1e-9; 1e-5 also covers the cases whose tol asks for exact copies). */
double tol_stored(const tcase *tc, moe_dtype dt) {
    return dt == MOE_DTYPE_F32 ? tc->tol : fmax(tc->tol, 1e-5);
}

/* cmp_host of a typed device output [n] (bf16 widened, MXFP8 decoded) against the CPU's fp32
 * result as that type stores it (as_stored): an MXFP8 output differs from its fp32 value by
 * e4m3's rounding (nmse about 1e-3), which the GPU's output must reproduce, not be near. */
void cmp_typed(gctx *g, const char *what, moe_buf dev, const float *ref, int64_t n, double tol) {
    float *h = xmalloc(F(n)), *r = fdup(ref, n);
    if (dev.mx) {
        uint8_t *q = down(g, dev.p, (size_t)n), *mx = down(g, dev.mx, (size_t)(n / 32));
        test_mxfp8_decode(h, q, mx, n);
        free(q), free(mx);
    } else if (dev.dt == MOE_DTYPE_BF16) {
        uint16_t *h16 = down(g, dev.p, (size_t)n * sizeof(uint16_t));
        for (int64_t i = 0; i < n; i++)
            h[i] = moe_bf16_to_f32(h16[i]);
        free(h16);
    } else {
        g->gpu->memcpy_d2h(g->gpu, h, dev.p, F(n));
    }
    as_stored(r, n, dev.dt);
    cmp_host(g, what, h, r, n, tol);
    free(h), free(r);
}

/* The GPU's weight operand for case tc, the weight [E, O, I] at dw_ dev: dw_ itself, its bf16
 * copy (typed cases: what the model passes under the bf16 recipe; the CPU reads the fp32
 * weight, unit.ops_lowp checks that both give the same bits), or under fp8-block its e4m3 copies
 * from the GPU's quantize_weight (the CPU reads its own, cpu_weight), in new guarded buffers
 * (the scales' padding entries zero, as in the model's allocation). */
moe_cbuf gpu_weight(gctx *g, const tcase *tc, const float *dw_, int64_t E, int64_t O, int64_t I) {
    int64_t n = E * O * I;
    if (moe_recipe_format(tc->prec) == MOE_RECIPE_FP8_BLOCK) {
        int64_t ns = moe_fp8_weight_scales(E, O, I);
        float *zeros = calloc((size_t)ns, sizeof(float));
        uint8_t *q = dup_dev(g, "w e4m3", NULL, (size_t)(2 * n));
        float *sc = dup_dev(g, "w scales", zeros, F(ns));
        free(zeros);
        g->gpu->quantize_weight(g->gpu, q, sc, dw_, E, O, I, tc->prec);
        return moe_cbuf_e4m3(q, sc);
    }
    if (typed_dt(tc) == MOE_DTYPE_F32 || moe_recipe_is_fp8(tc->prec)) return moe_cbuf_f32(dw_);
    uint16_t *d16 = dup_dev(g, "w16", NULL, (size_t)n * sizeof(uint16_t));
    g->gpu->cast_bf16(g->gpu, d16, dw_, n);
    return moe_cbuf_of(d16, MOE_DTYPE_BF16);
}

/* The CPU's weight operand for w [E, O, I] host: its e4m3 copies under fp8-block (release
 * with gc_weight_free), else w. */
moe_cbuf cpu_weight(gctx *g, const tcase *tc, const float *w, int64_t E, int64_t O, int64_t I) {
    return gc_weight(g->cpu, w, E, O, I, tc->prec);
}
