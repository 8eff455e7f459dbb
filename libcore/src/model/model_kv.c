/* model_kv: cached keys and values for scoring (moe/model.h) - a logprobs pass that saves
 * every layer's keys and values, and a pass that continues rows of such a cache after their
 * first P positions, so an ALT window runs only from where it leaves its REF window.
 *
 * The one thing to know: only attention looks across positions, so a continuing pass runs
 * every other op on its own tokens alone and gives attention, per layer, its rows' cached
 * prefix keys followed by its own (moe_model_kv_layer): the same keys, at the same
 * positions (RoPE from P on), as the whole rows' pass. */
#include <string.h>

#include "model/model_internal.h"

/* Bytes of one position's keys (or values) in the attention's operand type. */
static size_t kv_row_bytes(const moe_model_config *cfg, moe_recipe recipe) {
    int64_t D = cfg->hidden_size / cfg->num_attention_heads;
    return (size_t)(cfg->num_key_value_heads * D) * moe_dtype_size(moe_model_act_dtype(recipe));
}

size_t moe_kv_cache_bytes(const moe_model_config *cfg, moe_recipe recipe, int64_t tokens) {
    /* k and v of every layer, and the two work buffers */
    return 2 * (size_t)(cfg->num_hidden_layers + 1) * (size_t)tokens * kv_row_bytes(cfg, recipe);
}

moe_status moe_kv_cache_create(moe_kv_cache *c, const moe_model *m, int64_t tokens, moe_err *err) {
    memset(c, 0, sizeof *c);
    const moe_backend *be = m->be;
    size_t row = kv_row_bytes(&m->cfg, m->recipe), L = (size_t)m->cfg.num_hidden_layers;
    c->tokens = tokens;
    c->k = be->alloc(be, L * (size_t)tokens * row);
    c->v = be->alloc(be, L * (size_t)tokens * row);
    c->wk = be->alloc(be, (size_t)tokens * row);
    c->wv = be->alloc(be, (size_t)tokens * row);
    if (c->k && c->v && c->wk && c->wv) return MOE_OK;
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                       "out of %s memory for the keys and values of %lld positions (%.2f GiB)",
                       be->name, (long long)tokens,
                       (double)moe_kv_cache_bytes(&m->cfg, m->recipe, tokens) / (1 << 30));
}

void moe_kv_cache_free(moe_kv_cache *c, const moe_model *m) {
    const moe_backend *be = m->be;
    be->free(be, c->k);
    be->free(be, c->v);
    be->free(be, c->wk);
    be->free(be, c->wv);
    memset(c, 0, sizeof *c);
}

moe_status moe_model_kv_check(const moe_model *m, const moe_kv_use *kv, int B, int T,
                              moe_err *err) {
    if (!kv->save == !kv->from)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "a pass with cached keys either saves them or continues them");
    if (m->doc_sep >= 0)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "cached keys under a document mask");
    if (kv->save) {
        if ((int64_t)B * T > kv->save->tokens)
            return moe_err_set(err, MOE_ERR_INPUT, NULL,
                               "%d rows of %d positions do not fit a cache of %lld", B, T,
                               (long long)kv->save->tokens);
        return MOE_OK;
    }
    const moe_kv_cache *c = kv->from;
    if (kv->P < 1 || kv->P > c->T || kv->P + T > m->cfg.max_position_embeddings ||
        (int64_t)B * (kv->P + T) > c->tokens)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "%d rows of %d positions after %lld cached ones do not fit (cache: "
                           "rows of %lld, %lld positions in all; model: %lld positions)",
                           B, T, (long long)kv->P, (long long)c->T, (long long)c->tokens,
                           (long long)m->cfg.max_position_embeddings);
    for (int b = 0; b < B; b++)
        if (kv->src[b] < 0 || kv->src[b] >= c->rows)
            return moe_err_set(err, MOE_ERR_INPUT, NULL,
                               "row %d continues cache row %d (the cache holds %d)", b, kv->src[b],
                               c->rows);
    return MOE_OK;
}

void moe_model_kv_layer(moe_model *m, int l, const moe_kv_use *kv, const void *k, const void *v,
                        int B, int64_t T, moe_cbuf *kc, moe_cbuf *vc, int64_t *Tk) {
    const moe_backend *be = m->be;
    const moe_dtype adt = m->acts->adt;
    const size_t row = kv_row_bytes(&m->cfg, m->recipe);
    if (kv->save) {
        moe_kv_cache *c = kv->save;
        size_t at = (size_t)l * (size_t)c->tokens * row, n = (size_t)B * (size_t)T * row;
        be->memcpy_d2d(be, (char *)c->k + at, k, n);
        be->memcpy_d2d(be, (char *)c->v + at, v, n);
        return;
    }
    moe_kv_cache *c = kv->from;
    const int64_t P = kv->P, n = P + T;
    const char *ck = (const char *)c->k + (size_t)l * (size_t)c->tokens * row;
    const char *cv = (const char *)c->v + (size_t)l * (size_t)c->tokens * row;
    for (int b = 0; b < B; b++) {
        size_t dst = (size_t)(b * n) * row, src = (size_t)kv->src[b] * (size_t)c->T * row;
        be->memcpy_d2d(be, (char *)c->wk + dst, ck + src, (size_t)P * row);
        be->memcpy_d2d(be, (char *)c->wv + dst, cv + src, (size_t)P * row);
        be->memcpy_d2d(be, (char *)c->wk + dst + (size_t)P * row,
                       (const char *)k + (size_t)(b * T) * row, (size_t)T * row);
        be->memcpy_d2d(be, (char *)c->wv + dst + (size_t)P * row,
                       (const char *)v + (size_t)(b * T) * row, (size_t)T * row);
    }
    *kc = moe_cbuf_of(c->wk, adt);
    *vc = moe_cbuf_of(c->wv, adt);
    *Tk = n;
}
