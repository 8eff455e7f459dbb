/* ops_dense: matrix products of the CPU backend - Linear layers (y = x W^T and its two
 * backward products) and the grouped expert matmul over variable row counts per expert.
 *
 * All GEMMs go through moe_cpu_gemm: cblas_sgemm when built with OpenBLAS, else an OpenMP
 * kernel in which every output element is a single dot product in ascending k (so results
 * do not depend on the thread count). Under the bf16 recipe, operands are rounded to bf16
 * into temporary copies first and forward outputs are stored rounded; gradients stay fp32.
 * Temporary buffers come from malloc; running out of host memory there aborts with a
 * message (the op table has no error channel on the CPU: a failed malloc of a scratch copy
 * is the same condition as the OOM killer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/quant.h"
#include "ops/cpu/cpu_ops.h"

#ifdef MOE_HAVE_CBLAS
#include <cblas.h>
#endif
#undef I /* <complex.h> (pulled in by cblas.h) defines I; here it is an input size */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "moe: cpu backend: out of memory allocating %zu bytes of scratch\n", n);
        abort();
    }
    return p;
}

void moe_cpu_round_bf16_inplace(float *x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = moe_round_bf16(x[i]);
}

const float *moe_cpu_operand(const float *x, int64_t n, moe_recipe prec) {
    if (prec != MOE_RECIPE_BF16 || !x) return x;
    float *c = xmalloc((size_t)n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        c[i] = moe_round_bf16(x[i]);
    return c;
}

void moe_cpu_operand_free(const float *copy, const float *orig) {
    if (copy != orig) free((void *)copy);
}

float *moe_cpu_output(moe_buf y, int64_t n) {
    return y.dt == MOE_DTYPE_F32 ? y.p : xmalloc((size_t)n * sizeof(float));
}

float *moe_cpu_grad_output(moe_buf y, int64_t n, moe_grad_store st) {
    float *g = moe_cpu_output(y, n);
    if (g != y.p && st == MOE_GRAD_ADD) {
        moe_cbuf c = moe_cbuf_from(y);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            g[i] = moe_cbuf_get(c, i);
    }
    return g;
}

void moe_cpu_output_store(moe_buf y, float *scratch, int64_t n) {
    if (y.dt == MOE_DTYPE_F32) return;
    if (y.mx) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < n / 32; b++)
            moe_cpu_store_block(y, 32 * b, scratch + 32 * b, 32);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            moe_buf_set(y, i, scratch[i]);
    }
    free(scratch);
}

void moe_cpu_store_block(moe_buf y, int64_t i0, const float *v, int64_t cnt) {
    if (y.mx) {
        float r[32];
        for (int j = 0; j < 32; j++)
            r[j] = moe_round_bf16(v[j]);
        moe_mxfp8_encode_block((uint8_t *)y.p + i0, y.mx + i0 / 32, r, 0);
        return;
    }
    for (int64_t j = 0; j < cnt; j++)
        moe_buf_set(y, i0 + j, v[j]);
}

const float *moe_cpu_operand_typed(moe_cbuf w, int64_t n, moe_recipe prec) {
    if (w.dt != MOE_DTYPE_BF16 && !w.mx) return moe_cpu_operand(w.p, n, prec);
    float *c = xmalloc((size_t)n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        c[i] = moe_cbuf_get(w, i);
    return c;
}

/* out[c, r] = in[r, c] for a [R, C] matrix */
static float *transpose_copy(const float *in, int64_t R, int64_t C) {
    float *out = xmalloc((size_t)(R * C) * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++)
        for (int64_t r = 0; r < R; r++)
            out[c * R + r] = in[r * C + c];
    return out;
}

void moe_cpu_gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, const float *B, float beta, float *C) {
    if (M <= 0 || N <= 0) return;
    /* Bring both operands to "K contiguous" form: a [M,K], bt [N,K]. */
    float *a_copy = trans_a ? transpose_copy(A, K, M) : NULL;
    float *b_copy = trans_b ? NULL : transpose_copy(B, K, N);
    const float *a = trans_a ? a_copy : A;
    const float *bt = trans_b ? B : b_copy;
    const int64_t JB = 64; /* columns per block: keeps a block of bt rows in cache */
#pragma omp parallel for schedule(static) collapse(2)
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j0 = 0; j0 < N; j0 += JB) {
            const float *ai = a + i * K;
            int64_t j1 = j0 + JB < N ? j0 + JB : N;
            for (int64_t j = j0; j < j1; j++) {
                const float *bj = bt + j * K;
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++)
                    s += ai[k] * bj[k];
                float prev = beta == 0.0f ? 0.0f : beta * C[i * N + j];
                C[i * N + j] = alpha * s + prev;
            }
        }
    }
    free(a_copy);
    free(b_copy);
}

void moe_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, const float *B, float beta, float *C) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* empty reduction: C = beta * C */
        for (int64_t i = 0; i < M * N; i++)
            C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
#ifdef MOE_HAVE_CBLAS
    /* OpenBLAS's own threading is not bit-reproducible across thread counts (its partition
     * changes which micro-kernels handle which elements), so it runs single-threaded here
     * and we parallelise over a FIXED grid of output tiles: every tile is the same
     * single-threaded call whatever the number of OpenMP threads. */
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    const int64_t TM = 128, TN = 128;
    int64_t tm = (M + TM - 1) / TM, tn = (N + TN - 1) / TN;
    int lda = trans_a ? (int)M : (int)K, ldb = trans_b ? (int)K : (int)N;
#pragma omp parallel for schedule(dynamic, 1) if (tm * tn > 1)
    for (int64_t t = 0; t < tm * tn; t++) {
        int64_t m0 = (t / tn) * TM, n0 = (t % tn) * TN;
        int64_t mb = M - m0 < TM ? M - m0 : TM, nb = N - n0 < TN ? N - n0 : TN;
        const float *a = trans_a ? A + m0 : A + m0 * K;
        const float *b = trans_b ? B + n0 * K : B + n0;
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, (int)mb, (int)nb, (int)K, alpha, a, lda, b,
                    ldb, beta, C + m0 * N + n0, (int)N);
    }
#else
    moe_cpu_gemm_ref(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
#endif
}

/* An fp8-block activation pair is an operand of the fp8-block products alone: aborts naming
 * the op and the operand (what) when one comes under another recipe. */
static void pair_in_fp8(const char *op, const char *what, int pair, moe_recipe prec) {
    if (!pair || moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) return;
    fprintf(stderr,
            "moe: cpu backend: an fp8-block activation pair as the %s of %s outside the "
            "fp8-block recipes\n",
            what, op);
    abort();
}

void moe_cpu_matmul_forward(const moe_backend *be, moe_buf yb, moe_cbuf x, moe_cbuf w, int64_t N,
                            int64_t I, int64_t O, moe_recipe prec) {
    (void)be;
    pair_in_fp8("matmul_forward", "x", moe_cbuf_is_fp8_pair(x), prec);
    if (moe_cpu_is_fp8(prec)) {
        moe_cpu_fp8_matmul_forward(yb, x, w, N, I, O, prec);
        return;
    }
    const float *xr = moe_cpu_operand_typed(x, N * I, prec);
    const float *wr = moe_cpu_operand_typed(w, O * I, prec);
    float *y = moe_cpu_output(yb, N * O);
    moe_cpu_gemm(0, 1, N, O, I, 1.0f, xr, wr, 0.0f, y);
    if (prec == MOE_RECIPE_BF16) moe_cpu_round_bf16_inplace(y, N * O);
    moe_cpu_output_store(yb, y, N * O);
    moe_cpu_operand_free(xr, x.p);
    moe_cpu_operand_free(wr, w.p);
}

void moe_cpu_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy, moe_cbuf x,
                             moe_cbuf w, int64_t N, int64_t I, int64_t O, moe_recipe prec,
                             moe_grad_store dx_st, moe_grad_store dw_st) {
    (void)be;
    pair_in_fp8("matmul_backward", "dy or x", moe_cbuf_is_fp8_pair(dy) || moe_cbuf_is_fp8_pair(x),
                prec);
    if (moe_cpu_is_fp8(prec)) {
        moe_cpu_fp8_matmul_backward(dx, dw, dy, x, w, N, I, O, prec, dx_st, dw_st);
        return;
    }
    const float *dyr = moe_cpu_operand_typed(dy, N * O, prec);
    if (dx) { /* dx[N,I] (+)= dy[N,O] W[O,I] */
        const float *wr = moe_cpu_operand_typed(w, O * I, prec);
        moe_cpu_gemm(0, 0, N, I, O, 1.0f, dyr, wr, moe_grad_beta(dx_st), dx);
        moe_cpu_operand_free(wr, w.p);
    }
    if (dw) { /* dw[O,I] (+)= dy^T[O,N] x[N,I] (no rows: written as zeros under SET) */
        const float *xr = moe_cpu_operand_typed(x, N * I, prec);
        moe_cpu_gemm(1, 0, O, I, N, 1.0f, dyr, xr, moe_grad_beta(dw_st), dw);
        moe_cpu_operand_free(xr, x.p);
    }
    moe_cpu_operand_free(dyr, dy.p);
}

void moe_cpu_grouped_matmul_forward(const moe_backend *be, moe_buf yb, moe_cbuf x, moe_cbuf w,
                                    const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                    moe_recipe prec) {
    (void)be;
    pair_in_fp8("grouped_matmul_forward", "x", moe_cbuf_is_fp8_pair(x), prec);
    if (moe_cpu_is_fp8(prec)) {
        moe_cpu_fp8_grouped_forward(yb, x, w, offsets, E, I, O, prec);
        return;
    }
    int64_t M = offsets[E];
    const float *xr = moe_cpu_operand_typed(x, M * I, prec);
    /* a BF16 output is computed in fp32 first and stored rounded (what the F32 path does) */
    float *y = moe_cpu_output(yb, M * O);
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue;
        moe_cbuf w_e = moe_cbuf_at(w, e * O * I);
        const float *we = moe_cpu_operand_typed(w_e, O * I, prec);
        moe_cpu_gemm(0, 1, n, O, I, 1.0f, xr + r0 * I, we, 0.0f, y + r0 * O);
        moe_cpu_operand_free(we, w_e.p);
    }
    if (prec == MOE_RECIPE_BF16) moe_cpu_round_bf16_inplace(y, M * O);
    moe_cpu_output_store(yb, y, M * O);
    moe_cpu_operand_free(xr, x.p);
}

/* The fp32 / bf16 products of the grouped backward: dx [M, I] (+)= dy W_e, dw [E, O, I] (+)=
 * dy_e^T x_e per expert with rows (dx or dw NULL: not computed). */
static void dense_grouped_backward(float *dx, float *dw, moe_cbuf dy, moe_cbuf x, moe_cbuf w,
                                   const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                   moe_recipe prec, moe_grad_store dx_st, moe_grad_store dw_st) {
    int64_t M = offsets[E];
    const float *dyr = moe_cpu_operand_typed(dy, M * O, prec);
    const float *xr = dw ? moe_cpu_operand_typed(x, M * I, prec) : NULL;
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue;
        if (dx) {
            moe_cbuf w_e = moe_cbuf_at(w, e * O * I);
            const float *we = moe_cpu_operand_typed(w_e, O * I, prec);
            moe_cpu_gemm(0, 0, n, I, O, 1.0f, dyr + r0 * O, we, moe_grad_beta(dx_st), dx + r0 * I);
            moe_cpu_operand_free(we, w_e.p);
        }
        if (dw)
            moe_cpu_gemm(1, 0, O, I, n, 1.0f, dyr + r0 * O, xr + r0 * I, moe_grad_beta(dw_st),
                         dw + e * O * I);
    }
    moe_cpu_operand_free(dyr, dy.p);
    if (xr) moe_cpu_operand_free(xr, x.p);
}

void moe_cpu_grouped_matmul_backward(const moe_backend *be, moe_buf dxb, moe_buf dwb, moe_cbuf dy,
                                     moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                     int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                                     moe_grad_store dw_st) {
    (void)be;
    pair_in_fp8("grouped_matmul_backward", "dy or x",
                moe_cbuf_is_fp8_pair(dy) || moe_cbuf_is_fp8_pair(x), prec);
    int64_t M = offsets[E];
    float *dw = dwb.p ? moe_cpu_grad_output(dwb, E * O * I, dw_st) : NULL; /* fp32 (or dwb) */
    if (dw && dw_st == MOE_GRAD_SET) /* the experts with no rows: their weight gradient is zero */
        for (int64_t e = 0; e < E; e++)
            if (offsets[e + 1] <= offsets[e])
                memset(dw + e * O * I, 0, (size_t)(O * I) * sizeof(float));
    float *dx = dxb.p ? moe_cpu_grad_output(dxb, M * I, dx_st) : NULL; /* fp32 (or dxb) */
    if (moe_cpu_is_fp8(prec))
        moe_cpu_fp8_grouped_backward(dx, dw, dy, x, w, offsets, E, I, O, prec, dx_st, dw_st);
    else
        dense_grouped_backward(dx, dw, dy, x, w, offsets, E, I, O, prec, dx_st, dw_st);
    if (dx) moe_cpu_output_store(dxb, dx, M * I);
    if (dw) moe_cpu_output_store(dwb, dw, E * O * I);
}

void moe_cpu_grouped_dgrad_sum(const moe_backend *be, moe_buf dxb, moe_cbuf dya, moe_cbuf wa,
                               moe_cbuf dyb, moe_cbuf wb, const int32_t *offsets, int64_t E,
                               int64_t I, int64_t O, moe_recipe prec) {
    (void)be;
    if ((moe_cbuf_is_fp8_pair(dya) || moe_cbuf_is_fp8_pair(dyb)) &&
        moe_recipe_format(prec) != MOE_RECIPE_FP8_BLOCK) {
        fprintf(stderr, "moe: cpu backend: an fp8-block activation pair as a dy of a grouped "
                        "dgrad sum outside the fp8-block recipes\n");
        abort();
    }
    const int64_t M = offsets[E];
    float *dx = moe_cpu_grad_output(dxb, M * I, MOE_GRAD_SET); /* fp32 (or dxb): the one sum */
    const moe_cbuf dy[2] = {dya, dyb}, w[2] = {wa, wb}, none = moe_cbuf_f32(NULL);
    for (int j = 0; j < 2; j++) {
        const moe_grad_store st = j ? MOE_GRAD_ADD : MOE_GRAD_SET;
        if (moe_cpu_is_fp8(prec))
            moe_cpu_fp8_grouped_backward(dx, NULL, dy[j], none, w[j], offsets, E, I, O, prec, st,
                                         MOE_GRAD_SET);
        else
            dense_grouped_backward(dx, NULL, dy[j], none, w[j], offsets, E, I, O, prec, st,
                                   MOE_GRAD_SET);
    }
    moe_cpu_output_store(dxb, dx, M * I);
}
