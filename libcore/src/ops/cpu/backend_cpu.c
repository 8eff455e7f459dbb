/* backend_cpu: the CPU reference backend's table - capabilities, memory functions over the
 * host heap and the op entries implemented in ops_*.c.
 *
 * The table is a static const object: the CPU backend has no state (ctx NULL), so it can be
 * shared by any number of models and threads, and destroy does nothing. Memory from alloc
 * is zero-filled and 64-byte aligned; a failed allocation returns NULL (the model turns that
 * into MOE_ERR_RUNTIME). */
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/cpu/cpu_ops.h"

#ifdef MOE_HAVE_CBLAS
#include <cblas.h>
#endif

/* The reference runs every op at every size (the model's config validation bounds them) and
 * every recipe: the fp8 ones emulated (ops_fp8.c). */
static int cpu_supports(const moe_backend *be, moe_op op, const moe_op_dims *dims,
                        moe_recipe prec) {
    (void)be;
    (void)dims;
    if ((int)op < 0 || op >= MOE_OP_COUNT) return 0;
    return prec == MOE_RECIPE_FP32 || prec == MOE_RECIPE_BF16 || moe_cpu_is_fp8(prec);
}

static void cpu_destroy(const moe_backend *be) {
    (void)be; /* a static table: nothing to release */
}

static void cpu_memory(const moe_backend *be, size_t *current, size_t *peak) {
    (void)be; /* host memory is not counted */
    if (current) *current = 0;
    if (peak) *peak = 0;
}

static void *cpu_alloc(const moe_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + 63) / 64 * 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    memset(p, 0, n ? n : 64);
    return p;
}

static void cpu_free(const moe_backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_memcpy(const moe_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n) memmove(dst, src, n);
}

static void cpu_memset(const moe_backend *be, void *dst, int byte, size_t n) {
    (void)be;
    if (n) memset(dst, byte, n);
}

static moe_status cpu_synchronize(const moe_backend *be, moe_err *err) {
    (void)be;
    (void)err;
    return MOE_OK;
}

static const moe_backend cpu_backend = {
    .name = "cpu",
    .ctx = NULL,
    .bf16_native = 0,
    .mx_native = 0,
    .fp8_pairs = INT_MAX, /* pairs of any number of groups */
    .supports = cpu_supports,
    .destroy = cpu_destroy,
    .memory = cpu_memory,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy_h2d = cpu_memcpy,
    .memcpy_d2h = cpu_memcpy,
    .memcpy_d2d = cpu_memcpy,
    .memset = cpu_memset,
    .synchronize = cpu_synchronize,
    .embedding_forward = moe_cpu_embedding_forward,
    .embedding_backward = moe_cpu_embedding_backward,
    .rmsnorm_forward = moe_cpu_rmsnorm_forward,
    .rmsnorm_backward = moe_cpu_rmsnorm_backward,
    .rope_forward = moe_cpu_rope_forward,
    .rope_backward = moe_cpu_rope_backward,
    .attention_forward = moe_cpu_attention_forward,
    .attention_backward = moe_cpu_attention_backward,
    .matmul_forward = moe_cpu_matmul_forward,
    .matmul_backward = moe_cpu_matmul_backward,
    .router_forward = moe_cpu_router_forward,
    .router_backward = moe_cpu_router_backward,
    .permute_forward = moe_cpu_permute_forward,
    .permute_backward = moe_cpu_permute_backward,
    .unpermute_forward = moe_cpu_unpermute_forward,
    .unpermute_backward = moe_cpu_unpermute_backward,
    .grouped_matmul_forward = moe_cpu_grouped_matmul_forward,
    .grouped_matmul_backward = moe_cpu_grouped_matmul_backward,
    .grouped_dgrad_sum = moe_cpu_grouped_dgrad_sum,
    .swiglu_forward = moe_cpu_swiglu_forward,
    .swiglu_backward = moe_cpu_swiglu_backward,
    .cross_entropy_forward = moe_cpu_cross_entropy_forward,
    .cross_entropy_backward = moe_cpu_cross_entropy_backward,
    .add = moe_cpu_add,
    .adamw = moe_cpu_adamw,
    .cast_bf16 = moe_cpu_cast_bf16,
    .quantize_weight = moe_cpu_quantize_weight,
    .quantize_pair = moe_cpu_quantize_pair,
    .adamw_quantize = moe_cpu_adamw_quantize,
    .sum_squares = moe_cpu_sum_squares,
    .pool_forward = moe_cpu_pool_forward,
};

const moe_backend *moe_backend_cpu(void) {
    return &cpu_backend;
}

void moe_backend_cpu_set_threads(int n) {
    if (n < 1) n = 1;
    omp_set_num_threads(n);
#ifdef MOE_HAVE_CBLAS
    openblas_set_num_threads(1); /* GEMMs are tiled over OpenMP threads (ops_dense.c) */
#endif
}

/* The OpenBLAS core type this CPU should get when OpenBLAS fell back to its generic Prescott
 * kernels, else NULL. */
static const char *better_coretype(void) {
#if defined(MOE_HAVE_CBLAS) && defined(__x86_64__)
    const char *core = openblas_get_corename();
    if (core && strcmp(core, "Prescott") == 0 && __builtin_cpu_supports("avx2"))
        return __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
#endif
    return NULL;
}

const char *moe_backend_cpu_blas_advice(void) {
    const char *better = better_coretype();
    if (!better) return NULL;
    if (getenv("OPENBLAS_CORETYPE"))
        return "OpenBLAS runs its generic Prescott kernels although OPENBLAS_CORETYPE is set; "
               "matrix products run several times slower than this CPU allows";
    return strcmp(better, "SkylakeX") == 0
               ? "OpenBLAS chose its generic Prescott kernels on this AVX-512 CPU; matrix "
                 "products run ~4x faster with OPENBLAS_CORETYPE=SkylakeX in the environment"
               : "OpenBLAS chose its generic Prescott kernels on this AVX2 CPU; matrix "
                 "products run much faster with OPENBLAS_CORETYPE=Haswell in the environment";
}

void moe_backend_cpu_tune_blas(char **argv) {
    const char *better = better_coretype();
    if (!better || getenv("OPENBLAS_CORETYPE")) return;
    const char *preload = getenv("LD_PRELOAD"); /* under valgrind the new image would run */
    if (preload && strstr(preload, "vgpreload")) return; /* without it: keep this one */
    /* OpenBLAS reads the variable once, when it is loaded: only a fresh image sees it. The
     * variable being set afterwards also guarantees a single re-execution. */
    if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with the generic kernels */
}
