/* ops_norm: the elementwise and per-row ops of the CPU backend - embedding lookup, RMSNorm,
 * RoPE, SwiGLU, the residual add and the pooling of hidden states over positions.
 *
 * Parallel loops split rows (or, for parameter-gradient reductions over rows, column
 * slabs), never a reduction's summation order, so results are thread-count independent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe/quant.h"
#include "ops/cpu/cpu_ops.h"

#define COL_SLAB 64 /* columns per task in column-parallel reductions */

void moe_cpu_embedding_forward(const moe_backend *be, moe_buf out, const int32_t *tokens,
                               const float *wte, int64_t N, int64_t C) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *src = wte + (int64_t)tokens[n] * C;
        for (int64_t c = 0; c < C; c++)
            moe_buf_set(out, n * C + c, src[c]);
    }
}

void moe_cpu_embedding_backward(const moe_backend *be, float *dwte, const float *dout,
                                const int32_t *tokens, int64_t N, int64_t C, int64_t V) {
    (void)be;
    (void)V;
    /* Each task owns a slab of columns and walks the tokens in order: no write races and
     * a fixed summation order for repeated tokens. */
    int64_t nslab = (C + COL_SLAB - 1) / COL_SLAB;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < nslab; s++) {
        int64_t c0 = s * COL_SLAB, c1 = c0 + COL_SLAB < C ? c0 + COL_SLAB : C;
        for (int64_t n = 0; n < N; n++) {
            float *dst = dwte + (int64_t)tokens[n] * C;
            const float *g = dout + n * C;
            for (int64_t c = c0; c < c1; c++)
                dst[c] += g[c];
        }
    }
}

/* The output is stored 32 values at a time (moe_cpu_store_block): an MXFP8 output (C a
 * multiple of 32) is encoded a block at a time. */
enum { NORM_BLOCK = 32 };

/* pairs: n = offsets[E] K, or abort with what came */
static void pairs_check(const char *op, int is_pair, const moe_fp8_groups *pairs, int64_t n) {
    if (is_pair == !!pairs && (!pairs || n == pairs->offsets[pairs->E] * pairs->K)) return;
    fprintf(stderr,
            "moe: cpu backend: %s got %s and %s groups for n = %lld (an fp8-block pair comes "
            "with the groups of its n = offsets[E] K elements; other outputs without groups)\n",
            op, is_pair ? "a pair" : "no pair", pairs ? "its" : "no", (long long)n);
    abort();
}

/* out [N, C] = the norm of x's rows, each value rounded to bf16 where round (stored in out's
 * type), rstd [N] */
static void rmsnorm_values(moe_buf out, float *rstd, moe_cbuf x, const float *w, int64_t N,
                           int64_t C, float eps, int round) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        moe_cbuf xn = moe_cbuf_at(x, n * C);
        float ss = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            float xc = moe_cbuf_get(xn, c);
            ss += xc * xc;
        }
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        for (int64_t c0 = 0; c0 < C; c0 += NORM_BLOCK) {
            int64_t cnt = C - c0 < NORM_BLOCK ? C - c0 : NORM_BLOCK;
            float v[NORM_BLOCK];
            for (int64_t j = 0; j < cnt; j++) {
                v[j] = moe_cbuf_get(xn, c0 + j) * r * w[c0 + j];
                if (round) v[j] = moe_round_bf16(v[j]);
            }
            moe_cpu_store_block(out, n * C + c0, v, cnt);
        }
    }
}

void moe_cpu_rmsnorm_forward(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf x,
                             const float *w, int64_t N, int64_t C, float eps, moe_recipe prec,
                             const moe_fp8_groups *pairs) {
    (void)be;
    pairs_check("rmsnorm_forward", moe_cbuf_is_fp8_pair(moe_cbuf_from(out)), pairs, N * C);
    if (!pairs) {
        rmsnorm_values(out, rstd, x, w, N, C, eps, prec == MOE_RECIPE_BF16);
        return;
    }
    /* the BF16 values the other path stores, then their encoding */
    float *v = moe_cpu_output(out, N * C); /* fp32 scratch */
    rmsnorm_values(moe_buf_f32(v), rstd, x, w, N, C, eps, 1);
    moe_fp8_pair_encode(out.p, v, pairs->offsets, pairs->E, pairs->K, pairs->pow2, pairs->tiles);
    free(v);
}

void moe_cpu_rmsnorm_backward(const moe_backend *be, float *dx, float *dw, const float *dout,
                              moe_cbuf x, const float *w, const float *rstd, int64_t N, int64_t C) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        moe_cbuf xn = moe_cbuf_at(x, n * C);
        const float *gn = dout + n * C;
        float r = rstd[n], dot = 0.0f;
        for (int64_t c = 0; c < C; c++)
            dot += gn[c] * w[c] * moe_cbuf_get(xn, c);
        float k = dot * r * r * r / (float)C;
        float *dxn = dx + n * C;
        for (int64_t c = 0; c < C; c++)
            dxn[c] += gn[c] * w[c] * r - moe_cbuf_get(xn, c) * k;
    }
    int64_t nslab = (C + COL_SLAB - 1) / COL_SLAB;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < nslab; s++) {
        int64_t c0 = s * COL_SLAB, c1 = c0 + COL_SLAB < C ? c0 + COL_SLAB : C;
        for (int64_t n = 0; n < N; n++) {
            const float *gn = dout + n * C;
            float r = rstd[n];
            for (int64_t c = c0; c < c1; c++)
                dw[c] += gn[c] * moe_cbuf_get(x, n * C + c) * r;
        }
    }
}

/* Rotates every head vector of x by +angle (dir = 1) or -angle (dir = -1) of its position into
 * y (may be x): p0 + pos[b, t], or p0 + t when pos is NULL. The angle table (positions [p0,
 * p0 + T)) is computed in double and rounded once, so forward and backward use the same
 * cos/sin. */
static void rope_apply(moe_buf y, moe_cbuf x, const int32_t *pos, int64_t p0, int64_t B, int64_t T,
                       int64_t NH, int64_t D, double theta, float dir) {
    int64_t half = D / 2;
    float *cs = malloc((size_t)(T * half * 2) * sizeof(float));
    if (!cs) abort(); /* host OOM on a T x D/2 table: nothing sensible to continue with */
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double inv_freq = pow(theta, -(double)(2 * i) / (double)D);
            double ang = (double)(p0 + t) * inv_freq;
            cs[(t * half + i) * 2] = (float)cos(ang);
            cs[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
#pragma omp parallel for schedule(static) collapse(2)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *ct = cs + (pos ? pos[b * T + t] : t) * half * 2;
            for (int64_t h = 0; h < NH; h++) {
                int64_t v = ((b * T + t) * NH + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    float c = ct[2 * i], s = dir * ct[2 * i + 1];
                    float x1 = moe_cbuf_get(x, v + i), x2 = moe_cbuf_get(x, v + i + half);
                    moe_buf_set(y, v + i, x1 * c - x2 * s);
                    moe_buf_set(y, v + i + half, x2 * c + x1 * s);
                }
            }
        }
    free(cs);
}

void moe_cpu_rope_forward(const moe_backend *be, moe_buf x, const int32_t *pos, int64_t p0,
                          int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    (void)be;
    rope_apply(x, moe_cbuf_from(x), pos, p0, B, T, NH, D, theta, 1.0f);
}

void moe_cpu_rope_backward(const moe_backend *be, moe_buf dx, const float *dy, const int32_t *pos,
                           int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    (void)be;
    rope_apply(dx, moe_cbuf_f32(dy), pos, 0, B, T, NH, D, theta, -1.0f);
}

/* Both directions run over blocks of 32 elements, so that an MXFP8 output is encoded a block
 * at a time (moe_cpu_store_block) after its block's inputs were read: in place is safe. */
enum { SWIGLU_BLOCK = 32 };

static void swiglu_values(moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n, int round) {
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += SWIGLU_BLOCK) {
        int64_t cnt = n - i0 < SWIGLU_BLOCK ? n - i0 : SWIGLU_BLOCK;
        float v[SWIGLU_BLOCK];
        for (int64_t j = 0; j < cnt; j++) {
            float ai = moe_cbuf_get(a, i0 + j);
            float s = 1.0f / (1.0f + moe_cpu_expf(-ai));
            v[j] = ai * s * moe_cbuf_get(b, i0 + j);
            if (round) v[j] = moe_round_bf16(v[j]);
        }
        moe_cpu_store_block(out, i0, v, cnt);
    }
}

void moe_cpu_swiglu_forward(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                            moe_recipe prec, const moe_fp8_groups *pairs) {
    (void)be;
    pairs_check("swiglu_forward", moe_cbuf_is_fp8_pair(moe_cbuf_from(out)), pairs, n);
    if (!pairs) {
        swiglu_values(out, a, b, n, prec == MOE_RECIPE_BF16);
        return;
    }
    /* the BF16 values the other path stores, then their encoding */
    float *g = moe_cpu_output(out, n); /* fp32 scratch */
    swiglu_values(moe_buf_f32(g), a, b, n, 1);
    moe_fp8_pair_encode(out.p, g, pairs->offsets, pairs->E, pairs->K, pairs->pow2, pairs->tiles);
    free(g);
}

/* SwiGLU's gradients, each stored in its output's type (moe_cpu_store_block) */
static void swiglu_grads(moe_buf da,    /* [n] F32|BF16|MXFP8, may be a */
                         moe_buf db,    /* [n] of da's type, may be b */
                         moe_cbuf dout, /* [n] */
                         moe_cbuf a,    /* [n] */
                         moe_cbuf b,    /* [n] */
                         int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += SWIGLU_BLOCK) {
        int64_t cnt = n - i0 < SWIGLU_BLOCK ? n - i0 : SWIGLU_BLOCK;
        float ga[SWIGLU_BLOCK], gb[SWIGLU_BLOCK];
        for (int64_t j = 0; j < cnt; j++) {
            int64_t i = i0 + j;
            float ai = moe_cbuf_get(a, i);
            float s = 1.0f / (1.0f + moe_cpu_expf(-ai));
            float silu = ai * s;
            float d = moe_cbuf_get(dout, i);
            ga[j] = d * moe_cbuf_get(b, i) * (s + silu * (1.0f - s));
            gb[j] = d * silu;
        }
        moe_cpu_store_block(da, i0, ga, cnt);
        moe_cpu_store_block(db, i0, gb, cnt);
    }
}

void moe_cpu_swiglu_backward(const moe_backend *be, moe_buf da, moe_buf db, moe_cbuf dout,
                             moe_cbuf a, moe_cbuf b, int64_t n, const moe_fp8_groups *pairs) {
    (void)be;
    pairs_check("swiglu_backward (da)", moe_cbuf_is_fp8_pair(moe_cbuf_from(da)), pairs, n);
    pairs_check("swiglu_backward (db)", moe_cbuf_is_fp8_pair(moe_cbuf_from(db)), pairs, n);
    if (pairs && pairs->tiles) {
        fprintf(stderr, "moe: cpu backend: swiglu_backward's pairs are dy operands: in blocks, "
                        "not tiles\n");
        abort();
    }
    if (!pairs) {
        swiglu_grads(da, db, dout, a, b, n);
        return;
    }
    /* the BF16 values the other path stores, then both encodings of each */
    float *ga = moe_cpu_output(da, n), *gb = moe_cpu_output(db, n); /* fp32 scratch */
    swiglu_grads(moe_buf_f32(ga), moe_buf_f32(gb), dout, a, b, n);
    moe_cpu_round_bf16_inplace(ga, n);
    moe_cpu_round_bf16_inplace(gb, n);
    moe_fp8_pair_encode(da.p, ga, pairs->offsets, pairs->E, pairs->K, pairs->pow2, 0);
    moe_fp8_pair_encode(db.p, gb, pairs->offsets, pairs->E, pairs->K, pairs->pow2, 0);
    free(ga), free(gb);
}

void moe_cpu_add(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        moe_buf_set(out, i, moe_cbuf_get(a, i) + moe_cbuf_get(b, i));
}

void moe_cpu_pool_forward(const moe_backend *be, float *out, const float *x, const int32_t *range,
                          int64_t B, int64_t T, int64_t C, int max) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + (b * T + range[2 * b]) * C;
        int64_t cnt = range[2 * b + 1];
        for (int64_t c = 0; c < C; c++) {
            if (max) {
                float v = xb[c];
                for (int64_t t = 1; t < cnt; t++)
                    v = xb[t * C + c] > v ? xb[t * C + c] : v;
                out[b * C + c] = v;
            } else {
                double s = 0.0;
                for (int64_t t = 0; t < cnt; t++)
                    s += xb[t * C + c];
                out[b * C + c] = (float)(s / (double)cnt);
            }
        }
    }
}
