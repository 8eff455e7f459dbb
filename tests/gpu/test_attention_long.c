/* gpu.attention_long: the CUDA flash attention at 131,072 tokens (the minimum),
 * bf16 recipe, grouped-query (H 8, KV 2, D 128), forward and backward.
 *
 * A CPU reference of the whole sequence would take hours, so the checks use what causality
 * guarantees instead: (1) the first T0 rows of `out`, `lse` and `dq` depend only on the first
 * T0 positions, so they must equal a separate run at T0 (same kernel, same tiles: compared by
 * NMSE); (2) a few late query rows (which attend to ~131k keys) are recomputed on the host in
 * double precision from bf16-rounded q/k/v; (3) every output is finite; (4) memory stays
 * linear in T: the device peak stays within 2x the fp32 buffers this test allocates (room
 * for the backend's bf16 operand copies; one T x T score matrix of one head alone would be
 * 64 GiB). (5) The inference path at 1,048,576 tokens in one window: a forward with bf16
 * q/k/v in and a bf16 output (what moe-embed and moe-score pass), sampled late rows against
 * the double reference, every output finite, the device peak within the buffers plus 25%.
 * Prints the forward and backward times. Exits 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/dtype.h"
#include "moe/log.h"
#include "testlib.h"

enum { T = 131072, T0 = 2048, H = 8, KV = 2, D = 128, T1M = 1048576 };

/* Uniform in [-1, 1) from a xorshift64 stream: fast enough for 10^8 values. */
static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((double)(s >> 11) * 0x1.0p-52 - 1.0);
    }
}

static double nmse(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? num / den : num;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* out[t, h, :] in double from bf16-rounded q, k, v (row t attends to keys 0..t). */
static void reference_row(double *out, const float *q, const float *k, const float *v, int64_t t,
                          int64_t h) {
    int64_t g = h / (H / KV);
    const float *qr = q + (t * H + h) * D;
    double mx = -INFINITY, sum = 0;
    double *s = malloc((size_t)(t + 1) * sizeof *s);
    for (int64_t j = 0; j <= t; j++) {
        const float *kr = k + (j * KV + g) * D;
        double dot = 0;
        for (int d = 0; d < D; d++)
            dot += (double)moe_round_bf16(qr[d]) * (double)moe_round_bf16(kr[d]);
        s[j] = dot / sqrt((double)D);
        if (s[j] > mx) mx = s[j];
    }
    for (int d = 0; d < D; d++)
        out[d] = 0;
    for (int64_t j = 0; j <= t; j++) {
        double p = exp(s[j] - mx);
        sum += p;
        const float *vr = v + (j * KV + g) * D;
        for (int d = 0; d < D; d++)
            out[d] += p * (double)moe_round_bf16(vr[d]);
    }
    for (int d = 0; d < D; d++)
        out[d] /= sum;
    free(s);
}

typedef struct run {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv; /* device */
} run;

/* Forward + backward at length n on the first n positions of the host tensors; copies
 * out, lse and dq back into the host arrays. */
static double run_attention(const moe_backend *be, int64_t n, const float *q, const float *k,
                            const float *v, const float *dout, float *out, float *lse, float *dq,
                            double *t_fwd, double *t_bwd, moe_err *err) {
    size_t nq = (size_t)n * H * D * sizeof(float), nk = (size_t)n * KV * D * sizeof(float);
    size_t nl = (size_t)n * H * sizeof(float);
    run r = {be->alloc(be, nq), be->alloc(be, nk), be->alloc(be, nk),
             be->alloc(be, nq), be->alloc(be, nl), be->alloc(be, nq),
             be->alloc(be, nq), be->alloc(be, nk), be->alloc(be, nk)};
    double bytes = (double)(5 * nq + 4 * nk + nl);
    if (!r.q || !r.k || !r.v || !r.out || !r.lse || !r.dout || !r.dq || !r.dk || !r.dv) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "device allocation failed at T=%lld", (long long)n);
        bytes = -1;
        goto done;
    }
    be->memcpy_h2d(be, r.q, q, nq);
    be->memcpy_h2d(be, r.k, k, nk);
    be->memcpy_h2d(be, r.v, v, nk);
    be->memcpy_h2d(be, r.dout, dout, nq);
    if (be->synchronize(be, err) != MOE_OK) goto fail;
    double t0 = moe_time_now();
    be->attention_forward(be, moe_buf_f32(r.out), r.lse, moe_cbuf_f32(r.q), moe_cbuf_f32(r.k),
                          moe_cbuf_f32(r.v), NULL, 1, n, n, H, KV, D, MOE_RECIPE_BF16);
    if (be->synchronize(be, err) != MOE_OK) goto fail;
    double t1 = moe_time_now();
    be->attention_backward(be, r.dq, r.dk, r.dv, r.dout, moe_cbuf_f32(r.q), moe_cbuf_f32(r.k),
                           moe_cbuf_f32(r.v), moe_cbuf_f32(r.out), r.lse, NULL, 1, n, H, KV, D,
                           MOE_RECIPE_BF16, MOE_GRAD_ADD);
    if (be->synchronize(be, err) != MOE_OK) goto fail;
    *t_fwd = t1 - t0;
    *t_bwd = moe_time_now() - t1;
    be->memcpy_d2h(be, out, r.out, nq);
    be->memcpy_d2h(be, lse, r.lse, nl);
    be->memcpy_d2h(be, dq, r.dq, nq);
    if (be->synchronize(be, err) == MOE_OK) goto done;
fail:
    bytes = -1;
done:
    be->free(be, r.q), be->free(be, r.k), be->free(be, r.v), be->free(be, r.out);
    be->free(be, r.lse), be->free(be, r.dout), be->free(be, r.dq), be->free(be, r.dk);
    be->free(be, r.dv);
    return bytes;
}

/* Uploads host [n] fp32 as bf16 into a new device buffer (NULL on failure). */
static uint16_t *upload_bf16(const moe_backend *be, const float *x, size_t n) {
    uint16_t *h = malloc(n * sizeof(uint16_t)), *d = be->alloc(be, n * sizeof(uint16_t));
    if (h && d) {
        for (size_t i = 0; i < n; i++)
            h[i] = moe_f32_to_bf16(x[i]);
        be->memcpy_h2d(be, d, h, n * sizeof(uint16_t));
    }
    free(h);
    return d;
}

/* (5): the forward at T1M tokens, typed bf16 in and out; checks sampled rows and the peak. */
static void check_inference_1m(const moe_backend *be) {
    moe_err err;
    moe_err_clear(&err);
    size_t nq = (size_t)T1M * H * D, nk = (size_t)T1M * KV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    uint16_t *out = malloc(nq * 2);
    float *lse = malloc((size_t)T1M * H * 4);
    CHECK(q && k && v && out && lse);
    if (!q || !k || !v || !out || !lse) goto host_done;
    fill(q, nq, 11), fill(k, nk, 12), fill(v, nk, 13);
    size_t cur0, peak0, cur, peak;
    be->memory(be, &cur0, &peak0);
    uint16_t *dq = upload_bf16(be, q, nq), *dk = upload_bf16(be, k, nk);
    uint16_t *dv = upload_bf16(be, v, nk), *dout = be->alloc(be, nq * 2);
    float *dlse = be->alloc(be, (size_t)T1M * H * 4);
    double bytes = (double)(nq * 2 * 2 + nk * 2 * 2 + (size_t)T1M * H * 4);
    CHECK(dq && dk && dv && dout && dlse);
    if (dq && dk && dv && dout && dlse) {
        double t0 = moe_time_now();
        be->attention_forward(be, moe_buf_of(dout, MOE_DTYPE_BF16), dlse,
                              moe_cbuf_of(dq, MOE_DTYPE_BF16), moe_cbuf_of(dk, MOE_DTYPE_BF16),
                              moe_cbuf_of(dv, MOE_DTYPE_BF16), NULL, 1, T1M, T1M, H, KV, D,
                              MOE_RECIPE_BF16);
        CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "T=%d forward: %s", T1M, err.msg);
        double f = moe_time_now() - t0;
        be->memory(be, &cur, &peak);
        be->memcpy_d2h(be, out, dout, nq * 2);
        be->memcpy_d2h(be, lse, dlse, (size_t)T1M * H * 4);
        int finite = 1;
        for (size_t i = 0; i < nq && finite; i++)
            finite = isfinite(moe_bf16_to_f32(out[i]));
        CHECK(finite && all_finite(lse, (size_t)T1M * H));
        const int64_t rows[] = {T1M - 1, T1M / 2 + 3, 700001};
        for (int i = 0; i < 3; i++)
            for (int h = 0; h < H; h += 5) {
                double ref[D];
                reference_row(ref, q, k, v, rows[i], h);
                float got[D], reff[D];
                for (int d = 0; d < D; d++) {
                    got[d] = moe_bf16_to_f32(out[((size_t)rows[i] * H + (size_t)h) * D + d]);
                    reff[d] = (float)ref[d];
                }
                double e = nmse(got, reff, D);
                printf("T=%d row %lld head %d vs double reference: nmse %.3g\n", T1M,
                       (long long)rows[i], h, e);
                CHECK(e <= 1e-3); /* bf16 P and a bf16 output: ~1e-5 expected */
            }
        double flop = 2.0 * 2.0 * H * D * (double)T1M * (double)T1M / 2.0;
        printf("T=%d forward (bf16 in and out) %.1f ms (%.0f TFLOP/s); device peak %.2f GiB "
               "for %.2f GiB of buffers\n",
               T1M, 1e3 * f, flop / f / 1e12, (double)(peak - cur0) / 1073741824.0,
               bytes / 1073741824.0);
        CHECK((double)(peak - cur0) <= 1.25 * bytes);
    }
    be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout), be->free(be, dlse);
host_done:
    free(q), free(k), free(v), free(out), free(lse);
}

int main(void) {
    const moe_backend *be = test_cuda_backend("test_attention_long");
    if (!be) return 77;
    moe_err err;
    moe_err_clear(&err);
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc((size_t)T * H * 4), *dq = malloc(nq * 4);
    float *out0 = malloc((size_t)T0 * H * D * 4), *lse0 = malloc((size_t)T0 * H * 4);
    float *dq0 = malloc((size_t)T0 * H * D * 4);
    if (!q || !k || !v || !dout || !out || !lse || !dq || !out0 || !lse0 || !dq0) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    fill(q, nq, 1), fill(k, nk, 2), fill(v, nk, 3), fill(dout, nq, 4);

    double f0, b0, f, b;
    CHECK(run_attention(be, T0, q, k, v, dout, out0, lse0, dq0, &f0, &b0, &err) > 0);
    size_t cur, peak;
    be->memory(be, &cur, &peak);
    size_t base = cur;
    double bytes = run_attention(be, T, q, k, v, dout, out, lse, dq, &f, &b, &err);
    CHECK_MSG(bytes > 0, "T=%d run failed: %s", T, err.msg);
    be->memory(be, &cur, &peak);
    if (bytes > 0) {
        /* [B, H, T] lse: the prefix rows of head h sit at h*T (long) and h*T0 (short) */
        double e_lse = 0;
        for (int h = 0; h < H; h++) {
            double e = nmse(lse + (size_t)h * T, lse0 + (size_t)h * T0, T0);
            if (e > e_lse) e_lse = e;
        }
        double e_out = nmse(out, out0, (size_t)T0 * H * D);
        double e_dq = nmse(dq, dq0, (size_t)T0 * H * D);
        printf("prefix T0=%d vs T=%d: nmse out %.3g lse %.3g dq %.3g\n", T0, T, e_out, e_lse, e_dq);
        CHECK(e_out <= 1e-12 && e_lse <= 1e-12 && e_dq <= 1e-12);
        CHECK(all_finite(out, nq) && all_finite(lse, (size_t)T * H) && all_finite(dq, nq));
        const int64_t rows[] = {T - 1, T - 777, T / 2 + 5};
        for (int i = 0; i < 3; i++) {
            for (int h = 0; h < H; h += 3) {
                double ref[D];
                reference_row(ref, q, k, v, rows[i], h);
                float got[D], reff[D];
                for (int d = 0; d < D; d++) {
                    got[d] = out[((size_t)rows[i] * H + (size_t)h) * D + (size_t)d];
                    reff[d] = (float)ref[d];
                }
                double e = nmse(got, reff, D);
                printf("row %lld head %d vs double reference: nmse %.3g\n", (long long)rows[i], h,
                       e);
                CHECK(e <= 1e-3); /* bf16 P in the PV product: ~1e-5 expected */
            }
        }
        double flop_f = 2.0 * 2.0 * H * D * (double)T * (double)T / 2.0; /* causal QK^T + PV */
        printf("T=%d fwd %.1f ms (%.0f TFLOP/s), bwd %.1f ms (%.0f TFLOP/s at 2.5x fwd)\n", T,
               1e3 * f, flop_f / f / 1e12, 1e3 * b, 2.5 * flop_f / b / 1e12);
        printf("device peak %.2f GiB above the %.2f GiB this run allocated (%.2f GiB before)\n",
               (double)(peak - base) / 1073741824.0, bytes / 1073741824.0,
               (double)base / 1073741824.0);
        CHECK((double)(peak - base) <= 2.0 * bytes);
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq);
    free(out0), free(lse0), free(dq0);
    check_inference_1m(be);
    be->destroy(be);
    return test_summary("gpu.attention_long");
}
