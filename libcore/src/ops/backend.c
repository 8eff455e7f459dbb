/* backend: the backend lifecycle and capability checks of the ops layer (moe/ops.h) - op
 * names, moe_backend_open (device names, the auto rule and its log line), moe_backend_check
 * (supports over every op, with the sizes named in the error) and the scratch estimate.
 *
 * The one thing to know: this is the only file above kernels/ that knows which backends a
 * build has (#ifdef MOE_HAVE_CUDA); model, train and embed open, query and destroy backends
 * through these functions and the table, never by name. */
#include <stdlib.h>
#include <string.h>

#include "moe/config.h" /* moe_recipe_name */
#include "moe/log.h"
#include "moe/ops.h"
#include "ops/cuda_scratch.h"
#ifdef MOE_HAVE_CUDA
#include "moe/backend_cuda.h"
#endif

static const char *const op_names[MOE_OP_COUNT] = {
    [MOE_OP_EMBEDDING] = "embedding",
    [MOE_OP_RMSNORM] = "rmsnorm",
    [MOE_OP_ROPE] = "rope",
    [MOE_OP_ATTENTION] = "attention",
    [MOE_OP_MATMUL] = "matmul",
    [MOE_OP_ROUTER] = "router",
    [MOE_OP_PERMUTE] = "permute",
    [MOE_OP_UNPERMUTE] = "unpermute",
    [MOE_OP_GROUPED_MATMUL] = "grouped_matmul",
    [MOE_OP_SWIGLU] = "swiglu",
    [MOE_OP_CROSS_ENTROPY] = "cross_entropy",
    [MOE_OP_ADD] = "add",
    [MOE_OP_ADAMW] = "adamw",
    [MOE_OP_SUM_SQUARES] = "sum_squares",
    [MOE_OP_POOL] = "pool",
    [MOE_OP_CAST] = "cast",
    [MOE_OP_QUANTIZE] = "quantize",
};

const char *moe_op_name(moe_op op) {
    if ((int)op < 0 || op >= MOE_OP_COUNT) return "?";
    return op_names[op];
}

/* ---- moe_backend_check ---- */

/* The sizes that matter for op, "B=2 T=64 H=4 KV=2 D=80" style, into buf. */
static void describe_dims(moe_op op, const moe_op_dims *d, char *buf, size_t n) {
    long long B = d->B, T = d->T, C = d->C, H = d->H, KV = d->KV, D = d->D, V = d->V, E = d->E,
              K = d->K, F = d->F;
    switch (op) {
    case MOE_OP_ATTENTION:
        snprintf(buf, n, "B=%lld T=%lld H=%lld KV=%lld D=%lld (head dim)", B, T, H, KV, D);
        break;
    case MOE_OP_ROPE:
        snprintf(buf, n, "B=%lld T=%lld H=%lld D=%lld (head dim)", B, T, H, D);
        break;
    case MOE_OP_ROUTER:
    case MOE_OP_PERMUTE:
    case MOE_OP_UNPERMUTE:
        snprintf(buf, n, "N=%lld C=%lld E=%lld (experts) K=%lld (experts per token)", B * T, C, E,
                 K);
        break;
    case MOE_OP_GROUPED_MATMUL:
        snprintf(buf, n, "E=%lld (experts) C=%lld F=%lld rows=%lld", E, C, F, B * T * K);
        break;
    case MOE_OP_EMBEDDING:
    case MOE_OP_CROSS_ENTROPY:
        snprintf(buf, n, "N=%lld C=%lld V=%lld (vocabulary)", B * T, C, V);
        break;
    default:
        snprintf(buf, n, "N=%lld C=%lld H=%lld KV=%lld D=%lld V=%lld E=%lld K=%lld F=%lld", B * T,
                 C, H, KV, D, V, E, K, F);
        break;
    }
}

moe_status moe_backend_check(const moe_backend *be, const moe_op_dims *dims, moe_recipe prec,
                             moe_err *err) {
    for (int i = 0; i < MOE_OP_COUNT; i++) {
        moe_op op = (moe_op)i;
        if (!be->supports(be, op, NULL, prec)) {
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "precision.recipe %s needs %s support in the %s backend, which is not "
                        "available in this build yet (op %s)",
                        moe_recipe_name(prec),
                        moe_recipe_is_fp8(prec) ? "fp8 GEMM" : "this precision", be->name,
                        moe_op_name(op));
            moe_err_hint(err, "use precision.recipe=bf16 (or fp32)");
            return MOE_ERR_INPUT;
        }
        if (dims && !be->supports(be, op, dims, prec)) {
            char sizes[256];
            describe_dims(op, dims, sizes, sizeof sizes);
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "the %s backend cannot run op %s at %s under recipe %s", be->name,
                        moe_op_name(op), sizes, moe_recipe_name(prec));
            moe_err_hint(err, "docs/model.md lists the sizes each backend supports; change the "
                              "model shape, or use the cpu device (the reference runs every "
                              "shape)");
            return MOE_ERR_INPUT;
        }
    }
    return MOE_OK;
}

/* ---- moe_backend_open ---- */

/* Parses "cuda" (*index = -1: the current device) or "cuda:N". 1 on success. */
static int parse_cuda(const char *device, int *index) {
    if (strcmp(device, "cuda") == 0) {
        *index = -1;
        return 1;
    }
    if (strncmp(device, "cuda:", 5) != 0 || device[5] < '0' || device[5] > '9') return 0;
    char *end;
    long v = strtol(device + 5, &end, 10);
    if (*end || v > 4096) return 0;
    *index = (int)v;
    return 1;
}

/* The CUDA backend on device index (-1: the current one), or NULL with err set. */
static const moe_backend *open_cuda(int index, moe_err *err) {
#ifdef MOE_HAVE_CUDA
    return index < 0 ? moe_backend_cuda(err) : moe_backend_cuda_on(index, err);
#else
    (void)index;
    moe_err_set(err, MOE_ERR_INPUT, NULL, "this build has no CUDA support");
    return NULL;
#endif
}

/* The CPU reference, with OpenBLAS's advice logged when its kernels are slow here. */
static const moe_backend *open_cpu(void) {
    const char *advice = moe_backend_cpu_blas_advice();
    if (advice) moe_log_warn("%s", advice);
    return moe_backend_cpu();
}

int moe_backend_gpu_count(void) {
#ifdef MOE_HAVE_CUDA
    return moe_cuda_device_count();
#else
    return 0;
#endif
}

moe_status moe_backend_rank_device(const char *device, int local_rank, int n_gpus, char *out,
                                   size_t n, moe_err *err) {
    if (strcmp(device, "cuda") != 0) {
        snprintf(out, n, "%s", device);
        return MOE_OK;
    }
    if (n_gpus > 0 && local_rank >= n_gpus) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "device=cuda on local rank %d (LOCAL_RANK, or the rank among this node's MPI "
                    "processes), but this process sees %d GPU%s (CUDA_VISIBLE_DEVICES=%s)",
                    local_rank, n_gpus, n_gpus == 1 ? "" : "s", cvd ? cvd : "(unset)");
        moe_err_hint(err, "start at most one rank per visible GPU on each node, or give each "
                          "rank its GPU yourself with device=cuda:N");
        return MOE_ERR_INPUT;
    }
    snprintf(out, n, "cuda:%d", local_rank);
    return MOE_OK;
}

const moe_backend *moe_backend_open(const char *device, moe_recipe recipe, int threads,
                                    moe_err *err) {
    int index = -1, is_auto = strcmp(device, "auto") == 0;
    int is_cpu = strcmp(device, "cpu") == 0;
    if (!is_auto && !is_cpu && !parse_cuda(device, &index)) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "unknown device '%s': expected cpu, cuda, cuda:N or auto", device);
        moe_err_hint(err, "auto takes the first GPU when one is usable, else the CPU; cuda:N "
                          "counts the GPUs this process sees from 0");
        return NULL;
    }
    if (threads > 0) moe_backend_cpu_set_threads(threads);
    const moe_backend *be = NULL;
    if (is_cpu || (is_auto && moe_backend_gpu_count() == 0)) {
        be = open_cpu();
    } else {
        moe_err sub;
        moe_err_clear(&sub);
        be = open_cuda(index, &sub);
        if (!be && is_auto) {
            moe_log_warn("device: auto found a GPU but cannot use it (%s); running on the CPU",
                         sub.msg);
            be = open_cpu();
        } else if (!be) {
            moe_err_set(err, MOE_ERR_INPUT, NULL, "device: %s was requested but %s%s", device,
                        sub.status == MOE_ERR_INPUT ? "" : "no GPU is usable: ", sub.msg);
            moe_err_hint(err, "use the cpu (or auto) device on a machine without a GPU");
            return NULL;
        }
    }
    if (moe_backend_check(be, NULL, recipe, err) != MOE_OK) {
        be->destroy(be);
        return NULL;
    }
    if (index >= 0)
        moe_log_info("device: %s:%d", be->name, index);
    else
        moe_log_info("device: %s", be->name);
    return be;
}

/* ---- scratch estimate ---- */

/* The CUDA backend's own working memory (kernels/backend_cuda.cu) for a training model: the
 * cuBLASLt workspace, and under bf16 the conversions the model's typed operands leave, in
 * grow-only scratch slots (at most MOE_CUDA_SCRATCH_GROW of the largest operand a slot ever
 * holds). The model passes bf16 weight copies and bf16 activations, so what is converted is:
 * slot A, an fp32 dy to bf16 (lm_head's [N, V], o_proj's [N, C], q/k/v's) or the router's
 * bf16 input widened to fp32 [N, C]; slot C, lm_head's fp32 input to bf16 or the router's
 * input widened again in its backward [N, C] fp32; slot D, attention's fp32 dout [N, H*D].
 * The router's widenings happen only where the skinny kernels do not take its gate
 * (moe_cuda_skinny_shape). Small: attention lse/delta, expert grouping, cross-entropy
 * partials, the reduction slot (RMSNorm backward's partials, one [C] per MOE_CUDA_RMS_ROWS
 * rows, or the skinny gate's weight gradient partials, one [E, C] per MOE_CUDA_SKINNY_ROWS
 * rows, whichever is larger) and slot F (the RoPE table, [T][D / 2] cos and sin, or the
 * Hopper attention backward's semaphores, [B, H, T / 64] for dq and [B, KV, T / 128] for
 * dK/dV). fp8-block and mxfp8 add their quantized operands (below). */
static int64_t cuda_scratch_bytes(const moe_op_dims *d, moe_recipe prec, unsigned flags) {
    /* every recipe runs there (gpu.backend_ops checks that this and supports() agree) */
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
    int64_t N = d->B * d->T, C = d->C, V = d->V, HD = d->H * d->D;
    int64_t ws = (int64_t)MOE_CUDA_WORKSPACE_BYTES;
    int64_t small = N * d->H * 4 + N * 8 + 2 * V * 4;
    /* the reduction slot's largest request: partial weight gradients, RMSNorm backward's or
     * the skinny gate's */
    const int skinny = moe_cuda_skinny_shape(C, d->E);
    const int64_t red = (N + MOE_CUDA_RMS_ROWS - 1) / MOE_CUDA_RMS_ROWS * C * 4;
    const int64_t red_gate =
        skinny ? (N + MOE_CUDA_SKINNY_ROWS - 1) / MOE_CUDA_SKINNY_ROWS * d->E * C * 4 : 0;
    small += MOE_CUDA_SCRATCH_GROW(MAX2(red, red_gate));
    const int64_t rope = d->T * d->D * 4,
                  sems =
                      (d->B * d->H * ((d->T + 63) / 64) + d->B * d->KV * ((d->T + 127) / 128)) * 4;
    small += MOE_CUDA_SCRATCH_GROW(MAX2(rope, sems)); /* slot F */
    int fp8_block = moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK;
    int mx = moe_recipe_format(prec) == MOE_RECIPE_MXFP8;
    if (prec != MOE_RECIPE_BF16 && !fp8_block && !mx) return ws + small;
    const int64_t widen = skinny ? 0 : 4 * N * C;                   /* the router's input in fp32 */
    int64_t sa = MAX2(2 * MAX2(N * V, MAX2(N * C, N * HD)), widen); /* bytes */
    int64_t sb = 0, sc = MAX2(2 * N * C, widen), sd = 2 * N * HD;
    if (fp8_block) {
        /* its products' e4m3 activation operands (one byte a value, an fp32 scale per 128,
         * 256 bytes of alignment) of width W in slots A (x or dy rows), C and D (dy^T and x^T
         * along the tokens, each expert's rows padded to whole blocks). On an sm_90 device
         * (MOE_SCRATCH_SM90) the experts' F-wide operands (g, dh1, dh3) are fp8-block pairs
         * among the activations and only products of width C or H D quantize into scratch
         * (w2's dy, the dense products'); elsewhere every product's operands come here, F wide
         * included. The weights come as the model's persistent e4m3 copies, so slot B holds
         * only the bf16 conversions of fp32 weights: lm_head's (no bf16 copies under fp8) and,
         * with MOE_SCRATCH_SKIPPED, those of the layers precision.skip_layers keeps in bf16,
         * e.g. [E, F, C]. RMSNorm stages ln1 in bf16 [N, C] in slot A before writing it as an
         * fp8-block pair: within A's bf16 conversions above. Measured on an H100 (2026-12-07,
         * mixtral8x7b-2L, docs/performance-gpu.md): the SM90 form 0.01-0.05 GiB above the peaks
         * at 8,192, 32,768 and 65,536 tokens. */
        const int64_t E = d->E, F = d->F, NK = N * d->K;
        const int pairs = (flags & MOE_SCRATCH_SM90) && E >= 1 && E <= MOE_CUDA_GROUPED_MAXE;
        const int64_t W = pairs ? MAX2(C, HD) : MAX2(MAX2(C, F), HD);
        int64_t rows = MAX2(NK, N) * W, padded = (MAX2(NK, N) + 128 * MAX2(E, 1)) * W;
        /* (the Hopper grouped kernel's scales [W / 128, round_up(rows, 4)]: up to 3 rows more) */
        sa = MAX2(sa, rows + rows / 32 + 16 * (W / 128 + 1) + 256);
        sb = 2 * V * C;
        if (flags & MOE_SCRATCH_SKIPPED) sb = MAX2(sb, 2 * MAX2(E * C * F, C * HD));
        sc = MAX2(sc, padded + padded / 32 + 256);
        sd = MAX2(sd, padded + padded / 32 + 256);
    }
    if (mx) {
        /* its products' bf16 operands of quantized values (kernels/mxfp8.cu): slot A the
         * activation or gradient [rows, W] (either way), slot C the wgrad's x [rows, W] or a
         * product's MXFP8 output staged in bf16 before its encoding, slot B the weight
         * [E, F, C] (its fp32 master, quantized at each call; lm_head's [V, C] conversion
         * under bf16). RMSNorm and permute stage their MXFP8 outputs in A; SwiGLU reads and
         * writes MXFP8 in one pass, with no scratch. On sm_100+ the products' native MXFP8
         * operands (one byte a value, tiled scales, each expert's tokens padded to 128 for
         * wgrad; docs/dtypes.md) take the same slots and fit them when 132 E <= 0.97 NK. */
        int64_t NK = N * d->K, W = MAX2(MAX2(d->C, d->F), HD);
        int64_t rows = 2 * MAX2(NK, N) * W;
        sa = MAX2(sa, rows);
        sb = MAX2(2 * V * C, 2 * MAX2(d->E * C * d->F, C * HD));
        sc = MAX2(sc, rows);
    }
#undef MAX2
    return ws + small + MOE_CUDA_SCRATCH_GROW(sa + sb + sc + sd);
}

int64_t moe_backend_scratch_estimate(const char *kind, const moe_op_dims *dims, moe_recipe prec,
                                     unsigned flags) {
    if (strcmp(kind, "cuda") == 0) return cuda_scratch_bytes(dims, prec, flags);
    return 0; /* the CPU backend allocates only what it is asked for */
}
