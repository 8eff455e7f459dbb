/* gemm_plan: the cuBLASLt engine under the CUDA backend's matrix products (gemm_cublaslt.cu):
 * plans cached per shape, the algorithm each one runs, and the two calls the products make,
 * moe_gemm_rm (bf16 / fp32 operands) and moe_gemm_fp8 (block-scaled e4m3), both with fp32
 * accumulation.
 *
 * The one thing a reader must know: cuBLASLt is column-major, so a row-major C = op(A) op(B)
 * is computed as the column-major C^T = op(B)^T op(A)^T (operands swapped, nothing copied).
 * Descriptors, layouts and the heuristic's algorithm are cached per shape / dtype / pointer
 * alignment in the backend context; all products share the context's one workspace. An
 * expert's row count changes from step to step, so a per-expert product is cached under its
 * count's bucket (rows_bucket): the heuristic is asked for the bucket's largest count, and
 * the layouts are resized to the actual count at each call. A step then finds all its plans
 * cached (before, every expert product of a step queried the heuristic), and the algorithm
 * depends on the bucket alone, so a resumed run picks the same ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"

#define MOE_GEMM_CACHE_SLOTS 1024 /* hash slots, a power of two */
#define MOE_GEMM_CACHE_MAX 768    /* plans held; at this many the cache is emptied */

typedef struct moe_gemm_key {
    int ta, tb;
    int64_t M, N, K;
    int dtype;            /* cudaDataType of A and B */
    int scale_a, scale_b; /* fp8: 1 + the cublasLtMatmulMatrixScale_t of A's and B's block scales;
                             0 for bf16 / fp32 products */
    int cdtype; /* cudaDataType of C: CUDA_R_32F, or CUDA_R_16BF (written with beta = 0) */
    int beta_nonzero;
    int align_a, align_b, align_c; /* bytes, power of two, <= 256 */
    int vary;                      /* GEMM_VARY_*: M or K holds rows_bucket of the count */
} moe_gemm_key;

typedef struct moe_gemm_plan {
    moe_gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} moe_gemm_plan;

struct moe_gemm_cache {
    moe_gemm_plan plans[MOE_GEMM_CACHE_SLOTS]; /* open addressing; desc NULL: a free slot */
    int n;                                     /* plans held */
};

static void plan_destroy(moe_gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

static void cache_clear(struct moe_gemm_cache *gc) {
    for (int i = 0; i < MOE_GEMM_CACHE_SLOTS; i++)
        if (gc->plans[i].desc) plan_destroy(&gc->plans[i]);
    gc->n = 0;
}

void moe_gemm_cache_free(moe_cuda_ctx *c) {
    if (!c->gemm_cache) return;
    cache_clear(c->gemm_cache);
    free(c->gemm_cache);
    c->gemm_cache = NULL;
}

/* The bucket of an expert's row count n > 0: n rounded up to a multiple of 128 up to 2,048
 * rows, above that to a multiple of a power of two between n / 16 and n / 8 (so a plan
 * serves counts within 6-12% of each other: about 50 buckets up to 32,768 rows). */
static int64_t rows_bucket(int64_t n) {
    int64_t g = 128;
    while (g * 16 < n)
        g *= 2;
    return (n + g - 1) / g * g;
}

/* FNV-1a over the key's fields (not its bytes: a copied struct's padding is unspecified). */
static uint32_t key_hash(const moe_gemm_key *k) {
    const int64_t f[] = {k->ta,      k->tb,      k->M,       k->N,      k->K,
                         k->dtype,   k->scale_a, k->scale_b, k->cdtype, k->beta_nonzero,
                         k->align_a, k->align_b, k->align_c, k->vary};
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        for (int b = 0; b < 64; b += 8)
            h = (h ^ (uint32_t)((uint64_t)f[i] >> b & 0xff)) * 16777619u;
    return h;
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
           a->dtype == b->dtype && a->scale_a == b->scale_a && a->scale_b == b->scale_b &&
           a->cdtype == b->cdtype && a->beta_nonzero == b->beta_nonzero &&
           a->align_a == b->align_a && a->align_b == b->align_b && a->align_c == b->align_c &&
           a->vary == b->vary;
}

static const char *dtype_name(int dt) {
    return dt == CUDA_R_16BF ? "bf16" : dt == CUDA_R_8F_E4M3 ? "e4m3 block-scaled" : "f32";
}

#define SHAPE_FMT "M=%lld N=%lld K=%lld ta=%d tb=%d %s -> %s"
#define SHAPE_ARGS(k)                                                                              \
    (long long)(k)->M, (long long)(k)->N, (long long)(k)->K, (k)->ta, (k)->tb,                     \
        dtype_name((k)->dtype), dtype_name((k)->cdtype)

/* The block-scale pointers of an fp8 product on desc (cuBLASLt's A is our B): set per call,
 * and before the heuristic query, which refuses block scaling without them. 0 after a
 * recorded error. */
static int set_scales(moe_cuda_ctx *c, cublasLtMatmulDesc_t desc, const void *as, const void *bs,
                      const char *op, const moe_gemm_key *key) {
    return moe_cublas_check(c,
                            cublasLtMatmulDescSetAttribute(
                                desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &bs, sizeof bs),
                            op, SHAPE_FMT " (scales)", SHAPE_ARGS(key)) &&
           moe_cublas_check(c,
                            cublasLtMatmulDescSetAttribute(
                                desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &as, sizeof as),
                            op, SHAPE_FMT " (scales)", SHAPE_ARGS(key));
}

/* The column-major layouts of row-major C[M,N] = op(A) op(B) (the top of this file):
 * cuBLASLt's A is op(B)^T (layout 0), its B is op(A)^T (1), its C is C^T (2); each is
 * rows[i] x cols[i] with leading dimension rows[i]. */
typedef struct gemm_layouts {
    uint64_t rows[3], cols[3];
} gemm_layouts;

static gemm_layouts layout_dims(int ta, int tb, int64_t M, int64_t N, int64_t K) {
    gemm_layouts d;
    d.rows[0] = (uint64_t)(tb ? K : N);
    d.cols[0] = (uint64_t)(tb ? N : K);
    d.rows[1] = (uint64_t)(ta ? M : K);
    d.cols[1] = (uint64_t)(ta ? K : M);
    d.rows[2] = (uint64_t)N;
    d.cols[2] = (uint64_t)M;
    return d;
}

/* Builds (or finds) the plan for key; NULL after recording an error. as/bs: an fp8 key's
 * scales of A and B (NULL otherwise). */
static moe_gemm_plan *plan_get(moe_cuda_ctx *c, const moe_gemm_key *key, const void *as,
                               const void *bs, const char *op) {
    if (!c->gemm_cache) {
        c->gemm_cache = (struct moe_gemm_cache *)calloc(1, sizeof *c->gemm_cache);
        if (!c->gemm_cache) {
            moe_cuda_check(c, cudaErrorMemoryAllocation, op, "GEMM plan cache (host memory)");
            return NULL;
        }
    }
    struct moe_gemm_cache *gc = c->gemm_cache;
    uint32_t i = key_hash(key) & (MOE_GEMM_CACHE_SLOTS - 1);
    for (; gc->plans[i].desc; i = (i + 1) & (MOE_GEMM_CACHE_SLOTS - 1))
        if (key_eq(&gc->plans[i].key, key)) return &gc->plans[i];
    if (gc->n >= MOE_GEMM_CACHE_MAX) { /* rebuilt as needed: the plans are a function of the key */
        cache_clear(gc);
        i = key_hash(key) & (MOE_GEMM_CACHE_SLOTS - 1);
    }
    moe_gemm_plan *p = &gc->plans[i];
    cudaDataType dt = (cudaDataType)key->dtype;
    /* column-major: D^T[N,M] = op(B)^T [N,K] * op(A)^T [K,M] */
    cublasOperation_t opa = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* on B */
    cublasOperation_t opb = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* on A */
    gemm_layouts d = layout_dims(key->ta, key->tb, key->M, key->N, key->K);
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
    cublasLtMatrixLayout_t *lay[3] = {&p->la, &p->lb, &p->lc};
    for (int l = 0; l < 3 && ok; l++)
        ok = moe_cublas_check(c,
                              cublasLtMatrixLayoutCreate(lay[l],
                                                         l == 2 ? (cudaDataType)key->cdtype : dt,
                                                         d.rows[l], d.cols[l], (int64_t)d.rows[l]),
                              op, SHAPE_FMT, SHAPE_ARGS(key));
    if (ok && key->scale_a) { /* cuBLASLt's A is our B (see the top of this file) */
        cublasLtMatmulMatrixScale_t ma = (cublasLtMatmulMatrixScale_t)(key->scale_b - 1);
        cublasLtMatmulMatrixScale_t mb = (cublasLtMatmulMatrixScale_t)(key->scale_a - 1);
        ok = moe_cublas_check(c,
                              cublasLtMatmulDescSetAttribute(
                                  p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma),
                              op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             moe_cublas_check(c,
                              cublasLtMatmulDescSetAttribute(
                                  p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb),
                              op, SHAPE_FMT, SHAPE_ARGS(key)) &&
             set_scales(c, p->desc, as, bs, op, key);
    }
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
                              op, SHAPE_FMT " (algorithm query)", SHAPE_ARGS(key));
        if (ok && (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)) {
            moe_cublas_check(c, CUBLAS_STATUS_NOT_SUPPORTED, op,
                             SHAPE_FMT " (no cuBLASLt algorithm for this shape)", SHAPE_ARGS(key));
            ok = 0;
        }
        if (ok) p->algo = res.algo;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        plan_destroy(p); /* zeroed: a free slot again */
        return NULL;
    }
    p->key = *key;
    gc->n++;
    return p;
}

/* Runs plan p on row-major A and B into C for the product of shape `k` (p's key, or its
 * exact form when p serves a bucket: the layouts are resized to it first). 0 after a
 * recorded error. */
static int run_plan(moe_cuda_ctx *c, const char *op, const moe_gemm_plan *p, const moe_gemm_key *k,
                    float alpha, const void *A, const void *B, float beta, void *C) {
    if (p->key.vary != GEMM_EXACT) {
        gemm_layouts d = layout_dims(k->ta, k->tb, k->M, k->N, k->K);
        cublasLtMatrixLayout_t lay[3] = {p->la, p->lb, p->lc};
        for (int l = 0; l < 3; l++) {
            /* rows, cols and the leading dimension (= rows), each a 64-bit attribute */
            const cublasLtMatrixLayoutAttribute_t at[3] = {CUBLASLT_MATRIX_LAYOUT_ROWS,
                                                           CUBLASLT_MATRIX_LAYOUT_COLS,
                                                           CUBLASLT_MATRIX_LAYOUT_LD};
            const uint64_t rows = d.rows[l], cols = d.cols[l];
            const int64_t ld = (int64_t)rows;
            const void *val[3] = {&rows, &cols, &ld};
            for (int a = 0; a < 3; a++)
                if (!moe_cublas_check(
                        c, cublasLtMatrixLayoutSetAttribute(lay[l], at[a], val[a], sizeof rows), op,
                        SHAPE_FMT " (layout)", SHAPE_ARGS(k)))
                    return 0;
        }
    }
    return moe_cublas_check(c,
                            cublasLtMatmul(c->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C,
                                           p->lc, C, p->lc, &p->algo, c->workspace,
                                           c->workspace_bytes, c->stream),
                            op, SHAPE_FMT, SHAPE_ARGS(k));
}

/* The exact key of a product (no block scales: an fp8 caller sets scale_a/scale_b); vary
 * names the dimension that is an expert's row count (GEMM_EXACT for a dense product). */
static moe_gemm_key gemm_key(int ta, int tb, int64_t M, int64_t N, int64_t K, cudaDataType dtype,
                             const void *A, const void *B, float beta, const void *C,
                             cudaDataType ctype, int vary) {
    moe_gemm_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta;
    key.tb = tb;
    key.M = M;
    key.N = N;
    key.K = K;
    key.vary = vary;
    key.dtype = (int)dtype;
    key.cdtype = (int)ctype;
    key.beta_nonzero = beta != 0.0f;
    key.align_a = ptr_align(A);
    key.align_b = ptr_align(B);
    key.align_c = ptr_align(C);
    return key;
}

/* The key a plan is cached under: the exact key with its varying dimension bucketed. */
static moe_gemm_key plan_key(moe_gemm_key k) {
    if (k.vary == GEMM_VARY_M) k.M = rows_bucket(k.M);
    if (k.vary == GEMM_VARY_K) k.K = rows_bucket(k.K);
    return k;
}

/* The two calls of the products (their contracts: backend_cuda.cuh). */
int moe_gemm_rm(moe_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                float alpha, const void *A, const void *B, cudaDataType dtype, float beta, void *C,
                cudaDataType ctype, int vary) {
    if (M <= 0 || N <= 0) return 1;
    if (K <= 0) {
        if (beta != 0.0f) return 1; /* beta is 0 or 1 in this backend: C unchanged */
        return moe_cuda_check(
            c, cudaMemsetAsync(C, 0, (size_t)(M * N) * moe_gemm_esize(ctype), c->stream), op,
            "M=%lld N=%lld K=0", (long long)M, (long long)N);
    }
    moe_gemm_key key = gemm_key(ta, tb, M, N, K, dtype, A, B, beta, C, ctype, vary),
                 pk = plan_key(key);
    moe_gemm_plan *p = plan_get(c, &pk, NULL, NULL, op);
    if (!p) return 0;
    return run_plan(c, op, p, &key, alpha, A, B, beta, C);
}

int moe_gemm_fp8(moe_cuda_ctx *c, const char *op, int64_t M, int64_t N, int64_t K, const uint8_t *A,
                 const void *as, cublasLtMatmulMatrixScale_t ma, const uint8_t *B, const void *bs,
                 cublasLtMatmulMatrixScale_t mb, float beta, void *C, cudaDataType ctype,
                 int vary) {
    if (M <= 0 || N <= 0 || K <= 0) return 1;
    moe_gemm_key key = gemm_key(0, 1, M, N, K, CUDA_R_8F_E4M3, A, B, beta, C, ctype, vary);
    key.scale_a = 1 + (int)ma;
    key.scale_b = 1 + (int)mb;
    moe_gemm_key pk = plan_key(key);
    moe_gemm_plan *p = plan_get(c, &pk, as, bs, op);
    /* the scales are per call: set on the cached descriptor right before the product */
    if (!p || !set_scales(c, p->desc, as, bs, op, &key)) return 0;
    return run_plan(c, op, p, &key, 1.0f, A, B, beta, C);
}
