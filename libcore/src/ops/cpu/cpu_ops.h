/* cpu_ops: private declarations shared by the CPU backend's files (libcore/src/cpu/).
 *
 * Each ops_<family>.c implements the entries of one op family with exactly the signatures
 * of the moe_backend table in moe/ops.h; backend_cpu.c assembles the table. The one thing a
 * reader must know: every reduction here runs over fixed-size chunks in a fixed order, never
 * over "whatever each thread got", so results are identical for any OMP thread count. */
#ifndef MOE_CPU_OPS_H
#define MOE_CPU_OPS_H

#include <stdint.h>

#include "moe/dtype.h"
#include "moe/ops.h"

#define MOE_CPU_CHUNK 4096 /* elements per fixed reduction chunk */

/* exp(x) in fp32 without libm and without branches, so loops calling it vectorise:
 * Cephes' expf (range reduction by ln 2 in two parts, degree-6 polynomial, scale by 2^n
 * through the exponent bits); within 2 ulp of expf for x in [-87, 88], 0 below -87
 * (so exp(-inf) = 0), saturates at exp(88) above. NaN gives NaN. */
static inline float moe_cpu_expf(float x) {
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float y = p * moe_f32_from_bits((uint32_t)((int32_t)n + 127) << 23);
    return x < -87.0f ? 0.0f : y;
}

/* Plain GEMM on row-major matrices, C = alpha * op(A) op(B) + beta * C, op = transpose when
 * the flag is set; A is [M,K] (or [K,M] transposed), B is [K,N] (or [N,K]), C is [M,N].
 * Uses cblas_sgemm when built with MOE_HAVE_CBLAS, else moe_cpu_gemm_ref. Call it from
 * serial code only (it parallelises itself). */
void moe_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, const float *B, float beta, float *C);
/* The OpenMP blocked fallback (always built, tested against cblas when both exist). Each
 * C element is one dot product in ascending k: thread-count independent. */
void moe_cpu_gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, const float *B, float beta, float *C);
/* Returns x itself for fp32, else a malloc'ed copy rounded to bf16 (caller frees via
 * moe_cpu_operand_free(copy, x)). NULL on allocation failure. */
const float *moe_cpu_operand(const float *x, int64_t n, moe_recipe prec);
void moe_cpu_operand_free(const float *copy, const float *orig);
/* The fp32 values of a matrix-product operand w of n elements under prec: for F32 as
 * moe_cpu_operand (w itself, or a rounded copy), for BF16 and MXFP8 a malloc'ed decoded
 * copy. Free with moe_cpu_operand_free(result, w.p). */
const float *moe_cpu_operand_typed(moe_cbuf w, int64_t n, moe_recipe prec);
/* An fp32 buffer for a typed output y of n elements: y itself when F32, else a malloc'ed
 * scratch that moe_cpu_output_store(y, scratch, n) stores (rounded to BF16, or encoded as
 * MXFP8 by moe_cpu_store_block) and frees. */
float *moe_cpu_output(moe_buf y, int64_t n);
/* The same for a gradient output the op adds into or writes as st says: under MOE_GRAD_ADD
 * the scratch starts with y's values. */
float *moe_cpu_grad_output(moe_buf y, int64_t n, moe_grad_store st);
void moe_cpu_output_store(moe_buf y, float *scratch, int64_t n);
/* Stores v [cnt] at elements [i0, i0 + cnt) of y: elementwise (rounded when BF16), or for
 * an MXFP8 y one block (i0 a multiple of 32, cnt 32), encoding each value's bf16 rounding
 * (what a BF16 output would hold): the one place that rule lives. The elementwise ops write
 * 32 values at a time through it, so that every output type takes the same loop. */
void moe_cpu_store_block(moe_buf y, int64_t i0, const float *v, int64_t cnt);
void moe_cpu_round_bf16_inplace(float *x, int64_t n);

/* ops_dense.c */
void moe_cpu_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N,
                            int64_t I, int64_t O, moe_recipe prec);
void moe_cpu_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy, moe_cbuf x,
                             moe_cbuf w, int64_t N, int64_t I, int64_t O, moe_recipe prec,
                             moe_grad_store dx_st, moe_grad_store dw_st);
void moe_cpu_grouped_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w,
                                    const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                    moe_recipe prec);
void moe_cpu_grouped_matmul_backward(const moe_backend *be, moe_buf dx, moe_buf dw, moe_cbuf dy,
                                     moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                     int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                                     moe_grad_store dw_st);
void moe_cpu_grouped_dgrad_sum(const moe_backend *be, moe_buf dx, moe_cbuf dya, moe_cbuf wa,
                               moe_cbuf dyb, moe_cbuf wb, const int32_t *offsets, int64_t E,
                               int64_t I, int64_t O, moe_recipe prec);

/* ops_fp8.c: the fp8 recipes' products (moe_cpu_is_fp8), called by the products above */
int moe_cpu_is_fp8(moe_recipe prec);
void moe_cpu_fp8_matmul_forward(moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N, int64_t I, int64_t O,
                                moe_recipe prec);
void moe_cpu_fp8_matmul_backward(float *dx, float *dw, moe_cbuf dy, moe_cbuf x, moe_cbuf w,
                                 int64_t N, int64_t I, int64_t O, moe_recipe prec,
                                 moe_grad_store dx_st, moe_grad_store dw_st);
void moe_cpu_fp8_grouped_forward(moe_buf y, moe_cbuf x, moe_cbuf w, const int32_t *offsets,
                                 int64_t E, int64_t I, int64_t O, moe_recipe prec);
void moe_cpu_fp8_grouped_backward(float *dx, float *dw, moe_cbuf dy, moe_cbuf x, moe_cbuf w,
                                  const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                  moe_recipe prec, moe_grad_store dx_st, moe_grad_store dw_st);
/* quantize_weight (ops.h): the fp8-block copies of w [E, O, I], moe_quant_tiles_e4m3 per
 * expert */
void moe_cpu_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w, int64_t E,
                             int64_t O, int64_t I, moe_recipe prec);
/* adamw_quantize (ops.h): moe_cpu_adamw then moe_cpu_quantize_weight. */
void moe_cpu_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                           const moe_fp8_groups *pairs);
void moe_cpu_adamw_quantize(const moe_backend *be, float *param, moe_cbuf grad, moe_buf m,
                            moe_buf v, uint8_t *q, float *s, int64_t E, int64_t O, int64_t I,
                            moe_recipe prec, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step, float grad_scale);

/* ops_norm.c */
void moe_cpu_embedding_forward(const moe_backend *be, moe_buf out, const int32_t *tokens,
                               const float *wte, int64_t N, int64_t C);
void moe_cpu_embedding_backward(const moe_backend *be, float *dwte, const float *dout,
                                const int32_t *tokens, int64_t N, int64_t C, int64_t V);
void moe_cpu_rmsnorm_forward(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf x,
                             const float *w, int64_t N, int64_t C, float eps, moe_recipe prec,
                             const moe_fp8_groups *pairs);
void moe_cpu_rmsnorm_backward(const moe_backend *be, float *dx, float *dw, const float *dout,
                              moe_cbuf x, const float *w, const float *rstd, int64_t N, int64_t C);
void moe_cpu_rope_forward(const moe_backend *be, moe_buf x, const int32_t *pos, int64_t p0,
                          int64_t B, int64_t T, int64_t NH, int64_t D, double theta);
void moe_cpu_rope_backward(const moe_backend *be, moe_buf dx, const float *dy, const int32_t *pos,
                           int64_t B, int64_t T, int64_t NH, int64_t D, double theta);
void moe_cpu_swiglu_forward(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                            moe_recipe prec, const moe_fp8_groups *pairs);
void moe_cpu_swiglu_backward(const moe_backend *be, moe_buf da, moe_buf db, moe_cbuf dout,
                             moe_cbuf a, moe_cbuf b, int64_t n, const moe_fp8_groups *pairs);
void moe_cpu_add(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n);
void moe_cpu_pool_forward(const moe_backend *be, float *out, const float *x, const int32_t *range,
                          int64_t B, int64_t T, int64_t C, int max);

/* ops_attention.c */
void moe_cpu_attention_forward(const moe_backend *be, moe_buf out, float *lse, moe_cbuf q,
                               moe_cbuf k, moe_cbuf v, const int32_t *doc_start, int64_t B,
                               int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                               moe_recipe prec);
void moe_cpu_attention_backward(const moe_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, moe_cbuf q, moe_cbuf k, moe_cbuf v, moe_cbuf out,
                                const float *lse, const int32_t *doc_start, int64_t B, int64_t T,
                                int64_t H, int64_t KV, int64_t D, moe_recipe prec,
                                moe_grad_store st);

/* ops_moe.c */
void moe_cpu_router_forward(const moe_backend *be, float *probs, float *lse, int32_t *topk_idx,
                            float *topk_w, int32_t *counts, float *stats, const float *logits,
                            int64_t N, int64_t E, int64_t K);
void moe_cpu_router_backward(const moe_backend *be, float *dlogits, const float *dtopk_w,
                             const float *dprob, float dz, const float *probs, const float *lse,
                             const int32_t *topk_idx, const float *topk_w, int64_t N, int64_t E,
                             int64_t K);
void moe_cpu_permute_forward(const moe_backend *be, moe_buf xp, int32_t *row_src, int32_t *slot_row,
                             int32_t *offsets, moe_cbuf x, const int32_t *topk_idx, int64_t N,
                             int64_t C, int64_t E, int64_t K);
void moe_cpu_permute_backward(const moe_backend *be, float *dx, moe_cbuf dxp,
                              const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                              moe_grad_store st);
void moe_cpu_unpermute_forward(const moe_backend *be, moe_buf y, moe_cbuf res, moe_cbuf yp,
                               const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                               int64_t K);
void moe_cpu_unpermute_backward(const moe_backend *be, moe_buf dyp, float *dtopk_w, const float *dy,
                                moe_cbuf yp, const float *topk_w, const int32_t *slot_row,
                                int64_t N, int64_t C, int64_t K, moe_grad_store st);

/* ops_loss.c */
void moe_cpu_cross_entropy_forward(const moe_backend *be, float *loss, float *lse,
                                   const float *logits, const int32_t *targets,
                                   const float *weights, int64_t N, int64_t V);
void moe_cpu_cross_entropy_backward(const moe_backend *be, float *dlogits, const float *logits,
                                    const float *lse, const int32_t *targets, const float *weights,
                                    float dloss, int64_t N, int64_t V);

/* ops_optim.c */
void moe_cpu_adamw(const moe_backend *be, float *param, uint16_t *param16, uint16_t *param_lo,
                   moe_cbuf grad, moe_buf m, moe_buf v, int64_t n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
void moe_cpu_cast_bf16(const moe_backend *be, uint16_t *dst, const float *src, int64_t n);
double moe_cpu_sum_squares(const moe_backend *be, moe_cbuf x, int64_t n);

#endif
