/* test_backend_ops: every op of the CUDA backend against the CPU reference backend, in the
 * style of ggml's test-backend-ops.
 *
 * A table of cases (op, shapes, recipe, tolerance) drives one runner per op family; each
 * runner draws fresh random inputs (the seed is printed; `--seed N` replays a run), runs the
 * forward and the backward on both backends and compares every output by normalised mean
 * squared error (sum (gpu - cpu)^2 / sum cpu^2); integer outputs must match exactly. Every
 * device buffer carries guard bytes on both sides (checked after each op: out-of-bounds
 * writes fail), overwritten outputs start poisoned with NaN (unwritten elements fail), and
 * any NaN in a GPU output fails. Accumulated (+=) gradients start from the same random
 * values on both sides, so accumulation is tested too.
 *
 * Operands are fp32, or of the types the model passes: bf16 under the bf16 recipe (TYPED
 * cases) and, per operand role, what a case sets (the mxfp8 recipe's bf16 residual and MXFP8
 * activations: e4m3 values and e8m0 scales in two guarded buffers, both poisoned when
 * written). The CPU gets fp32 inputs holding the same values; a typed output is compared with
 * the CPU's result as its type stores it (bf16 rounding; MXFP8 encoding, compared decoded).
 *
 *   gpu_test_backend_ops [--seed N] [--only NAME]   compare mode (ctest gpu.backend_ops)
 *   gpu_test_backend_ops --perf [--only NAME]       GPU timings of large cases, TFLOP/s or GB/s
 *
 * The program is this file and the ones beside it: ops_harness.h and ops_harness.c (random
 * numbers, guarded device buffers, comparisons, typed operands), ops_runners_dense.c
 * (embedding, RMSNorm, RoPE, attention, pool, cross-entropy, add), ops_runners_products.c
 * (matmul, router, permute and unpermute, grouped, SwiGLU, AdamW and its copies, sum of
 * squares) and ops_perf.c (--perf's table and timing). This file holds the case table, the
 * supports() checks and main.
 *
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/ops.h"
#include "ops_harness.h"
#include "testlib.h"

/* ------------------------------------------------------------------------------------------
 * cases */

typedef void (*runner_fn)(gctx *g, const tcase *tc);

static runner_fn runner_for(moe_op op) {
    switch (op) {
    case MOE_OP_EMBEDDING:
        return run_embedding;
    case MOE_OP_RMSNORM:
        return run_rmsnorm;
    case MOE_OP_ROPE:
        return run_rope;
    case MOE_OP_ATTENTION:
        return run_attention;
    case MOE_OP_MATMUL:
        return run_matmul;
    case MOE_OP_ROUTER:
        return run_router;
    case MOE_OP_PERMUTE:
        return run_permute; /* also runs unpermute with the same routing */
    case MOE_OP_UNPERMUTE:
        return run_permute;
    case MOE_OP_GROUPED_MATMUL:
        return run_grouped;
    case MOE_OP_SWIGLU:
        return run_swiglu;
    case MOE_OP_CROSS_ENTROPY:
        return run_xent;
    case MOE_OP_ADD:
        return run_add;
    case MOE_OP_ADAMW:
        return run_adamw; /* also runs cast_bf16 */
    case MOE_OP_CAST:
        return run_adamw;
    case MOE_OP_QUANTIZE:
        return run_adamw_fp8;
    case MOE_OP_SUM_SQUARES:
        return run_sum_squares;
    case MOE_OP_POOL:
        return run_pool;
    default:
        return NULL;
    }
}

/* Tolerances: fp32 ops differ only in libm ulps and summation order (measured <= 2e-13);
 * bf16 outputs can round the other way at a boundary (measured <= 1.5e-9, attention's
 * bf16 probabilities and score gradients included: <= 8e-9 on an H200, 2026-11-29).
 * Attention's bf16 cases allow 4e-6: the Hopper forward (kernels/sm90) walks 128-key blocks
 * where the CPU reference walks 64, so its probabilities round at other running maxima
 * (measured <= 9.0e-7 for out, 2026-12-01; a wrong kernel gives 1e-3 and more).
 * mxfp8 (1e-5): both sides multiply the same quantized values (MXFP8 inputs made here, fp32
 * weights and bf16 operands quantized per call by the same rule), so the products differ in
 * the fp32 sums' order only: a bf16 output may round the other way at a boundary and an MXFP8
 * one then move by an e4m3 step (estimated nmse <= 1e-6; quantizing a wrong way: 1e-3). */
static const tcase k_cases[] = {
    {"embedding N1000 C256 V300", MOE_OP_EMBEDDING, {1000, 256, 300}, FP32, 1e-12, 0},
    {"embedding N4000 C128 V5 (DNA)", MOE_OP_EMBEDDING, {4000, 128, 5}, FP32, 1e-12, 0},
    {"embedding N500 C64 V3000", MOE_OP_EMBEDDING, {500, 64, 3000}, FP32, 1e-12, 0},
    /* the bf16 residual stream of mxfp8 training (its first value; C100: a scalar tail) */
    {"embedding N1000 C256 V300 mxfp8 bf16-out",
     MOE_OP_EMBEDDING,
     {1000, 256, 300},
     MX8,
     1e-12,
     Y_BF16},
    {"embedding N333 C100 V64 mxfp8 bf16-out",
     MOE_OP_EMBEDDING,
     {333, 100, 64},
     MX8,
     1e-12,
     Y_BF16},
    {"rmsnorm N513 C1024 fp32", MOE_OP_RMSNORM, {513, 1024}, FP32, 1e-10, 0},
    {"rmsnorm N300 C320 bf16", MOE_OP_RMSNORM, {300, 320}, BF16, 1e-6, 0},
    {"rmsnorm N300 C320 bf16 typed", MOE_OP_RMSNORM, {300, 320}, BF16, 1e-6, 1},
    /* rows of a length that is not a multiple of 8: the one-element path of the vectorised
     * elementwise kernels (every other case here moves 8 elements at a time) */
    {"rmsnorm N200 C100 fp32", MOE_OP_RMSNORM, {200, 100}, FP32, 1e-10, 0},
    {"rmsnorm N200 C100 bf16 typed", MOE_OP_RMSNORM, {200, 100}, BF16, 1e-6, 1},
    /* under mxfp8: the bf16 residual in, ln1 out as MXFP8 (compared decoded) or ln2 as bf16 */
    {"rmsnorm N300 C320 mxfp8 bf16-in mx-out",
     MOE_OP_RMSNORM,
     {300, 320},
     MX8,
     1e-5,
     X_BF16 | Y_MXFP8},
    {"rmsnorm N513 C1024 mxfp8 bf16-in mx-out",
     MOE_OP_RMSNORM,
     {513, 1024},
     MX8,
     1e-5,
     X_BF16 | Y_MXFP8},
    {"rmsnorm N300 C320 mxfp8 bf16-in bf16-out",
     MOE_OP_RMSNORM,
     {300, 320},
     MX8,
     1e-5,
     X_BF16 | Y_BF16},
    {"rope B2 T100 NH6 D64", MOE_OP_ROPE, {2, 100, 6, 64, 10000}, FP32, 1e-10, 0},
    {"rope B1 T300 NH2 D128 1e6", MOE_OP_ROPE, {1, 300, 2, 128, 1000000}, FP32, 1e-10, 0},
    /* bf16 storage rounds the rotated values (the CPU's fp32 ones rounded to compare with) */
    {"rope B1 T300 NH2 D128 typed", MOE_OP_ROPE, {1, 300, 2, 128, 1000000}, BF16, 1e-5, 1},
    {"rope docs B2 T333 NH4 D64", MOE_OP_ROPE, {2, 333, 4, 64, 10000, 1}, FP32, 1e-10, 0},
    {"rope docs B2 T300 NH2 D128 typed", MOE_OP_ROPE, {2, 300, 2, 128, 1000000, 2}, BF16, 1e-5, 1},
    {"rope B2 T50 NH3 D20", MOE_OP_ROPE, {2, 50, 3, 20, 10000}, FP32, 1e-10, 0},
    {"rope B2 T50 NH3 D20 typed", MOE_OP_ROPE, {2, 50, 3, 20, 10000}, BF16, 1e-5, 1},
    {"rope p0 B2 T100 NH2 D128 typed",
     MOE_OP_ROPE,
     {2, 100, 2, 128, 1000000, 0, 8000},
     BF16,
     1e-5,
     1},
    {"attn B2 T200 H8 KV2 D64", MOE_OP_ATTENTION, {2, 200, 8, 2, 64}, BF16, 4e-6, 0},
    {"attn B1 T333 H4 KV4 D128", MOE_OP_ATTENTION, {1, 333, 4, 4, 128}, BF16, 4e-6, 0},
    {"attn B1 T333 H4 KV2 D128 typed", MOE_OP_ATTENTION, {1, 333, 4, 2, 128}, BF16, 4e-6, 1},
    {"attn B2 T200 H8 KV2 D64 typed", MOE_OP_ATTENTION, {2, 200, 8, 2, 64}, BF16, 4e-6, 1},
    {"attn B1 T1024 H4 KV1 D128", MOE_OP_ATTENTION, {1, 1024, 4, 1, 128}, BF16, 4e-6, 0},
    {"attn B3 T77 H4 KV2 D16", MOE_OP_ATTENTION, {3, 77, 4, 2, 16}, BF16, 4e-6, 0},
    {"attn fp32 B2 T150 H4 KV2 D64", MOE_OP_ATTENTION, {2, 150, 4, 2, 64}, FP32, 1e-10, 0},
    {"attn fp32 B1 T70 H3 KV1 D40", MOE_OP_ATTENTION, {1, 70, 3, 1, 40}, FP32, 1e-10, 0},
    {"attn B1 T130 H2 KV1 D32", MOE_OP_ATTENTION, {1, 130, 2, 1, 32}, BF16, 4e-6, 0},
    {"attn B1 T257 H6 KV3 D96", MOE_OP_ATTENTION, {1, 257, 6, 3, 96}, BF16, 4e-6, 0},
    /* document masks (s[5], doc_starts): T not a multiple of the tiles, length-1 documents,
     * boundaries on tile edges, key blocks skipped before long documents */
    {"attn docs B2 T333 H4 KV2 D64", MOE_OP_ATTENTION, {2, 333, 4, 2, 64, 1}, BF16, 4e-6, 0},
    {"attn docs B2 T333 H4 KV2 D128 ty", MOE_OP_ATTENTION, {2, 333, 4, 2, 128, 1}, BF16, 4e-6, 1},
    {"attn docs B1 T1024 H4 KV1 D128", MOE_OP_ATTENTION, {1, 1024, 4, 1, 128, 1}, BF16, 4e-6, 0},
    {"attn docs B3 T200 H8 KV2 D64 rand", MOE_OP_ATTENTION, {3, 200, 8, 2, 64, 2}, BF16, 4e-6, 0},
    {"attn docs B3 T77 H4 KV2 D16 rand", MOE_OP_ATTENTION, {3, 77, 4, 2, 16, 2}, BF16, 4e-6, 0},
    {"attn docs B1 T257 H6 KV3 D96", MOE_OP_ATTENTION, {1, 257, 6, 3, 96, 1}, BF16, 4e-6, 0},
    {"attn docs B2 T130 H2 KV1 D32", MOE_OP_ATTENTION, {2, 130, 2, 1, 32, 1}, BF16, 4e-6, 0},
    /* GQA 4 without a mask above 2,048 tokens (the Hopper backward's longest blocks among 18
     * key blocks a kv head, each walking 4 query heads), long documents */
    {"attn B1 T2300 H4 KV1 D64", MOE_OP_ATTENTION, {1, 2300, 4, 1, 64}, BF16, 4e-6, 0},
    /* 12 (batch, kv head) rows: the Hopper backward starts a group of 8 in turn, then 4 */
    {"attn B3 T300 H8 KV4 D64 rows", MOE_OP_ATTENTION, {3, 300, 8, 4, 64}, BF16, 4e-6, 0},
    /* GQA 8: a Hopper backward block walks 8 query heads at each query block */
    {"attn B2 T400 H16 KV2 D128 gqa8", MOE_OP_ATTENTION, {2, 400, 16, 2, 128}, BF16, 4e-6, 0},
    {"attn docs B1 T600 H8 KV1 D64 gqa8", MOE_OP_ATTENTION, {1, 600, 8, 1, 64, 2}, BF16, 4e-6, 0},
    {"attn docs B2 T2400 H4 KV2 D128 long",
     MOE_OP_ATTENTION,
     {2, 2400, 4, 2, 128, 3},
     BF16,
     4e-6,
     0},
    /* more query tiles (128 rows of one head) than an H200 has SMs: a persistent forward
     * block walks several, with and without documents and cached keys */
    {"attn docs B4 T700 H12 KV4 D64 rand tiles",
     MOE_OP_ATTENTION,
     {4, 700, 12, 4, 64, 2},
     BF16,
     4e-6,
     0},
    {"attn cache B4 T400+200 H16 KV4 D128 tiles",
     MOE_OP_ATTENTION,
     {4, 400, 16, 4, 128, 0, 200},
     BF16,
     4e-6,
     1},
    {"attn fp32 docs B2 T150 H4 KV2 D64", MOE_OP_ATTENTION, {2, 150, 4, 2, 64, 1}, FP32, 1e-10, 0},
    {"attn fp32 docs B2 T90 H3 KV1 D40", MOE_OP_ATTENTION, {2, 90, 3, 1, 40, 2}, FP32, 1e-10, 0},
    /* cached keys (s[6] = P: the queries are the last T of P + T positions), as scoring's
     * continued windows run them: the wgmma kernel (D64, D128), the portable one, fp32 */
    {"attn cache B2 T100+300 H8 KV2 D128 ty",
     MOE_OP_ATTENTION,
     {2, 100, 8, 2, 128, 0, 300},
     BF16,
     4e-6,
     1},
    {"attn cache B1 T64+200 H4 KV1 D64",
     MOE_OP_ATTENTION,
     {1, 64, 4, 1, 64, 0, 200},
     BF16,
     4e-6,
     0},
    {"attn cache B2 T77+130 H4 KV2 D32",
     MOE_OP_ATTENTION,
     {2, 77, 4, 2, 32, 0, 130},
     BF16,
     4e-6,
     0},
    {"attn cache docs B2 T150+183 H4 KV2 D128",
     MOE_OP_ATTENTION,
     {2, 150, 4, 2, 128, 1, 183},
     BF16,
     4e-6,
     0},
    {"attn fp32 cache B2 T50+100 H3 KV1 D40",
     MOE_OP_ATTENTION,
     {2, 50, 3, 1, 40, 0, 100},
     FP32,
     1e-10,
     0},
    {"matmul N512 I384 O640 fp32", MOE_OP_MATMUL, {512, 384, 640}, FP32, 1e-10, 0},
    /* the skinny fp32 kernels (gemm_skinny.cu, O <= 32, I a multiple of 8 up to 4096): the
     * router's gate with its bf16 input (mixtral's shape), an fp32 input, then odd shapes: N not
     * a multiple of anything or one row, I ending in a part of a 256-column step (I200, I520,
     * I136), O in one short pass of 8 (O3), two and a half (O20) and four (O32) and dgrad's three
     * widths (O8, O12, O32), a bf16 output (its rounding: the bf16 cases' bound); I204 and O33
     * take the cuBLAS path with a bf16 input. The sums run in another order than the CPU's, as
     * cuBLAS's do: the fp32 cases' bound */
    {"matmul N8192 I4096 O8 fp32 bf16-in", MOE_OP_MATMUL, {8192, 4096, 8}, FP32, 1e-10, X_BF16},
    {"matmul N1000 I2048 O8 fp32", MOE_OP_MATMUL, {1000, 2048, 8}, FP32, 1e-10, 0},
    {"matmul N77 I200 O8 fp32 bf16-in", MOE_OP_MATMUL, {77, 200, 8}, FP32, 1e-10, X_BF16},
    {"matmul N1 I4096 O8 fp32 bf16-in", MOE_OP_MATMUL, {1, 4096, 8}, FP32, 1e-10, X_BF16},
    {"matmul N1000 I256 O3 fp32", MOE_OP_MATMUL, {1000, 256, 3}, FP32, 1e-10, 0},
    {"matmul N300 I64 O32 fp32 bf16-in", MOE_OP_MATMUL, {300, 64, 32}, FP32, 1e-10, X_BF16},
    {"matmul N513 I520 O20 fp32", MOE_OP_MATMUL, {513, 520, 20}, FP32, 1e-10, 0},
    {"matmul N300 I136 O12 fp32 bf16-in", MOE_OP_MATMUL, {300, 136, 12}, FP32, 1e-10, X_BF16},
    {"matmul N77 I200 O8 fp32 bf16-in bf16-out",
     MOE_OP_MATMUL,
     {77, 200, 8},
     FP32,
     1e-6,
     X_BF16 | Y_BF16},
    {"matmul N77 I204 O8 fp32 bf16-in", MOE_OP_MATMUL, {77, 204, 8}, FP32, 1e-10, X_BF16},
    {"matmul N100 I256 O33 fp32 bf16-in", MOE_OP_MATMUL, {100, 256, 33}, FP32, 1e-10, X_BF16},
    {"matmul N512 I384 O640 bf16", MOE_OP_MATMUL, {512, 384, 640}, BF16, 1e-6, 0},
    {"matmul N77 I200 O130 bf16", MOE_OP_MATMUL, {77, 200, 130}, BF16, 1e-6, 0},
    {"matmul N77 I200 O130 bf16 typed", MOE_OP_MATMUL, {77, 200, 130}, BF16, 1e-6, 1},
    /* a bf16 dy: q's and k's gradients as RoPE's backward writes them under bf16 */
    {"matmul N77 I200 O130 bf16 typed bf16-dy",
     MOE_OP_MATMUL,
     {77, 200, 130},
     BF16,
     1e-6,
     TYPED | DY_BF16},
    {"matmul N512 I384 O640 bf16 typed bf16-dy",
     MOE_OP_MATMUL,
     {512, 384, 640},
     BF16,
     1e-6,
     TYPED | DY_BF16},
    {"matmul N512 I384 O640 bf16 typed", MOE_OP_MATMUL, {512, 384, 640}, BF16, 1e-6, 1},
    /* fp8-block against the CPU emulation: the same quantized values (quant_fp8.cu makes the
     * bytes of moe/quant.h), so only the fp32 sums' order and the bf16 rounding of forward
     * outputs differ. Shapes: partial 128-blocks and tiles, fp32 and bf16 inputs. */
    {"matmul N512 I384 O640 fp8", MOE_OP_MATMUL, {512, 384, 640}, FP8B, 1e-5, 0},
    {"matmul N77 I208 O144 fp8 typed", MOE_OP_MATMUL, {77, 208, 144}, FP8B, 1e-5, 1},
    {"matmul N300 I64 O32 fp8 typed", MOE_OP_MATMUL, {300, 64, 32}, FP8B, 1e-5, 1},
    {"matmul N77 I208 O144 fp8 pow2 typed", MOE_OP_MATMUL, {77, 208, 144}, FP8P, 1e-5, 1},
    /* precision.fp8_wgrad x-tiles: the wgrad's x in 128 x 128 tiles (partial ones both ways) */
    {"matmul N512 I384 O640 fp8 x-tiles", MOE_OP_MATMUL, {512, 384, 640}, FP8X, 1e-5, 0},
    {"matmul N77 I208 O144 fp8 x-tiles typed", MOE_OP_MATMUL, {77, 208, 144}, FP8X, 1e-5, 1},
    {"matmul N300 I64 O32 fp8 pow2 x-tiles typed", MOE_OP_MATMUL, {300, 64, 32}, FP8PX, 1e-5, 1},
    /* mxfp8 against the CPU emulation: the q/k/v projections (x MXFP8 ln1, y bf16), the
     * o-projection (x bf16, y fp32) and I208 (a bf16 x: rows ending in a block of 16); N not a
     * multiple of 32 (the weight gradient's blocks along N end short), O32 (one block for
     * dgrad's rows), the floor rule (the MXFP8 x quantized again under it) */
    {"matmul N300 I256 O384 mxfp8 mx-in",
     MOE_OP_MATMUL,
     {300, 256, 384},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"matmul N77 I128 O96 mxfp8 mx-in", MOE_OP_MATMUL, {77, 128, 96}, MX8, 1e-5, X_MXFP8 | Y_BF16},
    {"matmul N1000 I256 O32 mxfp8 mx-in",
     MOE_OP_MATMUL,
     {1000, 256, 32},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"matmul N300 I384 O256 mxfp8 bf16-in f32-out",
     MOE_OP_MATMUL,
     {300, 384, 256},
     MX8,
     1e-5,
     X_BF16 | Y_F32},
    {"matmul N77 I208 O144 mxfp8 bf16-in",
     MOE_OP_MATMUL,
     {77, 208, 144},
     MX8,
     1e-5,
     X_BF16 | Y_BF16},
    {"matmul N300 I256 O384 mxfp8-floor mx-in",
     MOE_OP_MATMUL,
     {300, 256, 384},
     MX8F,
     1e-5,
     X_MXFP8 | Y_BF16},
    {"router N1000 E8 K2", MOE_OP_ROUTER, {1000, 8, 2}, FP32, 1e-10, 0},
    {"router N300 E64 K6", MOE_OP_ROUTER, {300, 64, 6}, FP32, 1e-10, 0},
    {"permute N1000 C96 E8 K2", MOE_OP_PERMUTE, {1000, 96, 8, 2}, FP32, 1e-12, 0},
    {"permute N1000 C96 E8 K2 typed", MOE_OP_PERMUTE, {1000, 96, 8, 2}, BF16, 1e-12, 1},
    {"permute N3000 C40 E64 K4", MOE_OP_PERMUTE, {3000, 40, 64, 4}, FP32, 1e-12, 0},
    {"permute N500 C36 E8 K2 typed", MOE_OP_PERMUTE, {500, 36, 8, 2}, BF16, 1e-12, 1},
    /* mxfp8: xp MXFP8 from the bf16 ln2 (the same bytes as the CPU's); unpermute on bf16 */
    {"permute N1000 C96 E8 K2 mxfp8 mx-out",
     MOE_OP_PERMUTE,
     {1000, 96, 8, 2},
     MX8,
     1e-12,
     TYPED | Y_MXFP8},
    {"permute N700 C256 E6 K2 mxfp8 mx-out",
     MOE_OP_PERMUTE,
     {700, 256, 6, 2},
     MX8,
     1e-12,
     TYPED | Y_MXFP8},
    {"grouped E8 I256 O384 fp32", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, FP32, 1e-10, 0},
    {"grouped E8 I256 O384 bf16", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, BF16, 1e-6, 0},
    {"grouped E4 I72 O40 bf16", MOE_OP_GROUPED_MATMUL, {4, 72, 40, 33}, BF16, 1e-6, 0},
    {"grouped E4 I72 O40 bf16 typed", MOE_OP_GROUPED_MATMUL, {4, 72, 40, 33}, BF16, 1e-6, 1},
    {"grouped E8 I256 O384 bf16 typed", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, BF16, 1e-6, 1},
    /* bf16 weight gradients (optim.expert_grads bf16): added into and written */
    {"grouped E8 I256 O384 bf16 typed gw16",
     MOE_OP_GROUPED_MATMUL,
     {8, 256, 384, 120},
     BF16,
     1e-6,
     TYPED | GW_BF16},
    {"grouped E4 I72 O40 bf16 gw16", MOE_OP_GROUPED_MATMUL, {4, 72, 40, 33}, BF16, 1e-6, GW_BF16},
    {"grouped E6 I128 O272 fp8 gw16",
     MOE_OP_GROUPED_MATMUL,
     {6, 128, 272, 300},
     FP8B,
     1e-5,
     GW_BF16},
    {"grouped E8 I256 O384 fp8 typed", MOE_OP_GROUPED_MATMUL, {8, 256, 384, 120}, FP8B, 1e-5, 1},
    {"grouped E4 I80 O48 fp8 typed", MOE_OP_GROUPED_MATMUL, {4, 80, 48, 33}, FP8B, 1e-5, 1},
    {"grouped E6 I128 O272 fp8", MOE_OP_GROUPED_MATMUL, {6, 128, 272, 300}, FP8B, 1e-5, 0},
    {"grouped E4 I80 O48 fp8 pow2 typed", MOE_OP_GROUPED_MATMUL, {4, 80, 48, 33}, FP8P, 1e-5, 1},
    {"grouped E8 I256 O384 fp8 x-tiles typed",
     MOE_OP_GROUPED_MATMUL,
     {8, 256, 384, 120},
     FP8X,
     1e-5,
     1},
    {"grouped E6 I208 O272 fp8 x-tiles gw16",
     MOE_OP_GROUPED_MATMUL,
     {6, 208, 272, 300},
     FP8X,
     1e-5,
     GW_BF16},
    {"grouped E4 I80 O48 fp8 pow2 x-tiles typed",
     MOE_OP_GROUPED_MATMUL,
     {4, 80, 48, 33},
     FP8PX,
     1e-5,
     1},
    /* the model's w2 backward under fp8-block: dg (the dx) written in bf16 (moe_layer_acts.dgt);
     * the grouped kernel's bf16 output, as the forward's, for dgrad */
    {"grouped E8 I384 O256 fp8 dg16 typed",
     MOE_OP_GROUPED_MATMUL,
     {8, 384, 256, 120},
     FP8B,
     1e-5,
     TYPED | DX_BF16},
    {"grouped E6 I208 O272 fp8 x-tiles dg16 typed",
     MOE_OP_GROUPED_MATMUL,
     {6, 208, 272, 300},
     FP8X,
     1e-5,
     TYPED | DX_BF16},
    /* the grouped fp8 kernel's stage ring (4 stages at 128 x 256 tiles) wrapping: inside a
     * tile (5 K blocks of 128 both ways), and from tile to tile of a block's walk (about 200
     * tiles for 132 SMs) */
    {"grouped E4 I640 O640 fp8 typed", MOE_OP_GROUPED_MATMUL, {4, 640, 640, 200}, FP8B, 1e-5, 1},
    {"grouped E8 I640 O1280 fp8", MOE_OP_GROUPED_MATMUL, {8, 640, 1280, 600}, FP8B, 1e-5, 0},
    /* mxfp8 as the model runs the experts of hidden 256 (128), width 384 (96): w1/w3 (x xe,
     * y h1, dy dh1 all MXFP8; dx dxe fp32), w2 (x g MXFP8, y ye and dy dye bf16, dx dg bf16
     * written); each expert's rows their own blocks along the tokens in the weight gradient:
     * uneven counts, an expert of none, and experts shorter than one block (s[3] 20) */
    {"grouped E6 I256 O384 mxfp8 mx-in mx-out",
     MOE_OP_GROUPED_MATMUL,
     {6, 256, 384, 100},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_F32},
    {"grouped E6 I384 O256 mxfp8 mx-in bf16-out",
     MOE_OP_GROUPED_MATMUL,
     {6, 384, 256, 100},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16 | DY_BF16 | DX_BF16},
    {"grouped E8 I128 O96 mxfp8 mx-in mx-out",
     MOE_OP_GROUPED_MATMUL,
     {8, 128, 96, 70},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_BF16},
    {"grouped E8 I96 O128 mxfp8 mx-in bf16-out",
     MOE_OP_GROUPED_MATMUL,
     {8, 96, 128, 70},
     MX8,
     1e-5,
     X_MXFP8 | Y_BF16 | DY_BF16 | DX_BF16},
    {"grouped E4 I256 O384 mxfp8 mx short experts",
     MOE_OP_GROUPED_MATMUL,
     {4, 256, 384, 20},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_F32},
    {"grouped E6 I256 O384 mxfp8 mx gw16",
     MOE_OP_GROUPED_MATMUL,
     {6, 256, 384, 100},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_MXFP8 | DX_F32 | GW_BF16},
    {"swiglu n100003 fp32", MOE_OP_SWIGLU, {100003}, FP32, 1e-10, 0},
    {"swiglu n100003 bf16", MOE_OP_SWIGLU, {100003}, BF16, 1e-6, 0},
    {"swiglu n100003 bf16 typed", MOE_OP_SWIGLU, {100003}, BF16, 1e-6, 1},
    {"swiglu n100000 fp32", MOE_OP_SWIGLU, {100000}, FP32, 1e-10, 0},
    {"swiglu n100000 bf16 typed", MOE_OP_SWIGLU, {100000}, BF16, 1e-6, 1},
    /* mxfp8: h1, h3 and g MXFP8, dg bf16, dh1 and dh3 MXFP8 (also over h1 and h3) */
    {"swiglu n100000 mxfp8 mx",
     MOE_OP_SWIGLU,
     {100000},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_BF16 | DX_MXFP8},
    {"swiglu n96032 mxfp8 mx",
     MOE_OP_SWIGLU,
     {96032},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_BF16 | DX_MXFP8},
    {"swiglu n4096 mxfp8 mx f32-dout",
     MOE_OP_SWIGLU,
     {4096},
     MX8,
     1e-5,
     X_MXFP8 | Y_MXFP8 | DY_F32 | DX_MXFP8},
    {"xent N300 V1000 weights", MOE_OP_CROSS_ENTROPY, {300, 1000, 1}, FP32, 1e-10, 0},
    {"xent N257 V256", MOE_OP_CROSS_ENTROPY, {257, 256, 0}, FP32, 1e-10, 0},
    {"add n12345", MOE_OP_ADD, {12345}, FP32, 0.0, 0},
    {"add n12344", MOE_OP_ADD, {12344}, FP32, 0.0, 0},
    /* o_proj's bf16 output (b) onto the fp32 residual */
    {"add n12344 bf16 b", MOE_OP_ADD, {12344}, BF16, 0.0, TYPED},
    {"add n12345 bf16 b", MOE_OP_ADD, {12345}, BF16, 0.0, TYPED},
    /* the bf16 residual of mxfp8 training (in place, b bf16), and its last read into fp32 */
    {"add n12344 mxfp8 bf16 residual", MOE_OP_ADD, {12344}, MX8, 0.0, TYPED | X_BF16 | Y_BF16},
    {"add n12345 mxfp8 bf16-in f32-out", MOE_OP_ADD, {12345}, MX8, 0.0, X_BF16 | Y_F32},
    {"adamw n10007 3 steps", MOE_OP_ADAMW, {10007}, FP32, 1e-10, 0},
    {"adamw n10007 3 steps bf16 m v", MOE_OP_ADAMW, {10007}, FP32, 0.0, 1},
    {"adamw n10007 3 steps bf16 grad", MOE_OP_ADAMW, {10007}, FP32, 1e-10, GW_BF16},
    {"adamw n10007 3 steps bf16 m v grad", MOE_OP_ADAMW, {10007}, FP32, 0.0, 1 | GW_BF16},
    /* the split master (optim.master split): its halves, the CPU's bytes with bf16 moments */
    {"adamw split fp32 m v", MOE_OP_ADAMW, {10007}, FP32, 1e-10, MASTER_SPLIT},
    {"adamw split bf16 m v", MOE_OP_ADAMW, {10007}, FP32, 0.0, 1 | MASTER_SPLIT},
    {"adamw split bf16 m v grad", MOE_OP_ADAMW, {10007}, FP32, 0.0, 1 | GW_BF16 | MASTER_SPLIT},
    /* AdamW then the fp8-block copies: edge tiles (272 = 2 x 128 + 16, 144), experts, pow2 */
    {"adamw fp8 E3 O272 I144", MOE_OP_QUANTIZE, {3, 272, 144}, FP8B, 1e-10, 0},
    {"adamw fp8 pow2 E1 O384 I656", MOE_OP_QUANTIZE, {1, 384, 656}, FP8P, 1e-10, 0},
    /* and in one pass (adamw_quantize) with the training setting's bf16 moments and gradients */
    {"adamw fp8 E3 O272 I144 bf16 m v grad",
     MOE_OP_QUANTIZE,
     {3, 272, 144},
     FP8B,
     1e-10,
     1 | GW_BF16},
    {"sum_squares n1000003", MOE_OP_SUM_SQUARES, {1000003}, FP32, 1e-12, 0},
    {"sum_squares n1000003 bf16", MOE_OP_SUM_SQUARES, {1000003}, FP32, 1e-12, GW_BF16},
    {"pool B9 T300 C200", MOE_OP_POOL, {9, 300, 200}, FP32, 1e-13, 0},
    {"pool B3 T4100 C2048", MOE_OP_POOL, {3, 4100, 2048}, FP32, 1e-13, 0},
};
enum { NCASES = sizeof k_cases / sizeof k_cases[0] };

/* The sizes supports() sees for a case (the fields its op reads; the rest 0). */
static moe_op_dims tcase_dims(const tcase *tc) {
    moe_op_dims d;
    memset(&d, 0, sizeof d);
    const int64_t *s = tc->s;
    switch (tc->op) {
    case MOE_OP_ATTENTION:
        d.B = s[0], d.T = s[1], d.H = s[2], d.KV = s[3], d.D = s[4];
        break;
    case MOE_OP_ROPE:
        d.B = s[0], d.T = s[1], d.H = s[2], d.D = s[3];
        break;
    case MOE_OP_ROUTER:
        d.B = 1, d.T = s[0], d.E = s[1], d.K = s[2];
        break;
    case MOE_OP_PERMUTE:
        d.B = 1, d.T = s[0], d.C = s[1], d.E = s[2], d.K = s[3];
        break;
    case MOE_OP_MATMUL: /* as an attention projection C -> H*D */
        d.B = 1, d.T = s[0], d.C = s[1], d.H = d.KV = 1, d.D = s[2];
        break;
    case MOE_OP_GROUPED_MATMUL:
        d.E = s[0], d.C = s[1], d.F = s[2];
        break;
    default:
        break;
    }
    return d;
}

/* supports() with sizes: the shapes the kernels refuse at launch are refused up front, and
 * moe_backend_check names the op and the sizes (what moe_model_create reports). */
static void check_supports_shapes(const moe_backend *gpu) {
    moe_op_dims d;
    memset(&d, 0, sizeof d);
    d.B = 2, d.T = 64, d.H = 4, d.KV = 2, d.D = 64, d.C = 256, d.E = 8, d.K = 2, d.V = 64;
    d.F = 128;
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_BF16, NULL) == MOE_OK);
    d.D = 80; /* no flash-attention kernel for head dim 80; the fp32 kernel takes it */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    CHECK(gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    CHECK(gpu->supports(gpu, MOE_OP_MATMUL, &d, MOE_RECIPE_BF16)); /* only attention cares */
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_BF16, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "attention") && strstr(err.msg, "D=80"), "message: %s", err.msg);
    d.D = 288; /* beyond the fp32 kernel's 256 */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_FP32));
    d.D = 64, d.H = 6, d.KV = 4; /* H % KV != 0 */
    CHECK(!gpu->supports(gpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    d.H = 4, d.KV = 2, d.E = 2000; /* more experts than the grouping kernels take */
    CHECK(!gpu->supports(gpu, MOE_OP_PERMUTE, &d, MOE_RECIPE_FP32));
    moe_err_clear(&err);
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_FP32, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "permute") && strstr(err.msg, "E=2000"), "message: %s", err.msg);
    /* fp8-block and mxfp8, either scale rule: every op (the unquantized ones as bf16);
     * fp8-block's products want multiples of 16 */
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_FP8_BLOCK, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_FP8_BLOCK_POW2, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_MXFP8, NULL) == MOE_OK);
    CHECK(moe_backend_check(gpu, NULL, MOE_RECIPE_MXFP8_FLOOR, NULL) == MOE_OK);
    /* --dry-run's CUDA estimate exists for exactly the recipes the backend runs (every op) */
    const moe_recipe all[] = {MOE_RECIPE_FP32,         MOE_RECIPE_BF16,
                              MOE_RECIPE_FP8_BLOCK,    MOE_RECIPE_FP8_BLOCK_POW2,
                              MOE_RECIPE_FP8_BLOCK_XT, MOE_RECIPE_FP8_BLOCK_POW2_XT,
                              MOE_RECIPE_MXFP8,        MOE_RECIPE_MXFP8_FLOOR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_MSG((moe_backend_scratch_estimate("cuda", &d, all[i], 0) >= 0) ==
                      (moe_backend_check(gpu, NULL, all[i], NULL) == MOE_OK),
                  "recipe %s: the scratch estimate and supports() disagree",
                  moe_recipe_name(all[i]));
    memset(&d, 0, sizeof d);
    d.B = 1, d.T = 64, d.C = 64, d.H = 4, d.KV = 2, d.D = 16, d.E = 4, d.K = 2, d.F = 96, d.V = 5;
    CHECK(moe_backend_check(gpu, &d, MOE_RECIPE_FP8_BLOCK, NULL) == MOE_OK);
    d.F = 100;
    CHECK(!gpu->supports(gpu, MOE_OP_GROUPED_MATMUL, &d, MOE_RECIPE_FP8_BLOCK));
    CHECK(gpu->supports(gpu, MOE_OP_GROUPED_MATMUL, &d, MOE_RECIPE_BF16));
    d.F = 96, d.KV = 1, d.D = 8; /* k/v projections of 8 columns */
    CHECK(!gpu->supports(gpu, MOE_OP_MATMUL, &d, MOE_RECIPE_FP8_BLOCK));
}

/* ------------------------------------------------------------------------------------------ */

/* How many compare cases' names contain only (all of them when only is NULL). */
static int compare_cases_matching(const char *only) {
    int n = 0;
    for (int i = 0; i < NCASES; i++)
        n += !only || strstr(k_cases[i].name, only) != NULL;
    return n;
}

int main(int argc, char **argv) {
    int perf = 0;
    const char *only = NULL;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf"))
            perf = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--perf] [--seed N] [--only SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    /* a filter that matches no case would check nothing and pass: an error, before any GPU
     * is looked for (the two modes' tables name their cases differently) */
    if ((perf ? perf_cases_matching(only) : compare_cases_matching(only)) == 0) {
        fprintf(stderr,
                "test_backend_ops: no %s case's name contains \"%s\" (the compare and --perf "
                "modes name their cases differently: see k_cases in test_backend_ops.c and k_perf "
                "in ops_perf.c)\n",
                perf ? "--perf" : "compare", only);
        return 2;
    }
    moe_err err;
    moe_err_clear(&err);
    gctx g;
    memset(&g, 0, sizeof g);
    g.cpu = moe_backend_cpu();
    g.gpu = test_cuda_backend("test_backend_ops");
    if (!g.gpu) return 77;
    g_rng = seed;
    printf("test_backend_ops: seed %llu (replay with --seed %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    if (perf) {
        run_perf_cases(&g, only);
    } else {
        check_supports_shapes(g.gpu);
        int failed_cases = 0, run = 0;
        for (int i = 0; i < NCASES; i++) {
            const tcase *tc = &k_cases[i];
            if (only && !strstr(tc->name, only)) continue;
            g.label = tc->name;
            g.fails = 0;
            moe_op_dims dims = tcase_dims(tc);
            if (!g.gpu->supports(g.gpu, tc->op, &dims, tc->prec)) {
                printf("  %-28s not supported by the CUDA backend: FAIL\n", tc->name);
                CHECK_MSG(0, "%s: cuda backend does not support %s", tc->name, moe_op_name(tc->op));
                continue;
            }
            runner_for(tc->op)(&g, tc);
            free_bufs(&g);
            run++;
            failed_cases += g.fails > 0;
        }
        printf("test_backend_ops: %d cases, %d failed, worst nmse %.3e, seed %llu\n", run,
               failed_cases, g_worst_nmse, (unsigned long long)seed);
    }
    g.gpu->destroy(g.gpu);
    free(g.perf_src);
    return test_summary("test_backend_ops");
}
