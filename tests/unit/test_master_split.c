/* test_master_split: optim.master split on the CPU backend (moe_model_set_master).
 *
 * 1. Layout: the norms, the embedding table and the router gates keep fp32 masters (packed in
 *    param_mem), every other tensor is its bf16 copy plus a low half; init and the host copies
 *    in and out give the fp32-master model's bytes exactly (tied and untied lm_head), and
 *    moe_model_f32_masters_before counts what the layout packs.
 * 2. The copies: loaded with many ties, a split model's bf16 copies round them away from zero
 *    where the fp32-master model's round to even, and nowhere else; the copies of the fp32
 *    masters (the tied embedding's, read by lm_head) are the same.
 * 3. AdamW: moe_model_adamw on a split model, whole or cut into ZeRO-like ranges that split
 *    tensors, gives bit for bit the masters the op gives on the host copy of the fp32 masters
 *    with the same gradients and moments (runs of fp32 and split masters, decay changes,
 *    bf16 expert gradients).
 * 4. Refusals: another recipe, a forward-only model, an unknown value; back to fp32 works. */
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "model/model_internal.h"
#include "moe/dtype.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 9 };

static void batch(int32_t *tok, int32_t *tgt) {
    uint64_t s = 5;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)gc_uniform(&s, 0, 11), tgt[i] = (int32_t)gc_uniform(&s, 0, 11);
}

/* A training model of cfg under recipe, its masters kept as master says: returns
 * moe_model_set_master's status (the model exists either way: free it). */
static moe_status create_as(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                            moe_master master, moe_err *err) {
    moe_err_clear(err);
    CHECK(moe_model_create(m, cfg, recipe, MOE_RECOMPUTE_NONE, moe_backend_cpu(), B, T, err) ==
          MOE_OK);
    return moe_model_set_master(m, master, err);
}

/* A bf16 training model with master as its masters. */
static void create(moe_model *m, const moe_model_config *cfg, moe_master master) {
    moe_err err;
    CHECK(create_as(m, cfg, MOE_RECIPE_BF16, master, &err) == MOE_OK);
}

static void test_layout(int tied) {
    moe_model_config cfg = test_tiny_config(tied);
    moe_model a, s;
    create(&a, &cfg, MOE_MASTER_FP32);
    create(&s, &cfg, MOE_MASTER_SPLIT);
    moe_model_init_weights(&a, 7);
    moe_model_init_weights(&s, 7);
    const moe_param_table *t = &s.table;
    int64_t n = t->n_elems, f32 = 0;
    for (int i = 0; i < t->n_params; i++) {
        const moe_param *p = &t->params[i];
        int keep =
            p->ndim == 1 || i == t->p_embed || (p->layer >= 0 && t->layer[p->layer].gate == i);
        CHECK_MSG((p->data != NULL) == keep && (p->lo16 != NULL) == !keep && p->data16,
                  "%s: data %p lo16 %p", p->name, (void *)p->data, (void *)p->lo16);
        f32 += keep ? p->numel : 0;
    }
    CHECK_INT_EQ(s.param_elems, f32);
    CHECK(f32 > 0 && f32 < n / 4 && s.param_lo_mem && !a.param_lo_mem && a.param_elems == n);
    for (int64_t x = 0; x <= n; x += 37) { /* the fp32 elements before x, counted here */
        int64_t want = 0;
        for (int i = 0; i < t->n_params; i++) {
            const moe_param *p = &t->params[i];
            for (int64_t j = 0; p->data && j < p->numel; j++)
                want += p->offset + j < x;
        }
        CHECK_INT_EQ(moe_model_f32_masters_before(&s, x), want);
        CHECK_INT_EQ(moe_model_f32_masters_before(&a, x), x);
    }
    float *ha = malloc((size_t)n * 4), *hs = malloc((size_t)n * 4);
    moe_model_copy_params_to_host(&a, ha);
    moe_model_copy_params_to_host(&s, hs);
    CHECK_MSG(memcmp(ha, hs, (size_t)n * 4) == 0, "init: split masters differ (tied %d)", tied);
    for (int64_t i = 0; i < n; i += 3) /* other values, through the host path */
        ha[i] = -ha[i] * 1.5f;
    moe_model_copy_params_from_host(&s, ha);
    moe_model_copy_params_to_host(&s, hs);
    CHECK(memcmp(ha, hs, (size_t)n * 4) == 0);
    /* a split tensor's copy is its master's high half */
    const moe_param *w = &t->params[t->layer[1].w2];
    for (int64_t j = 0; j < w->numel; j++) {
        uint16_t hi, lo;
        moe_f32_split_bf16(ha[w->offset + j], &hi, &lo);
        CHECK(w->data16[j] == hi && w->lo16[j] == lo);
    }
    free(ha), free(hs);
    moe_model_free(&a);
    moe_model_free(&s);
}

/* Ties (low 16 bits 0x8000) in every tensor: the copies the forward reads. */
static void test_copies(void) {
    moe_model_config cfg = test_tiny_config(1);
    moe_model a, s;
    create(&a, &cfg, MOE_MASTER_FP32);
    create(&s, &cfg, MOE_MASTER_SPLIT);
    moe_model_init_weights(&a, 3);
    int64_t n = a.table.n_elems;
    float *h = malloc((size_t)n * 4);
    moe_model_copy_params_to_host(&a, h);
    for (int64_t i = 0; i < n; i += 2)
        h[i] = moe_f32_from_bits((moe_f32_bits(h[i]) & 0xffff0000u) | 0x8000u);
    moe_model_copy_params_from_host(&a, h);
    moe_model_copy_params_from_host(&s, h);
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt);
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_forward(&a, tok, tgt, NULL, B, T, NULL, &err) == MOE_OK); /* refreshes */
    CHECK(moe_model_forward(&s, tok, tgt, NULL, B, T, NULL, &err) == MOE_OK);
    int64_t away = 0, bad = 0;
    for (int i = 0; i < a.table.n_params; i++) {
        const moe_param *pa = &a.table.params[i], *ps = &s.table.params[i];
        for (int64_t j = 0; j < pa->numel; j++) {
            uint16_t ca = pa->data16[j], cs = ps->data16[j];
            uint32_t u = moe_f32_bits(h[pa->offset + j]);
            int tie = (u & 0xffffu) == 0x8000u;
            if (ps->data) /* an fp32 master: the same copy */
                bad += ca != cs;
            else if (tie && ca == u >> 16) /* to even stayed below: away went up */
                bad += cs != ca + 1, away++;
            else
                bad += cs != ca;
        }
    }
    CHECK_MSG(bad == 0, "%lld copies differ other than at ties", (long long)bad);
    CHECK(away > n / 8);
    free(h);
    moe_model_free(&a);
    moe_model_free(&s);
}

/* AdamW over [ranges[k], ranges[k + 1]) on the split model against the op on host fp32
 * masters, both from the same masters, gradients and moments. */
static void test_adamw(int decay_all, moe_dtype gdt, const int64_t *ranges, int nr) {
    moe_model_config cfg = test_tiny_config(0);
    moe_model s;
    create(&s, &cfg, MOE_MASTER_SPLIT);
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_set_expert_grads(&s, gdt, &err) == MOE_OK);
    moe_model_init_weights(&s, 11);
    int64_t n = s.table.n_elems;
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt);
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    float *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4), *hm = calloc((size_t)n, 4),
          *hv = calloc((size_t)n, 4);
    moe_optim_config o = test_optim(0.1);
    o.decay_norms_and_embeddings = decay_all;
    const moe_backend *cpu = moe_backend_cpu();
    for (int64_t step = 1; step <= 3; step++) {
        moe_model_zero_grad(&s);
        CHECK(moe_model_forward(&s, tok, tgt, NULL, B, T, NULL, &err) == MOE_OK);
        CHECK(moe_model_backward(&s, 1.0f, &err) == MOE_OK);
        moe_model_copy_params_to_host(&s, p);
        moe_model_copy_grads_to_host(&s, g);
        for (int k = 0; k < nr; k++) { /* each range with moments from its own start */
            int64_t lo = ranges[k], hi = ranges[k + 1];
            moe_model_adamw(&s, lo, hi, moe_buf_f32(m + lo), moe_buf_f32(v + lo), &o, 1e-2, step,
                            0.5f);
        }
        for (int i = 0; i < s.table.n_params; i++) { /* the reference: per tensor, on the host */
            const moe_param *q = &s.table.params[i];
            int64_t at = q->offset;
            double wd = q->decay || decay_all ? 0.1 : 0.0;
            /* a bf16 gradient holds bf16 values: the host copy widened them exactly */
            cpu->adamw(cpu, p + at, NULL, NULL, moe_cbuf_f32(g + at), moe_buf_f32(hm + at),
                       moe_buf_f32(hv + at), q->numel, 1e-2f, 0.9f, 0.95f, 1e-8f, (float)wd, step,
                       0.5f);
        }
        moe_model_copy_params_to_host(&s, got);
        CHECK_MSG(memcmp(p, got, (size_t)n * 4) == 0 && memcmp(m, hm, (size_t)n * 4) == 0 &&
                      memcmp(v, hv, (size_t)n * 4) == 0,
                  "step %lld (%d ranges, decay_all %d, %s expert gradients): the split model's "
                  "AdamW differs from the op's on fp32 masters",
                  (long long)step, nr, decay_all, moe_dtype_name(gdt));
    }
    free(p), free(g), free(got), free(m), free(v), free(hm), free(hv);
    moe_model_free(&s);
}

static void test_refusals(void) {
    moe_model_config cfg = test_tiny_config(0);
    moe_model m;
    moe_err err;
    CHECK(create_as(&m, &cfg, MOE_RECIPE_FP32, MOE_MASTER_SPLIT, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "optim.master split") && strstr(err.hint, "precision.recipe: bf16"));
    moe_model_free(&m);
    moe_err_clear(&err);
    CHECK(moe_model_create_forward_only(&m, &cfg, MOE_RECIPE_BF16, moe_backend_cpu(), B, T, &err) ==
          MOE_OK);
    CHECK(moe_model_set_master(&m, MOE_MASTER_SPLIT, &err) == MOE_ERR_INPUT);
    moe_model_free(&m);
    create(&m, &cfg, MOE_MASTER_SPLIT);
    moe_err_clear(&err);
    CHECK(moe_model_set_master(&m, (moe_master)5, &err) == MOE_ERR_INPUT);
    moe_model_init_weights(&m, 1);
    moe_err_clear(&err);
    CHECK(moe_model_set_master(&m, MOE_MASTER_FP32, &err) == MOE_OK); /* zero weights again */
    CHECK(!m.param_lo_mem && m.param_elems == m.table.n_elems);
    int64_t n = m.table.n_elems, nonzero = 0;
    float *h = malloc((size_t)n * 4);
    moe_model_copy_params_to_host(&m, h);
    for (int64_t i = 0; i < n; i++)
        nonzero += h[i] != 0.0f;
    CHECK_INT_EQ(nonzero, 0);
    free(h);
    moe_model_free(&m);
}

int main(void) {
    test_layout(0);
    test_layout(1);
    test_copies();
    moe_model tmp;
    moe_model_config cfg = test_tiny_config(0);
    create(&tmp, &cfg, MOE_MASTER_SPLIT);
    const int64_t n = tmp.table.n_elems, dense = tmp.table.dense_elems;
    moe_model_free(&tmp);
    const int64_t whole[2] = {0, n};
    /* cuts inside tensors of both kinds, one at the dense / expert boundary */
    const int64_t cuts[5] = {0, 3 * n / 17, dense, dense + 101, n};
    test_adamw(1, MOE_DTYPE_F32, whole, 1);
    test_adamw(0, MOE_DTYPE_F32, whole, 1);
    test_adamw(0, MOE_DTYPE_F32, cuts, 4);
    test_adamw(1, MOE_DTYPE_BF16, cuts, 4);
    test_refusals();
    return test_summary("test_master_split");
}
