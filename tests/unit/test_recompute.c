/* test_recompute: train.recompute (none/attn/moe/full) and the memory estimate.
 *
 * 1. Gradients, losses and router statistics of every recompute mode are BIT-identical to
 *    recompute none, for the fp32, bf16, mxfp8 (MXFP8 expert activations) and fp8-block
 *    (ln1 and the expert path as fp8-block pairs; blocks, and pow2 with x-tiles) recipes,
 *    tied and untied lm_head, over two accumulated micro-batches of different shapes (the
 *    second smaller than the buffers); fp8-block writes ln1 as a pair in every layer's
 *    forward and recomputed attention block, and (pow2 with x-tiles, whose experts are wider
 *    than the model) xe in every layer's forward and recomputed MoE block (counted).
 * 2. Each mode's activation plan is smaller than the one before it (none > attn, moe > full >
 *    forward-only), and a forward-only model gives the same hidden states as a training one.
 * 3. moe_model_memory_estimate is exact: a counting wrapper around the CPU backend's
 *    alloc/free sums what the model (and the AdamW moments a trainer adds) really allocate
 *    through the backend, and forward/backward allocate nothing more (fp32, bf16, and
 *    fp8-block, whose weight copies the first pass makes, and mxfp8, whose expert
 *    activations are MXFP8 and laid out again for a skipped layer, each with and without a
 *    layer in skip_layers; fp32 and bf16 AdamW moments); also for one rank of
 *    an expert-parallel group (its experts, its worst-case expert-side buffers).
 * 4. The backward makes the SwiGLU output g again only where the shared region does not hold
 *    it: every layer but the last under recompute none and attn, none under moe and full
 *    (the recomputed MoE block wrote it), counted through the same wrapper.
 * The one thing a reader must know: "bit-identical" is memcmp, not a tolerance - the
 * recomputed forward runs the same deterministic ops on the same inputs. */
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "model/model_internal.h"
#include "moe/dtype.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 3, T = 24, NLIVE = 64 };

/* ---- counting backend: the CPU table with alloc/free that keep a ledger in ctx ---- */

typedef struct counter {
    const moe_backend *cpu;
    void *ptr[NLIVE];
    size_t bytes[NLIVE];
    size_t live, peak;
    int n_alloc;
    int n_swiglu;    /* swiglu_forward calls */
    int n_norm_pair; /* rmsnorm_forward calls writing an fp8-block pair (ln1's) */
    int n_xe_pair;   /* quantize_pair calls (the expert inputs xe) */
} counter;

static void *count_alloc(const moe_backend *be, size_t bytes) {
    counter *c = be->ctx;
    void *p = c->cpu->alloc(c->cpu, bytes);
    if (!p) return NULL;
    for (int i = 0; i < NLIVE; i++)
        if (!c->ptr[i]) {
            c->ptr[i] = p, c->bytes[i] = bytes;
            c->live += bytes;
            if (c->live > c->peak) c->peak = c->live;
            c->n_alloc++;
            return p;
        }
    CHECK_MSG(0, "more than %d live allocations", NLIVE);
    c->cpu->free(c->cpu, p);
    return NULL;
}

static void count_free(const moe_backend *be, void *p) {
    counter *c = be->ctx;
    if (!p) return;
    for (int i = 0; i < NLIVE; i++)
        if (c->ptr[i] == p) {
            c->live -= c->bytes[i];
            c->ptr[i] = NULL;
            break;
        }
    c->cpu->free(c->cpu, p);
}

static void count_swiglu(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                         moe_recipe prec, const moe_fp8_groups *pairs) {
    counter *c = be->ctx;
    c->n_swiglu++;
    c->cpu->swiglu_forward(c->cpu, out, a, b, n, prec, pairs);
}

static void count_norm(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf x, const float *w,
                       int64_t N, int64_t C, float eps, moe_recipe prec,
                       const moe_fp8_groups *pairs) {
    counter *c = be->ctx;
    c->n_norm_pair += pairs != NULL;
    c->cpu->rmsnorm_forward(c->cpu, out, rstd, x, w, N, C, eps, prec, pairs);
}

static void count_quantize_pair(const moe_backend *be, moe_buf out, moe_cbuf x,
                                const moe_fp8_groups *pairs) {
    counter *c = be->ctx;
    c->n_xe_pair++;
    c->cpu->quantize_pair(c->cpu, out, x, pairs);
}

static moe_backend counting_backend(counter *c) {
    memset(c, 0, sizeof *c);
    c->cpu = moe_backend_cpu();
    moe_backend be = *c->cpu;
    be.ctx = c;
    be.alloc = count_alloc;
    be.free = count_free;
    be.swiglu_forward = count_swiglu;
    be.rmsnorm_forward = count_norm;
    be.quantize_pair = count_quantize_pair;
    return be;
}

/* ---- fixtures ---- */

static moe_model_config config(int tied) {
    moe_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 37;
    c.hidden_size = 32;
    c.intermediate_size = 24;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.num_local_experts = 5;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = 64;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.3;
    c.router_z_loss_coef = 0.05;
    c.initializer_range = 0.25;
    c.tie_word_embeddings = tied;
    return c;
}

typedef struct run_out {
    float *grads;
    double loss[2], aux[2], z[2];
    int64_t n, act_bytes;
    int norm_pairs; /* rmsnorm_forward calls that wrote ln1 as an fp8-block pair */
    int xe_pairs;   /* quantize_pair calls (xe as an fp8-block pair) */
} run_out;

/* Two accumulated micro-batches: B x T, then 2 x (T - 5) with weights. */
static run_out run(const moe_model_config *cfg, moe_recipe recipe, moe_recompute rc,
                   const int32_t *tok, const int32_t *tgt, const float *w) {
    run_out o;
    memset(&o, 0, sizeof o);
    counter cnt;
    moe_backend cbe = counting_backend(&cnt);
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    if (moe_model_create(&m, cfg, recipe, rc, &cbe, B, T, &err) != MOE_OK) {
        CHECK_MSG(0, "create: %s", err.msg);
        return o;
    }
    moe_model_init_weights(&m, 21);
    moe_step_stats st;
    CHECK(moe_model_forward(&m, tok, tgt, NULL, B, T, &st, &err) == MOE_OK);
    CHECK(moe_model_backward(&m, 0.5f, &err) == MOE_OK);
    o.loss[0] = st.loss, o.aux[0] = st.aux_loss, o.z[0] = st.z_loss;
    CHECK(moe_model_forward(&m, tok + 7, tgt + 7, w, 2, T - 5, &st, &err) == MOE_OK);
    CHECK(moe_model_backward(&m, 0.5f, &err) == MOE_OK);
    o.loss[1] = st.loss, o.aux[1] = st.aux_loss, o.z[1] = st.z_loss;
    o.n = m.table.n_elems;
    o.act_bytes = (int64_t)m.acts->bytes;
    o.grads = malloc((size_t)o.n * sizeof(float));
    moe_model_copy_grads_to_host(&m, o.grads);
    o.norm_pairs = cnt.n_norm_pair;
    o.xe_pairs = cnt.n_xe_pair;
    moe_model_free(&m);
    return o;
}

static void test_bit_identical(void) {
    int32_t tok[B * T], tgt[B * T];
    float w[B * T];
    uint64_t s = 9;
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)gc_uniform(&s, 0, 37);
        tgt[i] = i % 11 == 3 ? -1 : (int32_t)gc_uniform(&s, 0, 37);
        w[i] = (float)gc_uniform(&s, 0.2, 1.0);
    }
    const moe_recipe recipes[5] = {MOE_RECIPE_FP32, MOE_RECIPE_BF16, MOE_RECIPE_MXFP8,
                                   MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK_POW2_XT};
    for (int tied = 0; tied < 2; tied++)
        for (int r = 0; r < 5; r++) {
            moe_model_config cfg = config(tied);
            /* MXFP8 storage; fp8-block's xe as a pair (intermediate_size >= hidden_size; the
             * first fp8-block recipe keeps 24: xe unpaired) */
            if (recipes[r] == MOE_RECIPE_MXFP8 || r == 4) cfg.intermediate_size = 64;
            /* fp8-block's ln1 an fp8-block pair: written by each layer's forward, and again by
             * the attention blocks the backward recomputes (attn, full); xe likewise where
             * paired, again by the MoE blocks it recomputes (moe, full) */
            const int L = (int)cfg.num_hidden_layers, fp8 = r >= 3, xpair = r == 4;
            run_out ref = run(&cfg, recipes[r], MOE_RECOMPUTE_NONE, tok, tgt, w);
            if (!ref.grads) return;
            CHECK_INT_EQ(ref.norm_pairs, fp8 ? 2 * L : 0);
            CHECK_INT_EQ(ref.xe_pairs, xpair ? 2 * L : 0);
            double gmax = 0.0;
            for (int64_t i = 0; i < ref.n; i++)
                if (ref.grads[i] > gmax) gmax = ref.grads[i];
            CHECK_MSG(gmax > 0.0, "reference gradients are all zero");
            for (int rc = MOE_RECOMPUTE_ATTN; rc <= MOE_RECOMPUTE_FULL; rc++) {
                run_out o = run(&cfg, recipes[r], (moe_recompute)rc, tok, tgt, w);
                if (!o.grads) continue;
                const char *what = moe_recompute_name((moe_recompute)rc);
                const int again = rc == MOE_RECOMPUTE_ATTN || rc == MOE_RECOMPUTE_FULL;
                const int moe_again = rc == MOE_RECOMPUTE_MOE || rc == MOE_RECOMPUTE_FULL;
                CHECK_MSG(o.norm_pairs == (fp8 ? (again ? 4 : 2) * L : 0),
                          "recompute %s (%s): %d ln1 pairs written", what,
                          moe_recipe_name(recipes[r]), o.norm_pairs);
                CHECK_MSG(o.xe_pairs == (xpair ? (moe_again ? 4 : 2) * L : 0),
                          "recompute %s (%s): %d xe pairs written", what,
                          moe_recipe_name(recipes[r]), o.xe_pairs);
                CHECK_MSG(o.n == ref.n, "%s: parameter count", what);
                CHECK_MSG(memcmp(o.loss, ref.loss, sizeof o.loss) == 0 &&
                              memcmp(o.aux, ref.aux, sizeof o.aux) == 0 &&
                              memcmp(o.z, ref.z, sizeof o.z) == 0,
                          "recompute %s (%s, tied %d): losses differ from none", what,
                          moe_recipe_name(recipes[r]), tied);
                CHECK_MSG(memcmp(o.grads, ref.grads, (size_t)ref.n * sizeof(float)) == 0,
                          "recompute %s (%s, tied %d): gradients differ from none", what,
                          moe_recipe_name(recipes[r]), tied);
                CHECK_MSG(o.act_bytes < ref.act_bytes, "recompute %s does not save memory", what);
                free(o.grads);
            }
            free(ref.grads);
        }
}

/* Plans shrink in the documented order; forward-only gives the training model's hidden
 * states and refuses forward/backward. */
static void test_plans_and_forward_only(void) {
    moe_model_config cfg = config(0);
    int64_t by[4];
    for (int rc = 0; rc < 4; rc++)
        by[rc] = moe_model_activation_bytes(&cfg, MOE_RECIPE_FP32, (moe_recompute)rc, B, T);
    CHECK(by[MOE_RECOMPUTE_ATTN] < by[MOE_RECOMPUTE_NONE]);
    CHECK(by[MOE_RECOMPUTE_MOE] < by[MOE_RECOMPUTE_NONE]);
    CHECK(by[MOE_RECOMPUTE_FULL] < by[MOE_RECOMPUTE_ATTN]);
    CHECK(by[MOE_RECOMPUTE_FULL] < by[MOE_RECOMPUTE_MOE]);
    /* the MoE block (N k rows of width C and 3F) outweighs attention in this config */
    CHECK(by[MOE_RECOMPUTE_MOE] < by[MOE_RECOMPUTE_ATTN]);
    /* mxfp8 stores MXFP8 expert activations only with whole blocks of 32 in a row: not with
     * this config's intermediate_size 24 (bf16's plan), with 64 (smaller) */
    CHECK(!moe_model_layer_mx(&cfg, MOE_RECIPE_MXFP8, NULL, 0));
    CHECK(moe_model_activation_bytes(&cfg, MOE_RECIPE_MXFP8, MOE_RECOMPUTE_NONE, B, T) ==
          moe_model_activation_bytes(&cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, B, T));
    moe_model_config c64 = cfg;
    c64.intermediate_size = 64;
    CHECK(moe_model_layer_mx(&c64, MOE_RECIPE_MXFP8, NULL, 2) &&
          moe_model_layer_mx(&c64, MOE_RECIPE_MXFP8_FLOOR, NULL, 2) &&
          !moe_model_layer_mx(&c64, MOE_RECIPE_FP8_BLOCK, NULL, 2));

    counter cnt;
    moe_backend cbe = counting_backend(&cnt);
    moe_model tr, fo;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&tr, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_FULL, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    CHECK(moe_model_create_forward_only(&fo, &cfg, MOE_RECIPE_BF16, &cbe, B, T, &err) == MOE_OK);
    if (err.status != MOE_OK) return;
    /* forward-only bf16: the fp32 tensors that stay fp32 (norms, embedding, router), every
     * weight in bf16 and the activations; no gradients, no fp32 copy of the matrices */
    CHECK_INT_EQ(cnt.n_alloc, 3);
    CHECK(fo.weights16_only && fo.param_elems > 0 && fo.param_elems < fo.table.n_elems / 2);
    CHECK((int64_t)cnt.live == fo.param_elems * 4 + fo.table.n_elems * 2 + (int64_t)fo.acts->bytes);
    CHECK((int64_t)fo.acts->bytes < by[MOE_RECOMPUTE_FULL]);
    moe_model_init_weights(&tr, 4);
    moe_model_init_weights(&fo, 4);
    int32_t tok[B * T];
    uint64_t s = 3;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)gc_uniform(&s, 0, 37);
    size_t nh = (size_t)B * T * 32;
    float *h1 = malloc(nh * sizeof(float)), *h2 = malloc(nh * sizeof(float));
    for (int layer = 0; layer <= 3; layer++) {
        CHECK(moe_model_hidden(&tr, tok, B, T, layer, h1, &err) == MOE_OK);
        CHECK(moe_model_hidden(&fo, tok, B, T, layer, h2, &err) == MOE_OK);
        CHECK_MSG(memcmp(h1, h2, nh * sizeof(float)) == 0, "hidden layer %d differs", layer);
    }
    /* the load path (moe-embed, moe-score): the host weights in, the same hidden states; and
     * out again, the fp32 tensors exact, the others their bf16 values */
    moe_model fo2;
    CHECK(moe_model_create_forward_only(&fo2, &cfg, MOE_RECIPE_BF16, moe_backend_cpu(), B, T,
                                        &err) == MOE_OK);
    float *w = malloc((size_t)tr.table.n_elems * sizeof(float));
    float *w2 = malloc((size_t)tr.table.n_elems * sizeof(float));
    moe_model_copy_params_to_host(&tr, w);
    moe_model_copy_params_from_host(&fo2, w);
    CHECK(moe_model_hidden(&tr, tok, B, T, 3, h1, &err) == MOE_OK);
    CHECK(moe_model_hidden(&fo2, tok, B, T, 3, h2, &err) == MOE_OK);
    CHECK_MSG(memcmp(h1, h2, nh * sizeof(float)) == 0, "hidden states after a load differ");
    moe_model_copy_params_to_host(&fo2, w2);
    int64_t exact = 0, either = 0;
    for (int64_t i = 0; i < tr.table.n_elems; i++) {
        exact += w2[i] == w[i];
        either += w2[i] == w[i] || w2[i] == moe_round_bf16(w[i]);
    }
    CHECK_INT_EQ(either, tr.table.n_elems);
    CHECK(exact >= fo2.param_elems && exact < tr.table.n_elems);
    free(w), free(w2);
    moe_model_free(&fo2);
    CHECK(moe_model_forward(&fo, tok, tok, NULL, B, T, NULL, &err) == MOE_ERR_RUNTIME);
    CHECK(moe_model_backward(&fo, 1.0f, &err) == MOE_ERR_RUNTIME);
    moe_model bad;
    CHECK(moe_model_create(&bad, &cfg, MOE_RECIPE_FP32, (moe_recompute)7, moe_backend_cpu(), B, T,
                           &err) == MOE_ERR_INPUT);
    moe_model_free(&bad);
    free(h1), free(h2);
    moe_model_free(&tr);
    moe_model_free(&fo);
    CHECK_INT_EQ((int64_t)cnt.live, 0);
}

/* The estimate equals what is really allocated through the backend, for every mode. */
static void test_estimate_exact(void) {
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)((i * 7) % 37);
    for (int tied = 0; tied < 2; tied++)
        for (int rc = 0; rc < 4; rc++)
            for (int r = 0; r < 7; r++) {
                /* fp8-block and mxfp8 twice: every layer quantized, then layer 1 in
                 * skip_layers (under mxfp8 its expert activations are bf16: a new layout);
                 * bf16 twice: fp32 masters, then split ones (optim.master split) */
                const moe_recipe rs[7] = {
                    MOE_RECIPE_FP32,  MOE_RECIPE_BF16,  MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK,
                    MOE_RECIPE_MXFP8, MOE_RECIPE_MXFP8, MOE_RECIPE_BF16};
                const uint8_t skip1[3] = {0, 1, 0}, *skip = r % 2 && r > 1 && r < 6 ? skip1 : NULL;
                moe_recipe recipe = rs[r];
                moe_master master = r == 6 ? MOE_MASTER_SPLIT : MOE_MASTER_FP32;
                moe_model_config cfg = config(tied);
                cfg.intermediate_size = r == 4 || r == 5 ? 64 : cfg.intermediate_size;
                counter cnt;
                moe_backend cbe = counting_backend(&cnt);
                moe_model m;
                moe_err err;
                moe_err_clear(&err);
                if (moe_model_create(&m, &cfg, recipe, (moe_recompute)rc, &cbe, B, T, &err) !=
                    MOE_OK) {
                    CHECK_MSG(0, "create: %s", err.msg);
                    continue;
                }
                CHECK(moe_model_set_skip_layers(&m, skip, &err) == MOE_OK);
                /* what the trainer adds: the AdamW moments, through the same backend (bf16
                 * ones, optim.moments bf16, and bf16 expert gradients, optim.expert_grads
                 * bf16, with the tied models), in the trainer's order */
                moe_dtype mdt = tied ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
                CHECK(moe_model_set_expert_grads(&m, mdt, &err) == MOE_OK);
                CHECK(moe_model_set_master(&m, master, &err) == MOE_OK);
                moe_model_init_weights(&m, 1);
                /* the masters outside the copies: fp32, or the kept fp32 ones and low halves */
                size_t pb = (size_t)m.param_elems * sizeof(float) +
                            (size_t)(m.table.n_elems - m.param_elems) *
                                (master == MOE_MASTER_SPLIT ? sizeof(uint16_t) : 0);
                size_t mb = (size_t)m.table.n_elems * moe_dtype_size(mdt);
                void *am = cbe.alloc(&cbe, mb), *av = cbe.alloc(&cbe, mb);
                moe_model_zero_grad(&m);
                CHECK(moe_model_forward(&m, tok, tok, NULL, B, T, NULL, &err) == MOE_OK);
                CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
                if (mdt == MOE_DTYPE_BF16) { /* the host copy widens the bf16 expert gradients */
                    float *g = malloc((size_t)m.table.n_elems * sizeof(float));
                    moe_model_copy_grads_to_host(&m, g);
                    int64_t bad = 0;
                    for (int i = m.table.n_dense; i < m.table.n_params; i++) {
                        const moe_param *q = &m.table.params[i];
                        for (int64_t j = 0; j < q->numel; j++)
                            bad += g[q->offset + j] != moe_bf16_to_f32(q->grad16[j]);
                    }
                    CHECK_INT_EQ(bad, 0);
                    free(g);
                }
                moe_optim_config opt = test_optim(0.1);
                opt.moments = mdt;
                moe_model_adamw(&m, 0, m.table.n_elems, moe_buf_of(am, mdt), moe_buf_of(av, mdt),
                                &opt, 1e-3, 1, 1.0f);
                moe_model_memory est;
                moe_model_memory_estimate(&cfg, recipe, (moe_recompute)rc, B, T, 1, skip, mdt, mdt,
                                          master, &est);
                CHECK_MSG((int64_t)cnt.peak == est.total,
                          "recompute %s %s tied %d: estimate %lld bytes, allocated %zu",
                          moe_recompute_name((moe_recompute)rc), moe_recipe_name(recipe), tied,
                          (long long)est.total, cnt.peak);
                CHECK_INT_EQ(est.activations, (int64_t)m.acts->bytes);
                CHECK_INT_EQ(est.params, (int64_t)pb);
                CHECK_INT_EQ(est.optimizer, 2 * (int64_t)mb);
                CHECK_INT_EQ(est.expert_elems, m.table.n_elems - m.table.dense_elems);
                if (r == 6) { /* 2 bytes less than fp32 masters for each split one */
                    moe_model_memory f;
                    moe_model_memory_estimate(&cfg, recipe, (moe_recompute)rc, B, T, 1, skip, mdt,
                                              mdt, MOE_MASTER_FP32, &f);
                    CHECK_INT_EQ(f.total - est.total, 2 * (m.table.n_elems - m.param_elems));
                    CHECK(m.param_lo_mem && m.param_elems < m.table.n_elems / 2);
                }
                CHECK(est.gpu_scratch > 0); /* every recipe runs on CUDA */
                CHECK((est.fp8_copies > 0) == (r == 2 || r == 3) &&
                      (m.param8_mem != NULL) == (r == 2 || r == 3));
                if (r == 4 || r == 5) { /* MXFP8 expert activations: less than bf16's, more
                                           with a skip */
                    moe_model_memory b16, mx;
                    moe_model_memory_estimate(&cfg, MOE_RECIPE_BF16, (moe_recompute)rc, B, T, 1,
                                              NULL, mdt, mdt, MOE_MASTER_FP32, &b16);
                    moe_model_memory_estimate(&cfg, recipe, (moe_recompute)rc, B, T, 1, NULL, mdt,
                                              mdt, MOE_MASTER_FP32, &mx);
                    CHECK(mx.activations < b16.activations);
                    CHECK(r == 4 ||
                          (est.activations > mx.activations && est.activations <= b16.activations));
                }
                if (r == 3) { /* the skipped layer's copies are left out */
                    moe_model_memory all;
                    moe_model_memory_estimate(&cfg, recipe, (moe_recompute)rc, B, T, 1, NULL, mdt,
                                              mdt, MOE_MASTER_FP32, &all);
                    CHECK(est.fp8_copies * 3 == all.fp8_copies * 2);
                }
                cbe.free(&cbe, am);
                cbe.free(&cbe, av);
                moe_model_free(&m);
                CHECK_INT_EQ((int64_t)cnt.live, 0);
            }
}

/* moe_model_ep's exchange for a model that runs no pass: never called. */
static moe_status no_exchange(void *ctx, const void *send, const int64_t *send_rows, void *recv,
                              const int64_t *recv_rows, size_t row_bytes, moe_err *err) {
    (void)ctx, (void)send, (void)send_rows, (void)recv, (void)recv_rows, (void)row_bytes;
    CHECK_MSG(0, "an exchange in a model that runs no pass");
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "unexpected exchange");
}

/* Expert parallelism: rank 1 of an expert group of 5 (one of the 5 experts, the expert side
 * sized for 5 x the local rows) allocates what the estimate for ep = 5 says (fp32, bf16, and
 * bf16 with split masters). */
static void test_estimate_ep(void) {
    moe_model_config cfg = config(0);
    for (int r = 0; r < 3; r++) {
        moe_recipe recipe = r ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
        moe_master master = r == 2 ? MOE_MASTER_SPLIT : MOE_MASTER_FP32;
        counter cnt;
        moe_backend cbe = counting_backend(&cnt);
        moe_model m;
        moe_err err;
        moe_err_clear(&err);
        moe_model_ep ep = {.rank = 1, .size = 5, .alltoallv = no_exchange};
        if (moe_model_create_ep(&m, &cfg, recipe, MOE_RECOMPUTE_NONE, &cbe, B, T, &ep, &err) !=
            MOE_OK) {
            CHECK_MSG(0, "create: %s", err.msg);
            continue;
        }
        moe_dtype mdt = r ? MOE_DTYPE_BF16 : MOE_DTYPE_F32; /* the moments' and expert grads' */
        CHECK(moe_model_set_expert_grads(&m, mdt, &err) == MOE_OK);
        CHECK(moe_model_set_master(&m, master, &err) == MOE_OK);
        int64_t es = master == MOE_MASTER_SPLIT ? 2 : 4; /* an expert's master outside copies */
        size_t pb = (size_t)m.param_elems * sizeof(float) +
                    (size_t)((m.table.n_elems - m.param_elems) * (es == 2 ? 2 : 0));
        size_t mb = (size_t)m.table.n_elems * moe_dtype_size(mdt);
        void *am = cbe.alloc(&cbe, mb), *av = cbe.alloc(&cbe, mb);
        moe_model_memory est, one;
        moe_model_memory_estimate(&cfg, recipe, MOE_RECOMPUTE_NONE, B, T, 5, NULL, mdt, mdt, master,
                                  &est);
        moe_model_memory_estimate(&cfg, recipe, MOE_RECOMPUTE_NONE, B, T, 1, NULL, mdt, mdt, master,
                                  &one);
        CHECK_INT_EQ(est.total, (int64_t)cnt.peak);
        CHECK_INT_EQ(est.params, (int64_t)pb);
        CHECK_INT_EQ(est.expert_params, (m.table.n_elems - m.table.dense_elems) * es);
        CHECK_INT_EQ(est.expert_elems, m.table.n_elems - m.table.dense_elems);
        CHECK_INT_EQ(est.activations, (int64_t)m.acts->bytes);
        CHECK(est.params < one.params && est.activations > one.activations);
        cbe.free(&cbe, am);
        cbe.free(&cbe, av);
        moe_model_free(&m);
        CHECK_INT_EQ((int64_t)cnt.live, 0);
    }
}

/* The expert side's worst case: every token of the group's ep ranks sends at most
 * min(K, E/ep) rows to one rank (top-K experts are distinct). */
static void test_expert_rows_max(void) {
    moe_model_config cfg = config(0); /* E 5, K 2 */
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 1), 14);
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 5), 35); /* one expert a rank: 1 row a token */
    cfg.num_local_experts = 8;
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 8), 56);
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 4), 56); /* two experts a rank: both */
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 2), 28);
    cfg.num_experts_per_tok = 1;
    CHECK_INT_EQ(moe_model_expert_rows_max(&cfg, 7, 8), 56);
}

/* SwiGLU forwards of one forward and backward: L in the forward, then the backward's: L - 1
 * (g made again but in the last layer) under none and attn, L (the MoE blocks made again,
 * g with them) under moe and full; a second micro-batch the same. */
static void test_g_kept(void) {
    moe_model_config cfg = config(0);
    const int L = (int)cfg.num_hidden_layers;
    int32_t tok[B * T];
    uint64_t s = 5;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)gc_uniform(&s, 0, 37);
    for (int rc = MOE_RECOMPUTE_NONE; rc <= MOE_RECOMPUTE_FULL; rc++) {
        counter cnt;
        moe_backend cbe = counting_backend(&cnt);
        moe_model m;
        moe_err err;
        moe_err_clear(&err);
        if (moe_model_create(&m, &cfg, MOE_RECIPE_BF16, (moe_recompute)rc, &cbe, B, T, &err) !=
            MOE_OK) {
            CHECK_MSG(0, "create: %s", err.msg);
            continue;
        }
        moe_model_init_weights(&m, 2);
        const int want = rc == MOE_RECOMPUTE_MOE || rc == MOE_RECOMPUTE_FULL ? 2 * L : 2 * L - 1;
        moe_step_stats st;
        for (int micro = 1; micro <= 2; micro++) {
            CHECK(moe_model_forward(&m, tok, tok, NULL, B, T, &st, &err) == MOE_OK);
            CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
            CHECK_MSG(cnt.n_swiglu == micro * want, "recompute %s: %d SwiGLU forwards, want %d",
                      moe_recompute_name((moe_recompute)rc), cnt.n_swiglu, micro * want);
        }
        moe_model_free(&m);
    }
}

int main(void) {
    test_expert_rows_max();
    test_g_kept();
    test_bit_identical();
    test_plans_and_forward_only();
    test_estimate_exact();
    test_estimate_ep();
    return test_summary("test_recompute");
}
