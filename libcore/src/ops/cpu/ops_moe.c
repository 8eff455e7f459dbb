/* ops_moe: the mixture-of-experts plumbing of the CPU backend - router (softmax, top-k,
 * renormalised weights, load statistics), permutation of (token, slot) pairs into
 * expert-contiguous rows, and the weighted un-permutation back to tokens.
 *
 * The permutation is a stable counting sort by expert over (n, k) order, so a token's rows
 * always appear in token order inside its expert's group: outputs are deterministic and
 * match a naive per-token loop. Routing weights are applied in unpermute (not swiglu).
 * Router statistics reduce over fixed chunks of ROUTER_CHUNK tokens, summed in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

#define ROUTER_CHUNK 256

void moe_cpu_router_forward(const moe_backend *be, float *probs, float *lse, int32_t *topk_idx,
                            float *topk_w, int32_t *counts, float *stats, const float *logits,
                            int64_t N, int64_t E, int64_t K) {
    (void)be;
    int64_t nchunk = (N + ROUTER_CHUNK - 1) / ROUTER_CHUNK;
    double *part = calloc((size_t)((nchunk > 0 ? nchunk : 1) * (E + 2)), sizeof(double));
    if (!part) abort(); /* host OOM on a small scratch table */
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ch++) {
        double *pc = part + ch * (E + 2);
        int64_t n1 = (ch + 1) * ROUTER_CHUNK < N ? (ch + 1) * ROUTER_CHUNK : N;
        for (int64_t n = ch * ROUTER_CHUNK; n < n1; n++) {
            const float *z = logits + n * E;
            float *p = probs + n * E;
            float mx = -INFINITY;
            for (int64_t e = 0; e < E; e++)
                mx = z[e] > mx ? z[e] : mx;
            float sum = 0.0f;
            for (int64_t e = 0; e < E; e++) {
                p[e] = expf(z[e] - mx);
                sum += p[e];
            }
            float inv = 1.0f / sum, ent = 0.0f;
            for (int64_t e = 0; e < E; e++) {
                p[e] *= inv;
                if (p[e] > 0.0f) ent -= p[e] * logf(p[e]);
                pc[e] += p[e];
            }
            float l = mx + logf(sum);
            lse[n] = l;
            pc[E] += (double)l * l;
            pc[E + 1] += ent;
            /* top-k by repeated selection: descending p, lower index wins ties */
            int32_t *idx = topk_idx + n * K;
            float *w = topk_w + n * K, tot = 0.0f;
            for (int64_t kk = 0; kk < K; kk++) {
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++) {
                    int taken = 0;
                    for (int64_t j = 0; j < kk; j++)
                        taken |= idx[j] == e;
                    if (!taken && (best < 0 || p[e] > p[best])) best = e;
                }
                idx[kk] = (int32_t)best;
                w[kk] = p[best];
                tot += p[best];
            }
            for (int64_t kk = 0; kk < K; kk++)
                w[kk] /= tot;
        }
    }
    for (int64_t j = 0; j < E + 2; j++) {
        double s = 0.0;
        for (int64_t ch = 0; ch < nchunk; ch++)
            s += part[ch * (E + 2) + j];
        stats[j] = (float)s;
    }
    for (int64_t e = 0; e < E; e++)
        counts[e] = 0;
    for (int64_t i = 0; i < N * K; i++)
        counts[topk_idx[i]]++;
    free(part);
}

void moe_cpu_router_backward(const moe_backend *be, float *dlogits, const float *dtopk_w,
                             const float *dprob, float dz, const float *probs, const float *lse,
                             const int32_t *topk_idx, const float *topk_w, int64_t N, int64_t E,
                             int64_t K) {
    (void)be;
#pragma omp parallel
    {
        float *dp = malloc((size_t)E * sizeof(float));
        if (!dp) abort();
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *p = probs + n * E;
            const int32_t *idx = topk_idx + n * K;
            const float *w = topk_w + n * K, *dw = dtopk_w + n * K;
            for (int64_t e = 0; e < E; e++)
                dp[e] = dprob ? dprob[e] : 0.0f;
            /* w_k = p_k / S: dL/dp_k = (dw_k - sum_j dw_j w_j) / S */
            float S = 0.0f, wdw = 0.0f;
            for (int64_t kk = 0; kk < K; kk++) {
                S += p[idx[kk]];
                wdw += dw[kk] * w[kk];
            }
            for (int64_t kk = 0; kk < K; kk++)
                dp[idx[kk]] += (dw[kk] - wdw) / S;
            float pdp = 0.0f;
            for (int64_t e = 0; e < E; e++)
                pdp += p[e] * dp[e];
            /* softmax backward, plus d(lse^2)/dz_e = 2 lse p_e */
            float zterm = 2.0f * dz * lse[n];
            float *g = dlogits + n * E;
            for (int64_t e = 0; e < E; e++)
                g[e] += p[e] * (dp[e] - pdp) + zterm * p[e];
        }
        free(dp);
    }
}

void moe_cpu_permute_forward(const moe_backend *be, moe_buf xp, int32_t *row_src, int32_t *slot_row,
                             int32_t *offsets, moe_cbuf x, const int32_t *topk_idx, int64_t N,
                             int64_t C, int64_t E, int64_t K) {
    (void)be;
    int64_t *next = calloc((size_t)E, sizeof(int64_t));
    if (!next) abort();
    for (int64_t e = 0; e <= E; e++)
        offsets[e] = 0;
    for (int64_t i = 0; i < N * K; i++)
        offsets[topk_idx[i] + 1]++;
    for (int64_t e = 0; e < E; e++) {
        offsets[e + 1] += offsets[e];
        next[e] = offsets[e];
    }
    for (int64_t i = 0; i < N * K; i++) { /* stable: (n, k) order within each expert */
        int64_t r = next[topk_idx[i]]++;
        row_src[r] = (int32_t)i;
        slot_row[i] = (int32_t)r;
    }
    free(next);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * K; r++) {
        int64_t src = (int64_t)(row_src[r] / K) * C;
        if (xp.dt == x.dt && !xp.mx && !x.mx) {
            size_t es = moe_dtype_size(x.dt);
            memcpy((char *)xp.p + (size_t)(r * C) * es, (const char *)x.p + (size_t)src * es,
                   (size_t)C * es);
        } else { /* converted 32 values at a time: an MXFP8 xp (C a multiple of 32) by blocks */
            float v[32];
            for (int64_t c0 = 0; c0 < C; c0 += 32) {
                int64_t cnt = C - c0 < 32 ? C - c0 : 32;
                for (int64_t j = 0; j < cnt; j++)
                    v[j] = moe_cbuf_get(x, src + c0 + j);
                moe_cpu_store_block(xp, r * C + c0, v, cnt);
            }
        }
    }
}

void moe_cpu_permute_backward(const moe_backend *be, float *dx, moe_cbuf dxp,
                              const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                              moe_grad_store st) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *d = dx + n * C;
        if (st == MOE_GRAD_SET)
            for (int64_t c = 0; c < C; c++)
                d[c] = 0.0f;
        for (int64_t kk = 0; kk < K; kk++) {
            const int64_t r = (int64_t)slot_row[n * K + kk] * C;
            if (dxp.dt == MOE_DTYPE_F32) {
                const float *g = (const float *)dxp.p + r;
                for (int64_t c = 0; c < C; c++)
                    d[c] += g[c];
            } else
                for (int64_t c = 0; c < C; c++)
                    d[c] += moe_cbuf_get(dxp, r + c);
        }
    }
}

void moe_cpu_unpermute_forward(const moe_backend *be, moe_buf y, moe_cbuf res, moe_cbuf yp,
                               const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                               int64_t K) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float s = 0.0f;
            for (int64_t kk = 0; kk < K; kk++)
                s += topk_w[n * K + kk] * moe_cbuf_get(yp, slot_row[n * K + kk] * C + c);
            moe_buf_set(y, n * C + c, res.p ? moe_cbuf_get(res, n * C + c) + s : s);
        }
}

void moe_cpu_unpermute_backward(const moe_backend *be, moe_buf dyp, float *dtopk_w, const float *dy,
                                moe_cbuf yp, const float *topk_w, const int32_t *slot_row,
                                int64_t N, int64_t C, int64_t K, moe_grad_store st) {
    (void)be;
    const int add = st == MOE_GRAD_ADD;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = dy + n * C;
        for (int64_t kk = 0; kk < K; kk++) {
            int64_t r = slot_row[n * K + kk];
            moe_cbuf dr = moe_cbuf_from(dyp);
            float w = topk_w[n * K + kk], s = 0.0f;
            for (int64_t c = 0; c < C; c++) { /* yp read before dyp is written: in place */
                float prev = add ? moe_cbuf_get(dr, r * C + c) : 0.0f;
                s += g[c] * moe_cbuf_get(yp, r * C + c);
                moe_buf_set(dyp, r * C + c, prev + w * g[c]);
            }
            dtopk_w[n * K + kk] = (add ? dtopk_w[n * K + kk] : 0.0f) + s;
        }
    }
}
