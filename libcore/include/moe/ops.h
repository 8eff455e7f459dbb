/* ops: every operation the MoE model needs, forward and backward, behind a backend table.
 *
 * A backend (`moe_backend`) is a table of function pointers: its lifecycle and capabilities
 * (supports, destroy, memory), memory functions (the model allocates ALL its parameters,
 * gradients and activations through them, so buffers may live on a GPU) and one entry per op
 * direction. `moe_backend_cpu()` is the reference: fp32 accumulation, OpenMP, cblas_sgemm
 * when built with MOE_HAVE_CBLAS; the CUDA backend in kernels/ fills the same table.
 *
 * Lifecycle (src/ops/backend.c): moe_backend_open("cpu" | "cuda" | "cuda:N" | "auto", ...)
 * chooses and creates a backend, be->destroy(be) releases it (a no-op for the static CPU
 * table). Callers never test which backend they hold: what differs is asked of the table
 * (supports with the op's sizes, bf16_native, memory), and moe_backend_check refuses a
 * model shape a backend cannot run before any work.
 *
 * Conventions every implementation follows (the one thing a reader must know):
 *  - Pointers marked "dev" are backend memory (from be->alloc); "host" means CPU memory.
 *    Shapes are given in comments, row-major, last dimension contiguous.
 *  - Forward ops OVERWRITE their outputs. Backward ops ACCUMULATE (+=) into every gradient
 *    they produce (parameter AND activation gradients); the caller zeroes buffers first.
 *    Exceptions are marked: rope (in place both ways), cross_entropy_backward and
 *    swiglu_backward (write), and the ops with a moe_grad_store argument (attention,
 *    matmul, grouped matmul, permute and unpermute backward), which add or write as the
 *    caller says: a
 *    gradient with one producer is written (no zeroing pass, no read of the zeros), the
 *    second producer of a sum adds. On the CPU, writing gives the bits adding into zeros gives.
 *    A gradient pointer documented "may be NULL" is skipped.
 *  - `prec` is the precision recipe. MOE_RECIPE_FP32: plain fp32. MOE_RECIPE_BF16 (GPU
 *    numerics emulated on the CPU): every operand of a matrix product (matmul, grouped
 *    matmul, the QK^T and PV products of attention and their backward products) is rounded
 *    to bf16 (round to nearest even) before multiplying, products accumulate in fp32, and
 *    the activations those ops produce (matmul/grouped matmul/attention outputs, swiglu,
 *    rmsnorm outputs) are stored rounded to bf16. Softmax, norms statistics, router, loss,
 *    residual stream, gradients and optimizer stay fp32. The fp8 recipes (docs/dtypes.md)
 *    quantize the operands of matmul and grouped matmul and run the rest as bf16.
 *  - Results never depend on the number of OpenMP threads: reductions run over fixed chunks
 *    in a fixed order, so runs are bit-reproducible (exact resume relies on this).
 *  - Routing-weight scaling lives in unpermute (y[n] = sum_k w[n,k] * expert_out[slot]),
 *    not in swiglu.
 *  - Typed operands (moe_cbuf to read, moe_buf to write: pointer + moe_dtype) are where an
 *    op takes more than one element type, F32 or BF16 (and E4M3 weights, below). Today: the
 *    weight of matmul and grouped matmul (the fp32 master, or the model's bf16 copy written
 *    by adamw, or its fp8-block copies), the
 *    activations the bf16 recipe rounds anyway (rmsnorm's output, matmul's input and output,
 *    q/k/v through RoPE and attention, attention's output; the expert activations: permute's
 *    output, the grouped matmul's input and output, swiglu's, unpermute's input). BF16 only
 *    under the bf16 recipe (one exception: a BF16 matmul input under fp32, the router's,
 *    read as its exact values), where it holds exactly the values the recipe rounds the F32
 *    tensor to: both give the same result, BF16 saves the conversion and half the memory.
 *    Gradients stay F32, except the ones whose only reader is a matrix product that rounds
 *    them anyway (the expert path's dyp, dh1, dh3: unpermute's and swiglu's backward outputs,
 *    the grouped matmul's dy): BF16 there, and "+=" into a BF16 output stores the rounded
 *    sum; and under mxfp8 SwiGLU's incoming gradient dg (w2's grouped dx, swiglu_backward's
 *    dout), whose products quantize what SwiGLU's backward makes of it: BF16. RoPE on BF16 rounds
 * its result: the values attention reads. AdamW's moments m and v are typed too, whatever the
 * recipe: BF16 under `optim.moments: bf16` (see adamw); and so are the experts' weight
 * gradients (grouped matmul's dw, adamw's grad, sum_squares' x): BF16 under
 * `optim.expert_grads: bf16`, whatever the recipe.
 *  - fp8-block weights (MOE_RECIPE_FP8_BLOCK and _POW2): the weight operand of matmul and
 *    grouped matmul is E4M3 (moe_cbuf_e4m3), the weight's persistent copies that
 *    quantize_weight writes from the fp32 master (the model calls it right after adamw and
 *    whenever its bf16 copies would be refreshed): p holds the row-wise copy [E, O, I]
 *    (forward) followed by the transposed copy [E, I, O] (dgrad: cuBLASLt's fp8 products
 *    need both operands contiguous along the reduction), e4m3 bytes, each expert's matrix in
 *    128 x 128 tiles; s the row-wise tile scales [E, moe_fp8_tile_scales(O, I)] followed by
 *    the transposed ones [E, moe_fp8_tile_scales(I, O)] (E = 1 for matmul). A tile is
 *    symmetric, so both hold the same values, but they are stored twice: cuBLASLt reads each
 *    operand's scales in that operand's own tile order and row padding, and the second copy
 *    costs 4 bytes per 16384 values. The products quantize only their activations and
 *    gradients per call; an F32 weight under fp8-block is refused. mxfp8 weights stay F32
 *    (quantized per call, by the CPU emulation and by the CUDA backend alike).
 *  - MXFP8 activations (moe_buf_mxfp8: E4M3 values with an e8m0 scale per 32 consecutive
 *    elements, in their own array `mx`): under mxfp8 the model stores the first norm's output
 *    (rmsnorm's output, the q/k/v matmuls' input) and the expert path so (permute's output, the
 * grouped matmul's input and output, swiglu's inputs and output both ways, the dh1/dh3 written over
 * them). An op writing one stores the encoding of the BF16 value it would write
 * (moe_mxfp8_encode_block of the bf16 rounding, ceil scale rule whatever precision.fp8_scale says:
 * that rule is the products'); an op reading one reads its values. Their element counts are
 * multiples of 32 (the model uses them only when hidden and expert widths are). Both backends
 * run them; the CUDA backend's products multiply bf16 tiles of the quantized values (sm_90 has
 * no MXFP8 product), the same values as the CPU's.
 *  - The residual stream (embedding's output, add's out and a, rmsnorm's input x in both
 *    directions) is F32, or BF16 where the model keeps it so (training, the layers that
 *    store MXFP8 under mxfp8: Megatron-Core's bf16 residual): add sums in fp32 and stores
 *    the sum rounded; rmsnorm reads the values.
 *
 * Sizes: N tokens (= B*T), C hidden, H query heads, KV key/value heads, D head dim (C/H),
 * V vocabulary, E experts, K experts per token, F expert intermediate size, M = N*K rows
 * after permutation (dropless: every (token, slot) pair gets a row). */
#ifndef MOE_OPS_H
#define MOE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/dtype.h"
#include "moe/err.h"
#include "moe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moe_op {
    MOE_OP_EMBEDDING,
    MOE_OP_RMSNORM,
    MOE_OP_ROPE,
    MOE_OP_ATTENTION,
    MOE_OP_MATMUL,
    MOE_OP_ROUTER,
    MOE_OP_PERMUTE,
    MOE_OP_UNPERMUTE,
    MOE_OP_GROUPED_MATMUL,
    MOE_OP_SWIGLU,
    MOE_OP_CROSS_ENTROPY,
    MOE_OP_ADD,
    MOE_OP_ADAMW,
    MOE_OP_SUM_SQUARES,
    MOE_OP_POOL,
    MOE_OP_CAST,
    MOE_OP_QUANTIZE,
    MOE_OP_COUNT
} moe_op;

/* "embedding", "rmsnorm", ... ; "?" for an out-of-range value. */
const char *moe_op_name(moe_op op);

/* The sizes of the op calls a caller will make (the "Sizes" above), each the largest it will
 * use: B sequences of T tokens per call (N = B*T), C, H, KV, D, V, E, K, F. What supports()
 * and the scratch estimate see; a model fills it from its config and batch. */
typedef struct moe_op_dims {
    int64_t B, T, C, H, KV, D, V, E, K, F;
} moe_op_dims;

/* How a backward op with this argument stores a gradient: MOE_GRAD_ADD adds into it (+=),
 * MOE_GRAD_SET overwrites it (=), every element included: under SET the weight gradient of
 * an expert with no rows, or of a product with no rows, is written as zeros. */
typedef enum moe_grad_store { MOE_GRAD_ADD = 0, MOE_GRAD_SET = 1 } moe_grad_store;
/* The GEMM beta that stores a gradient as st says: 1 adds into it, 0 writes it. */
static inline float moe_grad_beta(moe_grad_store st) {
    return st == MOE_GRAD_SET ? 0.0f : 1.0f;
}

/* A read-only operand in backend memory with the type of its elements; s: the block scales
 * of an E4M3 weight (the fp8-block weight copies above), mx: the scales of an MXFP8
 * activation (E4M3 values, one e8m0 scale per 32 consecutive elements: element i is
 * e4m3(p[i]) * 2^(mx[i / 32] - 127)); NULL for every other operand. */
typedef struct moe_cbuf {
    const void *p;
    moe_dtype dt;
    const float *s;
    const uint8_t *mx;
} moe_cbuf;

/* A writable operand in backend memory with the type of its elements (mx as above). */
typedef struct moe_buf {
    void *p;
    moe_dtype dt;
    uint8_t *mx;
} moe_buf;

static inline moe_cbuf moe_cbuf_of(const void *p, moe_dtype dt) {
    moe_cbuf b = {p, dt, NULL, NULL};
    return b;
}
/* The E4M3 weight operand of fp8-block: q [2 E O I] e4m3 and s [moe_fp8_weight_scales]
 * as quantize_weight writes them. */
static inline moe_cbuf moe_cbuf_e4m3(const uint8_t *q, const float *s) {
    moe_cbuf b = {q, MOE_DTYPE_E4M3, s, NULL};
    return b;
}
/* An MXFP8 activation of n elements (n a multiple of 32): q [n] e4m3, mx [n / 32] e8m0
 * scales, written by the ops with the ceil rule (moe_mxfp8_encode_block, moe/quant.h). */
static inline moe_buf moe_buf_mxfp8(uint8_t *q, uint8_t *mx) {
    moe_buf b = {q, MOE_DTYPE_E4M3, mx};
    return b;
}
/* An fp8-block activation pair (moe/quant.h's layout: the row-wise e4m3 copy and each row
 * group's transposed one, with their 1 x 128 block (or the transposed copy's 128 x 128 tile)
 * scales, in one buffer of moe_fp8_pair_bytes_max bytes): E4M3 with neither s nor mx. Under
 * fp8-block, on a backend with fp8_pairs, swiglu_backward writes dh1 and dh3 so and
 * grouped_matmul_backward reads them as dy, swiglu_forward writes g so and w2's
 * grouped_matmul_forward and _backward read it as x, and rmsnorm_forward writes the first
 * norm's output ln1 so (one group of all N rows) and the q, k and v matmul_forward and
 * _backward read it as x: the quantization done where the activation is made, not in more
 * passes over it (ln1's copies once a layer where each of the three products made its own). */
static inline moe_buf moe_buf_fp8_pair(void *p) {
    moe_buf b = {p, MOE_DTYPE_E4M3, NULL};
    return b;
}
/* The row groups of fp8-block activation pairs: rows offsets[e] .. offsets[e + 1] (host) of
 * K columns each, E groups; pow2 the power-of-two scale rule (MOE_RECIPE_FP8_BLOCK_POW2);
 * tiles: the transposed copy in 128 x 128 tiles (a weight gradient's x under
 * moe_recipe_wgrad_tiles; a dy never). */
typedef struct moe_fp8_groups {
    const int32_t *offsets;
    int64_t E, K;
    int pow2, tiles;
} moe_fp8_groups;
/* Scales of one [R, K] matrix in 128 x 128 tiles, cuBLASLt's BLK128x128_32F layout: tile
 * (rb, kb) at rb * round_up(ceil(K / 128), 4) + kb; the entries past ceil(K / 128) in a row
 * are padding, never written (zero from the allocation). */
static inline int64_t moe_fp8_tile_scales(int64_t R, int64_t K) {
    return (R + 127) / 128 * (((K + 127) / 128 + 3) / 4 * 4);
}
/* Scales of the fp8-block copies of a weight [E, O, I]: [E, tiles of [O, I]] for the
 * row-wise copy, then [E, tiles of [I, O]] for the transposed one. */
static inline int64_t moe_fp8_weight_scales(int64_t E, int64_t O, int64_t I) {
    return E * (moe_fp8_tile_scales(O, I) + moe_fp8_tile_scales(I, O));
}
static inline moe_cbuf moe_cbuf_f32(const float *p) {
    return moe_cbuf_of(p, MOE_DTYPE_F32);
}
static inline moe_buf moe_buf_of(void *p, moe_dtype dt) {
    moe_buf b = {p, dt, NULL};
    return b;
}
static inline moe_buf moe_buf_f32(float *p) {
    return moe_buf_of(p, MOE_DTYPE_F32);
}
static inline moe_cbuf moe_cbuf_from(moe_buf b) {
    moe_cbuf c = {b.p, b.dt, NULL, b.mx};
    return c;
}
/* 1 when b is an fp8-block activation pair (moe_buf_fp8_pair: E4M3 with neither the weight
 * copies' scales nor MXFP8's): swiglu's and rmsnorm's outputs, the fp8-block products' x or
 * the grouped ones' dy. */
static inline int moe_cbuf_is_fp8_pair(moe_cbuf b) {
    return b.dt == MOE_DTYPE_E4M3 && !b.s && !b.mx;
}
/* b advanced by n elements of its own type (an MXFP8 operand by a multiple of 32). */
static inline moe_buf moe_buf_at(moe_buf b, int64_t n) {
    b.p = (char *)b.p + (size_t)n * moe_dtype_size(b.dt);
    if (b.mx) b.mx += n / 32;
    return b;
}
/* b advanced by n elements (of its own type, an MXFP8 operand by a multiple of 32; not for
 * the fp8-block weights, whose scales are tiled). */
static inline moe_cbuf moe_cbuf_at(moe_cbuf b, int64_t n) {
    b.p = (const char *)b.p + (size_t)n * moe_dtype_size(b.dt);
    if (b.mx) b.mx += n / 32;
    return b;
}
/* Host access for the CPU backend: element i as fp32 (F32, BF16 or MXFP8); a store, rounded
 * when BF16 (an MXFP8 operand is written 32 values at a time: moe_mxfp8_encode_block). */
static inline float moe_cbuf_get(moe_cbuf b, int64_t i) {
    if (b.mx) return moe_e4m3_to_f32(((const uint8_t *)b.p)[i]) * moe_e8m0_to_f32(b.mx[i / 32]);
    return b.dt == MOE_DTYPE_BF16 ? moe_bf16_to_f32(((const uint16_t *)b.p)[i])
                                  : ((const float *)b.p)[i];
}
static inline void moe_buf_set(moe_buf b, int64_t i, float v) {
    if (b.dt == MOE_DTYPE_BF16)
        ((uint16_t *)b.p)[i] = moe_f32_to_bf16(v);
    else
        ((float *)b.p)[i] = v;
}

typedef struct moe_backend moe_backend;
struct moe_backend {
    const char *name; /* "cpu", "cuda" */
    void *ctx;        /* backend state (streams, handles); NULL for the CPU backend */
    int bf16_native;  /* 1: bf16 matrix products run natively, faster than fp32 (a GPU);
                         0: bf16 is emulated by rounding (the CPU), fp32 is the fast recipe */
    int mx_native;    /* 1: mxfp8's products run on MXFP8 tensor cores (cuBLASLt's VEC32_UE8M0,
                         sm_100+); 0: as bf16 products of the quantized values (sm_90) or
                         emulated (the CPU) */
    int fp8_pairs;    /* the most row groups (experts) of an fp8-block activation pair
                         (moe_buf_fp8_pair) that swiglu_forward and _backward write and
                         the grouped matmuls read (rmsnorm_forward writes and matmul reads
                         pairs of one group wherever this is >= 1); 0: none */

    /* 1 when the backend implements op (both directions) at precision prec for calls of
     * sizes dims, else 0. dims NULL asks about the recipe alone (some sizes work). */
    int (*supports)(const moe_backend *be, moe_op op, const moe_op_dims *dims, moe_recipe prec);
    /* Waits for queued work and releases everything the backend holds, the table included;
     * every buffer from alloc must have been freed. A no-op for the static CPU table. */
    void (*destroy)(const moe_backend *be);
    /* Backend memory held now and the most held so far (bytes): buffers from alloc plus the
     * backend's own scratch. The CPU backend does not count (both 0). */
    void (*memory)(const moe_backend *be, size_t *current, size_t *peak);

    /* ---- memory (all sizes in bytes) ---- */
    void *(*alloc)(const moe_backend *be, size_t bytes); /* zero-filled, 64-byte aligned;
                                                            NULL on failure */
    void (*free)(const moe_backend *be, void *p);        /* p may be NULL */
    void (*memcpy_h2d)(const moe_backend *be, void *dst_dev, const void *src_host, size_t n);
    void (*memcpy_d2h)(const moe_backend *be, void *dst_host, const void *src_dev, size_t n);
    void (*memcpy_d2d)(const moe_backend *be, void *dst_dev, const void *src_dev, size_t n);
    void (*memset)(const moe_backend *be, void *dst_dev, int byte, size_t n);
    /* Waits for queued work; reports an asynchronous failure (MOE_ERR_RUNTIME) if any. */
    moe_status (*synchronize)(const moe_backend *be, moe_err *err);

    /* ---- embedding: out[n,:] = wte[tokens[n],:] ---- */
    void (*embedding_forward)(const moe_backend *be, moe_buf out, /* [N, C] dev, F32|BF16 */
                              const int32_t *tokens,              /* [N] dev, each in [0, V) */
                              const float *wte,                   /* [V, C] dev */
                              int64_t N, int64_t C);
    void (*embedding_backward)(const moe_backend *be, float *dwte, /* [V, C] dev, += */
                               const float *dout,                  /* [N, C] dev */
                               const int32_t *tokens,              /* [N] dev */
                               int64_t N, int64_t C, int64_t V);

    /* ---- RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) ----
     * With pairs (on a backend with fp8_pairs; NULL otherwise) out is an fp8-block activation
     * pair of pairs' groups, N C = offsets[E] K, holding the encoding of the BF16 values it
     * would otherwise write (prec then MOE_RECIPE_BF16); the model passes one group (ln1) */
    void (*rmsnorm_forward)(const moe_backend *be, moe_buf out, /* [N, C] dev, F32|BF16|pair */
                            float *rstd,                        /* [N] dev, saved for backward */
                            moe_cbuf x,                         /* [N, C] dev, F32|BF16 */
                            const float *w,                     /* [C] dev */
                            int64_t N, int64_t C, float eps, moe_recipe prec,
                            const moe_fp8_groups *pairs);
    void (*rmsnorm_backward)(const moe_backend *be, float *dx, /* [N, C] dev, += */
                             float *dw,                        /* [C] dev, += */
                             const float *dout,                /* [N, C] dev */
                             moe_cbuf x,                       /* [N, C] dev, F32|BF16 */
                             const float *w,                   /* [C] dev */
                             const float *rstd,                /* [N] dev */
                             int64_t N, int64_t C);

    /* ---- RoPE, Hugging Face convention (rotate_half over the two halves of D):
     * x1 = x[..., :D/2], x2 = x[..., D/2:], out = [x1 cos - x2 sin, x2 cos + x1 sin] with
     * angle = p * theta^(-2i/D) for i < D/2, p = pos[b, t] (Hugging Face's position_ids:
     * under a document mask the position inside the token's document), or p = t when pos is
     * NULL, plus p0 in the forward (rows that continue cached keys start at position p0;
     * training passes 0). Every pos lies in [0, T). The forward IN PLACE; the backward
     * rotates the fp32 gradient dy by -angle into dx, of its type (in place when dx.p is dy,
     * F32; a BF16 dx holds the rotated values rounded, as the bf16 products read them) ---- */
    void (*rope_forward)(const moe_backend *be, moe_buf x, /* [B, T, NH, D] dev, in place */
                         const int32_t *pos,               /* [B, T] dev, in [0, T), or NULL */
                         int64_t p0, int64_t B, int64_t T, int64_t NH, int64_t D, double theta);
    void (*rope_backward)(const moe_backend *be, moe_buf dx, /* [B, T, NH, D] dev, F32|BF16 */
                          const float *dy,                   /* [B, T, NH, D] dev, may be dx.p */
                          const int32_t *pos,                /* [B, T] dev, in [0, T), or NULL */
                          int64_t B, int64_t T, int64_t NH, int64_t D, double theta);

    /* ---- causal grouped-query attention, softmax(q k^T / sqrt(D)) v, query head h uses
     * kv head h / (H/KV). Blocked with an online softmax: memory linear in T. lse is the
     * natural-log logsumexp of each scaled score row, saved for backward.
     * Document mask (packed samples): doc_start[b, t] is the first position of the document
     * that holds position t (doc_start[b, 0] = 0; for t > 0 either doc_start[b, t - 1] or
     * t), and query t attends to the keys j with doc_start[b, t] <= j <= t only, so a packed
     * row computes what each of its documents computes alone; key blocks wholly before a
     * query block's documents are skipped, not just masked. NULL: one document per row (plain
     * causal). Backward takes the doc_start of its forward.
     * Cached keys (the forward only): k and v hold Tk >= T positions and the T queries are
     * the last T of them - query t sits at position t + Tk - T and attends to the keys j <=
     * t + Tk - T (doc_start then gives positions in [0, Tk)). A forward over the suffix of
     * a sequence whose prefix keys were kept (scoring) computes what the whole sequence's
     * forward computes for those rows. Training passes Tk = T. ---- */
    void (*attention_forward)(const moe_backend *be, moe_buf out, /* [B, T, H, D] dev */
                              float *lse,                         /* [B, H, T] dev */
                              moe_cbuf q,                         /* [B, T, H, D] dev */
                              moe_cbuf k,                         /* [B, Tk, KV, D] dev */
                              moe_cbuf v,                         /* [B, Tk, KV, D] dev */
                              const int32_t *doc_start,           /* [B, T] dev, or NULL */
                              int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t KV, int64_t D,
                              moe_recipe prec);
    /* dq, dk, dv (+)= the gradients, added or written (every element) as st says */
    void (*attention_backward)(const moe_backend *be, float *dq, /* [B, T, H, D] dev */
                               float *dk,                        /* [B, T, KV, D] dev */
                               float *dv,                        /* [B, T, KV, D] dev */
                               const float *dout,                /* [B, T, H, D] dev */
                               moe_cbuf q,                       /* [B, T, H, D] dev */
                               moe_cbuf k,                       /* [B, T, KV, D] dev */
                               moe_cbuf v,                       /* [B, T, KV, D] dev */
                               moe_cbuf out,             /* [B, T, H, D] dev, forward output */
                               const float *lse,         /* [B, H, T] dev */
                               const int32_t *doc_start, /* [B, T] dev, or NULL */
                               int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                               moe_recipe prec, moe_grad_store st);

    /* ---- matmul with a Linear weight [out, in]: y = x W^T ----
     * Under fp8-block, on a backend with fp8_pairs, x may be an fp8-block activation pair of
     * one group (offsets {0, N}, K = I; its transposed copy in tiles as
     * moe_recipe_wgrad_tiles(prec)): its row-wise copy is the forward's operand and its
     * transposed one wgrad's, the values the products would have quantized x to. A pair
     * under another recipe is refused. */
    void (*matmul_forward)(const moe_backend *be, moe_buf y, /* [N, O] dev, F32|BF16 */
                           moe_cbuf x,                       /* [N, I] dev, F32|BF16|pair */
                           moe_cbuf w,                       /* [O, I] dev, F32|BF16|E4M3 */
                           int64_t N, int64_t I, int64_t O, moe_recipe prec);
    /* dx (+)= dy W ; dw (+)= dy^T x, each added or written as dx_st / dw_st say */
    void (*matmul_backward)(const moe_backend *be, float *dx, /* [N, I] dev, may be NULL */
                            float *dw,                        /* [O, I] dev, may be NULL */
                            moe_cbuf dy, /* [N, O] dev, F32, or BF16 under the bf16 recipe */
                            moe_cbuf x,  /* [N, I] dev, F32, BF16 or pair (as the forward's) */
                            moe_cbuf w,  /* [O, I] dev, F32|BF16|E4M3 */
                            int64_t N, int64_t I, int64_t O, moe_recipe prec, moe_grad_store dx_st,
                            moe_grad_store dw_st);

    /* ---- router: p = softmax(logits) in fp32, top-K experts by p (ties: lower index
     * first; slots in descending p), topk_w = p[top] / sum_k p[top_k]. Statistics for the
     * losses: counts[e] = assignments (token, slot) to e; stats[e] = sum_n p[n,e] (e < E),
     * stats[E] = sum_n lse[n]^2 (z-loss numerator), stats[E+1] = sum_n entropy(p[n,:]).
     * All stats reduce in a fixed order (thread-count independent). ---- */
    void (*router_forward)(const moe_backend *be, float *probs, /* [N, E] dev */
                           float *lse,                          /* [N] dev, logsumexp of logits */
                           int32_t *topk_idx,                   /* [N, K] dev */
                           float *topk_w,                       /* [N, K] dev */
                           int32_t *counts,                     /* [E] dev */
                           float *stats,                        /* [E + 2] dev */
                           const float *logits,                 /* [N, E] dev */
                           int64_t N, int64_t E, int64_t K);
    /* Gradient of L = sum_{n,k} dtopk_w[n,k]*topk_w[n,k] + sum_{n,e} dprob[e]*p[n,e]
     *                 + dz * sum_n lse[n]^2
     * with respect to the logits (counts are piecewise constant: no gradient).
     * dprob is the aux-loss derivative by mean probability, shared by all tokens. */
    void (*router_backward)(const moe_backend *be, float *dlogits, /* [N, E] dev, += */
                            const float *dtopk_w,                  /* [N, K] dev */
                            const float *dprob,                    /* [E] dev, may be NULL (= 0) */
                            float dz, const float *probs,          /* [N, E] dev */
                            const float *lse,                      /* [N] dev */
                            const int32_t *topk_idx,               /* [N, K] dev */
                            const float *topk_w,                   /* [N, K] dev */
                            int64_t N, int64_t E, int64_t K);

    /* ---- permute: group the (token, slot) pairs by expert, stable in (n, k) order.
     * row_src[r] = n*K + k of permuted row r; slot_row[n*K + k] = r (the inverse);
     * offsets[e]..offsets[e+1] = rows of expert e (offsets[0] = 0, offsets[E] = N*K);
     * xp[r,:] = x[row_src[r] / K, :]. offsets is written to dev memory; the caller copies it
     * to the host for grouped_matmul. ---- */
    void (*permute_forward)(const moe_backend *be, moe_buf xp, /* [N*K, C] dev, F32|BF16 */
                            int32_t *row_src,                  /* [N*K] dev */
                            int32_t *slot_row,                 /* [N*K] dev */
                            int32_t *offsets,                  /* [E + 1] dev */
                            moe_cbuf x,                        /* [N, C] dev, F32|BF16 */
                            const int32_t *topk_idx,           /* [N, K] dev */
                            int64_t N, int64_t C, int64_t E, int64_t K);
    /* dx[n,:] (+)= sum_k dxp[slot_row[n*K+k], :], summed in fp32 in k order (from 0) */
    void (*permute_backward)(const moe_backend *be, float *dx, /* [N, C] dev */
                             moe_cbuf dxp,                     /* [N*K, C] dev, F32|BF16 */
                             const int32_t *slot_row,          /* [N*K] dev */
                             int64_t N, int64_t C, int64_t K, moe_grad_store st);

    /* ---- unpermute with routing weights, and the residual add after it: y[n,:] = res[n,:]
     * + s, s = sum_k topk_w[n,k] * yp[slot_row[n*K+k],:] summed in fp32 in k order (from
     * 0), s added to res in fp32 and the sum stored in y's type; without res (.p NULL)
     * y = s ---- */
    void (*unpermute_forward)(const moe_backend *be, moe_buf y, /* [N, C] dev, F32|BF16 */
                              moe_cbuf res,            /* [N, C] dev, F32|BF16, or .p NULL */
                              moe_cbuf yp,             /* [N*K, C] dev, F32|BF16 */
                              const float *topk_w,     /* [N, K] dev */
                              const int32_t *slot_row, /* [N*K] dev */
                              int64_t N, int64_t C, int64_t K);
    /* dyp[r,:] (+)= w dy[n,:], dtopk_w[n,k] (+)= dot(dy[n,:], yp[r,:]); st for both. dyp may
     * be yp (in place, of one type: each element read before it is written) */
    void (*unpermute_backward)(const moe_backend *be, moe_buf dyp, /* [N*K, C] dev, F32|BF16 */
                               float *dtopk_w,                     /* [N, K] dev */
                               const float *dy,                    /* [N, C] dev */
                               moe_cbuf yp,                        /* [N*K, C] dev, F32|BF16 */
                               const float *topk_w,                /* [N, K] dev */
                               const int32_t *slot_row,            /* [N*K] dev */
                               int64_t N, int64_t C, int64_t K, moe_grad_store st);

    /* ---- grouped matmul: rows offsets[e]..offsets[e+1] of x use expert e's weight:
     * y[r] = x[r] W[e]^T. offsets is HOST memory; experts with no rows are skipped (their
     * weight gradient is left untouched under MOE_GRAD_ADD, zeroed under SET). M = offsets[E].
     * ---- */
    /* Under fp8-block, on a backend with fp8_pairs, x may be an fp8-block activation pair of
     * the call's groups (offsets, E, K = I): its row-wise copy is the product's operand */
    void (*grouped_matmul_forward)(const moe_backend *be, moe_buf y, /* [M, O] dev, F32|BF16 */
                                   moe_cbuf x,                       /* [M, I] dev, F32|BF16|pair */
                                   moe_cbuf w,             /* [E, O, I] dev, F32|BF16|E4M3 */
                                   const int32_t *offsets, /* [E + 1] host */
                                   int64_t E, int64_t I, int64_t O, moe_recipe prec);
    /* dx (+)= dy W_e ; dw[e] (+)= dy_e^T x_e, each added or written as dx_st / dw_st say
     * (dx.p or dw.p may be NULL: not computed, and x not read without dw); a BF16 dw (the
     * experts' gradients under optim.expert_grads: bf16) holds the fp32 result rounded, an
     * added one the rounded fp32 sum of its value and the product; a BF16 dx (dg under mxfp8
     * and fp8-block) the fp32 result rounded, written (dx_st SET) under fp8-block. Under fp8-block,
     * on a backend with fp8_pairs, dy may be an fp8-block activation pair of the call's groups
     * (offsets, E, K = O; blocks): its row-wise copy is dgrad's operand and its transposed
     * one wgrad's, the values the products would have quantized dy to; and x a pair (K = I;
     * tiles as moe_recipe_wgrad_tiles(prec)), whose transposed copy is wgrad's operand */
    void (*grouped_matmul_backward)(const moe_backend *be, moe_buf dx, /* [M, I] dev, F32|BF16 */
                                    moe_buf dw,  /* [E, O, I] dev, F32|BF16, or .p NULL */
                                    moe_cbuf dy, /* [M, O] dev, F32|BF16|pair */
                                    moe_cbuf x,  /* [M, I] dev, F32|BF16|pair */
                                    moe_cbuf w,  /* [E, O, I] dev, F32|BF16|E4M3 */
                                    const int32_t *offsets, /* [E + 1] host */
                                    int64_t E, int64_t I, int64_t O, moe_recipe prec,
                                    moe_grad_store dx_st, moe_grad_store dw_st);
    /* dx = dya Wa_e + dyb Wb_e per group, written: the dgrad of two products of the same x
     * (the experts' w1 and w3) as one product over both reductions, one fp32 sum stored in
     * dx's type, so that no second pass reads dx to add to it. dya and dyb as
     * grouped_matmul_backward's dy, each of its own weight. Under fp8-block, on a backend with
     * fp8_pairs, both may be fp8-block activation pairs of the call's groups (K = O; their
     * row-wise copies are the operands), and then dx may be BF16 (the fp32 sum rounded);
     * otherwise dx is F32. */
    void (*grouped_dgrad_sum)(const moe_backend *be, moe_buf dx, /* [M, I] dev, F32|BF16 */
                              moe_cbuf dya,                      /* [M, O] dev, F32|BF16|pair */
                              moe_cbuf wa,                       /* [E, O, I] dev, F32|BF16|E4M3 */
                              moe_cbuf dyb,                      /* [M, O] dev, of dya's type */
                              moe_cbuf wb,                       /* [E, O, I] dev, of wa's type */
                              const int32_t *offsets,            /* [E + 1] host */
                              int64_t E, int64_t I, int64_t O, moe_recipe prec);

    /* ---- SwiGLU: out = silu(a) * b, silu(a) = a / (1 + exp(-a)) ----
     * With pairs (on a backend with fp8_pairs; NULL otherwise) out is an fp8-block activation
     * pair of pairs' groups, n = offsets[E] K, holding the encoding of the BF16 values it would
     * otherwise write (prec then MOE_RECIPE_BF16) */
    void (*swiglu_forward)(const moe_backend *be, moe_buf out, /* [n] dev, F32|BF16|pair */
                           moe_cbuf a,                         /* [n] dev (w1 output) */
                           moe_cbuf b, /* [n] dev (w3 output), of a's type */
                           int64_t n, moe_recipe prec, const moe_fp8_groups *pairs);
    /* WRITES (does not accumulate) da and db: each has this one producer, so no zeroing.
     * In place allowed: da may be a and db b (each element read before it is written).
     * With pairs (on a backend with fp8_pairs; NULL otherwise) da and db are fp8-block
     * activation pairs (moe_buf_fp8_pair, not in place) of pairs' groups, n = offsets[E] K,
     * each holding the encoding of the BF16 values it would otherwise write. */
    void (*swiglu_backward)(const moe_backend *be, moe_buf da, /* [n] dev, F32|BF16|pair */
                            moe_buf db,                        /* [n] dev, of da's type */
                            moe_cbuf dout,                     /* [n] dev, F32|BF16 */
                            moe_cbuf a,                        /* [n] dev, F32|BF16 */
                            moe_cbuf b,                        /* [n] dev, F32|BF16 */
                            int64_t n, const moe_fp8_groups *pairs);

    /* ---- cross-entropy with a fused softmax: loss[n] = weight[n] * (lse[n] - logit[n,t])
     * for target t >= 0; targets -1 are ignored (loss 0, no gradient). weights NULL = 1. --- */
    void (*cross_entropy_forward)(const moe_backend *be, float *loss, /* [N] dev */
                                  float *lse,                         /* [N] dev */
                                  const float *logits,                /* [N, V] dev */
                                  const int32_t *targets,             /* [N] dev, -1 = ignore */
                                  const float *weights,               /* [N] dev or NULL */
                                  int64_t N, int64_t V);
    /* WRITES (does not accumulate) dlogits = dloss * weight[n] * (softmax - onehot(t)),
     * rows of ignored targets = 0. dlogits may alias logits (in-place fused backward). */
    void (*cross_entropy_backward)(const moe_backend *be, float *dlogits, /* [N, V] dev */
                                   const float *logits,                   /* [N, V] dev */
                                   const float *lse,                      /* [N] dev */
                                   const int32_t *targets,                /* [N] dev */
                                   const float *weights,                  /* [N] dev or NULL */
                                   float dloss, int64_t N, int64_t V);

    /* ---- elementwise add: out = a + b, summed in fp32 and stored in out's type; out may
     * alias a or b (the residual adds) ---- */
    void (*add)(const moe_backend *be, moe_buf out, /* [n] dev, F32|BF16 */
                moe_cbuf a,                         /* [n] dev, F32|BF16 */
                moe_cbuf b,                         /* [n] dev, F32|BF16 */
                int64_t n);

    /* ---- AdamW, fp32 arithmetic, decoupled weight decay, bias correction; step counts
     * from 1: g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2, each new
     * moment stored in m's (v's) type and read back, so that the update below is computed
     * from the stored values (a BF16 moment rounded to nearest even): they are the whole
     * optimizer state, all a resumed run has and all the update depends on;
     * param -= lr * (m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + weight_decay * param);
     * param16 (may be NULL) = the new param rounded to bf16, in the same pass. m and v are
     * F32 or BF16, both of one type. With BF16 moments the CUDA backend computes exactly
     * the CPU's bits (no fused multiply-adds); with F32 ones it contracts as it always has
     * (within rounding of the CPU's). A split master (optim.master split) has no param
     * array (NULL): it is param16 and param_lo, moe_f32_join_bf16(param16[i], param_lo[i])
     * (moe/dtype.h); the update is the same fp32 one, and the new master is stored as
     * moe_f32_split_bf16 gives it, param16 its bf16 rounding with ties away from zero.
     * ---- */
    void (*adamw)(const moe_backend *be, float *param, /* [n] dev, or NULL (split master) */
                  uint16_t *param16,  /* [n] dev bf16, may be NULL; split: the master's high half */
                  uint16_t *param_lo, /* [n] dev, the split master's low half, or NULL */
                  moe_cbuf grad,      /* [n] dev, F32 or BF16 */
                  moe_buf m,          /* [n] dev, F32 or BF16 */
                  moe_buf v,          /* [n] dev, the type of m */
                  int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t step, float grad_scale);

    /* ---- the fp8-block weight copies (the E4M3 operand above) of w [E, O, I]: 128 x 128
     * tiles per expert, scale amax / 448 (1 for an all-zero tile) or, under
     * MOE_RECIPE_FP8_BLOCK_POW2, its power-of-two rounding up; values e4m3(x / scale),
     * saturating, NaN kept: the bytes of moe/quant.h's moe_quant_tiles_e4m3 ---- */
    void (*quantize_weight)(const moe_backend *be, uint8_t *q, /* [2 E O I] dev */
                            float *s,       /* [moe_fp8_weight_scales(E, O, I)] dev */
                            const float *w, /* [E, O, I] dev */
                            int64_t E, int64_t O, int64_t I, moe_recipe prec);

    /* ---- an fp8-block activation pair (moe_buf_fp8_pair; not on x) of pairs' groups from
     * x's BF16 values: the bytes of moe/quant.h's moe_fp8_pair_encode, the operands the
     * fp8-block products would quantize x to (on a backend with fp8_pairs >= pairs->E). The
     * model's expert inputs xe under fp8-block: read by w1's and w3's products, forward and
     * wgrad, their copies made once a layer where each of the four made its own ---- */
    void (*quantize_pair)(const moe_backend *be, moe_buf out, /* pair of [offsets[E], K] dev */
                          moe_cbuf x,                         /* [offsets[E], K] dev, BF16 */
                          const moe_fp8_groups *pairs);

    /* ---- adamw on a whole weight w [E, O, I] with an fp32 master (no bf16 copy), then its
     * fp8-block copies from the new master: the bytes of adamw followed by quantize_weight,
     * in one pass where the backend can (the CUDA backend: one kernel a 128 x 128 tile, which
     * reads the master once where the two ops read it twice) ---- */
    void (*adamw_quantize)(const moe_backend *be, float *param, /* [E, O, I] dev */
                           moe_cbuf grad,                       /* [E, O, I] dev, F32 or BF16 */
                           moe_buf m,                           /* [E, O, I] dev, F32 or BF16 */
                           moe_buf v,                           /* [E, O, I] dev, the type of m */
                           uint8_t *q,                          /* [2 E O I] dev */
                           float *s, /* [moe_fp8_weight_scales(E, O, I)] dev */
                           int64_t E, int64_t O, int64_t I, moe_recipe prec, float lr, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step,
                           float grad_scale);

    /* ---- dst = src rounded to bf16 (round to nearest even) ---- */
    void (*cast_bf16)(const moe_backend *be, uint16_t *dst, /* [n] dev bf16 */
                      const float *src,                     /* [n] dev */
                      int64_t n);

    /* ---- sum of squares in double over fixed chunks, summed in order (deterministic) --- */
    double (*sum_squares)(const moe_backend *be, moe_cbuf x /* [n] dev, F32 or BF16 */, int64_t n);

    /* ---- pooling over a range of positions per row, forward only (moe-embed):
     * out[b, :] = mean (max = 0) or elementwise max (max = 1) of x[b, t, :] over
     * t in [range[b, 0], range[b, 0] + range[b, 1]); range[b, 1] >= 1 and the range lies in
     * [0, T). Means sum in double (deterministic order) and round once. ---- */
    void (*pool_forward)(const moe_backend *be, float *out, /* [B, C] dev */
                         const float *x,                    /* [B, T, C] dev */
                         const int32_t *range,              /* [B, 2] dev: first, count */
                         int64_t B, int64_t T, int64_t C, int max);
};

/* ---- lifecycle and capabilities (src/ops/backend.c) ---- */

/* Opens the backend `device` names: "cpu"; "cuda" (the current CUDA device); "cuda:N" (device
 * N); "auto" (the first GPU when one is usable, else the CPU; a GPU that is visible but cannot
 * start gives a warning and the CPU). Logs "device: <name>" at info level. threads > 0 sets
 * the CPU threads (moe_backend_cpu_set_threads; OpenMP is per process, so for any device);
 * 0 keeps the current count. The backend must support `recipe` (moe_backend_check without
 * sizes). Errors: an unknown name, cuda in a build without CUDA, no usable GPU for cuda or
 * cuda:N, an unsupported recipe: MOE_ERR_INPUT with a hint. Release with be->destroy(be). */
const moe_backend *moe_backend_open(const char *device, moe_recipe recipe, int threads,
                                    moe_err *err);
/* The device name a rank of a multi-process run opens, into out [n]: "cuda" becomes
 * "cuda:L" for local rank L (one GPU per rank of a node, counted as this process sees them:
 * CUDA_VISIBLE_DEVICES applies); every other name ("cpu", "auto", "cuda:N") is kept.
 * n_gpus: the GPUs visible (moe_backend_gpu_count). L >= n_gpus > 0 is MOE_ERR_INPUT with a
 * hint; with no GPU at all, moe_backend_open("cuda:L") says so. */
moe_status moe_backend_rank_device(const char *device, int local_rank, int n_gpus, char *out,
                                   size_t n, moe_err *err);
/* Number of CUDA devices this process sees (0 without CUDA in the build, a driver or a GPU). */
int moe_backend_gpu_count(void);
/* MOE_OK when be supports every op at precision prec for calls of sizes dims (NULL: the
 * recipe alone); else MOE_ERR_INPUT naming the backend, the first refused op, its sizes and
 * the recipe, with a hint. Callers check before allocating anything (moe_model_create). */
moe_status moe_backend_check(const moe_backend *be, const moe_op_dims *dims, moe_recipe prec,
                             moe_err *err);
/* moe_backend_scratch_estimate's flags. */
/* a compute capability 9.0 device (H100, H200): the experts' fp8-block operands are
 * activation pairs (be->fp8_pairs) where the model's dims.E experts fit the sm_90 grouped
 * kernel, not quantized into scratch as on later GPUs */
#define MOE_SCRATCH_SM90 1u
/* precision.skip_layers keeps some layers in bf16: under fp8-block their fp32 weights are
 * converted to bf16 in scratch */
#define MOE_SCRATCH_SKIPPED 2u
/* Working memory (bytes) backend kind `kind` ("cpu", "cuda") allocates on top of the buffers
 * it is asked for, for the op calls of a training model of sizes dims under prec (the typed
 * operands the model passes: bf16 weight copies and activations under bf16): 0 for the CPU;
 * for CUDA the cuBLASLt workspace, the operand conversions left and reduction scratch (an
 * upper bound for those calls; fp32 operands under bf16 convert more; the fp8 recipes'
 * quantized operands). flags (MOE_SCRATCH_*) name what the fp8-block recipe's operands depend
 * on. Needs no device and works in every build (moe-train --dry-run prints it); unknown kinds
 * give 0. */
int64_t moe_backend_scratch_estimate(const char *kind, const moe_op_dims *dims, moe_recipe prec,
                                     unsigned flags);

/* The CPU reference backend (static, immutable table). */
const moe_backend *moe_backend_cpu(void);
/* Threads used by the CPU backend (OpenMP's count; OpenBLAS is kept single-threaded and
 * GEMMs are tiled over the OpenMP threads instead, because OpenBLAS's own threading is not
 * bit-reproducible across thread counts). n < 1 counts as 1. Results do not depend on n. */
void moe_backend_cpu_set_threads(int n);
/* NULL, or one line of advice when the BLAS runs far below this CPU's ability: OpenBLAS
 * 0.3.21 does not recognise recent Xeons and falls back to its SSE3 "Prescott" kernels
 * (about 4x slower GEMMs); the core type can only be chosen through the environment
 * (OPENBLAS_CORETYPE) before the program starts. moe_backend_open logs it as a warning when
 * it opens the CPU backend. */
const char *moe_backend_cpu_blas_advice(void);
/* Called first thing in main by the tools that multiply matrices on the CPU (moe-train,
 * moe-embed): when OpenBLAS fell back to its generic kernels on a CPU with AVX2/AVX-512 and
 * OPENBLAS_CORETYPE is unset, sets it to the right core type (Haswell, SkylakeX) and
 * re-executes the program (/proc/self/exe, same argv and open files; nothing has been read
 * yet), so that users get the fast kernels without knowing the variable. Returns only when
 * it does not re-execute (also under valgrind, which would not follow the new image). A value
 * the user set is never changed (OPENBLAS_CORETYPE=Prescott keeps the generic kernels). */
void moe_backend_cpu_tune_blas(char **argv);

#ifdef __cplusplus
}
#endif

#endif
