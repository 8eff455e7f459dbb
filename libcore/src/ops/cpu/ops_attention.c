/* ops_attention: causal grouped-query attention of the CPU backend, flash style.
 *
 * Forward walks each query row's keys in blocks of ATT_BLOCK with an online softmax
 * (running max m, running sum l, rescaled accumulator), so no T x T matrix ever exists:
 * memory is linear in T. It saves lse = m + log(l) per row; backward recomputes the
 * probabilities p = exp(s - lse) from it. Backward runs one task per (batch, kv head):
 * the task owns dq of the query heads in that group and dk/dv of the kv head, so every
 * gradient element is written by one task in a fixed order (deterministic, no atomics). Under bf16,
 * q/k/v/dout and the probabilities/score gradients are rounded to bf16 before each product, as a
 * bf16 flash-attention kernel does. With a document mask (doc_start, moe/ops.h) a row's keys
 * start at its document's first position instead of 0: the blocks then start there too, so a
 * packed document walks its keys in the same blocks as it would alone. A forward over cached
 * keys (Tk > T) walks a query's keys in the blocks the whole sequence's forward walks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

#define ATT_BLOCK 64

/* Eight fixed partial sums (lane i % 8), added in a fixed tree: the compiler can vectorise
 * it without -ffast-math and the order never depends on threads. */
static float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static float rnd(float x, moe_recipe prec) {
    return prec == MOE_RECIPE_BF16 ? moe_round_bf16(x) : x;
}

void moe_cpu_attention_forward(const moe_backend *be, moe_buf outb, float *lse, moe_cbuf q,
                               moe_cbuf k, moe_cbuf v, const int32_t *doc_start, int64_t B,
                               int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                               moe_recipe prec) {
    (void)be;
    const float *qr = moe_cpu_operand_typed(q, B * T * H * D, prec);
    const float *kr = moe_cpu_operand_typed(k, B * Tk * KV * D, prec);
    const float *vr = moe_cpu_operand_typed(v, B * Tk * KV * D, prec);
    float *out = moe_cpu_output(outb, B * T * H * D);
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t group = H / KV;
#pragma omp parallel
    {
        float *acc = malloc((size_t)D * sizeof(float));
        float s[ATT_BLOCK];
        if (!acc) abort(); /* D floats of host scratch */
#pragma omp for schedule(dynamic, 4) collapse(3)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++) {
                    const float *qi = qr + ((b * T + t) * H + h) * D;
                    const int64_t g = h / group, pos = t + Tk - T; /* the query's position */
                    float m = -INFINITY, l = 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] = 0.0f;
                    const int64_t first = doc_start ? doc_start[b * T + t] : 0;
                    for (int64_t j0 = first; j0 <= pos; j0 += ATT_BLOCK) {
                        int64_t j1 = j0 + ATT_BLOCK <= pos + 1 ? j0 + ATT_BLOCK : pos + 1;
                        float bm = -INFINITY;
                        for (int64_t j = j0; j < j1; j++) {
                            s[j - j0] = scale * dot(qi, kr + ((b * Tk + j) * KV + g) * D, D);
                            if (s[j - j0] > bm) bm = s[j - j0];
                        }
                        float mn = bm > m ? bm : m;
                        float corr = moe_cpu_expf(m - mn); /* 0 on the first block (m = -inf) */
                        l *= corr;
                        for (int64_t d = 0; d < D; d++)
                            acc[d] *= corr;
                        for (int64_t j = 0; j < j1 - j0; j++)
                            s[j] = moe_cpu_expf(s[j] - mn);
                        for (int64_t j = j0; j < j1; j++) {
                            l += s[j - j0];
                            float pr = rnd(s[j - j0], prec);
                            const float *vj = vr + ((b * Tk + j) * KV + g) * D;
                            for (int64_t d = 0; d < D; d++)
                                acc[d] += pr * vj[d];
                        }
                        m = mn;
                    }
                    float *oi = out + ((b * T + t) * H + h) * D;
                    for (int64_t d = 0; d < D; d++)
                        oi[d] = rnd(acc[d] / l, prec);
                    lse[(b * H + h) * T + t] = m + logf(l);
                }
        free(acc);
    }
    moe_cpu_output_store(outb, out, B * T * H * D);
    moe_cpu_operand_free(qr, q.p);
    moe_cpu_operand_free(kr, k.p);
    moe_cpu_operand_free(vr, v.p);
}

void moe_cpu_attention_backward(const moe_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, moe_cbuf q, moe_cbuf k, moe_cbuf v,
                                moe_cbuf outb, const float *lse, const int32_t *doc_start,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                moe_recipe prec, moe_grad_store st) {
    (void)be;
    if (st == MOE_GRAD_SET) { /* the reference writes by adding into zeros */
        memset(dq, 0, (size_t)(B * T * H * D) * sizeof(float));
        memset(dk, 0, (size_t)(B * T * KV * D) * sizeof(float));
        memset(dv, 0, (size_t)(B * T * KV * D) * sizeof(float));
    }
    const float *qr = moe_cpu_operand_typed(q, B * T * H * D, prec);
    const float *kr = moe_cpu_operand_typed(k, B * T * KV * D, prec);
    const float *vr = moe_cpu_operand_typed(v, B * T * KV * D, prec);
    const float *gr = moe_cpu_operand(dout, B * T * H * D, prec);
    /* the forward output's values (a BF16 one widened; the row term reads it unrounded) */
    const float *out = moe_cpu_operand_typed(outb, B * T * H * D, MOE_RECIPE_FP32);
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t group = H / KV;
    /* Di = sum_d dout * out: the softmax-backward row term, [B, H, T] */
    float *Dr = malloc((size_t)(B * H * T) * sizeof(float));
    if (!Dr) abort();
#pragma omp parallel for schedule(static) collapse(3)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t o = ((b * T + t) * H + h) * D;
                Dr[(b * H + h) * T + t] = dot(dout + o, out + o, D);
            }
            /* One task per (batch, kv head) owns dq of the heads of its group and dk/dv of that kv
             * head, so p and dp are computed once and every sum has a fixed order. */
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < KV; g++)
            for (int64_t h = g * group; h < (g + 1) * group; h++)
                for (int64_t t = 0; t < T; t++) {
                    int64_t oq = ((b * T + t) * H + h) * D;
                    const float *qi = qr + oq, *gi = gr + oq;
                    float *dqi = dq + oq;
                    float li = lse[(b * H + h) * T + t], di = Dr[(b * H + h) * T + t];
                    float pb[ATT_BLOCK], ds[ATT_BLOCK];
                    const int64_t first = doc_start ? doc_start[b * T + t] : 0;
                    for (int64_t j0 = first; j0 <= t; j0 += ATT_BLOCK) {
                        int64_t nb = j0 + ATT_BLOCK <= t + 1 ? ATT_BLOCK : t + 1 - j0;
                        for (int64_t j = 0; j < nb; j++)
                            pb[j] = scale * dot(qi, kr + ((b * T + j0 + j) * KV + g) * D, D) - li;
                        for (int64_t j = 0; j < nb; j++)
                            pb[j] = moe_cpu_expf(pb[j]);
                        for (int64_t j = 0; j < nb; j++) {
                            const float *vj = vr + ((b * T + j0 + j) * KV + g) * D;
                            ds[j] = rnd(pb[j] * (dot(gi, vj, D) - di), prec) * scale;
                            pb[j] = rnd(pb[j], prec);
                        }
                        for (int64_t j = 0; j < nb; j++) {
                            int64_t ok = ((b * T + j0 + j) * KV + g) * D;
                            const float *kj = kr + ok;
                            float *dkj = dk + ok, *dvj = dv + ok;
                            float dsj = ds[j], pj = pb[j];
                            for (int64_t d = 0; d < D; d++) {
                                dqi[d] += dsj * kj[d];
                                dkj[d] += dsj * qi[d];
                                dvj[d] += pj * gi[d];
                            }
                        }
                    }
                }
    free(Dr);
    moe_cpu_operand_free(qr, q.p);
    moe_cpu_operand_free(kr, k.p);
    moe_cpu_operand_free(vr, v.p);
    moe_cpu_operand_free(gr, dout);
    moe_cpu_operand_free(out, outb.p);
}
