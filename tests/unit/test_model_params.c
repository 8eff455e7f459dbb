/* test_model_params: the one parameter table (moe/model_params.h). Dense tensors come
 * first and form one contiguous element range; each (layer, kind) of the expert part is a
 * contiguous block of the local experts in expert order (what the grouped matmul takes); a
 * narrowed expert range [e0, e1) keeps the dense part and gives exactly the names and
 * offsets of those experts; the table is the model's (moe_model_create), tied and untied;
 * the Hugging Face order puts every layer's experts right after its dense tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/model.h"
#include "moe/model_params.h"
#include "testlib.h"

static void small(moe_model_config *c, int tied) {
    moe_config cfg;
    moe_config_defaults(&cfg);
    *c = cfg.model;
    c->vocab_size = 24;
    c->hidden_size = 16;
    c->intermediate_size = 12;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->num_local_experts = 4;
    c->num_experts_per_tok = 2;
    c->max_position_embeddings = 8;
    c->tie_word_embeddings = tied;
}

/* Dense first, offsets contiguous in table order, expert blocks per (layer, kind). */
static void check_order(const moe_param_table *t, const moe_model_config *c) {
    int64_t off = 0;
    for (int i = 0; i < t->n_params; i++) {
        const moe_param *p = &t->params[i];
        CHECK_MSG(p->offset == off, "%s at %lld, expected %lld", p->name, (long long)p->offset,
                  (long long)off);
        off += p->numel;
        CHECK_INT_EQ(p->kind == MOE_PARAM_DENSE, i < t->n_dense);
        CHECK_INT_EQ(p->expert < 0, i < t->n_dense);
        CHECK(p->dtype == MOE_DTYPE_F32);
    }
    CHECK_INT_EQ(off, t->n_elems);
    CHECK_INT_EQ(t->params[t->n_dense - 1].offset + t->params[t->n_dense - 1].numel,
                 t->dense_elems);
    int64_t EL = t->e1 - t->e0, F = c->intermediate_size, C = c->hidden_size;
    for (int l = 0; l < (int)c->num_hidden_layers; l++) {
        const moe_param_layer *li = &t->layer[l];
        int first[3] = {li->w1, li->w2, li->w3};
        for (int k = 0; k < 3; k++)
            for (int64_t j = 0; j < EL; j++) {
                const moe_param *p = &t->params[first[k] + j];
                char want[128];
                snprintf(want, sizeof want,
                         "model.layers.%d.block_sparse_moe.experts.%lld.w%d.weight", l,
                         (long long)(t->e0 + j), k + 1);
                CHECK_MSG(strcmp(p->name, want) == 0, "%s, expected %s", p->name, want);
                CHECK_INT_EQ(p->kind, MOE_PARAM_W1 + k);
                CHECK_INT_EQ(p->layer, l);
                CHECK_INT_EQ(p->shape[0], k == 1 ? C : F);
                CHECK_INT_EQ(p->shape[1], k == 1 ? F : C);
                /* one [EL, out, in] block: expert j starts j tensors into it */
                CHECK_INT_EQ(p->offset, t->params[first[k]].offset + j * F * C);
            }
        CHECK(strcmp(t->params[li->gate].name + strlen(t->params[li->gate].name) - 11,
                     "gate.weight") == 0);
        CHECK(li->gate < t->n_dense && li->ln1 < t->n_dense);
    }
}

static void check_model_table(int tied) {
    moe_model_config c;
    small(&c, tied);
    moe_err err;
    moe_err_clear(&err);
    moe_model m;
    memset(&m, 0, sizeof m);
    CHECK_INT_EQ(moe_model_create(&m, &c, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, moe_backend_cpu(), 1,
                                  4, &err),
                 MOE_OK);
    const moe_param_table *t = &m.table;
    CHECK_INT_EQ(t->e0, 0);
    CHECK_INT_EQ(t->e1, 4);
    CHECK_INT_EQ(t->n_params, 1 + 3 * 7 + 1 + !tied + 3 * 3 * 4);
    CHECK_INT_EQ(t->n_dense, 1 + 3 * 7 + 1 + !tied);
    check_order(t, &c);
    int64_t total;
    moe_model_count_params(&c, &total, NULL);
    CHECK_INT_EQ(t->n_elems, total);
    CHECK_INT_EQ(moe_param_table_find(t, "lm_head.weight") >= 0, !tied);
    CHECK_INT_EQ(t->p_lm_head == t->p_embed, tied);
    CHECK(strcmp(t->params[t->n_dense - 1].name, tied ? "model.norm.weight" : "lm_head.weight") ==
          0);
    for (int i = 0; i < t->n_params; i++)
        CHECK(t->params[i].data == m.param_mem + t->params[i].offset);
    /* Hugging Face order: embed, layer 0 (dense, then its w1, w2, w3 blocks), ..., norm */
    int *order = malloc((size_t)t->n_params * sizeof *order);
    moe_param_table_hf_order(t, order);
    CHECK_INT_EQ(order[0], t->p_embed);
    CHECK_INT_EQ(order[1], t->layer[0].ln1);
    CHECK_INT_EQ(order[8], t->layer[0].w1);
    CHECK_INT_EQ(order[8 + 4], t->layer[0].w2);
    CHECK_INT_EQ(order[8 + 12], t->layer[1].ln1);
    CHECK_INT_EQ(order[t->n_params - 1 - !tied], t->p_norm);
    free(order);
    moe_model_free(&m);
}

static void check_narrowed(void) {
    moe_model_config c;
    small(&c, 0);
    moe_err err;
    moe_err_clear(&err);
    moe_param_table all, part;
    CHECK(moe_param_table_build(&all, &c, 0, 4, &err) == MOE_OK);
    CHECK(moe_param_table_build(&part, &c, 2, 4, &err) == MOE_OK); /* rank 1 of ep 2 */
    CHECK_INT_EQ(part.n_dense, all.n_dense);
    CHECK_INT_EQ(part.dense_elems, all.dense_elems);
    CHECK_INT_EQ(part.n_params, part.n_dense + 3 * 3 * 2);
    check_order(&part, &c);
    for (int i = 0; i < part.n_dense; i++)
        CHECK(strcmp(part.params[i].name, all.params[i].name) == 0 &&
              part.params[i].offset == all.params[i].offset);
    /* the expert part holds exactly experts 2 and 3, each rank 1's under ep 2 */
    int64_t FC = c.intermediate_size * c.hidden_size;
    CHECK_INT_EQ(part.n_elems, part.dense_elems + 3 * 3 * 2 * FC);
    const moe_param *p = &part.params[part.n_dense];
    CHECK(strcmp(p->name, "model.layers.0.block_sparse_moe.experts.2.w1.weight") == 0);
    CHECK_INT_EQ(p->offset, part.dense_elems);
    p = &part.params[part.n_dense + 3];
    CHECK(strcmp(p->name, "model.layers.0.block_sparse_moe.experts.3.w2.weight") == 0);
    CHECK_INT_EQ(p->offset, part.dense_elems + 3 * FC);
    p = &part.params[part.layer[2].w3 + 1];
    CHECK(strcmp(p->name, "model.layers.2.block_sparse_moe.experts.3.w3.weight") == 0);
    CHECK_INT_EQ(p->offset, part.n_elems - FC);
    for (int i = part.n_dense; i < part.n_params; i++)
        CHECK_INT_EQ(moe_param_rank(&part.params[i], 4, 2), 1);
    CHECK_INT_EQ(moe_param_rank(&part.params[0], 4, 2), 0);
    CHECK_INT_EQ(moe_param_table_find(&part, "model.layers.0.block_sparse_moe.experts.1.w1.weight"),
                 -1);
    moe_param_table bad;
    CHECK(moe_param_table_build(&bad, &c, 3, 3, &err) == MOE_ERR_INPUT);
    CHECK(moe_param_table_build(&bad, &c, 0, 5, &err) == MOE_ERR_INPUT);
    moe_param_table_free(&bad);
    moe_param_table_free(&all);
    moe_param_table_free(&part);
}

int main(void) {
    check_model_table(0);
    check_model_table(1);
    check_narrowed();
    return test_summary("model_params");
}
