/* model_masters: where the master weights live, and every way in and out of them: weight
 * init, the host copies (checkpoints, export, embedding and scoring loads) and the choice of
 * layout (optim.master).
 *
 * Three layouts. fp32 (the default): param_mem holds every tensor's fp32 master at its table
 * offset. weights16_only (a forward-only bf16 model): param_mem holds only the tensors that
 * stay fp32 (keeps_f32: the norms, the embedding table and the router gates, which the
 * forward reads in fp32), packed in table order, and the matrices exist as bf16 only, in
 * param16_mem. Split master (optim.master split, a training bf16 model): param_mem as in
 * weights16_only, and the other tensors' masters as their bf16 copy in param16_mem (the high
 * half, rounded with ties away from zero) plus their low 16 bits in param_lo_mem, packed in
 * table order (moe_f32_split_bf16, moe/dtype.h). The one thing a reader must know: the split
 * masters are exact, so everything outside the model (checkpoints, export, the trainer's
 * all-gathers through moe_model_f32_masters_before) sees the same fp32 values in every
 * layout; only a weights16_only model rounds its matrices. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "moe/rng.h"

int moe_model_keeps_f32(const moe_param_table *t, int i) {
    const moe_param *p = &t->params[i];
    return p->ndim == 1 || i == t->p_embed || (p->layer >= 0 && t->layer[p->layer].gate == i);
}

int64_t moe_model_f32_elems(const moe_param_table *t) {
    int64_t n = 0;
    for (int i = 0; i < t->n_params; i++)
        if (moe_model_keeps_f32(t, i)) n += t->params[i].numel;
    return n;
}

/* 1 when param_mem holds only the tensors moe_model_keeps_f32 selects. */
static int packed(const moe_model *m) {
    return m->weights16_only || m->master == MOE_MASTER_SPLIT;
}

void moe_model_point_params(moe_model *m) {
    moe_param_table *t = &m->table;
    int64_t f = 0, l = 0; /* packed elements so far: fp32 ones, split ones */
    for (int i = 0; i < t->n_params; i++) {
        moe_param *p = &t->params[i];
        int f32 = !packed(m) || moe_model_keeps_f32(t, i);
        p->data = f32 ? m->param_mem + (packed(m) ? f : p->offset) : NULL;
        p->data16 = m->param16_mem ? m->param16_mem + p->offset : NULL;
        p->lo16 = m->param_lo_mem && !f32 ? m->param_lo_mem + l : NULL;
        if (f32)
            f += p->numel;
        else
            l += p->numel;
    }
}

int64_t moe_model_f32_masters_before(const moe_model *m, int64_t i) {
    if (!packed(m)) return i;
    int64_t n = 0;
    for (int k = 0; k < m->table.n_params && m->table.params[k].offset < i; k++) {
        const moe_param *p = &m->table.params[k];
        if (p->data) n += p->numel < i - p->offset ? p->numel : i - p->offset;
    }
    return n;
}

moe_status moe_model_set_master(moe_model *m, moe_master master, moe_err *err) {
    if (master != MOE_MASTER_FP32 && master != MOE_MASTER_SPLIT)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "master weights stored as %d (fp32 or split)",
                           (int)master);
    if (master == m->master) return MOE_OK;
    if (master == MOE_MASTER_SPLIT && !moe_model_has_copies(m->recipe, m->grad_mem != NULL)) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "optim.master split: a %s%s model keeps no bf16 weight copies to split the "
                    "masters into",
                    m->grad_mem ? "" : "forward-only ", moe_recipe_name(m->recipe));
        moe_err_hint(err, "use optim.master: fp32, or precision.recipe: bf16 for training");
        return MOE_ERR_INPUT;
    }
    const moe_backend *be = m->be;
    be->free(be, m->param_mem); /* the old layout first: never both at once */
    be->free(be, m->param_lo_mem);
    m->param_mem = NULL, m->param_lo_mem = NULL;
    m->master = master;
    m->param_elems = packed(m) ? moe_model_f32_elems(&m->table) : m->table.n_elems;
    int64_t nlo = master == MOE_MASTER_SPLIT ? m->table.n_elems - m->param_elems : 0;
    m->param_mem = be->alloc(be, (size_t)m->param_elems * sizeof(float));
    if (nlo) m->param_lo_mem = be->alloc(be, (size_t)nlo * sizeof(uint16_t));
    moe_model_point_params(m);
    if (!m->param_mem || (nlo && !m->param_lo_mem))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "out of %s memory for the master weights (%.2f GiB, optim.master %s)",
                           be->name, (double)(m->param_elems * 4 + nlo * 2) / 1073741824.0,
                           moe_master_name(master));
    be->memset(be, m->param16_mem, 0, (size_t)m->table.n_elems * sizeof(uint16_t));
    m->copies_stale = 1; /* zero weights: the copies of the fp32 ones follow at the next pass */
    return MOE_OK;
}

/* The largest tensor's numel (1 at least): the size of host scratch a tensor at a time. */
static int64_t max_numel(const moe_param_table *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].numel > n) n = t->params[i].numel;
    return n;
}

uint16_t *moe_model_host16(const moe_model *m, int per) {
    uint16_t *s = malloc((size_t)(max_numel(&m->table) * per) * sizeof(uint16_t));
    if (!s) abort(); /* a tensor's worth of host memory or two; the model itself fit */
    return s;
}

/* Tensor i's values from host [numel] into the model: its fp32 master, its split master's
 * halves, or in a weights16_only model its bf16 weights (rounded to nearest even). s16: host
 * scratch of 2 numel codes. The caller marks the copies of the fp32 masters stale. */
static void upload_tensor(moe_model *m, int i, const float *host, uint16_t *s16) {
    const moe_param *p = &m->table.params[i];
    size_t n16 = (size_t)p->numel * sizeof(uint16_t);
    if (p->data) {
        m->be->memcpy_h2d(m->be, p->data, host, (size_t)p->numel * sizeof(float));
        if (!m->weights16_only) return;
    }
    for (int64_t j = 0; j < p->numel; j++)
        if (p->lo16)
            moe_f32_split_bf16(host[j], s16 + j, s16 + p->numel + j);
        else
            s16[j] = moe_f32_to_bf16(host[j]);
    m->be->memcpy_h2d(m->be, p->data16, s16, n16);
    if (p->lo16) m->be->memcpy_h2d(m->be, p->lo16, s16 + p->numel, n16);
}

void moe_model_copy_params_to_host(const moe_model *m, float *dst) {
    if (!packed(m)) {
        m->be->memcpy_d2h(m->be, dst, m->param_mem, (size_t)m->table.n_elems * sizeof(float));
        return;
    }
    uint16_t *s = moe_model_host16(m, 2); /* the fp32 tensors, the others joined or widened */
    for (int i = 0; i < m->table.n_params; i++) {
        const moe_param *p = &m->table.params[i];
        float *d = dst + p->offset;
        size_t n16 = (size_t)p->numel * sizeof(uint16_t);
        if (p->data) {
            m->be->memcpy_d2h(m->be, d, p->data, (size_t)p->numel * sizeof(float));
            continue;
        }
        m->be->memcpy_d2h(m->be, s, p->data16, n16);
        if (p->lo16) m->be->memcpy_d2h(m->be, s + p->numel, p->lo16, n16);
        for (int64_t j = 0; j < p->numel; j++)
            d[j] = p->lo16 ? moe_f32_join_bf16(s[j], s[p->numel + j]) : moe_bf16_to_f32(s[j]);
    }
    free(s);
}

void moe_model_copy_params_from_host(moe_model *m, const float *src) {
    m->copies_stale = !m->weights16_only;
    if (!packed(m)) {
        m->be->memcpy_h2d(m->be, m->param_mem, src, (size_t)m->table.n_elems * sizeof(float));
        return;
    }
    uint16_t *s = moe_model_host16(m, 2);
    for (int i = 0; i < m->table.n_params; i++)
        upload_tensor(m, i, src + m->table.params[i].offset, s);
    free(s);
}

/* FNV-1a of the tensor name: the Philox stream of that tensor, so a tensor's initial values
 * depend only on (seed, name), not on its position in the table or on the thread count. */
static uint64_t name_stream(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void moe_model_init_weights(moe_model *m, uint64_t seed) {
    const moe_param_table *t = &m->table;
    float *host = malloc((size_t)max_numel(t) * sizeof(float));
    if (!host) abort(); /* one tensor's worth of host memory; the model itself fit */
    uint16_t *s16 = moe_model_host16(m, 2);
    for (int i = 0; i < t->n_params; i++) {
        const moe_param *p = &t->params[i];
        if (p->ndim == 1) {
            for (int64_t j = 0; j < p->numel; j++)
                host[j] = 1.0f;
        } else {
            moe_rng_fill_normal(host, p->numel, 0.0f, (float)m->cfg.initializer_range, seed,
                                name_stream(p->name));
        }
        upload_tensor(m, i, host, s16);
    }
    free(host);
    free(s16);
    m->copies_stale = !m->weights16_only;
}
