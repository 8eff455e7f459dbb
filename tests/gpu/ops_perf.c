/* ops_perf: the --perf mode of gpu_test_backend_ops (test_backend_ops.c): a table of large
 * cases (pcase: op, direction, sizes), each timed on the GPU alone (no CPU reference, no
 * guard checks) as the median of 7 repetitions of 3 calls after a warm-up, and printed as TFLOP/s
 * for the products and attention, GB/s for the others. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ops.h"
#include "moe/quant.h"
#include "ops_harness.h"

/* ------------------------------------------------------------------------------------------
 * perf mode: GPU only, large shapes, median of timed repetitions after a warm-up */

typedef struct pcase {
    const char *name;
    moe_op op;
    int dir; /* 0 forward, 1 backward */
    int64_t s[7];
} pcase;

static const pcase k_perf[] = {
    {"matmul bf16 N8192 I4096 O4096", MOE_OP_MATMUL, 0, {8192, 4096, 4096}},
    {"matmul bf16 N8192 I4096 O4096", MOE_OP_MATMUL, 1, {8192, 4096, 4096}},
    {"matmul bf16 N16384 I2048 O256 (lm_head)", MOE_OP_MATMUL, 0, {16384, 2048, 256}},
    /* s[3] 1: the router's gate as the model runs it, the fp32 recipe on a bf16 x with the fp32
     * weight, y and dy (the skinny kernels), in GB/s of the bytes it must move; s[4] 1: the
     * backward without dx (the weight gradient alone; dgrad's time is the difference) */
    {"matmul fp32 gate N8192 I4096 O8 bf16-in", MOE_OP_MATMUL, 0, {8192, 4096, 8, 1}},
    {"matmul fp32 gate N8192 I4096 O8 bf16-in", MOE_OP_MATMUL, 1, {8192, 4096, 8, 1}},
    {"matmul fp32 gate N8192 I4096 O8 bf16-in dw only", MOE_OP_MATMUL, 1, {8192, 4096, 8, 1, 1}},
    {"matmul fp32 gate N8192 I2048 O8 bf16-in", MOE_OP_MATMUL, 0, {8192, 2048, 8, 1}},
    {"matmul fp32 gate N8192 I2048 O8 bf16-in", MOE_OP_MATMUL, 1, {8192, 2048, 8, 1}},
    {"grouped bf16 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 14336, 2048}},
    {"grouped bf16 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 1, {8, 4096, 14336, 2048}},
    /* issue 12's comparison with torch._grouped_mm (bench/grouped_gpu.sh runs both): the two
     * presets' forward products, w1 and w3 as one gate-up product as torch's comparison fuses
     * them, then the down product; s[5] 1: the uneven counts of k_uneven */
    {"grouped bf16 E8 M16384 I4096 O28672", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 28672, 2048}},
    {"grouped bf16 E8 M16384 I4096 O28672 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 28672, 2048, 0, 1}},
    {"grouped bf16 E8 M16384 I14336 O4096", MOE_OP_GROUPED_MATMUL, 0, {8, 14336, 4096, 2048}},
    {"grouped bf16 E8 M16384 I14336 O4096 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 14336, 4096, 2048, 0, 1}},
    {"grouped bf16 E8 M32768 I2048 O8192", MOE_OP_GROUPED_MATMUL, 0, {8, 2048, 8192, 4096}},
    {"grouped bf16 E8 M32768 I2048 O8192 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 2048, 8192, 4096, 0, 1}},
    {"grouped bf16 E8 M32768 I4096 O2048", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 2048, 4096}},
    {"grouped bf16 E8 M32768 I4096 O2048 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 2048, 4096, 0, 1}},
    /* s[4] 1: fp8-block, the weight's e4m3 copies (the forward and dgrad one grouped kernel on
     * Hopper, wgrad per expert) */
    {"grouped fp8 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 0, {8, 4096, 14336, 2048, 1}},
    {"grouped fp8 E8 M16384 I4096 O14336", MOE_OP_GROUPED_MATMUL, 1, {8, 4096, 14336, 2048, 1}},
    /* uneven: 4 of the 8 experts end in a tile of at most 64 rows */
    {"grouped fp8 E8 M16384 I4096 O14336 uneven",
     MOE_OP_GROUPED_MATMUL,
     0,
     {8, 4096, 14336, 2048, 1, 1}},
    {"grouped fp8 E8 M16384 I4096 O14336 uneven",
     MOE_OP_GROUPED_MATMUL,
     1,
     {8, 4096, 14336, 2048, 1, 1}},
    /* s[6]: the experts' dxe = dh1 W1 + dh3 W3 from two fp8-block pairs (dx alone, 2 products'
     * FLOPs): 1 grouped_dgrad_sum into a bf16 dx (one launch), 2 the two grouped dgrads into an
     * fp32 dx, w3's adding to w1's (the model before grouped_dgrad_sum) */
    {"grouped fp8 E8 M16384 I4096 O14336 uneven dxe sum",
     MOE_OP_GROUPED_MATMUL,
     1,
     {8, 4096, 14336, 2048, 1, 1, 1}},
    {"grouped fp8 E8 M16384 I4096 O14336 uneven dxe twice",
     MOE_OP_GROUPED_MATMUL,
     1,
     {8, 4096, 14336, 2048, 1, 1, 2}},
    {"attn bf16 B2 H16 KV8 T8192 D128", MOE_OP_ATTENTION, 0, {2, 8192, 16, 8, 128}},
    {"attn bf16 B2 H16 KV8 T8192 D128", MOE_OP_ATTENTION, 1, {2, 8192, 16, 8, 128}},
    {"attn bf16 B4 H16 KV8 T2048 D64", MOE_OP_ATTENTION, 0, {4, 2048, 16, 8, 64}},
    {"attn bf16 B4 H16 KV8 T2048 D64", MOE_OP_ATTENTION, 1, {4, 2048, 16, 8, 64}},
    /* the other shapes of bench/attention_sdpa.py (issue 13's table) */
    {"attn bf16 B2 H32 KV8 T4096 D128", MOE_OP_ATTENTION, 0, {2, 4096, 32, 8, 128}},
    {"attn bf16 B2 H32 KV8 T4096 D128", MOE_OP_ATTENTION, 1, {2, 4096, 32, 8, 128}},
    {"attn bf16 B1 H16 KV8 T32768 D128", MOE_OP_ATTENTION, 0, {1, 32768, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T32768 D128", MOE_OP_ATTENTION, 1, {1, 32768, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T131072 D128", MOE_OP_ATTENTION, 0, {1, 131072, 16, 8, 128}},
    {"attn bf16 B1 H16 KV8 T131072 D128", MOE_OP_ATTENTION, 1, {1, 131072, 16, 8, 128}},
    /* document mask, documents of s[5] tokens: the work (and FLOPs) of 8 separate 1024s */
    {"attn bf16 B2 H16 KV8 T8192 D128 docs 1024", MOE_OP_ATTENTION, 0, {2, 8192, 16, 8, 128, 1024}},
    {"attn bf16 B2 H16 KV8 T8192 D128 docs 1024", MOE_OP_ATTENTION, 1, {2, 8192, 16, 8, 128, 1024}},
    {"rmsnorm N16384 C4096", MOE_OP_RMSNORM, 0, {16384, 4096}},
    {"rmsnorm N16384 C4096", MOE_OP_RMSNORM, 1, {16384, 4096}},
    {"swiglu n=16384*8192", MOE_OP_SWIGLU, 0, {16384LL * 8192}},
    {"swiglu n=16384*8192", MOE_OP_SWIGLU, 1, {16384LL * 8192}},
    /* s[1] E, s[2] K: fp8-block pairs of E even groups of s[0] / K rows (mixtral8x7b-2L's
     * experts): the forward's g pair with its transposed copy in tiles (x-tiles), the
     * backward's dh1 and dh3 pairs */
    {"swiglu pairs E8 M16384 K14336", MOE_OP_SWIGLU, 0, {16384LL * 14336, 8, 14336}},
    {"swiglu pairs E8 M16384 K14336", MOE_OP_SWIGLU, 1, {16384LL * 14336, 8, 14336}},
    {"rmsnorm N16384 C2048", MOE_OP_RMSNORM, 0, {16384, 2048}},
    {"rmsnorm N16384 C2048", MOE_OP_RMSNORM, 1, {16384, 2048}},
    {"xent N16384 V256", MOE_OP_CROSS_ENTROPY, 0, {16384, 256}},
    {"router N16384 E8 K2", MOE_OP_ROUTER, 0, {16384, 8, 2}},
    {"permute N16384 C4096 E8 K2", MOE_OP_PERMUTE, 0, {16384, 4096, 8, 2}},
    {"embedding bwd N16384 C4096 V256", MOE_OP_EMBEDDING, 1, {16384, 4096, 256}},
    {"adamw n=256M", MOE_OP_ADAMW, 0, {256LL << 20}},
    {"adamw n=256M bf16 moments", MOE_OP_ADAMW, 0, {256LL << 20, 1}}, /* s[1] 1: bf16 m, v */
    /* s[2] 1: bf16 gradient (optim.expert_grads bf16) */
    {"adamw n=256M bf16 moments bf16 grad", MOE_OP_ADAMW, 0, {256LL << 20, 1, 1}},
    /* s[3] 1: the split master (optim.master split): its two halves instead of param */
    {"adamw n=256M bf16 moments bf16 grad split", MOE_OP_ADAMW, 0, {256LL << 20, 1, 1, 1}},
    {"sum_squares n=256M", MOE_OP_SUM_SQUARES, 0, {256LL << 20}},
    {"sum_squares n=256M bf16", MOE_OP_SUM_SQUARES, 0, {256LL << 20, 1}}, /* s[1] 1: bf16 */
    /* the fp8-block weight copies of one mixtral w1 (both layouts), as after each AdamW */
    {"quantize_weight E8 O14336 I4096", MOE_OP_QUANTIZE, 0, {8, 14336, 4096}},
    /* s[3] 1: AdamW (bf16 moments and gradient) and those copies in one pass, adamw_quantize:
     * against "adamw ... bf16 grad" over the same n plus the case above */
    {"adamw_quantize E8 O14336 I4096 bf16 m v grad", MOE_OP_QUANTIZE, 0, {8, 14336, 4096, 1}},
};
enum { NPERF = sizeof k_perf / sizeof k_perf[0] };

/* The uneven expert counts of the grouped perf cases: expert e gets k_uneven[e] / 100 of the
 * M rows, rounded down to a multiple of 16, the last expert the rest (a spread like the
 * Dirichlet(2) draws of ../shared/anchors/anchors_turn2.py, fixed so that torch can be given
 * the same counts: the case prints them). */
static const int k_uneven[8] = {22, 6, 15, 9, 18, 3, 17, 10};

/* offsets [E + 1] of M = E * per rows: even, or uneven as k_uneven (E = 8) */
static void perf_offsets(int32_t *off, int64_t E, int64_t per, int uneven) {
    const int64_t M = E * per;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = (int32_t)(!uneven     ? (e + 1) * per
                               : e + 1 < E ? off[e] + M * k_uneven[e] / 100 / 16 * 16
                                           : M);
}

/* a device buffer of n random floats in [-scale, scale], or with nonneg in [0, scale] (a
 * 1M-value block repeated) */
static float *perf_buf_of(gctx *g, int64_t n, float scale, int nonneg) {
    const int64_t blk = 1 << 20;
    if (!g->perf_src) g->perf_src = frand(blk, -1, 1);
    float *src = xmalloc(F(blk));
    for (int64_t i = 0; i < blk; i++)
        src[i] = (nonneg ? fabsf(g->perf_src[i]) : g->perf_src[i]) * scale;
    float *d = g->gpu->alloc(g->gpu, F(n));
    if (!d) {
        fprintf(stderr, "perf: device allocation of %lld floats failed\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i += blk)
        g->gpu->memcpy_h2d(g->gpu, d + i, src, F(n - i < blk ? n - i : blk));
    free(src);
    g->bufs[g->nbufs].base = (unsigned char *)d, g->bufs[g->nbufs].bytes = F(n);
    g->bufs[g->nbufs].part = "";
    g->bufs[g->nbufs++].name = "perf";
    return d;
}

/* a device buffer of n random floats in [-1, 1] */
static float *perf_buf(gctx *g, int64_t n) {
    return perf_buf_of(g, n, 1.0f, 0);
}

/* AdamW's state for a perf case: m in [-0.1, 0.1] and v in [0, 0.01] (a negative v, or a
 * float's low half read as bf16, sends the IEEE square root and divisions down their slow
 * paths, which training never sees), as fp32 or, bf16, their bf16 values (returned as float
 * pointers, for the closure's buffers). */
static void perf_moments(gctx *g, int64_t n, int bf16, float **m, float **v) {
    *m = perf_buf_of(g, n, 0.1f, 0), *v = perf_buf_of(g, n, 0.01f, 1);
    if (!bf16) return;
    float *m16 = perf_buf(g, (n + 1) / 2), *v16 = perf_buf(g, (n + 1) / 2);
    g->gpu->cast_bf16(g->gpu, (uint16_t *)m16, *m, n);
    g->gpu->cast_bf16(g->gpu, (uint16_t *)v16, *v, n);
    *m = m16, *v = v16;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_perf(gctx *g, const pcase *pc) {
    const moe_backend *be = g->gpu;
    const int64_t *s = pc->s;
    double flops = 0.0, bytes = 0.0;
    g->nbufs = 0;
    /* the op under test, as a closure over the buffers below */
    float *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL, *f = NULL, *h = NULL, *k = NULL;
    int32_t *ia = NULL, *ib = NULL, *ic = NULL, *id = NULL, *off = NULL;
    const int32_t *ds = NULL; /* attention: doc_start [B, T] dev of documents of s[5] tokens */
    /* bf16 views and copies: the operands as the model passes them under the bf16 recipe */
    moe_cbuf w16 = moe_cbuf_of(NULL, MOE_DTYPE_BF16), a16 = w16, b16 = w16, c16 = w16;
    int64_t M = 0;
    moe_fp8_groups pairs = {0}; /* swiglu: the pairs' groups (s[1] experts) */
    moe_fp8_groups pg = {0};    /* grouped s[6]: dh1's and dh3's pairs dyp (s[0] groups) */
    moe_buf dyp[2] = {moe_buf_f32(NULL), moe_buf_f32(NULL)};
    switch (pc->op) {
    case MOE_OP_MATMUL:
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[2] * s[1]), c = perf_buf(g, s[0] * s[2]);
        if (pc->dir) d = perf_buf(g, s[0] * s[1]), e = perf_buf(g, s[2] * s[1]);
        w16.p = perf_buf(g, (s[2] * s[1] + 1) / 2); /* the bf16 copy the model passes */
        be->cast_bf16(be, (uint16_t *)w16.p, b, s[2] * s[1]);
        a16.p = perf_buf(g, (s[0] * s[1] + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, s[0] * s[1]);
        if (s[3]) { /* the gate: x bf16 read, y written; dx read and written, dy read by both
                       products, dw read and written */
            const double NI = (double)s[0] * s[1], NO = (double)s[0] * s[2];
            const double OI = (double)s[2] * s[1];
            bytes = !pc->dir ? 2 * NI + 4 * NO + 4 * OI
                    : s[4]   ? 2 * NI + 4 * NO + 8 * OI
                             : 10 * NI + 8 * NO + 8 * OI;
        } else {
            flops = (pc->dir ? 4.0 : 2.0) * (double)s[0] * s[1] * s[2];
        }
        break;
    case MOE_OP_GROUPED_MATMUL:
        if (s[5] && s[0] != (int64_t)(sizeof k_uneven / sizeof k_uneven[0])) {
            fprintf(stderr, "perf: uneven counts are defined for 8 experts\n");
            exit(1);
        }
        off = xmalloc(I32(s[0] + 1));
        perf_offsets(off, s[0], s[3], (int)s[5]);
        M = off[s[0]];
        a = perf_buf(g, M * s[1]), b = perf_buf(g, s[0] * s[2] * s[1]), c = perf_buf(g, M * s[2]);
        if (pc->dir) d = perf_buf(g, M * s[1]), e = perf_buf(g, s[0] * s[2] * s[1]);
        if (s[4]) { /* fp8-block: the weight's e4m3 copies (2 bytes a weight) and scales */
            float *sc = perf_buf(g, moe_fp8_weight_scales(s[0], s[2], s[1]));
            uint8_t *q = (uint8_t *)perf_buf(g, s[0] * s[2] * s[1] / 2);
            be->quantize_weight(be, q, sc, b, s[0], s[2], s[1], FP8B);
            w16 = moe_cbuf_e4m3(q, sc);
        } else {
            w16.p = perf_buf(g, (s[0] * s[2] * s[1] + 1) / 2);
            be->cast_bf16(be, (uint16_t *)w16.p, b, s[0] * s[2] * s[1]);
        }
        a16.p = perf_buf(g, (M * s[1] + 1) / 2); /* the bf16 expert activations */
        be->cast_bf16(be, (uint16_t *)a16.p, a, M * s[1]);
        if (pc->dir) { /* and the bf16 output gradient: c's values (not its floats' halves) */
            c16.p = perf_buf(g, (M * s[2] + 1) / 2);
            be->cast_bf16(be, (uint16_t *)c16.p, c, M * s[2]);
        }
        flops = (pc->dir ? 4.0 : 2.0) * (double)M * s[1] * s[2];
        if (s[6]) { /* dh1's and dh3's pairs of c's values; W3: w16 again */
            pg = (moe_fp8_groups){off, s[0], s[2], 0, 0};
            const size_t pb = moe_fp8_pair_bytes_max(M, s[0], s[2]);
            for (int j = 0; j < 2; j++) {
                dyp[j] = moe_buf_fp8_pair(perf_buf(g, (int64_t)(pb + 3) / 4));
                be->quantize_pair(be, dyp[j], c16, &pg);
            }
        }
        break;
    case MOE_OP_ATTENTION: {
        int64_t nq = s[0] * s[1] * s[2] * s[4], nk = s[0] * s[1] * s[3] * s[4];
        a = perf_buf(g, nq), b = perf_buf(g, nk), c = perf_buf(g, nk), d = perf_buf(g, nq);
        e = perf_buf(g, s[0] * s[2] * s[1]);
        a16.p = perf_buf(g, (nq + 1) / 2), b16.p = perf_buf(g, (nk + 1) / 2);
        c16.p = perf_buf(g, (nk + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, nq);
        be->cast_bf16(be, (uint16_t *)b16.p, b, nk);
        be->cast_bf16(be, (uint16_t *)c16.p, c, nk);
        /* causal FLOPs 2 B H T L D per pass (L = T, or the document length) */
        double L = (double)s[1];
        if (s[5]) {
            int32_t *hds = xmalloc(I32(s[0] * s[1]));
            for (int64_t i = 0; i < s[0] * s[1]; i++)
                hds[i] = (int32_t)(i % s[1] / s[5] * s[5]);
            ds = dup_dev(g, "doc_start", hds, I32(s[0] * s[1]));
            free(hds);
            L = (double)s[5];
        }
        if (pc->dir) {
            f = perf_buf(g, nq), h = perf_buf(g, nk), k = perf_buf(g, nk);
            be->attention_forward(be, moe_buf_of(d, MOE_DTYPE_BF16), e, a16, b16, c16, ds, s[0],
                                  s[1], s[1], s[2], s[3], s[4], BF16);
        }
        flops = 2.0 * (double)s[0] * s[2] * s[1] * L * s[4] * (pc->dir ? 2.5 : 1.0);
        break;
    }
    case MOE_OP_RMSNORM:
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[1]), c = perf_buf(g, s[0] * s[1]);
        d = perf_buf(g, s[0]), e = perf_buf(g, s[0] * s[1]);
        be->rmsnorm_forward(be, moe_buf_f32(c), d, moe_cbuf_f32(a), b, s[0], s[1], 1e-5f, BF16,
                            NULL);
        bytes = (pc->dir ? 4.0 : 2.0) * 4.0 * (double)s[0] * s[1];
        break;
    case MOE_OP_SWIGLU:
        a = perf_buf(g, s[0]), b = perf_buf(g, s[0]), c = perf_buf(g, s[0]);
        a16.p = perf_buf(g, (s[0] + 1) / 2), b16.p = perf_buf(g, (s[0] + 1) / 2);
        be->cast_bf16(be, (uint16_t *)a16.p, a, s[0]);
        be->cast_bf16(be, (uint16_t *)b16.p, b, s[0]);
        /* bf16 in and out, as the model runs it; the backward also reads the fp32 gradient
         * and writes bf16 da, db */
        bytes = (pc->dir ? 12.0 : 6.0) * (double)s[0];
        if (s[1]) { /* pairs: two e4m3 copies (2 bytes) in place of each bf16 output */
            off = xmalloc(I32(s[1] + 1));
            perf_offsets(off, s[1], s[0] / s[2] / s[1], 0);
            const size_t pb = moe_fp8_pair_bytes_max(off[s[1]], s[1], s[2]);
            c = perf_buf(g, (int64_t)pb / 4 + 1);
            if (pc->dir) b = perf_buf(g, (int64_t)pb / 4 + 1);
            pairs = (moe_fp8_groups){off, s[1], s[2], 0, !pc->dir};
        }
        break;
    case MOE_OP_CROSS_ENTROPY: {
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[0]), c = perf_buf(g, s[0]);
        int32_t *t = xmalloc(I32(s[0]));
        for (int64_t i = 0; i < s[0]; i++)
            t[i] = (int32_t)rng_int(s[1]);
        ia = dup_dev(g, "targets", t, I32(s[0]));
        free(t);
        bytes = 4.0 * (double)s[0] * s[1];
        break;
    }
    case MOE_OP_ROUTER: {
        float *z = router_logits(s[0], s[1]);
        a = dup_dev(g, "logits", z, F(s[0] * s[1]));
        free(z);
        b = perf_buf(g, s[0] * s[1]), c = perf_buf(g, s[0]), d = perf_buf(g, s[0] * s[2]);
        e = perf_buf(g, s[1] + 2);
        ia = (int32_t *)perf_buf(g, s[0] * s[2]), ib = (int32_t *)perf_buf(g, s[1]);
        bytes = 8.0 * (double)s[0] * s[1];
        break;
    }
    case MOE_OP_PERMUTE: {
        int32_t *ti = random_topk(s[0], s[2], s[3]);
        ia = dup_dev(g, "topk", ti, I32(s[0] * s[3]));
        free(ti);
        a = perf_buf(g, s[0] * s[1]), b = perf_buf(g, s[0] * s[3] * s[1]);
        ib = (int32_t *)perf_buf(g, s[0] * s[3]), ic = (int32_t *)perf_buf(g, s[0] * s[3]);
        id = (int32_t *)perf_buf(g, s[2] + 1);
        bytes = 2.0 * (double)s[0] * s[1] * (1 + s[3]); /* bf16 in and out */
        break;
    }
    case MOE_OP_EMBEDDING: {
        int32_t *t = xmalloc(I32(s[0]));
        for (int64_t i = 0; i < s[0]; i++)
            t[i] = (int32_t)rng_int(s[2]);
        ia = dup_dev(g, "tokens", t, I32(s[0]));
        free(t);
        a = perf_buf(g, s[2] * s[1]), b = perf_buf(g, s[0] * s[1]);
        bytes = 4.0 * (double)s[0] * s[1] * 3;
        break;
    }
    case MOE_OP_ADAMW:
        a = perf_buf(g, s[0]), b = perf_buf(g, s[0]);
        perf_moments(g, s[0], (int)s[1], &c, &d);
        e = perf_buf(g, (s[0] + 1) / 2);
        if (s[2]) { /* the gradient's bf16 values (not the fp32 buffer's bits read as bf16) */
            b16.p = perf_buf(g, (s[0] + 1) / 2);
            be->cast_bf16(be, (uint16_t *)b16.p, b, s[0]);
        }
        if (s[3]) { /* the halves of a split master: bf16 values and any low bits */
            be->cast_bf16(be, (uint16_t *)e, a, s[0]);
            f = perf_buf(g, (s[0] + 1) / 2);
        }
        /* read p, g, m, v; write p, m, v and the bf16 copy: 30 B, 22 B with bf16 moments, 2 B
         * less with a bf16 gradient, 2 B less with a split master (read 2 + 2, write 2 + 2) */
        bytes = ((s[1] ? 22.0 : 30.0) - (s[2] ? 2.0 : 0.0) - (s[3] ? 2.0 : 0.0)) * (double)s[0];
        break;
    case MOE_OP_SUM_SQUARES:
        a = perf_buf(g, s[0]);
        if (s[1]) {
            a16.p = perf_buf(g, (s[0] + 1) / 2);
            be->cast_bf16(be, (uint16_t *)a16.p, a, s[0]);
        }
        bytes = (s[1] ? 2.0 : 4.0) * (double)s[0];
        break;
    case MOE_OP_QUANTIZE: {
        const int64_t n = s[0] * s[1] * s[2];
        a = perf_buf(g, n), b = perf_buf(g, n / 2); /* w; q and qt: 2 n bytes */
        c = perf_buf(g, moe_fp8_weight_scales(s[0], s[1], s[2]));
        bytes = 6.0 * (double)n; /* read 4 bytes a weight, write 2 */
        if (s[3]) { /* bf16 gradient and moments; read p, g, m, v, write p, m, v, q and qt */
            float *gr = perf_buf(g, n);
            d = perf_buf(g, n / 2);
            be->cast_bf16(be, (uint16_t *)d, gr, n);
            perf_moments(g, n, 1, &e, &f);
            bytes = 20.0 * (double)n;
        }
        break;
    }
    default:
        return;
    }
    double times[7];
    int reps = 7, iters = 3;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (plans, scratch, module load) */
        moe_err err;
        moe_err_clear(&err);
        be->synchronize(be, &err);
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            switch (pc->op) {
            case MOE_OP_MATMUL:
                if (s[3] && pc->dir)
                    be->matmul_backward(be, s[4] ? NULL : d, e, moe_cbuf_f32(c), a16,
                                        moe_cbuf_f32(b), s[0], s[1], s[2], FP32, MOE_GRAD_ADD,
                                        MOE_GRAD_ADD);
                else if (s[3])
                    be->matmul_forward(be, moe_buf_f32(c), a16, moe_cbuf_f32(b), s[0], s[1], s[2],
                                       FP32);
                else if (pc->dir)
                    be->matmul_backward(be, d, e, moe_cbuf_f32(c), a16, w16, s[0], s[1], s[2], BF16,
                                        MOE_GRAD_ADD, MOE_GRAD_ADD);
                else
                    be->matmul_forward(be, moe_buf_of(c, MOE_DTYPE_BF16), a16, w16, s[0], s[1],
                                       s[2], BF16);
                break;
            case MOE_OP_GROUPED_MATMUL:
                if (s[6] == 1)
                    be->grouped_dgrad_sum(be, moe_buf_of(d, MOE_DTYPE_BF16), moe_cbuf_from(dyp[0]),
                                          w16, moe_cbuf_from(dyp[1]), w16, off, s[0], s[1], s[2],
                                          FP8B);
                else if (s[6] == 2)
                    for (int j = 0; j < 2; j++)
                        be->grouped_matmul_backward(be, moe_buf_f32(d), moe_buf_f32(NULL),
                                                    moe_cbuf_from(dyp[j]), a16, w16, off, s[0],
                                                    s[1], s[2], FP8B,
                                                    j ? MOE_GRAD_ADD : MOE_GRAD_SET, MOE_GRAD_SET);
                else if (pc->dir)
                    be->grouped_matmul_backward(be, moe_buf_f32(d), moe_buf_f32(e), c16, a16, w16,
                                                off, s[0], s[1], s[2], s[4] ? FP8B : BF16,
                                                MOE_GRAD_ADD, MOE_GRAD_ADD);
                else
                    be->grouped_matmul_forward(be, moe_buf_of(c, MOE_DTYPE_BF16), a16, w16, off,
                                               s[0], s[1], s[2], s[4] ? FP8B : BF16);
                break;
            case MOE_OP_ATTENTION:
                if (pc->dir)
                    be->attention_backward(be, f, h, k, a, a16, b16, c16,
                                           moe_cbuf_of(d, MOE_DTYPE_BF16), e, ds, s[0], s[1], s[2],
                                           s[3], s[4], BF16, MOE_GRAD_ADD);
                else
                    be->attention_forward(be, moe_buf_of(d, MOE_DTYPE_BF16), e, a16, b16, c16, ds,
                                          s[0], s[1], s[1], s[2], s[3], s[4], BF16);
                break;
            case MOE_OP_RMSNORM:
                if (pc->dir)
                    be->rmsnorm_backward(be, e, b, c, moe_cbuf_f32(a), b, d, s[0], s[1]);
                else
                    be->rmsnorm_forward(be, moe_buf_f32(c), d, moe_cbuf_f32(a), b, s[0], s[1],
                                        1e-5f, BF16, NULL);
                break;
            case MOE_OP_SWIGLU:
                if (pc->dir)
                    be->swiglu_backward(be,
                                        s[1] ? moe_buf_fp8_pair(c) : moe_buf_of(c, MOE_DTYPE_BF16),
                                        s[1] ? moe_buf_fp8_pair(b) : moe_buf_of(b, MOE_DTYPE_BF16),
                                        moe_cbuf_f32(a), a16, b16, s[0], s[1] ? &pairs : NULL);
                else
                    be->swiglu_forward(be,
                                       s[1] ? moe_buf_fp8_pair(c) : moe_buf_of(c, MOE_DTYPE_BF16),
                                       a16, b16, s[0], BF16, s[1] ? &pairs : NULL);
                break;
            case MOE_OP_CROSS_ENTROPY:
                be->cross_entropy_forward(be, b, c, a, ia, NULL, s[0], s[1]);
                break;
            case MOE_OP_ROUTER:
                be->router_forward(be, b, c, ia, d, ib, e, a, s[0], s[1], s[2]);
                break;
            case MOE_OP_PERMUTE:
                be->permute_forward(be, moe_buf_of(b, MOE_DTYPE_BF16), ib, ic, id,
                                    moe_cbuf_of(a, MOE_DTYPE_BF16), ia, s[0], s[1], s[2], s[3]);
                break;
            case MOE_OP_EMBEDDING:
                be->embedding_backward(be, a, b, ia, s[0], s[1], s[2]);
                break;
            case MOE_OP_ADAMW:
                be->adamw(be, s[3] ? NULL : a, (uint16_t *)e, s[3] ? (uint16_t *)f : NULL,
                          s[2] ? b16 : moe_cbuf_f32(b),
                          moe_buf_of(c, s[1] ? MOE_DTYPE_BF16 : MOE_DTYPE_F32),
                          moe_buf_of(d, s[1] ? MOE_DTYPE_BF16 : MOE_DTYPE_F32), s[0], 1e-9f, 0.9f,
                          0.95f, 1e-8f, 0.0f, 10, 1.0f);
                break;
            case MOE_OP_SUM_SQUARES:
                (void)be->sum_squares(be, s[1] ? a16 : moe_cbuf_f32(a), s[0]);
                break;
            case MOE_OP_QUANTIZE:
                if (s[3])
                    be->adamw_quantize(be, a, moe_cbuf_of(d, MOE_DTYPE_BF16),
                                       moe_buf_of(e, MOE_DTYPE_BF16), moe_buf_of(f, MOE_DTYPE_BF16),
                                       (uint8_t *)b, c, s[0], s[1], s[2], FP8B, 1e-9f, 0.9f, 0.95f,
                                       1e-8f, 0.0f, 10, 1.0f);
                else
                    be->quantize_weight(be, (uint8_t *)b, c, a, s[0], s[1], s[2], FP8B);
                break;
            default:
                break;
            }
        }
        if (be->synchronize(be, &err) != MOE_OK) {
            moe_err_print(&err, "test_backend_ops --perf", stderr);
            exit(1);
        }
        if (r >= 0) times[r] = (now_s() - t0) / iters;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    double med = times[reps / 2];
    if (flops > 0)
        printf("  %-44s %-3s %9.3f ms  %8.1f TFLOP/s\n", pc->name, pc->dir ? "bwd" : "fwd",
               med * 1e3, flops / med * 1e-12);
    else
        printf("  %-44s %-3s %9.3f ms  %8.1f GB/s\n", pc->name, pc->dir ? "bwd" : "fwd", med * 1e3,
               bytes / med * 1e-9);
    if (pc->op == MOE_OP_GROUPED_MATMUL) { /* the counts, for a peer given the same ones */
        printf("    counts");
        for (int64_t x = 0; x < s[0]; x++)
            printf("%c%d", x ? ',' : ' ', off[x + 1] - off[x]);
        printf("\n");
    }
    fflush(stdout);
    for (int i = 0; i < g->nbufs; i++)
        be->free(be, g->bufs[i].base);
    g->nbufs = 0;
    free(off);
}

/* How many perf cases' names contain only (all of them when only is NULL). */
int perf_cases_matching(const char *only) {
    int n = 0;
    for (int i = 0; i < NPERF; i++)
        n += !only || strstr(k_perf[i].name, only) != NULL;
    return n;
}

/* Times every perf case whose name contains only (all of them when only is NULL), in table
 * order. */
void run_perf_cases(gctx *g, const char *only) {
    for (int i = 0; i < NPERF; i++)
        if (!only || strstr(k_perf[i].name, only)) run_perf(g, &k_perf[i]);
}
