/* model_params: the one parameter table (moe/model_params.h). Dense part first, then per
 * layer and kind the block of local experts; offsets are assigned in that order, so the
 * dense part and the local experts are each one contiguous range of the flat array. */
#include "moe/model_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends tensor name of shape [d0] (ndim 1) or [d0, d1] at the next offset; returns its
 * index. t->params has room (the caller counted). */
static int add(moe_param_table *t, const char *name, int ndim, int64_t d0, int64_t d1, int decay,
               int layer, int expert, moe_param_kind kind) {
    moe_param *p = &t->params[t->n_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->numel = ndim > 1 ? d0 * d1 : d0;
    p->offset = t->n_elems;
    p->dtype = MOE_DTYPE_F32;
    p->decay = decay;
    p->layer = layer;
    p->expert = expert;
    p->kind = kind;
    t->n_elems += p->numel;
    return t->n_params++;
}

/* add() for a tensor that is not an expert weight. */
static int add_dense(moe_param_table *t, const char *name, int ndim, int64_t d0, int64_t d1,
                     int decay, int layer) {
    return add(t, name, ndim, d0, d1, decay, layer, -1, MOE_PARAM_DENSE);
}

moe_status moe_param_table_build(moe_param_table *t, const moe_model_config *c, int64_t e0,
                                 int64_t e1, moe_err *err) {
    memset(t, 0, sizeof *t);
    t->p_embed = t->p_norm = t->p_lm_head = -1;
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 ||
        c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
        c->num_local_experts <= 0 || c->hidden_size % c->num_attention_heads)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "model sizes must be positive and num_attention_heads must divide "
                           "hidden_size");
    if (e0 < 0 || e1 <= e0 || e1 > c->num_local_experts)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "local expert range [%lld, %lld) is not inside [0, %lld)", (long long)e0,
                           (long long)e1, (long long)c->num_local_experts);
    int L = (int)c->num_hidden_layers, EL = (int)(e1 - e0);
    int n = 1 + 7 * L + 1 + (c->tie_word_embeddings ? 0 : 1) + 3 * EL * L;
    t->params = calloc((size_t)n, sizeof *t->params);
    t->layer = calloc((size_t)L, sizeof *t->layer);
    if (!t->params || !t->layer) {
        moe_param_table_free(t);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory for the parameter table");
    }
    t->e0 = e0;
    t->e1 = e1;
    int64_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    int64_t D = C / c->num_attention_heads;
    int64_t HD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D;
    int64_t E = c->num_local_experts;
    char nm[128];
#define LNAME(fmt, ...) (snprintf(nm, sizeof nm, "model.layers.%d." fmt, l, __VA_ARGS__), nm)
    t->p_embed = add_dense(t, "model.embed_tokens.weight", 2, V, C, 0, -1);
    for (int l = 0; l < L; l++) {
        moe_param_layer *li = &t->layer[l];
        li->ln1 = add_dense(t, LNAME("%s", "input_layernorm.weight"), 1, C, 0, 0, l);
        li->q = add_dense(t, LNAME("%s", "self_attn.q_proj.weight"), 2, HD, C, 1, l);
        li->k = add_dense(t, LNAME("%s", "self_attn.k_proj.weight"), 2, KVD, C, 1, l);
        li->v = add_dense(t, LNAME("%s", "self_attn.v_proj.weight"), 2, KVD, C, 1, l);
        li->o = add_dense(t, LNAME("%s", "self_attn.o_proj.weight"), 2, C, HD, 1, l);
        li->ln2 = add_dense(t, LNAME("%s", "post_attention_layernorm.weight"), 1, C, 0, 0, l);
        li->gate = add_dense(t, LNAME("%s", "block_sparse_moe.gate.weight"), 2, E, C, 1, l);
    }
    t->p_norm = add_dense(t, "model.norm.weight", 1, C, 0, 0, -1);
    t->p_lm_head =
        c->tie_word_embeddings ? t->p_embed : add_dense(t, "lm_head.weight", 2, V, C, 1, -1);
    t->n_dense = t->n_params;
    t->dense_elems = t->n_elems;
    static const char *const kind_name[] = {"", "w1", "w2", "w3"};
    for (int l = 0; l < L; l++) {
        moe_param_layer *li = &t->layer[l];
        for (int k = MOE_PARAM_W1; k <= MOE_PARAM_W3; k++) {
            int at = t->n_params;
            int64_t out = k == MOE_PARAM_W2 ? C : F, in = k == MOE_PARAM_W2 ? F : C;
            for (int e = (int)e0; e < (int)e1; e++)
                add(t, LNAME("block_sparse_moe.experts.%d.%s.weight", e, kind_name[k]), 2, out, in,
                    1, l, e, (moe_param_kind)k);
            *(k == MOE_PARAM_W1 ? &li->w1 : k == MOE_PARAM_W2 ? &li->w2 : &li->w3) = at;
        }
    }
#undef LNAME
    return MOE_OK;
}

void moe_param_table_free(moe_param_table *t) {
    if (!t) return;
    free(t->params);
    free(t->layer);
    memset(t, 0, sizeof *t);
}

int moe_param_table_find(const moe_param_table *t, const char *name) {
    for (int i = 0; i < t->n_params; i++)
        if (strcmp(t->params[i].name, name) == 0) return i;
    return -1;
}

int moe_param_rank(const moe_param *p, int64_t num_experts, int ep) {
    if (p->expert < 0 || ep <= 1) return 0;
    return (int)(p->expert / (num_experts / ep));
}

void moe_param_table_hf_order(const moe_param_table *t, int *order) {
    /* embed_tokens sorts before layer 0, model.norm and lm_head after the last layer; a
     * stable pass per layer keeps the table's own order inside it (dense, then w1, w2, w3
     * blocks), which is the order of MixtralDecoderLayer's modules. */
    int L = 0, n = 0;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].layer + 1 > L) L = t->params[i].layer + 1;
    for (int l = -1; l <= L; l++)
        for (int i = 0; i < t->n_params; i++) {
            const moe_param *p = &t->params[i];
            int key = p->layer >= 0 ? p->layer : i == t->p_embed ? -1 : L;
            if (key == l) order[n++] = i;
        }
}
