/* ops_harness: what the files of gpu.backend_ops share (test_backend_ops.c, the case table
 * and main; ops_harness.c, the harness; ops_runners_dense.c and ops_runners_products.c, the
 * runners; ops_perf.c, --perf). The harness context with its guarded device buffers, the case
 * struct with its operand roles and types, the recipes' short names, and the functions one
 * file calls from another. Each function's contract is the comment above its definition. */
#ifndef MOE_OPS_HARNESS_H
#define MOE_OPS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/ops.h"

/* ------------------------------------------------------------------------------------------
 * random numbers (splitmix64), timing (ops_harness.c) */

extern uint64_t g_rng; /* the generator's state: main seeds it (--seed) */

float rng_uniform(float lo, float hi);
int64_t rng_int(int64_t n);
double now_s(void);
void *xmalloc(size_t n);
float *frand(int64_t n, float lo, float hi);

/* ------------------------------------------------------------------------------------------
 * device buffers with guards (ops_harness.c) */

#define MAX_BUFS 32

typedef struct dbuf {
    unsigned char *base;
    size_t bytes;
    const char *name;
    const char *part; /* "" or " scales" (the second buffer of an MXFP8 operand) */
} dbuf;

typedef struct gctx {
    const moe_backend *cpu, *gpu;
    dbuf bufs[MAX_BUFS];
    int nbufs;
    const char *label; /* current case, for messages */
    int fails;         /* failures in the current case */
    float *perf_src;   /* perf mode: a host block of random values, repeated into buffers */
} gctx;

void *dup_dev(gctx *g, const char *name, const void *host, size_t bytes);
void *down(gctx *g, const void *dev, size_t bytes);
void check_sync_guards(gctx *g, const char *after);
void free_bufs(gctx *g);

/* ------------------------------------------------------------------------------------------
 * comparisons (ops_harness.c) */

extern double g_worst_nmse; /* over the whole run, for the summary */

void cmp_f32(gctx *g, const char *what, const float *dev, const float *ref, int64_t n, double tol);
void cmp_i32(gctx *g, const char *what, const int32_t *dev, const int32_t *ref, int64_t n);
int same_bytes(gctx *g, const char *what, const void *dev, const void *ref, size_t bytes);
void check_changed(gctx *g, const char *what, const float *ref, const float *init, int64_t n,
                   double min_frac);
float *fdup(const float *x, int64_t n);

#define F(n) ((size_t)(n) * sizeof(float))
#define I32(n) ((size_t)(n) * sizeof(int32_t))

/* ------------------------------------------------------------------------------------------
 * cases */

/* The operand roles, as each runner reads them: ROLE_X the forward's activation input (matmul
 * and grouped x, rmsnorm x, permute x, swiglu a and b, add a); ROLE_Y the forward's output
 * (matmul and grouped y, rmsnorm out, permute xp, swiglu out, add out, embedding out); ROLE_DY
 * the backward's incoming gradient (matmul and grouped dy, swiglu dout); ROLE_DX the activation
 * gradient written (grouped dx under MOE_GRAD_SET, swiglu da and db). */
enum { ROLE_X, ROLE_Y, ROLE_DY, ROLE_DX };

/* tcase.types: TYPED, and the type of a role's operands where the case sets one (two bits a
 * role: the model's operands under mxfp8); the others take the runner's default, fp32 or
 * (TYPED) bf16. MXFP8: e4m3 values and an e8m0 scale per 32 (moe_buf_mxfp8). */
enum {
    TYPED = 1, /* the GPU's typed operands are bf16, as the model passes them under the bf16
                  recipe: weights as bf16 copies (cast_bf16 of them), expert activations in
                  bf16 (permute's xp, grouped in and out, swiglu in and out, unpermute's yp,
                  add's b: o_proj's output) */
    X_F32 = 1 << 1,
    X_BF16 = 2 << 1,
    X_MXFP8 = 3 << 1,
    Y_F32 = 1 << 3,
    Y_BF16 = 2 << 3,
    Y_MXFP8 = 3 << 3,
    DY_F32 = 1 << 5,
    DY_BF16 = 2 << 5,
    DY_MXFP8 = 3 << 5,
    DX_F32 = 1 << 7,
    DX_BF16 = 2 << 7,
    DX_MXFP8 = 3 << 7,
    GW_BF16 = 1 << 9,      /* the experts' weight gradients bf16 (optim.expert_grads bf16): grouped
                              dw, AdamW's gradient, sum_squares' input */
    MASTER_SPLIT = 1 << 10 /* AdamW's master as the bf16 copy and a low half (optim.master
                              split) */
};

typedef struct tcase {
    const char *name;
    moe_op op;
    int64_t s[7];
    moe_recipe prec;
    double tol; /* NMSE bound for float outputs */
    int types;  /* TYPED and role types (above); the CPU always gets fp32 inputs holding the
                   same values as the GPU's operands (bf16-rounded, MXFP8-encoded) */
} tcase;

#define FP32 MOE_RECIPE_FP32
#define BF16 MOE_RECIPE_BF16
#define FP8B MOE_RECIPE_FP8_BLOCK
#define FP8P MOE_RECIPE_FP8_BLOCK_POW2
#define FP8X MOE_RECIPE_FP8_BLOCK_XT /* precision.fp8_wgrad x-tiles */
#define FP8PX MOE_RECIPE_FP8_BLOCK_POW2_XT
/* mxfp8: on a GPU whose cuBLASLt multiplies MXFP8 (be->mx_native, sm_100+) the product cases
 * with I and O multiples of 128 run the native products, the others the bf16 form that sm_90
 * runs for all (gemm_cublaslt.cu) */
#define MX8 MOE_RECIPE_MXFP8
#define MX8F MOE_RECIPE_MXFP8_FLOOR

/* ------------------------------------------------------------------------------------------
 * typed operands (ops_harness.c) */

moe_dtype typed_dt(const tcase *tc);
moe_dtype role_dt(const tcase *tc, int role, moe_dtype dflt);
uint8_t *mx_encode(const float *x, int64_t n);
void as_stored(float *x, int64_t n, moe_dtype dt);
moe_buf dev_operand(gctx *g, moe_dtype dt, const char *name, const float *host, int64_t n);
double tol_stored(const tcase *tc, moe_dtype dt);
void cmp_typed(gctx *g, const char *what, moe_buf dev, const float *ref, int64_t n, double tol);
moe_cbuf gpu_weight(gctx *g, const tcase *tc, const float *dw_, int64_t E, int64_t O, int64_t I);
moe_cbuf cpu_weight(gctx *g, const tcase *tc, const float *w, int64_t E, int64_t O, int64_t I);

/* ------------------------------------------------------------------------------------------
 * the runners: each runs case tc (its sizes in tc->s) on both backends and compares */

/* ops_runners_dense.c */
void run_embedding(gctx *g, const tcase *tc);
void run_rmsnorm(gctx *g, const tcase *tc);
void run_rope(gctx *g, const tcase *tc);
void run_attention(gctx *g, const tcase *tc);
void run_pool(gctx *g, const tcase *tc);
void run_xent(gctx *g, const tcase *tc);
void run_add(gctx *g, const tcase *tc);

/* ops_runners_products.c (router_logits and random_topk: inputs that --perf draws too) */
void run_matmul(gctx *g, const tcase *tc);
float *router_logits(int64_t N, int64_t E);
void run_router(gctx *g, const tcase *tc);
int32_t *random_topk(int64_t N, int64_t E, int64_t K);
void run_permute(gctx *g, const tcase *tc);
void run_grouped(gctx *g, const tcase *tc);
void run_swiglu(gctx *g, const tcase *tc);
void run_adamw(gctx *g, const tcase *tc);
void run_adamw_fp8(gctx *g, const tcase *tc);
void run_sum_squares(gctx *g, const tcase *tc);

/* ------------------------------------------------------------------------------------------
 * perf mode (ops_perf.c) */

void run_perf_cases(gctx *g, const char *only);
int perf_cases_matching(const char *only);

#endif
