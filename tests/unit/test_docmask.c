/* test_docmask: the document mask of the whole model (train.document_mask) on the CPU backend
 * in fp32. With the separator set, a packed batch computes what its documents compute alone:
 * the per-token log-probabilities, the cross-entropy and every parameter gradient (the
 * router's aux and z losses, which pool all tokens of a micro-batch, are switched off so that
 * the losses add up); the recompute modes keep that; without the mask the later documents
 * see their predecessors and their log-probabilities change. Also the separator's checks.
 *
 * Tolerance: both sides run the same ops on the same values; only the matrix products'
 * blocking differs with the number of rows (OpenBLAS), measured at about 1e-7 relative.
 * 2e-5 absolute on log-probabilities of ~2.4 nats and 1e-4 relative on gradients is ~100x
 * that, while the unmasked model differs by more than 1e-2. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 24, V = 11, SEP = 2 };
/* document lengths per row (the last one cut by the row end, without a separator) */
static const int k_lens[B][5] = {{5, 1, 9, 9, 0}, {12, 3, 1, 8, 0}};
static int32_t tokens[B * T], targets[B * T];

/* test_tiny_config without the router losses: they pool the tokens of a micro-batch */
static moe_model_config tiny_config(void) {
    moe_model_config c = test_tiny_config(0);
    c.router_aux_loss_coef = 0;
    c.router_z_loss_coef = 0;
    return c;
}

/* Random documents ending in SEP (except each row's last), and the trainer's targets under
 * the mask: the next token, -1 after a separator; the row's last target is random. */
static void make_batch(void) {
    uint64_t s = 91;
    for (int b = 0; b < B; b++)
        for (int d = 0, t = 0; k_lens[b][d]; t += k_lens[b][d], d++)
            for (int i = 0; i < k_lens[b][d]; i++) {
                int last = i == k_lens[b][d] - 1 && t + k_lens[b][d] < T;
                int32_t x = (int32_t)gc_uniform(&s, 3, V); /* never SEP */
                tokens[b * T + t + i] = last ? SEP : x;
            }
    for (int i = 0; i < B * T; i++)
        targets[i] = i % T == T - 1     ? (int32_t)gc_uniform(&s, 3, V)
                     : tokens[i] == SEP ? -1
                                        : tokens[i + 1];
}

static moe_model *new_model(moe_recompute rc) {
    moe_model_config c = tiny_config();
    moe_model *m = calloc(1, sizeof *m);
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(m, &c, MOE_RECIPE_FP32, rc, moe_backend_cpu(), B, T, &err) == MOE_OK);
    moe_model_init_weights(m, 7);
    return m;
}

static void free_model(moe_model *m) {
    moe_model_free(m);
    free(m);
}

/* max |a - b| over n values, and max |b| */
static double maxdiff(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i])), s = fmax(s, fabs((double)b[i]));
    if (scale) *scale = s;
    return d;
}

/* The packed batch: log-probabilities lp [B, T], gradients grad [n_params] of one backward
 * at grad_scale 1 and the step's token count. */
static void run_packed(moe_model *m, float *lp, float *grad, double *ntok) {
    moe_err err;
    moe_err_clear(&err);
    moe_step_stats st;
    CHECK(moe_model_logprobs(m, tokens, targets, B, T, lp, &err) == MOE_OK);
    moe_model_zero_grad(m);
    CHECK(moe_model_forward(m, tokens, targets, NULL, B, T, &st, &err) == MOE_OK);
    CHECK(moe_model_backward(m, 1.0f, &err) == MOE_OK);
    moe_model_copy_grads_to_host(m, grad);
    *ntok = st.n_tokens;
}

/* Each document alone (one row of its own length): its log-probabilities into lp [B, T] at
 * its positions, and the sum over documents of (its tokens / ntok) x its gradient, which is
 * the gradient of the packed mean cross-entropy. */
static void run_alone(moe_model *m, float *lp, float *grad, double ntok) {
    moe_err err;
    moe_err_clear(&err);
    moe_model_zero_grad(m);
    for (int b = 0; b < B; b++)
        for (int d = 0, t = 0; k_lens[b][d]; t += k_lens[b][d], d++) {
            const int32_t *tk = tokens + b * T + t, *tg = targets + b * T + t;
            int n = k_lens[b][d];
            moe_step_stats st;
            CHECK(moe_model_logprobs(m, tk, tg, 1, n, lp + b * T + t, &err) == MOE_OK);
            CHECK(moe_model_forward(m, tk, tg, NULL, 1, n, &st, &err) == MOE_OK);
            if (st.n_tokens > 0)
                CHECK(moe_model_backward(m, (float)(st.n_tokens / ntok), &err) == MOE_OK);
        }
    moe_model_copy_grads_to_host(m, grad);
}

static void test_packed_equals_alone(void) {
    moe_model *m = new_model(MOE_RECOMPUTE_NONE);
    CHECK_INT_EQ(m->doc_sep, -1); /* off until the trainer sets it */
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_set_document_separator(m, SEP, &err) == MOE_OK);
    int64_t np = moe_model_n_params(m);
    float lp[B * T], lp1[B * T], lp_off[B * T];
    float *g = calloc((size_t)np, sizeof(float)), *g1 = calloc((size_t)np, sizeof(float));
    float *gfull = calloc((size_t)np, sizeof(float));
    double ntok, scale;
    run_packed(m, lp, g, &ntok);
    run_alone(m, lp1, g1, ntok);
    double dl = maxdiff(lp, lp1, B * T, NULL), dg = maxdiff(g, g1, np, &scale);
    printf("packed vs alone: log-prob max diff %.3g, gradient max diff %.3g (max |g| %.3g)\n", dl,
           dg, scale);
    CHECK_MSG(dl < 2e-5, "log-probabilities: packed and alone differ by %g", dl);
    CHECK_MSG(dg < 1e-4 * scale, "gradients: packed and alone differ by %g (max %g)", dg, scale);
    CHECK(scale > 1e-3);

    /* full recomputation rebuilds the attention blocks under the same mask: same bits */
    moe_model *mf = new_model(MOE_RECOMPUTE_FULL);
    CHECK(moe_model_set_document_separator(mf, SEP, &err) == MOE_OK);
    float lpf[B * T];
    double ntf;
    run_packed(mf, lpf, gfull, &ntf);
    CHECK(memcmp(gfull, g, (size_t)np * sizeof(float)) == 0);
    free_model(mf);

    /* mask off: the first document of each row is unchanged, the later ones see the earlier */
    CHECK(moe_model_set_document_separator(m, -1, &err) == MOE_OK);
    CHECK(moe_model_logprobs(m, tokens, targets, B, T, lp_off, &err) == MOE_OK);
    double first = 0, later = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double d = fabs((double)lp_off[b * T + t] - lp[b * T + t]);
            if (t < k_lens[b][0])
                first = fmax(first, d);
            else
                later = fmax(later, d);
        }
    printf("mask off: first documents differ by %.3g, later ones by %.3g\n", first, later);
    CHECK_MSG(first < 2e-5, "mask off changed the first document by %g", first);
    CHECK_MSG(later > 1e-2, "mask off changed the later documents by only %g", later);
    free(g), free(g1), free(gfull);
    free_model(m);
}

static void test_separator_checks(void) {
    moe_model *m = new_model(MOE_RECOMPUTE_NONE);
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_set_document_separator(m, V, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "separator") != NULL);
    moe_err_clear(&err);
    CHECK(moe_model_set_document_separator(m, -2, &err) == MOE_ERR_INPUT);
    CHECK_INT_EQ(m->doc_sep, -1);
    free_model(m);
    moe_model_config c = tiny_config();
    moe_model fo;
    moe_err_clear(&err);
    CHECK(moe_model_create_forward_only(&fo, &c, MOE_RECIPE_FP32, moe_backend_cpu(), B, T, &err) ==
          MOE_OK);
    CHECK(moe_model_set_document_separator(&fo, SEP, &err) == MOE_ERR_RUNTIME);
    moe_err_clear(&err);
    CHECK(moe_model_set_document_separator(&fo, -1, &err) == MOE_OK);
    moe_model_free(&fo);
}

int main(void) {
    make_batch();
    test_packed_equals_alone();
    test_separator_checks();
    return test_summary("test_docmask");
}
