/* model_params: THE parameter table of the MoE model - every tensor's Hugging Face name,
 * shape, dtype, offset in the flat parameter array, owner (dense, or expert e of layer l),
 * kind and weight-decay flag, built once from a model config and a local expert range.
 * The model (moe_model_create), checkpoint writing and reading (moe/ckpt.h), moe-convert
 * (to-hf, from-hf, inspect) and reshard all use this one table; nothing else lists tensors.
 *
 * Order (the one thing a reader must know):
 *   dense part   model.embed_tokens; per layer input_layernorm, self_attn.q/k/v/o_proj,
 *                post_attention_layernorm, block_sparse_moe.gate; model.norm; lm_head
 *                (absent when tied)
 *   expert part  per layer l, per kind w1, w2, w3: experts.e0 .. experts.(e1-1)
 * Why: the issue asks for experts grouped by expert index so that "dense = one contiguous
 * range, this rank's experts = one contiguous range" holds by construction: dense gradients
 * are reduced over all ranks and expert gradients over the dp replicas of the same experts,
 * and ZeRO-1 slices are ranges of the flat array, so each must be one range. Inside the
 * expert part each (layer, kind) is one [e1 - e0, out, in] block, which is what the grouped
 * matmul of the MoE block takes as its weight (moe_param_layer.w1/w2/w3 index the block's
 * first tensor). Offsets follow the table order; the checkpoint files are keyed by name
 * (safetensors writes them sorted), so the order never shows in a file.
 * Expert indices in names and in moe_param.expert are GLOBAL ([0, num_local_experts)); the
 * local range [e0, e1) is all experts in one process and E/ep of them on an expert-parallel
 * rank (moe_model_create_ep). */
#ifndef MOE_MODEL_PARAMS_H
#define MOE_MODEL_PARAMS_H

#include <stdint.h>

#include "moe/config.h"
#include "moe/dtype.h"
#include "moe/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moe_param_kind {
    MOE_PARAM_DENSE = 0, /* not an expert weight */
    MOE_PARAM_W1,        /* experts.{e}.w1 [F, C] (gate projection) */
    MOE_PARAM_W2,        /* experts.{e}.w2 [C, F] (down projection) */
    MOE_PARAM_W3,        /* experts.{e}.w3 [F, C] (up projection) */
} moe_param_kind;

typedef struct moe_param { /* one named tensor, Hugging Face Mixtral name */
    char name[128];
    int ndim;
    int64_t shape[4];
    int64_t numel;
    int64_t offset;      /* element offset in the flat parameter / gradient arrays */
    moe_dtype dtype;     /* of the stored master weight: MOE_DTYPE_F32 */
    int decay;           /* 1 for matrices (incl. lm_head); 0 for norms and embeddings */
    int layer;           /* -1 for embed_tokens, model.norm, lm_head */
    int expert;          /* global expert index; -1 for dense tensors */
    moe_param_kind kind; /* MOE_PARAM_DENSE, or which expert weight */
    float *data;         /* [shape] dev, fp32 master weight (set by moe_model_create; NULL in a
                            table built alone, and where the master is not fp32: a
                            weights16_only model's matrices, a split master) */
    float *grad;         /* [shape] dev, its fp32 gradient (idem; NULL in a forward-only
                            model, and for an expert tensor whose gradient is bf16) */
    uint16_t *grad16;    /* [shape] dev, its bf16 gradient: the experts' under
                            optim.expert_grads bf16 (moe_model_set_expert_grads); else NULL */
    uint16_t *data16;    /* [shape] dev, bf16 copy of data that the matrix products read under
                            the bf16 recipe (set by moe_model_create; else NULL); of a split
                            master, its high half */
    uint16_t *lo16;      /* [shape] dev, a split master's low half (optim.master split,
                            moe_model_set_master; moe_f32_join_bf16(data16[i], lo16[i])), else
                            NULL */
    uint8_t *data8;      /* fp8-block copies of the [E, out, in] weight this tensor leads (a
                            dense matrix: E = 1; an expert kind: the block from its first
                            expert), [2 E out in] dev e4m3 (moe/ops.h); NULL elsewhere */
    float *scale8;       /* [moe_fp8_weight_scales(E, out, in)] dev, their tile scales */
} moe_param;

typedef struct moe_param_layer { /* indices into moe_param_table.params of one layer */
    int ln1, q, k, v, o, ln2, gate;
    int w1, w2, w3; /* expert e0 of a contiguous [e1 - e0, out, in] block */
} moe_param_layer;

typedef struct moe_param_table {
    moe_param *params; /* [n_params] dense part, then expert part (order above) */
    int n_params;
    int n_dense;         /* params[0, n_dense) are dense */
    int64_t n_elems;     /* total elements */
    int64_t dense_elems; /* elements [0, dense_elems) are dense, the rest the local experts */
    int64_t e0, e1;      /* local expert range (global indices) */
    int p_embed, p_norm, p_lm_head; /* lm_head = embed_tokens when tied */
    moe_param_layer *layer;         /* [num_hidden_layers] */
} moe_param_table;

/* Builds the table of model config c holding the experts [e0, e1) of every layer
 * (0 <= e0 < e1 <= num_local_experts). Shapes need positive sizes and num_attention_heads
 * dividing hidden_size (MOE_ERR_INPUT otherwise); out of memory is MOE_ERR_RUNTIME. */
moe_status moe_param_table_build(moe_param_table *t, const moe_model_config *c, int64_t e0,
                                 int64_t e1, moe_err *err);
void moe_param_table_free(moe_param_table *t); /* safe on a zeroed or failed-build table */
/* Index of the tensor with this name, or -1. */
int moe_param_table_find(const moe_param_table *t, const char *name);
/* EP rank that owns a tensor when num_experts experts are split evenly over ep ranks:
 * its expert's rank, 0 for dense tensors. */
int moe_param_rank(const moe_param *p, int64_t num_experts, int ep);
/* The table's indices in Hugging Face state_dict order (embed_tokens, layer 0 with its
 * experts, layer 1, ..., model.norm, lm_head: the order transformers' save_pretrained fills
 * shards in) into order [n_params]. */
void moe_param_table_hf_order(const moe_param_table *t, int *order);

#ifdef __cplusplus
}
#endif

#endif
