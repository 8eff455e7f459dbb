/* test_model_grad: the whole model on the CPU backend - finite-difference check of the
 * loss (CE + aux + z) with respect to sampled elements of EVERY parameter tensor (tied and
 * untied lm_head), bit-identical results for 1 and 2 threads, the bf16 recipe, refusal of
 * fp8 recipes (emulated), the hidden-state API, the per-token log-probabilities
 * (moe_model_logprobs), init, accumulation semantics, sizes for --dry-run and bad input.
 *
 * FD tolerance: the model computes in fp32, so the loss (~2.4) carries ~1e-6 absolute
 * rounding noise; with h = 3e-3 the quotient's noise is ~3e-4, truncation ~h^2 |f'''| is
 * smaller. We compare with atol 5e-4 + rtol 5e-2, and always include each tensor's
 * largest-gradient element (typically 1e-2..1e-1) so every tensor kind gets a sharp check.
 * A perturbation that flips a top-k routing decision makes the loss jump (aux counts are
 * piecewise constant); such samples are detected by comparing the routing and skipped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "model/model_internal.h"
#include "moe/dtype.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 9 };
static int32_t tokens[B * T], targets[B * T];
static float weights[B * T];

static void make_batch(void) {
    uint64_t s = 77;
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)gc_uniform(&s, 0, 11);
        targets[i] = (int32_t)gc_uniform(&s, 0, 11);
        weights[i] = (float)gc_uniform(&s, 0.3, 1.0);
    }
    targets[4] = -1;
    targets[T + 8] = -1;
}

typedef struct {
    moe_model *m;
    int32_t *route0;
    int flipped;
} fd_ctx;

static int64_t route_len(const moe_model *m) {
    return m->cfg.num_hidden_layers * B * T * m->cfg.num_experts_per_tok;
}
static void get_routes(const moe_model *m, int32_t *dst) {
    int64_t per = B * T * m->cfg.num_experts_per_tok;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        memcpy(dst + l * per, m->acts->layer[l].topk_idx, (size_t)per * sizeof(int32_t));
}

static double model_loss(void *p) {
    fd_ctx *c = p;
    moe_step_stats st;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_forward(c->m, tokens, targets, weights, B, T, &st, &err) == MOE_OK);
    int64_t n = route_len(c->m);
    int32_t *r = malloc((size_t)n * sizeof(int32_t));
    get_routes(c->m, r);
    if (memcmp(r, c->route0, (size_t)n * sizeof(int32_t)) != 0) c->flipped = 1;
    free(r);
    return st.loss;
}

static void grad_check_model(int tied) {
    moe_model_config cfg = test_tiny_config(tied);
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    moe_model_init_weights(&m, 1234);
    moe_step_stats st;
    CHECK(moe_model_forward(&m, tokens, targets, weights, B, T, &st, &err) == MOE_OK);
    CHECK(st.aux_loss > 0.5 && st.z_loss > 0.0 && isfinite(st.loss));
    CHECK_NEAR(st.loss, st.ce_loss + 0.5 * st.aux_loss + 0.1 * st.z_loss, 1e-9);
    CHECK_NEAR(st.n_tokens, B * T - 2, 0);
    fd_ctx c = {&m, malloc((size_t)route_len(&m) * sizeof(int32_t)), 0};
    get_routes(&m, c.route0);
    moe_model_zero_grad(&m);
    CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
    int checked = 0, skipped = 0, tensors = 0;
    uint64_t s = 99 + (uint64_t)tied;
    for (int i = 0; i < m.table.n_params; i++) {
        moe_param *p = &m.table.params[i];
        int64_t best = 0;
        for (int64_t j = 1; j < p->numel; j++)
            if (fabsf(p->grad[j]) > fabsf(p->grad[best])) best = j;
        int ok_here = 0;
        for (int t = 0; t < 3; t++) {
            int64_t j = t == 0 ? best : (int64_t)gc_uniform(&s, 0, (double)p->numel);
            float orig = p->data[j];
            c.flipped = 0;
            p->data[j] = orig + 3e-3f;
            double hp = (double)p->data[j] - orig, lp = model_loss(&c);
            p->data[j] = orig - 3e-3f;
            double hm = orig - (double)p->data[j], lm = model_loss(&c);
            p->data[j] = orig;
            if (c.flipped) {
                skipped++;
                continue;
            }
            double fd = (lp - lm) / (hp + hm), an = p->grad[j];
            CHECK_MSG(fabs(fd - an) <= 5e-4 + 5e-2 * fmax(fabs(fd), fabs(an)),
                      "%s%s[%lld]: finite difference %.6g vs backward %.6g", tied ? "(tied) " : "",
                      p->name, (long long)j, fd, an);
            checked++;
            ok_here = 1;
        }
        tensors += ok_here;
    }
    CHECK_MSG(tensors == m.table.n_params,
              "only %d of %d tensors were checked (%d samples skipped "
              "for routing flips)",
              tensors, m.table.n_params, skipped);
    CHECK(skipped * 5 < checked);
    free(c.route0);
    moe_model_free(&m);
}

/* forward + backward, returns loss; grads left in the model */
static double step(moe_model *m, float scale) {
    moe_step_stats st;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_forward(m, tokens, targets, weights, B, T, &st, &err) == MOE_OK);
    CHECK(moe_model_backward(m, scale, &err) == MOE_OK);
    return st.loss;
}

static void test_threads_precision_accumulation(void) {
    moe_model_config cfg = test_tiny_config(0);
    moe_model m1, m2, mb;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m1, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    CHECK(moe_model_create(&m2, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    CHECK(moe_model_create(&mb, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    moe_model_init_weights(&m1, 5);
    moe_model_init_weights(&m2, 5);
    moe_model_init_weights(&mb, 5);
    int64_t n = m1.table.n_elems;
    CHECK(memcmp(m1.param_mem, m2.param_mem, (size_t)n * 4) == 0);
    moe_backend_cpu_set_threads(1);
    double l1 = step(&m1, 1.0f);
    moe_backend_cpu_set_threads(2);
    double l2 = step(&m2, 1.0f);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0);
    CHECK_MSG(memcmp(m1.grad_mem, m2.grad_mem, (size_t)n * 4) == 0,
              "gradients differ between 1 and 2 threads");
    /* backward accumulates: a second forward/backward with scale 0.5 adds half */
    float *g1 = malloc((size_t)n * 4);
    moe_model_copy_grads_to_host(&m1, g1);
    step(&m1, 0.5f);
    double maxe = 0;
    for (int64_t i = 0; i < n; i++)
        maxe = fmax(maxe, fabs(m1.grad_mem[i] - 1.5 * g1[i]));
    CHECK_NEAR(maxe, 0.0, 1e-6);
    moe_err_clear(&err);
    CHECK(moe_model_backward(&m1, 1.0f, &err) == MOE_ERR_RUNTIME); /* needs a new forward */
    /* zero_grad: the next backward writes every gradient (no trace of the 1.5 g1 before it,
     * the embedding's and the norms' included), the bytes of a first backward */
    moe_model_zero_grad(&m1);
    step(&m1, 1.0f);
    CHECK_MSG(memcmp(m1.grad_mem, m2.grad_mem, (size_t)n * 4) == 0,
              "a backward after zero_grad differs from the first backward");
    /* zero_grad with no backward after it: the gradients read as zeros */
    moe_model_zero_grad(&m1);
    float *gz = malloc((size_t)n * 4);
    moe_model_copy_grads_to_host(&m1, gz);
    const float *gm = moe_model_grads_at(&m1, 0).p;
    int zeros = 1;
    for (int64_t i = 0; i < n; i++)
        zeros &= gz[i] == 0.0f && gm[i] == 0.0f;
    CHECK_MSG(zeros, "gradients after zero_grad without a backward are not zero");
    free(gz);
    /* bf16: close to fp32 but not equal, and gradients close */
    double lb = step(&mb, 1.0f);
    CHECK_MSG(lb != l1 && fabs(lb - l1) < 2e-2 * fabs(l1), "bf16 loss %.9g vs fp32 %.9g", lb, l1);
    double dot = 0, n1 = 0, nb = 0;
    for (int64_t i = 0; i < n; i++)
        dot += (double)g1[i] * mb.grad_mem[i], n1 += (double)g1[i] * g1[i],
            nb += (double)mb.grad_mem[i] * mb.grad_mem[i];
    CHECK_MSG(dot / sqrt(n1 * nb) > 0.99, "bf16 vs fp32 gradient cosine %g", dot / sqrt(n1 * nb));
    /* the bf16 recipe stores its rounded activations (norm outputs, q/k/v, attention and
     * expert activations) as bf16, fp32 keeps fp32 */
    CHECK(mb.acts->adt == MOE_DTYPE_BF16 && m1.acts->adt == MOE_DTYPE_F32);
    free(g1);
    moe_model_free(&m1);
    moe_model_free(&m2);
    moe_model_free(&mb);
}

static void test_hidden_init_sizes_errors(void) {
    moe_model_config cfg = test_tiny_config(0);
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    moe_model_init_weights(&m, 42);
    /* init: norms are ones, matrices ~ N(0, 0.3), deterministic per seed */
    int ie = moe_param_table_find(&m.table, "model.embed_tokens.weight");
    int in = moe_param_table_find(&m.table, "model.layers.1.post_attention_layernorm.weight");
    int iw = moe_param_table_find(&m.table, "model.layers.0.block_sparse_moe.experts.3.w2.weight");
    CHECK(ie >= 0 && in >= 0 && iw >= 0);
    CHECK(moe_param_table_find(&m.table, "lm_head.weight") >= 0);
    CHECK(moe_param_table_find(&m.table, "model.layers.2.input_layernorm.weight") < 0);
    CHECK(m.table.params[in].data[3] == 1.0f && m.table.params[in].decay == 0 &&
          m.table.params[iw].decay == 1);
    CHECK(m.table.params[iw].layer == 0 && m.table.params[iw].expert == 3);
    CHECK(m.table.params[iw].shape[0] == 16 && m.table.params[iw].shape[1] == 12);
    double ss = 0;
    for (int64_t j = 0; j < m.table.params[iw].numel; j++)
        ss += (double)m.table.params[iw].data[j] * m.table.params[iw].data[j];
    CHECK_NEAR(sqrt(ss / m.table.params[iw].numel), 0.3, 0.05);
    float *p0 = malloc((size_t)m.table.n_elems * 4);
    moe_model_copy_params_to_host(&m, p0);
    moe_model_init_weights(&m, 43);
    CHECK(memcmp(p0, m.param_mem, (size_t)m.table.n_elems * 4) != 0);
    moe_model_init_weights(&m, 42);
    CHECK(memcmp(p0, m.param_mem, (size_t)m.table.n_elems * 4) == 0);
    /* hidden states: layer 0 is the embedding; rows are independent across the batch;
     * the last layer is the final norm (unit RMS with unit weights) */
    int64_t C = cfg.hidden_size;
    float *h = malloc((size_t)(B * T * C) * 4), *h1 = malloc((size_t)(T * C) * 4);
    CHECK(moe_model_hidden(&m, tokens, B, T, 0, h, &err) == MOE_OK);
    CHECK(memcmp(h + 5 * C, m.table.params[ie].data + tokens[5] * C, (size_t)C * 4) == 0);
    CHECK(moe_model_hidden(&m, tokens, B, T, 2, h, &err) == MOE_OK);
    double rs = 0;
    for (int64_t c = 0; c < C; c++)
        rs += (double)h[7 * C + c] * h[7 * C + c];
    CHECK_NEAR(sqrt(rs / C), 1.0, 1e-3);
    CHECK(moe_model_hidden(&m, tokens + T, 1, T, 2, h1, &err) == MOE_OK);
    double md = 0;
    for (int64_t i = 0; i < T * C; i++)
        md = fmax(md, fabs(h1[i] - h[T * C + i]));
    CHECK_NEAR(md, 0.0, 1e-5);
    CHECK(moe_model_hidden(&m, tokens, B, T, 1, h, &err) == MOE_OK);
    moe_step_stats st;
    CHECK(moe_model_forward(&m, tokens, targets, NULL, B, T, &st, &err) == MOE_OK);
    CHECK(memcmp(h, m.acts->layer[1].x_in, (size_t)(B * T * C) * 4) == 0);
    CHECK_NEAR(st.weight_sum, st.n_tokens, 0);
    int64_t sum = 0;
    for (int e = 0; e < 4; e++)
        sum += st.expert_tokens[4 + e];
    CHECK_INT_EQ(sum, B * T * 2);
    CHECK(st.router_entropy > 0 && st.router_entropy <= log(4.0) + 1e-9);
    moe_err_clear(&err);
    CHECK(moe_model_hidden(&m, tokens, B, T, 3, h, &err) == MOE_ERR_INPUT);
    /* sizes */
    int64_t total, active;
    moe_model_count_params(&cfg, &total, &active);
    CHECK_INT_EQ(total, m.table.n_elems);
    CHECK_INT_EQ(total - active, 2 * 2 * 3 * 16 * 12); /* 2 layers x 2 idle experts x 3 mats */
    double want =
        6.0 * (2 * (16 * 16 + 2 * 16 * 8 + 16 * 16 + 2 * 3 * 16 * 12 + 16 * 4) + 11 * 16) +
        6.0 * 2 * 9 * 16;
    CHECK_NEAR(moe_model_flops_per_token(&cfg, 9), want, 0);
    CHECK_INT_EQ(moe_model_activation_bytes(&cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, B, T),
                 (int64_t)m.acts->bytes);
    /* bad input */
    int32_t bad[B * T];
    memcpy(bad, tokens, sizeof bad);
    bad[3] = 11;
    moe_err_clear(&err);
    CHECK(moe_model_forward(&m, bad, targets, NULL, B, T, NULL, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    moe_err_clear(&err);
    CHECK(moe_model_forward(&m, tokens, targets, NULL, B, T + 1, NULL, &err) == MOE_ERR_INPUT);
    free(p0), free(h), free(h1);
    moe_model_free(&m);
    /* the fp8 recipes build on the CPU (emulated; a backend without them: unit.backend);
     * impossible shapes are refused */
    moe_model m8;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m8, &cfg, MOE_RECIPE_FP8_BLOCK, MOE_RECOMPUTE_NONE, moe_backend_cpu(),
                           B, T, &err) == MOE_OK);
    moe_model_free(&m8);
    cfg.num_experts_per_tok = 5;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m8, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_ERR_INPUT);
    cfg = test_tiny_config(0);
    moe_err_clear(&err);
    CHECK(moe_model_create(&m8, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, 33,
                           &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "max_position_embeddings") != NULL);
}

static void test_initial_loss(void) {
    /* with tiny weights the model is near uniform: CE ~ ln V, aux ~ 1 */
    moe_model_config cfg = test_tiny_config(1);
    cfg.initializer_range = 0.002;
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    moe_model_init_weights(&m, 7);
    moe_step_stats st;
    CHECK(moe_model_forward(&m, tokens, targets, weights, B, T, &st, &err) == MOE_OK);
    CHECK_NEAR(st.ce_loss, log(11.0), 5e-3);
    CHECK_NEAR(st.aux_loss, 1.0, 0.05);
    CHECK_NEAR(st.z_loss, log(4.0) * log(4.0), 1e-3);
    CHECK_NEAR(st.router_entropy, log(4.0), 1e-3);
    moe_model_free(&m);
}

/* A size at which GEMMs split into several output tiles and attention into several key
 * blocks: 1 and 2 threads must still give the same bits (exact resume depends on it). */
static void test_threads_big(void) {
    moe_model_config cfg = test_tiny_config(0);
    cfg.hidden_size = 160, cfg.intermediate_size = 136, cfg.num_attention_heads = 5;
    cfg.num_key_value_heads = 1, cfg.vocab_size = 200, cfg.max_position_embeddings = 256;
    enum { BB = 2, TT = 150 };
    int32_t *tok = malloc(BB * TT * sizeof(int32_t)), *tgt = malloc(BB * TT * sizeof(int32_t));
    uint64_t s = 5;
    for (int i = 0; i < BB * TT; i++)
        tok[i] = (int32_t)gc_uniform(&s, 0, 200), tgt[i] = (int32_t)gc_uniform(&s, 0, 200);
    float *g[2];
    double loss[2];
    int64_t n = 0;
    for (int r = 0; r < 2; r++) {
        moe_backend_cpu_set_threads(r + 1);
        moe_model m;
        moe_err err;
        moe_err_clear(&err);
        CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, moe_backend_cpu(), BB,
                               TT, &err) == MOE_OK);
        moe_model_init_weights(&m, 11);
        moe_step_stats st;
        CHECK(moe_model_forward(&m, tok, tgt, NULL, BB, TT, &st, &err) == MOE_OK);
        CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
        loss[r] = st.loss;
        n = m.table.n_elems;
        g[r] = malloc((size_t)n * sizeof(float));
        moe_model_copy_grads_to_host(&m, g[r]);
        moe_model_free(&m);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(double)) == 0);
    CHECK_MSG(memcmp(g[0], g[1], (size_t)n * sizeof(float)) == 0,
              "gradients depend on the thread count");
    free(g[0]), free(g[1]), free(tok), free(tgt);
}

/* moe_model_logprobs, what moe-score sums: minus the per-token cross-entropy of forward
 * (their sum is -ce_sum, ignored targets 0, no backward after them), equal to a host
 * log-softmax (double) of final-norm states times the head, and bit-identical on a
 * forward-only model (logits allocated on its first call). */
static void test_logprobs(int tied) {
    moe_model_config cfg = test_tiny_config(tied);
    const int64_t V = cfg.vocab_size, C = cfg.hidden_size;
    moe_model tr, fo;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&tr, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                           &err) == MOE_OK);
    CHECK(moe_model_create_forward_only(&fo, &cfg, MOE_RECIPE_FP32, moe_backend_cpu(), B, T,
                                        &err) == MOE_OK);
    if (err.status != MOE_OK) return;
    moe_model_init_weights(&tr, 9);
    moe_model_init_weights(&fo, 9);
    int32_t *tok = tokens, tgt[B * T];
    memcpy(tgt, targets, sizeof tgt);
    float lp[B * T], lp2[B * T];
    moe_step_stats st;
    CHECK(moe_model_forward(&tr, tok, tgt, NULL, B, T, &st, &err) == MOE_OK);
    CHECK(moe_model_logprobs(&tr, tok, tgt, B, T, lp, &err) == MOE_OK);
    double sum = 0.0;
    for (int i = 0; i < B * T; i++) {
        if (tgt[i] < 0) CHECK(lp[i] == 0.0f);
        CHECK(lp[i] <= 0.0f);
        sum += lp[i];
    }
    CHECK_NEAR(sum, -st.ce_sum, 1e-9 * fabs(st.ce_sum));
    CHECK(moe_model_backward(&tr, 1.0f, &err) == MOE_ERR_RUNTIME);
    moe_err_clear(&err);

    /* independent head: hidden states of the final norm times the head, log-softmax */
    float *h = malloc((size_t)B * T * C * sizeof(float));
    float *p = malloc((size_t)tr.table.n_elems * sizeof(float));
    CHECK(moe_model_hidden(&tr, tok, B, T, (int)cfg.num_hidden_layers, h, &err) == MOE_OK);
    moe_model_copy_params_to_host(&tr, p);
    const float *head = p + tr.table.params[tr.table.p_lm_head].offset;
    double worst = 0.0;
    for (int n = 0; n < B * T; n++) {
        if (tgt[n] < 0) continue;
        double z[64], mx = -INFINITY, se = 0.0;
        for (int v = 0; v < V; v++) {
            z[v] = 0.0;
            for (int c = 0; c < C; c++)
                z[v] += (double)h[n * C + c] * head[v * C + c];
            mx = z[v] > mx ? z[v] : mx;
        }
        for (int v = 0; v < V; v++)
            se += exp(z[v] - mx);
        double ref = z[tgt[n]] - mx - log(se);
        if (fabs(lp[n] - ref) > worst) worst = fabs(lp[n] - ref);
    }
    CHECK_MSG(worst < 1e-5, "tied %d: |logprob - host log-softmax| up to %g", tied, worst);

    /* forward-only: same numbers, head allocated on the first call and kept */
    CHECK(moe_model_logprobs(&fo, tok, tgt, B, T, lp2, &err) == MOE_OK);
    CHECK(memcmp(lp, lp2, sizeof lp) == 0);
    CHECK(moe_model_logprobs(&fo, tok, tgt, 1, T - 4, lp2, &err) == MOE_OK);
    CHECK(moe_model_logprobs(&fo, tok, tgt, B, T + 1, lp2, &err) == MOE_ERR_INPUT);
    moe_err_clear(&err);
    tgt[5] = (int32_t)V;
    CHECK(moe_model_logprobs(&fo, tok, tgt, B, T, lp2, &err) == MOE_ERR_INPUT);
    free(h);
    free(p);
    moe_model_free(&tr);
    moe_model_free(&fo);
}

/* precision.skip_layers: a layer it names runs its products as under bf16. With every layer
 * skipped, fp8-block and mxfp8 compute exactly what bf16 computes (loss and gradients, bit
 * for bit: the same bf16 weight values, read from a copy or converted at the product, and
 * under mxfp8 the expert activations stored in bf16 again); with one layer skipped fp8-block
 * differs from both. */
static void test_skip_layers(void) {
    moe_model_config cfg = test_tiny_config(0);
    cfg.hidden_size = 128, cfg.intermediate_size = 128; /* whole fp8 blocks */
    const moe_recipe rs[5] = {MOE_RECIPE_BF16, MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_FP8_BLOCK,
                              MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_MXFP8};
    const uint8_t all[2] = {1, 1}, first[2] = {1, 0};
    const uint8_t *skips[5] = {NULL, all, first, NULL, all};
    double loss[5];
    float *grads[5];
    moe_err err;
    for (int r = 0; r < 5; r++) {
        moe_model m;
        moe_err_clear(&err);
        CHECK(moe_model_create(&m, &cfg, rs[r], MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T,
                               &err) == MOE_OK);
        CHECK(moe_model_set_skip_layers(&m, skips[r], &err) == MOE_OK);
        moe_model_init_weights(&m, 3);
        moe_step_stats st;
        CHECK(moe_model_forward(&m, tokens, targets, NULL, B, T, &st, &err) == MOE_OK);
        CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
        loss[r] = st.loss;
        grads[r] = malloc((size_t)m.table.n_elems * sizeof(float));
        moe_model_copy_grads_to_host(&m, grads[r]);
        if (r == 4) { /* same sizes for every model: compare here */
            size_t bytes = (size_t)m.table.n_elems * sizeof(float);
            for (int k = 1; k < 5; k += 3)
                CHECK_MSG(loss[k] == loss[0] && memcmp(grads[k], grads[0], bytes) == 0,
                          "%s with every layer skipped: loss %.17g vs bf16 %.17g",
                          moe_recipe_name(rs[k]), loss[k], loss[0]);
            CHECK(loss[2] != loss[0] && loss[2] != loss[3]);
            CHECK(loss[3] != loss[0]);
        }
        moe_model_free(&m);
    }
    for (int r = 0; r < 5; r++)
        free(grads[r]);
}

/* mxfp8 keeps the residual stream of its MXFP8 layers in bf16 (training plans): layer 1's
 * input holds bf16 values, and moe_model_hidden reads them as they are; a skipped layer
 * keeps fp32 (layer 0's input is the embedding, exact), as bf16 does everywhere. */
static int all_bf16(const float *x, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        k += x[i] == moe_round_bf16(x[i]);
    return k == n;
}

static void test_mxfp8_residual(void) {
    moe_model_config cfg = test_tiny_config(0);
    cfg.hidden_size = 128, cfg.intermediate_size = 128; /* whole MXFP8 blocks */
    const int64_t n = (int64_t)B * T * cfg.hidden_size;
    const uint8_t first[2] = {1, 0};
    float *h0 = malloc((size_t)n * 4), *h1 = malloc((size_t)n * 4);
    for (int r = 0; r < 3; r++) {
        moe_model m;
        moe_err err;
        moe_err_clear(&err);
        CHECK(moe_model_create(&m, &cfg, r ? MOE_RECIPE_MXFP8 : MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE,
                               moe_backend_cpu(), B, T, &err) == MOE_OK);
        if (r == 2) CHECK(moe_model_set_skip_layers(&m, first, &err) == MOE_OK);
        moe_model_init_weights(&m, 5);
        CHECK(moe_model_hidden(&m, tokens, B, T, 0, h0, &err) == MOE_OK);
        CHECK(moe_model_hidden(&m, tokens, B, T, 1, h1, &err) == MOE_OK);
        moe_dtype want0 = r == 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        CHECK_MSG(m.acts->layer[0].rdt == want0 &&
                      m.acts->layer[1].rdt == (r ? MOE_DTYPE_BF16 : MOE_DTYPE_F32),
                  "recipe %d: residual types %d %d", r, (int)m.acts->layer[0].rdt,
                  (int)m.acts->layer[1].rdt);
        CHECK(all_bf16(h0, n) == (r == 1)); /* the embedding, rounded where layer 0 is MXFP8 */
        CHECK(all_bf16(h1, n) == (r != 0)); /* bf16's fp32 residual is not all bf16 */
        if (r == 1) {
            const uint16_t *x1 = m.acts->layer[1].x_in;
            int same = 1;
            for (int64_t i = 0; i < n; i++)
                same &= h1[i] == moe_bf16_to_f32(x1[i]);
            CHECK(same);
        }
        moe_model_free(&m);
    }
    free(h0), free(h1);
}

int main(void) {
    make_batch();
    test_threads_big();
    grad_check_model(0);
    grad_check_model(1);
    test_threads_precision_accumulation();
    test_hidden_init_sizes_errors();
    test_initial_loss();
    test_skip_layers();
    test_mxfp8_residual();
    test_logprobs(0);
    test_logprobs(1);
    return test_summary("test_model_grad");
}
