/* gemm_cublaslt: the dense and grouped (per-expert) matrix products of the CUDA backend,
 * through cuBLASLt with fp32 accumulation.
 *
 * Every product is phrased like the CPU backend's moe_cpu_gemm: row-major C[M,N] =
 * alpha op(A) op(B) + beta C with fp32 C. Under the bf16 recipe A and B are bf16: a BF16
 * weight operand is read as it is, fp32 tensors are converted into scratch buffers first
 * (activations; weights given as F32), and forward outputs are
 * rounded to bf16 afterwards, exactly what the CPU backend emulates; under fp32 the
 * product runs in true fp32 (CUBLAS_COMPUTE_32F, no TF32).
 *
 * The one thing a reader must know: cuBLASLt is column-major, so a row-major C = op(A) op(B)
 * is computed as the column-major C^T = op(B)^T op(A)^T (operands swapped, nothing copied).
 * Descriptors, layouts and the heuristic's algorithm are cached per shape / dtype / pointer
 * alignment in the backend context; all products share the context's one workspace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"

#define MOE_GEMM_CACHE_CAP 128

typedef struct moe_gemm_key {
    int ta, tb;
    int64_t M, N, K;
    int dtype;  /* cudaDataType of A and B */
    int cdtype; /* cudaDataType of C: CUDA_R_32F, or CUDA_R_16BF (written with beta = 0) */
    int beta_nonzero;
    int align_a, align_b, align_c; /* bytes, power of two, <= 256 */
} moe_gemm_key;

typedef struct moe_gemm_plan {
    moe_gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} moe_gemm_plan;

struct moe_gemm_cache {
    moe_gemm_plan plans[MOE_GEMM_CACHE_CAP];
    int n;    /* plans in use */
    int next; /* round-robin victim once full */
};

static void plan_destroy(moe_gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void moe_gemm_cache_free(moe_cuda_ctx *c) {
    if (!c->gemm_cache) return;
    for (int i = 0; i < c->gemm_cache->n; i++)
        plan_destroy(&c->gemm_cache->plans[i]);
    free(c->gemm_cache);
    c->gemm_cache = NULL;
}

static int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && (u % (uintptr_t)(2 * a)) == 0)
        a *= 2;
    return a;
}

static int key_eq(const moe_gemm_key *a, const moe_gemm_key *b) {
    return a->ta == b->ta && a->tb == b->tb && a->M == b->M && a->N == b->N && a->K == b->K &&
           a->dtype == b->dtype && a->cdtype == b->cdtype && a->beta_nonzero == b->beta_nonzero &&
           a->align_a == b->align_a && a->align_b == b->align_b && a->align_c == b->align_c;
}

#define SHAPE_FMT "M=%lld N=%lld K=%lld ta=%d tb=%d %s -> %s"
#define SHAPE_ARGS(k)                                                                              \
    (long long)(k)->M, (long long)(k)->N, (long long)(k)->K, (k)->ta, (k)->tb,                     \
        (k)->dtype == CUDA_R_16BF ? "bf16" : "f32", (k)->cdtype == CUDA_R_16BF ? "bf16" : "f32"

/* Builds (or finds) the plan for key; NULL after recording an error. */
static moe_gemm_plan *plan_get(moe_cuda_ctx *c, const moe_gemm_key *key, const char *op) {
    if (!c->gemm_cache) {
        c->gemm_cache = (struct moe_gemm_cache *)calloc(1, sizeof *c->gemm_cache);
        if (!c->gemm_cache) {
            moe_cuda_check(c, cudaErrorMemoryAllocation, op, "GEMM plan cache (host memory)");
            return NULL;
        }
    }
    struct moe_gemm_cache *gc = c->gemm_cache;
    for (int i = 0; i < gc->n; i++)
        if (key_eq(&gc->plans[i].key, key)) return &gc->plans[i];
    moe_gemm_plan *p;
    if (gc->n < MOE_GEMM_CACHE_CAP) {
        p = &gc->plans[gc->n++];
    } else {
        p = &gc->plans[gc->next];
        gc->next = (gc->next + 1) % MOE_GEMM_CACHE_CAP;
        plan_destroy(p);
    }
    memset(p, 0, sizeof *p);
    cudaDataType dt = (cudaDataType)key->dtype;
    /* column-major: D^T[N,M] = op(B)^T [N,K] * op(A)^T [K,M] */
    cublasOperation_t opa = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* on B */
    cublasOperation_t opb = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* on A */
    uint64_t la_rows = key->tb ? key->K : key->N, la_cols = key->tb ? key->N : key->K;
    uint64_t lb_rows = key->ta ? key->M : key->K, lb_cols = key->ta ? key->K : key->M;
    int ok = moe_cublas_check(c, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                              op, SHAPE_FMT, SHAPE_ARGS(key));
    if (ok)
        ok = moe_cublas_check(
            c,
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
            op, SHAPE_FMT, SHAPE_ARGS(key));
    if (ok)
        ok = moe_cublas_check(
            c,
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
            op, SHAPE_FMT, SHAPE_ARGS(key));
    if (ok)
        ok = moe_cublas_check(
            c, cublasLtMatrixLayoutCreate(&p->la, dt, la_rows, la_cols, (int64_t)la_rows), op,
            SHAPE_FMT, SHAPE_ARGS(key));
    if (ok)
        ok = moe_cublas_check(
            c, cublasLtMatrixLayoutCreate(&p->lb, dt, lb_rows, lb_cols, (int64_t)lb_rows), op,
            SHAPE_FMT, SHAPE_ARGS(key));
    if (ok)
        ok =
            moe_cublas_check(c,
                             cublasLtMatrixLayoutCreate(&p->lc, (cudaDataType)key->cdtype,
                                                        (uint64_t)key->N, (uint64_t)key->M, key->N),
                             op, SHAPE_FMT, SHAPE_ARGS(key));
    cublasLtMatmulPreference_t pref = NULL;
    if (ok)
        ok = moe_cublas_check(c, cublasLtMatmulPreferenceCreate(&pref), op, SHAPE_FMT,
                              SHAPE_ARGS(key));
    if (ok) {
        uint64_t ws = c->workspace_bytes;
        uint32_t al_a = (uint32_t)key->align_b, al_b = (uint32_t)key->align_a;
        uint32_t al_c = (uint32_t)key->align_c;
        ok = moe_cublas_check(c,
                              cublasLtMatmulPreferenceSetAttribute(
                                  pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                              op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             moe_cublas_check(
                 c,
                 cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
                 op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             moe_cublas_check(
                 c,
                 cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
                 op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             moe_cublas_check(
                 c,
                 cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
                 op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             moe_cublas_check(
                 c,
                 cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
                 op, SHAPE_FMT, SHAPE_ARGS(key));
    }
    if (ok) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        ok = moe_cublas_check(c,
                              cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc,
                                                             p->lc, pref, 1, &res, &found),
                              op, SHAPE_FMT, SHAPE_ARGS(key));
        if (ok && (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)) {
            moe_cublas_check(c, CUBLAS_STATUS_NOT_SUPPORTED, op,
                             SHAPE_FMT " (no cuBLASLt algorithm for this shape)", SHAPE_ARGS(key));
            ok = 0;
        }
        if (ok) p->algo = res.algo;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        plan_destroy(p); /* zeroed: M = 0 never matches a real request (M > 0) */
        return NULL;
    }
    p->key = *key;
    return p;
}

static size_t esize(cudaDataType dt) {
    return dt == CUDA_R_16BF ? 2 : 4;
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C. A is [M,K] ([K,M] if ta), B is [K,N]
 * ([N,K] if tb), both of dtype (CUDA_R_16BF or CUDA_R_32F); C of ctype (CUDA_R_32F, or
 * CUDA_R_16BF with beta = 0: the fp32 result rounded to nearest). Returns 0 after a recorded
 * error. */
static int gemm_rm(moe_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const void *A, const void *B, cudaDataType dtype, float beta,
                   void *C, cudaDataType ctype) {
    if (M <= 0 || N <= 0) return 1;
    if (K <= 0) {
        if (beta != 0.0f) return 1; /* beta is 0 or 1 in this backend: C unchanged */
        return moe_cuda_check(c, cudaMemsetAsync(C, 0, (size_t)(M * N) * esize(ctype), c->stream),
                              op, "M=%lld N=%lld K=0", (long long)M, (long long)N);
    }
    moe_gemm_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta;
    key.tb = tb;
    key.M = M;
    key.N = N;
    key.K = K;
    key.dtype = (int)dtype;
    key.cdtype = (int)ctype;
    key.beta_nonzero = beta != 0.0f;
    key.align_a = ptr_align(A);
    key.align_b = ptr_align(B);
    key.align_c = ptr_align(C);
    moe_gemm_plan *p = plan_get(c, &key, op);
    if (!p) return 0;
    return moe_cublas_check(c,
                            cublasLtMatmul(c->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C,
                                           p->lc, C, p->lc, &p->algo, c->workspace,
                                           c->workspace_bytes, c->stream),
                            op, SHAPE_FMT, SHAPE_ARGS(&key));
}

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
    if (prec == MOE_RECIPE_BF16 || prec == MOE_RECIPE_FP32) return 1;
    moe_cuda_check(c, cudaErrorNotSupported, op, "recipe %d (fp8 recipes are not available in this build)",
                   (int)prec);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * dense Linear: y = x W^T */

void moe_cuda_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w, int64_t N,
                             int64_t I, int64_t O, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "matmul_forward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) || !moe_cuda_typed_ok(c, y.dt, op) || N <= 0 ||
        O <= 0)
        return;
    cudaDataType dt = prec == MOE_RECIPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType ct = y.dt == MOE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F; /* written by the GEMM */
    const void *xa = typed_operand(c, MOE_CUDA_SCRATCH_A, x, N * I, prec, op);
    const void *wa = xa ? typed_operand(c, MOE_CUDA_SCRATCH_B, w, O * I, prec, op) : NULL;
    if (!wa) return;
    if (!gemm_rm(c, op, 0, 1, N, O, I, 1.0f, xa, wa, dt, 0.0f, y.p, ct)) return;
    if (prec == MOE_RECIPE_BF16 && ct == CUDA_R_32F)
        moe_cuda_round_bf16(c, (float *)y.p, N * O, op);
}

void moe_cuda_matmul_backward(const moe_backend *be, float *dx, float *dw, const float *dy,
                              moe_cbuf x, moe_cbuf w, int64_t N, int64_t I, int64_t O,
                              moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "matmul_backward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) || N <= 0) return;
    cudaDataType dt = prec == MOE_RECIPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const void *dya = operand(c, MOE_CUDA_SCRATCH_A, dy, N * O, prec, op);
    if (!dya) return;
    if (dx) { /* dx[N,I] += dy[N,O] W[O,I] */
        const void *wa = typed_operand(c, MOE_CUDA_SCRATCH_B, w, O * I, prec, op);
        if (!wa || !gemm_rm(c, op, 0, 0, N, I, O, 1.0f, dya, wa, dt, 1.0f, dx, CUDA_R_32F)) return;
    }
    if (dw) { /* dw[O,I] += dy^T[O,N] x[N,I] */
        const void *xa = typed_operand(c, MOE_CUDA_SCRATCH_C, x, N * I, prec, op);
        if (!xa) return;
        gemm_rm(c, op, 1, 0, O, I, N, 1.0f, dya, xa, dt, 1.0f, dw, CUDA_R_32F);
    }
}

/* ------------------------------------------------------------------------------------------
 * grouped (per-expert) matmul: one cuBLASLt call per expert with rows, all on one stream */

void moe_cuda_grouped_matmul_forward(const moe_backend *be, moe_buf y, moe_cbuf x, moe_cbuf w,
                                     const int32_t *offsets, int64_t E, int64_t I, int64_t O,
                                     moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "grouped_matmul_forward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op) || !moe_cuda_typed_ok(c, y.dt, op)) return;
    int64_t M = offsets[E];
    if (M <= 0 || O <= 0) return;
    cudaDataType dt = prec == MOE_RECIPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    /* a BF16 output is written by the GEMM itself (no rounding pass) */
    cudaDataType ct = y.dt == MOE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const char *xa = (const char *)typed_operand(c, MOE_CUDA_SCRATCH_A, x, M * I, prec, op);
    const char *wa =
        xa ? (const char *)typed_operand(c, MOE_CUDA_SCRATCH_B, w, E * O * I, prec, op) : NULL;
    if (!wa) return;
    size_t es = esize(dt), cs = esize(ct);
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue;
        if (!gemm_rm(c, op, 0, 1, n, O, I, 1.0f, xa + (size_t)(r0 * I) * es,
                     wa + (size_t)(e * O * I) * es, dt, 0.0f, (char *)y.p + (size_t)(r0 * O) * cs,
                     ct))
            return;
    }
    if (prec == MOE_RECIPE_BF16 && ct == CUDA_R_32F)
        moe_cuda_round_bf16(c, (float *)y.p, M * O, op);
}

void moe_cuda_grouped_matmul_backward(const moe_backend *be, float *dx, float *dw, moe_cbuf dy,
                                      moe_cbuf x, moe_cbuf w, const int32_t *offsets, int64_t E,
                                      int64_t I, int64_t O, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "grouped_matmul_backward";
    if (moe_cuda_failed(c) || !prec_ok(c, prec, op)) return;
    int64_t M = offsets[E];
    if (M <= 0) return;
    cudaDataType dt = prec == MOE_RECIPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    size_t es = esize(dt);
    const char *dya = (const char *)typed_operand(c, MOE_CUDA_SCRATCH_A, dy, M * O, prec, op);
    const char *xa =
        dya ? (const char *)typed_operand(c, MOE_CUDA_SCRATCH_C, x, M * I, prec, op) : NULL;
    if (!xa) return;
    const char *wa = NULL;
    if (dx) {
        wa = (const char *)typed_operand(c, MOE_CUDA_SCRATCH_B, w, E * O * I, prec, op);
        if (!wa) return;
    }
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        if (n <= 0) continue;
        if (dx && !gemm_rm(c, op, 0, 0, n, I, O, 1.0f, dya + (size_t)(r0 * O) * es,
                           wa + (size_t)(e * O * I) * es, dt, 1.0f, dx + r0 * I, CUDA_R_32F))
            return;
        if (!gemm_rm(c, op, 1, 0, O, I, n, 1.0f, dya + (size_t)(r0 * O) * es,
                     xa + (size_t)(r0 * I) * es, dt, 1.0f, dw + e * O * I, CUDA_R_32F))
            return;
    }
}
