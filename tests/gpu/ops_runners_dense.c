/* ops_runners_dense: the runners of gpu.backend_ops (test_backend_ops.c) for the ops that
 * are not products, expert routing or the optimizer: embedding, RMSNorm, RoPE, attention (with
 * document masks and cached keys), pooling, cross-entropy and add. Each runner takes a case of
 * the table (its sizes in tc->s), runs forward and backward on both backends from the same
 * random inputs and compares every output (ops_harness.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ops.h"
#include "ops_harness.h"
#include "testlib.h"

/* Document masks of the attention and RoPE cases, chosen by s[5]: 0 none; 1 documents of the
 * lengths of k_doc_cycle in turn, row b starting at entry b (length-1 documents, boundaries on
 * the 32- and 64-row tile edges, documents longer than a tile and than several); 2 random
 * lengths, a third of them 1, the others in [2, 150]; 3 long documents: 2,200, 1 and 300 rows
 * in turn (key blocks that 2,000 queries see beside blocks that a few do). */
static const int64_t k_doc_cycle[] = {37, 1, 26, 64, 1, 128, 3, 90, 65, 1, 200};
static const int64_t k_doc_long[] = {2200, 1, 300};
enum { DOC_CYCLE = sizeof k_doc_cycle / sizeof k_doc_cycle[0] };

static int64_t next_doc_len(int64_t mode, int *at) {
    if (mode == 2) return rng_int(3) == 0 ? 1 : 2 + rng_int(149);
    if (mode == 3) return k_doc_long[(*at)++ % 3];
    int64_t len = k_doc_cycle[*at];
    *at = (*at + 1) % DOC_CYCLE;
    return len;
}

/* The op's doc_start [B, T] (host, malloc'ed) for mask mode `mode`; NULL for mode 0. */
static int32_t *doc_starts(int64_t B, int64_t T, int64_t mode) {
    if (!mode) return NULL;
    int32_t *ds = xmalloc(I32(B * T));
    for (int64_t b = 0; b < B; b++) {
        int at = (int)(b % DOC_CYCLE);
        int64_t start = 0, len = next_doc_len(mode, &at);
        for (int64_t t = 0; t < T; t++) {
            if (t - start == len) start = t, len = next_doc_len(mode, &at);
            ds[b * T + t] = (int32_t)start;
        }
    }
    return ds;
}

void run_embedding(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1], V = tc->s[2];
    int32_t *tok = xmalloc(I32(N));
    for (int64_t i = 0; i < N; i++)
        tok[i] = (int32_t)rng_int(V);
    float *wte = frand(V * C, -1, 1), *out = xmalloc(F(N * C));
    g->cpu->embedding_forward(g->cpu, moe_buf_f32(out), tok, wte, N, C);
    int32_t *dtok = dup_dev(g, "tokens", tok, I32(N));
    float *dwte = dup_dev(g, "wte", wte, F(V * C));
    /* a bf16 out (the residual stream under mxfp8) holds the rounded rows: exactly */
    moe_buf dout = dev_operand(g, role_dt(tc, ROLE_Y, MOE_DTYPE_F32), "out", NULL, N * C);
    g->gpu->embedding_forward(g->gpu, dout, dtok, dwte, N, C);
    check_sync_guards(g, "embedding_forward");
    cmp_typed(g, "out", dout, out, N * C, tc->tol);
    float *gy = frand(N * C, -1, 1), *dw = frand(V * C, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(N * C)), *ddw = dup_dev(g, "dwte", dw, F(V * C));
    g->cpu->embedding_backward(g->cpu, dw, gy, tok, N, C, V);
    g->gpu->embedding_backward(g->gpu, ddw, dgy, dtok, N, C, V);
    check_sync_guards(g, "embedding_backward");
    cmp_f32(g, "dwte", ddw, dw, V * C, tc->tol);
    free(tok), free(wte), free(out), free(gy), free(dw);
}

void run_rmsnorm(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], C = tc->s[1];
    float eps = 1e-5f;
    /* x: the residual stream, fp32 or (under mxfp8) bf16; out: ln1 MXFP8 or ln2 bf16 there */
    const moe_dtype xdt = role_dt(tc, ROLE_X, MOE_DTYPE_F32);
    const moe_recipe p16 = moe_recipe_unquantized(tc->prec); /* the norms', as the model says */
    float *x = frand(N * C, -2, 2), *w = frand(C, 0.5f, 1.5f);
    float *out = xmalloc(F(N * C)), *rstd = xmalloc(F(N));
    as_stored(x, N * C, xdt);
    g->cpu->rmsnorm_forward(g->cpu, moe_buf_f32(out), rstd, moe_cbuf_f32(x), w, N, C, eps, p16,
                            NULL);
    moe_cbuf dx_ = moe_cbuf_from(dev_operand(g, xdt, "x", x, N * C));
    float *dw_ = dup_dev(g, "w", w, F(C));
    moe_buf dout = dev_operand(g, role_dt(tc, ROLE_Y, typed_dt(tc)), "out", NULL, N * C);
    float *drstd = dup_dev(g, "rstd", NULL, F(N));
    g->gpu->rmsnorm_forward(g->gpu, dout, drstd, dx_, dw_, N, C, eps, p16, NULL);
    check_sync_guards(g, "rmsnorm_forward");
    cmp_typed(g, "out", dout, out, N * C, tc->tol);
    cmp_f32(g, "rstd", drstd, rstd, N, tc->tol);
    float *gy = frand(N * C, -1, 1), *gx = frand(N * C, -1, 1), *gw = frand(C, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(N * C)), *dgx = dup_dev(g, "dx", gx, F(N * C));
    float *dgw = dup_dev(g, "dw", gw, F(C)), *drs = dup_dev(g, "rstd_ref", rstd, F(N));
    g->cpu->rmsnorm_backward(g->cpu, gx, gw, gy, moe_cbuf_f32(x), w, rstd, N, C);
    g->gpu->rmsnorm_backward(g->gpu, dgx, dgw, dgy, dx_, dw_, drs, N, C);
    check_sync_guards(g, "rmsnorm_backward");
    cmp_f32(g, "dx", dgx, gx, N * C, tc->tol);
    cmp_f32(g, "dw", dgw, gw, C, tc->tol);
    free(x), free(w), free(out), free(rstd), free(gy), free(gx), free(gw);
}

/* s: B, T, NH, D, theta, document mode, p0 (the forward's first position) */
void run_rope(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], NH = tc->s[2], D = tc->s[3], p0 = tc->s[6];
    double theta = (double)tc->s[4];
    int64_t n = B * T * NH * D;
    float *x = frand(n, -1, 1);
    as_stored(x, n, typed_dt(tc));
    moe_buf dx_ = dev_operand(g, typed_dt(tc), "x", x, n);
    int32_t *pos = doc_starts(B, T, tc->s[5]), *dpos = NULL; /* positions inside documents */
    for (int64_t i = 0; pos && i < B * T; i++)
        pos[i] = (int32_t)(i % T) - pos[i];
    if (pos) dpos = dup_dev(g, "pos", pos, I32(B * T));
    g->cpu->rope_forward(g->cpu, moe_buf_f32(x), pos, p0, B, T, NH, D, theta);
    g->gpu->rope_forward(g->gpu, dx_, dpos, p0, B, T, NH, D, theta);
    check_sync_guards(g, "rope_forward");
    cmp_typed(g, "x (fwd)", dx_, x, n, tc->tol);
    /* the backward in place on fp32, and (typed) from fp32 into bf16, as under bf16 */
    float *gx = frand(n, -1, 1);
    float *dgx = dup_dev(g, "dx", gx, F(n));
    moe_buf dgt = dev_operand(g, typed_dt(tc), "dx (typed)", NULL, n);
    g->cpu->rope_backward(g->cpu, moe_buf_f32(gx), gx, pos, B, T, NH, D, theta);
    g->gpu->rope_backward(g->gpu, dgt, dgx, dpos, B, T, NH, D, theta);
    g->gpu->rope_backward(g->gpu, moe_buf_f32(dgx), dgx, dpos, B, T, NH, D, theta);
    check_sync_guards(g, "rope_backward");
    cmp_f32(g, "dx (bwd)", dgx, gx, n, tc->tol);
    cmp_typed(g, "dx (bwd, typed out)", dgt, gx, n, tc->tol);
    free(x), free(gx), free(pos);
}

/* The document starts [B, T] of the last T of Tk positions (doc_starts over Tk), or NULL. */
static int32_t *doc_starts_last(int64_t B, int64_t T, int64_t Tk, int64_t mode) {
    int32_t *all = doc_starts(B, Tk, mode);
    if (!all || Tk == T) return all;
    int32_t *ds = xmalloc(I32(B * T));
    for (int64_t b = 0; b < B; b++)
        memcpy(ds + b * T, all + b * Tk + (Tk - T), I32(T));
    free(all);
    return ds;
}

/* s: B, T, H, KV, D, document mode, P: the queries continue P cached keys (Tk = P + T
 * keys; the forward only, as the model's scoring runs it) */
void run_attention(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], H = tc->s[2], KV = tc->s[3], D = tc->s[4];
    int64_t Tk = T + tc->s[6], nq = B * T * H * D, nk = B * Tk * KV * D;
    float *q = frand(nq, -2, 2), *k = frand(nk, -2, 2), *v = frand(nk, -1, 1);
    as_stored(q, nq, typed_dt(tc)), as_stored(k, nk, typed_dt(tc)), as_stored(v, nk, typed_dt(tc));
    float *out = xmalloc(F(nq)), *lse = xmalloc(F(B * H * T));
    int32_t *ds = doc_starts_last(B, T, Tk, tc->s[5]);
    const int32_t *dds = ds ? dup_dev(g, "doc_start", ds, I32(B * T)) : NULL;
    g->cpu->attention_forward(g->cpu, moe_buf_f32(out), lse, moe_cbuf_f32(q), moe_cbuf_f32(k),
                              moe_cbuf_f32(v), ds, B, T, Tk, H, KV, D, tc->prec);
    moe_cbuf dq_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "q", q, nq));
    moe_cbuf dk_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "k", k, nk));
    moe_cbuf dv_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "v", v, nk));
    moe_buf dout = dev_operand(g, typed_dt(tc), "out", NULL, nq);
    float *dlse = dup_dev(g, "lse", NULL, F(B * H * T));
    g->gpu->attention_forward(g->gpu, dout, dlse, dq_, dk_, dv_, dds, B, T, Tk, H, KV, D, tc->prec);
    check_sync_guards(g, "attention_forward");
    cmp_typed(g, "out", dout, out, nq, tc->tol);
    cmp_f32(g, "lse", dlse, lse, B * H * T, tc->tol);
    if (Tk > T) { /* cached keys: a forward only */
        free(q), free(k), free(v), free(out), free(lse), free(ds);
        return;
    }
    /* backward from the CPU's forward results, so both sides see the same out and lse */
    float *gy = frand(nq, -1, 1), *gq = frand(nq, -1, 1), *gk = frand(nk, -1, 1);
    float *gv = frand(nk, -1, 1);
    float *dgy = dup_dev(g, "dout", gy, F(nq)), *dgq = dup_dev(g, "dq", gq, F(nq));
    float *dgk = dup_dev(g, "dk", gk, F(nk)), *dgv = dup_dev(g, "dv", gv, F(nk));
    moe_cbuf dor = moe_cbuf_from(dev_operand(g, typed_dt(tc), "out_ref", out, nq));
    float *dlr = dup_dev(g, "lse_ref", lse, F(B * H * T));
    float *gq0 = fdup(gq, nq), *gk0 = fdup(gk, nk);
    g->cpu->attention_backward(g->cpu, gq, gk, gv, gy, moe_cbuf_f32(q), moe_cbuf_f32(k),
                               moe_cbuf_f32(v), moe_cbuf_f32(out), lse, ds, B, T, H, KV, D,
                               tc->prec, MOE_GRAD_ADD);
    g->gpu->attention_backward(g->gpu, dgq, dgk, dgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_ADD);
    check_sync_guards(g, "attention_backward");
    check_changed(g, "dq", gq, gq0, nq, 0.9);
    check_changed(g, "dk", gk, gk0, nk, 0.9);
    free(gq0), free(gk0);
    cmp_f32(g, "dq", dgq, gq, nq, tc->tol);
    cmp_f32(g, "dk", dgk, gk, nk, tc->tol);
    cmp_f32(g, "dv", dgv, gv, nk, tc->tol);
    /* written gradients (MOE_GRAD_SET) into NaN-poisoned buffers, which must not be read */
    g->cpu->attention_backward(g->cpu, gq, gk, gv, gy, moe_cbuf_f32(q), moe_cbuf_f32(k),
                               moe_cbuf_f32(v), moe_cbuf_f32(out), lse, ds, B, T, H, KV, D,
                               tc->prec, MOE_GRAD_SET);
    float *sgq = dup_dev(g, "dq (SET)", NULL, F(nq)), *sgk = dup_dev(g, "dk (SET)", NULL, F(nk));
    float *sgv = dup_dev(g, "dv (SET)", NULL, F(nk));
    g->gpu->attention_backward(g->gpu, sgq, sgk, sgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_SET);
    check_sync_guards(g, "attention_backward SET");
    cmp_f32(g, "dq (SET)", sgq, gq, nq, tc->tol);
    cmp_f32(g, "dk (SET)", sgk, gk, nk, tc->tol);
    cmp_f32(g, "dv (SET)", sgv, gv, nk, tc->tol);
    /* deterministic: the same call again gives the same bits (the Hopper kernel adds each
     * block's share of dq in a fixed order) */
    float *rgq = dup_dev(g, "dq (again)", NULL, F(nq));
    float *rgk = dup_dev(g, "dk (again)", NULL, F(nk)),
          *rgv = dup_dev(g, "dv (again)", NULL, F(nk));
    g->gpu->attention_backward(g->gpu, rgq, rgk, rgv, dgy, dq_, dk_, dv_, dor, dlr, dds, B, T, H,
                               KV, D, tc->prec, MOE_GRAD_SET);
    check_sync_guards(g, "attention_backward again");
    const float *pairs[3][2] = {{sgq, rgq}, {sgk, rgk}, {sgv, rgv}};
    const int64_t lens[3] = {nq, nk, nk};
    for (int j = 0; j < 3; j++) {
        float *x = down(g, pairs[j][0], F(lens[j])), *y = down(g, pairs[j][1], F(lens[j]));
        int same = memcmp(x, y, F(lens[j])) == 0;
        printf("  %-28s %-16s repeat %s\n", g->label,
               j == 0   ? "dq"
               : j == 1 ? "dk"
                        : "dv",
               same ? "identical" : "DIFFERS");
        CHECK_MSG(same, "%s: two backward runs differ (not deterministic)", g->label);
        free(x), free(y);
    }
    free(q), free(k), free(v), free(out), free(lse), free(gy), free(gq), free(gk), free(gv);
    free(ds);
}

/* pool: random ranges per row, including a range of one position and one reaching the end */
void run_pool(gctx *g, const tcase *tc) {
    int64_t B = tc->s[0], T = tc->s[1], C = tc->s[2];
    float *x = frand(B * T * C, -3, 3), *o = xmalloc(F(B * C));
    int32_t *range = xmalloc(I32(2 * B));
    for (int64_t b = 0; b < B; b++) {
        int64_t first = b == 0 ? 0 : rng_int(T), cnt = b == 1 ? 1 : 1 + rng_int(T - first);
        if (b == 2) first = T - 5, cnt = 5;
        range[2 * b] = (int32_t)first, range[2 * b + 1] = (int32_t)cnt;
    }
    float *dx = dup_dev(g, "x", x, F(B * T * C));
    int32_t *dr = dup_dev(g, "range", range, I32(2 * B));
    for (int max = 0; max <= 1; max++) {
        float *dout = dup_dev(g, max ? "out_max" : "out_mean", NULL, F(B * C));
        g->cpu->pool_forward(g->cpu, o, x, range, B, T, C, max);
        g->gpu->pool_forward(g->gpu, dout, dx, dr, B, T, C, max);
        check_sync_guards(g, "pool_forward");
        cmp_f32(g, max ? "max" : "mean", dout, o, B * C, max ? 0.0 : tc->tol);
    }
    free(x), free(o), free(range);
}

void run_xent(gctx *g, const tcase *tc) {
    int64_t N = tc->s[0], V = tc->s[1];
    int use_w = tc->s[2] != 0;
    float *z = frand(N * V, -5, 5), *w = use_w ? frand(N, 0, 2) : NULL;
    int32_t *t = xmalloc(I32(N));
    for (int64_t i = 0; i < N; i++)
        t[i] = rng_int(7) == 0 ? -1 : (int32_t)rng_int(V);
    float *loss = xmalloc(F(N)), *lse = xmalloc(F(N));
    g->cpu->cross_entropy_forward(g->cpu, loss, lse, z, t, w, N, V);
    float *dz_ = dup_dev(g, "logits", z, F(N * V)),
          *dw_ = use_w ? dup_dev(g, "weights", w, F(N)) : NULL;
    int32_t *dt = dup_dev(g, "targets", t, I32(N));
    float *dloss = dup_dev(g, "loss", NULL, F(N)), *dlse = dup_dev(g, "lse", NULL, F(N));
    g->gpu->cross_entropy_forward(g->gpu, dloss, dlse, dz_, dt, dw_, N, V);
    check_sync_guards(g, "cross_entropy_forward");
    cmp_f32(g, "loss", dloss, loss, N, tc->tol);
    cmp_f32(g, "lse", dlse, lse, N, tc->tol);
    float dl = 0.7f;
    float *gz = xmalloc(F(N * V));
    g->cpu->cross_entropy_backward(g->cpu, gz, z, lse, t, w, dl, N, V);
    float *dlr = dup_dev(g, "lse_ref", lse, F(N)), *dgz = dup_dev(g, "dlogits", NULL, F(N * V));
    g->gpu->cross_entropy_backward(g->gpu, dgz, dz_, dlr, dt, dw_, dl, N, V);
    check_sync_guards(g, "cross_entropy_backward");
    cmp_f32(g, "dlogits", dgz, gz, N * V, tc->tol);
    /* in place: dlogits aliases logits */
    g->gpu->cross_entropy_backward(g->gpu, dz_, dz_, dlr, dt, dw_, dl, N, V);
    check_sync_guards(g, "cross_entropy_backward in place");
    cmp_f32(g, "dlogits in place", dz_, gz, N * V, tc->tol);
    free(z), free(w), free(t), free(loss), free(lse), free(gz);
}

/* a and out: the residual stream, fp32 or bf16 (one fp32 sum on both sides, so a bf16 out
 * holds exactly the CPU's sum rounded); in place where they share a type. b: o_proj's output,
 * bf16 with TYPED */
void run_add(gctx *g, const tcase *tc) {
    int64_t n = tc->s[0];
    const moe_dtype adt = role_dt(tc, ROLE_X, MOE_DTYPE_F32),
                    odt = role_dt(tc, ROLE_Y, MOE_DTYPE_F32);
    float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *o = xmalloc(F(n));
    as_stored(a, n, adt);
    as_stored(b, n, typed_dt(tc));
    g->cpu->add(g->cpu, moe_buf_f32(o), moe_cbuf_f32(a), moe_cbuf_f32(b), n);
    moe_buf da_ = dev_operand(g, adt, "a", a, n), do_ = dev_operand(g, odt, "out", NULL, n);
    moe_cbuf db_ = moe_cbuf_from(dev_operand(g, typed_dt(tc), "b", b, n));
    g->gpu->add(g->gpu, do_, moe_cbuf_from(da_), db_, n);
    check_sync_guards(g, "add");
    cmp_typed(g, "out", do_, o, n, tc->tol);
    if (adt == odt) { /* out aliases a (a residual add) */
        g->gpu->add(g->gpu, da_, moe_cbuf_from(da_), db_, n);
        check_sync_guards(g, "add in place");
        cmp_typed(g, "out (aliased)", da_, o, n, tc->tol);
    }
    free(a), free(b), free(o);
}
