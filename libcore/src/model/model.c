/* model: the MoE model's lifetime, activation plan and gradients, and the size/FLOP
 * estimates for --dry-run. The passes themselves live in model_pass.c, the parameter table
 * in model_params.c (moe/model_params.h: dense tensors first, then per layer and kind one
 * [E, out, in] block of experts for the grouped matmul), the master weights' layouts, init
 * and host copies in model_masters.c. All gradients live in one backend allocation at the
 * table's offsets, the weights in one or (a packed layout) a few. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "moe/quant.h"

/* ---- activation plan ---- */

/* Buffers start 256 bytes apart (relative to base; a CUDA allocation is 256-byte aligned):
 * cuBLASLt's heuristic picks its algorithm by operand alignment, so every activation gets
 * the best one whatever the sizes before it. */
#define MOE_ACT_ALIGN 256

static void *carve(size_t *off, char *base, size_t bytes) {
    size_t at = *off;
    *off += (bytes + MOE_ACT_ALIGN - 1) / MOE_ACT_ALIGN * MOE_ACT_ALIGN;
    return base ? base + at : NULL;
}

/* Which groups a plan keeps per layer (see struct moe_acts). */
static void plan_keeps(int plan, int *attn, int *mid, int *moe) {
    *attn = plan == MOE_RECOMPUTE_NONE || plan == MOE_RECOMPUTE_MOE;
    *mid = plan == MOE_RECOMPUTE_NONE || plan == MOE_RECOMPUTE_ATTN || plan == MOE_RECOMPUTE_MOE;
    *moe = plan == MOE_RECOMPUTE_NONE || plan == MOE_RECOMPUTE_ATTN;
}

moe_dtype moe_model_act_dtype(moe_recipe recipe) {
    return moe_recipe_unquantized(recipe) == MOE_RECIPE_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
}

int64_t moe_model_expert_rows_max(const moe_model_config *cfg, int64_t N, int ep) {
    int64_t K = cfg->num_experts_per_tok, El = cfg->num_local_experts / (ep > 1 ? ep : 1);
    return ep > 1 ? ep * N * (K < El ? K : El) : N * K;
}

int moe_model_layer_mx(const moe_model_config *cfg, moe_recipe recipe, const uint8_t *skip, int l) {
    return moe_recipe_format(moe_layer_recipe(recipe, skip, l)) == MOE_RECIPE_MXFP8 &&
           cfg->hidden_size % 32 == 0 && cfg->intermediate_size % 32 == 0;
}

/* Layer l's dg type (moe_layer_acts.dgt) in a plan that trains (train), else F32 (no dg). */
static moe_dtype dg_type(const moe_model_config *cfg, moe_recipe recipe, const uint8_t *skip, int l,
                         int train) {
    const int fp8 = moe_recipe_format(moe_layer_recipe(recipe, skip, l)) == MOE_RECIPE_FP8_BLOCK;
    return train && (fp8 || moe_model_layer_mx(cfg, recipe, skip, l)) ? MOE_DTYPE_BF16
                                                                      : MOE_DTYPE_F32;
}

/* Bytes of the one gradient allocation (moe_model.grad_mem) for `dense` dense and `experts`
 * expert elements: the dense part's fp32 gradients, then the experts' in dt, one flat fp32
 * array, or for bf16 ones from the next 256 bytes. */
static size_t grad_dense_bytes(int64_t dense, moe_dtype dt) {
    size_t b = (size_t)dense * sizeof(float);
    return dt == MOE_DTYPE_F32 ? b : (b + 255) / 256 * 256;
}
static size_t grads_bytes(int64_t dense, int64_t experts, moe_dtype dt) {
    return grad_dense_bytes(dense, dt) + (size_t)experts * moe_dtype_size(dt);
}
static size_t grad_bytes(const moe_param_table *t, moe_dtype dt) {
    return grads_bytes(t->dense_elems, t->n_elems - t->dense_elems, dt);
}
/* The experts' gradients [n_elems - dense_elems] dev, in m->expert_grad_dt. */
static void *expert_grads(const moe_model *m) {
    return (char *)m->grad_mem + grad_dense_bytes(m->table.dense_elems, m->expert_grad_dt);
}
/* moe_param.grad / grad16 of every tensor into grad_mem (NULL without gradients). */
static void point_grads(moe_model *m) {
    moe_param_table *t = &m->table;
    for (int i = 0; i < t->n_params; i++) {
        moe_param *p = &t->params[i];
        int bf = i >= t->n_dense && m->expert_grad_dt == MOE_DTYPE_BF16;
        p->grad = m->grad_mem && !bf ? m->grad_mem + p->offset : NULL;
        p->grad16 =
            m->grad_mem && bf ? (uint16_t *)expert_grads(m) + (p->offset - t->dense_elems) : NULL;
    }
}

/* Bytes of an activation of n elements: MXFP8 (n e4m3 values, then n / 32 e8m0 scales) or n
 * elements of ef bytes. */
static size_t act_bytes(int64_t n, int mx, size_t ef) {
    return mx ? (size_t)(n + n / 32) : (size_t)n * ef;
}

/* Bytes of layer l's ln1 [N, C] (ef bytes an element, or MXFP8 in a layer that stores it):
 * in a training plan (train) under fp8-block, a layer not in skip, room for it as an
 * fp8-block pair of one group too (both copies with their scales and padding,
 * moe_fp8_pair_bytes_max; model_pass.c's ln1_pair writes it where the backend takes pairs). */
static size_t ln1_bytes(const moe_model_config *cfg, moe_recipe recipe, const uint8_t *skip, int l,
                        int train, int64_t N, size_t ef) {
    const int64_t C = cfg->hidden_size;
    const size_t b = act_bytes(N * C, moe_model_layer_mx(cfg, recipe, skip, l), ef);
    if (!train || moe_recipe_format(recipe) != MOE_RECIPE_FP8_BLOCK || (skip && skip[l])) return b;
    const size_t pb = moe_fp8_pair_bytes_max(N, 1, C);
    return pb > b ? pb : b;
}

/* The expert activations of one layer, or of the shared set (see moe_layer_acts): the
 * expert side gets cap rows, and its own xe/ye only with expert parallelism (own); xp, xe,
 * h1 and h3 in MXFP8 when mx (yp and ye stay ef); xp with room for an fp8-block pair of E
 * groups too when xpair (moe_xe_pair_room). g is not among them: it lives in the region of
 * moe_acts_plan's phases. */
static void carve_experts(moe_layer_acts *la, size_t *off, char *base, int64_t NK, int64_t cap,
                          int own, int64_t C, int64_t F, int64_t E, size_t ef, int mx, int xpair) {
    const size_t xb = act_bytes(NK * C, mx, ef), pb = xpair ? moe_fp8_pair_bytes_max(NK, E, C) : 0;
    la->xp = carve(off, base, pb > xb ? pb : xb);
    la->h1 = carve(off, base, act_bytes(cap * F, mx, ef));
    la->h3 = carve(off, base, act_bytes(cap * F, mx, ef));
    la->yp = carve(off, base, (size_t)(NK * C) * ef);
    la->xe = own ? carve(off, base, act_bytes(cap * C, mx, ef)) : la->xp;
    la->ye = own ? carve(off, base, (size_t)(cap * C) * ef) : la->yp;
}

/* The MXFP8 scales of a layer whose ln1 and expert path are stored so: each after its
 * buffer's values (a buffer sized for ef bytes an element has room for them too); else NULL. */
static void act_scales(moe_layer_acts *la, int64_t N, int64_t NK, int64_t cap, int64_t C, int64_t F,
                       int mx) {
    la->ln1_mx = mx ? (uint8_t *)la->ln1 + N * C : NULL;
    la->xp_mx = mx ? (uint8_t *)la->xp + NK * C : NULL;
    la->xe_mx = mx ? (uint8_t *)la->xe + cap * C : NULL;
    la->h1_mx = mx ? (uint8_t *)la->h1 + cap * F : NULL;
    la->h3_mx = mx ? (uint8_t *)la->h3 + cap * F : NULL;
    la->g_mx = mx ? (uint8_t *)la->g + cap * F : NULL;
}

size_t moe_acts_plan(const moe_model_config *cfg, int64_t N, int plan, moe_recipe recipe, int ep,
                     const uint8_t *skip, struct moe_acts *a, char *base) {
    int64_t C = cfg->hidden_size, V = cfg->vocab_size, F = cfg->intermediate_size;
    int64_t E = cfg->num_local_experts, K = cfg->num_experts_per_tok;
    int64_t D = cfg->hidden_size / cfg->num_attention_heads;
    int64_t HD = cfg->num_attention_heads * D, KVD = cfg->num_key_value_heads * D;
    int64_t NK = N * K, L = cfg->num_hidden_layers, cap = moe_model_expert_rows_max(cfg, N, ep);
    const int own = ep > 1; /* expert parallelism: the expert side has buffers of its own */
    size_t off = 0, f = sizeof(float), i4 = sizeof(int32_t);
    size_t ef = moe_dtype_size(moe_model_act_dtype(recipe)); /* the void * activations */
    int train = plan != MOE_PLAN_FORWARD, keep_attn, keep_mid, keep_moe;
    plan_keeps(plan, &keep_attn, &keep_mid, &keep_moe);
    /* all_mx: every layer stores MXFP8 (the shared buffers are sized so too); any_mx: one does;
     * all_dg16: every layer's dg is bf16 */
    int all_mx = 1, any_mx = 0, all_dg16 = 1, any_xpair = 0;
    size_t ln1_max = 0; /* the largest layer's ln1: the shared one's size */
    for (int l = 0; l < (int)L; l++) {
        const int mx = moe_model_layer_mx(cfg, recipe, skip, l);
        const size_t b = ln1_bytes(cfg, recipe, skip, l, train, N, ef);
        all_mx &= mx, any_mx |= mx;
        any_xpair |= moe_xe_pair_room(cfg, recipe, skip, l, train, ep);
        all_dg16 &= dg_type(cfg, recipe, skip, l, train) == MOE_DTYPE_BF16;
        ln1_max = b > ln1_max ? b : ln1_max;
    }
    /* bytes an element of x_mid when not kept (of the layers' rdt type) and of dg (dgt): bf16
     * when every layer's is, else fp32 */
    const size_t rf = train && all_mx ? sizeof(uint16_t) : f;
    const size_t gf = train && all_dg16 ? sizeof(uint16_t) : f;
    moe_layer_acts sh; /* the shared set: groups that are not kept point here in every layer */
    memset(&sh, 0, sizeof sh);
    if (!keep_attn) {
        sh.ln1 = carve(&off, base, ln1_max);
        sh.rstd1 = carve(&off, base, (size_t)N * f);
        sh.q = carve(&off, base, (size_t)(N * HD) * ef);
        sh.k = carve(&off, base, (size_t)(N * KVD) * ef);
        sh.v = carve(&off, base, (size_t)(N * KVD) * ef);
        sh.att = carve(&off, base, (size_t)(N * HD) * ef);
        sh.att_lse = carve(&off, base, (size_t)(N * cfg->num_attention_heads) * f);
    }
    if (!keep_mid) sh.x_mid = carve(&off, base, (size_t)(N * C) * rf);
    if (!keep_moe) {
        sh.ln2 = carve(&off, base, (size_t)(N * C) * ef);
        sh.rstd2 = carve(&off, base, (size_t)N * f);
        sh.rlogits = carve(&off, base, (size_t)(N * E) * f);
        sh.probs = carve(&off, base, (size_t)(N * E) * f);
        sh.rlse = carve(&off, base, (size_t)N * f);
        sh.topk_idx = carve(&off, base, (size_t)NK * i4);
        sh.topk_w = carve(&off, base, (size_t)NK * f);
        sh.row_src = carve(&off, base, (size_t)NK * i4);
        sh.slot_row = carve(&off, base, (size_t)NK * i4);
        sh.offsets = carve(&off, base, (size_t)(E + 1) * i4);
        carve_experts(&sh, &off, base, NK, cap, own, C, F, E, ef, all_mx, any_xpair);
    }
    /* A training layer that stores MXFP8 keeps no ln2 of its own: the backward makes it again
     * from x_mid for the router's weight gradient, its one reader there (the same op on the
     * same input: the same bits). */
    void *ln2_again = train && keep_moe && any_mx ? carve(&off, base, (size_t)(N * C) * ef) : NULL;
    /* router statistics of every layer, read after the whole forward in one copy each */
    int32_t *counts_all = carve(&off, base, (size_t)(L * E) * i4);
    float *rstats_all = carve(&off, base, (size_t)(L * (E + 2)) * f);
    /* forward-only: the residual stream ping-pongs between two buffers */
    float *xbuf[2] = {NULL, NULL};
    if (!train) {
        xbuf[0] = carve(&off, base, (size_t)(N * C) * f);
        xbuf[1] = carve(&off, base, (size_t)(N * C) * f);
    }
    for (int64_t l = 0; l < L; l++) {
        moe_layer_acts tmp, *la = base ? &a->layer[l] : &tmp;
        const int mx = moe_model_layer_mx(cfg, recipe, skip, (int)l);
        *la = sh;
        la->rdt = train && mx ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        la->dgt = dg_type(cfg, recipe, skip, (int)l, train);
        size_t rbytes = (size_t)(N * C) * moe_dtype_size(la->rdt);
        la->x_in = train ? carve(&off, base, rbytes) : xbuf[l & 1];
        if (keep_attn) {
            la->ln1 = carve(&off, base, ln1_bytes(cfg, recipe, skip, (int)l, train, N, ef));
            la->rstd1 = carve(&off, base, (size_t)N * f);
            la->q = carve(&off, base, (size_t)(N * HD) * ef);
            la->k = carve(&off, base, (size_t)(N * KVD) * ef);
            la->v = carve(&off, base, (size_t)(N * KVD) * ef);
            la->att = carve(&off, base, (size_t)(N * HD) * ef);
            la->att_lse = carve(&off, base, (size_t)(N * cfg->num_attention_heads) * f);
        }
        if (keep_mid) la->x_mid = carve(&off, base, rbytes);
        if (keep_moe) {
            la->remake_ln2 = train && mx;
            la->ln2 = la->remake_ln2 ? ln2_again : carve(&off, base, (size_t)(N * C) * ef);
            la->rstd2 = carve(&off, base, (size_t)N * f);
            la->rlogits = carve(&off, base, (size_t)(N * E) * f);
            la->probs = carve(&off, base, (size_t)(N * E) * f);
            la->rlse = carve(&off, base, (size_t)N * f);
            la->topk_idx = carve(&off, base, (size_t)NK * i4);
            la->topk_w = carve(&off, base, (size_t)NK * f);
            la->row_src = carve(&off, base, (size_t)NK * i4);
            la->slot_row = carve(&off, base, (size_t)NK * i4);
            la->offsets = carve(&off, base, (size_t)(E + 1) * i4);
            carve_experts(la, &off, base, NK, cap, own, C, F, E, ef, mx,
                          moe_xe_pair_room(cfg, recipe, skip, (int)l, train, ep));
        }
        /* router statistics are read after the whole forward: always per layer (tiny) */
        la->counts = counts_all ? counts_all + l * E : NULL;
        la->rstats = rstats_all ? rstats_all + l * (E + 2) : NULL;
    }
    struct moe_acts tmp, *p = base ? a : &tmp;
    memset(&tmp, 0, sizeof tmp);
    p->plan = plan;
    p->keep_attn = keep_attn;
    p->keep_mid = keep_mid;
    p->keep_moe = keep_moe;
    p->adt = moe_model_act_dtype(recipe);
    p->g_layer = -1;
    p->x_final = train ? carve(&off, base, (size_t)(N * C) * f) : xbuf[L & 1];
    p->lnf = carve(&off, base, (size_t)(N * C) * f);
    p->rstdf = carve(&off, base, (size_t)N * f);
    p->tokens = carve(&off, base, (size_t)N * i4);
    p->pool_range = carve(&off, base, (size_t)(2 * N) * i4);
    p->tmp = carve(&off, base, (size_t)(N * C) * f);
    /* One region for buffers whose lifetimes never overlap (moe_model_backward's order):
     * g, the SwiGLU output, in each layer's forward and again at the start of its backward
     * (made again from h1 and h3 for w2's weight gradient); dg over it once that gradient
     * has read g; dxe and dxp once SwiGLU's backward has read dg; the attention gradients
     * once permute's backward has read dxp. Forward-only plans hold g alone. */
    size_t u = off, uend = off;
    void *g = carve(&u, base,
                    train ? (size_t)(cap * F) * gf /* dg; g fits */
                          : act_bytes(cap * F, all_mx, ef));
    p->dg = train ? g : NULL;
    if (base)
        for (int64_t l = 0; l < L; l++) {
            a->layer[l].g = g;
            act_scales(&a->layer[l], N, NK, cap, C, F,
                       moe_model_layer_mx(cfg, recipe, skip, (int)l));
        }
    if (!train) return u; /* hidden states only: no logits, losses or gradients */
    uend = u, u = off;
    float *dxe = own ? carve(&u, base, (size_t)(cap * C) * f) : NULL;
    p->dxp = carve(&u, base, (size_t)(NK * C) * f);
    p->dxe = own ? dxe : p->dxp;
    uend = u > uend ? u : uend;
    /* fp8-block: dh1 and dh3 as fp8-block pairs, written by SwiGLU's backward while it reads
     * dg and read by the w1 and w3 products while they write dxe: after both. dh1p holds g
     * as a pair before that (SwiGLU's forward to w2's products, forward and backward), where
     * no other buffer of the forward lies */
    p->dh1p = p->dh3p = NULL;
    if (moe_recipe_format(recipe) == MOE_RECIPE_FP8_BLOCK) {
        const size_t pb = moe_fp8_pair_bytes_max(cap, E / (ep > 1 ? ep : 1), F);
        p->dh1p = carve(&uend, base, pb);
        p->dh3p = carve(&uend, base, pb);
    }
    u = off;
    p->datt = carve(&u, base, (size_t)(N * HD) * f);
    p->dq = carve(&u, base, (size_t)(N * HD) * f);
    p->dk = carve(&u, base, (size_t)(N * KVD) * f);
    p->dv = carve(&u, base, (size_t)(N * KVD) * f);
    off = u > uend ? u : uend;
    p->logits = carve(&off, base, (size_t)(N * V) * f);
    p->ce_loss = carve(&off, base, (size_t)N * f);
    p->ce_lse = carve(&off, base, (size_t)N * f);
    p->targets = carve(&off, base, (size_t)N * i4);
    p->weights = carve(&off, base, (size_t)N * f);
    p->dres = carve(&off, base, (size_t)(N * C) * f);
    p->dln = carve(&off, base, (size_t)(N * C) * f);
    p->drl = carve(&off, base, (size_t)(N * E) * f);
    p->dtw = carve(&off, base, (size_t)NK * f);
    p->dprob = carve(&off, base, (size_t)(L * E) * f);
    /* dyp, dh1 and dh3 have no buffers: the backward writes them over the layer's yp, h1
     * and h3, whose last reader is the op that writes them (unpermute's and swiglu's
     * backward, in place) */
    p->dye = own ? carve(&off, base, (size_t)(cap * C) * ef) : NULL; /* NULL: the layer's yp */
    p->xfer = own ? carve(&off, base, (size_t)(cap * C) * f) : NULL;
    p->doc_start = carve(&off, base, (size_t)N * i4);
    p->positions = carve(&off, base, (size_t)N * i4);
    return off;
}

/* ---- lifetime ---- */

static moe_status check_config(const moe_model_config *c, int max_batch, int max_seq,
                               moe_err *err) {
#define NEED(cond, ...)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            moe_err_set(err, MOE_ERR_INPUT, NULL, __VA_ARGS__);                                    \
            return MOE_ERR_INPUT;                                                                  \
        }                                                                                          \
    } while (0)
    NEED(c->vocab_size > 0 && c->hidden_size > 0 && c->intermediate_size > 0 &&
             c->num_hidden_layers > 0 && c->num_attention_heads > 0 && c->num_key_value_heads > 0 &&
             c->num_local_experts > 0 && c->num_experts_per_tok > 0,
         "model sizes must all be positive");
    NEED(c->hidden_size % c->num_attention_heads == 0,
         "model.hidden_size %lld is not a multiple of model.num_attention_heads %lld",
         (long long)c->hidden_size, (long long)c->num_attention_heads);
    NEED((c->hidden_size / c->num_attention_heads) % 2 == 0,
         "head dim (hidden_size / num_attention_heads = %lld) must be even for RoPE",
         (long long)(c->hidden_size / c->num_attention_heads));
    NEED(c->num_attention_heads % c->num_key_value_heads == 0,
         "model.num_attention_heads %lld is not a multiple of model.num_key_value_heads %lld",
         (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    NEED(c->num_experts_per_tok <= c->num_local_experts,
         "model.num_experts_per_tok %lld exceeds model.num_local_experts %lld",
         (long long)c->num_experts_per_tok, (long long)c->num_local_experts);
    NEED(c->vocab_size <= INT32_MAX, "model.vocab_size %lld does not fit token ids",
         (long long)c->vocab_size);
    NEED(max_batch > 0 && max_seq > 0, "batch (%d) and sequence length (%d) must be positive",
         max_batch, max_seq);
    NEED(max_seq <= c->max_position_embeddings,
         "sequence length %d exceeds model.max_position_embeddings %lld", max_seq,
         (long long)c->max_position_embeddings);
    NEED((int64_t)max_batch * max_seq * c->num_experts_per_tok < INT32_MAX,
         "batch x sequence x experts_per_tok = %lld routed rows is too many for one micro-batch",
         (long long)max_batch * max_seq * c->num_experts_per_tok);
#undef NEED
    return MOE_OK;
}

static moe_status create_plan(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                              int plan, const moe_backend *be, int max_batch, int max_seq,
                              const moe_model_ep *ep, moe_err *err) {
    memset(m, 0, sizeof *m);
    m->doc_sep = -1;
    m->ep.size = 1;
    if (ep && ep->size > 1) m->ep = *ep;
    int P = m->ep.size; /* ranks per expert group */
    if (check_config(cfg, max_batch, max_seq, err) != MOE_OK) {
        moe_err_hint(err, "fix the model section of the config");
        return MOE_ERR_INPUT;
    }
    moe_op_dims dims;
    moe_model_op_dims(cfg, max_batch, max_seq, &dims);
    if (moe_backend_check(be, &dims, recipe, err) != MOE_OK) return MOE_ERR_INPUT;
    m->cfg = *cfg;
    m->recipe = recipe;
    m->be = be;
    m->max_batch = max_batch;
    m->max_seq = max_seq;
    m->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    int L = (int)cfg->num_hidden_layers, E = (int)cfg->num_local_experts;
    int64_t N = (int64_t)max_batch * max_seq;
    if (E % P || m->ep.rank < 0 || m->ep.rank >= P) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "expert rank %d of %d: the %d experts do not split evenly over the group",
                    m->ep.rank, P, E);
        return MOE_ERR_INPUT;
    }
    if (N * cfg->num_experts_per_tok * P >= INT32_MAX) { /* the expert side's row offsets */
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "%lld routed rows per micro-batch x %d expert-parallel ranks is too many for "
                    "one rank's experts",
                    (long long)(N * cfg->num_experts_per_tok), P);
        moe_err_hint(err, "use a smaller train.micro_batch_tokens");
        return MOE_ERR_INPUT;
    }
    moe_status tst = moe_param_table_build(&m->table, cfg, (int64_t)E / P * m->ep.rank,
                                           (int64_t)E / P * (m->ep.rank + 1), err);
    if (tst != MOE_OK) {
        moe_model_free(m);
        return tst;
    }
    moe_param_table *t = &m->table;
    m->acts = calloc(1, sizeof(struct moe_acts));
    m->expert_tokens = calloc((size_t)(L * E), sizeof(int64_t));
    if (!m->acts || !m->expert_tokens) goto oom;
    struct moe_acts *a = m->acts;
    a->layer = calloc((size_t)L, sizeof(moe_layer_acts));
    a->h_offsets = calloc((size_t)(L * (E + 1)), sizeof(int32_t));
    a->h_loss = calloc((size_t)N, sizeof(float));
    if (!a->layer || !a->h_offsets || !a->h_loss) goto oom;
    a->ep = P;
    if (P > 1) {
        a->ep_rows = calloc((size_t)(L * E), sizeof(int64_t));
        a->ep_off = calloc((size_t)(L * (E / P + 1)), sizeof(int32_t));
        if (!a->ep_rows || !a->ep_off) goto oom;
    }
    if (plan != MOE_PLAN_FORWARD) {
        a->h_doc = calloc((size_t)(2 * N), sizeof(int32_t));
        if (!a->h_doc) goto oom;
    }
    /* a forward-only bf16 model holds its matrix weights in bf16 only (no optimizer step to
     * refresh copies from): fp32 just for the tensors that stay fp32, packed */
    m->weights16_only = plan == MOE_PLAN_FORWARD && recipe == MOE_RECIPE_BF16;
    int copies = m->weights16_only || moe_model_has_copies(recipe, plan != MOE_PLAN_FORWARD);
    m->param_elems = m->weights16_only ? moe_model_f32_elems(t) : t->n_elems;
    m->param_mem = be->alloc(be, (size_t)m->param_elems * sizeof(float));
    m->expert_grad_dt = MOE_DTYPE_F32;
    if (plan != MOE_PLAN_FORWARD) m->grad_mem = be->alloc(be, grad_bytes(t, m->expert_grad_dt));
    if (copies) m->param16_mem = be->alloc(be, (size_t)t->n_elems * sizeof(uint16_t));
    if (!m->param_mem || (plan != MOE_PLAN_FORWARD && !m->grad_mem) || (copies && !m->param16_mem))
        goto oom;
    moe_model_point_params(m);
    point_grads(m);
    /* zero weights, zero copies: right, but training models say so once */
    m->copies_stale = !m->weights16_only;
    a->max_tokens = N;
    a->bytes = moe_acts_plan(cfg, N, plan, recipe, P, NULL, a, NULL);
    a->mem = be->alloc(be, a->bytes);
    if (!a->mem) goto oom;
    moe_acts_plan(cfg, N, plan, recipe, P, NULL, a, a->mem);
    return MOE_OK;
oom:;
    size_t pbytes = (size_t)(m->weights16_only ? m->param_elems : m->table.n_elems) * sizeof(float);
    size_t abytes = moe_acts_plan(cfg, N, plan, recipe, P, NULL, NULL, NULL);
    int copies16 = m->weights16_only || moe_model_has_copies(recipe, plan != MOE_PLAN_FORWARD);
    size_t cbytes = copies16 ? (size_t)m->table.n_elems * sizeof(uint16_t) : 0;
    size_t gbytes = plan == MOE_PLAN_FORWARD ? 0 : (size_t)m->table.n_elems * sizeof(float);
    moe_model_free(m);
    moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                "out of %s memory for the model (%.1f MiB fp32 weights + %.1f MiB bf16 weights + "
                "%.1f MiB gradients + %.1f MiB activations)",
                be->name, pbytes / 1048576.0, cbytes / 1048576.0, gbytes / 1048576.0,
                abytes / 1048576.0);
    moe_err_hint(err, plan == MOE_PLAN_FORWARD
                          ? "use a smaller batch or window"
                          : "use a smaller micro batch (train.micro_batch_tokens), "
                            "train.recompute=full, or a smaller model");
    return MOE_ERR_RUNTIME;
}

moe_status moe_model_create(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                            moe_recompute recompute, const moe_backend *be, int max_batch,
                            int max_seq, moe_err *err) {
    return moe_model_create_ep(m, cfg, recipe, recompute, be, max_batch, max_seq, NULL, err);
}

moe_status moe_model_create_ep(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                               moe_recompute recompute, const moe_backend *be, int max_batch,
                               int max_seq, const moe_model_ep *ep, moe_err *err) {
    if ((int)recompute < MOE_RECOMPUTE_NONE || (int)recompute > MOE_RECOMPUTE_FULL) {
        memset(m, 0, sizeof *m);
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "train.recompute %d is not one of none, attn, moe, full",
                           (int)recompute);
    }
    return create_plan(m, cfg, recipe, (int)recompute, be, max_batch, max_seq, ep, err);
}

moe_status moe_model_create_forward_only(moe_model *m, const moe_model_config *cfg,
                                         moe_recipe recipe, const moe_backend *be, int max_batch,
                                         int max_seq, moe_err *err) {
    return create_plan(m, cfg, recipe, MOE_PLAN_FORWARD, be, max_batch, max_seq, NULL, err);
}

moe_status moe_model_set_document_separator(moe_model *m, int32_t sep, moe_err *err) {
    if (sep < -1 || sep >= m->cfg.vocab_size)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "document separator id %d is outside [-1, %lld) (-1 = no mask)", sep,
                           (long long)m->cfg.vocab_size);
    if (sep >= 0 && m->acts->plan == MOE_PLAN_FORWARD)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "a forward-only model has no document mask (one sequence per row)");
    m->doc_sep = sep;
    return MOE_OK;
}

moe_status moe_model_replan_acts(moe_model *m, moe_err *err) {
    struct moe_acts *a = m->acts;
    const moe_recipe f = moe_recipe_format(m->recipe);
    /* the plans that depend on the skipped layers: mxfp8's (the stored types) and both fp8
     * recipes' dg (moe_layer_acts.dgt) */
    if ((f != MOE_RECIPE_MXFP8 && f != MOE_RECIPE_FP8_BLOCK) || !a || !a->mem) return MOE_OK;
    const moe_backend *be = m->be;
    be->free(be, a->mem);
    a->bytes =
        moe_acts_plan(&m->cfg, a->max_tokens, a->plan, m->recipe, a->ep, m->skip_quant, a, NULL);
    a->mem = be->alloc(be, a->bytes);
    if (!a->mem) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of %s memory for %.1f MiB of activations",
                    be->name, a->bytes / 1048576.0);
        moe_err_hint(err, "use a smaller micro batch (train.micro_batch_tokens) or "
                          "train.recompute=full");
        return MOE_ERR_RUNTIME;
    }
    moe_acts_plan(&m->cfg, a->max_tokens, a->plan, m->recipe, a->ep, m->skip_quant, a, a->mem);
    return MOE_OK;
}

moe_status moe_model_alloc_head(moe_model *m, moe_err *err) {
    struct moe_acts *a = m->acts;
    if (a->logits) return MOE_OK; /* a training plan, or an earlier call */
    int64_t N = a->max_tokens, V = m->cfg.vocab_size;
    size_t off = 0, bytes = (size_t)(N * V + 2 * N) * sizeof(float) + (size_t)N * sizeof(int32_t);
    a->head_mem = m->be->alloc(m->be, bytes + 4 * MOE_ACT_ALIGN);
    if (!a->head_mem) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                    "out of %s memory for the logits of %lld tokens (%.1f MiB)", m->be->name,
                    (long long)N, bytes / 1048576.0);
        moe_err_hint(err, "use a smaller batch (--batch-tokens) or window");
        return MOE_ERR_RUNTIME;
    }
    char *base = a->head_mem;
    a->logits = carve(&off, base, (size_t)(N * V) * sizeof(float));
    a->ce_loss = carve(&off, base, (size_t)N * sizeof(float));
    a->ce_lse = carve(&off, base, (size_t)N * sizeof(float));
    a->targets = carve(&off, base, (size_t)N * sizeof(int32_t));
    return MOE_OK;
}

void moe_model_free(moe_model *m) {
    if (!m) return;
    if (m->be) {
        m->be->free(m->be, m->param_mem);
        m->be->free(m->be, m->param16_mem);
        m->be->free(m->be, m->param_lo_mem);
        m->be->free(m->be, m->param8_mem);
        m->be->free(m->be, m->grad_mem);
        if (m->acts) m->be->free(m->be, m->acts->mem);
        if (m->acts) m->be->free(m->be, m->acts->head_mem);
    }
    if (m->acts) {
        free(m->acts->layer);
        free(m->acts->h_offsets);
        free(m->acts->ep_rows);
        free(m->acts->ep_off);
        free(m->acts->h_loss);
        free(m->acts->h_doc);
        free(m->acts);
    }
    moe_param_table_free(&m->table);
    free(m->expert_tokens);
    free(m->skip_quant);
    memset(m, 0, sizeof *m);
}

int64_t moe_model_n_params(const moe_model *m) {
    return m->table.n_elems;
}

void moe_model_copy_grads_to_host(const moe_model *m, float *dst) {
    const moe_param_table *t = &m->table;
    if (!m->grad_mem || m->grads_stale) { /* forward-only model, or zero since zero_grad */
        memset(dst, 0, (size_t)t->n_elems * sizeof(float));
        return;
    }
    if (m->expert_grad_dt == MOE_DTYPE_F32) {
        m->be->memcpy_d2h(m->be, dst, m->grad_mem, (size_t)t->n_elems * sizeof(float));
        return;
    }
    m->be->memcpy_d2h(m->be, dst, m->grad_mem, (size_t)t->dense_elems * sizeof(float));
    uint16_t *s = moe_model_host16(m, 1); /* the experts' bf16 gradients widened, one by one */
    for (int i = t->n_dense; i < t->n_params; i++) {
        const moe_param *p = &t->params[i];
        m->be->memcpy_d2h(m->be, s, p->grad16, (size_t)p->numel * sizeof(uint16_t));
        for (int64_t j = 0; j < p->numel; j++)
            dst[p->offset + j] = moe_bf16_to_f32(s[j]);
    }
    free(s);
}

void moe_model_zero_grad(moe_model *m) {
    if (m->grad_mem) m->grads_stale = 1; /* nothing to do for a forward-only model */
}

moe_buf moe_model_grads_at(moe_model *m, int64_t i) {
    const moe_param_table *t = &m->table;
    if (!m->grad_mem) return moe_buf_f32(NULL);
    if (m->grads_stale) {
        m->be->memset(m->be, m->grad_mem, 0, grad_bytes(t, m->expert_grad_dt));
        m->grads_stale = 0;
    }
    if (i < t->dense_elems) return moe_buf_f32(m->grad_mem + i);
    return moe_buf_at(moe_buf_of(expert_grads(m), m->expert_grad_dt), i - t->dense_elems);
}

double moe_model_grad_sum_squares(moe_model *m, int64_t lo, int64_t hi) {
    /* one pass over fp32 gradients; bf16 expert ones are a pass of their own */
    const int64_t d = m->expert_grad_dt == MOE_DTYPE_F32 ? hi : m->table.dense_elems;
    const int64_t mid = lo < d ? (hi < d ? hi : d) : lo;
    double s = 0.0;
    if (mid > lo)
        s += m->be->sum_squares(m->be, moe_cbuf_from(moe_model_grads_at(m, lo)), mid - lo);
    if (hi > mid)
        s += m->be->sum_squares(m->be, moe_cbuf_from(moe_model_grads_at(m, mid)), hi - mid);
    return s;
}

moe_status moe_model_set_expert_grads(moe_model *m, moe_dtype dt, moe_err *err) {
    if (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_BF16)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "expert gradients of type %s (fp32 or bf16)",
                           moe_dtype_name(dt));
    if (!m->grad_mem)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "a forward-only model has no gradients to keep in %s",
                           moe_dtype_name(dt));
    if (dt == m->expert_grad_dt) return MOE_OK;
    m->be->free(m->be, m->grad_mem);
    m->expert_grad_dt = dt;
    m->grad_mem = m->be->alloc(m->be, grad_bytes(&m->table, dt));
    point_grads(m);
    if (!m->grad_mem)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "out of memory for the gradients (%.2f GiB, experts' in %s)",
                           (double)grad_bytes(&m->table, dt) / 1073741824.0, moe_dtype_name(dt));
    m->grads_stale = 1;
    return MOE_OK;
}

/* ---- sizes for --dry-run ---- */

void moe_model_count_params(const moe_model_config *c, int64_t *total, int64_t *active) {
    int64_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    int64_t D = c->num_attention_heads > 0 ? C / c->num_attention_heads : 0;
    int64_t HD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D;
    int64_t dense = 2 * C + C * HD + 2 * C * KVD + HD * C + c->num_local_experts * C;
    int64_t expert = 3 * C * F;
    int64_t outer = V * C + C + (c->tie_word_embeddings ? 0 : V * C);
    int64_t L = c->num_hidden_layers;
    if (total) *total = outer + L * (dense + c->num_local_experts * expert);
    if (active) *active = outer + L * (dense + c->num_experts_per_tok * expert);
}

double moe_model_flops_per_token(const moe_model_config *c, int64_t seq) {
    double C = (double)c->hidden_size, F = (double)c->intermediate_size;
    double D = c->num_attention_heads > 0 ? (double)(c->hidden_size / c->num_attention_heads) : 0;
    double HD = (double)c->num_attention_heads * D, KVD = (double)c->num_key_value_heads * D;
    double L = (double)c->num_hidden_layers;
    double per_layer = C * HD + 2.0 * C * KVD + HD * C +
                       (double)c->num_experts_per_tok * 3.0 * C * F +
                       C * (double)c->num_local_experts;
    double matmul = L * per_layer + (double)c->vocab_size * C;
    return 6.0 * matmul + 6.0 * L * (double)seq * C;
}

int64_t moe_model_activation_bytes(const moe_model_config *cfg, moe_recipe recipe,
                                   moe_recompute recompute, int64_t batch, int64_t seq) {
    if (cfg->num_attention_heads <= 0) return 0;
    return (int64_t)moe_acts_plan(cfg, batch * seq, (int)recompute, recipe, 1, NULL, NULL, NULL);
}

void moe_model_op_dims(const moe_model_config *c, int64_t batch, int64_t seq, moe_op_dims *d) {
    memset(d, 0, sizeof *d);
    d->B = batch;
    d->T = seq;
    d->C = c->hidden_size;
    d->H = c->num_attention_heads;
    d->KV = c->num_key_value_heads;
    d->D = c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
    d->V = c->vocab_size;
    d->E = c->num_local_experts;
    d->K = c->num_experts_per_tok;
    d->F = c->intermediate_size;
}

void moe_model_memory_estimate(const moe_model_config *cfg, moe_recipe recipe,
                               moe_recompute recompute, int64_t batch, int64_t seq, int ep,
                               const uint8_t *skip, moe_dtype moments, moe_dtype expert_grads,
                               moe_master master, moe_model_memory *out) {
    int64_t total = 0;
    moe_model_count_params(cfg, &total, NULL);
    if (ep < 1) ep = 1;
    int64_t experts = cfg->num_hidden_layers * cfg->num_local_experts * 3 * cfg->hidden_size *
                      cfg->intermediate_size;
    int64_t mine = total - experts + experts / ep; /* the dense part and E/ep experts */
    /* the fp32 masters: all, or under a split master the tensors the table keeps in fp32
     * (dense ones: a table of one expert holds them all; a shape the table refuses counts as
     * all fp32) */
    int64_t f32 = mine;
    moe_param_table t;
    memset(&t, 0, sizeof t);
    if (master == MOE_MASTER_SPLIT && moe_model_has_copies(recipe, 1) &&
        moe_param_table_build(&t, cfg, 0, 1, NULL) == MOE_OK)
        f32 = moe_model_f32_elems(&t);
    moe_param_table_free(&t);
    memset(out, 0, sizeof *out);
    out->params = f32 * (int64_t)sizeof(float) + (mine - f32) * (int64_t)sizeof(uint16_t);
    out->expert_elems = experts / ep;
    out->expert_params = experts / ep * (int64_t)(f32 < mine ? sizeof(uint16_t) : sizeof(float));
    out->grads = (int64_t)grads_bytes(mine - experts / ep, experts / ep, expert_grads);
    out->optimizer = 2 * mine * (int64_t)moe_dtype_size(moments);
    out->weight_copies = moe_model_has_copies(recipe, 1) ? mine * (int64_t)sizeof(uint16_t) : 0;
    if (moe_model_has_fp8_copies(recipe))
        out->fp8_copies = moe_model_fp8_copy_bytes(cfg, cfg->num_local_experts / ep, skip);
    if (cfg->num_attention_heads > 0)
        out->activations =
            (int64_t)moe_acts_plan(cfg, batch * seq, (int)recompute, recipe, ep, skip, NULL, NULL);
    moe_op_dims dims;
    moe_model_op_dims(cfg, batch, seq, &dims);
    unsigned skipped = 0;
    for (int l = 0; skip && l < cfg->num_hidden_layers; l++)
        skipped |= skip[l] ? MOE_SCRATCH_SKIPPED : 0u;
    out->gpu_scratch =
        moe_backend_scratch_estimate("cuda", &dims, recipe, skipped | MOE_SCRATCH_SM90);
    out->gpu_scratch_other = moe_backend_scratch_estimate("cuda", &dims, recipe, skipped);
    out->total = out->params + out->weight_copies + out->fp8_copies + out->grads + out->optimizer +
                 out->activations;
}
