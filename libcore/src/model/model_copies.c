/* model_copies: the weight copies the matrix products read instead of the fp32 masters, and
 * the AdamW step that keeps them right.
 *
 * bf16 recipe: one bf16 copy of every tensor (param16_mem), written by the AdamW kernel in
 * the same pass as the master; under optim.master split the copy of a tensor without an
 * fp32 master is half its master (model_masters.c), updated in place, never refreshed from
 * anything else. fp8-block: for each layer not in precision.skip_layers, the
 * e4m3 copies of the weights its products quantize (q, k, v, o and the expert blocks w1, w3,
 * w2), row-wise and transposed with their 128 x 128 tile scales (moe/ops.h), in one
 * allocation (param8_mem) made by the first pass, when the skipped layers are known. They
 * are written in the AdamW pass: a quantized weight wholly inside the range AdamW updates is
 * updated by be->adamw_quantize, which writes its copies from the new master (one kernel a
 * 128 x 128 tile on the GPU: a tile's scale needs the whole updated tile first); every other
 * tensor by be->adamw's flat runs, which run across many tensors and which ZeRO-1 cuts
 * anywhere (a quantized weight only partly inside a ZeRO-1 slice makes the copies stale). The
 * one thing a reader must know: every write of the masters other than moe_model_adamw marks the
 * copies stale (copies_stale) and the next pass rewrites them all (moe_model_refresh_copies: those
 * of the fp32 masters), so init, load, resume and an all-gather of ZeRO slices need nothing else.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

int moe_model_has_copies(moe_recipe recipe, int training) {
    return recipe == MOE_RECIPE_BF16 && training;
}

int moe_model_has_fp8_copies(moe_recipe recipe) {
    return moe_recipe_format(recipe) == MOE_RECIPE_FP8_BLOCK;
}

/* Bytes of the copies of one [E, O, I] weight: its e4m3 values, then its scales, each part
 * 256-byte aligned (cuBLASLt picks its algorithm by operand alignment). */
static int64_t copy_bytes(int64_t E, int64_t O, int64_t I) {
    return (2 * E * O * I + 255) / 256 * 256 +
           (moe_fp8_weight_scales(E, O, I) * (int64_t)sizeof(float) + 255) / 256 * 256;
}

/* The table indices of layer l's quantized weights (q, k, v, o, w1, w3, w2) into idx [7]. */
static void layer_weights(const moe_param_table *t, int l, int idx[7]) {
    const moe_param_layer *li = &t->layer[l];
    const int all[7] = {li->q, li->k, li->v, li->o, li->w1, li->w3, li->w2};
    memcpy(idx, all, sizeof all);
}

/* Experts per weight j (0..6) of layer_weights's list: 1 for attention, the block's for the
 * experts. */
static int64_t experts_of(const moe_param_table *t, int j) {
    return j < 4 ? 1 : t->e1 - t->e0;
}

static int skipped(const uint8_t *skip, int64_t l) {
    return skip && skip[l];
}

int64_t moe_model_fp8_copy_bytes(const moe_model_config *c, int64_t experts, const uint8_t *skip) {
    int64_t C = c->hidden_size, F = c->intermediate_size;
    int64_t D = c->num_attention_heads > 0 ? C / c->num_attention_heads : 0;
    int64_t HD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D, per = 0;
    per += copy_bytes(1, HD, C) + 2 * copy_bytes(1, KVD, C) + copy_bytes(1, C, HD);
    per += 2 * copy_bytes(experts, F, C) + copy_bytes(experts, C, F);
    int64_t total = 0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        total += skipped(skip, l) ? 0 : per;
    return total;
}

/* Drops the fp8 copies (the next pass makes them again). */
static void drop_fp8_copies(moe_model *m) {
    m->be->free(m->be, m->param8_mem);
    m->param8_mem = NULL;
    for (int i = 0; i < m->table.n_params; i++)
        m->table.params[i].data8 = NULL, m->table.params[i].scale8 = NULL;
}

moe_status moe_model_prepare_copies(moe_model *m, moe_err *err) {
    if (!moe_model_has_fp8_copies(m->recipe) || m->param8_mem) return MOE_OK;
    moe_param_table *t = &m->table;
    int64_t bytes = moe_model_fp8_copy_bytes(&m->cfg, t->e1 - t->e0, m->skip_quant);
    if (bytes == 0) return MOE_OK; /* every layer skipped */
    m->param8_mem = m->be->alloc(m->be, (size_t)bytes);
    if (!m->param8_mem) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                    "out of %s memory for the fp8-block weight copies (%.1f MiB)", m->be->name,
                    (double)bytes / 1048576.0);
        moe_err_hint(err, "name more layers in precision.skip_layers, or use a smaller model");
        return MOE_ERR_RUNTIME;
    }
    char *at = (char *)m->param8_mem;
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        if (skipped(m->skip_quant, l)) continue;
        int idx[7];
        layer_weights(t, l, idx);
        for (int j = 0; j < 7; j++) {
            moe_param *p = &t->params[idx[j]];
            int64_t E = experts_of(t, j), O = p->shape[0], I = p->shape[1];
            p->data8 = (uint8_t *)at;
            p->scale8 = (float *)(at + (2 * E * O * I + 255) / 256 * 256);
            at += copy_bytes(E, O, I);
        }
    }
    m->copies_stale = 1;
    return MOE_OK;
}

moe_status moe_model_set_skip_layers(moe_model *m, const uint8_t *skip, moe_err *err) {
    free(m->skip_quant);
    m->skip_quant = NULL;
    drop_fp8_copies(m); /* laid out for the old set of layers */
    if (!skip) return moe_model_replan_acts(m, err);
    size_t L = (size_t)m->cfg.num_hidden_layers;
    m->skip_quant = malloc(L ? L : 1);
    if (!m->skip_quant) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory");
    memcpy(m->skip_quant, skip, L);
    return moe_model_replan_acts(m, err);
}

/* Writes the fp8 copies of weight j (layer_weights's order) of layer l from its master. */
static void quantize(moe_model *m, int l, int j) {
    int idx[7];
    layer_weights(&m->table, l, idx);
    const moe_param *p = &m->table.params[idx[j]];
    m->be->quantize_weight(m->be, p->data8, p->scale8, p->data, experts_of(&m->table, j),
                           p->shape[0], p->shape[1], m->recipe);
}

void moe_model_params_written(moe_model *m) {
    m->copies_stale = 1;
}

/* The bf16 copies of the fp32 masters: one cast of param_mem, or under a split master one
 * per run of consecutive fp32 tensors (the split masters' high halves are their copies). */
static void cast_copies(moe_model *m) {
    const moe_param_table *t = &m->table;
    if (m->master != MOE_MASTER_SPLIT) {
        m->be->cast_bf16(m->be, m->param16_mem, m->param_mem, t->n_elems);
        return;
    }
    for (int i = 0; i < t->n_params; i++) { /* i++ steps over the split master ending a run */
        const moe_param *p = &t->params[i];
        int64_t n = 0;
        while (i < t->n_params && t->params[i].data)
            n += t->params[i++].numel;
        if (n) m->be->cast_bf16(m->be, p->data16, p->data, n);
    }
}

void moe_model_refresh_copies(moe_model *m) {
    if (!m->copies_stale || m->weights16_only) return;
    if (m->param16_mem) cast_copies(m);
    for (int l = 0; m->param8_mem && l < (int)m->cfg.num_hidden_layers; l++)
        for (int j = 0; j < 7 && !skipped(m->skip_quant, l); j++)
            quantize(m, l, j);
    m->copies_stale = 0;
}

/* 1 when AdamW on [lo, hi) updates weight p (the first tensor of its block of E, p->data8 set)
 * and writes its fp8 copies in the same pass (be->adamw_quantize): the whole weight inside
 * the range, an fp32 master, no bf16 copy, and copies that are not stale (stale ones are all
 * rewritten before the next forward). */
static int copies_in_adamw(const moe_model *m, const moe_param *p, int64_t E, int64_t lo,
                           int64_t hi) {
    return p->data8 && m->param8_mem && !m->copies_stale && p->data && !m->param16_mem &&
           p->offset >= lo && p->offset + E * p->numel <= hi;
}

/* After an AdamW step on [lo, hi): the fp8 copies of every quantized weight wholly inside
 * it rewritten (by adamw_quantize, or here); one only partly inside (a ZeRO-1 slice) makes the
 * copies stale. */
static void update_fp8_copies(moe_model *m, int64_t lo, int64_t hi) {
    if (!m->param8_mem || m->copies_stale) return; /* none yet, or all rewritten anyway */
    const moe_param_table *t = &m->table;
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        if (skipped(m->skip_quant, l)) continue;
        int idx[7];
        layer_weights(t, l, idx);
        for (int j = 0; j < 7; j++) {
            const moe_param *p = &t->params[idx[j]];
            int64_t a = p->offset, b = a + experts_of(t, j) * p->numel;
            if (b <= lo || a >= hi) continue;
            if (a < lo || b > hi) {
                m->copies_stale = 1;
                return;
            }
            if (!copies_in_adamw(m, p, experts_of(t, j), lo, hi)) quantize(m, l, j);
        }
    }
}

/* One be->adamw call on the elements [a, b) of tensors of one kind, tensor first leading:
 * fp32 masters (with their bf16 copies unless stale) or split masters (the halves). */
static void adamw_run(moe_model *m, int first, int64_t a, int64_t b, moe_buf mom, moe_buf var,
                      int64_t lo, const moe_optim_config *o, double wd, double lr, int64_t step,
                      float grad_scale) {
    const moe_param *p = &m->table.params[first];
    int64_t at = a - p->offset; /* a's place in the run's arrays, from its first tensor's */
    /* a stale copy is rewritten before the next forward (not here); a split master's high
     * half is always written: it is half the master */
    uint16_t *copy = m->param16_mem && (p->lo16 || !m->copies_stale) ? m->param16_mem + a : NULL;
    m->be->adamw(m->be, p->data ? p->data + at : NULL, copy, p->lo16 ? p->lo16 + at : NULL,
                 moe_cbuf_from(moe_model_grads_at(m, a)), moe_buf_at(mom, a - lo),
                 moe_buf_at(var, a - lo), b - a, (float)lr, (float)o->beta1, (float)o->beta2,
                 (float)o->eps, (float)wd, step, grad_scale);
}

void moe_model_adamw(moe_model *m, int64_t lo, int64_t hi, moe_buf mom, moe_buf var,
                     const moe_optim_config *o, double lr, int64_t step, float grad_scale) {
    const moe_param_table *t = &m->table;
    int64_t a = -1, b = -1; /* the run being gathered: elements [a, b), from tensor first */
    int first = -1;
    double wd_run = 0.0;
    for (int i = 0; i <= t->n_params; i++) {
        double wd = 0.0;
        int64_t pa = hi, pb = hi, E = 1;
        int fused = 0; /* a quantized weight, updated with its fp8 copies in one pass */
        if (i < t->n_params) {
            const moe_param *p = &t->params[i];
            pa = p->offset > lo ? p->offset : lo;
            pb = p->offset + p->numel < hi ? p->offset + p->numel : hi;
            wd = (p->decay || o->decay_norms_and_embeddings) ? o->weight_decay : 0.0;
            if (pa >= pb) continue;
            E = p->expert >= 0 ? t->e1 - t->e0 : 1;
            fused = copies_in_adamw(m, p, E, lo, hi);
        }
        /* a run ends at a change of decay, a gap, where bf16 expert gradients begin, between
         * fp32 and split masters, and at a weight updated with its copies */
        int grads16 = pa == t->dense_elems && m->expert_grad_dt != MOE_DTYPE_F32;
        if (a >= 0 && (i == t->n_params || fused || wd != wd_run || pa != b || grads16 ||
                       !t->params[i].data != !t->params[first].data)) {
            adamw_run(m, first, a, b, mom, var, lo, o, wd_run, lr, step, grad_scale);
            a = -1;
        }
        if (i == t->n_params) break;
        if (fused) { /* the whole block of E tensors */
            const moe_param *p = &t->params[i];
            m->be->adamw_quantize(m->be, p->data, moe_cbuf_from(moe_model_grads_at(m, p->offset)),
                                  moe_buf_at(mom, p->offset - lo), moe_buf_at(var, p->offset - lo),
                                  p->data8, p->scale8, E, p->shape[0], p->shape[1], m->recipe,
                                  (float)lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                                  (float)wd, step, grad_scale);
            i += (int)E - 1;
            continue;
        }
        if (a < 0) a = pa, first = i, wd_run = wd;
        b = pb;
    }
    update_fp8_copies(m, lo, hi);
}
