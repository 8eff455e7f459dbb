/* test_model_ep: expert parallelism inside the model (model_ep.c) without MPI - two models of
 * one expert group (ep = 2, two experts each) run in two threads, their moe_model_ep hook an
 * in-process all-to-all (a barrier, then each copies its rows from the peers' send
 * buffers). Each trains on its own micro-batch; one model holding every expert runs both.
 * Per micro-batch the losses and router statistics must match, and the gradients: dense ones
 * summed over the two ranks, each expert's on its owner (1e-5 relative to the tensor's
 * largest value in fp32, 1e-3 in bf16: only the order of the weight-gradient sums differs).
 * Cases: random routing with every activation kept; all tokens routed to experts 0 and 1
 * (a zero gate: ties go to the lower index) so rank 1 receives no rows and experts 2, 3 none,
 * under train.recompute=full (the exchanges run again in the backward); bf16 with
 * recompute=moe; mxfp8, whose expert rows travel as MXFP8 values and scales. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 12, P = 2 };

typedef struct xchg { /* the in-process transport shared by the P ranks */
    pthread_barrier_t bar;
    const void *send[P];
    const int64_t *rows[P];
} xchg;

typedef struct rank_ctx {
    xchg *x;
    int rank;
    moe_model model;
    const int32_t *tok, *tgt;
    moe_step_stats st;
    moe_status fwd, bwd;
    moe_err err;
} rank_ctx;

/* moe_model_ep.alltoallv between the threads: post, wait, copy the peers' rows, wait. */
static moe_status thread_a2a(void *ctx, const void *send, const int64_t *send_rows, void *recv,
                             const int64_t *recv_rows, size_t row_bytes, moe_err *err) {
    rank_ctx *me = ctx;
    xchg *x = me->x;
    x->send[me->rank] = send, x->rows[me->rank] = send_rows;
    pthread_barrier_wait(&x->bar);
    char *out = recv;
    moe_status st = MOE_OK;
    for (int s = 0; s < P; s++) {
        int64_t at = 0;
        for (int q = 0; q < me->rank; q++)
            at += x->rows[s][q];
        int64_t n = x->rows[s][me->rank];
        if (n != recv_rows[s]) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "row counts differ");
        if (n > 0 && st == MOE_OK)
            memcpy(out, (const char *)x->send[s] + (size_t)at * row_bytes, (size_t)n * row_bytes);
        out += (size_t)recv_rows[s] * row_bytes;
    }
    pthread_barrier_wait(&x->bar);
    return st;
}

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    r->fwd = moe_model_forward(&r->model, r->tok, r->tgt, NULL, B, T, &r->st, &r->err);
    r->bwd = r->fwd == MOE_OK ? moe_model_backward(&r->model, 0.5f, &r->err) : r->fwd;
    return NULL;
}

/* testlib's tiny config with more vocabulary and experts' width, one KV head of two. */
static moe_model_config config(void) {
    moe_model_config c = test_tiny_config(0);
    c.vocab_size = 29;
    c.intermediate_size = 24;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.router_aux_loss_coef = 0.3;
    c.router_z_loss_coef = 0.05;
    return c;
}

/* Zeroes every layer's router gate (all logits equal: top-k takes experts 0 and 1). */
static void zero_gates(moe_model *m) {
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const moe_param *g = &m->table.params[m->table.layer[l].gate];
        memset(g->data, 0, (size_t)g->numel * sizeof(float));
    }
    moe_model_params_written(m);
}

static double max_abs(const float *a, int64_t n) {
    double mx = 1e-30;
    for (int64_t i = 0; i < n; i++)
        mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
    return mx;
}

static void run_case(const char *name, moe_recipe recipe, moe_recompute rc, int zero_gate,
                     double tol) {
    moe_model_config cfg = config();
    if (recipe == MOE_RECIPE_MXFP8) /* whole blocks of 32: the expert rows travel as MXFP8 */
        cfg.hidden_size = 32, cfg.intermediate_size = 64;
    moe_err err;
    moe_err_clear(&err);
    int32_t tok[P][B * T], tgt[P][B * T];
    uint64_t s = 5;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < B * T; i++) {
            tok[r][i] = (int32_t)gc_uniform(&s, 0, 29);
            tgt[r][i] = i % 7 == 2 ? -1 : (int32_t)gc_uniform(&s, 0, 29);
        }
    /* one model with every expert, both micro-batches in turn */
    moe_model one;
    if (moe_model_create(&one, &cfg, recipe, rc, moe_backend_cpu(), B, T, &err) != MOE_OK) {
        CHECK_MSG(0, "%s: create: %s", name, err.msg);
        return;
    }
    moe_model_init_weights(&one, 3);
    if (zero_gate) zero_gates(&one);
    moe_step_stats ref[P];
    int64_t L = cfg.num_hidden_layers, E = cfg.num_local_experts, load[P][8];
    for (int r = 0; r < P; r++) {
        CHECK(moe_model_forward(&one, tok[r], tgt[r], NULL, B, T, &ref[r], &err) == MOE_OK);
        memcpy(load[r], one.expert_tokens, (size_t)(L * E) * sizeof(int64_t));
        CHECK(moe_model_backward(&one, 0.5f, &err) == MOE_OK);
    }
    /* the expert group: two models, two threads */
    xchg x;
    pthread_barrier_init(&x.bar, NULL, P);
    rank_ctx rk[P];
    memset(rk, 0, sizeof rk);
    for (int r = 0; r < P; r++) {
        rk[r].x = &x, rk[r].rank = r, rk[r].tok = tok[r], rk[r].tgt = tgt[r];
        moe_model_ep ep = {.rank = r, .size = P, .alltoallv = thread_a2a, .ctx = &rk[r]};
        CHECK(moe_model_create_ep(&rk[r].model, &cfg, recipe, rc, moe_backend_cpu(), B, T, &ep,
                                  &err) == MOE_OK);
        moe_model_init_weights(&rk[r].model, 3); /* by (seed, name): the same values */
        if (zero_gate) zero_gates(&rk[r].model);
        CHECK_INT_EQ(rk[r].model.table.e0, 2 * r);
        CHECK_INT_EQ(rk[r].model.table.e1, 2 * r + 2);
    }
    pthread_t th[P];
    for (int r = 0; r < P; r++)
        pthread_create(&th[r], NULL, rank_main, &rk[r]);
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&x.bar);
    for (int r = 0; r < P; r++) {
        CHECK_MSG(rk[r].fwd == MOE_OK && rk[r].bwd == MOE_OK, "%s rank %d: %s", name, r,
                  rk[r].err.msg);
        CHECK_NEAR(rk[r].st.loss, ref[r].loss, 1e-6 * ref[r].loss);
        CHECK_NEAR(rk[r].st.aux_loss, ref[r].aux_loss, 1e-6 * ref[r].aux_loss);
        CHECK_NEAR(rk[r].st.z_loss, ref[r].z_loss, 1e-6 * ref[r].z_loss + 1e-12);
        for (int64_t i = 0; i < L * E; i++)
            CHECK_INT_EQ(rk[r].st.expert_tokens[i], load[r][i]);
    }
    if (zero_gate) /* experts 2 and 3 (rank 1's) got nothing */
        for (int r = 0; r < P; r++)
            for (int64_t l = 0; l < L; l++)
                CHECK(load[r][l * E + 2] == 0 && load[r][l * E + 3] == 0);
    /* gradients: dense summed over the ranks, experts from their owner */
    const moe_param_table *t1 = &one.table;
    float *g1 = malloc((size_t)t1->n_elems * sizeof(float));
    moe_model_copy_grads_to_host(&one, g1);
    float *g[P];
    for (int r = 0; r < P; r++) {
        g[r] = malloc((size_t)rk[r].model.table.n_elems * sizeof(float));
        moe_model_copy_grads_to_host(&rk[r].model, g[r]);
    }
    double worst = 0;
    for (int i = 0; i < t1->n_params; i++) {
        const moe_param *p = &t1->params[i];
        double mx = max_abs(g1 + p->offset, p->numel), d = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            double v = 0;
            for (int r = 0; r < P; r++) {
                int k = moe_param_table_find(&rk[r].model.table, p->name);
                if (k >= 0) v += g[r][rk[r].model.table.params[k].offset + j];
            }
            d = fmax(d, fabs(v - g1[p->offset + j]) / mx);
        }
        CHECK_MSG(d <= tol, "%s: gradient of %s differs by %.3g of its largest value", name,
                  p->name, d);
        worst = fmax(worst, d);
    }
    printf("%s: gradients within %.2g\n", name, worst);
    for (int r = 0; r < P; r++) {
        free(g[r]);
        moe_model_free(&rk[r].model);
    }
    free(g1);
    moe_model_free(&one);
}

int main(void) {
    run_case("fp32 random routing", MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, 0, 1e-5);
    run_case("fp32 all to rank 0, recompute full", MOE_RECIPE_FP32, MOE_RECOMPUTE_FULL, 1, 1e-5);
    run_case("bf16 recompute moe", MOE_RECIPE_BF16, MOE_RECOMPUTE_MOE, 0, 1e-3);
    run_case("mxfp8", MOE_RECIPE_MXFP8, MOE_RECOMPUTE_NONE, 0, 1e-3);
    return test_summary("model_ep");
}
