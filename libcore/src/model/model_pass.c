/* model_pass: the forward and backward passes of the MoE model, llm.c style - one function
 * calling the backend ops in order, one calling their backward ops in reverse order.
 *
 * Everything touches activation memory only through be-> ops and memory functions (so the
 * same code drives the CUDA backend); the host sees only the small per-token loss vector and
 * the router statistics, copied back to compute the scalar losses in double. Backward ops
 * accumulate unless told to write (moe_grad_store): a gradient buffer with one producer is
 * written by it, the first of several producers writes and the others add, and only the
 * buffers of accumulating ops (the residual's dres, the router's logits) are zeroed right
 * before the op that fills them. Parameter gradients are written by the first backward after
 * moe_model_zero_grad and added to by later ones. Loss definitions (ce, aux, z) are in
 * moe/model.h. Activation recomputation (train.recompute): the forward is written as two
 * block functions so that backward can run a block again for a layer whose intermediates were
 * not kept (they live in a shared set, see model_internal.h); the recomputed values are
 * bit-identical to the first forward's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define ZERO(ptr, count) be->memset(be, (ptr), 0, (size_t)(count) * sizeof(*(ptr)))

/* The document mask's inputs of the ops for the last forward (NULL when it ran without a
 * separator): doc_start [N] and positions [N] dev, filled by moe_model_run_layers. */
static const int32_t *doc_start(const moe_model *m) {
    return m->acts->doc_masked ? m->acts->doc_start : NULL;
}
static const int32_t *doc_positions(const moe_model *m) {
    return m->acts->doc_masked ? m->acts->positions : NULL;
}

/* The weight gradient of an expert tensor p, typed: bf16 under optim.expert_grads bf16. */
static moe_buf expert_grad(const moe_param *p) {
    return p->grad16 ? moe_buf_of(p->grad16, MOE_DTYPE_BF16) : moe_buf_f32(p->grad);
}

/* An activation buffer as an operand: MXFP8 when it has scales mx (the layer's ln1 and
 * expert path under mxfp8, model_internal.h), else of type adt. */
static moe_buf act(void *p, uint8_t *mx, moe_dtype adt) {
    return mx ? moe_buf_mxfp8(p, mx) : moe_buf_of(p, adt);
}

/* Whether layer l's ln1 goes as an fp8-block activation pair of one group (the N rows): in
 * training (the plan gave ln1 room for one, moe_acts_plan) under fp8-block, for a layer not in
 * precision.skip_layers, where the backend takes pairs. Its two copies are the operands of
 * the q, k and v products, forward and wgrad, made once where each product made its own. */
static int ln1_pair(const moe_model *m, int l) {
    return m->acts->plan != MOE_PLAN_FORWARD &&
           moe_recipe_format(moe_model_layer_recipe(m, l)) == MOE_RECIPE_FP8_BLOCK &&
           m->be->fp8_pairs >= 1;
}
/* ln1 as rmsnorm writes it and the q, k and v products read it: under ln1_pair an fp8-block
 * pair, *gp its one group of the N rows (offsets in gr; the transposed copy in tiles where the
 * recipe's weight gradients take them) and *gpp = gp; else the activation itself (MXFP8 or
 * adt) and *gpp = NULL. */
static moe_buf ln1_buf(const moe_model *m, int l, int64_t N, int32_t gr[2], moe_fp8_groups *gp,
                       const moe_fp8_groups **gpp) {
    const moe_layer_acts *la = &m->acts->layer[l];
    const moe_recipe prec = moe_model_layer_recipe(m, l);
    *gpp = NULL;
    if (!ln1_pair(m, l)) return act(la->ln1, la->ln1_mx, m->acts->adt);
    gr[0] = 0, gr[1] = (int32_t)N;
    const moe_fp8_groups g = {gr, 1, m->cfg.hidden_size, moe_recipe_pow2(prec),
                              moe_recipe_wgrad_tiles(prec)};
    *gp = g, *gpp = gp;
    return moe_buf_fp8_pair(la->ln1);
}

void moe_model_attn_block(moe_model *m, int l, int B, int T, int with_residual) {
    const moe_backend *be = m->be;
    const moe_model_config *c = &m->cfg;
    struct moe_acts *a = m->acts;
    const moe_recipe prec = moe_model_layer_recipe(m, l), p16 = moe_recipe_unquantized(prec);
    int64_t N = (int64_t)B * T, C = c->hidden_size;
    int64_t H = c->num_attention_heads, KV = c->num_key_value_heads, D = m->head_dim;
    moe_param *P = m->table.params;
    moe_layer_acts *la = &a->layer[l];
    const moe_param_layer *li = &m->table.layer[l];
    const moe_dtype adt = a->adt;
    int32_t gr[2];
    moe_fp8_groups g1;
    const moe_fp8_groups *g1p;
    moe_buf ln1b = ln1_buf(m, l, N, gr, &g1, &g1p);
    moe_cbuf ln1 = moe_cbuf_from(ln1b);
    be->rmsnorm_forward(be, ln1b, la->rstd1, moe_cbuf_of(la->x_in, la->rdt), P[li->ln1].data, N, C,
                        (float)c->rms_norm_eps, p16, g1p);
    moe_buf q = moe_buf_of(la->q, adt), k = moe_buf_of(la->k, adt), v = moe_buf_of(la->v, adt);
    be->matmul_forward(be, q, ln1, moe_model_weight(m, li->q), N, C, H * D, prec);
    be->matmul_forward(be, k, ln1, moe_model_weight(m, li->k), N, C, KV * D, prec);
    be->matmul_forward(be, v, ln1, moe_model_weight(m, li->v), N, C, KV * D, prec);
    const moe_kv_use *kv = a->kv;
    const int64_t p0 = kv && kv->from ? kv->P : 0; /* a continued row's first position */
    be->rope_forward(be, q, doc_positions(m), p0, B, T, H, D, c->rope_theta);
    be->rope_forward(be, k, doc_positions(m), p0, B, T, KV, D, c->rope_theta);
    moe_cbuf kc = moe_cbuf_from(k), vc = moe_cbuf_from(v);
    int64_t Tk = T;
    if (kv) moe_model_kv_layer(m, l, kv, la->k, la->v, B, T, &kc, &vc, &Tk);
    be->attention_forward(be, moe_buf_of(la->att, adt), la->att_lse, moe_cbuf_from(q), kc, vc,
                          doc_start(m), B, T, Tk, H, KV, D, p16);
    if (!with_residual) return;
    /* the product's output is of bf16 values under every recipe but fp32's: stored as adt */
    be->matmul_forward(be, moe_buf_of(a->tmp, adt), moe_cbuf_of(la->att, adt),
                       moe_model_weight(m, li->o), N, H * D, C, prec);
    be->add(be, moe_buf_of(la->x_mid, la->rdt), moe_cbuf_of(la->x_in, la->rdt),
            moe_cbuf_of(a->tmp, adt), N * C);
}

/* Layer l's second norm, ln2 and rstd2 from x_mid: in the MoE block's forward, and again in
 * the backward of a layer that keeps no ln2 (remake_ln2: the same bits). */
static void ln2_forward(moe_model *m, int l, int64_t N) {
    const moe_backend *be = m->be;
    moe_layer_acts *la = &m->acts->layer[l];
    int64_t C = m->cfg.hidden_size;
    be->rmsnorm_forward(
        be, moe_buf_of(la->ln2, m->acts->adt), la->rstd2, moe_cbuf_of(la->x_mid, la->rdt),
        m->table.params[m->table.layer[l].ln2].data, N, C, (float)m->cfg.rms_norm_eps,
        moe_recipe_unquantized(moe_model_layer_recipe(m, l)), NULL);
}

/* Whether layer l's expert activations g, dh1 and dh3 go as fp8-block activation pairs (of El
 * local experts): under fp8-block, where the backend takes pairs of that many groups. */
static int expert_pairs(const moe_model *m, moe_recipe prec, int64_t El) {
    return m->acts->dh1p && moe_recipe_format(prec) == MOE_RECIPE_FP8_BLOCK && El >= 1 &&
           El <= m->be->fp8_pairs;
}
/* g as the layer's products read it: under expert_pairs an fp8-block pair in dh1p (the w2
 * products' x; its transposed copy in tiles where the recipe's weight gradients take them),
 * which swiglu_forward writes with groups *gp; else the activation itself (gp NULL). */
static moe_buf g_operand(const moe_model *m, int l, moe_recipe prec, const int32_t *eoff,
                         int64_t El, moe_fp8_groups *gp, const moe_fp8_groups **gpp) {
    struct moe_acts *a = m->acts;
    const moe_layer_acts *la = &a->layer[l];
    *gpp = NULL;
    if (!expert_pairs(m, prec, El)) return act(la->g, la->g_mx, a->adt);
    const moe_fp8_groups g = {eoff, El, m->cfg.intermediate_size, moe_recipe_pow2(prec),
                              moe_recipe_wgrad_tiles(prec)};
    *gp = g, *gpp = gp;
    return moe_buf_fp8_pair(a->dh1p);
}

/* Whether layer l's expert inputs xe go as an fp8-block activation pair of its experts' groups:
 * the plan gave xp room for one (moe_xe_pair_room: training, fp8-block, the layer not skipped,
 * ep 1) and the backend takes pairs of that many groups. Its two copies are the operands of
 * the w1 and w3 products, forward and wgrad, made once a layer where each of the four made
 * its own. */
static int xe_pair(const moe_model *m, int l) {
    const struct moe_acts *a = m->acts;
    return moe_xe_pair_room(&m->cfg, m->recipe, m->skip_quant, l, a->plan != MOE_PLAN_FORWARD,
                            a->ep) &&
           m->cfg.num_local_experts <= m->be->fp8_pairs;
}
/* xe as the w1 and w3 products read it: under xe_pair the pair in xp's buffer, *gp its groups
 * (eoff, El: the experts' rows of C; the transposed copy in tiles where the recipe's weight
 * gradients take them) and *gpp = gp; else the activation itself and *gpp = NULL. */
static moe_buf xe_operand(const moe_model *m, int l, moe_recipe prec, const int32_t *eoff,
                          int64_t El, moe_fp8_groups *gp, const moe_fp8_groups **gpp) {
    const moe_layer_acts *la = &m->acts->layer[l];
    *gpp = NULL;
    if (!xe_pair(m, l)) return act(la->xe, la->xe_mx, m->acts->adt);
    const moe_fp8_groups g = {eoff, El, m->cfg.hidden_size, moe_recipe_pow2(prec),
                              moe_recipe_wgrad_tiles(prec)};
    *gp = g, *gpp = gp;
    return moe_buf_fp8_pair(la->xe);
}

void moe_model_moe_block(moe_model *m, int l, int B, int T, int with_residual) {
    const moe_backend *be = m->be;
    const moe_model_config *c = &m->cfg;
    struct moe_acts *a = m->acts;
    const moe_recipe prec = moe_model_layer_recipe(m, l), p16 = moe_recipe_unquantized(prec);
    int64_t N = (int64_t)B * T, C = c->hidden_size, F = c->intermediate_size;
    int64_t E = c->num_local_experts, K = c->num_experts_per_tok;
    int L = (int)c->num_hidden_layers;
    moe_param *P = m->table.params;
    moe_layer_acts *la = &a->layer[l];
    const moe_param_layer *li = &m->table.layer[l];
    /* the router (gate matmul included) runs in fp32 */
    const moe_dtype adt = a->adt;
    moe_cbuf ln2 = moe_cbuf_of(la->ln2, adt);
    ln2_forward(m, l, N);
    be->matmul_forward(be, moe_buf_f32(la->rlogits), ln2, moe_cbuf_f32(P[li->gate].data), N, C, E,
                       MOE_RECIPE_FP32);
    be->router_forward(be, la->probs, la->rlse, la->topk_idx, la->topk_w, la->counts, la->rstats,
                       la->rlogits, N, E, K);
    /* under xe_pair the permuted rows go to h1 (free until w1's product, which reads the pair
     * quantize_pair makes of them in xp's buffer) */
    const int xpair = xe_pair(m, l);
    be->permute_forward(be, xpair ? moe_buf_of(la->h1, adt) : act(la->xp, la->xp_mx, adt),
                        la->row_src, la->slot_row, la->offsets, ln2, la->topk_idx, N, C, E, K);
    be->memcpy_d2h(be, a->h_offsets + (int64_t)l * (E + 1), la->offsets,
                   (size_t)(E + 1) * sizeof(int32_t));
    /* expert parallelism: the rows to their experts' owners (xp -> xe; MXFP8 rows with their
     * scales), back after (ye -> yp) */
    size_t row_bytes = (size_t)C * moe_dtype_size(adt);
    if (a->ep > 1 && la->xp_mx) {
        moe_model_ep_dispatch(m, l, la->xp, la->xe, (size_t)C, 1);
        moe_model_ep_dispatch(m, l, la->xp_mx, la->xe_mx, (size_t)C / 32, 0);
    } else if (a->ep > 1) {
        moe_model_ep_dispatch(m, l, la->xp, la->xe, row_bytes, 1);
    }
    int64_t El, R;
    const int32_t *eoff = moe_model_expert_rows(m, l, &El, &R);
    moe_buf h1 = act(la->h1, la->h1_mx, adt), h3 = act(la->h3, la->h3_mx, adt);
    moe_fp8_groups gg;
    const moe_fp8_groups *gp;
    moe_buf g = g_operand(m, l, prec, eoff, El, &gg, &gp);
    moe_fp8_groups xg;
    const moe_fp8_groups *xgp;
    const moe_buf xeb = xe_operand(m, l, prec, eoff, El, &xg, &xgp);
    if (xpair) be->quantize_pair(be, xeb, moe_cbuf_of(la->h1, adt), xgp);
    const moe_cbuf xe = moe_cbuf_from(xeb);
    be->grouped_matmul_forward(be, h1, xe, moe_model_weight(m, li->w1), eoff, El, C, F, prec);
    be->grouped_matmul_forward(be, h3, xe, moe_model_weight(m, li->w3), eoff, El, C, F, prec);
    be->swiglu_forward(be, g, moe_cbuf_from(h1), moe_cbuf_from(h3), R * F, p16, gp);
    a->g_layer = l;
    be->grouped_matmul_forward(be, moe_buf_of(la->ye, adt), moe_cbuf_from(g),
                               moe_model_weight(m, li->w2), eoff, El, F, C, prec);
    if (a->ep > 1) moe_model_ep_combine(m, l, la->ye, la->yp, row_bytes);
    if (!with_residual) return;
    moe_buf x_out =
        l + 1 < L ? moe_buf_of(a->layer[l + 1].x_in, a->layer[l + 1].rdt) : moe_buf_f32(a->x_final);
    be->unpermute_forward(be, x_out, moe_cbuf_of(la->x_mid, la->rdt), moe_cbuf_of(la->yp, adt),
                          la->topk_w, la->slot_row, N, C, K);
}

void moe_model_run_layers(moe_model *m, const int32_t *tokens, int B, int T, int upto) {
    const moe_backend *be = m->be;
    struct moe_acts *a = m->acts;
    int64_t N = (int64_t)B * T, C = m->cfg.hidden_size;
    int L = (int)m->cfg.num_hidden_layers;
    be->memcpy_h2d(be, a->tokens, tokens, (size_t)N * sizeof(int32_t));
    a->doc_masked = m->doc_sep >= 0;
    if (a->doc_masked) { /* a document starts at the row start and after each separator */
        int32_t *start = a->h_doc, *pos = a->h_doc + N;
        for (int64_t i = 0; i < N; i++) {
            int64_t t = i % T;
            start[i] = t == 0 || tokens[i - 1] == m->doc_sep ? (int32_t)t : start[i - 1];
            pos[i] = (int32_t)t - start[i];
        }
        be->memcpy_h2d(be, a->doc_start, start, (size_t)N * sizeof(int32_t));
        be->memcpy_h2d(be, a->positions, pos, (size_t)N * sizeof(int32_t));
    }
    moe_buf x0 = L > 0 ? moe_buf_of(a->layer[0].x_in, a->layer[0].rdt) : moe_buf_f32(a->x_final);
    moe_model_refresh_copies(m);
    be->embedding_forward(be, x0, a->tokens, m->table.params[m->table.p_embed].data, N, C);
    for (int l = 0; l < upto && l < L; l++) {
        moe_model_attn_block(m, l, B, T, 1);
        moe_model_moe_block(m, l, B, T, 1);
    }
}

/* Token ids in [0, V); targets in [-1, V); shapes within the limits given to create. */
static moe_status check_inputs(const moe_model *m, const int32_t *tokens, const int32_t *targets,
                               const float *weights, int B, int T, moe_err *err) {
    const moe_model_config *c = &m->cfg;
    if (B <= 0 || T <= 0 || T > m->max_seq || (int64_t)B * T > (int64_t)m->max_batch * m->max_seq)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "batch %d x sequence %d does not fit the model's buffers (created for "
                           "%d x %d)",
                           B, T, m->max_batch, m->max_seq);
    if (T > c->max_position_embeddings)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "sequence length %d exceeds model.max_position_embeddings %lld", T,
                           (long long)c->max_position_embeddings);
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "token id %d at batch row %lld position %lld is outside the vocabulary "
                        "[0, %lld)",
                        tokens[i], (long long)(i / T), (long long)(i % T),
                        (long long)c->vocab_size);
            moe_err_hint(err, "the data was tokenized for a different vocabulary");
            return MOE_ERR_INPUT;
        }
        if (targets && (targets[i] < -1 || targets[i] >= c->vocab_size))
            return moe_err_set(err, MOE_ERR_INPUT, NULL,
                               "target %d at batch row %lld position %lld is outside [-1, %lld)",
                               targets[i], (long long)(i / T), (long long)(i % T),
                               (long long)c->vocab_size);
        if (weights && !(weights[i] >= 0.0f && isfinite(weights[i])))
            return moe_err_set(err, MOE_ERR_INPUT, NULL,
                               "loss weight %g at batch row %lld position %lld is not a finite "
                               "non-negative number",
                               (double)weights[i], (long long)(i / T), (long long)(i % T));
    }
    return MOE_OK;
}

double moe_model_loss(const moe_model_config *c, double ce, double aux, double z) {
    return ce + c->router_aux_loss_coef * aux + c->router_z_loss_coef * z;
}

/* After the layers (x_final filled): final norm and lm_head into a->logits [N, V]; with
 * targets [N] (host), their cross-entropy per token into a->ce_loss and its host mirror
 * a->h_loss [N] (weights [N] host or NULL). */
static void head_forward(moe_model *m, const int32_t *targets, const float *weights, int64_t N) {
    const moe_backend *be = m->be;
    const moe_model_config *c = &m->cfg;
    struct moe_acts *a = m->acts;
    int64_t C = c->hidden_size, V = c->vocab_size;
    /* lnf as adt: lm_head's forward and weight gradient read the bf16 values directly */
    be->rmsnorm_forward(be, moe_buf_of(a->lnf, a->adt), a->rstdf, moe_cbuf_f32(a->x_final),
                        m->table.params[m->table.p_norm].data, N, C, (float)c->rms_norm_eps,
                        moe_recipe_unquantized(m->recipe), NULL);
    be->matmul_forward(be, moe_buf_f32(a->logits), moe_cbuf_of(a->lnf, a->adt),
                       moe_model_weight(m, m->table.p_lm_head), N, C, V,
                       moe_recipe_unquantized(m->recipe));
    if (!targets) return;
    be->memcpy_h2d(be, a->targets, targets, (size_t)N * sizeof(int32_t));
    if (weights) be->memcpy_h2d(be, a->weights, weights, (size_t)N * sizeof(float));
    be->cross_entropy_forward(be, a->ce_loss, a->ce_lse, a->logits, a->targets,
                              weights ? a->weights : NULL, N, V);
    be->memcpy_d2h(be, a->h_loss, a->ce_loss, (size_t)N * sizeof(float));
}

moe_status moe_model_forward(moe_model *m, const int32_t *tokens, const int32_t *targets,
                             const float *weights, int B, int T, moe_step_stats *st, moe_err *err) {
    if (m->acts->plan == MOE_PLAN_FORWARD)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "moe_model_forward on a model created forward-only (hidden states "
                           "only); create it with moe_model_create");
    if (check_inputs(m, tokens, targets, weights, B, T, err) != MOE_OK) return err->status;
    if (moe_model_prepare_copies(m, err) != MOE_OK) return err->status;
    const moe_backend *be = m->be;
    const moe_model_config *c = &m->cfg;
    struct moe_acts *a = m->acts;
    int64_t N = (int64_t)B * T;
    int64_t E = c->num_local_experts, K = c->num_experts_per_tok;
    int L = (int)c->num_hidden_layers;
    m->ep_status = MOE_OK;
    moe_model_run_layers(m, tokens, B, T, L);
    if (m->ep_status != MOE_OK) {
        if (err) *err = m->ep_err;
        return m->ep_status;
    }
    head_forward(m, targets, weights, N);
    double ce_sum = 0.0, wsum = 0.0, ntok = 0.0;
    a->has_targets = targets != NULL;
    a->has_weights = targets && weights;
    if (targets) {
        for (int64_t i = 0; i < N; i++) {
            if (targets[i] < 0) continue;
            ntok += 1.0;
            wsum += weights ? weights[i] : 1.0;
            ce_sum += a->h_loss[i];
        }
    }
    a->weight_sum = wsum;
    m->last_B = B;
    m->last_T = T;
    /* router losses from the per-layer statistics */
    double aux = 0.0, z = 0.0, ent = 0.0;
    int32_t *cnt_all = malloc((size_t)(L * E) * sizeof(int32_t));
    float *stats_all = malloc((size_t)(L * (E + 2)) * sizeof(float));
    if (!cnt_all || !stats_all) {
        free(cnt_all);
        free(stats_all);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory");
    }
    /* the layers' rows are one buffer each (model_internal.h): two copies, not 2 L */
    if (L > 0) {
        be->memcpy_d2h(be, cnt_all, a->layer[0].counts, (size_t)(L * E) * sizeof(int32_t));
        be->memcpy_d2h(be, stats_all, a->layer[0].rstats, (size_t)(L * (E + 2)) * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        const int32_t *cnt = cnt_all + l * E;
        const float *stats = stats_all + l * (E + 2);
        double al = 0.0;
        for (int64_t e = 0; e < E; e++) {
            m->expert_tokens[l * E + e] = cnt[e];
            al += ((double)cnt[e] / (double)(N * K)) * ((double)stats[e] / (double)N);
        }
        aux += (double)E * al;
        z += (double)stats[E] / (double)N;
        ent += (double)stats[E + 1] / (double)N;
    }
    free(cnt_all);
    free(stats_all);
    aux /= L;
    z /= L;
    ent /= L;
    moe_status s = be->synchronize(be, err);
    if (st) {
        memset(st, 0, sizeof *st);
        st->ce_loss = wsum > 0.0 ? ce_sum / wsum : 0.0;
        st->aux_loss = aux;
        st->z_loss = z;
        st->loss = moe_model_loss(c, st->ce_loss, aux, z);
        st->n_tokens = ntok;
        st->weight_sum = wsum;
        st->ce_sum = ce_sum;
        st->router_entropy = ent;
        st->expert_tokens = m->expert_tokens;
    }
    return s;
}

moe_status moe_model_backward(moe_model *m, float grad_scale, moe_err *err) {
    struct moe_acts *a = m->acts;
    if (m->last_B <= 0 || !a->has_targets)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "moe_model_backward needs a preceding moe_model_forward with targets");
    const moe_backend *be = m->be;
    const moe_model_config *c = &m->cfg;
    const moe_recipe p16 = moe_recipe_unquantized(m->recipe);
    int B = m->last_B, T = m->last_T, L = (int)c->num_hidden_layers;
    int64_t N = (int64_t)B * T, C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    int64_t H = c->num_attention_heads, KV = c->num_key_value_heads, D = m->head_dim;
    int64_t E = c->num_local_experts, K = c->num_experts_per_tok, NK = N * K;
    moe_param *P = m->table.params;
    /* parameter gradients: written by this backward after moe_model_zero_grad (gw = SET),
     * else added to; the ones its accumulating ops fill (embedding, norms) start at zero */
    const moe_grad_store gw = m->grads_stale ? MOE_GRAD_SET : MOE_GRAD_ADD;
    if (m->grads_stale) {
        ZERO(P[m->table.p_embed].grad, P[m->table.p_embed].numel);
        ZERO(P[m->table.p_norm].grad, P[m->table.p_norm].numel);
        for (int l = 0; l < L; l++) {
            ZERO(P[m->table.layer[l].ln1].grad, C);
            ZERO(P[m->table.layer[l].ln2].grad, C);
        }
        m->grads_stale = 0;
    }
    /* head: CE -> lm_head -> final norm */
    float dloss = a->weight_sum > 0.0 ? (float)(grad_scale / a->weight_sum) : 0.0f;
    be->cross_entropy_backward(be, a->logits, a->logits, a->ce_lse, a->targets,
                               a->has_weights ? a->weights : NULL, dloss, N, V);
    be->matmul_backward(be, a->dln, P[m->table.p_lm_head].grad, moe_cbuf_f32(a->logits),
                        moe_cbuf_of(a->lnf, a->adt), moe_model_weight(m, m->table.p_lm_head), N, C,
                        V, p16, MOE_GRAD_SET, gw);
    ZERO(a->dres, N * C);
    be->rmsnorm_backward(be, a->dres, P[m->table.p_norm].grad, a->dln, moe_cbuf_f32(a->x_final),
                         P[m->table.p_norm].data, a->rstdf, N, C);
    /* router loss derivatives: aux = mean_l E sum_e f_e P_e, z = mean_l mean_n lse^2 */
    float *dprob = malloc((size_t)(L * E) * sizeof(float));
    if (!dprob) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory");
    for (int64_t i = 0; i < L * E; i++) /* d aux_l / d p[n,e] = E f_e / N, f_e = count/(N K) */
        dprob[i] = (float)(grad_scale * c->router_aux_loss_coef / L * (double)E *
                           ((double)m->expert_tokens[i] / (double)NK) / (double)N);
    be->memcpy_h2d(be, a->dprob, dprob, (size_t)(L * E) * sizeof(float)); /* all layers' */
    free(dprob);
    float dz = (float)(grad_scale * c->router_z_loss_coef / ((double)L * (double)N));
    for (int l = L - 1; l >= 0; l--) {
        moe_layer_acts *la = &a->layer[l];
        const moe_param_layer *li = &m->table.layer[l];
        const moe_dtype adt = a->adt;
        const moe_recipe prec = moe_model_layer_recipe(m, l);
        /* recompute what the plan did not keep, from the layer's kept inputs: the attention
         * block from x_in (also x_mid when that was not kept), the MoE block from x_mid */
        if (!a->keep_attn || !a->keep_mid) moe_model_attn_block(m, l, B, T, !a->keep_mid);
        if (!a->keep_moe) moe_model_moe_block(m, l, B, T, 0);
        /* MoE block: x_out = x_mid + unpermute(experts(permute(ln2))) */
        /* dyp over yp, dh1/dh3 over h1/h3: in place, each op their last reader */
        void *dyp = la->yp, *dye = a->ep > 1 ? a->dye : dyp;
        be->unpermute_backward(be, moe_buf_of(dyp, adt), a->dtw, a->dres, moe_cbuf_of(la->yp, adt),
                               la->topk_w, la->slot_row, N, C, K, MOE_GRAD_SET);
        /* expert parallelism: dyp goes the way xp went (-> dye), dxe comes back as ye did */
        if (a->ep > 1) moe_model_ep_dispatch(m, l, dyp, dye, (size_t)C * moe_dtype_size(adt), 0);
        int64_t El, R;
        const int32_t *eoff = moe_model_expert_rows(m, l, &El, &R);
        /* g shares its region with dg (moe_acts_plan), or as a pair dh1p's: unless it still
         * holds this layer's g (the last layer's forward, or the MoE block just recomputed)
         * it is made again from h1 and h3, read by w2's weight gradient, and then
         * overwritten by dg (or dh1) */
        moe_buf h1 = act(la->h1, la->h1_mx, adt), h3 = act(la->h3, la->h3_mx, adt);
        moe_fp8_groups gg;
        const moe_fp8_groups *gp;
        moe_buf gb = g_operand(m, l, prec, eoff, El, &gg, &gp);
        moe_cbuf g = moe_cbuf_from(gb), w2 = moe_model_weight(m, li->w2);
        moe_fp8_groups xg;
        const moe_fp8_groups *xgp;
        moe_cbuf xe = moe_cbuf_from(xe_operand(m, l, prec, eoff, El, &xg, &xgp));
        if (a->g_layer != l)
            be->swiglu_forward(be, gb, moe_cbuf_from(h1), moe_cbuf_from(h3), R * F, p16, gp);
        be->grouped_matmul_backward(be, moe_buf_f32(NULL), expert_grad(&P[li->w2]),
                                    moe_cbuf_of(dye, adt), g, w2, eoff, El, F, C, prec,
                                    MOE_GRAD_SET, gw);
        be->grouped_matmul_backward(be, moe_buf_of(a->dg, la->dgt), moe_buf_f32(NULL),
                                    moe_cbuf_of(dye, adt), g, w2, eoff, El, F, C, prec,
                                    MOE_GRAD_SET, gw);
        a->g_layer = -1;
        /* dh1 and dh3 written over h1 and h3, of their type; or under fp8-block, where the
         * backend takes them, as fp8-block pairs: the operands the w1 and w3 products read */
        const int pairs = expert_pairs(m, prec, El);
        const moe_fp8_groups pg = {eoff, El, F, moe_recipe_pow2(prec), 0};
        moe_buf dh1 = pairs ? moe_buf_fp8_pair(a->dh1p) : h1;
        moe_buf dh3 = pairs ? moe_buf_fp8_pair(a->dh3p) : h3;
        be->swiglu_backward(be, dh1, dh3, moe_cbuf_of(a->dg, la->dgt), moe_cbuf_from(h1),
                            moe_cbuf_from(h3), R * F, pairs ? &pg : NULL);
        moe_cbuf w1 = moe_model_weight(m, li->w1), w3 = moe_model_weight(m, li->w3);
        /* dxe = dh1 W1 + dh3 W3: with pairs one product over both, written once, in bf16 where
         * it goes to permute's backward as it is (without expert parallelism); else w3's dgrad
         * adds to w1's in fp32 */
        const moe_dtype dxt = pairs && a->ep <= 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        be->grouped_matmul_backward(be, moe_buf_f32(pairs ? NULL : a->dxe), expert_grad(&P[li->w1]),
                                    moe_cbuf_from(dh1), xe, w1, eoff, El, C, F, prec, MOE_GRAD_SET,
                                    gw);
        be->grouped_matmul_backward(be, moe_buf_f32(pairs ? NULL : a->dxe), expert_grad(&P[li->w3]),
                                    moe_cbuf_from(dh3), xe, w3, eoff, El, C, F, prec, MOE_GRAD_ADD,
                                    gw);
        if (pairs)
            be->grouped_dgrad_sum(be, moe_buf_of(a->dxe, dxt), moe_cbuf_from(dh1), w1,
                                  moe_cbuf_from(dh3), w3, eoff, El, C, F, prec);
        if (a->ep > 1) moe_model_ep_combine(m, l, a->dxe, a->dxp, (size_t)C * sizeof(float));
        be->permute_backward(be, a->dln, moe_cbuf_of(a->dxp, dxt), la->slot_row, N, C, K,
                             MOE_GRAD_SET);
        if (la->remake_ln2) ln2_forward(m, l, N);
        ZERO(a->drl, N * E);
        be->router_backward(be, a->drl, a->dtw, a->dprob + l * E, dz, la->probs, la->rlse,
                            la->topk_idx, la->topk_w, N, E, K);
        be->matmul_backward(be, a->dln, P[li->gate].grad, moe_cbuf_f32(a->drl),
                            moe_cbuf_of(la->ln2, adt), moe_cbuf_f32(P[li->gate].data), N, C, E,
                            MOE_RECIPE_FP32, MOE_GRAD_ADD, gw);
        be->rmsnorm_backward(be, a->dres, P[li->ln2].grad, a->dln, moe_cbuf_of(la->x_mid, la->rdt),
                             P[li->ln2].data, la->rstd2, N, C);
        /* attention block: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)) */
        be->matmul_backward(be, a->datt, P[li->o].grad, moe_cbuf_f32(a->dres),
                            moe_cbuf_of(la->att, adt), moe_model_weight(m, li->o), N, H * D, C,
                            prec, MOE_GRAD_SET, gw);
        be->attention_backward(be, a->dq, a->dk, a->dv, a->datt, moe_cbuf_of(la->q, adt),
                               moe_cbuf_of(la->k, adt), moe_cbuf_of(la->v, adt),
                               moe_cbuf_of(la->att, adt), la->att_lse, doc_start(m), B, T, H, KV, D,
                               p16, MOE_GRAD_SET);
        /* dq and dk turned back by RoPE: under bf16 rounded as their products read them (the
         * same bits), into the region of datt, which attention's backward has read; fp8 and
         * mxfp8 quantize the fp32 values */
        moe_buf dqr = moe_buf_f32(a->dq), dkr = moe_buf_f32(a->dk);
        if (prec == MOE_RECIPE_BF16) {
            dqr = moe_buf_of(a->datt, MOE_DTYPE_BF16);
            dkr = moe_buf_of((uint16_t *)a->datt + N * H * D, MOE_DTYPE_BF16);
        }
        be->rope_backward(be, dqr, a->dq, doc_positions(m), B, T, H, D, c->rope_theta);
        be->rope_backward(be, dkr, a->dk, doc_positions(m), B, T, KV, D, c->rope_theta);
        /* ln1 as the forward wrote it (rmsnorm's backward reads x_in and rstd1, not ln1) */
        int32_t gr[2];
        moe_fp8_groups g1;
        const moe_fp8_groups *g1p;
        moe_cbuf ln1 = moe_cbuf_from(ln1_buf(m, l, N, gr, &g1, &g1p));
        be->matmul_backward(be, a->dln, P[li->q].grad, moe_cbuf_from(dqr), ln1,
                            moe_model_weight(m, li->q), N, C, H * D, prec, MOE_GRAD_SET, gw);
        be->matmul_backward(be, a->dln, P[li->k].grad, moe_cbuf_from(dkr), ln1,
                            moe_model_weight(m, li->k), N, C, KV * D, prec, MOE_GRAD_ADD, gw);
        be->matmul_backward(be, a->dln, P[li->v].grad, moe_cbuf_f32(a->dv), ln1,
                            moe_model_weight(m, li->v), N, C, KV * D, prec, MOE_GRAD_ADD, gw);
        be->rmsnorm_backward(be, a->dres, P[li->ln1].grad, a->dln, moe_cbuf_of(la->x_in, la->rdt),
                             P[li->ln1].data, la->rstd1, N, C);
    }
    be->embedding_backward(be, P[m->table.p_embed].grad, a->dres, a->tokens, N, C, V);
    /* the logits buffer now holds gradients: a second backward needs a new forward */
    a->has_targets = 0;
    if (m->ep_status != MOE_OK) {
        if (err) *err = m->ep_err;
        return m->ep_status;
    }
    return be->synchronize(be, err);
}

/* Runs tokens [B, T] (host) up to `layer` and sets *src to its hidden states [B, T, C] on
 * the backend; the activations then no longer belong to a forward with targets. */
static moe_status hidden_states(moe_model *m, const int32_t *tokens, int B, int T, int layer,
                                const float **src, moe_err *err) {
    const moe_model_config *c = &m->cfg;
    int L = (int)c->num_hidden_layers;
    if (layer < 0 || layer > L)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "hidden-state layer %d is outside [0, %d] (0 = embeddings, %d = final "
                           "norm)",
                           layer, L, L);
    if (check_inputs(m, tokens, NULL, NULL, B, T, err) != MOE_OK) return err->status;
    if (moe_model_prepare_copies(m, err) != MOE_OK) return err->status;
    const moe_backend *be = m->be;
    struct moe_acts *a = m->acts;
    int64_t N = (int64_t)B * T, C = c->hidden_size;
    moe_model_run_layers(m, tokens, B, T, layer);
    if (layer == L) {
        be->rmsnorm_forward(be, moe_buf_f32(a->lnf), a->rstdf, moe_cbuf_f32(a->x_final),
                            m->table.params[m->table.p_norm].data, N, C, (float)c->rms_norm_eps,
                            moe_recipe_unquantized(m->recipe), NULL);
        *src = a->lnf;
    } else if (a->layer[layer].rdt == MOE_DTYPE_F32) {
        *src = a->layer[layer].x_in;
    } else { /* a bf16 residual (training under mxfp8): its values into dln (+ zeros in dres),
              * two gradient buffers the next backward writes again */
        ZERO(a->dres, N * C);
        be->add(be, moe_buf_f32(a->dln), moe_cbuf_of(a->layer[layer].x_in, MOE_DTYPE_BF16),
                moe_cbuf_f32(a->dres), N * C);
        *src = a->dln;
    }
    m->last_B = 0;
    a->has_targets = 0;
    return MOE_OK;
}

moe_status moe_model_hidden(moe_model *m, const int32_t *tokens, int B, int T, int layer,
                            float *out, moe_err *err) {
    const float *src = NULL;
    if (hidden_states(m, tokens, B, T, layer, &src, err) != MOE_OK) return err->status;
    m->be->memcpy_d2h(m->be, out, src, (size_t)B * T * m->cfg.hidden_size * sizeof(float));
    return m->be->synchronize(m->be, err);
}

moe_status moe_model_hidden_pooled(moe_model *m, const int32_t *tokens, int B, int T, int layer,
                                   const int32_t *range, int max, float *out, moe_err *err) {
    for (int b = 0; b < B; b++)
        if (range[2 * b] < 0 || range[2 * b + 1] < 1 || range[2 * b] + range[2 * b + 1] > T)
            return moe_err_set(err, MOE_ERR_INPUT, NULL,
                               "pooling range %d of row %d (%d positions) is outside [0, %d)",
                               range[2 * b], b, range[2 * b + 1], T);
    const float *src = NULL;
    if (hidden_states(m, tokens, B, T, layer, &src, err) != MOE_OK) return err->status;
    const moe_backend *be = m->be;
    struct moe_acts *a = m->acts;
    int64_t C = m->cfg.hidden_size;
    /* a->tmp [N, C] is free after the forward and holds [B, C] (B <= N) */
    be->memcpy_h2d(be, a->pool_range, range, (size_t)(2 * B) * sizeof(int32_t));
    be->pool_forward(be, a->tmp, src, a->pool_range, B, T, C, max);
    be->memcpy_d2h(be, out, a->tmp, (size_t)B * C * sizeof(float));
    return be->synchronize(be, err);
}

moe_status moe_model_logprobs(moe_model *m, const int32_t *tokens, const int32_t *targets, int B,
                              int T, float *out, moe_err *err) {
    return moe_model_logprobs_kv(m, tokens, targets, B, T, NULL, out, err);
}

moe_status moe_model_logprobs_kv(moe_model *m, const int32_t *tokens, const int32_t *targets, int B,
                                 int T, const moe_kv_use *kv, float *out, moe_err *err) {
    if (check_inputs(m, tokens, targets, NULL, B, T, err) != MOE_OK) return err->status;
    if (kv && moe_model_kv_check(m, kv, B, T, err) != MOE_OK) return err->status;
    if (moe_model_prepare_copies(m, err) != MOE_OK) return err->status;
    if (moe_model_alloc_head(m, err) != MOE_OK) return err->status;
    const moe_backend *be = m->be;
    struct moe_acts *a = m->acts;
    int64_t N = (int64_t)B * T;
    a->kv = kv;
    moe_model_run_layers(m, tokens, B, T, (int)m->cfg.num_hidden_layers);
    a->kv = NULL;
    if (kv && kv->save) kv->save->T = T, kv->save->rows = B;
    head_forward(m, targets, NULL, N);
    for (int64_t i = 0; i < N; i++)
        out[i] = targets[i] < 0 ? 0.0f : -a->h_loss[i];
    m->last_B = 0; /* not a forward that backward may differentiate */
    a->has_targets = 0;
    return be->synchronize(be, err);
}
