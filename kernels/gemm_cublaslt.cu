/* gemm_cublaslt: the dense and grouped (per-expert) matrix products of the CUDA backend,
 * through cuBLASLt with fp32 accumulation (its plans and calls: gemm_plan.cu).
 *
 * Every product is phrased like the CPU backend's moe_cpu_gemm: row-major C[M,N] =
 * alpha op(A) op(B) + beta C with fp32 C. Under the bf16 recipe A and B are bf16: a BF16
 * weight operand is read as it is, fp32 tensors are converted into scratch buffers first
 * (activations; weights given as F32), and forward outputs are
 * rounded to bf16 afterwards, exactly what the CPU backend emulates; under fp32 the
 * product runs in true fp32 (CUBLAS_COMPUTE_32F, no TF32), except a dense one of few outputs
 * (the router's gate), which gemm_skinny.cu's kernels take without converting x. Under mxfp8
 * the operands are bf16 tiles of the values the recipe quantizes to (below), and the products
 * are the bf16 ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"

/* Scale modes of block-scaled operands: fp8-block's 1 x 128 blocks and 128 x 128 tiles of fp32
 * scales (quant_fp8.cu's layouts), mxfp8's e8m0 per 32 in the 128 x 4 tiled layout
 * (moe_mx_tiled_index). */
#define SC_VEC128 CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
#define SC_TILES CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
#define SC_MX CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0

/* The matrix-product operand of x under prec: a bf16 scratch copy, or x itself (fp32). */
static const void *operand(moe_cuda_ctx *c, int slot, const float *x, int64_t n, moe_recipe prec,
                           const char *op) {
    if (prec != MOE_RECIPE_BF16) return x;
    return moe_cuda_bf16_operand(c, slot, x, n, op);
}

/* A typed operand under prec: BF16 as it is (bf16 recipe) or widened to fp32 (fp32 recipe:
 * its exact values), F32 as operand() makes it. NULL after a recorded error. */
static const void *typed_operand(moe_cuda_ctx *c, int slot, moe_cbuf w, int64_t n, moe_recipe prec,
                                 const char *op) {
    if (w.dt == MOE_DTYPE_F32) return operand(c, slot, (const float *)w.p, n, prec, op);
    if (w.dt == MOE_DTYPE_BF16 && prec == MOE_RECIPE_BF16) return w.p;
    if (w.dt == MOE_DTYPE_BF16 && prec == MOE_RECIPE_FP32)
        return moe_cuda_f32_operand(c, slot, (const __nv_bfloat16 *)w.p, n, op);
    moe_cuda_check(c, cudaErrorInvalidValue, op, "an operand of type %s (f32 or bf16 expected)",
                   moe_dtype_name(w.dt));
    return NULL;
}

static int prec_ok(moe_cuda_ctx *c, moe_recipe prec, const char *op) {
    if (prec == MOE_RECIPE_BF16 || prec == MOE_RECIPE_FP32 || moe_recipe_is_fp8(prec)) return 1;
    moe_cuda_check(c, cudaErrorNotSupported, op, "recipe %d", (int)prec);
    return 0;
}

/* 1 unless an fp8-block activation pair (pair: one of the op's operands, named by what) comes
 * outside the fp8-block recipes, whose products alone read pairs: then 0 after recording an
 * error. */
static int pair_in_fp8(moe_cuda_ctx *c, int pair, moe_recipe prec, const char *what,
                       const char *op) {
    if (!pair || moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) return 1;
    moe_cuda_check(c, cudaErrorInvalidValue, op, "an fp8-block pair %s outside fp8-block", what);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * mxfp8 products (docs/dtypes.md): bf16 tiles of each operand's values quantized in blocks
 * of 32 along the product's reduction (mxfp8.cu), as the CPU emulation quantizes them
 * (libcore/src/ops/cpu/ops_fp8.c): forward x and W along their rows (over I); dgrad dy along
 * its rows and W along its columns (over O, each expert's matrix on its own); wgrad dy and x
 * along their columns (over the tokens, each expert's rows their own group). The weight is
 * the fp32 master, quantized at each call (sm_90 has no MXFP8 product to read a stored one). */

static int is_mx(moe_recipe prec) {
    return moe_recipe_format(prec) == MOE_RECIPE_MXFP8;
}

/* x [R, K] as a product's operand under prec in scratch slot `slot`: under mxfp8 quantized
 * along rows (group 0) or columns in groups of `group` rows (moe_cuda_mx_quantize), bf16;
 * under bf16 and fp32 as typed_operand makes it (group unused). NULL after a recorded error. */
static const void *product_operand(moe_cuda_ctx *c, int slot, moe_cbuf x, int64_t R, int64_t K,
                                   int64_t group, moe_recipe prec, const char *op) {
    if (!is_mx(prec)) return typed_operand(c, slot, x, R * K, prec, op);
    __nv_bfloat16 *d = (__nv_bfloat16 *)moe_cuda_scratch(c, slot, (size_t)(R * K) * 2, op);
    if (!d || !moe_cuda_mx_quantize(c, d, x, R, K, group, prec == MOE_RECIPE_MXFP8_FLOOR, op))
        return NULL;
    return d;
}

/* x [M, K] as the wgrad operand of grouped rows (offsets [E + 1] host): under mxfp8 each
 * group's rows quantized along the columns on their own; else as product_operand. */
static const char *grouped_cols_operand(moe_cuda_ctx *c, int slot, moe_cbuf x,
                                        const int32_t *offsets, int64_t E, int64_t K,
                                        moe_recipe prec, const char *op) {
    const int64_t M = offsets[E];
    if (!is_mx(prec)) return (const char *)product_operand(c, slot, x, M, K, M, prec, op);
    __nv_bfloat16 *d = (__nv_bfloat16 *)moe_cuda_scratch(c, slot, (size_t)(M * K) * 2, op);
    if (!d) return NULL;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n > 0 && !moe_cuda_mx_quantize(c, d + r0 * K, moe_cbuf_at(x, r0 * K), n, K, n,
                                           prec == MOE_RECIPE_MXFP8_FLOOR, op))
            return NULL;
    }
    return (const char *)d;
}

/* cuBLASLt's element type of a product's operands under prec (fp32, or bf16 for bf16 and
 * mxfp8) and of a typed output. */
static cudaDataType operand_type(moe_recipe prec) {
    return prec == MOE_RECIPE_FP32 ? CUDA_R_32F : CUDA_R_16BF;
}
static cudaDataType output_type(moe_dtype dt) {
    return dt == MOE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* ------------------------------------------------------------------------------------------
 * fp8-block products (docs/dtypes.md), quantized as the CPU emulation does
 * (libcore/src/ops/cpu/ops_fp8.c): forward x in 1 x 128 row blocks and W in 128 x 128
 * tiles; dgrad dy in row blocks and W^T in tiles; wgrad dy^T and x^T in 1 x 128 blocks along
 * the tokens, each expert's rows their own group, zero-padded to whole blocks. A dense
 * product is the grouped one with a single group. The weight is never quantized here: it
 * comes as its persistent E4M3 copies (moe/ops.h; quantize_weight writes them after each
 * AdamW step), the row-wise one for the forward and the transposed one for dgrad. Under
 * MOE_RECIPE_FP8_BLOCK_POW2 (precision.fp8_scale pow2) every activation scale is rounded up
 * to a power of two (pow2 below), as the copies' scales were. */

typedef struct fp8_operand {
    uint8_t *q; /* e4m3 values */
    float *s;   /* their scales (quant_fp8.cu's layouts) */
} fp8_operand;

/* Scratch slot `slot` as an operand of nq values and ns scales. 0 after a recorded error. */
static int fp8_scratch(moe_cuda_ctx *c, int slot, int64_t nq, int64_t ns, fp8_operand *o,
                       const char *op) {
    size_t qb = ((size_t)nq + 255) / 256 * 256;
    char *p = (char *)moe_cuda_scratch(c, slot, qb + (size_t)ns * sizeof(float), op);
    if (!p) return 0;
    o->q = (uint8_t *)p;
    o->s = (float *)(p + qb);
    return 1;
}

/* 1 when the product's shape and weight suit fp8-block (multiples of 16, the weight's E4M3
 * copies), else 0 after recording an error. */
static int fp8_dims_ok(moe_cuda_ctx *c, int64_t I, int64_t O, moe_cbuf w, const char *op) {
    if (w.dt != MOE_DTYPE_E4M3 || !w.s) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "a %s weight (fp8-block products read the weight's e4m3 copies from "
                       "quantize_weight)",
                       moe_dtype_name(w.dt));
        return 0;
    }
    if (moe_cuda_fp8_shape_ok(I, O)) return 1;
    moe_cuda_check(c, cudaErrorInvalidValue, op,
                   "I=%lld O=%lld (fp8-block products need multiples of 16)", (long long)I,
                   (long long)O);
    return 0;
}

/* Rows of an fp8 product with 1 x 128 row-block scales: cuBLASLt takes such an operand only
 * with a row count that is a multiple of FP8_ROWS, so a group of n rows runs as its first
 * n - n % FP8_ROWS rows straight into the output, and its last n % FP8_ROWS rows as one
 * product of FP8_ROWS rows into scratch slot E, copied (or added) into place. */
#define FP8_ROWS 16

static int64_t round32(int64_t n) {
    return (n + 31) / 32 * 32;
}

/* Where group e's row-block scales start in the scale array of groups of rows
 * [offsets[e], offsets[e + 1]) reducing over K (KB = ceil(K / 128) blocks a row): 128-byte
 * aligned, the body's [KB, n - n % 16] first, the tail's [KB, 16] at +round32(body); the array
 * holds fp8_group_scales(offsets, E, KB) floats. */
static int64_t fp8_group_scales(const int32_t *offsets, int64_t e, int64_t KB) {
    return round32((int64_t)offsets[e] * KB) + e * (round32(FP8_ROWS * KB) + 64);
}

/* Each group's rows of x [M, K] in 1 x 128 row blocks: o->q [M, K] (FP8_ROWS rows of slack
 * allocated after them: a tail product reads past its group) and the scales of each group's
 * body and tail as fp8_group_scales lays them out. */
static int fp8_rows_grouped(moe_cuda_ctx *c, const fp8_operand *o, moe_cbuf x,
                            const int32_t *offsets, int64_t E, int64_t K, int pow2,
                            const char *op) {
    int64_t KB = (K + 127) / 128;
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0, body = n - n % FP8_ROWS;
        float *s = o->s + fp8_group_scales(offsets, e, KB);
        if (body > 0 && !moe_cuda_fp8_rows(c, o->q + r0 * K, s, moe_cbuf_at(x, r0 * K), body, K,
                                           body, pow2, op))
            return 0;
        if (n > body &&
            !moe_cuda_fp8_rows(c, o->q + (r0 + body) * K, s + round32(body * KB),
                               moe_cbuf_at(x, (r0 + body) * K), n - body, K, FP8_ROWS, pow2, op))
            return 0;
    }
    return 1;
}

__global__ void k_add_into(float *__restrict__ dst, const float *__restrict__ src, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] += src[i];
}

/* Group e's product C[n, N] (+)= A_e[n, K] B^T, A_e the group's rows of `a` (fp8_rows_grouped
 * over offsets), B [N, K] tiled (bq, bs); C of ct, beta 0 (bf16 or fp32) or 1 (fp32). */
static int fp8_group_product(moe_cuda_ctx *c, const char *op, const fp8_operand *a,
                             const int32_t *offsets, int64_t e, int64_t N, int64_t K,
                             const uint8_t *bq, const float *bs, float beta, void *C,
                             cudaDataType ct) {
    int64_t KB = (K + 127) / 128, r0 = offsets[e], n = offsets[e + 1] - r0;
    int64_t body = n - n % FP8_ROWS, tail = n - body;
    const float *s = a->s + fp8_group_scales(offsets, e, KB);
    size_t cs = moe_gemm_esize(ct);
    if (body > 0 && !moe_gemm_fp8(c, op, body, N, K, a->q + r0 * K, s, SC_VEC128, bq, bs, SC_TILES,
                                  beta, C, ct, GEMM_VARY_M))
        return 0;
    if (tail == 0) return 1;
    void *t = moe_cuda_scratch(c, MOE_CUDA_SCRATCH_E, (size_t)(FP8_ROWS * N) * cs, op);
    char *dst = (char *)C + (size_t)(body * N) * cs;
    if (!t || !moe_gemm_fp8(c, op, FP8_ROWS, N, K, a->q + (r0 + body) * K, s + round32(body * KB),
                            SC_VEC128, bq, bs, SC_TILES, 0.0f, t, ct, GEMM_EXACT))
        return 0;
    if (beta == 0.0f)
        return moe_cuda_check(
            c,
            cudaMemcpyAsync(dst, t, (size_t)(tail * N) * cs, cudaMemcpyDeviceToDevice, c->stream),
            op, "fp8 tail of %lld rows", (long long)tail);
    k_add_into<<<moe_cuda_grid(c, tail * N, 256), 256, 0, c->stream>>>((float *)dst,
                                                                       (const float *)t, tail * N);
    return MOE_CUDA_LAUNCHED(c, op, "fp8 tail of %lld rows", (long long)tail);
}

/* y [M, N] (+)= a [M, K] W_e^T per group (beta: 1 adds, 0 writes; a bf16 y is written), wq
 * [E, N, K] and ws a weight copy and its scales. On Hopper one launch over the groups
 * (sm90/grouped_fp8.cu) with all of a's rows quantized at once into slot A; elsewhere one
 * cuBLASLt product per group (bodies and 16-row tails). 0 after a recorded error. */
static int fp8_grouped_product(moe_cuda_ctx *c, const char *op, moe_buf y /* [M, N] */, float beta,
                               moe_cbuf a /* [M, K] */, const uint8_t *wq /* [E, N, K] */,
                               const float *ws /* [E, moe_fp8_tile_scales(N, K)] */,
                               const int32_t *offsets /* [E + 1] host */, int64_t E, int64_t N,
                               int64_t K, int pow2) {
    const int64_t M = offsets[E], KB = (K + 127) / 128;
    fp8_operand ao;
#if MOE_HAVE_SM90A
    if (moe_cuda_grouped_fp8_supported(c, E, y.p, wq, ws)) {
        const int64_t lds = (M + 3) / 4 * 4;
        return fp8_scratch(c, MOE_CUDA_SCRATCH_A, M * K, KB * lds, &ao, op) &&
               moe_cuda_fp8_rows(c, ao.q, ao.s, a, M, K, lds, pow2, op) &&
               moe_cuda_grouped_fp8(c, y, beta, ao.q, ao.s, lds, wq, ws, offsets, E, N, K, op);
    }
#endif
    const cudaDataType ct = y.dt == MOE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const int64_t ts = moe_fp8_tile_scales(N, K);
    if (!fp8_scratch(c, MOE_CUDA_SCRATCH_A, (M + FP8_ROWS) * K, fp8_group_scales(offsets, E, KB),
                     &ao, op) ||
        !fp8_rows_grouped(c, &ao, a, offsets, E, K, pow2, op))
        return 0;
    for (int64_t e = 0; e < E; e++)
        if (offsets[e + 1] > offsets[e] &&
            !fp8_group_product(c, op, &ao, offsets, e, N, K, wq + e * N * K, ws + e * ts, beta,
                               (char *)y.p + (size_t)(offsets[e] * N) * moe_gemm_esize(ct), ct))
            return 0;
    return 1;
}

/* y [M, N] (+)= a W_e^T (beta: 1 adds, 0 writes) from an fp8-block pair a [M, K] (its row-wise
 * copy) of the groups offsets and a weight copy wq [E, N, K] with scales ws. A pair of one group
 * of whole 16-row blocks (RMSNorm's ln1, a dense product's x) is what cuBLASLt reads: its scales'
 * row stride lds is then M, and the call is the one an unpaired x gets after its own quantization
 * (fp8_group_product's body), so the result is the same bits. Other pairs need the layout the
 * sm_90 grouped kernel reads (the backend offers pairs only where it runs): one grouped launch.
 * 0 after a recorded error. */
static int fp8_pair_product(moe_cuda_ctx *c, const char *op, moe_buf y, float beta, moe_cbuf a,
                            const uint8_t *wq, const float *ws, const int32_t *offsets, int64_t E,
                            int64_t N, int64_t K) {
    const moe_fp8_pair_layout pl = moe_fp8_pair_layout_of(offsets, E, K, 0); /* rows: any form */
    const uint8_t *pq = (const uint8_t *)a.p;
    const float *ps = (const float *)(pq + pl.s_rows);
    if (E == 1 && pl.M % FP8_ROWS == 0)
        return moe_gemm_fp8(c, op, pl.M, N, K, pq, ps, SC_VEC128, wq, ws, SC_TILES, beta, y.p,
                            output_type(y.dt), GEMM_VARY_M);
#if MOE_HAVE_SM90A
    if (moe_cuda_grouped_fp8_fits(c, E, y.p, wq, ws))
        return moe_cuda_grouped_fp8(c, y, beta, pq, ps, pl.lds, wq, ws, offsets, E, N, K, op);
#endif
    return moe_cuda_check(c, cudaErrorInvalidValue, op,
                          "an fp8-block pair of %lld groups, %lld rows (its row-wise copy is read "
                          "by cuBLASLt as one group of a multiple of 16 rows, else by the sm_90 "
                          "grouped fp8 kernel alone: at most be->fp8_pairs groups)",
                          (long long)E, (long long)pl.M);
}

/* An fp8-block weight's transposed copy [E, I, O] (dgrad's operand) and its scales, which
 * quantize_weight writes after the row-wise ones. */
static const uint8_t *weight_cols(moe_cbuf w, int64_t E, int64_t I, int64_t O, const float **s) {
    *s = w.s + E * moe_fp8_tile_scales(O, I);
    return (const uint8_t *)w.p + E * O * I;
}

/* y [M, O] = x [M, I] W_e^T per group, w [E, O, I] (its row-wise copy); x may be an fp8-block
 * pair; fp32 outputs rounded to bf16. */
static void fp8_grouped_forward(moe_cuda_ctx *c, const char *op, moe_buf y, moe_cbuf x, moe_cbuf w,
                                const int32_t *offsets, int64_t E, int64_t I, int64_t O, int pow2) {
    const uint8_t *wq = (const uint8_t *)w.p;
    if (fp8_dims_ok(c, I, O, w, op) &&
        (moe_cbuf_is_fp8_pair(x)
             ? fp8_pair_product(c, op, y, 0.0f, x, wq, w.s, offsets, E, O, I)
             : fp8_grouped_product(c, op, y, 0.0f, x, wq, w.s, offsets, E, O, I, pow2)) &&
        y.dt == MOE_DTYPE_F32)
        moe_cuda_round_bf16(c, (float *)y.p, offsets[E] * O, op);
}

/* dx [M, I] (F32, or BF16 with bx 0) (+)= dy W_e and dw [E, O, I] (F32|BF16) (+)= dy^T x per
 * group (dx.p, dw.p NULL: not computed; betas bx, bw: 1 adds, 0 writes); dy [M, O], or an fp8-block
 * pair of these groups (moe/quant.h), whose two copies are the products' dy operands as they are; x
 * [M, I], or a pair whose transposed copy is the wgrad's operand.
 * prec an fp8-block recipe: its scale rule, and whether the wgrad's x is in tiles
 * (moe_recipe_wgrad_tiles: cuBLASLt's VEC128 x BLK128x128 product, as the forward's). */
static void fp8_grouped_backward(moe_cuda_ctx *c, const char *op, moe_buf dx, moe_buf dw,
                                 moe_cbuf dy, moe_cbuf x, moe_cbuf w, const int32_t *offsets,
                                 int64_t E, int64_t I, int64_t O, moe_recipe prec, float bx,
                                 float bw) {
    if (!fp8_dims_ok(c, I, O, w, op)) return;
    const int pow2 = moe_recipe_pow2(prec), xtiles = moe_recipe_wgrad_tiles(prec);
    const int pair = moe_cbuf_is_fp8_pair(dy), xpair = moe_cbuf_is_fp8_pair(x);
    const moe_fp8_pair_layout pl =
        pair ? moe_fp8_pair_layout_of(offsets, E, O, 0) : moe_fp8_pair_layout{};
    const uint8_t *pq = (const uint8_t *)dy.p;
    if (dx.p) {
        const float *wts;
        const uint8_t *wtq = weight_cols(w, E, I, O, &wts);
        if (pair ? !fp8_pair_product(c, op, dx, bx, dy, wtq, wts, offsets, E, I, O)
                 : !fp8_grouped_product(c, op, dx, bx, dy, wtq, wts, offsets, E, I, O, pow2))
            return;
    }
    if (!dw.p) return;
    const cudaDataType ct = output_type(dw.dt);
    int64_t Mpad = 0, xs = 0; /* the groups' rows, each padded to whole blocks; x's scales */
    for (int64_t e = 0; e < E; e++) {
        const int64_t np = moe_cuda_fp8_pad(offsets[e + 1] - offsets[e]);
        Mpad += np, xs += xtiles ? moe_fp8_tile_scales(I, np) : np / 128 * I;
    }
    const moe_fp8_pair_layout xl =
        xpair ? moe_fp8_pair_layout_of(offsets, E, I, xtiles) : moe_fp8_pair_layout{};
    const uint8_t *xq = (const uint8_t *)x.p;
    fp8_operand dyt = {(uint8_t *)pq + pl.q_cols, (float *)(pq + pl.s_cols)},
                xt = {(uint8_t *)xq + xl.q_cols, (float *)(xq + xl.s_cols)};
    if ((!pair && (!fp8_scratch(c, MOE_CUDA_SCRATCH_C, O * Mpad, Mpad / 128 * O, &dyt, op) ||
                   !moe_cuda_fp8_cols_t(c, dyt.q, dyt.s, dy, offsets, E, O, pow2, 0, op))) ||
        (!xpair && (!fp8_scratch(c, MOE_CUDA_SCRATCH_D, I * Mpad, xs, &xt, op) ||
                    !moe_cuda_fp8_cols_t(c, xt.q, xt.s, x, offsets, E, I, pow2, xtiles, op))))
        return;
    for (int64_t e = 0, p0 = 0, s0 = 0; e < E; e++) {
        int64_t np = moe_cuda_fp8_pad(offsets[e + 1] - offsets[e]);
        if (np <= 0) continue;
        if (!moe_gemm_fp8(c, op, O, I, np, dyt.q + p0 * O, dyt.s + p0 / 128 * O, SC_VEC128,
                          xt.q + p0 * I, xt.s + (xtiles ? s0 : p0 / 128 * I),
                          xtiles ? SC_TILES : SC_VEC128, bw, moe_buf_at(dw, e * O * I).p, ct,
                          GEMM_VARY_K))
            return;
        p0 += np, s0 += moe_fp8_tile_scales(I, np);
    }
}

/* ------------------------------------------------------------------------------------------
 * mxfp8 on MXFP8 tensor cores (sm_100+, c->mx_native): each operand quantized as the
 * emulation above quantizes it (the same blocks of 32, scales and e4m3 values, now kept as
 * bytes: moe_cuda_mx_native) and multiplied by cuBLASLt's VEC32_UE8M0 products, so both forms
 * multiply the same values and differ in the order of their fp32 sums. Each group's operand
 * has its own scale tiles of 128 rows; the wgrad's tokens are padded to 128 with zeros
 * (Transformer Engine's grouped MXFP8 product failed on counts not a multiple of 32: its issue
 * #2966). Products with a dimension I or O not a multiple of 128 keep the bf16 form.
 * NOT RUN: the GPUs this was written beside (H100, H200) are sm_90, where cuBLASLt refuses
 * VEC32_UE8M0 (moe_cuda_mx_probe says so at start-up and these functions are never called);
 * gpu.quant_operands (then gpu.mx_native) checks the operands' bytes there (passed on an H100,
 * 2026-12-05), and on an sm_100 GPU gpu.backend_ops's mxfp8 cases would check these products
 * against the CPU emulation. */

static int use_native(const moe_cuda_ctx *c, moe_recipe prec, int64_t I, int64_t O) {
    return is_mx(prec) && c->mx_native && I % 128 == 0 && O % 128 == 0;
}

int moe_cuda_mx_probe(moe_cuda_ctx *c) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtMatmulMatrixScale_t mode = SC_MX;
    const void *sc = c->workspace; /* any device address: the query asks for the pointers */
    const uint64_t ws = c->workspace_bytes;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lay[3] = {NULL, NULL, NULL};
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
#define LT_OK(call) ((call) == CUBLAS_STATUS_SUCCESS)
    int ok =
        LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                             sizeof mode)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                             sizeof mode)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sc,
                                             sizeof sc)) &&
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sc,
                                             sizeof sc));
    for (int l = 0; l < 3 && ok; l++) /* 256 x 256 x 256, e4m3 in, bf16 out */
        ok = LT_OK(cublasLtMatrixLayoutCreate(&lay[l], l == 2 ? CUDA_R_16BF : CUDA_R_8F_E4M3, 256,
                                              256, 256));
    ok = ok && LT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
         LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws)) &&
         LT_OK(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, lay[0], lay[1], lay[2], lay[2], pref, 1,
                                              &res, &found)) &&
         found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
#undef LT_OK
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (int l = 0; l < 3; l++)
        if (lay[l]) cublasLtMatrixLayoutDestroy(lay[l]);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return ok;
}

/* A native MXFP8 operand: e4m3 bytes q and the e8m0 scales sc of its groups. */
typedef struct mx_operand {
    uint8_t *q, *sc;
} mx_operand;

/* x [M, K]'s native operand over groups offsets [E + 1] (moe_cuda_mx_native) in scratch slot
 * `slot`: the bytes, then the scales at the next 256-byte boundary. 0 after a recorded error. */
static int mx_native_operand(moe_cuda_ctx *c, int slot, mx_operand *o, moe_cbuf x,
                             const int32_t *offsets, int64_t E, int64_t K, int transpose,
                             moe_recipe prec, const char *op) {
    const moe_mx_groups g = moe_mx_groups_of(offsets, E, K, transpose);
    const int64_t qb = (g.q + 255) / 256 * 256;
    uint8_t *p = (uint8_t *)moe_cuda_scratch(c, slot, (size_t)(qb + g.sc), op);
    if (!p) return 0;
    o->q = p, o->sc = p + qb;
    return moe_cuda_mx_native(c, o->q, o->sc, x, offsets, E, K, transpose,
                              prec == MOE_RECIPE_MXFP8_FLOOR, op);
}

/* y [M, O] = x [M, I] W_e^T per group, w [E, O, I]; y F32 or BF16, written by the products. */
static int mx_native_forward(moe_cuda_ctx *c, const char *op, moe_buf y, moe_cbuf x, moe_cbuf w,
                             const int32_t *offsets /* [E + 1] host */, int64_t E, int64_t I,
                             int64_t O, moe_recipe prec) {
    /* w as one group of E * O rows: O % 128 == 0, so expert e's tiles are whole, the e-th */
    const int32_t wrows[2] = {0, (int32_t)(E * O)};
    mx_operand xa, wa;
    if (!mx_native_operand(c, MOE_CUDA_SCRATCH_A, &xa, x, offsets, E, I, 0, prec, op) ||
        !mx_native_operand(c, MOE_CUDA_SCRATCH_B, &wa, w, wrows, 1, I, 0, prec, op))
        return 0;
    const cudaDataType ct = output_type(y.dt);
    moe_mx_groups at = {0, 0};
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n > 0 &&
            !moe_gemm_fp8(c, op, n, O, I, xa.q + at.q, xa.sc + at.sc, SC_MX, wa.q + e * O * I,
                          wa.sc + e * moe_mx_tiled_bytes(O, I), SC_MX, 0.0f,
                          (char *)y.p + (size_t)(r0 * O) * moe_gemm_esize(ct), ct, GEMM_VARY_M))
            return 0;
        const moe_mx_groups g = moe_mx_group_bytes(n, I, 0);
        at.q += g.q, at.sc += g.sc;
    }
    return 1;
}

/* dx [M, I] (+)= dy W_e (dx.p NULL: none) and dw [E, O, I] (+)= dy^T x per group (.p NULL: none),
 * betas bx, bw (1 adds, 0 writes); dy [M, O]. 0 after a recorded error. */
static int mx_native_backward(moe_cuda_ctx *c, const char *op, moe_buf dx, moe_buf dw, moe_cbuf dy,
                              moe_cbuf x, moe_cbuf w, const int32_t *offsets /* [E + 1] host */,
                              int64_t E, int64_t I, int64_t O, moe_recipe prec, float bx,
                              float bw) {
    if (dx.p) { /* dy along its rows, each W_e transposed along O: [I, O], no padding */
        int32_t *wo = (int32_t *)malloc((size_t)(E + 1) * sizeof *wo);
        for (int64_t e = 0; wo && e <= E; e++)
            wo[e] = (int32_t)(e * O);
        mx_operand da = {NULL, NULL}, wt = {NULL, NULL}; /* set by mx_native_operand when ok */
        const int ok =
            wo ? mx_native_operand(c, MOE_CUDA_SCRATCH_A, &da, dy, offsets, E, O, 0, prec, op) &&
                     mx_native_operand(c, MOE_CUDA_SCRATCH_B, &wt, w, wo, E, I, 1, prec, op)
               : moe_cuda_check(c, cudaErrorMemoryAllocation, op,
                                "%lld expert offsets (host memory)", (long long)E);
        free(wo);
        if (!ok) return 0;
        const cudaDataType ct = output_type(dx.dt);
        moe_mx_groups at = {0, 0};
        for (int64_t e = 0; e < E; e++) {
            const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
            if (n > 0 && !moe_gemm_fp8(
                             c, op, n, I, O, da.q + at.q, da.sc + at.sc, SC_MX, wt.q + e * I * O,
                             wt.sc + e * moe_mx_tiled_bytes(I, O), SC_MX, bx,
                             (char *)dx.p + (size_t)(r0 * I) * moe_gemm_esize(ct), ct, GEMM_VARY_M))
                return 0;
            const moe_mx_groups g = moe_mx_group_bytes(n, O, 0);
            at.q += g.q, at.sc += g.sc;
        }
    }
    if (!dw.p) return 1;
    const cudaDataType ct = output_type(dw.dt);
    /* dy and x transposed along each group's tokens, padded to 128 */
    mx_operand dyt, xt;
    if (!mx_native_operand(c, MOE_CUDA_SCRATCH_A, &dyt, dy, offsets, E, O, 1, prec, op) ||
        !mx_native_operand(c, MOE_CUDA_SCRATCH_C, &xt, x, offsets, E, I, 1, prec, op))
        return 0;
    moe_mx_groups ad = {0, 0}, ax = {0, 0};
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = offsets[e + 1] - offsets[e];
        if (n > 0 && !moe_gemm_fp8(c, op, O, I, moe_mx_pad(n), dyt.q + ad.q, dyt.sc + ad.sc, SC_MX,
                                   xt.q + ax.q, xt.sc + ax.sc, SC_MX, bw,
                                   moe_buf_at(dw, e * O * I).p, ct, GEMM_VARY_K))
            return 0;
        const moe_mx_groups gd = moe_mx_group_bytes(n, O, 1), gx = moe_mx_group_bytes(n, I, 1);
        ad.q += gd.q, ad.sc += gd.sc, ax.q += gx.q, ax.sc += gx.sc;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * dense Linear: y = x W^T */

void moe_cuda_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N,
                             int64_t I, int64_t O, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "matmul_forward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) ||
        !pair_in_fp8(c, moe_cbuf_is_fp8_pair(x), prec, "x", op) || N <= 0 || O <= 0)
        return;
    if (moe_cuda_skinny_ok(prec, x, w, I, O, y.dt, NULL)) { /* few outputs: the router's gate */
        moe_cuda_skinny_forward(c, y, x, (const float *)w.p, N, I, O, op);
        return;
    }
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) {
        if (!moe_cuda_typed_ok(c, y.dt, op)) return;
        const int32_t rows[2] = {0, (int32_t)N};
        fp8_grouped_forward(c, op, y, x, w, rows, 1, I, O, moe_recipe_pow2(prec));
        return;
    }
    cudaDataType dt = operand_type(prec);
    moe_buf ys = moe_cuda_mx_stage(c, MOE_CUDA_SCRATCH_C, y, N * O, op); /* an MXFP8 y in bf16 */
    if (!ys.p) return;
    cudaDataType ct = output_type(ys.dt); /* written by the GEMM */
    if (use_native(c, prec, I, O)) {
        const int32_t rows[2] = {0, (int32_t)N};
        if (!mx_native_forward(c, op, ys, x, w, rows, 1, I, O, prec)) return;
    } else {
        const void *xa = product_operand(c, MOE_CUDA_SCRATCH_A, x, N, I, 0, prec, op);
        const void *wa = xa ? product_operand(c, MOE_CUDA_SCRATCH_B, w, O, I, 0, prec, op) : NULL;
        if (!wa || !moe_gemm_rm(c, op, 0, 1, N, O, I, 1.0f, xa, wa, dt, 0.0f, ys.p, ct, GEMM_EXACT))
            return;
    }
    if (prec != MOE_RECIPE_FP32 && ct == CUDA_R_32F &&
        !moe_cuda_round_bf16(c, (float *)ys.p, N * O, op))
        return;
    moe_cuda_mx_write(c, y, ys, N * O, op);
}

/* Under SET, dw [n] (F32 or BF16) of a product with no rows is written as zeros. */
static int zero_unreached(moe_cuda_ctx *c, moe_buf dw, int64_t n, moe_grad_store st,
                          const char *op) {
    if (!dw.p || st != MOE_GRAD_SET || n <= 0) return 1;
    return moe_cuda_check(c, cudaMemsetAsync(dw.p, 0, (size_t)n * moe_dtype_size(dw.dt), c->stream),
                          op, "zeros of a weight gradient with no rows (%lld)", (long long)n);
}

void moe_cuda_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy, moe_cbuf x,
                              moe_cbuf w, int64_t N, int64_t I, int64_t O, moe_recipe prec,
                              moe_grad_store dx_st, moe_grad_store dw_st) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "matmul_backward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) ||
        !pair_in_fp8(c, moe_cbuf_is_fp8_pair(x), prec, "x", op) || !moe_cuda_typed_ok(c, dy.dt, op))
        return;
    if (N <= 0) {
        zero_unreached(c, moe_buf_f32(dw), O * I, dw_st, op);
        return;
    }
    if (dy.dt == MOE_DTYPE_F32 && moe_cuda_skinny_ok(prec, x, w, I, O, MOE_DTYPE_F32, dx)) {
        moe_cuda_skinny_backward(c, dx, dw, (const float *)dy.p, x, (const float *)w.p, N, I, O,
                                 moe_grad_beta(dx_st), moe_grad_beta(dw_st), op);
        return;
    }
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) {
        const int32_t rows[2] = {0, (int32_t)N};
        fp8_grouped_backward(c, op, moe_buf_f32(dx), moe_buf_f32(dw), dy, x, w, rows, 1, I, O, prec,
                             moe_grad_beta(dx_st), moe_grad_beta(dw_st));
        return;
    }
    if (use_native(c, prec, I, O)) {
        const int32_t rows[2] = {0, (int32_t)N};
        mx_native_backward(c, op, moe_buf_f32(dx), moe_buf_f32(dw), dy, x, w, rows, 1, I, O, prec,
                           moe_grad_beta(dx_st), moe_grad_beta(dw_st));
        return;
    }
    cudaDataType dt = operand_type(prec);
    const void *dya = NULL;
    if (dx) { /* dx[N,I] (+)= dy[N,O] W[O,I] */
        dya = product_operand(c, MOE_CUDA_SCRATCH_A, dy, N, O, 0, prec, op);
        const void *wa = dya ? product_operand(c, MOE_CUDA_SCRATCH_B, w, O, I, O, prec, op) : NULL;
        if (!wa || !moe_gemm_rm(c, op, 0, 0, N, I, O, 1.0f, dya, wa, dt, moe_grad_beta(dx_st), dx,
                                CUDA_R_32F, GEMM_EXACT))
            return;
    }
    if (dw) { /* dw[O,I] (+)= dy^T[O,N] x[N,I]; under mxfp8 dy quantized again, along N */
        if (!dya || is_mx(prec))
            dya = product_operand(c, MOE_CUDA_SCRATCH_A, dy, N, O, N, prec, op);
        const void *xa = dya ? product_operand(c, MOE_CUDA_SCRATCH_C, x, N, I, N, prec, op) : NULL;
        if (!xa) return;
        moe_gemm_rm(c, op, 1, 0, O, I, N, 1.0f, dya, xa, dt, moe_grad_beta(dw_st), dw, CUDA_R_32F,
                    GEMM_EXACT);
    }
}

/* ------------------------------------------------------------------------------------------
 * grouped (per-expert) matmul: one cuBLASLt call per expert with rows, all on one stream,
 * each from the plan of its row count's bucket */

void moe_cuda_grouped_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w,
                                     const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                     moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "grouped_matmul_forward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op)) return;
    int64_t M = offsets[E];
    if (M <= 0 || O <= 0) return;
    if (!pair_in_fp8(c, moe_cbuf_is_fp8_pair(x), prec, "x", op)) return;
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) {
        if (!moe_cuda_typed_ok(c, y.dt, op)) return;
        fp8_grouped_forward(c, op, y, x, w, offsets, E, I, O, moe_recipe_pow2(prec));
        return;
    }
    cudaDataType dt = operand_type(prec);
    moe_buf ys = moe_cuda_mx_stage(c, MOE_CUDA_SCRATCH_C, y, M * O, op); /* an MXFP8 y in bf16 */
    if (!ys.p) return;
    /* a BF16 output is written by the GEMM itself (no rounding pass) */
    cudaDataType ct = output_type(ys.dt);
    if (use_native(c, prec, I, O)) {
        if (!mx_native_forward(c, op, ys, x, w, offsets, E, I, O, prec)) return;
    } else {
        const char *xa = (const char *)product_operand(c, MOE_CUDA_SCRATCH_A, x, M, I, 0, prec, op);
        const char *wa =
            xa ? (const char *)product_operand(c, MOE_CUDA_SCRATCH_B, w, E * O, I, 0, prec, op)
               : NULL;
        if (!wa) return;
        size_t es = moe_gemm_esize(dt), cs = moe_gemm_esize(ct);
        for (int64_t e = 0; e < E; e++) {
            int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
            if (n > 0 && !moe_gemm_rm(c, op, 0, 1, n, O, I, 1.0f, xa + (size_t)(r0 * I) * es,
                                      wa + (size_t)(e * O * I) * es, dt, 0.0f,
                                      (char *)ys.p + (size_t)(r0 * O) * cs, ct, GEMM_VARY_M))
                return;
        }
    }
    if (prec != MOE_RECIPE_FP32 && ct == CUDA_R_32F &&
        !moe_cuda_round_bf16(c, (float *)ys.p, M * O, op))
        return;
    moe_cuda_mx_write(c, y, ys, M * O, op);
}

void moe_cuda_grouped_matmul_backward(const moe_backend *be, moe_buf dxb, moe_buf dw, moe_cbuf dy,
                                      moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                      int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                                      moe_grad_store dw_st) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "grouped_matmul_backward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) || !moe_cuda_typed_ok(c, dxb.dt, op) ||
        !moe_cuda_typed_ok(c, dw.dt, op))
        return;
    for (int64_t e = 0; dw.p && e < E; e++) /* the experts with no rows */
        if (offsets[e + 1] <= offsets[e] &&
            !zero_unreached(c, moe_buf_at(dw, e * O * I), O * I, dw_st, op))
            return;
    int64_t M = offsets[E];
    if (M <= 0) return;
    const float bx = moe_grad_beta(dx_st), bw = moe_grad_beta(dw_st);
    if (!pair_in_fp8(c, moe_cbuf_is_fp8_pair(dy) || moe_cbuf_is_fp8_pair(x), prec, "dy or x", op))
        return;
    if (moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK) {
        if (dxb.dt != MOE_DTYPE_F32 && (dxb.dt != MOE_DTYPE_BF16 || dx_st != MOE_GRAD_SET)) {
            moe_cuda_check(c, cudaErrorInvalidValue, op,
                           "a %s dx under fp8-block (f32 expected, or bf16 written, not added)",
                           moe_dtype_name(dxb.dt));
            return;
        }
        fp8_grouped_backward(c, op, dxb, dw, dy, x, w, offsets, E, I, O, prec, bx, bw);
        return;
    }
    if (use_native(c, prec, I, O)) {
        mx_native_backward(c, op, dxb, dw, dy, x, w, offsets, E, I, O, prec, bx, bw);
        return;
    }
    cudaDataType dt = operand_type(prec), ct = output_type(dxb.dt);
    size_t es = moe_gemm_esize(dt), cs = moe_gemm_esize(ct);
    const char *dya = NULL;
    if (dxb.p) { /* dx (+)= dy W_e: dy along its rows, each W_e along its columns (over O) */
        dya = (const char *)product_operand(c, MOE_CUDA_SCRATCH_A, dy, M, O, 0, prec, op);
        const char *wa =
            dya ? (const char *)product_operand(c, MOE_CUDA_SCRATCH_B, w, E * O, I, O, prec, op)
                : NULL;
        if (!wa) return;
        for (int64_t e = 0; e < E; e++) {
            int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
            if (n > 0 && !moe_gemm_rm(c, op, 0, 0, n, I, O, 1.0f, dya + (size_t)(r0 * O) * es,
                                      wa + (size_t)(e * O * I) * es, dt, bx,
                                      (char *)dxb.p + (size_t)(r0 * I) * cs, ct, GEMM_VARY_M))
                return;
        }
    }
    if (!dw.p) return;
    /* dw[e] (+)= dy_e^T x_e: under mxfp8 both along the tokens, each expert's on their own */
    const cudaDataType wt = output_type(dw.dt);
    if (!dya || is_mx(prec))
        dya = grouped_cols_operand(c, MOE_CUDA_SCRATCH_A, dy, offsets, E, O, prec, op);
    const char *xa =
        dya ? grouped_cols_operand(c, MOE_CUDA_SCRATCH_C, x, offsets, E, I, prec, op) : NULL;
    if (!xa) return;
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n > 0 && !moe_gemm_rm(c, op, 1, 0, O, I, n, 1.0f, dya + (size_t)(r0 * O) * es,
                                  xa + (size_t)(r0 * I) * es, dt, bw, moe_buf_at(dw, e * O * I).p,
                                  wt, GEMM_VARY_K))
            return;
    }
}

/* dx = dya Wa_e + dyb Wb_e (ops.h): under fp8-block with both dy fp8-block pairs one launch of
 * the sm_90 grouped kernel over both products' blocks (moe_cuda_grouped_fp8_sum, the weights'
 * transposed copies), dx BF16 or F32; otherwise the two grouped dgrads into an F32 dx. */
void moe_cuda_grouped_dgrad_sum(const moe_backend *be, moe_buf dx, moe_cbuf dya, moe_cbuf wa,
                                moe_cbuf dyb, moe_cbuf wb, const int32_t *offsets, int64_t E,
                                int64_t I, int64_t O, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "grouped_dgrad_sum";
    const int pa = moe_cbuf_is_fp8_pair(dya), pb = moe_cbuf_is_fp8_pair(dyb);
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) || !moe_cuda_typed_ok(c, dx.dt, op) ||
        !pair_in_fp8(c, pa || pb, prec, "dy", op) || offsets[E] <= 0)
        return;
    if (!(pa && pb)) {
        if (dx.dt != MOE_DTYPE_F32) {
            moe_cuda_check(c, cudaErrorInvalidValue, op,
                           "a %s dx (f32 expected; bf16 where both dy are fp8-block pairs)",
                           moe_dtype_name(dx.dt));
            return;
        }
        const moe_buf none = moe_buf_f32(NULL);
        moe_cuda_grouped_matmul_backward(be, dx, none, dya, moe_cbuf_f32(NULL), wa, offsets, E, I,
                                         O, prec, MOE_GRAD_SET, MOE_GRAD_SET);
        moe_cuda_grouped_matmul_backward(be, dx, none, dyb, moe_cbuf_f32(NULL), wb, offsets, E, I,
                                         O, prec, MOE_GRAD_ADD, MOE_GRAD_SET);
        return;
    }
    if (!fp8_dims_ok(c, I, O, wa, op) || !fp8_dims_ok(c, I, O, wb, op)) return;
    /* each pair's row-wise copy and scales; each weight's transposed copy and scales */
    const moe_fp8_pair_layout pl = moe_fp8_pair_layout_of(offsets, E, O, 0);
    const moe_cbuf dy[2] = {dya, dyb}, w[2] = {wa, wb};
    const uint8_t *xq[2], *wq[2];
    const float *sx[2], *sw[2];
    for (int j = 0; j < 2; j++) {
        xq[j] = (const uint8_t *)dy[j].p;
        sx[j] = (const float *)(xq[j] + pl.s_rows);
        wq[j] = weight_cols(w[j], E, I, O, &sw[j]);
    }
#if MOE_HAVE_SM90A
    if (moe_cuda_grouped_fp8_fits(c, E, dx.p, wq[0], sw[0]) &&
        moe_cuda_grouped_fp8_fits(c, E, dx.p, wq[1], sw[1])) {
        moe_cuda_grouped_fp8_sum(c, dx, xq, sx, pl.lds, wq, sw, offsets, E, I, O, op);
        return;
    }
#endif
    moe_cuda_check(c, cudaErrorInvalidValue, op,
                   "fp8-block pairs of %lld groups (their row-wise copies are read by the sm_90 "
                   "grouped fp8 kernel alone: at most be->fp8_pairs groups)",
                   (long long)E);
}
