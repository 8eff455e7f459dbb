/* test_kv_cache: cached keys of the whole model (moe_model_logprobs_kv) on the CPU backend,
 * what moe-score variants runs an ALT window with. A pass continuing rows of a cache after P
 * positions gives its tokens the log-probabilities a pass over the whole rows gives them -
 * fp32 and the bf16 recipe, P from 1 to a whole row, rows continuing any cache
 * row in any order, and continued rows whose tokens differ from the cached row's after P (an
 * ALT window: only its prefix is shared) - and bad uses are MOE_ERR_INPUT.
 *
 * Every op but attention is per token with a fixed reduction order, and attention walks a
 * continued query's keys in the blocks the whole pass walks: bf16 is equal bit for bit. In
 * fp32 OpenBLAS's blocking depends on the number of rows of a product (the continued pass
 * has fewer), measured at up to 1.2e-6 on log-probabilities of about 2.4 nats: 2e-5 is the
 * bound, and the same rows scored without their cached prefix differ by more than 1e-3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 3, T = 30 };

/* Tokens [rows, T]: random in [0, V); targets the next token, the last -1. */
static void make_rows(int32_t *tok, int32_t *tgt, int rows, int64_t V, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < rows * T; i++)
        tok[i] = (int32_t)gc_uniform(&s, 0, (double)V);
    for (int i = 0; i < rows * T; i++)
        tgt[i] = i % T == T - 1 ? -1 : tok[i + 1];
}

static void test_continue(moe_recipe recipe) {
    moe_model_config cfg = test_tiny_config(0);
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    moe_status st = moe_model_create_forward_only(&m, &cfg, recipe, moe_backend_cpu(), B, T, &err);
    CHECK_MSG(st == MOE_OK, "create: %s", err.msg);
    if (st != MOE_OK) return;
    moe_model_init_weights(&m, 5);
    int32_t tok[B * T], tgt[B * T], alt[B * T], alt_tgt[B * T];
    make_rows(tok, tgt, B, cfg.vocab_size, 11);
    make_rows(alt, alt_tgt, B, cfg.vocab_size, 12);
    float lp[B * T], whole[B * T], part[B * T];
    moe_kv_cache c;
    CHECK(moe_kv_cache_create(&c, &m, B * T, &err) == MOE_OK);
    moe_kv_use save = {&c, NULL, NULL, 0};
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, B, T, &save, lp, &err) == MOE_OK);
    CHECK(c.T == T && c.rows == B);
    CHECK(moe_model_logprobs(&m, tok, tgt, B, T, whole, &err) == MOE_OK);
    CHECK_MSG(memcmp(lp, whole, sizeof lp) == 0, "saving changed the log-probabilities");

    /* continued rows src = {2, 0, 1}: row b is cache row src[b]'s first P tokens followed by
     * alt's row b (an ALT window), scored from position P on */
    const int32_t src[B] = {2, 0, 1};
    const int64_t Ps[] = {1, 7, 16, 23, T - 1};
    for (int i = 0; i < 5; i++) {
        int64_t P = Ps[i], n = T - P;
        int32_t full[B * T], full_tgt[B * T], sfx[B * T], sfx_tgt[B * T];
        for (int b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                full[b * T + t] = t < P ? tok[src[b] * T + t] : alt[b * T + t];
                full_tgt[b * T + t] = t == T - 1  ? -1
                                      : t + 1 < P ? tok[src[b] * T + t + 1]
                                                  : alt[b * T + t + 1];
            }
        for (int b = 0; b < B; b++) {
            memcpy(sfx + b * n, full + b * T + P, (size_t)n * sizeof(int32_t));
            memcpy(sfx_tgt + b * n, full_tgt + b * T + P, (size_t)n * sizeof(int32_t));
        }
        CHECK(moe_model_logprobs(&m, full, full_tgt, B, T, whole, &err) == MOE_OK);
        moe_kv_use use = {NULL, &c, src, P};
        CHECK(moe_model_logprobs_kv(&m, sfx, sfx_tgt, B, (int)n, &use, part, &err) == MOE_OK);
        double worst = 0.0;
        for (int b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++)
                worst = fmax(worst, fabs((double)part[b * n + t] - whole[b * T + P + t]));
        CHECK_MSG(worst <= 2e-5,
                  "recipe %d, P = %lld: continued rows differ from the whole rows "
                  "by up to %g",
                  (int)recipe, (long long)P, worst);
        /* the prefix matters: the suffix alone (no cached keys) scores differently (P = T - 1
         * leaves one position, whose target is -1) */
        if (n == 1) continue;
        CHECK(moe_model_logprobs(&m, sfx, sfx_tgt, B, (int)n, whole, &err) == MOE_OK);
        double apart = 0.0;
        for (int64_t j = 0; j < B * n; j++)
            apart = fmax(apart, fabs((double)part[j] - whole[j]));
        CHECK_MSG(apart > 1e-3, "P = %lld: the cached prefix changed nothing (%g)", (long long)P,
                  apart);
    }

    /* bad uses */
    moe_kv_use none = {NULL, NULL, NULL, 0}, both = {&c, &c, src, 1};
    moe_kv_use far = {NULL, &c, src, T + 1}, zero = {NULL, &c, src, 0};
    const int32_t bad_src[B] = {0, 3, 1};
    moe_kv_use bad_row = {NULL, &c, bad_src, 4};
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, B, T, &none, lp, &err) == MOE_ERR_INPUT);
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, B, T, &both, lp, &err) == MOE_ERR_INPUT);
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, 1, 4, &far, lp, &err) == MOE_ERR_INPUT);
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, 1, 4, &zero, lp, &err) == MOE_ERR_INPUT);
    moe_err_clear(&err);
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, B, 4, &bad_row, lp, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "cache row 3") != NULL, "message: %s", err.msg);
    /* continuing rows longer than the cache's work buffers hold */
    moe_kv_use big = {NULL, &c, src, T - 1};
    CHECK(moe_model_logprobs_kv(&m, tok, tgt, B, 2, &big, lp, &err) == MOE_ERR_INPUT);
    moe_kv_cache_free(&c, &m);
    moe_model_free(&m);
}

int main(void) {
    test_continue(MOE_RECIPE_FP32);
    test_continue(MOE_RECIPE_BF16);
    return test_summary("test_kv_cache");
}
