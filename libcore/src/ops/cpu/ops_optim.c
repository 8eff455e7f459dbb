/* ops_optim: AdamW, the bf16 cast of weight copies and the sum of squares (gradient norm) of
 * the CPU backend.
 *
 * AdamW is elementwise (trivially deterministic). sum_squares sums fixed chunks of
 * MOE_CPU_CHUNK elements in double and then the chunk sums in index order, so the global
 * grad norm - and with it clipping and every later step - is identical for any thread count. */
#include <math.h>
#include <stdlib.h>

#include "ops/cpu/cpu_ops.h"

void moe_cpu_adamw(const moe_backend *be, float *param, uint16_t *param16, const float *grad,
                   float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                   float weight_decay, int64_t step, float grad_scale) {
    (void)be;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps);
        param[i] -= lr * (upd + weight_decay * param[i]);
        if (param16) param16[i] = moe_f32_to_bf16(param[i]);
    }
}

void moe_cpu_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dst[i] = moe_f32_to_bf16(src[i]);
}

double moe_cpu_sum_squares(const moe_backend *be, const float *x, int64_t n) {
    (void)be;
    int64_t nchunk = (n + MOE_CPU_CHUNK - 1) / MOE_CPU_CHUNK;
    if (nchunk == 0) return 0.0;
    double *part = malloc((size_t)nchunk * sizeof(double));
    if (!part) abort(); /* n/4096 doubles of host scratch */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunk; c++) {
        int64_t i1 = (c + 1) * MOE_CPU_CHUNK < n ? (c + 1) * MOE_CPU_CHUNK : n;
        double s = 0.0;
        for (int64_t i = c * MOE_CPU_CHUNK; i < i1; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0.0;
    for (int64_t c = 0; c < nchunk; c++)
        s += part[c];
    free(part);
    return s;
}
