/* test_fp8_copies: the fp8-block weight copies of a model (model_copies.c) are exactly
 * quantize(master) at every point the products read them.
 *
 * A small model with several 128 x 128 tiles per weight and short edge tiles, under
 * fp8-block and its pow2 rule, layer 1 in skip_layers: after the first forward (the refresh
 * from the initial masters) and after an AdamW step (the copies the step writes), every
 * quantized weight's row-wise and transposed e4m3 bytes and both scale layouts equal what
 * this file computes from the host copy of the master with the rule of docs/dtypes.md
 * (amax / 448 of a tile's finite values, or its power-of-two rounding up; e4m3 saturating);
 * the skipped layer has no copies. The one thing a reader must know: the reference below
 * shares nothing with the library's quantizers but the dtype conversions, which unit.dtype
 * checks bit for bit. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "model/model_internal.h"
#include "moe/dtype.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 16 };

/* test_tiny_config with weights of several tiles, the last ones short. */
static moe_model_config config(void) {
    moe_model_config c = test_tiny_config(0);
    c.hidden_size = 136; /* two tiles, the second 8 wide */
    c.intermediate_size = 264;
    c.num_hidden_layers = 3;
    c.num_local_experts = 3;
    c.max_position_embeddings = 64;
    return c;
}

/* The scale of tile (rb, kb) of w [R, K] under the rule (pow2 or amax / 448, at least 2^-126). */
static float ref_scale(const float *w, int64_t R, int64_t K, int64_t rb, int64_t kb, int pow2) {
    float amax = 0.0f;
    for (int64_t r = rb * 128; r < R && r < rb * 128 + 128; r++)
        for (int64_t k = kb * 128; k < K && k < kb * 128 + 128; k++)
            if (isfinite(w[r * K + k]) && fabsf(w[r * K + k]) > amax) amax = fabsf(w[r * K + k]);
    if (!(amax > 0.0f)) return 1.0f;
    float s = fmaxf(amax / 448.0f, FLT_MIN); /* at least 2^-126 */
    return pow2 ? moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(s)) : s;
}

/* Mismatches between the copies (q [2 E O I], s, host) of w [E, O, I] (host master) and the
 * reference: values and scales, row-wise and transposed. */
static int64_t copy_mismatches(const uint8_t *q, const float *s, const float *w, int64_t E,
                               int64_t O, int64_t I, int pow2) {
    int64_t bad = 0, OB = (O + 127) / 128, IB = (I + 127) / 128;
    int64_t IB4 = (IB + 3) / 4 * 4, OB4 = (OB + 3) / 4 * 4;
    const float *st = s + E * OB * IB4; /* the transposed copy's scales [E, IB * OB4] */
    for (int64_t e = 0; e < E; e++) {
        const float *we = w + e * O * I;
        const uint8_t *qe = q + e * O * I, *qte = q + (E + e) * O * I;
        for (int64_t ob = 0; ob < OB; ob++)
            for (int64_t ib = 0; ib < IB; ib++) {
                float sc = ref_scale(we, O, I, ob, ib, pow2);
                bad += s[e * OB * IB4 + ob * IB4 + ib] != sc;
                bad += st[e * IB * OB4 + ib * OB4 + ob] != sc;
                const float rcp = 1.0f / sc; /* each value times the tile's reciprocal */
                for (int64_t o = ob * 128; o < O && o < ob * 128 + 128; o++)
                    for (int64_t i = ib * 128; i < I && i < ib * 128 + 128; i++) {
                        uint8_t b = moe_f32_to_e4m3(we[o * I + i] * rcp, 1);
                        bad += qe[o * I + i] != b;
                        bad += qte[i * O + o] != b;
                    }
            }
    }
    return bad;
}

/* Checks every quantized weight of m against its master (host copy `host` of param_mem). */
static void check_copies(const moe_model *m, const float *host, int pow2, const char *when) {
    const moe_param_table *t = &m->table;
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        const moe_param_layer *li = &t->layer[l];
        const int idx[7] = {li->q, li->k, li->v, li->o, li->w1, li->w3, li->w2};
        for (int j = 0; j < 7; j++) {
            const moe_param *p = &t->params[idx[j]];
            if (l == 1) { /* in skip_layers */
                CHECK_MSG(!p->data8 && !p->scale8, "%s: skipped layer 1 has copies of %s", when,
                          p->name);
                continue;
            }
            int64_t E = j < 4 ? 1 : t->e1 - t->e0, O = p->shape[0], I = p->shape[1];
            CHECK_MSG(p->data8 && p->scale8, "%s: %s has no fp8 copies", when, p->name);
            if (!p->data8) continue;
            int64_t bad = copy_mismatches(p->data8, p->scale8, host + p->offset, E, O, I, pow2);
            CHECK_MSG(bad == 0, "%s (%s): %lld bytes or scales of %s differ from quantize(master)",
                      when, pow2 ? "pow2" : "amax", (long long)bad, p->name);
        }
        const moe_param *g = &t->params[li->gate]; /* the router stays unquantized */
        CHECK(!g->data8);
    }
    CHECK(!t->params[t->p_lm_head].data8 && !t->params[t->p_embed].data8);
}

static void test_copies(int pow2) {
    moe_model_config cfg = config();
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    moe_recipe r = pow2 ? MOE_RECIPE_FP8_BLOCK_POW2 : MOE_RECIPE_FP8_BLOCK;
    const moe_backend *be = moe_backend_cpu();
    if (moe_model_create(&m, &cfg, r, MOE_RECOMPUTE_NONE, be, B, T, &err) != MOE_OK) {
        CHECK_MSG(0, "create: %s", err.msg);
        return;
    }
    const uint8_t skip[3] = {0, 1, 0};
    CHECK(moe_model_set_skip_layers(&m, skip, &err) == MOE_OK);
    moe_model_init_weights(&m, 7);
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)((i * 7 + 3) % 11);
    float *host = malloc((size_t)m.table.n_elems * sizeof(float));
    CHECK(m.param8_mem == NULL); /* made by the first pass */
    moe_model_zero_grad(&m);
    CHECK(moe_model_forward(&m, tok, tok, NULL, B, T, NULL, &err) == MOE_OK);
    moe_model_copy_params_to_host(&m, host);
    check_copies(&m, host, pow2, "first forward");
    CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
    float *am = be->alloc(be, (size_t)m.table.n_elems * sizeof(float));
    float *av = be->alloc(be, (size_t)m.table.n_elems * sizeof(float));
    moe_optim_config opt = test_optim(0.1);
    moe_model_adamw(&m, 0, m.table.n_elems, moe_buf_f32(am), moe_buf_f32(av), &opt, 1e-2, 1, 1.0f);
    CHECK(!m.copies_stale); /* written by the step itself, not left to the next refresh */
    moe_model_copy_params_to_host(&m, host);
    check_copies(&m, host, pow2, "after adamw");
    /* a step over a range that cuts a weight leaves the copies to the next pass */
    int64_t lo = m.table.params[m.table.layer[0].q].offset + 1;
    moe_model_adamw(&m, lo, m.table.n_elems, moe_buf_f32(am + lo), moe_buf_f32(av + lo), &opt, 1e-2,
                    2, 1.0f);
    CHECK(m.copies_stale);
    CHECK(moe_model_forward(&m, tok, tok, NULL, B, T, NULL, &err) == MOE_OK);
    moe_model_copy_params_to_host(&m, host);
    check_copies(&m, host, pow2, "after a cut range");
    be->free(be, am), be->free(be, av);
    free(host);
    moe_model_free(&m);
}

int main(void) {
    test_copies(0);
    test_copies(1);
    return test_summary("test_fp8_copies");
}
