/* test_backend_prof: the profiling wrapper (moe/backend_prof.h) on the CPU backend.
 *
 * 1. A small MoE model trained for two steps (forward, backward, gradient norm, AdamW)
 *    through the wrapped table gives bit-identical losses, gradients and parameters to the
 *    same steps through the plain table, and the wrapper counts one call per op the model
 *    issues: per step L attention forwards and backwards, 3L expert (grouped) GEMMs each
 *    way, 5L + 1 dense matmuls each way (q, k, v, o, router gate per layer, lm_head).
 * 2. Direct calls: counts and kinds add up, reset clears, the printed table names every
 *    kind, the inner table is reachable. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/backend_prof.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 16, L = 2, STEPS = 2 };

static moe_model_config small_config(void) {
    moe_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 16;
    c.hidden_size = 32;
    c.intermediate_size = 24;
    c.num_hidden_layers = L;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = T;
    c.rope_theta = 1e4;
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.02;
    c.router_z_loss_coef = 0.001;
    c.initializer_range = 0.05;
    return c;
}

/* Runs STEPS training steps on `be`; fills losses, final grads and params (host copies). */
static int train_steps(const moe_backend *be, double *losses, float **grads, float **params,
                       int64_t *n_out) {
    moe_model_config c = small_config();
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    if (moe_model_create(&m, &c, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, be, B, T, &err) != MOE_OK) {
        moe_err_print(&err, "test_backend_prof", stderr);
        moe_model_free(&m);
        return 1;
    }
    moe_model_init_weights(&m, 7);
    int64_t n = m.table.n_elems;
    float *am = be->alloc(be, (size_t)n * sizeof(float));
    float *av = be->alloc(be, (size_t)n * sizeof(float));
    int32_t tok[B * T], tgt[B * T];
    uint64_t s = 12345;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)c.vocab_size);
    }
    for (int i = 0; i < B * T; i++)
        tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
    int rc = 0;
    moe_optim_config opt = test_optim(0.1);
    for (int st = 0; st < STEPS && rc == 0; st++) {
        moe_step_stats ss;
        moe_model_zero_grad(&m);
        if (moe_model_forward(&m, tok, tgt, NULL, B, T, &ss, &err) != MOE_OK ||
            moe_model_backward(&m, 1.0f, &err) != MOE_OK) {
            moe_err_print(&err, "test_backend_prof", stderr);
            rc = 1;
            break;
        }
        losses[st] = ss.loss;
        double gn = be->sum_squares(be, moe_cbuf_f32(m.grad_mem), n);
        float scale = gn > 1.0 ? (float)(1.0 / sqrt(gn)) : 1.0f;
        if (st + 1 < STEPS) /* keep the last step's gradients for the comparison */
            moe_model_adamw(&m, 0, n, moe_buf_f32(am), moe_buf_f32(av), &opt, 1e-2, st + 1, scale);
        if (be->synchronize(be, &err) != MOE_OK) rc = 1;
    }
    *n_out = n;
    *grads = malloc((size_t)n * sizeof(float));
    *params = malloc((size_t)n * sizeof(float));
    moe_model_copy_grads_to_host(&m, *grads);
    moe_model_copy_params_to_host(&m, *params);
    be->free(be, am);
    be->free(be, av);
    moe_model_free(&m);
    return rc;
}

static void test_model_bit_identical(void) {
    const moe_backend *cpu = moe_backend_cpu();
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *prof = moe_backend_prof_wrap(cpu, &err);
    CHECK(prof != NULL);
    if (!prof) return;
    CHECK(moe_backend_prof_inner(prof) == cpu);
    CHECK(strcmp(prof->name, cpu->name) == 0);
    double l0[STEPS] = {0}, l1[STEPS] = {0};
    float *g0 = NULL, *p0 = NULL, *g1 = NULL, *p1 = NULL;
    int64_t n0 = 0, n1 = 0;
    CHECK_INT_EQ(train_steps(cpu, l0, &g0, &p0, &n0), 0);
    CHECK_INT_EQ(train_steps(prof, l1, &g1, &p1, &n1), 0);
    CHECK_INT_EQ(n0, n1);
    for (int st = 0; st < STEPS; st++)
        CHECK_MSG(memcmp(&l0[st], &l1[st], sizeof(double)) == 0, "step %d loss %.17g vs %.17g", st,
                  l0[st], l1[st]);
    CHECK(l0[0] > 0.0 && l0[STEPS - 1] != l0[0]); /* the steps did train */
    CHECK(n0 == n1 && memcmp(g0, g1, (size_t)n0 * sizeof(float)) == 0);
    CHECK(n0 == n1 && memcmp(p0, p1, (size_t)n0 * sizeof(float)) == 0);

    moe_backend_prof_stats s;
    moe_backend_prof_get(prof, &s);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ATTENTION][0], STEPS * L);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ATTENTION][1], STEPS * L);
    CHECK_INT_EQ(s.op_calls[MOE_OP_GROUPED_MATMUL][0], STEPS * 3 * L);
    /* w2's weight gradient and dgrad are two calls (g and dg share a buffer) */
    CHECK_INT_EQ(s.op_calls[MOE_OP_GROUPED_MATMUL][1], STEPS * 4 * L);
    CHECK_INT_EQ(s.op_calls[MOE_OP_MATMUL][0], STEPS * (5 * L + 1));
    CHECK_INT_EQ(s.op_calls[MOE_OP_MATMUL][1], STEPS * (5 * L + 1));
    CHECK_INT_EQ(s.op_calls[MOE_OP_EMBEDDING][0], STEPS);
    CHECK_INT_EQ(s.op_calls[MOE_OP_EMBEDDING][1], STEPS);
    CHECK_INT_EQ(s.op_calls[MOE_OP_CROSS_ENTROPY][0], STEPS);
    CHECK_INT_EQ(s.op_calls[MOE_OP_SUM_SQUARES][0], STEPS);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ADAMW][0], STEPS - 1);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ROUTER][0], STEPS * L);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ROUTER][1], STEPS * L);
    CHECK(s.mem_calls > 0);
    /* waits for the device: per step the forward's token, target and loss copies, one offsets
     * copy per layer, the router statistics of all layers in two copies and a synchronize;
     * the backward's one dprob copy and a synchronize; this loop's sum_squares and
     * synchronize. Around the steps: one upload per tensor at init, two copies at the end. */
    moe_model_config mc = small_config();
    moe_param_table pt;
    CHECK(moe_param_table_build(&pt, &mc, 0, mc.num_local_experts, &err) == MOE_OK);
    CHECK_INT_EQ(s.host_syncs, pt.n_params + STEPS * (L + 10) + 2);
    moe_param_table_free(&pt);
    int64_t kc = 0, total = 0;
    double ksum = 0.0, osum = s.mem_seconds;
    for (int op = 0; op < MOE_OP_COUNT; op++)
        for (int d = 0; d < 2; d++) {
            total += s.op_calls[op][d];
            osum += s.op_seconds[op][d];
            CHECK(s.op_seconds[op][d] >= 0.0);
            CHECK(s.op_calls[op][d] > 0 || s.op_seconds[op][d] == 0.0);
        }
    total += s.mem_calls;
    for (int k = 0; k < MOE_PROF_KIND_COUNT; k++) {
        int64_t c = 0;
        ksum += moe_backend_prof_kind_seconds(&s, (moe_prof_kind)k, &c);
        kc += c;
    }
    CHECK_INT_EQ(kc, total);
    CHECK_NEAR(ksum, osum, 1e-9);
    int64_t ac = 0;
    moe_backend_prof_kind_seconds(&s, MOE_PROF_ATTENTION, &ac);
    CHECK_INT_EQ(ac, 2 * STEPS * L);
    CHECK(moe_backend_prof_kind_seconds(&s, MOE_PROF_EXPERT_GEMM, NULL) > 0.0);
    CHECK(moe_backend_prof_kind_seconds(&s, MOE_PROF_DENSE_GEMM, NULL) > 0.0);
    free(g0), free(p0), free(g1), free(p1);
    moe_backend_prof_free(prof);
}

static void test_direct_calls(void) {
    const moe_backend *cpu = moe_backend_cpu();
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *prof = moe_backend_prof_wrap(cpu, &err);
    CHECK(prof != NULL);
    if (!prof) return;
    enum { NE = 1000 };
    float *a = prof->alloc(prof, NE * sizeof(float)), *b = prof->alloc(prof, NE * sizeof(float));
    float ha[NE];
    for (int i = 0; i < NE; i++)
        ha[i] = (float)i * 0.5f - 3.0f;
    prof->memcpy_h2d(prof, a, ha, sizeof ha);
    prof->memcpy_h2d(prof, b, ha, sizeof ha);
    for (int r = 0; r < 3; r++)
        prof->add(prof, moe_buf_f32(b), moe_cbuf_f32(a), moe_cbuf_f32(b), NE);
    double ss = prof->sum_squares(prof, moe_cbuf_f32(b), NE), ref = 0.0;
    for (int i = 0; i < NE; i++)
        ref += 16.0 * (double)ha[i] * (double)ha[i];
    CHECK_NEAR(ss, ref, 1e-9 * ref);
    CHECK_INT_EQ(prof->synchronize(prof, &err), MOE_OK);
    moe_backend_prof_stats s;
    moe_backend_prof_get(prof, &s);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ADD][0], 3);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ADD][1], 0);
    CHECK_INT_EQ(s.op_calls[MOE_OP_SUM_SQUARES][0], 1);
    CHECK_INT_EQ(s.mem_calls, 2);
    int64_t c = 0;
    moe_backend_prof_kind_seconds(&s, MOE_PROF_OTHER, &c);
    CHECK_INT_EQ(c, 4);
    moe_backend_prof_kind_seconds(&s, MOE_PROF_ATTENTION, &c);
    CHECK_INT_EQ(c, 0);
    CHECK(moe_backend_prof_kind_of(MOE_OP_ATTENTION) == MOE_PROF_ATTENTION);
    CHECK(moe_backend_prof_kind_of(MOE_OP_GROUPED_MATMUL) == MOE_PROF_EXPERT_GEMM);
    CHECK(moe_backend_prof_kind_of(MOE_OP_MATMUL) == MOE_PROF_DENSE_GEMM);
    CHECK(moe_backend_prof_kind_of(MOE_OP_ROUTER) == MOE_PROF_OTHER);
    CHECK(moe_backend_prof_kind_of(MOE_OP_ADAMW) == MOE_PROF_OTHER);
    CHECK(prof->supports(prof, MOE_OP_ADD, NULL, MOE_RECIPE_FP32) ==
          cpu->supports(cpu, MOE_OP_ADD, NULL, MOE_RECIPE_FP32));
    CHECK(prof->bf16_native == cpu->bf16_native && prof->mx_native == cpu->mx_native &&
          prof->fp8_pairs == cpu->fp8_pairs);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    if (f) {
        moe_backend_prof_print(&s, 1, 1.0, f);
        fclose(f);
        for (int k = 0; k < MOE_PROF_KIND_COUNT; k++)
            CHECK_MSG(strstr(buf, moe_backend_prof_kind_name((moe_prof_kind)k)) != NULL,
                      "kind %d missing from the table", k);
        CHECK(strstr(buf, "| add | forward |") != NULL);
        CHECK(strstr(buf, "| add | backward |") == NULL);
        free(buf);
    }
    moe_backend_prof_reset(prof);
    moe_backend_prof_get(prof, &s);
    CHECK_INT_EQ(s.op_calls[MOE_OP_ADD][0], 0);
    CHECK_INT_EQ(s.mem_calls, 0);
    CHECK(s.op_seconds[MOE_OP_ADD][0] == 0.0);
    prof->free(prof, a);
    prof->free(prof, b);
    moe_backend_prof_free(prof);
    moe_backend_prof_free(NULL);
}

int main(void) {
    test_model_bit_identical();
    test_direct_calls();
    return test_summary("backend_prof");
}
