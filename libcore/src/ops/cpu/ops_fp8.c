/* ops_fp8: the CPU emulation of the fp8 recipes' matrix products (precision.recipe fp8-block
 * and mxfp8; the formats are moe/quant.h's). Each operand is fake-quantized along the
 * dimension its product reduces over, then the fp32 GEMM of ops_dense runs on the dequantized
 * values, accumulating in fp32; forward outputs are stored rounded to bf16, gradients fp32.
 *
 * The one thing a reader must know is which way each operand is quantized:
 *   forward  y = x W^T    x along its rows (over I); W as a weight (over I)
 *   dgrad   dx = dy W     dy along its rows (over O); W as a weight (over O)
 *   wgrad   dW = dy^T x   dy and x along their columns (over the tokens N); under
 *                         precision.fp8_wgrad x-tiles x in 128 x 128 tiles instead
 * A weight under fp8-block is read from its persistent e4m3 copies (moe/ops.h: written by
 * moe_cpu_quantize_weight from the master, one scale per 128 x 128 tile): the row-wise copy
 * for the forward, the transposed one for dgrad, decoded back to [O, I] so that the fp32
 * GEMM runs in the order it always did. Under mxfp8 the weight is the fp32 master with
 * row-wise (forward) and column-wise (dgrad) vectors quantized per call. In the grouped
 * products each expert's rows are their own group: the wgrad blocks along N start at the
 * expert's first row. The expert activations may be MXFP8 operands (the model stores them so
 * under mxfp8): read as their values; an MXFP8 output holds the encoding of the bf16 output.
 * Under fp8-block the grouped products' x (SwiGLU's output g), the grouped backward's dy
 * (SwiGLU's gradients) and the dense products' x (RMSNorm's ln1, a pair of one group: a dense
 * product is the grouped one of a single group) may be fp8-block activation pairs
 * (moe/quant.h): their copies are the products' operands as they stand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/quant.h"
#include "ops/cpu/cpu_ops.h"

enum { Q_ROWS, Q_COLS, Q_WEIGHT_ROWS, Q_WEIGHT_COLS, Q_WGRAD_X };

int moe_cpu_is_fp8(moe_recipe prec) {
    return moe_recipe_is_fp8(prec);
}

/* A malloc'ed fp32 scratch of n values; aborts on host OOM like the rest of the CPU
 * backend's scratch. */
static float *scratch(int64_t n) {
    float *c = malloc((size_t)n * sizeof(float) + 1);
    if (!c) {
        fprintf(stderr, "moe: cpu backend: out of memory for an fp8 operand copy\n");
        abort();
    }
    return c;
}

/* Expert e's weight [O, I] under fp8-block from the E4M3 copies w of [E, O, I] (moe/ops.h's
 * layout): the row-wise copy (how = Q_WEIGHT_ROWS) or the transposed one (Q_WEIGHT_COLS),
 * decoded into a malloc'ed [O, I]. A weight of another type is a caller's bug: aborts. */
static float *weight_copy(moe_cbuf w, int64_t E, int64_t e, int64_t O, int64_t I, int how) {
    if (w.dt != MOE_DTYPE_E4M3 || !w.s) {
        fprintf(stderr,
                "moe: cpu backend: an fp8-block product got a %s weight (its e4m3 copies "
                "from quantize_weight expected)\n",
                moe_dtype_name(w.dt));
        abort();
    }
    const uint8_t *q = w.p;
    float *c = scratch(O * I);
    if (how == Q_WEIGHT_ROWS)
        moe_quant_tiles_decode(c, q + e * O * I, w.s + e * moe_fp8_tile_scales(O, I), O, I, 0);
    else
        moe_quant_tiles_decode(c, q + (E + e) * O * I,
                               w.s + E * moe_fp8_tile_scales(O, I) + e * moe_fp8_tile_scales(I, O),
                               I, O, 1);
    return c;
}

/* The values the product multiplies for operand m, a row-major [R, K] of m's type: a
 * malloc'ed fp32 copy quantized along rows (Q_ROWS, the product reduces over K), columns
 * (Q_COLS, over R), or as an mxfp8 weight whose product reduces over K (Q_WEIGHT_ROWS) or R
 * (Q_WEIGHT_COLS); Q_WGRAD_X is a wgrad's x (reducing over R): in 128 x 128 tiles from its
 * first row under moe_recipe_wgrad_tiles, else as Q_COLS. An MXFP8 operand read along its rows
 * under mxfp8's ceil rule is already what that quantization gives (its blocks of 32 are the rows'
 * when K is a multiple of 32, and re-quantizing MXFP8 values returns them: unit.quant), so its
 * values are used as they are. */
static float *operand(moe_cbuf m, int64_t R, int64_t K, int how, moe_recipe prec) {
    float *c = scratch(R * K);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R * K; i++)
        c[i] = moe_cbuf_get(m, i);
    const moe_quant_opts o = moe_quant_opts_of(prec);
    if (m.mx && how == Q_ROWS && prec == MOE_RECIPE_MXFP8 && K % 32 == 0) return c;
    if (how == Q_WGRAD_X && moe_recipe_wgrad_tiles(prec))
        moe_quant_fake_tiles(c, c, R, K, o.pow2);
    else if (how == Q_ROWS || how == Q_WEIGHT_ROWS)
        moe_quant_fake_vectors(c, c, R, K, K, 1, &o);
    else
        moe_quant_fake_vectors(c, c, K, 1, R, K, &o);
    return c;
}

/* Expert e's weight [O, I] of w [E, O, I] as the product reads it: its fp8-block copy, or
 * (mxfp8) the master quantized per call. */
static float *weight(moe_cbuf w, int64_t E, int64_t e, int64_t O, int64_t I, int how,
                     moe_recipe prec) {
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) return weight_copy(w, E, e, O, I, how);
    return operand(moe_cbuf_at(w, e * O * I), O, I, how, prec);
}

void moe_cpu_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w, int64_t E,
                             int64_t O, int64_t I, moe_recipe prec) {
    (void)be;
    const int pow2 = moe_recipe_pow2(prec);
    const int64_t ts = moe_fp8_tile_scales(O, I), tst = moe_fp8_tile_scales(I, O);
    for (int64_t e = 0; e < E; e++)
        moe_quant_tiles_e4m3(q + e * O * I, s + e * ts, q + (E + e) * O * I, s + E * ts + e * tst,
                             w + e * O * I, O, I, pow2);
}

void moe_cpu_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                           const moe_fp8_groups *pairs) {
    (void)be;
    if (!pairs || !moe_cbuf_is_fp8_pair(moe_cbuf_from(out)) || x.dt != MOE_DTYPE_BF16 || x.mx) {
        fprintf(stderr, "moe: cpu backend: quantize_pair got %s x, %s output and %s groups (a "
                        "BF16 x, an fp8-block pair and its groups expected)\n",
                moe_dtype_name(x.dt), moe_cbuf_is_fp8_pair(moe_cbuf_from(out)) ? "a pair" : "no pair",
                pairs ? "its" : "no");
        abort();
    }
    const int64_t n = (int64_t)pairs->offsets[pairs->E] * pairs->K;
    float *v = scratch(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        v[i] = moe_cbuf_get(x, i);
    moe_fp8_pair_encode(out.p, v, pairs->offsets, pairs->E, pairs->K, pairs->pow2, pairs->tiles);
    free(v);
}

void moe_cpu_adamw_quantize(const moe_backend *be, float *param, moe_cbuf grad, moe_buf m,
                            moe_buf v, uint8_t *q, float *s, int64_t E, int64_t O, int64_t I,
                            moe_recipe prec, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step, float grad_scale) {
    moe_cpu_adamw(be, param, NULL, NULL, grad, m, v, E * O * I, lr, beta1, beta2, eps, weight_decay,
                  step, grad_scale);
    moe_cpu_quantize_weight(be, q, s, param, E, O, I, prec);
}

/* An activation m [M, K] of the grouped products as they read it: all rows along K (how =
 * Q_ROWS: the forward's x, dgrad's dy) or group e's rows along the tokens (Q_COLS: wgrad's dy,
 * Q_WGRAD_X: wgrad's x), a malloc'ed [rows, K]. From an fp8-block activation pair the copy it
 * holds (x's transposed copy in tiles where the recipe's wgrad has them): the values
 * quantizing a BF16 m here gives, bit for bit (swiglu encodes what it would store as BF16). */
static float *group_operand(moe_cbuf m, const int32_t *offsets, int64_t E, int64_t K, int64_t e,
                            int how, moe_recipe prec) {
    const int64_t r0 = how == Q_ROWS ? 0 : offsets[e];
    const int64_t n = (how == Q_ROWS ? offsets[E] : offsets[e + 1]) - r0;
    if (!moe_cbuf_is_fp8_pair(m)) return operand(moe_cbuf_at(m, r0 * K), n, K, how, prec);
    const int tiles = how == Q_WGRAD_X && moe_recipe_wgrad_tiles(prec);
    const moe_fp8_pair_layout l = moe_fp8_pair_layout_of(offsets, E, K, tiles);
    float *c = scratch(n * K);
    if (how == Q_ROWS)
        moe_fp8_pair_rows(c, m.p, &l);
    else
        moe_fp8_pair_cols(c, m.p, &l, offsets, e);
    return c;
}

void moe_cpu_fp8_grouped_forward(moe_buf yb, moe_cbuf x, moe_cbuf w, const int32_t *offsets,
                                 int64_t E, int64_t I, int64_t O, moe_recipe prec) {
    int64_t M = offsets[E];
    float *xq = group_operand(x, offsets, E, I, 0, Q_ROWS, prec), *y = moe_cpu_output(yb, M * O);
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue;
        float *wq = weight(w, E, e, O, I, Q_WEIGHT_ROWS, prec);
        moe_cpu_gemm(0, 1, n, O, I, 1.0f, xq + r0 * I, wq, 0.0f, y + r0 * O);
        free(wq);
    }
    moe_cpu_round_bf16_inplace(y, M * O);
    moe_cpu_output_store(yb, y, M * O);
    free(xq);
}

void moe_cpu_fp8_grouped_backward(float *dx, float *dw, moe_cbuf dy, moe_cbuf x, moe_cbuf w,
                                  const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                  moe_recipe prec, moe_grad_store dx_st, moe_grad_store dw_st) {
    float *dq = dx ? group_operand(dy, offsets, E, O, 0, Q_ROWS, prec) : NULL;
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue; /* zeroed under SET by the caller */
        if (dx) {
            float *wq = weight(w, E, e, O, I, Q_WEIGHT_COLS, prec);
            moe_cpu_gemm(0, 0, n, I, O, 1.0f, dq + r0 * O, wq, moe_grad_beta(dx_st), dx + r0 * I);
            free(wq);
        }
        if (!dw) continue;
        /* the expert's rows are their own group along N */
        float *dc = group_operand(dy, offsets, E, O, e, Q_COLS, prec);
        float *xc = group_operand(x, offsets, E, I, e, Q_WGRAD_X, prec);
        moe_cpu_gemm(1, 0, O, I, n, 1.0f, dc, xc, moe_grad_beta(dw_st), dw + e * O * I);
        free(dc), free(xc);
    }
    free(dq);
}

/* The dense products are the grouped ones with a single group of all N rows (the same
 * operands and GEMM calls): x (ln1 under fp8-block training) may be an fp8-block pair of that
 * one group. */
void moe_cpu_fp8_matmul_forward(moe_buf yb, moe_cbuf x, moe_cbuf w, int64_t N, int64_t I, int64_t O,
                                moe_recipe prec) {
    const int32_t rows[2] = {0, (int32_t)N};
    moe_cpu_fp8_grouped_forward(yb, x, w, rows, 1, I, O, prec);
}

void moe_cpu_fp8_matmul_backward(float *dx, float *dw, moe_cbuf dy, moe_cbuf x, moe_cbuf w,
                                 int64_t N, int64_t I, int64_t O, moe_recipe prec,
                                 moe_grad_store dx_st, moe_grad_store dw_st) {
    if (dw && N <= 0 && dw_st == MOE_GRAD_SET) /* no rows: dw written as zeros */
        memset(dw, 0, (size_t)(O * I) * sizeof(float));
    const int32_t rows[2] = {0, (int32_t)N};
    moe_cpu_fp8_grouped_backward(dx, dw, dy, x, w, rows, 1, I, O, prec, dx_st, dw_st);
}
