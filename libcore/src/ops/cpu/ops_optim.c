/* ops_optim: AdamW, the bf16 cast of weight copies and the sum of squares (gradient norm) of
 * the CPU backend.
 *
 * AdamW is elementwise (trivially deterministic); its moments are F32 or BF16 (moe/ops.h), its
 * master an fp32 array or the two halves of a split master (the same update either way),
 * and every product and sum is rounded on its own (C11 without FP_CONTRACT: no fused
 * multiply-add), which is what the CUDA backend repeats bit for bit for BF16 moments.
 * sum_squares sums fixed chunks of MOE_CPU_CHUNK elements in double and then the chunk sums
 * in index order, so the global grad norm - and with it clipping and every later step - is
 * identical for any thread count. */
#include <math.h>
#include <stdlib.h>

#include "ops/cpu/cpu_ops.h"

/* Stores the new moment x at b[i] and returns the value stored: x for F32, x rounded to
 * nearest even for BF16. The update is computed from this value, not from x, so that the
 * stored moments are the optimizer's whole state: every step reads only them (which is what
 * exact resume needs: a checkpoint holds exactly them, see train_ckpt.c) and the update a
 * step made follows from the moments it stored alone, on any backend. */
static inline float adamw_store_moment(moe_buf b, int64_t i, float x) {
    if (b.dt != MOE_DTYPE_BF16) {
        ((float *)b.p)[i] = x;
        return x;
    }
    uint16_t h = moe_f32_to_bf16(x);
    ((uint16_t *)b.p)[i] = h;
    return moe_bf16_to_f32(h);
}

void moe_cpu_adamw(const moe_backend *be, float *param, uint16_t *param16, uint16_t *param_lo,
                   moe_cbuf grad, moe_buf m, moe_buf v, int64_t n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
    (void)be;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    const moe_cbuf mr = moe_cbuf_from(m), vr = moe_cbuf_from(v);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = moe_cbuf_get(grad, i) * grad_scale;
        float mi = beta1 * moe_cbuf_get(mr, i) + (1.0f - beta1) * g;
        float vi = beta2 * moe_cbuf_get(vr, i) + (1.0f - beta2) * g * g;
        mi = adamw_store_moment(m, i, mi);
        vi = adamw_store_moment(v, i, vi);
        float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps);
        float p = param_lo ? moe_f32_join_bf16(param16[i], param_lo[i]) : param[i];
        p -= lr * (upd + weight_decay * p);
        if (param_lo) {
            moe_f32_split_bf16(p, &param16[i], &param_lo[i]);
            continue;
        }
        param[i] = p;
        if (param16) param16[i] = moe_f32_to_bf16(p);
    }
}

void moe_cpu_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dst[i] = moe_f32_to_bf16(src[i]);
}

double moe_cpu_sum_squares(const moe_backend *be, moe_cbuf x, int64_t n) {
    (void)be;
    int64_t nchunk = (n + MOE_CPU_CHUNK - 1) / MOE_CPU_CHUNK;
    if (nchunk == 0) return 0.0;
    double *part = malloc((size_t)nchunk * sizeof(double));
    if (!part) abort(); /* n/4096 doubles of host scratch */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunk; c++) {
        int64_t i1 = (c + 1) * MOE_CPU_CHUNK < n ? (c + 1) * MOE_CPU_CHUNK : n;
        double s = 0.0;
        for (int64_t i = c * MOE_CPU_CHUNK; i < i1; i++) {
            double xi = moe_cbuf_get(x, i);
            s += xi * xi;
        }
        part[c] = s;
    }
    double s = 0.0;
    for (int64_t c = 0; c < nchunk; c++)
        s += part[c];
    free(part);
    return s;
}
