/* test_backend_ops: every op of the CUDA backend against the CPU reference backend, in the
 * style of ggml's test-backend-ops.
 *
 * A table of cases (op, shapes, recipe, tolerance) drives one runner per op family; each
 * runner draws fresh random inputs (the seed is printed; `--seed N` replays a run), runs the
 * forward and the backward on both backends and compares every output by normalised mean
 * squared error (sum (gpu - cpu)^2 / sum cpu^2); integer outputs must match exactly. Every
 * device buffer carries guard bytes on both sides (checked after each op: out-of-bounds
 * writes fail), overwritten outputs start poisoned with NaN (unwritten elements fail), and
 * any NaN in a GPU output fails. Accumulated (+=) gradients start from the same random
 * values on both sides, so accumulation is tested too.
 *
 * Operands are fp32, or of the types the model passes: bf16 under the bf16 recipe (TYPED
 * cases) and, per operand role, what a case sets (the mxfp8 recipe's bf16 residual and MXFP8
 * activations: e4m3 values and e8m0 scales in two guarded buffers, both poisoned when
 * written). The CPU gets fp32 inputs holding the same values; a typed output is compared with
 * the CPU's result as its type stores it (bf16 rounding; MXFP8 encoding, compared decoded).
 *
 * The matrix-product cases run a second time with measured algorithm choice (labels
 * "measured: ...", train.deterministic: false): each shape's cuBLASLt algorithm timed among
 * its candidates at the first call, the trials leaving operands and guards untouched.
 *
 *   gpu_test_backend_ops [--seed N] [--only NAME]   compare mode (ctest gpu.backend_ops)
 *   gpu_test_backend_ops --perf [--measured] [--only NAME]
 *       GPU timings of large cases, TFLOP/s or GB/s (--measured: algorithms chosen by timing)
 *
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpulib.h"
#include "gradcheck.h"
#include "moe/backend_cuda.h"
#include "moe/ops.h"
#include "testlib.h"

/* ------------------------------------------------------------------------------------------
 * random numbers (splitmix64), timing */

static uint64_t g_rng;

static uint64_t rng_next(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}
static int64_t rng_int(int64_t n) {
    return (int64_t)(rng_next() % (uint64_t)n);
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_backend_ops: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static float *frand(int64_t n, float lo, float hi) {
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = rng_uniform(lo, hi);
    return p;
}

/* ------------------------------------------------------------------------------------------
 * device buffers with guards */

#define GUARD 256 /* bytes on each side; keeps the data 256-byte aligned */
#define GUARD_BYTE 0xA5
#define MAX_BUFS 32

typedef struct dbuf {
    unsigned char *base;
    size_t bytes;
    const char *name;
    const char *part; /* "" or " scales" (the second buffer of an MXFP8 operand) */
} dbuf;

typedef struct gctx {
    const moe_backend *cpu, *gpu;
    dbuf bufs[MAX_BUFS];
    int nbufs;
    const char *label; /* current case, for messages */
    int fails;         /* failures in the current case */
    float *perf_src;   /* perf mode: a host block of random values, repeated into buffers */
} gctx;

/* Device copy of host (bytes), or poisoned with 0xFF (NaN floats) when host is NULL. */
static void *dup_dev(gctx *g, const char *name, const void *host, size_t bytes) {
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

static void *down(gctx *g, const void *dev, size_t bytes) {
    void *h = xmalloc(bytes);
    g->gpu->memcpy_d2h(g->gpu, h, dev, bytes);
    return h;
}

/* Synchronises (reporting any recorded CUDA error) and checks every guard. */
static void check_sync_guards(gctx *g, const char *after) {
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

static void free_bufs(gctx *g) {
    for (int i = 0; i < g->nbufs; i++)
        g->gpu->free(g->gpu, g->bufs[i].base);
    g->nbufs = 0;
}

/* ------------------------------------------------------------------------------------------
 * comparisons */

static double g_worst_nmse; /* over the whole run, for the summary */

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

static void cmp_f32(gctx *g, const char *what, const float *dev, const float *ref, int64_t n,
                    double tol) {
    float *h = down(g, dev, (size_t)n * sizeof(float));
    cmp_host(g, what, h, ref, n, tol);
    free(h);
}

static void cmp_i32(gctx *g, const char *what, const int32_t *dev, const int32_t *ref, int64_t n) {
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
static int same_bytes(gctx *g, const char *what, const void *dev, const void *ref, size_t bytes) {
    void *h = down(g, dev, bytes);
    int same = memcmp(h, ref, bytes) == 0;
    free(h);
    CHECK_MSG(same, "%s: %s differs from the CPU's bytes", g->label, what);
    if (!same) g->fails++;
    return same;
}

/* An accumulated (+=) output that equals its initial values would make a comparison
 * vacuous (both backends doing nothing agree): the reference must have changed most of it. */
static void check_changed(gctx *g, const char *what, const float *ref, const float *init, int64_t n,
                          double min_frac) {
    int64_t changed = 0;
    for (int64_t i = 0; i < n; i++)
        changed += ref[i] != init[i];
    CHECK_MSG((double)changed >= min_frac * (double)n,
              "%s %s: the reference changed only %lld of %lld values", g->label, what,
              (long long)changed, (long long)n);
}

static float *fdup(const float *x, int64_t n) {
    float *p = xmalloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

#define F(n) ((size_t)(n) * sizeof(float))
#define I32(n) ((size_t)(n) * sizeof(int32_t))

/* ------------------------------------------------------------------------------------------
 * cases */

/* The operand roles, as each runner reads them: ROLE_X the forward's activation input (matmul
 * and grouped x, rmsnorm x, permute x, swiglu a and b, add a); ROLE_Y the forward's output
 * (matmul and grouped y, rmsnorm out, permute xp, swiglu out, add out, embedding out); ROLE_DY
 * the backward's incoming gradient (grouped dy, swiglu dout); ROLE_DX the activation gradient
 * written (grouped dx under MOE_GRAD_SET, swiglu da and db). */
enum { ROLE_X, ROLE_Y, ROLE_DY, ROLE_DX };

/* tcase.types: TYPED, and the type of a role's operands where the case sets one (two bits a
 * role: the model's operands under mxfp8); the others take the runner's default, fp32 or
 * (TYPED) bf16. MXFP8: e4m3 values and an e8m0 scale per 32 (moe_buf_mxfp8). */
enum {
    TYPED = 1, /* the GPU's typed operands are bf16, as the model passes them under the bf16
                  recipe: weights as bf16 copies (cast_bf16 of them), expert activations in
                  bf16 (permute's xp, grouped in and out, swiglu in and out, unpermute's yp) */
    X_F32 = 1 << 1,
    X_BF16 = 2 << 1,
    X_MXFP8 = 3 << 1,
    Y_F32 = 1 << 3,
    Y_BF16 = 2 << 3,
    Y_MXFP8 = 3 << 3,
    DY_F32 = 1 << 5,
    DY_BF16 = 2 << 5,
    DY_MXFP8 = 3 << 5,
    DX_F32 = 1 << 7,
    DX_BF16 = 2 << 7,
    DX_MXFP8 = 3 << 7
};

typedef struct tcase {
    const char *name;
    moe_op op;
    int64_t s[7];
    moe_recipe prec;
    double tol; /* NMSE bound for float outputs */
    int types;  /* TYPED and role types (above); the CPU always gets fp32 inputs holding the
                   same values as the GPU's operands (bf16-rounded, MXFP8-encoded) */
} tcase;

/* x[i] = round_bf16(x[i]): the values a bf16 operand can hold, so both sides see them. */
static void round_host(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = moe_round_bf16(x[i]);
}

/* bf16 where a TYPED case makes the operand so, else fp32. */
static moe_dtype typed_dt(const tcase *tc) {
    return tc->types & TYPED ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
}

/* The type of case tc's operands of role `role`: the case's choice, or dflt (the runner's:
 * typed_dt for an operand that TYPED cases make bf16, fp32 for one they do not). MXFP8 is
 * MOE_DTYPE_E4M3 here: the harness's E4M3 activations always carry their scales. */
static moe_dtype role_dt(const tcase *tc, int role, moe_dtype dflt) {
    static const moe_dtype k_dt[4] = {MOE_DTYPE_F32, MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_E4M3};
    const int t = tc->types >> (1 + 2 * role) & 3;
    return t ? k_dt[t] : dflt;
}

/* The MXFP8 form of x [n] (n a multiple of 32) as the ops store it: each value's bf16 rounding
 * encoded 32 at a time (moe_mxfp8_encode_block), q [n] followed by the scales [n / 32] in one
 * malloc'ed block. */
static uint8_t *mx_encode(const float *x, int64_t n) {
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
static void as_stored(float *x, int64_t n, moe_dtype dt) {
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
static moe_buf dev_operand(gctx *g, moe_dtype dt, const char *name, const float *host, int64_t n) {
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
static double tol_stored(const tcase *tc, moe_dtype dt) {
    return dt == MOE_DTYPE_F32 ? tc->tol : fmax(tc->tol, 1e-5);
}

/* cmp_host of a typed device output [n] (bf16 widened, MXFP8 decoded) against the CPU's fp32
 * result as that type stores it (as_stored): an MXFP8 output differs from its fp32 value by
 * e4m3's rounding (nmse about 1e-3), which the GPU's output must reproduce, not be near. */
static void cmp_typed(gctx *g, const char *what, moe_buf dev, const float *ref, int64_t n,
                      double tol) {
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
 * weight, unit.ops checks that both give the same bits), or under fp8-block its e4m3 copies
 * from the GPU's quantize_weight (the CPU reads its own, cpu_weight), in new guarded buffers
 * (the scales' padding entries zero, as in the model's allocation). */
static moe_cbuf gpu_weight(gctx *g, const tcase *tc, const float *dw_, int64_t E, int64_t O,
                           int64_t I) {
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
static moe_cbuf cpu_weight(gctx *g, const tcase *tc, const float *w, int64_t E, int64_t O,
                           int64_t I) {
    return gc_weight(g->cpu, w, E, O, I, tc->prec);
}

typedef void (*runner_fn)(gctx *g, const tcase *tc);

/* Document masks of the attention and RoPE cases, chosen by s[5]: 0 none; 1 documents of the
 * lengths of k_doc_cycle in turn, row b starting at entry b (length-1 documents, boundaries on
 * the 32- and 64-row tile edges, documents longer than a tile and than several); 2 random
 * lengths, a third of them 1, the others in [2, 150]; 3 long documents: 2,200, 1 and 300 rows
 * in turn (key blocks that 2,000 queries see beside blocks that a few do). */
static const int64_t k_doc_cycle[] = {37, 1, 26, 64, 1, 128, 3, 90, 65, 1, 200};
static const int64_t k_doc_long[] = {2200, 1, 300};
enum { DOC_CYCLE = sizeof k_doc_cycle / sizeof k_doc_cycle[0] };

static int64_t next_doc_len(int64_t mode, int *at) {
    if (mode == 2) return rng_int(3) == 0 ? 1 : 2 + rng_int(149);
    if (mode == 3) return k_doc_long[(*at)++ % 3];
    int64_t len = k_doc_cycle[*at];
    *at = (*at + 1) % DOC_CYCLE;
    return len;
}

/* The op's doc_start [B, T] (host, malloc'ed) for mask mode `mode`; NULL for mode 0. */
static int32_t *doc_starts(int64_t B, int64_t T, int64_t mode) {
    if (!mode) return NULL;
    int32_t *ds = xmalloc(I32(B * T));
    for (int64_t b = 0; b < B; b++) {
        int at = (int)(b % DOC_CYCLE);
        int64_t start = 0, len = next_doc_len(mode, &at);
        for (int64_t t = 0; t < T; t++) {
            if (t - start == len) start = t, len = next_doc_len(mode, &at);
            ds[b * T + t] = (int32_t)start;
        }
    }
    return ds;
}

static void run_embedding(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1], V = tc->s[2];
    int32_t *tok = xmalloc(I32(N));
    for (int64_t i = 0; i < N; i++)
        tok[i] = (int32_t)rng_int(V);
    float *wte = frand(V * C, -1, 1), *out = xmalloc(F(N * C));
    g->cpu->embedding_forward(g->cpu, moe_buf_f32(out), tok, wte, N, C);
    int32_t *dtok = dup_dev(g, "tokens", tok, I32(N));
    float *dwte = dup_dev(g, "wte", wte, F(V * C));
    /* a bf16 out (the residual stream under mxfp8) holds the rounded rows: exactly */
    moe_buf dout = dev_operand(g, role_dt(tc, ROLE_Y, MOE_DTYPE_F32), "out", NULL, N * C);
    g->gpu->embedding_forward(g->gpu, dout, dtok, dwte, N, C);
    check_sync_guards(g, "embedding_forward");
    cmp_typed(g, "out", dout, out, N * C, tc->tol);
    float *gy = frand(N * C, -1, 1), *dw = frand(V * C, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(N * C)), *ddw = dup_dev(g, "dwte", dw, F(V * C));
    g->cpu->embedding_backward(g->cpu, dw, gy, tok, N, C, V);
    g->gpu->embedding_backward(g->gpu, ddw, dgy, dtok, N, C, V);
    check_sync_guards(g, "embedding_backward");
    cmp_f32(g, "dwte", ddw, dw, V * C, tc->tol);
    free(tok), free(wte), free(out), free(gy), free(dw);
}

static void run_rmsnorm(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1];
    float eps = 1e-5f;
    /* x: the residual stream, fp32 or (under mxfp8) bf16; out: ln1 MXFP8 or ln2 bf16 there */
    const moe_dtype xdt = role_dt(tc, ROLE_X, MOE_DTYPE_F32);
    const moe_recipe p16 = moe_recipe_unquantized(tc->prec); /* the norms', as the model says */
    float *x = frand(N * C, -2, 2), *w = frand(C, 0.5f, 1.5f);
    float *out = xmalloc(F(N * C)), *rstd = xmalloc(F(N));
    as_stored(x, N * C, xdt);
    g->cpu->rmsnorm_forward(g->cpu, moe_buf_f32(out), rstd, moe_cbuf_f32(x), w, N, C, eps, p16);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * C));
    float *dw_ = dup_dev(g, "w", w, F(C));
    moe_buf dout = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "out", NULL, N * C);
    float *drstd = dup_dev(g, "rstd", NULL, F(N));
    g->gpu->rmsnorm_forward(g->gpu, dout, drstd, dx_, dw_, N, C, eps, p16);
    check_sync_guards(g, "rmsnorm_forward");
    cmp_typed(g, "out", dout, out, N * C, tc->tol);
    cmp_f32(g, "rstd", drstd, rstd, N, tc->tol);
    float *gy = frand(N * C, -1, 1), *gx = frand(N * C, -1, 1), *gw = frand(C, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(N * C)), *dgx = dup_dev(g, "dx", gx, F(N * C));
    float *dgw = dup_dev(g, "dw", gw, F(C)), *drs = dup_dev(g, "rstd_ref", rstd, F(N));
    g->cpu->rmsnorm_backward(g->cpu, gx, gw, gy, moe_cbuf_f32(x), w, rstd, N, C);
    g->gpu->rmsnorm_backward(g->gpu, dgx, dgw, dgy, dx_, dw_, drs, N, C);
    check_sync_guards(g, "rmsnorm_backward");
    cmp_f32(g, "dx", dgx, gx, N * C, tc->tol);
    cmp_f32(g, "dw", dgw, gw, C, tc->tol);
    free(x), free(w), free(out), free(rstd), free(gy), free(gx), free(gw);
}

/* s: B, T, NH, D, theta, document mode, p0 (the forward's first position) */
static void run_rope(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], NH = tc->s[2], D = tc->s[3], p0 = tc->s[6];
    double theta = (double)tc->s[4];
    int64_t n = B * T * NH * D;
    float *x = frand(n, -1, 1);
    as_stored(x, n, typed_dt(tc));
    moe_buf dx_ = dev_operand(g, typed_dt(tc), "x", x, n);
    int32_t *pos = doc_starts(B, T, tc->s[5]), *dpos = NULL; /* positions inside documents */
    for (int64_t i = 0; pos && i < B * T; i++)
        pos[i] = (int32_t)(i % T) - pos[i];
    if (pos) dpos = dup_dev(g, "pos", pos, I32(B * T));
    g->cpu->rope_forward(g->cpu, moe_buf_f32(x), pos, p0, B, T, NH, D, theta);
    g->gpu->rope_forward(g->gpu, dx_, dpos, p0, B, T, NH, D, theta);
    check_sync_guards(g, "rope_forward");
    cmp_typed(g, "x (fwd)", dx_, x, n, tc->tol);
    float *gx = frand(n, -1, 1);
    float *dgx = dup_dev(g, "dx", gx, F(n));
    g->cpu->rope_backward(g->cpu, gx, pos, B, T, NH, D, theta);
    g->gpu->rope_backward(g->gpu, dgx, dpos, B, T, NH, D, theta);
    check_sync_guards(g, "rope_backward");
    cmp_f32(g, "dx (bwd)", dgx, gx, n, tc->tol);
    free(x), free(gx), free(pos);
}

/* The document starts [B, T] of the last T of Tk positions (doc_starts over Tk), or NULL. */
static int32_t *doc_starts_last(int64_t B, int64_t T, int64_t Tk, int64_t mode) {
    int32_t *all = doc_starts(B, Tk, mode);
    if (!all || Tk == T) return all;
    int32_t *ds = xmalloc(I32(B * T));
    for (int64_t b = 0; b < B; b++)
        memcpy(ds + b * T, all + b * Tk + (Tk - T), I32(T));
    free(all);
    return ds;
}

/* s: B, T, H, KV, D, document mode, P: the queries continue P cached keys (Tk = P + T
 * keys; the forward only, as the model's scoring runs it) */
static void run_attention(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], H = tc->s[2], KV = tc->s[3], D = tc->s[4];
    int64_t Tk = T + tc->s[6], nq = B * T * H * D, nk = B * Tk * KV * D;
    float *q = frand(nq, -2, 2), *k = frand(nk, -2, 2), *v = frand(nk, -1, 1);
    as_stored(q, nq, typed_dt(tc)), as_stored(k, nk, typed_dt(tc)), as_stored(v, nk, typed_dt(tc));
    float *out = xmalloc(F(nq)), *lse = xmalloc(F(B * H * T));
    int32_t *ds = doc_starts_last(B, T, Tk, tc->s[5]);
    const int32_t *dds = ds ? dup_dev(g, "doc_start", ds, I32(B * T)) : NULL;
    g->cpu->attention_forward(g->cpu, moe_buf_f32(out), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                              moe_cbuf_f32(v), ds, B, T, Tk, H, KV, D, tc->prec);
    moe_cbuf dq_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "q", q, nq));
    moe_cbuf dk_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "k", k, nk));
    moe_cbuf dv_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "v", v, nk));
    moe_buf dout = dev_operand(g, typed_dt(tc), "out", NULL, nq);
    float *dlse = dup_dev(g, "lse", NULL, F(B * H * T));
    g->gpu->attention_forward(g->gpu, dout, dlse, dq_, dk_, dv_, dds, B, T, Tk, H, KV, D, tc->prec);
    check_sync_guards(g, "attention_forward");
    cmp_typed(g, "out", dout, out, nq, tc->tol);
    cmp_f32(g, "lse", dlse, lse, B * H * T, tc->tol);
    if (Tk > T) { /* cached keys: a forward only */
        free(q), free(k), free(v), free(out), free(lse), free(ds);
        return;
    }
    /* backward from the CPU's forward results, so both sides see the same out and lse */
    float *gy = frand(nq, -1, 1), *gq = frand(nq, -1, 1), *gk = frand(nk, -1, 1);
    float *gv = frand(nk, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(nq)), *dgq = dup_dev(g, "dq", gq, F(nq));
    float *dgk = dup_dev(g, "dk", gk, F(nk)), *dgv = dup_dev(g, "dv", gv, F(nk));
    moe_cbuf dor = moe_cbuf_from(dev_operand(g, typed_dt(tc), "out_ref", out, nq));
    float *dlr = dup_dev(g, "lse_ref", lse, F(B * H * T));
    float *gq0 = fdup(gq, nq), *gk0 = fdup(gk, nk);
    g->cpu->attention_backward(g->cpu, gq, gk, gv, gy, moe_cbuf_f32(q), moe_cbuf_f32(k),
                               moe_cbuf_f32(v), moe_cbuf_f32(out), lse, ds, B, T, H, KV, D,
                               tc->prec, MOE_GRAD_ADD);
    g->gpu->attention_backward(g->gpu, dgq, dgk, dgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_ADD);
    check_sync_guards(g, "attention_backward");
    check_changed(g, "dq", gq, gq0, nq, 0.9);
    check_changed(g, "dk", gk, gk0, nk, 0.9);
    free(gq0), free(gk0);
    cmp_f32(g, "dq", dgq, gq, nq, tc->tol);
    cmp_f32(g, "dk", dgk, gk, nk, tc->tol);
    cmp_f32(g, "dv", dgv, gv, nk, tc->tol);
    /* written gradients (MOE_GRAD_SET) into NaN-poisoned buffers, which must not be read */
    g->cpu->attention_backward(g->cpu, gq, gk, gv, gy, moe_cbuf_f32(q), moe_cbuf_f32(k),
                               moe_cbuf_f32(v), moe_cbuf_f32(out), lse, ds, B, T, H, KV, D,
                               tc->prec, MOE_GRAD_SET);
    float *sgq = dup_dev(g, "dq (SET)", NULL, F(nq)), *sgk = dup_dev(g, "dk (SET)", NULL, F(nk));
    float *sgv = dup_dev(g, "dv (SET)", NULL, F(nk));
    g->gpu->attention_backward(g->gpu, sgq, sgk, sgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_SET);
    check_sync_guards(g, "attention_backward SET");
    cmp_f32(g, "dq (SET)", sgq, gq, nq, tc->tol);
    cmp_f32(g, "dk (SET)", sgk, gk, nk, tc->tol);
    cmp_f32(g, "dv (SET)", sgv, gv, nk, tc->tol);
    /* deterministic: the same call again gives the same bits (the Hopper kernel adds each
     * block's share of dq in a fixed order) */
    float *rgq = dup_dev(g, "dq (again)", NULL, F(nq));
    float *rgk = dup_dev(g, "dk (again)", NULL, F(nk)),
          *rgv = dup_dev(g, "dv (again)", NULL, F(nk));
    g->gpu->attention_backward(g->gpu, rgq, rgk, rgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_SET);
    check_sync_guards(g, "attention_backward again");
    const float *pairs[3][2] = {{sgq, rgq}, {sgk, rgk}, {sgv, rgv}};
    const int64_t lens[3] = {nq, nk, nk};
    for (int j = 0; j < 3; j++) {
        float *x = down(g, pairs[j][0], F(lens[j])), *y = down(g, pairs[j][1], F(lens[j]));
        int same = memcmp(x, y, F(lens[j])) == 0;
        printf("  %-28s %-16s repeat %s\n", g->label,
               j == 0   ? "dq"
               : j == 1 ? "dk"
                        : "dv",
               same ? "identical" : "DIFFERS");
        CHECK_MSG(same, "%s: two backward runs differ (not deterministic)", g->label);
        free(x), free(y);
    }
    free(q), free(k), free(v), free(out), free(lse), free(gy), free(gq), free(gk), free(gv);
    free(ds);
}

/* Under mxfp8, x [R, I], w [E, O, I] and dy [R, O] of a product spread over 2^+-16: x[r, i] *=
 * a_r b_i, w[e, o, i] /= b_i c_o, dy[r, o] *= c_o / a_r, powers of two a per row, b per input
 * and c per output in [2^-8, 2^8]. Each product then sums terms of one size along its
 * reduction while a block of an operand spans up to 2^16 (values 2^14 below a block's largest
 * round to e4m3 subnormals or zero), so a product quantizing along the wrong dimension, or in
 * blocks that cross an expert's first row, changes its sums visibly. Uniform values would give
 * almost every block of 32 one power-of-two scale, and e4m3 rounds a normal value the same
 * under any of them: quantized in any blocks, or not at all, they would give the same values. */
static void mx_spread(const tcase *tc, float *x, float *w, float *dy, int64_t R, int64_t E,
                      int64_t I, int64_t O) {
    if (moe_recipe_format(tc->prec) != MOE_RECIPE_MXFP8) return;
    float *a = xmalloc(F(R + I + O)), *b = a + R, *c = b + I;
    for (int64_t j = 0; j < R + I + O; j++)
        a[j] = ldexpf(1.0f, (int)rng_int(17) - 8);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < I; i++)
            x[r * I + i] *= a[r] * b[i];
        for (int64_t o = 0; o < O; o++)
            dy[r * O + o] *= c[o] / a[r];
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < I; i++)
                w[(e * O + o) * I + i] /= b[i] * c[o];
    free(a);
}

static void run_matmul(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], I = tc->s[1], O = tc->s[2];
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc));
    float *x = frand(N * I, -1, 1), *w = frand(O * I, -1, 1), *gy = frand(N * O, -1, 1);
    float *y = xmalloc(F(N * O));
    mx_spread(tc, x, w, gy, N, 1, I, O);
    as_stored(x, N * I, xdt);
    moe_cbuf cw = cpu_weight(g, tc, w, 1, O, I);
    g->cpu->matmul_forward(g->cpu, moe_buf_f32(y), moe_cbuf_f32(x), cw, N, I, O, tc->prec);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * I));
    float *dw_ = dup_dev(g, "w", w, F(O * I));
    moe_buf dy_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "y", NULL, N * O);
    moe_cbuf gw_ = gpu_weight(g, tc, dw_, 1, O, I);
    g->gpu->matmul_forward(g->gpu, dy_, dx_, gw_, N, I, O, tc->prec);
    check_sync_guards(g, "matmul_forward");
    cmp_typed(g, "y", dy_, y, N * O, tc->tol);
    float *gx = frand(N * I, -1, 1), *gw = frand(O * I, -1, 1);
    float *dgy = dup_dev(g, "dy", gy, F(N * O)), *dgx = dup_dev(g, "dx", gx, F(N * I));
    float *dgw = dup_dev(g, "dw", gw, F(O * I));
    float *gx0 = fdup(gx, N * I), *gw0 = fdup(gw, O * I);
    g->cpu->matmul_backward(g->cpu, gx, gw, gy, moe_cbuf_f32(x), cw, N, I, O, tc->prec,
                            MOE_GRAD_ADD, MOE_GRAD_ADD);
    check_changed(g, "dx", gx, gx0, N * I, 0.9);
    check_changed(g, "dw", gw, gw0, O * I, 0.9);
    free(gx0), free(gw0);
    g->gpu->matmul_backward(g->gpu, dgx, dgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_ADD,
                            MOE_GRAD_ADD);
    check_sync_guards(g, "matmul_backward");
    cmp_f32(g, "dx", dgx, gx, N * I, tc->tol);
    cmp_f32(g, "dw", dgw, gw, O * I, tc->tol);
    /* dx NULL (first layer): only dw accumulates again */
    g->cpu->matmul_backward(g->cpu, NULL, gw, gy, moe_cbuf_f32(x), cw, N, I, O, tc->prec,
                            MOE_GRAD_ADD, MOE_GRAD_ADD);
    g->gpu->matmul_backward(g->gpu, NULL, dgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_ADD,
                            MOE_GRAD_ADD);
    check_sync_guards(g, "matmul_backward dx=NULL");
    cmp_f32(g, "dw (dx NULL)", dgw, gw, O * I, tc->tol);
    /* written gradients (MOE_GRAD_SET): into NaN-poisoned buffers, which must not be read */
    g->cpu->matmul_backward(g->cpu, gx, gw, gy, moe_cbuf_f32(x), cw, N, I, O, tc->prec,
                            MOE_GRAD_SET, MOE_GRAD_SET);
    float *sgx = dup_dev(g, "dx (SET)", NULL, F(N * I)),
          *sgw = dup_dev(g, "dw (SET)", NULL, F(O * I));
    g->gpu->matmul_backward(g->gpu, sgx, sgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_SET,
                            MOE_GRAD_SET);
    check_sync_guards(g, "matmul_backward SET");
    cmp_f32(g, "dx (SET)", sgx, gx, N * I, tc->tol);
    cmp_f32(g, "dw (SET)", sgw, gw, O * I, tc->tol);
    free(x), free(w), free(y), free(gy), free(gx), free(gw);
    gc_weight_free(cw);
}

/* router logits with well-separated values per row, so no near-ties make top-k ambiguous */
static float *router_logits(int64_t N, int64_t E) {
    float *z = xmalloc(F(N * E));
    int64_t *perm = xmalloc((size_t)E * sizeof(int64_t));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t e = 0; e < E; e++)
            perm[e] = e;
        for (int64_t e = E - 1; e > 0; e--) {
            int64_t j = rng_int(e + 1), t = perm[e];
            perm[e] = perm[j], perm[j] = t;
        }
        for (int64_t e = 0; e < E; e++)
            z[n * E + e] = 4.0f * (float)perm[e] / (float)E - 2.0f + rng_uniform(-0.01f, 0.01f);
    }
    free(perm);
    return z;
}

static void run_router(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], E = tc->s[1], K = tc->s[2];
    float *z = router_logits(N, E);
    float *p = xmalloc(F(N * E)), *lse = xmalloc(F(N)), *tw = xmalloc(F(N * K));
    float *st = xmalloc(F(E + 2));
    int32_t *ti = xmalloc(I32(N * K)), *cnt = xmalloc(I32(E));
    g->cpu->router_forward(g->cpu, p, lse, ti, tw, cnt, st, z, N, E, K);
    float *dz_ = dup_dev(g, "logits", z, F(N * E)), *dp = dup_dev(g, "probs", NULL, F(N * E));
    float *dl = dup_dev(g, "lse", NULL, F(N)), *dtw = dup_dev(g, "topk_w", NULL, F(N * K));
    float *dst = dup_dev(g, "stats", NULL, F(E + 2));
    int32_t *dti = dup_dev(g, "topk_idx", NULL, I32(N * K)),
            *dcnt = dup_dev(g, "counts", NULL, I32(E));
    g->gpu->router_forward(g->gpu, dp, dl, dti, dtw, dcnt, dst, dz_, N, E, K);
    check_sync_guards(g, "router_forward");
    cmp_f32(g, "probs", dp, p, N * E, tc->tol);
    cmp_f32(g, "lse", dl, lse, N, tc->tol);
    cmp_i32(g, "topk_idx", dti, ti, N * K);
    cmp_f32(g, "topk_w", dtw, tw, N * K, tc->tol);
    cmp_i32(g, "counts", dcnt, cnt, E);
    cmp_f32(g, "stats", dst, st, E + 2, tc->tol);
    float *gtw = frand(N * K, -1, 1), *gprob = frand(E, -0.1f, 0.1f), *gz = frand(N * E, -1, 1);
    float dzc = 0.3f;
    float *dgtw = dup_dev(g, "dtopk_w", gtw, F(N * K)), *dgp = dup_dev(g, "dprob", gprob, F(E));
    float *dgz = dup_dev(g, "dlogits", gz, F(N * E));
    float *dpr = dup_dev(g, "probs_ref", p, F(N * E)), *dlr = dup_dev(g, "lse_ref", lse, F(N));
    float *dtwr = dup_dev(g, "topk_w_ref", tw, F(N * K));
    int32_t *dtir = dup_dev(g, "topk_idx_ref", ti, I32(N * K));
    g->cpu->router_backward(g->cpu, gz, gtw, gprob, dzc, p, lse, ti, tw, N, E, K);
    g->gpu->router_backward(g->gpu, dgz, dgtw, dgp, dzc, dpr, dlr, dtir, dtwr, N, E, K);
    check_sync_guards(g, "router_backward");
    cmp_f32(g, "dlogits", dgz, gz, N * E, tc->tol);
    /* dprob NULL */
    g->cpu->router_backward(g->cpu, gz, gtw, NULL, dzc, p, lse, ti, tw, N, E, K);
    g->gpu->router_backward(g->gpu, dgz, dgtw, NULL, dzc, dpr, dlr, dtir, dtwr, N, E, K);
    check_sync_guards(g, "router_backward dprob=NULL");
    cmp_f32(g, "dlogits (dprob 0)", dgz, gz, N * E, tc->tol);
    free(z), free(p), free(lse), free(tw), free(st), free(ti), free(cnt), free(gtw), free(gprob);
    free(gz);
}

/* topk_idx with K distinct experts per token */
static int32_t *random_topk(int64_t N, int64_t E, int64_t K) {
    int32_t *ti = xmalloc(I32(N * K));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)rng_int(E);
                dup = 0;
                for (int64_t j = 0; j < k; j++)
                    dup |= ti[n * K + j] == e;
            } while (dup);
            ti[n * K + k] = e;
        }
    return ti;
}

static void run_permute(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1], E = tc->s[2], K = tc->s[3], M = N * K;
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc));
    int32_t *ti = random_topk(N, E, K);
    float *x = frand(N * C, -1, 1), *xp = xmalloc(F(M * C));
    as_stored(x, N * C, xdt);
    int32_t *rs = xmalloc(I32(M)), *sr = xmalloc(I32(M)), *off = xmalloc(I32(E + 1));
    g->cpu->permute_forward(g->cpu, moe_buf_f32(xp), rs, sr, off, moe_cbuf_f32(x), ti, N, C, E, K);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * C));
    moe_buf dxp = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "xp", NULL, M * C);
    int32_t *dti = dup_dev(g, "topk_idx", ti, I32(M)), *drs = dup_dev(g, "row_src", NULL, I32(M));
    int32_t *dsr = dup_dev(g, "slot_row", NULL, I32(M)),
            *doff = dup_dev(g, "offsets", NULL, I32(E + 1));
    g->gpu->permute_forward(g->gpu, dxp, drs, dsr, doff, dx_, dti, N, C, E, K);
    check_sync_guards(g, "permute_forward");
    cmp_typed(g, "xp", dxp, xp, M * C, tc->tol);
    if (dxp.mx) { /* rows of the same bf16 values, encoded by one rule: the CPU's very bytes */
        uint8_t *q = mx_encode(xp, M * C);
        int same = same_bytes(g, "xp e4m3 values", dxp.p, q, (size_t)(M * C));
        same &= same_bytes(g, "xp scales", dxp.mx, q + M * C, (size_t)(M * C / 32));
        printf("  %-28s %-16s n=%-9lld values and scales %s %s\n", g->label, "xp bytes",
               (long long)(M * C), same ? "identical" : "DIFFER", same ? "ok" : "FAIL");
        free(q);
    }
    cmp_i32(g, "row_src", drs, rs, M);
    cmp_i32(g, "slot_row", dsr, sr, M);
    cmp_i32(g, "offsets", doff, off, E + 1);
    float *gxp = frand(M * C, -1, 1), *gx = frand(N * C, -1, 1);
    float *dgxp = dup_dev(g, "dxp", gxp, F(M * C)), *dgx = dup_dev(g, "dx", gx, F(N * C));
    int32_t *dsrr = dup_dev(g, "slot_row_ref", sr, I32(M));
    g->cpu->permute_backward(g->cpu, gx, gxp, sr, N, C, K, MOE_GRAD_ADD);
    g->gpu->permute_backward(g->gpu, dgx, dgxp, dsrr, N, C, K, MOE_GRAD_ADD);
    check_sync_guards(g, "permute_backward");
    cmp_f32(g, "dx", dgx, gx, N * C, tc->tol);
    float *sgx = dup_dev(g, "dx (SET)", NULL, F(N * C)); /* written: poisoned, never read */
    g->cpu->permute_backward(g->cpu, gx, gxp, sr, N, C, K, MOE_GRAD_SET);
    g->gpu->permute_backward(g->gpu, sgx, dgxp, dsrr, N, C, K, MOE_GRAD_SET);
    check_sync_guards(g, "permute_backward SET");
    cmp_f32(g, "dx (SET)", sgx, gx, N * C, tc->tol);
    /* unpermute with the same routing */
    float *tw = frand(N * K, 0, 1), *yp = frand(M * C, -1, 1), *y = xmalloc(F(N * C));
    as_stored(yp, M * C, typed_dt(tc));
    g->cpu->unpermute_forward(g->cpu, y, moe_cbuf_f32(yp), tw, sr, N, C, K);
    float *dtw = dup_dev(g, "topk_w", tw, F(N * K));
    moe_cbuf dyp = moe_cbuf_from(dev_operand(g, typed_dt(tc), "yp", yp, M * C));
    float *dy = dup_dev(g, "y", NULL, F(N * C));
    g->gpu->unpermute_forward(g->gpu, dy, dyp, dtw, dsrr, N, C, K);
    check_sync_guards(g, "unpermute_forward");
    cmp_f32(g, "unpermute y", dy, y, N * C, tc->tol);
    float *gy = frand(N * C, -1, 1), *gyp = frand(M * C, -1, 1), *gtw = frand(N * K, -1, 1);
    as_stored(gyp, M * C, typed_dt(tc));
    float *dgy = dup_dev(g, "dy", gy, F(N * C));
    moe_buf dgyp = dev_operand(g, typed_dt(tc), "dyp", gyp, M * C);
    float *dgtw = dup_dev(g, "dtopk_w", gtw, F(N * K));
    g->cpu->unpermute_backward(g->cpu, moe_buf_f32(gyp), gtw, gy, moe_cbuf_f32(yp), tw, sr, N, C, K,
                               MOE_GRAD_ADD);
    g->gpu->unpermute_backward(g->gpu, dgyp, dgtw, dgy, dyp, dtw, dsrr, N, C, K, MOE_GRAD_ADD);
    check_sync_guards(g, "unpermute_backward");
    cmp_typed(g, "unpermute dyp", dgyp, gyp, M * C, tol_stored(tc, dgyp.dt));
    cmp_f32(g, "unpermute dtopk_w", dgtw, gtw, N * K, tc->tol);
    moe_buf sgyp = dev_operand(g, typed_dt(tc), "dyp (SET)", NULL, M * C); /* written: poisoned */
    float *sgtw = dup_dev(g, "dtopk_w (SET)", NULL, F(N * K));
    g->cpu->unpermute_backward(g->cpu, moe_buf_f32(gyp), gtw, gy, moe_cbuf_f32(yp), tw, sr, N, C, K,
                               MOE_GRAD_SET);
    g->gpu->unpermute_backward(g->gpu, sgyp, sgtw, dgy, dyp, dtw, dsrr, N, C, K, MOE_GRAD_SET);
    check_sync_guards(g, "unpermute_backward SET");
    cmp_typed(g, "unpermute dyp (SET)", sgyp, gyp, M * C, tol_stored(tc, sgyp.dt));
    cmp_f32(g, "unpermute dtopk_w (SET)", sgtw, gtw, N * K, tc->tol);
    /* in place, as the model runs it: dyp over yp */
    moe_buf iyp = dev_operand(g, typed_dt(tc), "yp (in place)", yp, M * C);
    g->gpu->unpermute_backward(g->gpu, iyp, sgtw, dgy, moe_cbuf_from(iyp), dtw, dsrr, N, C, K,
                               MOE_GRAD_SET);
    check_sync_guards(g, "unpermute_backward in place");
    cmp_typed(g, "unpermute dyp (in place)", iyp, gyp, M * C, tol_stored(tc, iyp.dt));
    cmp_f32(g, "unpermute dtopk_w (in place)", sgtw, gtw, N * K, tc->tol);
    free(ti), free(x), free(xp), free(rs), free(sr), free(off), free(gxp), free(gx), free(tw);
    free(yp), free(y), free(gy), free(gyp), free(gtw);
}

static void run_grouped(gctx *g, const tcase *tc) {
    int64_t E = tc->s[0], I = tc->s[1], O = tc->s[2], avg = tc->s[3];
    int32_t *off = xmalloc(I32(E + 1));
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) /* expert 1 gets no rows: its weight grad stays as is */
        off[e + 1] = off[e] + (e == 1 ? 0 : (int32_t)(avg / 2 + rng_int(avg + 1)));
    int64_t M = off[E];
    /* under mxfp8 x is MXFP8 (xe, g), y MXFP8 (h1, h3) or bf16 (ye), dy MXFP8 (dh1, dh3) or
     * bf16 (dye), a written dx bf16 (dg) or fp32 (dxe); the accumulated dx stays fp32 */
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc)),
                    dydt = role_dt(tc, ROLE_DY, typed_dt(tc));
    const moe_dtype dxdt = role_dt(tc, ROLE_DX, MOE_DTYPE_F32);
    float *x = frand(M * I, -1, 1), *w = frand(E * O * I, -1, 1), *gy = frand(M * O, -1, 1);
    float *y = xmalloc(F(M * O));
    mx_spread(tc, x, w, gy, M, E, I, O);
    as_stored(x, M * I, xdt);
    moe_cbuf cw = cpu_weight(g, tc, w, E, O, I);
    g->cpu->grouped_matmul_forward(g->cpu, moe_buf_f32(y), moe_cbuf_f32(x), cw, off, E, I, O,
                                   tc->prec);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, M * I));
    float *dw_ = dup_dev(g, "w", w, F(E * O * I));
    moe_buf dy_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "y", NULL, M * O);
    moe_cbuf gw_ = gpu_weight(g, tc, dw_, E, O, I);
    g->gpu->grouped_matmul_forward(g->gpu, dy_, dx_, gw_, off, E, I, O, tc->prec);
    check_sync_guards(g, "grouped_matmul_forward");
    cmp_typed(g, "y", dy_, y, M * O, tc->tol);
    float *gx = frand(M * I, -1, 1), *gw = frand(E * O * I, -1, 1);
    as_stored(gy, M * O, dydt);
    moe_cbuf dgy = moe_cbuf_from(dev_operand(g, dydt, "dy", gy, M * O));
    float *dgx = dup_dev(g, "dx", gx, F(M * I));
    float *dgw = dup_dev(g, "dw", gw, F(E * O * I));
    float *gx0 = fdup(gx, M * I), *gw0 = fdup(gw, E * O * I);
    g->cpu->grouped_matmul_backward(g->cpu, moe_buf_f32(gx), gw, moe_cbuf_f32(gy), moe_cbuf_f32(x),
                                    cw, off, E, I, O, tc->prec, MOE_GRAD_ADD, MOE_GRAD_ADD);
    g->gpu->grouped_matmul_backward(g->gpu, moe_buf_f32(dgx), dgw, dgy, dx_, gw_, off, E, I, O,
                                    tc->prec, MOE_GRAD_ADD, MOE_GRAD_ADD);
    check_sync_guards(g, "grouped_matmul_backward");
    check_changed(g, "dx", gx, gx0, M * I, 0.9);
    /* expert 1 has no rows: its weight gradient must stay exactly as it was */
    check_changed(g, "dw", gw, gw0, E * O * I, 0.9 * (double)(E - 1) / (double)E);
    float *gw1 = down(g, dgw + O * I, F(O * I));
    CHECK_MSG(memcmp(gw1, gw0 + O * I, F(O * I)) == 0,
              "%s: the weight gradient of an expert with no rows changed", g->label);
    free(gw1), free(gx0), free(gw0);
    cmp_f32(g, "dx", dgx, gx, M * I, tc->tol);
    cmp_f32(g, "dw", dgw, gw, E * O * I, tc->tol);
    /* written gradients (MOE_GRAD_SET) into poisoned buffers: expert 1's dw becomes zeros */
    g->cpu->grouped_matmul_backward(g->cpu, moe_buf_f32(gx), gw, moe_cbuf_f32(gy), moe_cbuf_f32(x),
                                    cw, off, E, I, O, tc->prec, MOE_GRAD_SET, MOE_GRAD_SET);
    moe_buf sgx = dev_operand(g, dxdt, "dx (SET)", NULL, M * I);
    float *sgw = dup_dev(g, "dw (SET)", NULL, F(E * O * I));
    g->gpu->grouped_matmul_backward(g->gpu, sgx, sgw, dgy, dx_, gw_, off, E, I, O, tc->prec,
                                    MOE_GRAD_SET, MOE_GRAD_SET);
    check_sync_guards(g, "grouped_matmul_backward SET");
    float *sw1 = down(g, sgw + O * I, F(O * I));
    int zeros = 1;
    for (int64_t i = 0; i < O * I; i++)
        zeros &= sw1[i] == 0.0f;
    CHECK_MSG(zeros, "%s: SET left the weight gradient of an expert with no rows unzeroed",
              g->label);
    free(sw1);
    cmp_typed(g, "dx (SET)", sgx, gx, M * I, tol_stored(tc, dxdt));
    cmp_f32(g, "dw (SET)", sgw, gw, E * O * I, tc->tol);
    /* the model's w2 backward: the weight gradient alone (dx NULL), then dx alone (dw NULL) */
    moe_buf ogx = dev_operand(g, dxdt, "dx (dx only)", NULL, M * I);
    float *ogw = dup_dev(g, "dw (dw only)", NULL, F(E * O * I));
    g->gpu->grouped_matmul_backward(g->gpu, moe_buf_f32(NULL), ogw, dgy, dx_, gw_, off, E, I, O,
                                    tc->prec, MOE_GRAD_SET, MOE_GRAD_SET);
    g->gpu->grouped_matmul_backward(g->gpu, ogx, NULL, dgy, dx_, gw_, off, E, I, O, tc->prec,
                                    MOE_GRAD_SET, MOE_GRAD_SET);
    check_sync_guards(g, "grouped_matmul_backward dw only, dx only");
    cmp_typed(g, "dx (dx only)", ogx, gx, M * I, tol_stored(tc, dxdt));
    cmp_f32(g, "dw (dw only)", ogw, gw, E * O * I, tc->tol);
    free(off), free(x), free(w), free(y), free(gy), free(gx), free(gw);
    gc_weight_free(cw);
}

static void run_swiglu(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    /* a, b and out: h1, h3 and g (MXFP8 under mxfp8); dout: dg (fp32, or bf16 under mxfp8);
     * da, db: dh1, dh3 (of h1's type where the model writes them over h1 and h3) */
    const moe_dtype adt = role_dt(tc, ROLE_X, typed_dt(tc)),
                    gdt = role_dt(tc, ROLE_DY, MOE_DTYPE_F32);
    const moe_dtype ddt = role_dt(tc, ROLE_DX, typed_dt(tc));
    const moe_recipe p16 = moe_recipe_unquantized(tc->prec); /* SwiGLU's, as the model says */
    float *a = frand(n, -4, 4), *b = frand(n, -2, 2), *o = xmalloc(F(n));
    as_stored(a, n, adt), as_stored(b, n, adt);
    g->cpu->swiglu_forward(g->cpu, moe_buf_f32(o), moe_cbuf_f32(a), moe_cbuf_f32(b), n, p16);
    moe_cbuf da_ = moe_cbuf_from(dev_operand(g, adt, "a", a, n));
    moe_cbuf db_ = moe_cbuf_from(dev_operand(g, adt, "b", b, n));
    moe_buf do_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "out", NULL, n);
    g->gpu->swiglu_forward(g->gpu, do_, da_, db_, n, p16);
    check_sync_guards(g, "swiglu_forward");
    cmp_typed(g, "out", do_, o, n, tc->tol);
    float *gy = frand(n, -1, 1), *ga = xmalloc(F(n)), *gb = xmalloc(F(n));
    as_stored(gy, n, gdt);
    moe_cbuf dgy = moe_cbuf_from(dev_operand(g, gdt, "dout", gy, n));
    /* written, not accumulated: poisoned */
    moe_buf dga = dev_operand(g, ddt, "da", NULL, n), dgb = dev_operand(g, ddt, "db", NULL, n);
    g->cpu->swiglu_backward(g->cpu, moe_buf_f32(ga), moe_buf_f32(gb), moe_cbuf_f32(gy),
                            moe_cbuf_f32(a), moe_cbuf_f32(b), n);
    g->gpu->swiglu_backward(g->gpu, dga, dgb, dgy, da_, db_, n);
    check_sync_guards(g, "swiglu_backward");
    cmp_typed(g, "da", dga, ga, n, tol_stored(tc, ddt));
    cmp_typed(g, "db", dgb, gb, n, tol_stored(tc, ddt));
    /* in place, as the model runs it: da over a, db over b */
    moe_buf ia = dev_operand(g, adt, "a (in place)", a, n),
            ib = dev_operand(g, adt, "b (in place)", b, n);
    g->gpu->swiglu_backward(g->gpu, ia, ib, dgy, moe_cbuf_from(ia), moe_cbuf_from(ib), n);
    check_sync_guards(g, "swiglu_backward in place");
    cmp_typed(g, "da (in place)", ia, ga, n, tol_stored(tc, adt));
    cmp_typed(g, "db (in place)", ib, gb, n, tol_stored(tc, adt));
    free(a), free(b), free(o), free(gy), free(ga), free(gb);
}

/* pool: random ranges per row, including a range of one position and one reaching the end */
static void run_pool(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], C = tc->s[2];
    float *x = frand(B * T * C, -3, 3), *o = xmalloc(F(B * C));
    int32_t *range = xmalloc(I32(2 * B));
    for (int64_t b = 0; b < B; b++) {
        int64_t first = b == 0 ? 0 : rng_int(T), cnt = b == 1 ? 1 : 1 + rng_int(T - first);
        if (b == 2) first = T - 5, cnt = 5;
        range[2 * b] = (int32_t)first, range[2 * b + 1] = (int32_t)cnt;
    }
    float *dx = dup_dev(g, "x", x, F(B * T * C));
    int32_t *dr = dup_dev(g, "range", range, I32(2 * B));
    for (int max = 0; max <= 1; max++) {
        float *dout = dup_dev(g, max ? "out_max" : "out_mean", NULL, F(B * C));
        g->cpu->pool_forward(g->cpu, o, x, range, B, T, C, max);
        g->gpu->pool_forward(g->gpu, dout, dx, dr, B, T, C, max);
        check_sync_guards(g, "pool_forward");
        cmp_f32(g, max ? "max" : "mean", dout, o, B * C, max ? 0.0 : tc->tol);
    }
    free(x), free(o), free(range);
}

static void run_xent(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], V = tc->s[1];
    int use_w = tc->s[2] != 0;
    float *z = frand(N * V, -5, 5), *w = use_w ? frand(N, 0, 2) : NULL;
    int32_t *t = xmalloc(I32(N));
    for (int64_t i = 0; i < N; i++)
        t[i] = rng_int(7) == 0 ? -1 : (int32_t)rng_int(V);
    float *loss = xmalloc(F(N)), *lse = xmalloc(F(N));
    g->cpu->cross_entropy_forward(g->cpu, loss, lse, z, t, w, N, V);
    float *dz_ = dup_dev(g, "logits", z, F(N * V)),
          *dw_ = use_w ? dup_dev(g, "weights", w, F(N)) : NULL;
    int32_t *dt = dup_dev(g, "targets", t, I32(N));
    float *dloss = dup_dev(g, "loss", NULL, F(N)), *dlse = dup_dev(g, "lse", NULL, F(N));
    g->gpu->cross_entropy_forward(g->gpu, dloss, dlse, dz_, dt, dw_, N, V);
    check_sync_guards(g, "cross_entropy_forward");
    cmp_f32(g, "loss", dloss, loss, N, tc->tol);
    cmp_f32(g, "lse", dlse, lse, N, tc->tol);
    float dl = 0.7f;
    float *gz = xmalloc(F(N * V));
    g->cpu->cross_entropy_backward(g->cpu, gz, z, lse, t, w, dl, N, V);
    float *dlr = dup_dev(g, "lse_ref", lse, F(N)), *dgz = dup_dev(g, "dlogits", NULL, F(N * V));
    g->gpu->cross_entropy_backward(g->gpu, dgz, dz_, dlr, dt, dw_, dl, N, V);
    check_sync_guards(g, "cross_entropy_backward");
    cmp_f32(g, "dlogits", dgz, gz, N * V, tc->tol);
    /* in place: dlogits aliases logits */
    g->gpu->cross_entropy_backward(g->gpu, dz_, dz_, dlr, dt, dw_, dl, N, V);
    check_sync_guards(g, "cross_entropy_backward in place");
    cmp_f32(g, "dlogits in place", dz_, gz, N * V, tc->tol);
    free(z), free(w), free(t), free(loss), free(lse), free(gz);
}

/* a and out: the residual stream, fp32 or bf16 (one fp32 sum on both sides, so a bf16 out
 * holds exactly the CPU's sum rounded); in place where they share a type */
static void run_add(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    const moe_dtype adt = role_dt(tc, ROLE_X, MOE_DTYPE_F32),
                    odt = role_dt(tc, ROLE_Y, MOE_DTYPE_F32);
    float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *o = xmalloc(F(n));
    as_stored(a, n, adt);
    g->cpu->add(g->cpu, moe_buf_f32(o), moe_cbuf_f32(a), b, n);
    moe_buf da_ = dev_operand(g, adt, "a", a, n), do_ = dev_operand(g, odt, "out", NULL, n);
    float *db_ = dup_dev(g, "b", b, F(n));
    g->gpu->add(g->gpu, do_, moe_cbuf_from(da_), db_, n);
    check_sync_guards(g, "add");
    cmp_typed(g, "out", do_, o, n, tc->tol);
    if (adt == odt) { /* out aliases a (a residual add) */
        g->gpu->add(g->gpu, da_, moe_cbuf_from(da_), db_, n);
        check_sync_guards(g, "add in place");
        cmp_typed(g, "out (aliased)", da_, o, n, tc->tol);
    }
    free(a), free(b), free(o);
}

/* Host copy of x [n] in type dt (F32, or the BF16 codes of values the caller rounded). */
static void *host_typed(const float *x, int64_t n, moe_dtype dt) {
    void *h = xmalloc((size_t)n * moe_dtype_size(dt));
    if (dt == MOE_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)h)[i] = moe_f32_to_bf16(x[i]);
    else
        memcpy(h, x, F(n));
    return h;
}

/* AdamW with its bf16 copy, three steps over different ranges so that every path of the
 * kernel runs: the whole array (16-byte vectors and a scalar tail), [1, n) (a scalar head
 * first), and the moments shifted by one element against the weights (no vectors at all);
 * then cast_bf16. The copy must be exactly the rounded new weight. Typed cases: bf16 moments
 * (optim.moments bf16), for which the GPU must compute the CPU's bytes: weights, copies and
 * both moments identical after every step (fp32 moments: within tol, the GPU fusing
 * multiply-adds). */
static void run_adamw(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    moe_dtype mdt = typed_dt(tc);
    size_t mbytes = (size_t)n * moe_dtype_size(mdt);
    float *p = frand(n, -1, 1), *gr = frand(n, -1, 1), *m0 = frand(n, -0.1f, 0.1f);
    float *v0 = frand(n, 0, 0.01f);
    as_stored(m0, n, mdt), as_stored(v0, n, mdt);
    moe_buf m = moe_buf_of(host_typed(m0, n, mdt), mdt),
            v = moe_buf_of(host_typed(v0, n, mdt), mdt);
    uint16_t *p16 = xmalloc((size_t)n * sizeof(uint16_t));
    float *dp = dup_dev(g, "param", p, F(n)), *dg = dup_dev(g, "grad", gr, F(n));
    moe_buf dm = dev_operand(g, mdt, "m", m0, n), dv = dev_operand(g, mdt, "v", v0, n);
    uint16_t *dp16 = dup_dev(g, "param16", NULL, (size_t)n * sizeof(uint16_t));
    const int64_t at[3] = {0, 1, 0}, shift[3] = {0, 0, 1}, len[3] = {n, n - 1, n - 1};
    int exact = 1;
    for (int64_t step = 1; step <= 3; step++) {
        int64_t a = at[step - 1], sh = shift[step - 1], ln = len[step - 1];
        g->cpu->adamw(g->cpu, p + a, p16 + a, gr + a, moe_buf_at(m, a + sh), moe_buf_at(v, a + sh),
                      ln, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
        g->gpu->adamw(g->gpu, dp + a, dp16 + a, dg + a, moe_buf_at(dm, a + sh),
                      moe_buf_at(dv, a + sh), ln, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
        check_sync_guards(g, "adamw");
        float *hp = down(g, dp, F(n));
        uint16_t *h16 = down(g, dp16, (size_t)n * sizeof(uint16_t));
        int64_t bad = 0;
        for (int64_t i = a; i < a + ln; i++)
            bad += h16[i] != moe_f32_to_bf16(hp[i]);
        CHECK_MSG(bad == 0, "%s step %lld: %lld bf16 copies differ from the rounded weight",
                  g->label, (long long)step, (long long)bad);
        free(hp), free(h16);
        if (mdt == MOE_DTYPE_BF16) {
            exact &= same_bytes(g, "param", dp, p, F(n));
            exact &= same_bytes(g, "param16", dp16 + a, p16 + a, (size_t)ln * sizeof(uint16_t));
            exact &= same_bytes(g, "m", dm.p, m.p, mbytes);
            exact &= same_bytes(g, "v", dv.p, v.p, mbytes);
        }
    }
    if (mdt == MOE_DTYPE_BF16) {
        printf("  %-28s %-16s n=%-9lld param, copy, m, v after 3 steps %s %s\n", g->label,
               "bf16 moments", (long long)n, exact ? "identical" : "DIFFER", exact ? "ok" : "FAIL");
    } else {
        cmp_f32(g, "param", dp, p, n, tc->tol);
        cmp_f32(g, "m", dm.p, m.p, n, tc->tol);
        cmp_f32(g, "v", dv.p, v.p, n, tc->tol);
    }
    /* cast_bf16: bit-exact against the CPU's */
    uint16_t *c16 = dup_dev(g, "cast", NULL, (size_t)n * sizeof(uint16_t));
    g->gpu->cast_bf16(g->gpu, c16, dg, n);
    g->cpu->cast_bf16(g->cpu, p16, gr, n);
    check_sync_guards(g, "cast_bf16");
    uint16_t *h16 = down(g, c16, (size_t)n * sizeof(uint16_t));
    CHECK_MSG(memcmp(h16, p16, (size_t)n * sizeof(uint16_t)) == 0, "%s: cast_bf16 differs",
              g->label);
    free(h16), free(p), free(gr), free(m0), free(v0), free(m.p), free(v.p), free(p16);
}

/* AdamW and then the fp8-block copies of the new weight w [E, O, I], as moe_model_adamw runs
 * them: the GPU's new master against the CPU's (NMSE, as the adamw cases), and the GPU's
 * copies byte for byte against the CPU's quantize_weight of the GPU's new master (row-wise
 * and transposed values, both scale layouts; the scales' padding zero on both sides). A tile
 * of zeros that stays zero (scale 1), two outliers and the special values planted before the
 * copies exercise the scale rule's and the conversion's edges. */
static void run_adamw_fp8(gctx *g, const tcase *tc) {
    int64_t E = tc->s[0], O = tc->s[1], I = tc->s[2], n = E * O * I;
    int64_t ns = moe_fp8_weight_scales(E, O, I);
    float *p = frand(n, -1, 1), *gr = frand(n, -1, 1), *m = frand(n, -0.1f, 0.1f);
    float *v = frand(n, 0, 0.01f);
    for (int64_t r = 0; r < 128 && r < O; r++) /* expert 0's first tile: zeros, no gradient */
        for (int64_t k = 0; k < 128 && k < I; k++)
            p[r * I + k] = gr[r * I + k] = m[r * I + k] = v[r * I + k] = 0.0f;
    p[n / 2] = 300.0f, p[n - 1] = -1e4f;
    float *zeros = calloc((size_t)ns, sizeof(float));
    float *dp = dup_dev(g, "param", p, F(n)), *dg = dup_dev(g, "grad", gr, F(n));
    float *dm = dup_dev(g, "m", m, F(n)), *dv = dup_dev(g, "v", v, F(n));
    uint8_t *dq = dup_dev(g, "e4m3 copies", NULL, (size_t)(2 * n));
    float *ds = dup_dev(g, "scales", zeros, F(ns));
    g->cpu->adamw(g->cpu, p, NULL, gr, moe_buf_f32(m), moe_buf_f32(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                  0.1f, 1, 0.5f);
    g->gpu->adamw(g->gpu, dp, NULL, dg, moe_buf_f32(dm), moe_buf_f32(dv), n, 1e-3f, 0.9f, 0.95f,
                  1e-8f, 0.1f, 1, 0.5f);
    check_sync_guards(g, "adamw");
    cmp_f32(g, "param", dp, p, n, tc->tol);
    /* the master as the copies see it, with values AdamW does not make: the last tile of the
     * last expert only NaN, +-Inf and zeros (amax 0: scale 1), and elsewhere subnormals, -0,
     * FLT_MAX and a NaN beside ordinary values */
    float *hp = down(g, dp, F(n));
    const int same_master = memcmp(hp, p, F(n)) == 0;
    static const float k_nonfinite[] = {NAN, INFINITY, -INFINITY, -NAN, 0.0f};
    for (int64_t r = (O - 1) / 128 * 128; r < O; r++)
        for (int64_t k = (I - 1) / 128 * 128; k < I; k++)
            hp[((E - 1) * O + r) * I + k] = k_nonfinite[(r + k) % 5];
    static const float k_odd[] = {1e-40f, -1e-42f, -0.0f, FLT_MAX, NAN, -3e-39f};
    for (int j = 0; j < 6; j++)
        hp[n / 3 + 5 * j] = k_odd[j];
    g->gpu->memcpy_h2d(g->gpu, dp, hp, F(n));
    g->gpu->quantize_weight(g->gpu, dq, ds, dp, E, O, I, tc->prec);
    check_sync_guards(g, "quantize_weight");
    float *hs = down(g, ds, F(ns));
    uint8_t *hq = down(g, dq, (size_t)(2 * n)), *cq = xmalloc((size_t)(2 * n));
    g->cpu->quantize_weight(g->cpu, cq, zeros, hp, E, O, I, tc->prec);
    int same_q = memcmp(hq, cq, (size_t)(2 * n)) == 0, same_s = memcmp(hs, zeros, F(ns)) == 0;
    printf("  %-28s %-16s n=%-9lld values %s scales %s (master %s) %s\n", g->label, "fp8 copies",
           (long long)n, same_q ? "identical" : "DIFFER", same_s ? "identical" : "DIFFER",
           same_master ? "bit-identical" : "within tol", same_q && same_s ? "ok" : "FAIL");
    CHECK_MSG(same_q && same_s, "%s: the GPU's fp8 copies differ from the CPU's quantize(master)",
              g->label);
    free(p), free(gr), free(m), free(v), free(zeros), free(hp), free(hs), free(hq), free(cq);
}

static void run_sum_squares(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    float *x = frand(n, -3, 3);
    float *dx_ = dup_dev(g, "x", x, F(n));
    double c = g->cpu->sum_squares(g->cpu, x, n), d = g->gpu->sum_squares(g->gpu, dx_, n);
    double d2 = g->gpu->sum_squares(g->gpu, dx_, n);
    check_sync_guards(g, "sum_squares");
    double rel = fabs(d - c) / c;
    printf("  %-28s %-16s n=%-9lld rel.err=%.3e tol=%.0e repeat=%s %s\n", g->label, "sum",
           (long long)n, rel, tc->tol, d == d2 ? "identical" : "DIFFERS",
           rel <= tc->tol && d == d2 ? "ok" : "FAIL");
    CHECK_MSG(rel <= tc->tol, "%s: sum of squares %.17g vs cpu %.17g", g->label, d, c);
    CHECK_MSG(d == d2, "%s: two runs differ: %.17g vs %.17g (not deterministic)", g->label, d, d2);
    free(x);
}

static runner_fn runner_for(moe_op op) {
    switch (op) {
    case MOE_OP_EMBEDDING:
        return run_embedding;
    case MOE_OP_RMSNORM:
        return run_rmsnorm;
    case MOE_OP_ROPE:
        return run_rope;
    case MOE_OP_ATTENTION:
        return run_attention;
    case MOE_OP_MATMUL:
        return run_matmul;
    case MOE_OP_ROUTER:
        return run_router;
    case MOE_OP_PERMUTE:
        return run_permute; /* also runs unpermute with the same routing */
    case MOE_OP_UNPERMUTE:
        return run_permute;
    case MOE_OP_GROUPED_MATMUL:
        return run_grouped;
    case MOE_OP_SWIGLU:
        return run_swiglu;
    case MOE_OP_CROSS_ENTROPY:
        return run_xent;
    case MOE_OP_ADD:
        return run_add;
    case MOE_OP_ADAMW:
        return run_adamw; /* also runs cast_bf16 */
    case MOE_OP_CAST:
        return run_adamw;
    case MOE_OP_QUANTIZE:
        return run_adamw_fp8;
    case MOE_OP_SUM_SQUARES:
        return run_sum_squares;
    case MOE_OP_POOL:
        return run_pool;
    default:
        return NULL;
    }
}

#define FP32 MOE_RECIPE_FP32
#define BF16 MOE_RECIPE_BF16
#define FP8B MOE_RECIPE_FP8_BLOCK
#define FP8P MOE_RECIPE_FP8_BLOCK_POW2
/* mxfp8: on a GPU whose cuBLASLt multiplies MXFP8 (be->mx_native, sm_100+) the product cases
 * with I and O multiples of 128 run the native products, the others the bf16 form that sm_90
 * runs for all (gemm_cublaslt.cu) */
#define MX8 MOE_RECIPE_MXFP8
#define MX8F MOE_RECIPE_MXFP8_FLOOR

/* Tolerances: fp32 ops differ only in libm ulps and summation order (measured <= 2e-13);
 * bf16 outputs can round the other way at a boundary (measured <= 1.5e-9, attention's
 * bf16 probabilities and score gradients included: <= 8e-9 on an H200, 2026-11-29).
 * Attention's bf16 cases allow 4e-6: the Hopper forward (kernels/sm90) walks 128-key blocks
 * where the CPU reference walks 64, so its probabilities round at other running maxima
 * (measured <= 9.0e-7 for out, 2026-12-01; a wrong kernel gives 1e-3 and more).
 * mxfp8 (1e-5): both sides multiply the same quantized values (MXFP8 inputs made here, fp32
 * weights and bf16 operands quantized per call by the same rule), so the products differ in
 * the fp32 sums' order only: a bf16 output may round the other way at a boundary and an MXFP8
 * one then move by an e4m3 step (estimated nmse <= 1e-6; quantizing a wrong way: 1e-3). */
static const tcase k_cases[] = {
    {"embedding N1000 C256 V300", MOE_OP_EMBEDDING, {1000, 256, 300}, FP32, 1e-12, 0},
    {"embedding N4000 C128 V5 (DNA)", MOE_OP_EMBEDDING, {4000, 128, 5}, FP32, 1e-12, 0},
    {"embedding N500 C64 V3000", MOE_OP_EMBEDDING, {500, 64, 3000}, FP32, 1e-12, 0},
    /* the bf16 residual stream of mxfp8 training (its first value; C100: a scalar tail) */
    {"embedding N1000 C256 V300 mxfp8 bf16-out",
     MOE_OP_EMBEDDING,
     {1000, 256, 300},
     MX8,
     1e-12,
     Y_BF16},
    {"embedding N333 C100 V64 mxfp8 bf16-out",
     MOE_OP_EMBEDDING,
     {333, 100, 64},
     MX8,
     1e-12,
     Y_BF16},
    {"rmsnorm N513 C1024 fp32", MOE_OP_RMSNORM, {513, 1024}, FP32, 1e-10, 0},
    {"rmsnorm N300 C320 bf16", MOE_OP_RMSNORM, {300, 320}, BF16, 1e-6, 0},
    {"rmsnorm N300 C320 bf16 typed", MOE_OP_RMSNORM, {300, 320}, BF16, 1e-6, 1},
    /* rows of a length that is not a multiple of 8: the one-element path of the vectorised
     * elementwise kernels (every other case here moves 8 elements at a time) */
    {"rmsnorm N200 C100 fp32", MOE_OP_RMSNORM, {200, 100}, FP32, 1e-10, 0},
    {"rmsnorm N200 C100 bf16 typed", MOE_OP_RMSNORM, {200, 100}, BF16, 1e-6, 1},
    /* under mxfp8: the bf16 residual in, ln1 out as MXFP8 (compared decoded) or ln2 as bf16 */
    {"rmsnorm N300 C320 mxfp8 bf16-in mx-out",
     MOE_OP_RMSNORM,
     {300, 320},
     MX8,
     1e-5,
     X_BF16 | Y_MXFP8},
    {"rmsnorm N513 C1024 mxfp8 bf16-in mx-out",
     MOE_OP_RMSNORM,
     {513, 1024},
     MX8,
     1e-5,
     X_BF16 | Y_MXFP8},
    {"rmsnorm N300 C320 mxfp8 bf16-in bf16-out",
     MOE_OP_RMSNORM,
     {300, 320},
     MX8,
     1e-5,
     X_BF16 | Y_BF16},
    {"rope B2 T100 NH6 D64", MOE_OP_ROPE, {2, 100, 6, 64, 10000}, FP32, 1e-10, 0},
    {"rope B1 T300 NH2 D128 1e6", MOE_OP_ROPE, {1, 300, 2, 128, 1000000}, FP32, 1e-10, 0},
    /* bf16 storage rounds the rotated values (the CPU's fp32 ones rounded to compare with) */
    {"rope B1 T300 NH2 D128 typed", MOE_OP_ROPE, {1, 300, 2, 128, 1000000}, BF16, 1e-5, 1},
    {"rope docs B2 T333 NH4 D64", MOE_OP_ROPE, {2, 333, 4, 64, 10000, 1}, FP32, 1e-10, 0},
    {"rope docs B2 T300 NH2 D128 typed", MOE_OP_ROPE, {2, 300, 2, 128, 1000000, 2}, BF16, 1e-5, 1},
    {"rope B2 T50 NH3 D20", MOE_OP_ROPE, {2, 50, 3, 20, 10000}, FP32, 1e-10, 0},
    {"rope B2 T50 NH3 D20 typed", MOE_OP_ROPE, {2, 50, 3, 20, 10000}, BF16, 1e-5, 1},
    {"rope p0 B2 T100 NH2 D128 typed",
     MOE_OP_ROPE,
     {2, 100, 2, 128, 1000000, 0, 8000},
     BF16,
     1e-5,
     1},
    {"attn B2 T200 H8 KV2 D64", MOE_OP_ATTENTION, {2, 200, 8, 2, 64}, BF16, 4e-6, 0},
    {"attn B1 T333 H4 KV4 D128", MOE_OP_ATTENTION, {1, 333, 4, 4, 128}, BF16, 4e-6, 0},
    {"attn B1 T333 H4 KV2 D128 typed", MOE_OP_ATTENTION, {1, 333, 4, 2, 128}, BF16, 4e-6, 1},
    {"attn B2 T200 H8 KV2 D64 typed", MOE_OP_ATTENTION, {2, 200, 8, 2, 64}, BF16, 4e-6, 1},
    {"attn B1 T1024 H4 KV1 D128", MOE_OP_ATTENTION, {1, 1024, 4, 1, 128}, BF16, 4e-6, 0},
    {"attn B3 T77 H4 KV2 D16", MOE_OP_ATTENTION, {3, 77, 4, 2, 16}, BF16, 4e-6, 0},
    {"attn fp32 B2 T150 H4 KV2 D64", MOE_OP_ATTENTION, {2, 150, 4, 2, 64}, FP32, 1e-10, 0},
    {"attn fp32 B1 T70 H3 KV1 D40", MOE_OP_ATTENTION, {1, 70, 3, 1, 40}, FP32, 1e-10, 0},
    {"attn B1 T130 H2 KV1 D32", MOE_OP_ATTENTION, {1, 130, 2, 1, 32}, BF16, 4e-6, 0},
    {"attn B1 T257 H6 KV3 D96", MOE_OP_ATTENTION, {1, 257, 6, 3, 96}, BF16, 4e-6, 0},
    /* document masks (s[5], doc_starts): T not a multiple of the tiles, length-1 documents,
     * boundaries on tile edges, key blocks skipped before long documents */
    {"attn docs B2 T333 H4 KV2 D64", MOE_OP_ATTENTION, {2, 333, 4, 2, 64, 1}, BF16, 4e-6, 0},
    {"attn docs B2 T333 H4 KV2 D128 ty", MOE_OP_ATTENTION, {2, 333, 4, 2, 128, 1}, BF16, 4e-6, 1},
    {"attn docs B1 T1024 H4 KV1 D128", MOE_OP_ATTENTION, {1, 1024, 4, 1, 128, 1}, BF16, 4e-6, 0},
    {"attn docs B3 T200 H8 KV2 D64 rand", MOE_OP_ATTENTION, {3, 200, 8, 2, 64, 2}, BF16, 4e-6, 0},
    {"attn docs B3 T77 H4 KV2 D16 rand", MOE_OP_ATTENTION, {3, 77, 4, 2, 16, 2}, BF16, 4e-6, 0},
    {"attn docs B1 T257 H6 KV3 D96", MOE_OP_ATTENTION, {1, 257, 6, 3, 96, 1}, BF16, 4e-6, 0},
    {"attn docs B2 T130 H2 KV1 D32", MOE_OP_ATTENTION, {2, 130, 2, 1, 32, 1}, BF16, 4e-6, 0},
    /* GQA 4 without a mask above 2,048 tokens (the Hopper backward: a block per query head),
     * long documents */
    {"attn B1 T2300 H4 KV1 D64", MOE_OP_ATTENTION, {1, 2300, 4, 1, 64}, BF16, 4e-6, 0},
    {"attn docs B2 T2400 H4 KV2 D128 long",
     MOE_OP_ATTENTION,
     {2, 2400, 4, 2, 128, 3},
     BF16,
     4e-6,
     0},
    /* more query tiles (128 rows of one head) than an H200 has SMs: a persistent forward
     * block walks several, with and without documents and cached keys */
    {"attn docs B4 T700 H12 KV4 D64 rand tiles",
     MOE_OP_ATTENTION,
     {4, 700, 12, 4, 64, 2},
     BF16,
     4e-6,
     0},
    {"attn cache B4 T400+200 H16 KV4 D128 tiles",
     MOE_OP_ATTENTION,
     {4, 400, 16, 4, 128, 0, 200},
     BF16,
     4e-6,
     1},
    {"attn fp32 docs B2 T150 H4 KV2 D64", MOE_OP_ATTENTION, {2, 150, 4, 2, 64, 1}, FP32, 1e-10, 0},
    {"attn fp32 docs B2 T90 H3 KV1 D40", MOE_OP_ATTENTION, {2, 90, 3, 1, 40, 2}, FP32, 1e-10, 0},
    /* cached keys (s[6] = P: the queries are the last T of P + T positions), as scoring's
     * continued windows run them: the wgmma kernel (D64, D128), the portable one, fp32 */
    {"attn cache B2 T100+300 H8 KV2 D128 ty",
     MOE_OP_ATTENTION,
     {2, 100, 8, 2, 128, 0, 300},
     BF16,
     4e-6,
     1},
    {"attn cache B1 T64+200 H4 KV1 D64",
     MOE_OP_ATTENTION,
     {1, 64, 4, 1, 64, 0, 200},
     BF16,
     4e-6,
     0},
    {"attn cache B2 T77+130 H4 KV2 D32",
     MOE_OP_ATTENTION,
     {2, 77, 4, 2, 32, 0, 130},
     BF16,
     4e-6,
     0},
    {"attn cache docs B2 T150+183 H4 KV2 D128",
     MOE_OP_ATTENTION,
     {2, 150, 4, 2, 128, 1, 183},
     BF16,
     4e-6,
     0},
    {"attn fp32 cache B2 T50+100 H3 KV1 D40",
     MOE_OP_ATTENTION,
     {2, 50, 3, 1, 40, 0, 100},
     FP32,
     1e-10,
     0},
    {"matmul N512 I384 O640 fp32", MOE_OP_MATMUL, {512, 384, 640}, FP32, 1e-10, 0},
    {"matmul N512 I384 O640 bf16", MOE_OP_MATMUL, {512, 384, 640}, BF16, 1e-6, 0},
    {"matmul N77 I200 O130 bf16", MOE_OP_MATMUL, {77, 200, 130}, BF16, 1e-6, 0},
    {"matmul N77 I200 O130 bf16 typed", MOE_OP_MATMUL, {77, 200, 130}, BF16, 1e-6, 1},
    {"matmul N512 I384 O640 bf16 typed", MOE_OP_MATMUL, {512, 384, 640}, BF16, 1e-6, 1},
    /* fp8-block against the CPU emulation: the same quantized values (quant_fp8.cu makes the
     * bytes of moe/quant.h), so only the fp32 sums' order and the bf16 rounding of forward
     * outputs differ. Shapes: partial 128-blocks and tiles, fp32 and bf16 inputs. */
    {"matmul N512 I384 O640 fp8", MOE_OP_MATMUL, {512, 384, 640}, FP8B, 1e-5, 0},
    {"matmul N77 I208 O144 fp8 typed", MOE_OP_MATMUL, {77, 208, 144}, FP8B, 1e-5, 1},
    {"matmul N300 I64 O32 fp8 typed", MOE_OP_MATMUL, {300, 64, 32}, FP8B, 1e-5, 1},
    {"matmul N77 I208 O144 fp8 pow2 typed", MOE_OP_MATMUL, {77, 208, 144}, FP8P, 1e-5, 1},
    /* mxfp8 against the CPU emulation: the q/k/v projections (x MXFP8 ln1, y bf16), the
     * o-projection (x bf16, y fp32) and I208 (a bf16 x: rows ending in a block of 16); N not a
     * multiple of 32 (the weight gradient's blocks along N end short), O32 (one block for
     * dgrad's rows), the floor rule (the MXFP8 x quantized again under it) */
    {"matmul N300 I256 O384 mxfp8 mx-in",
     MOE_OP_MATMUL,
     {300, 256, 384},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"matmul N77 I128 O96 mxfp8 mx-in", MOE_OP_MATMUL, {77, 128, 96}, MX8, 1e-5, X_MXFP8 | Y_BF16},
    {"matmul N1000 I256 O32 mxfp8 mx-in",
     MOE_OP_MATMUL,
     {1000, 256, 32},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"matmul N300 I384 O256 mxfp8 bf16-in f32-out",
     MOE_OP_MATMUL,
     {300, 384, 256},
     MX8,
     1e-5,
     X_BF16 | Y_F32},
    {"matmul N77 I208 O144 mxfp8 bf16-in",
     MOE_OP_MATMUL,
     {77, 208, 144},
     MX8,
     1e-5,
     X_BF16 | Y_BF16},
    {"matmul N300 I256 O384 mxfp8-floor mx-in",
     MOE_OP_MATMUL,
     {300, 256, 384},
     MX8F,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"router N1000 E8 K2", MOE_OP_ROUTER, {1000, 8, 2}, FP32, 1e-10, 0},
    {"router N300 E64 K6", MOE_OP_ROUTER, {300, 64, 6}, FP32, 1e-10, 0},
    {"permute N1000 C96 E8 K2", MOE_OP_PERMUTE, {1000, 96, 8, 2}, FP32, 1e-12, 0},
    {"permute N1000 C96 E8 K2 typed", MOE_OP_PERMUTE, {1000, 96, 8, 2}, BF16, 1e-12, 1},
    {"permute N3000 C40 E64 K4", MOE_OP_PERMUTE, {3000, 40, 64, 4}, FP32, 1e-12, 0},
    {"permute N500 C36 E8 K2 typed", MOE_OP_PERMUTE, {500, 36, 8, 2}, BF16, 1e-12, 1},
    /* mxfp8: xp MXFP8 from the bf16 ln2 (the same bytes as the CPU's); unpermute on bf16 */
    {"permute N1000 C96 E8 K2 mxfp8 mx-out",
     MOE_OP_PERMUTE,
     {1000, 96, 8, 2},
     MX8,
     1e-12,
     TYPED | Y_MXFP8},
    {"permute N700 C256 E6 K2 mxfp8 mx-out",
     MOE_OP_PERMUTE,
     {700, 256, 6, 2},
     MX8,
     1e-12,
     TYPED | Y_MXFP8},
    {"grouped E8 I256 O384 fp32", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, FP32, 1e-10, 0},
    {"grouped E8 I256 O384 bf16", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, BF16, 1e-6, 0},
    {"grouped E4 I72 O40 bf16", MOE_OP_GROUPED_MATMUL, {4, 72, 40, 33}, BF16, 1e-6, 0},
    {"grouped E4 I72 O40 bf16 typed", MOE_OP_GROUPED_MATMUL, {4, 72, 40, 33}, BF16, 1e-6, 1},
    {"grouped E8 I256 O384 bf16 typed", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, BF16, 1e-6, 1},
    {"grouped E8 I256 O384 fp8 typed", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, FP8B, 1e-5, 1},
    {"grouped E4 I80 O48 fp8 typed", MOE_OP_GROUPED_MATMUL, {4, 80, 48, 33}, FP8B, 1e-5, 1},
    {"grouped E6 I128 O272 fp8", MOE_OP_GROUPED_MATMUL, {6, 128, 272, 300}, FP8B, 1e-5, 0},
    {"grouped E4 I80 O48 fp8 pow2 typed", MOE_OP_GROUPED_MATMUL, {4, 80, 48, 33}, FP8P, 1e-5, 1},
    /* the grouped fp8 kernel's stage ring (4 stages at 128 x 256 tiles) wrapping: inside a
     * tile (5 K blocks of 128 both ways), and from tile to tile of a block's walk (about 200
     * tiles for 132 SMs) */
    {"grouped E4 I640 O640 fp8 typed", MOE_OP_GROUPED_MATMUL, {4, 640, 640, 200}, FP8B, 1e-5, 1},
    {"grouped E8 I640 O1280 fp8", MOE_OP_GROUPED_MATMUL, {8, 640, 1280, 600}, FP8B, 1e-5, 0},
    /* mxfp8 as the model runs the experts of hidden 256 (128), width 384 (96): w1/w3 (x xe,
     * y h1, dy dh1 all MXFP8; dx dxe fp32), w2 (x g MXFP8, y ye and dy dye bf16, dx dg bf16
     * written); each expert's rows their own blocks along the tokens in the weight gradient:
     * uneven counts, an expert of none, and experts shorter than one block (s[3] 20) */
    {"grouped E6 I256 O384 mxfp8 mx-in mx-out",
     MOE_OP_GROUPED_MATMUL,
     {6, 256, 384, 100},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_F32},
    {"grouped E6 I384 O256 mxfp8 mx-in bf16-out",
     MOE_OP_GROUPED_MATMUL,
     {6, 384, 256, 100},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16 | DY_BF16 | DX_BF16},
    {"grouped E8 I128 O96 mxfp8 mx-in mx-out",
     MOE_OP_GROUPED_MATMUL,
     {8, 128, 96, 70},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_BF16},
    {"grouped E8 I96 O128 mxfp8 mx-in bf16-out",
     MOE_OP_GROUPED_MATMUL,
     {8, 96, 128, 70},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16 | DY_BF16 | DX_BF16},
    {"grouped E4 I256 O384 mxfp8 mx short experts",
     MOE_OP_GROUPED_MATMUL,
     {4, 256, 384, 20},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_F32},
    {"swiglu n100003 fp32", MOE_OP_SWIGLU, {100003}, FP32, 1e-10, 0},
    {"swiglu n100003 bf16", MOE_OP_SWIGLU, {100003}, BF16, 1e-6, 0},
    {"swiglu n100003 bf16 typed", MOE_OP_SWIGLU, {100003}, BF16, 1e-6, 1},
    {"swiglu n100000 fp32", MOE_OP_SWIGLU, {100000}, FP32, 1e-10, 0},
    {"swiglu n100000 bf16 typed", MOE_OP_SWIGLU, {100000}, BF16, 1e-6, 1},
    /* mxfp8: h1, h3 and g MXFP8, dg bf16, dh1 and dh3 MXFP8 (also over h1 and h3) */
    {"swiglu n100000 mxfp8 mx",
     MOE_OP_SWIGLU,
     {100000},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_BF16 | DX_MXFP8},
    {"swiglu n96032 mxfp8 mx",
     MOE_OP_SWIGLU,
     {96032},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_BF16 | DX_MXFP8},
    {"swiglu n4096 mxfp8 mx f32-dout",
     MOE_OP_SWIGLU,
     {4096},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_F32 | DX_MXFP8},
    {"xent N300 V1000 weights", MOE_OP_CROSS_ENTROPY, {300, 1000, 1}, FP32, 1e-10, 0},
    {"xent N257 V256", MOE_OP_CROSS_ENTROPY, {257, 256, 0}, FP32, 1e-10, 0},
    {"add n12345", MOE_OP_ADD, {12345}, FP32, 0.0, 0},
    {"add n12344", MOE_OP_ADD, {12344}, FP32, 0.0, 0},
    /* the bf16 residual of mxfp8 training (in place), and its last read into fp32 */
    {"add n12344 mxfp8 bf16 residual", MOE_OP_ADD, {12344}, MX8, 0.0, X_BF16 | Y_BF16},
    {"add n12345 mxfp8 bf16-in f32-out", MOE_OP_ADD, {12345}, MX8, 0.0, X_BF16 | Y_F32},
    {"adamw n10007 3 steps", MOE_OP_ADAMW, {10007}, FP32, 1e-10, 0},
    {"adamw n10007 3 steps bf16 m v", MOE_OP_ADAMW, {10007}, FP32, 0.0, 1},
    /* AdamW then the fp8-block copies: edge tiles (272 = 2 x 128 + 16, 144), experts, pow2 */
    {"adamw fp8 E3 O272 I144", MOE_OP_QUANTIZE, {3, 272, 144}, FP8B, 1e-10, 0},
    {"adamw fp8 pow2 E1 O384 I656", MOE_OP_QUANTIZE, {1, 384, 656}, FP8P, 1e-10, 0},
    {"sum_squares n1000003", MOE_OP_SUM_SQUARES, {1000003}, FP32, 1e-12, 0},
    {"pool B9 T300 C200", MOE_OP_POOL, {9, 300, 200}, FP32, 1e-13, 0},
    {"pool B3 T4100 C2048", MOE_OP_POOL, {3, 4100, 2048}, FP32, 1e-13, 0},
};
enum { NCASES = sizeof k_cases / sizeof k_cases[0] };

/* The sizes supports() sees for a case (the fields its op reads; the rest 0). */
static moe_op_dims tcase_dims(const tcase *tc) {
    moe_op_dims d;
    memset(&d, 0, sizeof d);
    const int64_t *s = tc->s;
    switch (tc->op) {
    case MOE_OP_ATTENTION:
        d.B = s[0], d.T = s[1], d.H = s[2], d.KV = s[3], d.D = s[4];
        break;
    case MOE_OP_ROPE:
        d.B = s[0], d.T = s[1], d.H = s[2], d.D = s[3];
        break;
    case MOE_OP_ROUTER:
        d.B = 1, d.T = s[0], d.E = s[1], d.K = s[2];
        break;
    case MOE_OP_PERMUTE:
        d.B = 1, d.T = s[0], d.C = s[1], d.E = s[2], d.K = s[3];
        break;
    case MOE_OP_MATMUL: /* as an attention projection C -> H*D */
        d.B = 1, d.T = s[0], d.C = s[1], d.H = d.KV = 1, d.D = s[2];
        break;
    case MOE_OP_GROUPED_MATMUL:
        d.E = s[0], d.C = s[1], d.F = s[2];
        break;
    default:
        break;
    }
    return d;
}

/* supports() with sizes: the shapes the kernels refuse at launch are refused up front, and
 * moe_backend_check names the op and the sizes (what moe_model_create reports). */
static void check_supports_shapes(const moe_backend *gpu) {
    moe_op_dims d;
    memset(&d, 0, sizeof d);
    d.B = 2, d.T = 64, d.H = 4, d.KV = 2, d.D = 64, d.C = 256, d.E = 8, d.K = 2, d.V = 64;
    d.F = 128;
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_BF16, NULL) == MOE_OK);
    d.D = 80; /* no flash-attention kernel for head dim 80; the fp32 kernel takes it */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    CHECK(gpu->supports(gpu, MOE_OP_MATMUL, &d, MOE_RECIPE_BF16)); /* only attention cares */
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_BF16, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "attention") && strstr(err.msg, "D=80"), "message: %s", err.msg);
    d.D = 288; /* beyond the fp32 kernel's 256 */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    d.D = 64, d.H = 6, d.KV = 4; /* H % KV != 0 */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    d.H = 4, d.KV = 2, d.E = 2000; /* more experts than the grouping kernels take */
    CHECK(!gpu->supports(gpu, MOE_OP_PERMUTE, &d, MOE_RECIPE_FP32));
    moe_err_clear(&err);
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_FP32, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "permute") && strstr(err.msg, "E=2000"), "message: %s", err.msg);
    /* fp8-block and mxfp8, either scale rule: every op (the unquantized ones as bf16);
     * fp8-block's products want multiples of 16 */
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_FP8_BLOCK, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_FP8_BLOCK_POW2, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_MXFP8, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_MXFP8_FLOOR, NULL) == MOE_OK);
    /* --dry-run's CUDA estimate exists for exactly the recipes the backend runs (every op) */
    const moe_recipe all[] = {MOE_RECIPE_FP32,           MOE_RECIPE_BF16,  MOE_RECIPE_FP8_BLOCK,
                              MOE_RECIPE_FP8_BLOCK_POW2, MOE_RECIPE_MXFP8, MOE_RECIPE_MXFP8_FLOOR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_MSG((moe_backend_scratch_estimate("cuda", &d, all[i]) >= 0) ==
                      (moe_backend_check(gpu, NULL, all[i], NULL) == MOE_OK),
                  "recipe %s: the scratch estimate and supports() disagree",
                  moe_recipe_name(all[i]));
    memset(&d, 0, sizeof d);
    d.B = 1, d.T = 64, d.C = 64, d.H = 4, d.KV = 2, d.D = 16, d.E = 4, d.K = 2, d.F = 96, d.V = 5;
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_FP8_BLOCK, NULL) == MOE_OK);
    d.F = 100;
    CHECK(!gpu->supports(gpu, MOE_OP_GROUPED_MATMUL, &d, MOE_RECIPE_FP8_BLOCK));
    CHECK(gpu->supports(gpu, MOE_OP_GROUPED_MATMUL, &d, MOE_RECIPE_BF16));
    d.F = 96, d.KV = 1, d.D = 8; /* k/v projections of 8 columns */
    CHECK(!gpu->supports(gpu, MOE_OP_MATMUL, &d, MOE_RECIPE_FP8_BLOCK));
}

/* ------------------------------------------------------------------------------------------
 * perf mode: GPU only, large shapes, median of timed repetitions after a warm-up */

typedef struct pcase {
    const char *name;
    moe_op op;
    int dir; /* 0 forward, 1 backward */
    int64_t s[6];
} pcase;

static const pcase k_perf[] = {
    {"matmul bf16 N8192 I4096 O4096", MOE_OP_MATMUL, 0, {8192, 4096, 4096}},
    {"matmul bf16 N8192 I4096 O4096", MOE_OP_MATMUL, 1, {8192, 4096, 4096}},
    {"matmul bf16 N16384 I2048 O256 (lm_head)", MOE_OP_MATMUL, 0, {16384, 2048, 256}},
    {"grouped bf16 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 14336, 2048}},
    {"grouped bf16 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 1, {8, 4096, 14336, 2048}},
    /* issue 12's comparison with torch._grouped_mm (bench/grouped_gpu.sh runs both): the two
     * presets' forward products, w1 and w3 as one gate-up product as torch's comparison fuses
     * them, then the down product; s[5] 1: the uneven counts of k_uneven */
    {"grouped bf16 E8 M16384 I4096 O28672", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 28672, 2048}},
    {"grouped bf16 E8 M16384 I4096 O28672 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 28672, 2048, 0, 1}},
    {"grouped bf16 E8 M16384 I14336 O4096", MOE_OP_GROUPED_MATMUL, 0, {8, 14336, 4096, 2048}},
    {"grouped bf16 E8 M16384 I14336 O4096 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 14336, 4096, 2048, 0, 1}},
    {"grouped bf16 E8 M32768 I2048 O8192", MOE_OP_GROUPED_MATMUL, 0, {8, 2048, 8192, 4096}},
    {"grouped bf16 E8 M32768 I2048 O8192 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 2048, 8192, 4096, 0, 1}},
    {"grouped bf16 E8 M32768 I4096 O2048", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 2048, 4096}},
    {"grouped bf16 E8 M32768 I4096 O2048 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 2048, 4096, 0, 1}},
    /* s[4] 1: fp8-block, the weight's e4m3 copies (the forward and dgrad one grouped kernel on
     * Hopper, wgrad per expert) */
    {"grouped fp8 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 14336, 2048, 1}},
    {"grouped fp8 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 1, {8, 4096, 14336, 2048, 1}},
    /* uneven: 4 of the 8 experts end in a tile of at most 64 rows */
    {"grouped fp8 E8 M16384 I4096 O14336 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 14336, 2048, 1, 1}},
    {"grouped fp8 E8 M16384 I4096 O14336 uneven",
     MOE_OP_GROUPED_MATMUL,
     1,
     {8, 4096, 14336, 2048, 1, 1}},
    {"attn bf16 B2 H16 KV8 T8192 D128", MOE_OP_ATTENTION, 0, {2, 8192, 16, 8, 128}},
    {"attn bf16 B2 H16 KV8 T8192 D128", MOE_OP_ATTENTION, 1, {2, 8192, 16, 8, 128}},
    {"attn bf16 B4 H16 KV8 T2048 D64", MOE_OP_ATTENTION, 0, {4, 2048, 16, 8, 64}},
    {"attn bf16 B4 H16 KV8 T2048 D64", MOE_OP_ATTENTION, 1, {4, 2048, 16, 8, 64}},
    /* the other shapes of bench/attention_sdpa.py (issue 13's table) */
    {"attn bf16 B2 H32 KV8 T4096 D128", MOE_OP_ATTENTION, 0, {2, 4096, 32, 8, 128}},
    {"attn bf16 B2 H32 KV8 T4096 D128", MOE_OP_ATTENTION, 1, {2, 4096, 32, 8, 128}},
    {"attn bf16 B1 H16 KV8 T32768 D128", MOE_OP_ATTENTION, 0, {1, 32768, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T32768 D128", MOE_OP_ATTENTION, 1, {1, 32768, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T131072 D128", MOE_OP_ATTENTION, 0, {1, 131072, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T131072 D128", MOE_OP_ATTENTION, 1, {1, 131072, 16, 8, 128}},
    /* document mask, documents of s[5] tokens: the work (and FLOPs) of 8 separate 1024s */
    {"attn bf16 B2 H16 KV8 T8192 D128 docs 1024", MOE_OP_ATTENTION, 0, {2, 8192, 16, 8, 128, 1024}},
    {"attn bf16 B2 H16 KV8 T8192 D128 docs 1024", MOE_OP_ATTENTION, 1, {2, 8192, 16, 8, 128, 1024}},
    {"rmsnorm N16384 C4096", MOE_OP_RMSNORM, 0, {16384, 4096}},
    {"rmsnorm N16384 C4096", MOE_OP_RMSNORM, 1, {16384, 4096}},
    {"swiglu n=16384*8192", MOE_OP_SWIGLU, 0, {16384LL * 8192}},
    {"swiglu n=16384*8192", MOE_OP_SWIGLU, 1, {16384LL * 8192}},
    {"rmsnorm N16384 C2048", MOE_OP_RMSNORM, 0, {16384, 2048}},
    {"rmsnorm N16384 C2048", MOE_OP_RMSNORM, 1, {16384, 2048}},
    {"xent N16384 V256", MOE_OP_CROSS_ENTROPY, 0, {16384, 256}},
    {"router N16384 E8 K2", MOE_OP_ROUTER, 0, {16384, 8, 2}},
    {"permute N16384 C4096 E8 K2", MOE_OP_PERMUTE, 0, {16384, 4096, 8, 2}},
    {"embedding bwd N16384 C4096 V256", MOE_OP_EMBEDDING, 1, {16384, 4096, 256}},
    {"adamw n=256M", MOE_OP_ADAMW, 0, {256LL << 20}},
    {"adamw n=256M bf16 moments", MOE_OP_ADAMW, 0, {256LL << 20, 1}}, /* s[1] 1: bf16 m, v */
    {"sum_squares n=256M", MOE_OP_SUM_SQUARES, 0, {256LL << 20}},
    /* the fp8-block weight copies of one mixtral w1 (both layouts), as after each AdamW */
    {"quantize_weight E8 O14336 I4096", MOE_OP_QUANTIZE, 0, {8, 14336, 4096}},
};
enum { NPERF = sizeof k_perf / sizeof k_perf[0] };

/* The uneven expert counts of the grouped perf cases: expert e gets k_uneven[e] / 100 of the
 * M rows, rounded down to a multiple of 16, the last expert the rest (a spread like the
 * Dirichlet(2) draws of ../shared/anchors/anchors_turn2.py, fixed so that torch can be given
 * the same counts: the case prints them). */
static const int k_uneven[8] = {22, 6, 15, 9, 18, 3, 17, 10};

/* offsets [E + 1] of M = E * per rows: even, or uneven as k_uneven (E = 8) */
static void perf_offsets(int32_t *off, int64_t E, int64_t per, int uneven) {
    const int64_t M = E * per;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = (int32_t)(!uneven     ? (e + 1) * per
                               : e + 1 < E ? off[e] + M * k_uneven[e] / 100 / 16 * 16
                                           : M);
}

/* a device buffer of n random floats in [-1, 1] (a 1M-value block repeated) */
static float *perf_buf(gctx *g, int64_t n) {
    const int64_t blk = 1 << 20;
    if (!g->perf_src) g->perf_src = frand(blk, -1, 1);
    const float *src = g->perf_src;
    float *d = g->gpu->alloc(g->gpu, F(n));
    if (!d) {
        fprintf(stderr, "perf: device allocation of %lld floats failed\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i += blk)
        g->gpu->memcpy_h2d(g->gpu, d + i, src, F(n - i < blk ? n - i : blk));
    g->bufs[g->nbufs].base = (unsigned char *)d, g->bufs[g->nbufs].bytes = F(n);
    g->bufs[g->nbufs].part = "";
    g->bufs[g->nbufs++].name = "perf";
    return d;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_perf(gctx *g, const pcase *pc) {
    const moe_backend *be = g->gpu;
    const int64_t *s = pc->s;
    double flops = 0.0, bytes = 0.0;
    g->nbufs = 0;
    /* the op under test, as a closure over the buffers below */
    float *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL, *f = NULL, *h = NULL, *k = NULL;
    int32_t *ia = NULL, *ib = NULL, *ic = NULL, *id = NULL, *off = NULL;
    const int32_t *ds = NULL; /* attention: doc_start [B, T] dev of documents of s[5] tokens */
    /* bf16 views and copies: the operands as the model passes them under the bf16 recipe */
    moe_cbuf w16 = moe_cbuf_of(NULL, MOE_DTYPE_BF16), a16 = w16, b16 = w16, c16 = w16;
    int64_t M = 0;
    switch (pc->op) {
    case MOE_OP_MATMUL:
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[2] * s[1]), c = perf_buf(g, s[0] * s[2]);
        if (pc->dir) d = perf_buf(g, s[0] * s[1]), e = perf_buf(g, s[2] * s[1]);
        w16.p = perf_buf(g, (s[2] * s[1] + 1) / 2); /* the bf16 copy the model passes */
        be->cast_bf16(be, (uint16_t *)w16.p, b, s[2] * s[1]);
        a16.p = perf_buf(g, (s[0] * s[1] + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, s[0] * s[1]);
        flops = (pc->dir ? 4.0 : 2.0) * (double)s[0] * s[1] * s[2];
        break;
    case MOE_OP_GROUPED_MATMUL:
        if (s[5] && s[0] != (int64_t)(sizeof k_uneven / sizeof k_uneven[0])) {
            fprintf(stderr, "perf: uneven counts are defined for 8 experts\n");
            exit(1);
        }
        off = xmalloc(I32(s[0] + 1));
        perf_offsets(off, s[0], s[3], (int)s[5]);
        M = off[s[0]];
        a = perf_buf(g, M * s[1]), b = perf_buf(g, s[0] * s[2] * s[1]), c = perf_buf(g, M * s[2]);
        if (pc->dir) d = perf_buf(g, M * s[1]), e = perf_buf(g, s[0] * s[2] * s[1]);
        if (s[4]) { /* fp8-block: the weight's e4m3 copies (2 bytes a weight) and scales */
            float *sc = perf_buf(g, moe_fp8_weight_scales(s[0], s[2], s[1]));
            uint8_t *q = (uint8_t *)perf_buf(g, s[0] * s[2] * s[1] / 2);
            be->quantize_weight(be, q, sc, b, s[0], s[2], s[1], FP8B);
            w16 = moe_cbuf_e4m3(q, sc);
        } else {
            w16.p = perf_buf(g, (s[0] * s[2] * s[1] + 1) / 2);
            be->cast_bf16(be, (uint16_t *)w16.p, b, s[0] * s[2] * s[1]);
        }
        a16.p = perf_buf(g, (M * s[1] + 1) / 2); /* the bf16 expert activations */
        be->cast_bf16(be, (uint16_t *)a16.p, a, M * s[1]);
        flops = (pc->dir ? 4.0 : 2.0) * (double)M * s[1] * s[2];
        break;
    case MOE_OP_ATTENTION: {
        int64_t nq = s[0] * s[1] * s[2] * s[4], nk = s[0] * s[1] * s[3] * s[4];
        a = perf_buf(g, nq), b = perf_buf(g, nk), c = perf_buf(g, nk), d = perf_buf(g, nq);
        e = perf_buf(g, s[0] * s[2] * s[1]);
        a16.p = perf_buf(g, (nq + 1) / 2), b16.p = perf_buf(g, (nk + 1) / 2);
        c16.p = perf_buf(g, (nk + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, nq);
        be->cast_bf16(be, (uint16_t *)b16.p, b, nk);
        be->cast_bf16(be, (uint16_t *)c16.p, c, nk);
        /* causal FLOPs 2 B H T L D per pass (L = T, or the document length) */
        double L = (double)s[1];
        if (s[5]) {
            int32_t *hds = xmalloc(I32(s[0] * s[1]));
            for (int64_t i = 0; i < s[0] * s[1]; i++)
                hds[i] = (int32_t)(i % s[1] / s[5] * s[5]);
            ds = dup_dev(g, "doc_start", hds, I32(s[0] * s[1]));
            free(hds);
            L = (double)s[5];
        }
        if (pc->dir) {
            f = perf_buf(g, nq), h = perf_buf(g, nk), k = perf_buf(g, nk);
            be->attention_forward(be, moe_buf_of(d, MOE_DTYPE_BF16), e, a16, b16, c16, ds, s[0],
                                  s[1], s[1], s[2], s[3], s[4], BF16);
        }
        flops = 2.0 * (double)s[0] * s[2] * s[1] * L * s[4] * (pc->dir ? 2.5 : 1.0);
        break;
    }
    case MOE_OP_RMSNORM:
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[1]), c = perf_buf(g, s[0] * s[1]);
        d = perf_buf(g, s[0]), e = perf_buf(g, s[0] * s[1]);
        be->rmsnorm_forward(be, moe_buf_f32(c), d, moe_cbuf_f32(a), b, s[0], s[1], 1e-5f, BF16);
        bytes = (pc->dir ? 4.0 : 2.0) * 4.0 * (double)s[0] * s[1];
        break;
    case MOE_OP_SWIGLU:
        a = perf_buf(g, s[0]), b = perf_buf(g, s[0]), c = perf_buf(g, s[0]);
        a16.p = perf_buf(g, (s[0] + 1) / 2), b16.p = perf_buf(g, (s[0] + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, s[0]);
        be->cast_bf16(be, (uint16_t *)b16.p, b, s[0]);
        /* bf16 in and out, as the model runs it; the backward also reads the fp32 gradient
         * and writes bf16 da, db */
        bytes = (pc->dir ? 12.0 : 6.0) * (double)s[0];
        break;
    case MOE_OP_CROSS_ENTROPY: {
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[0]), c = perf_buf(g, s[0]);
        int32_t *t = xmalloc(I32(s[0]));
        for (int64_t i = 0; i < s[0]; i++)
            t[i] = (int32_t)rng_int(s[1]);
        ia = dup_dev(g, "targets", t, I32(s[0]));
        free(t);
        bytes = 4.0 * (double)s[0] * s[1];
        break;
    }
    case MOE_OP_ROUTER: {
        float *z = router_logits(s[0], s[1]);
        a = dup_dev(g, "logits", z, F(s[0] * s[1]));
        free(z);
        b = perf_buf(g, s[0] * s[1]), c = perf_buf(g, s[0]), d = perf_buf(g, s[0] * s[2]);
        e = perf_buf(g, s[1] + 2);
        ia = (int32_t *)perf_buf(g, s[0] * s[2]), ib = (int32_t *)perf_buf(g, s[1]);
        bytes = 8.0 * (double)s[0] * s[1];
        break;
    }
    case MOE_OP_PERMUTE: {
        int32_t *ti = random_topk(s[0], s[2], s[3]);
        ia = dup_dev(g, "topk", ti, I32(s[0] * s[3]));
        free(ti);
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[0] * s[3] * s[1]);
        ib = (int32_t *)perf_buf(g, s[0] * s[3]), ic = (int32_t *)perf_buf(g, s[0] * s[3]);
        id = (int32_t *)perf_buf(g, s[2] + 1);
        bytes = 2.0 * (double)s[0] * s[1] * (1 + s[3]); /* bf16 in and out */
        break;
    }
    case MOE_OP_EMBEDDING: {
        int32_t *t = xmalloc(I32(s[0]));
        for (int64_t i = 0; i < s[0]; i++)
            t[i] = (int32_t)rng_int(s[2]);
        ia = dup_dev(g, "tokens", t, I32(s[0]));
        free(t);
        a = perf_buf(g, s[2] * s[1]), b = perf_buf(g, s[0] * s[1]);
        bytes = 4.0 * (double)s[0] * s[1] * 3;
        break;
    }
    case MOE_OP_ADAMW:
        a = perf_buf(g, s[0]), b = perf_buf(g, s[0]), c = perf_buf(g, s[0]), d = perf_buf(g, s[0]);
        e = perf_buf(g, (s[0] + 1) / 2);
        /* read p, g, m, v; write p, m, v and the bf16 copy: 30 B, 22 B with bf16 moments */
        bytes = (s[1] ? 22.0 : 30.0) * (double)s[0];
        break;
    case MOE_OP_SUM_SQUARES:
        a = perf_buf(g, s[0]);
        bytes = 4.0 * (double)s[0];
        break;
    case MOE_OP_QUANTIZE: {
        const int64_t n = s[0] * s[1] * s[2];
        a = perf_buf(g, n), b = perf_buf(g, n / 2); /* w; q and qt: 2 n bytes */
        c = perf_buf(g, moe_fp8_weight_scales(s[0], s[1], s[2]));
        bytes = 6.0 * (double)n; /* read 4 bytes a weight, write 2 */
        break;
    }
    default:
        return;
    }
    double times[7];
    int reps = 7, iters = 3;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (plans, scratch, module load) */
        moe_err err;
        moe_err_clear(&err);
        be->synchronize(be, &err);
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            switch (pc->op) {
            case MOE_OP_MATMUL:
                if (pc->dir)
                    be->matmul_backward(be, d, e, c, a16, w16, s[0], s[1], s[2], BF16, MOE_GRAD_ADD,
                                        MOE_GRAD_ADD);
                else
                    be->matmul_forward(be, moe_buf_of(c, MOE_DTYPE_BF16), a16, w16, s[0], s[1],
                                       s[2], BF16);
                break;
            case MOE_OP_GROUPED_MATMUL:
                if (pc->dir)
                    be->grouped_matmul_backward(
                        be, moe_buf_f32(d), e, moe_cbuf_of(c, MOE_DTYPE_BF16), a16, w16, off, s[0],
                        s[1], s[2], s[4] ? FP8B : BF16, MOE_GRAD_ADD, MOE_GRAD_ADD);
                else
                    be->grouped_matmul_forward(be, moe_buf_of(c, MOE_DTYPE_BF16), a16, w16, off,
                                               s[0], s[1], s[2], s[4] ? FP8B : BF16);
                break;
            case MOE_OP_ATTENTION:
                if (pc->dir)
                    be->attention_backward(be, f, h, k, a, a16, b16, c16,
                                           moe_cbuf_of(d, MOE_DTYPE_BF16), e, ds, s[0], s[1], s[2],
                                           s[3], s[4], BF16, MOE_GRAD_ADD);
                else
                    be->attention_forward(be, moe_buf_of(d, MOE_DTYPE_BF16), e, a16, b16, c16, ds,
                                          s[0], s[1], s[1], s[2], s[3], s[4], BF16);
                break;
            case MOE_OP_RMSNORM:
                if (pc->dir)
                    be->rmsnorm_backward(be, e, b, c, moe_cbuf_f32(a), b, d, s[0], s[1]);
                else
                    be->rmsnorm_forward(be, moe_buf_f32(c), d, moe_cbuf_f32(a), b, s[0], s[1],
                                        1e-5f, BF16);
                break;
            case MOE_OP_SWIGLU:
                if (pc->dir)
                    be->swiglu_backward(be, moe_buf_of(c, MOE_DTYPE_BF16),
                                        moe_buf_of(b, MOE_DTYPE_BF16), moe_cbuf_f32(a), a16, b16,
                                        s[0]);
                else
                    be->swiglu_forward(be, moe_buf_of(c, MOE_DTYPE_BF16), a16, b16, s[0], BF16);
                break;
            case MOE_OP_CROSS_ENTROPY:
                be->cross_entropy_forward(be, b, c, a, ia, NULL, s[0], s[1]);
                break;
            case MOE_OP_ROUTER:
                be->router_forward(be, b, c, ia, d, ib, e, a, s[0], s[1], s[2]);
                break;
            case MOE_OP_PERMUTE:
                be->permute_forward(be, moe_buf_of(b, MOE_DTYPE_BF16), ib, ic, id,
                                    moe_cbuf_of(a, MOE_DTYPE_BF16), ia, s[0], s[1], s[2], s[3]);
                break;
            case MOE_OP_EMBEDDING:
                be->embedding_backward(be, a, b, ia, s[0], s[1], s[2]);
                break;
            case MOE_OP_ADAMW:
                be->adamw(be, a, (uint16_t *)e, b,
                          moe_buf_of(c, s[1] ? MOE_DTYPE_BF16 : MOE_DTYPE_F32),
                          moe_buf_of(d, s[1] ? MOE_DTYPE_BF16 : MOE_DTYPE_F32), s[0], 1e-9f, 0.9f,
                          0.95f, 1e-8f, 0.0f, 10, 1.0f);
                break;
            case MOE_OP_SUM_SQUARES:
                (void)be->sum_squares(be, a, s[0]);
                break;
            case MOE_OP_QUANTIZE:
                be->quantize_weight(be, (uint8_t *)b, c, a, s[0], s[1], s[2], FP8B);
                break;
            default:
                break;
            }
        }
        if (be->synchronize(be, &err) != MOE_OK) {
            moe_err_print(&err, "test_backend_ops --perf", stderr);
            exit(1);
        }
        if (r >= 0) times[r] = (now_s() - t0) / iters;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    double med = times[reps / 2];
    if (flops > 0)
        printf("  %-44s %-3s %9.3f ms  %8.1f TFLOP/s\n", pc->name, pc->dir ? "bwd" : "fwd",
               med * 1e3, flops / med * 1e-12);
    else
        printf("  %-44s %-3s %9.3f ms  %8.1f GB/s\n", pc->name, pc->dir ? "bwd" : "fwd", med * 1e3,
               bytes / med * 1e-9);
    if (pc->op == MOE_OP_GROUPED_MATMUL) { /* the counts, for a peer given the same ones */
        printf("    counts");
        for (int64_t x = 0; x < s[0]; x++)
            printf("%c%d", x ? ',' : ' ', off[x + 1] - off[x]);
        printf("\n");
    }
    fflush(stdout);
    for (int i = 0; i < g->nbufs; i++)
        be->free(be, g->bufs[i].base);
    g->nbufs = 0;
    free(off);
}

/* ------------------------------------------------------------------------------------------ */

/* Runs case tc under label (its checks name it), counting it into *run and *failed. */
static void run_case(gctx *g, const tcase *tc, const char *label, int *run, int *failed) {
    g->label = label;
    g->fails = 0;
    moe_op_dims dims = tcase_dims(tc);
    if (!g->gpu->supports(g->gpu, tc->op, &dims, tc->prec)) {
        printf("  %-28s not supported by the CUDA backend: FAIL\n", label);
        CHECK_MSG(0, "%s: cuda backend does not support %s", label, moe_op_name(tc->op));
        return;
    }
    runner_for(tc->op)(g, tc);
    free_bufs(g);
    (*run)++;
    *failed += g->fails > 0;
}

int main(int argc, char **argv) {
    int perf = 0, measured = 0;
    const char *only = NULL;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf"))
            perf = 1;
        else if (!strcmp(argv[i], "--measured"))
            measured = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--perf [--measured]] [--seed N] [--only SUBSTRING]\n",
                    argv[0]);
            return 2;
        }
    }
    moe_err err;
    moe_err_clear(&err);
    gctx g;
    memset(&g, 0, sizeof g);
    g.cpu = moe_backend_cpu();
    g.gpu = test_cuda_backend("test_backend_ops");
    if (!g.gpu) return 77;
    g_rng = seed;
    printf("test_backend_ops: seed %llu (replay with --seed %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    if (perf) {
        g.gpu->set_deterministic(g.gpu, !measured); /* --measured: train.deterministic false */
        for (int i = 0; i < NPERF; i++)
            if (!only || strstr(k_perf[i].name, only)) run_perf(&g, &k_perf[i]);
    } else {
        check_supports_shapes(g.gpu);
        int failed_cases = 0, run = 0;
        for (int i = 0; i < NCASES; i++)
            if (!only || strstr(k_cases[i].name, only))
                run_case(&g, &k_cases[i], k_cases[i].name, &run, &failed_cases);
        /* train.deterministic: false: the products again, each shape's algorithm chosen by
         * timing cuBLASLt's candidates at its first call; the trials must leave C (read by
         * the "+=" gradients) and the guard bytes as they were */
        g.gpu->set_deterministic(g.gpu, 0);
        for (int i = 0; i < NCASES; i++) {
            const tcase *tc = &k_cases[i];
            char label[160];
            snprintf(label, sizeof label, "measured: %s", tc->name);
            if ((tc->op == MOE_OP_MATMUL || tc->op == MOE_OP_GROUPED_MATMUL) &&
                (!only || strstr(label, only)))
                run_case(&g, tc, label, &run, &failed_cases);
        }
        g.gpu->set_deterministic(g.gpu, 1);
        printf("test_backend_ops: %d cases, %d failed, worst nmse %.3e, seed %llu\n", run,
               failed_cases, g_worst_nmse, (unsigned long long)seed);
    }
    g.gpu->destroy(g.gpu);
    free(g.perf_src);
    return test_summary("test_backend_ops");
}
