/* model_internal: what model.c (sizes, lifetime) and model_pass.c (forward and backward)
 * share - the activation plan (the per-layer parameter indices are the parameter table's,
 * moe/model_params.h).
 *
 * The one thing a reader must know: activations are carved out of ONE backend allocation by
 * moe_acts_plan(), which is run once with base == NULL to measure (that total is also what
 * moe_model_activation_bytes reports) and once to assign pointers. The plan (recompute mode)
 * decides which per-layer buffers are kept: a group that is not kept points, in every layer,
 * at ONE shared set of buffers that the forward overwrites layer after layer and the backward
 * refills by running that block's forward again (moe_model_recompute_*). */
#ifndef MOE_MODEL_INTERNAL_H
#define MOE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "moe/model.h"

/* Activation plans: the four train.recompute modes (same values as moe_recompute) and a
 * forward-only plan (hidden states for embedding: no backward, no logits, no gradients). */
enum { MOE_PLAN_FORWARD = 4 };

/* dev memory; a group not kept points at the shared set. The void * buffers hold the
 * activations the bf16 recipe rounds anyway, of element type moe_acts.adt. */
typedef struct moe_layer_acts {
    /* F32, or BF16 in a training plan's layer that stores MXFP8 (moe_model_layer_mx): the
     * type of the residual stream x_in and x_mid (Megatron-Core's bf16 residual) */
    moe_dtype rdt;
    /* the type of the layer's dg in the backward (moe_acts.dg): BF16 where the layer trains
     * under mxfp8 (as its residual) or fp8-block (SwiGLU's backward makes dh1 and dh3 from it,
     * quantized to e4m3 next: a bf16 rounding before that is far below theirs), else F32 */
    moe_dtype dgt;
    void *x_in;        /* [N, C] residual stream entering the layer */
    void *ln1;         /* [N, C]; in fp8-block training (a layer not skipped) room for an
                          fp8-block pair of one group too, which it holds where the backend
                          takes pairs (model_pass.c's ln1_pair) */
    float *rstd1;      /* [N] */
    void *q;           /* [N, H*D] after RoPE */
    void *k;           /* [N, KV*D] after RoPE */
    void *v;           /* [N, KV*D] */
    void *att;         /* [N, H*D] attention output (before o_proj) */
    float *att_lse;    /* [B, H, T] */
    void *x_mid;       /* [N, C] residual after attention */
    void *ln2;         /* [N, C] */
    int remake_ln2;    /* ln2 is shared: the backward makes it again from x_mid (mxfp8) */
    float *rstd2;      /* [N] */
    float *rlogits;    /* [N, E] router logits */
    float *probs;      /* [N, E] */
    float *rlse;       /* [N] */
    int32_t *topk_idx; /* [N, K] */
    float *topk_w;     /* [N, K] */
    int32_t *counts;   /* [E], row l of one [L, E] buffer */
    float *rstats;     /* [E + 2], row l of one [L, E + 2] buffer */
    int32_t *row_src;  /* [N*K] */
    int32_t *slot_row; /* [N*K] */
    int32_t *offsets;  /* [E + 1] */
    /* the expert activations: this rank's routed rows xp, yp [N*K]; the rows its experts
     * compute, R of them (R = N*K without expert parallelism), xe .. ye [cap = ep N*K] */
    void *xp; /* [N*K, C] permuted expert inputs; or, under moe_xe_pair_room, room for them
                 as an fp8-block pair of the experts' groups, which it holds where the backend
                 takes pairs (model_pass.c's xe_pair) */
    void *xe; /* [cap, C] rows the local experts received, by expert (= xp at ep 1) */
    void *h1; /* [cap, F] w1 output */
    void *h3; /* [cap, F] w3 output */
    void *g;  /* [cap, F] silu(h1) * h3: one buffer for all layers, moe_acts_plan's phase
                 region (recomputed in the backward, dg over it) */
    void *ye; /* [cap, C] the local experts' outputs, rows as xe (= yp at ep 1) */
    void *yp; /* [N*K, C] expert outputs (unweighted) */
    /* Under mxfp8 (moe_model_layer_mx) ln1, xp, xe, h1, h3 and g are MXFP8 (E4M3 values, the
     * dh1/dh3 written over h1/h3 too) with their e8m0 scales here, [rows, C / 32] or
     * [rows, F / 32] after each buffer's values; NULL when the layer stores them as adt */
    uint8_t *ln1_mx, *xp_mx, *xe_mx, *h1_mx, *h3_mx, *g_mx;
} moe_layer_acts;

struct moe_acts {
    int64_t max_tokens; /* N capacity */
    int plan;           /* moe_recompute value or MOE_PLAN_FORWARD */
    int keep_attn;      /* ln1..att_lse kept per layer (else shared and recomputed) */
    int keep_mid;       /* x_mid kept per layer */
    int keep_moe;       /* ln2..yp kept per layer */
    moe_dtype adt;      /* of the void * activations: moe_model_act_dtype(recipe) */
    void *mem;          /* the single backend allocation */
    size_t bytes;
    moe_layer_acts *layer; /* [L] host array of pointers */
    int32_t *h_offsets;    /* [L, E + 1] host copy of the routed rows' expert offsets */
    /* expert parallelism (ep > 1; else NULL): ep_rows [L, ep, E / ep] host, the rows this
     * rank's local expert j got from rank s in layer l; ep_off [L, E / ep + 1] host, the
     * local experts' offsets into xe (the grouped matmul's); xfer [cap, C] dev, of fp32
     * size, the rows on their way to or from the all-to-all */
    int ep;
    int64_t *ep_rows;
    int32_t *ep_off;
    void *xfer;
    float *x_final;      /* [N, C] residual after the last layer */
    void *lnf;           /* [N, C]: of adt in head_forward (lm_head reads it), F32 from
                            moe_model_hidden (the final-norm hidden states) */
    float *rstdf;        /* [N] */
    float *logits;       /* [N, V], overwritten in place by its gradient in backward */
    float *ce_loss;      /* [N] */
    float *ce_lse;       /* [N] */
    int32_t *tokens;     /* [N] */
    int32_t *pool_range; /* [N, 2] row ranges of moe_model_hidden_pooled */
    int32_t *targets;    /* [N] */
    float *weights;      /* [N] */
    void *tmp;           /* [N, C] o_proj's output before the residual add, of type adt; fp32
                            [B, C] pooled hidden states after a forward */
    /* gradient scratch, shared by all layers */
    float *dres;       /* [N, C] gradient of the residual stream */
    float *dln;        /* [N, C] */
    float *dq, *datt;  /* [N, H*D]; these four, dxp/dxe and dg share one region; once
                          attention's backward has read datt, it holds the rotated dq and dk
                          in bf16 under the bf16 recipe */
    float *dk, *dv;    /* [N, KV*D] */
    float *drl;        /* [N, E] */
    float *dtw;        /* [N, K] */
    float *dprob;      /* [L, E] */
    float *dxp;        /* [N*K, C]; bf16 values where a layer's dxe is written by
                          grouped_dgrad_sum at ep 1 (fp8-block pairs: moe_model_backward) */
    float *dxe;        /* [cap, C] the expert side's dxp (= dxp at ep 1) */
    void *dye;         /* [cap, C] the expert side's dyp, of element type adt; NULL at ep 1
                          (dyp itself). dyp [N*K, C], dh1 and dh3 [cap, F] (read only by
                          the w2 / w1 / w3 products) are written over the layer's yp, h1
                          and h3 */
    void *dg;          /* [cap, F], over g once w2's weight gradient has read it; of the
                          layer's rdt */
    void *dh1p, *dh3p; /* fp8-block training: dh1 and dh3 as fp8-block activation pairs
                          [moe_fp8_pair_bytes_max(cap, local experts, F)] (moe/quant.h), where
                          the backend has fp8_pairs (else h1 and h3 take them as above); in
                          dg's region, after dg and dxp; NULL otherwise. dh1p also holds g as
                          a pair (w2's x) from SwiGLU's forward until SwiGLU's backward */
    int g_layer;       /* the layer whose g the shared region (or dh1p) holds (the last MoE
                          block run), -1 once anything was written over it: the backward
                          makes g again only where it is another layer's */
    /* the document mask (moe_model_set_document_separator), derived from the tokens by each
     * pass; training plans only */
    int32_t *doc_start;   /* [N] first position of each position's document in its row */
    int32_t *positions;   /* [N] position inside the document (RoPE) */
    int32_t *h_doc;       /* [2N] host: doc_start, then positions, before the upload */
    int doc_masked;       /* the last forward ran with the mask: backward (and its recompute)
                             uses the same doc_start and positions */
    const moe_kv_use *kv; /* during a moe_model_logprobs_kv pass: its cached keys, else NULL */
    /* host mirrors of the last forward's inputs and per-token losses */
    float *h_loss;  /* [N] */
    void *head_mem; /* forward-only plan: logits, ce_loss, ce_lse, targets once scored */
    int has_targets, has_weights;
    double weight_sum;
};

/* The most routed rows one rank's experts can receive in a micro-step of N tokens per rank:
 * with expert parallelism every token of the group's ep ranks sends at most min(K, E/ep)
 * rows to a rank (its top-K experts are distinct), so ep * N * min(K, E / ep); N * K
 * without. Never dropping a token costs this worst case. */
int64_t moe_model_expert_rows_max(const moe_model_config *cfg, int64_t N, int ep);
/* Lays the activation buffers for max_tokens tokens, plan (moe_recompute value or
 * MOE_PLAN_FORWARD), recipe, ep ranks per expert group and the layers skip names
 * (precision.skip_layers, [L] host or NULL: their expert path is not MXFP8) out in memory
 * at base (NULL: only measure). a->layer must hold cfg->num_hidden_layers entries when base
 * is non-NULL. Returns the bytes needed. */
size_t moe_acts_plan(const moe_model_config *cfg, int64_t max_tokens, int plan, moe_recipe recipe,
                     int ep, const uint8_t *skip, struct moe_acts *a, char *base);
/* Lays m's activations out again for its skip_quant when their layout depends on it
 * (mxfp8: the skipped layers' expert path is not MXFP8; mxfp8 and fp8-block: their dg is
 * fp32, moe_layer_acts.dgt); a no-op otherwise. Releases the
 * old allocation first; out of memory: MOE_ERR_RUNTIME with a hint. What the buffers held
 * is gone: call it between passes only (moe_model_set_skip_layers). */
moe_status moe_model_replan_acts(moe_model *m, moe_err *err);
/* 1 when layer l stores its expert path (xp, xe, h1, h3, g) in MXFP8: under mxfp8, for a
 * layer skip does not name, when hidden_size and intermediate_size are multiples of 32 (a
 * scale block never spans two rows); else those buffers hold adt. */
int moe_model_layer_mx(const moe_model_config *cfg, moe_recipe recipe, const uint8_t *skip, int l);
/* The element type of the stored activations that the recipe rounds (norm outputs, q/k/v,
 * attention output, expert activations) under recipe: BF16 under bf16 (they hold bf16
 * values anyway), else F32. The same on every backend. */
moe_dtype moe_model_act_dtype(moe_recipe recipe);

/* model_kv.c: kv checked against m and a pass of B x T tokens (moe_model_logprobs_kv's
 * errors); then, per layer l of that pass, its keys k and values v [B * T, KV * D] dev (of
 * type acts->adt, after RoPE) saved into kv->save, or joined after their rows' cached prefix
 * in kv->from's work buffers: *kc, *vc [B, *Tk, KV, D] are what attention then reads
 * (untouched when saving). */
moe_status moe_model_kv_check(const moe_model *m, const moe_kv_use *kv, int B, int T, moe_err *err);
void moe_model_kv_layer(moe_model *m, int l, const moe_kv_use *kv, const void *k, const void *v,
                        int B, int64_t T, moe_cbuf *kc, moe_cbuf *vc, int64_t *Tk);

/* Makes sure the head buffers (logits, ce_loss, ce_lse, targets for max_tokens) exist: a
 * training plan has them; a forward-only plan gets them in a second allocation on the first
 * call (moe_model_logprobs), so that embedding never pays for [N, V] logits. */
moe_status moe_model_alloc_head(moe_model *m, moe_err *err);

/* The recipe of layer l's matrix products: recipe, or its unquantized form for a layer that
 * skip (precision.skip_layers as flags a layer, or NULL) names. */
static inline moe_recipe moe_layer_recipe(moe_recipe recipe, const uint8_t *skip, int l) {
    return skip && skip[l] ? moe_recipe_unquantized(recipe) : recipe;
}
static inline moe_recipe moe_model_layer_recipe(const moe_model *m, int l) {
    return moe_layer_recipe(m->recipe, m->skip_quant, l);
}

/* 1 when a plan that trains (train) gives layer l's expert inputs xe room for an fp8-block
 * activation pair: under fp8-block, a layer skip does not name, without expert parallelism
 * (xe is xp) and with intermediate_size >= hidden_size (h1 holds permute's bf16 rows until
 * quantize_pair has read them). model_pass.c's xe_pair writes it where the backend takes
 * pairs of num_local_experts groups. */
static inline int moe_xe_pair_room(const moe_model_config *cfg, moe_recipe recipe,
                                   const uint8_t *skip, int l, int train, int ep) {
    return train && ep <= 1 &&
           moe_recipe_format(moe_layer_recipe(recipe, skip, l)) == MOE_RECIPE_FP8_BLOCK &&
           cfg->intermediate_size >= cfg->hidden_size;
}

/* The operand the matrix products read for parameter i: its fp8-block copies (E4M3) when the
 * model has them (fp8-block, a layer not in skip_layers), its bf16 copy (bf16 recipe), else
 * the fp32 master weight. */
static inline moe_cbuf moe_model_weight(const moe_model *m, int i) {
    const moe_param *p = &m->table.params[i];
    if (p->data8) return moe_cbuf_e4m3(p->data8, p->scale8);
    if (p->data16) return moe_cbuf_of(p->data16, MOE_DTYPE_BF16);
    return moe_cbuf_f32(p->data);
}

/* ---- master weights (model_masters.c) ---- */

/* 1 for tensor i of t when a packed layout (a forward-only bf16 model's weights16_only, a
 * split master) keeps it in fp32: the tensors no matrix product reads as its weight (norms,
 * the embedding table, the router's gate, which runs in fp32). */
int moe_model_keeps_f32(const moe_param_table *t, int i);
/* The elements of those tensors: param_mem's size in a packed layout. */
int64_t moe_model_f32_elems(const moe_param_table *t);
/* moe_param.data, data16 and lo16 of every tensor into the weight allocations of m's layout
 * (param_mem, param16_mem, param_lo_mem; NULL where one is absent). */
void moe_model_point_params(moe_model *m);
/* Host scratch of per x (the largest tensor's numel) 16-bit values; aborts on host OOM (the
 * model itself fit). Free it with free(). */
uint16_t *moe_model_host16(const moe_model *m, int per);

/* ---- weight copies (model_copies.c) ---- */

/* 1 when a model keeps fp8-block copies of its quantized weights (fp8-block, either scale
 * rule; training or not: the products read no other form of those weights). */
int moe_model_has_fp8_copies(moe_recipe recipe);
/* Bytes of the fp8-block copies of a model of config c with `experts` experts per layer on
 * this rank and the layers with skip[l] = 1 (skip NULL: none) left out: what
 * moe_model_prepare_copies allocates. */
int64_t moe_model_fp8_copy_bytes(const moe_model_config *c, int64_t experts, const uint8_t *skip);
/* Allocates the fp8-block copies if the model has them and they do not exist yet (the first
 * pass, or the first after moe_model_set_skip_layers), marking them stale; every pass entry
 * point calls it before its first op. Out of memory: MOE_ERR_RUNTIME with a hint. */
moe_status moe_model_prepare_copies(moe_model *m, moe_err *err);
/* Rewrites the weight copies (bf16 and fp8-block) from the master weights when they are
 * stale (after a write other than moe_model_adamw); every forward entry point calls it
 * first. */
void moe_model_refresh_copies(moe_model *m);

/* Uploads tokens [B, T] (host; with a document separator also their document starts and
 * positions, moe_model_set_document_separator) and runs the forward up to (not including)
 * layer `upto` (0..L), after refreshing stale weight copies; returns after filling x_in of
 * that layer (or x_final when upto = L). Inputs are validated by the caller. */
void moe_model_run_layers(moe_model *m, const int32_t *tokens, int B, int T, int upto);
/* One block's forward for layer l into that layer's buffers. with_residual: also form the
 * block's residual sum (x_mid, or the next layer's input); the recompute in backward needs
 * x_mid only when it was not kept, and never the MoE block's output. */
void moe_model_attn_block(moe_model *m, int l, int B, int T, int with_residual);
void moe_model_moe_block(moe_model *m, int l, int B, int T, int with_residual);

/* ---- expert parallelism (model_ep.c; only for a model with ep > 1) ---- */

/* The expert side of layer l after its forward routing: the local experts' row offsets
 * [*El + 1] (host) into xe, their number *El and the rows *R they compute. Without expert
 * parallelism: the routed offsets h_offsets of l, E experts, N*K rows. */
const int32_t *moe_model_expert_rows(const moe_model *m, int l, int64_t *El, int64_t *R);
/* Sends this rank's routed rows src [N*K, row_bytes] (dev, sorted by global expert, layer
 * l's h_offsets) to their experts' owners; dst [R, row_bytes] gets the rows of the local
 * experts, grouped by expert. exchange_counts: first exchange and keep the per-expert counts
 * of l (the forward); 0 reuses them (the backward). A failed exchange is kept in
 * m->ep_status and makes the later ones of the pass do nothing. */
void moe_model_ep_dispatch(moe_model *m, int l, const void *src, void *dst, size_t row_bytes,
                           int exchange_counts);
/* The reverse of dispatch: src [R, row_bytes] in the local experts' order back to the ranks
 * the rows came from, into dst [N*K, row_bytes] in this rank's routed order. */
void moe_model_ep_combine(moe_model *m, int l, const void *src, void *dst, size_t row_bytes);

#endif
