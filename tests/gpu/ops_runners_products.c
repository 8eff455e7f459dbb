/* ops_runners_products: the runners of gpu.backend_ops (test_backend_ops.c) for the matrix
 * products (matmul, grouped expert products), the expert path around them (router, permute
 * and unpermute, SwiGLU) and the optimizer (AdamW with its bf16 copy and cast_bf16, AdamW then
 * the fp8-block copies, the sum of squares). Each runner takes a case of the table (its sizes
 * in tc->s), runs forward and backward on both backends from the same random inputs and
 * compares every output (ops_harness.h); router_logits and random_topk also feed --perf. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "ops_harness.h"
#include "testlib.h"

/* Under mxfp8, x [R, I], w [E, O, I] and dy [R, O] of a product spread over 2^+-16: x[r, i] *=
 * a_r b_i, w[e, o, i] /= b_i c_o, dy[r, o] *= c_o / a_r, powers of two a per row, b per input
 * and c per output in [2^-8, 2^8]. Each product then sums terms of one size along its
 * reduction while a block of an operand spans up to 2^16 (values 2^14 below a block's largest
 * round to e4m3 subnormals or zero), so a product quantizing along the wrong dimension, or in
 * blocks that cross an expert's first row, changes its sums visibly. Uniform values would give
 * almost every block of 32 one power-of-two scale, and e4m3 rounds a normal value the same
 * under any of them: quantized in any blocks, or not at all, they would give the same values. */
static void mx_spread(const tcase *tc, float *x, float *w, float *dy, int64_t R, int64_t E,
                      int64_t I, int64_t O) {
    if (moe_recipe_format(tc->prec) != MOE_RECIPE_MXFP8) return;
    float *a = xmalloc(F(R + I + O)), *b = a + R, *c = b + I;
    for (int64_t j = 0; j < R + I + O; j++)
        a[j] = ldexpf(1.0f, (int)rng_int(17) - 8);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < I; i++)
            x[r * I + i] *= a[r] * b[i];
        for (int64_t o = 0; o < O; o++)
            dy[r * O + o] *= c[o] / a[r];
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < I; i++)
                w[(e * O + o) * I + i] /= b[i] * c[o];
    free(a);
}

void run_matmul(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], I = tc->s[1], O = tc->s[2];
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc));
    float *x = frand(N * I, -1, 1), *w = frand(O * I, -1, 1), *gy = frand(N * O, -1, 1);
    float *y = xmalloc(F(N * O));
    mx_spread(tc, x, w, gy, N, 1, I, O);
    as_stored(x, N * I, xdt);
    /* dy fp32, or bf16 (DY_BF16: q's and k's, rotated by RoPE's backward, under bf16) */
    const moe_dtype gdt = role_dt(tc, ROLE_DY, MOE_DTYPE_F32);
    as_stored(gy, N * O, gdt);
    moe_cbuf cw = cpu_weight(g, tc, w, 1, O, I);
    g->cpu->matmul_forward(g->cpu, moe_buf_f32(y), moe_cbuf_f32(x), cw, N, I, O, tc->prec);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * I));
    float *dw_ = dup_dev(g, "w", w, F(O * I));
    moe_buf dy_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "y", NULL, N * O);
    moe_cbuf gw_ = gpu_weight(g, tc, dw_, 1, O, I);
    g->gpu->matmul_forward(g->gpu, dy_, dx_, gw_, N, I, O, tc->prec);
    check_sync_guards(g, "matmul_forward");
    cmp_typed(g, "y", dy_, y, N * O, tc->tol);
    float *gx = frand(N * I, -1, 1), *gw = frand(O * I, -1, 1);
    moe_cbuf dgy = moe_cbuf_from(dev_operand(g, gdt, "dy", gy, N * O));
    float *dgx = dup_dev(g, "dx", gx, F(N * I));
    float *dgw = dup_dev(g, "dw", gw, F(O * I));
    float *gx0 = fdup(gx, N * I), *gw0 = fdup(gw, O * I);
    g->cpu->matmul_backward(g->cpu, gx, gw, moe_cbuf_f32(gy), moe_cbuf_f32(x), cw, N, I, O,
                            tc->prec, MOE_GRAD_ADD, MOE_GRAD_ADD);
    check_changed(g, "dx", gx, gx0, N * I, 0.9);
    check_changed(g, "dw", gw, gw0, O * I, 0.9);
    free(gx0), free(gw0);
    g->gpu->matmul_backward(g->gpu, dgx, dgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_ADD,
                            MOE_GRAD_ADD);
    check_sync_guards(g, "matmul_backward");
    cmp_f32(g, "dx", dgx, gx, N * I, tc->tol);
    cmp_f32(g, "dw", dgw, gw, O * I, tc->tol);
    /* dx NULL (first layer): only dw accumulates again */
    g->cpu->matmul_backward(g->cpu, NULL, gw, moe_cbuf_f32(gy), moe_cbuf_f32(x), cw, N, I, O,
                            tc->prec, MOE_GRAD_ADD, MOE_GRAD_ADD);
    g->gpu->matmul_backward(g->gpu, NULL, dgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_ADD,
                            MOE_GRAD_ADD);
    check_sync_guards(g, "matmul_backward dx=NULL");
    cmp_f32(g, "dw (dx NULL)", dgw, gw, O * I, tc->tol);
    /* written gradients (MOE_GRAD_SET): into NaN-poisoned buffers, which must not be read */
    g->cpu->matmul_backward(g->cpu, gx, gw, moe_cbuf_f32(gy), moe_cbuf_f32(x), cw, N, I, O,
                            tc->prec, MOE_GRAD_SET, MOE_GRAD_SET);
    float *sgx = dup_dev(g, "dx (SET)", NULL, F(N * I)),
          *sgw = dup_dev(g, "dw (SET)", NULL, F(O * I));
    g->gpu->matmul_backward(g->gpu, sgx, sgw, dgy, dx_, gw_, N, I, O, tc->prec, MOE_GRAD_SET,
                            MOE_GRAD_SET);
    check_sync_guards(g, "matmul_backward SET");
    cmp_f32(g, "dx (SET)", sgx, gx, N * I, tc->tol);
    cmp_f32(g, "dw (SET)", sgw, gw, O * I, tc->tol);
    free(x), free(w), free(y), free(gy), free(gx), free(gw);
    gc_weight_free(cw);
}

/* router logits with well-separated values per row, so no near-ties make top-k ambiguous */
float *router_logits(int64_t N, int64_t E) {
    float *z = xmalloc(F(N * E));
    int64_t *perm = xmalloc((size_t)E * sizeof(int64_t));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t e = 0; e < E; e++)
            perm[e] = e;
        for (int64_t e = E - 1; e > 0; e--) {
            int64_t j = rng_int(e + 1), t = perm[e];
            perm[e] = perm[j], perm[j] = t;
        }
        for (int64_t e = 0; e < E; e++)
            z[n * E + e] = 4.0f * (float)perm[e] / (float)E - 2.0f + rng_uniform(-0.01f, 0.01f);
    }
    free(perm);
    return z;
}

void run_router(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], E = tc->s[1], K = tc->s[2];
    float *z = router_logits(N, E);
    float *p = xmalloc(F(N * E)), *lse = xmalloc(F(N)), *tw = xmalloc(F(N * K));
    float *st = xmalloc(F(E + 2));
    int32_t *ti = xmalloc(I32(N * K)), *cnt = xmalloc(I32(E));
    g->cpu->router_forward(g->cpu, p, lse, ti, tw, cnt, st, z, N, E, K);
    float *dz_ = dup_dev(g, "logits", z, F(N * E)), *dp = dup_dev(g, "probs", NULL, F(N * E));
    float *dl = dup_dev(g, "lse", NULL, F(N)), *dtw = dup_dev(g, "topk_w", NULL, F(N * K));
    float *dst = dup_dev(g, "stats", NULL, F(E + 2));
    int32_t *dti = dup_dev(g, "topk_idx", NULL, I32(N * K)),
            *dcnt = dup_dev(g, "counts", NULL, I32(E));
    g->gpu->router_forward(g->gpu, dp, dl, dti, dtw, dcnt, dst, dz_, N, E, K);
    check_sync_guards(g, "router_forward");
    cmp_f32(g, "probs", dp, p, N * E, tc->tol);
    cmp_f32(g, "lse", dl, lse, N, tc->tol);
    cmp_i32(g, "topk_idx", dti, ti, N * K);
    cmp_f32(g, "topk_w", dtw, tw, N * K, tc->tol);
    cmp_i32(g, "counts", dcnt, cnt, E);
    cmp_f32(g, "stats", dst, st, E + 2, tc->tol);
    float *gtw = frand(N * K, -1, 1), *gprob = frand(E, -0.1f, 0.1f), *gz = frand(N * E, -1, 1);
    float dzc = 0.3f;
    float *dgtw = dup_dev(g, "dtopk_w", gtw, F(N * K)), *dgp = dup_dev(g, "dprob", gprob, F(E));
    float *dgz = dup_dev(g, "dlogits", gz, F(N * E));
    float *dpr = dup_dev(g, "probs_ref", p, F(N * E)), *dlr = dup_dev(g, "lse_ref", lse, F(N));
    float *dtwr = dup_dev(g, "topk_w_ref", tw, F(N * K));
    int32_t *dtir = dup_dev(g, "topk_idx_ref", ti, I32(N * K));
    g->cpu->router_backward(g->cpu, gz, gtw, gprob, dzc, p, lse, ti, tw, N, E, K);
    g->gpu->router_backward(g->gpu, dgz, dgtw, dgp, dzc, dpr, dlr, dtir, dtwr, N, E, K);
    check_sync_guards(g, "router_backward");
    cmp_f32(g, "dlogits", dgz, gz, N * E, tc->tol);
    /* dprob NULL */
    g->cpu->router_backward(g->cpu, gz, gtw, NULL, dzc, p, lse, ti, tw, N, E, K);
    g->gpu->router_backward(g->gpu, dgz, dgtw, NULL, dzc, dpr, dlr, dtir, dtwr, N, E, K);
    check_sync_guards(g, "router_backward dprob=NULL");
    cmp_f32(g, "dlogits (dprob 0)", dgz, gz, N * E, tc->tol);
    free(z), free(p), free(lse), free(tw), free(st), free(ti), free(cnt), free(gtw), free(gprob);
    free(gz);
}

/* topk_idx with K distinct experts per token */
int32_t *random_topk(int64_t N, int64_t E, int64_t K) {
    int32_t *ti = xmalloc(I32(N * K));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)rng_int(E);
                dup = 0;
                for (int64_t j = 0; j < k; j++)
                    dup |= ti[n * K + j] == e;
            } while (dup);
            ti[n * K + k] = e;
        }
    return ti;
}

void run_permute(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1], E = tc->s[2], K = tc->s[3], M = N * K;
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc));
    int32_t *ti = random_topk(N, E, K);
    float *x = frand(N * C, -1, 1), *xp = xmalloc(F(M * C));
    as_stored(x, N * C, xdt);
    int32_t *rs = xmalloc(I32(M)), *sr = xmalloc(I32(M)), *off = xmalloc(I32(E + 1));
    g->cpu->permute_forward(g->cpu, moe_buf_f32(xp), rs, sr, off, moe_cbuf_f32(x), ti, N, C, E, K);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * C));
    moe_buf dxp = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "xp", NULL, M * C);
    int32_t *dti = dup_dev(g, "topk_idx", ti, I32(M)), *drs = dup_dev(g, "row_src", NULL, I32(M));
    int32_t *dsr = dup_dev(g, "slot_row", NULL, I32(M)),
            *doff = dup_dev(g, "offsets", NULL, I32(E + 1));
    g->gpu->permute_forward(g->gpu, dxp, drs, dsr, doff, dx_, dti, N, C, E, K);
    check_sync_guards(g, "permute_forward");
    cmp_typed(g, "xp", dxp, xp, M * C, tc->tol);
    if (dxp.mx) { /* rows of the same bf16 values, encoded by one rule: the CPU's very bytes */
        uint8_t *q = mx_encode(xp, M * C);
        int same = same_bytes(g, "xp e4m3 values", dxp.p, q, (size_t)(M * C));
        same &= same_bytes(g, "xp scales", dxp.mx, q + M * C, (size_t)(M * C / 32));
        printf("  %-28s %-16s n=%-9lld values and scales %s %s\n", g->label, "xp bytes",
               (long long)(M * C), same ? "identical" : "DIFFER", same ? "ok" : "FAIL");
        free(q);
    }
    cmp_i32(g, "row_src", drs, rs, M);
    cmp_i32(g, "slot_row", dsr, sr, M);
    cmp_i32(g, "offsets", doff, off, E + 1);
    /* dxp of the activations' type (bf16 where the experts' dgrad writes it so) */
    float *gxp = frand(M * C, -1, 1), *gx = frand(N * C, -1, 1);
    as_stored(gxp, M * C, typed_dt(tc));
    moe_cbuf dgxp = moe_cbuf_from(dev_operand(g, typed_dt(tc), "dxp", gxp, M * C));
    float *dgx = dup_dev(g, "dx", gx, F(N * C));
    int32_t *dsrr = dup_dev(g, "slot_row_ref", sr, I32(M));
    g->cpu->permute_backward(g->cpu, gx, moe_cbuf_f32(gxp), sr, N, C, K, MOE_GRAD_ADD);
    g->gpu->permute_backward(g->gpu, dgx, dgxp, dsrr, N, C, K, MOE_GRAD_ADD);
    check_sync_guards(g, "permute_backward");
    cmp_f32(g, "dx", dgx, gx, N * C, tc->tol);
    float *sgx = dup_dev(g, "dx (SET)", NULL, F(N * C)); /* written: poisoned, never read */
    g->cpu->permute_backward(g->cpu, gx, moe_cbuf_f32(gxp), sr, N, C, K, MOE_GRAD_SET);
    g->gpu->permute_backward(g->gpu, sgx, dgxp, dsrr, N, C, K, MOE_GRAD_SET);
    check_sync_guards(g, "permute_backward SET");
    cmp_f32(g, "dx (SET)", sgx, gx, N * C, tc->tol);
    /* unpermute with the same routing: alone, and with the residual add (x_out = x_mid + y,
     * x_mid and x_out of the model's residual type: bf16 under mxfp8, else fp32) */
    float *tw = frand(N * K, 0, 1), *yp = frand(M * C, -1, 1), *y = xmalloc(F(N * C));
    as_stored(yp, M * C, typed_dt(tc));
    g->cpu->unpermute_forward(g->cpu, moe_buf_f32(y), moe_cbuf_f32(NULL), moe_cbuf_f32(yp), tw, sr,
                              N, C, K);
    float *dtw = dup_dev(g, "topk_w", tw, F(N * K));
    moe_cbuf dyp = moe_cbuf_from(dev_operand(g, typed_dt(tc), "yp", yp, M * C));
    float *dy = dup_dev(g, "y", NULL, F(N * C));
    g->gpu->unpermute_forward(g->gpu, moe_buf_f32(dy), moe_cbuf_f32(NULL), dyp, dtw, dsrr, N, C, K);
    check_sync_guards(g, "unpermute_forward");
    cmp_f32(g, "unpermute y", dy, y, N * C, tc->tol);
    const moe_dtype rdt =
        moe_recipe_format(tc->prec) == MOE_RECIPE_MXFP8 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    float *res = frand(N * C, -4, 4), *yr = xmalloc(F(N * C));
    as_stored(res, N * C, rdt);
    g->cpu->unpermute_forward(g->cpu, moe_buf_f32(yr), moe_cbuf_f32(res), moe_cbuf_f32(yp), tw, sr,
                              N, C, K);
    moe_buf dres = dev_operand(g, rdt, "x_mid", res, N * C);
    moe_buf dyr = dev_operand(g, rdt, "x_out", NULL, N * C);
    g->gpu->unpermute_forward(g->gpu, dyr, moe_cbuf_from(dres), dyp, dtw, dsrr, N, C, K);
    check_sync_guards(g, "unpermute_forward + residual");
    /* a bf16 x_out may round the other way at a boundary (the GPU's sums fuse the multiply-
     * adds the CPU's round twice: nmse 1.5e-11 seen on an H100) */
    cmp_typed(g, "unpermute x_out", dyr, yr, N * C, tol_stored(tc, dyr.dt));
    free(res), free(yr);
    float *gy = frand(N * C, -1, 1), *gyp = frand(M * C, -1, 1), *gtw = frand(N * K, -1, 1);
    as_stored(gyp, M * C, typed_dt(tc));
    float *dgy = dup_dev(g, "dy", gy, F(N * C));
    moe_buf dgyp = dev_operand(g, typed_dt(tc), "dyp", gyp, M * C);
    float *dgtw = dup_dev(g, "dtopk_w", gtw, F(N * K));
    g->cpu->unpermute_backward(g->cpu, moe_buf_f32(gyp), gtw, gy, moe_cbuf_f32(yp), tw, sr, N, C, K,
                               MOE_GRAD_ADD);
    g->gpu->unpermute_backward(g->gpu, dgyp, dgtw, dgy, dyp, dtw, dsrr, N, C, K, MOE_GRAD_ADD);
    check_sync_guards(g, "unpermute_backward");
    cmp_typed(g, "unpermute dyp", dgyp, gyp, M * C, tol_stored(tc, dgyp.dt));
    cmp_f32(g, "unpermute dtopk_w", dgtw, gtw, N * K, tc->tol);
    moe_buf sgyp = dev_operand(g, typed_dt(tc), "dyp (SET)", NULL, M * C); /* written: poisoned */
    float *sgtw = dup_dev(g, "dtopk_w (SET)", NULL, F(N * K));
    g->cpu->unpermute_backward(g->cpu, moe_buf_f32(gyp), gtw, gy, moe_cbuf_f32(yp), tw, sr, N, C, K,
                               MOE_GRAD_SET);
    g->gpu->unpermute_backward(g->gpu, sgyp, sgtw, dgy, dyp, dtw, dsrr, N, C, K, MOE_GRAD_SET);
    check_sync_guards(g, "unpermute_backward SET");
    cmp_typed(g, "unpermute dyp (SET)", sgyp, gyp, M * C, tol_stored(tc, sgyp.dt));
    cmp_f32(g, "unpermute dtopk_w (SET)", sgtw, gtw, N * K, tc->tol);
    /* in place, as the model runs it: dyp over yp */
    moe_buf iyp = dev_operand(g, typed_dt(tc), "yp (in place)", yp, M * C);
    g->gpu->unpermute_backward(g->gpu, iyp, sgtw, dgy, moe_cbuf_from(iyp), dtw, dsrr, N, C, K,
                               MOE_GRAD_SET);
    check_sync_guards(g, "unpermute_backward in place");
    cmp_typed(g, "unpermute dyp (in place)", iyp, gyp, M * C, tol_stored(tc, iyp.dt));
    cmp_f32(g, "unpermute dtopk_w (in place)", sgtw, gtw, N * K, tc->tol);
    free(ti), free(x), free(xp), free(rs), free(sr), free(off), free(gxp), free(gx), free(tw);
    free(yp), free(y), free(gy), free(gyp), free(gtw);
}

/* Host copy of x [n] in type dt (F32, or the BF16 codes of values the caller rounded). */
static void *host_typed(const float *x, int64_t n, moe_dtype dt) {
    void *h = xmalloc((size_t)n * moe_dtype_size(dt));
    if (dt == MOE_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)h)[i] = moe_f32_to_bf16(x[i]);
    else
        memcpy(h, x, F(n));
    return h;
}

void run_grouped(gctx *g, const tcase *tc) {
    int64_t E = tc->s[0], I = tc->s[1], O = tc->s[2], avg = tc->s[3];
    int32_t *off = xmalloc(I32(E + 1));
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) /* expert 1 gets no rows: its weight grad stays as is */
        off[e + 1] = off[e] + (e == 1 ? 0 : (int32_t)(avg / 2 + rng_int(avg + 1)));
    int64_t M = off[E];
    /* under mxfp8 x is MXFP8 (xe, g), y MXFP8 (h1, h3) or bf16 (ye), dy MXFP8 (dh1, dh3) or
     * bf16 (dye), a written dx bf16 (dg) or fp32 (dxe); the accumulated dx stays fp32 */
    const moe_dtype xdt = role_dt(tc, ROLE_X, typed_dt(tc)),
                    dydt = role_dt(tc, ROLE_DY, typed_dt(tc));
    const moe_dtype dxdt = role_dt(tc, ROLE_DX, MOE_DTYPE_F32);
    const moe_dtype dwdt = tc->types & GW_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    const size_t dws = moe_dtype_size(dwdt);
    float *x = frand(M * I, -1, 1), *w = frand(E * O * I, -1, 1), *gy = frand(M * O, -1, 1);
    float *y = xmalloc(F(M * O));
    mx_spread(tc, x, w, gy, M, E, I, O);
    as_stored(x, M * I, xdt);
    moe_cbuf cw = cpu_weight(g, tc, w, E, O, I);
    g->cpu->grouped_matmul_forward(g->cpu, moe_buf_f32(y), moe_cbuf_f32(x), cw, off, E, I, O,
                                   tc->prec);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, M * I));
    float *dw_ = dup_dev(g, "w", w, F(E * O * I));
    moe_buf dy_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "y", NULL, M * O);
    moe_cbuf gw_ = gpu_weight(g, tc, dw_, E, O, I);
    g->gpu->grouped_matmul_forward(g->gpu, dy_, dx_, gw_, off, E, I, O, tc->prec);
    check_sync_guards(g, "grouped_matmul_forward");
    cmp_typed(g, "y", dy_, y, M * O, tc->tol);
    /* the CPU adds in fp32 into dw's stored values (bf16-rounded under GW_BF16), and
     * cmp_typed rounds its result as the GPU's bf16 dw stores it */
    float *gx = frand(M * I, -1, 1), *gw = frand(E * O * I, -1, 1);
    as_stored(gy, M * O, dydt);
    as_stored(gw, E * O * I, dwdt);
    moe_cbuf dgy = moe_cbuf_from(dev_operand(g, dydt, "dy", gy, M * O));
    float *dgx = dup_dev(g, "dx", gx, F(M * I));
    moe_buf dgw = dev_operand(g, dwdt, "dw", gw, E * O * I);
    float *gx0 = fdup(gx, M * I), *gw0 = fdup(gw, E * O * I);
    g->cpu->grouped_matmul_backward(g->cpu, moe_buf_f32(gx), moe_buf_f32(gw), moe_cbuf_f32(gy),
                                    moe_cbuf_f32(x), cw, off, E, I, O, tc->prec, MOE_GRAD_ADD,
                                    MOE_GRAD_ADD);
    g->gpu->grouped_matmul_backward(g->gpu, moe_buf_f32(dgx), dgw, dgy, dx_, gw_, off, E, I, O,
                                    tc->prec, MOE_GRAD_ADD, MOE_GRAD_ADD);
    check_sync_guards(g, "grouped_matmul_backward");
    check_changed(g, "dx", gx, gx0, M * I, 0.9);
    /* expert 1 has no rows: its weight gradient must stay exactly as it was */
    check_changed(g, "dw", gw, gw0, E * O * I, 0.9 * (double)(E - 1) / (double)E);
    void *gw1 = down(g, (char *)dgw.p + (size_t)(O * I) * dws, (size_t)(O * I) * dws);
    void *gw1_0 = host_typed(gw0 + O * I, O * I, dwdt);
    CHECK_MSG(memcmp(gw1, gw1_0, (size_t)(O * I) * dws) == 0,
              "%s: the weight gradient of an expert with no rows changed", g->label);
    free(gw1), free(gw1_0), free(gx0), free(gw0);
    cmp_f32(g, "dx", dgx, gx, M * I, tc->tol);
    cmp_typed(g, "dw", dgw, gw, E * O * I, tol_stored(tc, dwdt));
    /* written gradients (MOE_GRAD_SET) into poisoned buffers: expert 1's dw becomes zeros */
    g->cpu->grouped_matmul_backward(g->cpu, moe_buf_f32(gx), moe_buf_f32(gw), moe_cbuf_f32(gy),
                                    moe_cbuf_f32(x), cw, off, E, I, O, tc->prec, MOE_GRAD_SET,
                                    MOE_GRAD_SET);
    moe_buf sgx = dev_operand(g, dxdt, "dx (SET)", NULL, M * I);
    moe_buf sgw = dev_operand(g, dwdt, "dw (SET)", NULL, E * O * I);
    g->gpu->grouped_matmul_backward(g->gpu, sgx, sgw, dgy, dx_, gw_, off, E, I, O, tc->prec,
                                    MOE_GRAD_SET, MOE_GRAD_SET);
    check_sync_guards(g, "grouped_matmul_backward SET");
    unsigned char *sw1 = down(g, (char *)sgw.p + (size_t)(O * I) * dws, (size_t)(O * I) * dws);
    int zeros = 1; /* +0.0 in either type: zero bytes */
    for (size_t i = 0; i < (size_t)(O * I) * dws; i++)
        zeros &= sw1[i] == 0;
    CHECK_MSG(zeros, "%s: SET left the weight gradient of an expert with no rows unzeroed",
              g->label);
    free(sw1);
    cmp_typed(g, "dx (SET)", sgx, gx, M * I, tol_stored(tc, dxdt));
    cmp_typed(g, "dw (SET)", sgw, gw, E * O * I, tol_stored(tc, dwdt));
    /* the model's w2 backward: the weight gradient alone (dx NULL), then dx alone (dw NULL) */
    moe_buf ogx = dev_operand(g, dxdt, "dx (dx only)", NULL, M * I);
    moe_buf ogw = dev_operand(g, dwdt, "dw (dw only)", NULL, E * O * I);
    g->gpu->grouped_matmul_backward(g->gpu, moe_buf_f32(NULL), ogw, dgy, dx_, gw_, off, E, I, O,
                                    tc->prec, MOE_GRAD_SET, MOE_GRAD_SET);
    g->gpu->grouped_matmul_backward(g->gpu, ogx, moe_buf_f32(NULL), dgy, dx_, gw_, off, E, I, O,
                                    tc->prec, MOE_GRAD_SET, MOE_GRAD_SET);
    check_sync_guards(g, "grouped_matmul_backward dw only, dx only");
    cmp_typed(g, "dx (dx only)", ogx, gx, M * I, tol_stored(tc, dxdt));
    cmp_typed(g, "dw (dw only)", ogw, gw, E * O * I, tol_stored(tc, dwdt));
    free(off), free(x), free(w), free(y), free(gy), free(gx), free(gw);
    gc_weight_free(cw);
}

void run_swiglu(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    /* a, b and out: h1, h3 and g (MXFP8 under mxfp8); dout: dg (fp32, or bf16 under mxfp8);
     * da, db: dh1, dh3 (of h1's type where the model writes them over h1 and h3) */
    const moe_dtype adt = role_dt(tc, ROLE_X, typed_dt(tc)),
                    gdt = role_dt(tc, ROLE_DY, MOE_DTYPE_F32);
    const moe_dtype ddt = role_dt(tc, ROLE_DX, typed_dt(tc));
    const moe_recipe p16 = moe_recipe_unquantized(tc->prec); /* SwiGLU's, as the model says */
    float *a = frand(n, -4, 4), *b = frand(n, -2, 2), *o = xmalloc(F(n));
    as_stored(a, n, adt), as_stored(b, n, adt);
    g->cpu->swiglu_forward(g->cpu, moe_buf_f32(o), moe_cbuf_f32(a), moe_cbuf_f32(b), n, p16, NULL);
    moe_cbuf da_ = moe_cbuf_from(dev_operand(g, adt, "a", a, n));
    moe_cbuf db_ = moe_cbuf_from(dev_operand(g, adt, "b", b, n));
    moe_buf do_ = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "out", NULL, n);
    g->gpu->swiglu_forward(g->gpu, do_, da_, db_, n, p16, NULL);
    check_sync_guards(g, "swiglu_forward");
    cmp_typed(g, "out", do_, o, n, tc->tol);
    float *gy = frand(n, -1, 1), *ga = xmalloc(F(n)), *gb = xmalloc(F(n));
    as_stored(gy, n, gdt);
    moe_cbuf dgy = moe_cbuf_from(dev_operand(g, gdt, "dout", gy, n));
    /* written, not accumulated: poisoned */
    moe_buf dga = dev_operand(g, ddt, "da", NULL, n), dgb = dev_operand(g, ddt, "db", NULL, n);
    g->cpu->swiglu_backward(g->cpu, moe_buf_f32(ga), moe_buf_f32(gb), moe_cbuf_f32(gy),
                            moe_cbuf_f32(a), moe_cbuf_f32(b), n, NULL);
    g->gpu->swiglu_backward(g->gpu, dga, dgb, dgy, da_, db_, n, NULL);
    check_sync_guards(g, "swiglu_backward");
    cmp_typed(g, "da", dga, ga, n, tol_stored(tc, ddt));
    cmp_typed(g, "db", dgb, gb, n, tol_stored(tc, ddt));
    /* in place, as the model runs it: da over a, db over b */
    moe_buf ia = dev_operand(g, adt, "a (in place)", a, n),
            ib = dev_operand(g, adt, "b (in place)", b, n);
    g->gpu->swiglu_backward(g->gpu, ia, ib, dgy, moe_cbuf_from(ia), moe_cbuf_from(ib), n, NULL);
    check_sync_guards(g, "swiglu_backward in place");
    cmp_typed(g, "da (in place)", ia, ga, n, tol_stored(tc, adt));
    cmp_typed(g, "db (in place)", ib, gb, n, tol_stored(tc, adt));
    free(a), free(b), free(o), free(gy), free(ga), free(gb);
}

/* AdamW with its bf16 copy, three steps over different ranges so that every path of the
 * kernel runs: the whole array (16-byte vectors and a scalar tail), [1, n) (a scalar head
 * first), and the moments shifted by one element against the weights (no vectors at all);
 * then cast_bf16. The copy must be exactly the rounded new weight. Typed cases: bf16 moments
 * (optim.moments bf16), for which the GPU must compute the CPU's bytes: weights, copies and
 * both moments identical after every step (fp32 moments: within tol, the GPU fusing
 * multiply-adds). MASTER_SPLIT: the master is the bf16 copy and a low half (optim.master
 * split; 8-byte vectors of each), the copy its split's high half (ties away from zero), and
 * with bf16 moments both halves the CPU's bytes. */
void run_adamw(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    int split = (tc->types & MASTER_SPLIT) != 0;
    moe_dtype mdt = typed_dt(tc), gdt = tc->types & GW_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    size_t mbytes = (size_t)n * moe_dtype_size(mdt), hbytes = (size_t)n * sizeof(uint16_t);
    float *p = frand(n, -1, 1), *gr = frand(n, -1, 1), *m0 = frand(n, -0.1f, 0.1f);
    float *v0 = frand(n, 0, 0.01f);
    as_stored(m0, n, mdt), as_stored(v0, n, mdt), as_stored(gr, n, gdt);
    moe_buf m = moe_buf_of(host_typed(m0, n, mdt), mdt),
            v = moe_buf_of(host_typed(v0, n, mdt), mdt);
    moe_cbuf cg = moe_cbuf_of(host_typed(gr, n, gdt), gdt); /* the CPU reads the typed one too */
    uint16_t *p16 = xmalloc(hbytes), *plo = split ? xmalloc(hbytes) : NULL;
    for (int64_t i = 0; split && i < n; i++)
        moe_f32_split_bf16(p[i], p16 + i, plo + i);
    float *dp = split ? NULL : dup_dev(g, "param", p, F(n));
    float *dg = dup_dev(g, "grad (cast)", gr, F(n));
    moe_cbuf dgt = moe_cbuf_from(dev_operand(g, gdt, "grad", gr, n));
    moe_buf dm = dev_operand(g, mdt, "m", m0, n), dv = dev_operand(g, mdt, "v", v0, n);
    uint16_t *dp16 = dup_dev(g, "param16", split ? p16 : NULL, hbytes);
    uint16_t *dlo = split ? dup_dev(g, "param_lo", plo, hbytes) : NULL;
    const int64_t at[3] = {0, 1, 0}, shift[3] = {0, 0, 1}, len[3] = {n, n - 1, n - 1};
    int exact = 1;
    for (int64_t step = 1; step <= 3; step++) {
        int64_t a = at[step - 1], sh = shift[step - 1], ln = len[step - 1];
        g->cpu->adamw(g->cpu, split ? NULL : p + a, p16 + a, split ? plo + a : NULL,
                      moe_cbuf_at(cg, a), moe_buf_at(m, a + sh), moe_buf_at(v, a + sh), ln, 1e-3f,
                      0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
        g->gpu->adamw(g->gpu, split ? NULL : dp + a, dp16 + a, split ? dlo + a : NULL,
                      moe_cbuf_at(dgt, a), moe_buf_at(dm, a + sh), moe_buf_at(dv, a + sh), ln,
                      1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
        check_sync_guards(g, "adamw");
        uint16_t *h16 = down(g, dp16, hbytes), *hlo = split ? down(g, dlo, hbytes) : NULL;
        float *hp = split ? xmalloc(F(n)) : down(g, dp, F(n));
        int64_t bad = 0;
        for (int64_t i = a; i < a + ln; i++) {
            uint16_t hi = moe_f32_to_bf16(hp[i]), lo;
            if (split) /* the GPU's master, and its split's high half */
                hp[i] = moe_f32_join_bf16(h16[i], hlo[i]), moe_f32_split_bf16(hp[i], &hi, &lo);
            bad += h16[i] != hi;
        }
        CHECK_MSG(bad == 0, "%s step %lld: %lld bf16 copies differ from the rounded weight",
                  g->label, (long long)step, (long long)bad);
        free(hp), free(h16), free(hlo);
        if (mdt == MOE_DTYPE_BF16) {
            exact &= split ? same_bytes(g, "param_lo", dlo, plo, hbytes)
                           : same_bytes(g, "param", dp, p, F(n));
            exact &= same_bytes(g, "param16", dp16 + a, p16 + a, (size_t)ln * sizeof(uint16_t));
            exact &= same_bytes(g, "m", dm.p, m.p, mbytes);
            exact &= same_bytes(g, "v", dv.p, v.p, mbytes);
        }
    }
    if (mdt == MOE_DTYPE_BF16) {
        printf("  %-28s %-16s n=%-9lld %s, copy, m, v after 3 steps %s %s\n", g->label,
               gdt == MOE_DTYPE_BF16 ? "bf16 m v grad" : "bf16 moments", (long long)n,
               split ? "split master" : "param", exact ? "identical" : "DIFFER",
               exact ? "ok" : "FAIL");
    } else {
        if (split) { /* the masters the halves hold, on both sides */
            uint16_t *h16 = down(g, dp16, hbytes), *hlo = down(g, dlo, hbytes);
            float *gp = xmalloc(F(n));
            for (int64_t i = 0; i < n; i++)
                p[i] = moe_f32_join_bf16(p16[i], plo[i]), gp[i] = moe_f32_join_bf16(h16[i], hlo[i]);
            dp = dup_dev(g, "param (joined)", gp, F(n));
            free(h16), free(hlo), free(gp);
        }
        cmp_f32(g, "param", dp, p, n, tc->tol);
        cmp_f32(g, "m", dm.p, m.p, n, tc->tol);
        cmp_f32(g, "v", dv.p, v.p, n, tc->tol);
    }
    /* cast_bf16: bit-exact against the CPU's */
    uint16_t *c16 = dup_dev(g, "cast", NULL, hbytes);
    g->gpu->cast_bf16(g->gpu, c16, dg, n);
    g->cpu->cast_bf16(g->cpu, p16, gr, n);
    check_sync_guards(g, "cast_bf16");
    uint16_t *h16 = down(g, c16, hbytes);
    CHECK_MSG(memcmp(h16, p16, hbytes) == 0, "%s: cast_bf16 differs", g->label);
    free(h16), free(p), free(gr), free(m0), free(v0), free(m.p), free(v.p), free((void *)cg.p);
    free(p16), free(plo);
}

/* adamw_quantize (AdamW and the fp8-block copies in one pass) from the state p, gr, m, v
 * [E, O, I], the moments of type mdt and the gradient of type gdt (the values already as
 * stored): the GPU's master and moments against the CPU's (bit for bit with bf16 moments, as
 * the adamw cases; else within tc->tol), and its copies byte for byte against the CPU's
 * quantize_weight of the GPU's new master. */
static void check_adamw_quantize(gctx *g, const tcase *tc, const float *p, const float *gr,
                                 const float *m, const float *v, moe_dtype mdt, moe_dtype gdt,
                                 int64_t E, int64_t O, int64_t I) {
    const int64_t n = E * O * I, ns = moe_fp8_weight_scales(E, O, I);
    const size_t mbytes = (size_t)n * moe_dtype_size(mdt);
    float *cp = fdup(p, n), *cs = calloc((size_t)ns, sizeof(float));
    moe_buf cm = moe_buf_of(host_typed(m, n, mdt), mdt),
            cv = moe_buf_of(host_typed(v, n, mdt), mdt);
    void *cg = host_typed(gr, n, gdt);
    uint8_t *cq = xmalloc((size_t)(2 * n));
    float *dp = dup_dev(g, "param (fused)", p, F(n)), *ds = dup_dev(g, "scales (fused)", cs, F(ns));
    moe_buf dm = dev_operand(g, mdt, "m (fused)", m, n),
            dv = dev_operand(g, mdt, "v (fused)", v, n);
    moe_cbuf dg = moe_cbuf_from(dev_operand(g, gdt, "grad (fused)", gr, n));
    uint8_t *dq = dup_dev(g, "e4m3 copies (fused)", NULL, (size_t)(2 * n));
    g->cpu->adamw_quantize(g->cpu, cp, moe_cbuf_of(cg, gdt), cm, cv, cq, cs, E, O, I, tc->prec,
                           1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f);
    g->gpu->adamw_quantize(g->gpu, dp, dg, dm, dv, dq, ds, E, O, I, tc->prec, 1e-3f, 0.9f, 0.95f,
                           1e-8f, 0.1f, 2, 0.5f);
    check_sync_guards(g, "adamw_quantize");
    if (mdt == MOE_DTYPE_BF16) {
        int exact = same_bytes(g, "param (fused)", dp, cp, F(n)) &
                    same_bytes(g, "m (fused)", dm.p, cm.p, mbytes) &
                    same_bytes(g, "v (fused)", dv.p, cv.p, mbytes);
        printf("  %-28s %-16s n=%-9lld param, m, v %s %s\n", g->label, "fused bf16 m v",
               (long long)n, exact ? "identical" : "DIFFER", exact ? "ok" : "FAIL");
    } else {
        cmp_f32(g, "param (fused)", dp, cp, n, tc->tol);
        cmp_f32(g, "m (fused)", dm.p, cm.p, n, tc->tol);
        cmp_f32(g, "v (fused)", dv.p, cv.p, n, tc->tol);
    }
    /* the copies of the GPU's own new master */
    float *hp = down(g, dp, F(n));
    memset(cs, 0, F(ns));
    g->cpu->quantize_weight(g->cpu, cq, cs, hp, E, O, I, tc->prec);
    const int same_q = same_bytes(g, "e4m3 copies (fused)", dq, cq, (size_t)(2 * n)),
              same_s = same_bytes(g, "scales (fused)", ds, cs, F(ns));
    printf("  %-28s %-16s n=%-9lld values %s scales %s %s\n", g->label, "fused fp8 copies",
           (long long)n, same_q ? "identical" : "DIFFER", same_s ? "identical" : "DIFFER",
           same_q && same_s ? "ok" : "FAIL");
    free(cp), free(cs), free(cm.p), free(cv.p), free(cg), free(cq), free(hp);
}

/* AdamW and then the fp8-block copies of the new weight w [E, O, I], as moe_model_adamw runs
 * them: the GPU's new master against the CPU's (NMSE, as the adamw cases), and the GPU's
 * copies byte for byte against the CPU's quantize_weight of the GPU's new master (row-wise
 * and transposed values, both scale layouts; the scales' padding zero on both sides). A tile
 * of zeros that stays zero (scale 1), two outliers and the special values planted before the
 * copies exercise the scale rule's and the conversion's edges. Then the same state through
 * adamw_quantize, the one pass the model runs for a whole weight (check_adamw_quantize), with
 * the case's types: bf16 moments (typed) and bf16 gradients (GW_BF16). */
void run_adamw_fp8(gctx *g, const tcase *tc) {
    int64_t E = tc->s[0], O = tc->s[1], I = tc->s[2], n = E * O * I;
    int64_t ns = moe_fp8_weight_scales(E, O, I);
    float *p = frand(n, -1, 1), *gr = frand(n, -1, 1), *m = frand(n, -0.1f, 0.1f);
    float *v = frand(n, 0, 0.01f);
    for (int64_t r = 0; r < 128 && r < O; r++) /* expert 0's first tile: zeros, no gradient */
        for (int64_t k = 0; k < 128 && k < I; k++)
            p[r * I + k] = gr[r * I + k] = m[r * I + k] = v[r * I + k] = 0.0f;
    p[n / 2] = 300.0f, p[n - 1] = -1e4f;
    {
        const moe_dtype mdt = typed_dt(tc),
                        gdt = tc->types & GW_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        float *fm = fdup(m, n), *fv = fdup(v, n), *fg = fdup(gr, n);
        as_stored(fm, n, mdt), as_stored(fv, n, mdt), as_stored(fg, n, gdt);
        check_adamw_quantize(g, tc, p, fg, fm, fv, mdt, gdt, E, O, I);
        free(fm), free(fv), free(fg);
    }
    float *zeros = calloc((size_t)ns, sizeof(float));
    float *dp = dup_dev(g, "param", p, F(n)), *dg = dup_dev(g, "grad", gr, F(n));
    float *dm = dup_dev(g, "m", m, F(n)), *dv = dup_dev(g, "v", v, F(n));
    uint8_t *dq = dup_dev(g, "e4m3 copies", NULL, (size_t)(2 * n));
    float *ds = dup_dev(g, "scales", zeros, F(ns));
    g->cpu->adamw(g->cpu, p, NULL, NULL, moe_cbuf_f32(gr), moe_buf_f32(m), moe_buf_f32(v), n, 1e-3f,
                  0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f);
    g->gpu->adamw(g->gpu, dp, NULL, NULL, moe_cbuf_f32(dg), moe_buf_f32(dm), moe_buf_f32(dv), n,
                  1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f);
    check_sync_guards(g, "adamw");
    cmp_f32(g, "param", dp, p, n, tc->tol);
    /* the master as the copies see it, with values AdamW does not make: the last tile of the
     * last expert only NaN, +-Inf and zeros (amax 0: scale 1), and elsewhere subnormals, -0,
     * FLT_MAX and a NaN beside ordinary values */
    float *hp = down(g, dp, F(n));
    const int same_master = memcmp(hp, p, F(n)) == 0;
    static const float k_nonfinite[] = {NAN, INFINITY, -INFINITY, -NAN, 0.0f};
    for (int64_t r = (O - 1) / 128 * 128; r < O; r++)
        for (int64_t k = (I - 1) / 128 * 128; k < I; k++)
            hp[((E - 1) * O + r) * I + k] = k_nonfinite[(r + k) % 5];
    static const float k_odd[] = {1e-40f, -1e-42f, -0.0f, FLT_MAX, NAN, -3e-39f};
    for (int j = 0; j < 6; j++)
        hp[n / 3 + 5 * j] = k_odd[j];
    g->gpu->memcpy_h2d(g->gpu, dp, hp, F(n));
    g->gpu->quantize_weight(g->gpu, dq, ds, dp, E, O, I, tc->prec);
    check_sync_guards(g, "quantize_weight");
    float *hs = down(g, ds, F(ns));
    uint8_t *hq = down(g, dq, (size_t)(2 * n)), *cq = xmalloc((size_t)(2 * n));
    g->cpu->quantize_weight(g->cpu, cq, zeros, hp, E, O, I, tc->prec);
    int same_q = memcmp(hq, cq, (size_t)(2 * n)) == 0, same_s = memcmp(hs, zeros, F(ns)) == 0;
    printf("  %-28s %-16s n=%-9lld values %s scales %s (master %s) %s\n", g->label, "fp8 copies",
           (long long)n, same_q ? "identical" : "DIFFER", same_s ? "identical" : "DIFFER",
           same_master ? "bit-identical" : "within tol", same_q && same_s ? "ok" : "FAIL");
    CHECK_MSG(same_q && same_s, "%s: the GPU's fp8 copies differ from the CPU's quantize(master)",
              g->label);
    free(p), free(gr), free(m), free(v), free(zeros), free(hp), free(hs), free(hq), free(cq);
}

void run_sum_squares(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    const moe_dtype dt = tc->types & GW_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    float *x = frand(n, -3, 3);
    as_stored(x, n, dt);
    moe_cbuf hx = moe_cbuf_of(host_typed(x, n, dt), dt);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, dt, "x", x, n));
    double c = g->cpu->sum_squares(g->cpu, hx, n), d = g->gpu->sum_squares(g->gpu, dx_, n);
    double d2 = g->gpu->sum_squares(g->gpu, dx_, n);
    check_sync_guards(g, "sum_squares");
    double rel = fabs(d - c) / c;
    printf("  %-28s %-16s n=%-9lld rel.err=%.3e tol=%.0e repeat=%s %s\n", g->label, "sum",
           (long long)n, rel, tc->tol, d == d2 ? "identical" : "DIFFERS",
           rel <= tc->tol && d == d2 ? "ok" : "FAIL");
    CHECK_MSG(rel <= tc->tol, "%s: sum of squares %.17g vs cpu %.17g", g->label, d, c);
    CHECK_MSG(d == d2, "%s: two runs differ: %.17g vs %.17g (not deterministic)", g->label, d, d2);
    /* from the second element on: x no longer 16-byte aligned (bf16: the one-at-a-time form) */
    double c1 = g->cpu->sum_squares(g->cpu, moe_cbuf_at(hx, 1), n - 1);
    double d1 = g->gpu->sum_squares(g->gpu, moe_cbuf_at(dx_, 1), n - 1);
    check_sync_guards(g, "sum_squares from element 1");
    CHECK_MSG(fabs(d1 - c1) <= tc->tol * c1, "%s: sum of squares from element 1 %.17g vs cpu %.17g",
              g->label, d1, c1);
    free(x), free((void *)hx.p);
}
