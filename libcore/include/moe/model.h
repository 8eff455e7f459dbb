/* model: the Mixtral-style MoE causal language model, forward and backward, llm.c style.
 *
 * One forward function calls the ops of ops.h in order and one backward calls their
 * backward ops in reverse; there is no autograd. Semantics are Hugging Face Mixtral's
 * (docs/model.md): embedding, per layer x += o_proj(attn(rope(q), rope(k), v)) on
 * rmsnorm(x), then x += moe(rmsnorm(x)) with an fp32 softmax router, top-k, renormalised
 * top-k weights and SwiGLU experts w2(silu(w1 x) * w3 x); final norm; lm_head (or the
 * embedding when tied). Dropless: every token reaches its k experts.
 *
 * The one thing a reader must know: every buffer (parameters, gradients, activations) is
 * backend memory, allocated through the backend table; `moe_param.data/grad` point into
 * two single allocations (all fp32 master weights / all gradients, in the order of the one
 * parameter table, moe/model_params.h: dense tensors first, then the expert blocks). Use
 * moe_model_copy_params_to_host / _from_host (or be->memcpy_*) to read or write them: under
 * a packed layout (a weights16_only model, a split master) a tensor's weights are not all in
 * the fp32 allocation (moe_param.data NULL, see moe_model.param_mem).
 *
 * Loss of one forward (what backward differentiates):
 *   loss = ce + router_aux_loss_coef * aux + router_z_loss_coef * z
 *   ce  = sum_n w_n * CE_n / sum_n w_n over tokens with target >= 0 (w_n = weight, 1 if NULL)
 *   aux = mean over layers of E * sum_e f_e * P_e, f_e = (assignments to e)/(N*K),
 *         P_e = mean router probability of e over the N tokens of the micro-batch
 *         (Switch/Megatron normalisation: 1 at perfect balance. HF's load_balancing_loss_func
 *         pools the layers' logits before the product and divides counts by N, not N*K,
 *         so its value at balance is K; ours = HF-per-layer / K.)
 *   z   = mean over layers of mean_n logsumexp(router_logits[n,:])^2
 * All N = B*T positions are routed and count for aux/z (packed data has no padding). */
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include <stdint.h>

#include "moe/config.h"
#include "moe/err.h"
#include "moe/model_params.h"
#include "moe/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_step_stats {
    double loss;                  /* moe_model_loss(ce_loss, aux_loss, z_loss) */
    double ce_loss;               /* weighted mean CE over tokens with target >= 0 (nats) */
    double aux_loss;              /* load balancing, mean over layers (1 = balanced) */
    double z_loss;                /* router z-loss, mean over layers */
    double n_tokens;              /* tokens with target >= 0 */
    double weight_sum;            /* sum of their weights (= n_tokens when weights is NULL) */
    double ce_sum;                /* sum_n w_n * CE_n (nats), for exact means over micro-batches */
    double router_entropy;        /* mean over layers and tokens of the router entropy (nats) */
    const int64_t *expert_tokens; /* [layers, E], assignments per expert, owned by the model */
} moe_step_stats;

/* The training loss from its parts, the one place the formula is written:
 * ce + router_aux_loss_coef * aux + router_z_loss_coef * z. */
double moe_model_loss(const moe_model_config *c, double ce, double aux, double z);

typedef struct moe_acts moe_acts; /* activation buffers, private to model.c */

/* Expert parallelism as the model sees it: the seam to the dist layer (moe/comm.h), which
 * the model does not know. The ep ranks of an expert group each hold E / ep experts (rank r:
 * [r E / ep, (r + 1) E / ep)); each trains on its own tokens, which the MoE block sends to
 * their experts' owners and takes back with alltoallv. */
typedef struct moe_model_ep {
    int rank, size; /* this rank's place in its expert group, and the group's size (ep) */
    /* All-to-all(v) over the expert group, called by every rank of it in the same order:
     * send [sum send_rows, row_bytes] holds, in rank order, send_rows[r] rows for rank r;
     * recv [sum recv_rows, row_bytes] gets recv_rows[s] rows from rank s. Counts [size];
     * buffers are the backend's memory (host arrays for the counts' own exchange on the CPU
     * backend). Returns MOE_OK or an error in *err. */
    moe_status (*alltoallv)(void *ctx, const void *send, const int64_t *send_rows, void *recv,
                            const int64_t *recv_rows, size_t row_bytes, moe_err *err);
    void *ctx;
} moe_model_ep;

typedef struct moe_model {
    moe_model_config cfg;
    moe_recipe recipe;
    const moe_backend *be;
    int max_batch, max_seq;
    int64_t head_dim;
    moe_param_table table; /* the local experts [e0, e1) of every layer (all of them without
                              expert parallelism); data/grad set */
    moe_model_ep ep;       /* size 1: no expert parallelism */
    moe_status ep_status;  /* the first failed exchange of the pass in progress, in ep_err */
    moe_err ep_err;
    float *param_mem;       /* [param_elems] dev, one allocation: every tensor's fp32 master (at
                               its table offset), or in a packed layout (weights16_only, a
                               split master) only the tensors that stay fp32 (norms, the
                               embedding table, the router gates), packed in table order */
    int64_t param_elems;    /* table.n_elems, or what a packed layout keeps in fp32 */
    uint16_t *param16_mem;  /* [table.n_elems] dev, bf16 weights for the matrix products: the
                               copies of moe_model_has_copies (of a split master, its high
                               half), or a weights16_only model's weights; else NULL */
    uint16_t *param_lo_mem; /* [table.n_elems - param_elems] dev: the split masters' low halves,
                               packed in table order (optim.master split); else NULL */
    moe_master master;      /* MOE_MASTER_FP32 (after create) or MOE_MASTER_SPLIT
                               (moe_model_set_master) */
    int weights16_only;     /* forward-only bf16 model: matrix weights in bf16 only (their
                               moe_param.data is NULL), one conversion at load */
    uint8_t *param8_mem;    /* dev, one allocation: the fp8-block copies (moe/ops.h's E4M3
                               weights) of the quantized weights of the layers not in
                               skip_quant, each weight's e4m3 values then its tile scales
                               (moe_param.data8, scale8); made by the first pass under
                               fp8-block, else NULL */
    int copies_stale;       /* the weight copies (param16_mem, param8_mem) no longer equal what
                               the master weights give */
    float *grad_mem;        /* dev, one allocation: the gradients in table order, the dense
                               part's [dense_elems] fp32, then the experts' [n_elems -
                               dense_elems] in expert_grad_dt (F32: one flat [n_elems] fp32
                               array; BF16: from the next 256 bytes); read them through
                               moe_model_grads_at (see moe_model_zero_grad) */
    int grads_stale;        /* 1 after moe_model_zero_grad until the next backward writes the
                               gradients (or moe_model_grads_at zeroes them) */

    /* the experts' gradients: F32 (after create) or BF16 (moe_model_set_expert_grads) */
    moe_dtype expert_grad_dt;
    moe_acts *acts;
    int64_t *expert_tokens; /* [layers, E] host, filled by forward */
    uint8_t *skip_quant;    /* [layers] host: 1 = the layer's products stay unquantized under
                               an fp8 recipe (precision.skip_layers); NULL = none */
    int32_t doc_sep;        /* document mask (train.document_mask): the token id that ends
                               every document; -1 (the default) = none */
    int last_B, last_T;     /* shape of the last forward (0 = none) */
} moe_model;

/* 1 when a model keeps bf16 copies of its weights: under the bf16 recipe, for training (a
 * forward-only model converts each weight as a product reads it; it has no optimizer step
 * to refresh copies in). */
int moe_model_has_copies(moe_recipe recipe, int training);

/* Validates cfg (shapes divisible, k <= E, ...), refuses recipes and sizes the backend does
 * not support before allocating anything (moe_backend_check: fp8-block/mxfp8, or e.g. a head
 * dimension the CUDA bf16 attention lacks: MOE_ERR_INPUT naming the op and the sizes),
 * builds the parameter table, allocates
 * parameters, gradients (zeroed) and activations for up to max_batch x max_seq tokens.
 * recompute (train.recompute) sizes the activation plan: NONE keeps every intermediate of
 * every layer for backward but the SwiGLU output g (one shared buffer, made again from h1 and
 * h3: one elementwise pass a layer); ATTN keeps the layer input, the residual after attention and
 * the MoE block, and recomputes the attention block (norm, q/k/v, RoPE, attention) in backward; MOE
 * keeps the attention block and both residuals and recomputes the MoE block (norm, router,
 * permutation, experts); FULL keeps only each layer's input and recomputes the whole layer. Buffers
 * that are not kept exist once, shared by all layers. Gradients are bit-identical in every mode
 * (the forward ops are deterministic). Weights start at zero: call moe_model_init_weights or load
 * them. */
moe_status moe_model_create(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                            moe_recompute recompute, const moe_backend *be, int max_batch,
                            int max_seq, moe_err *err);
/* moe_model_create for one rank of an expert group (ep NULL or ep->size 1: every expert):
 * the table holds the rank's experts, and the expert side of the MoE block (the rows this
 * rank's experts receive) is sized for the worst case, every token of the group routed
 * here: ep->size x the local rows. moe_model_forward and moe_model_backward then exchange
 * rows with the other ranks, which must run the same passes in the same order. */
moe_status moe_model_create_ep(moe_model *m, const moe_model_config *cfg, moe_recipe recipe,
                               moe_recompute recompute, const moe_backend *be, int max_batch,
                               int max_seq, const moe_model_ep *ep, moe_err *err);
/* The smallest plan, for moe_model_hidden and moe_model_logprobs (embedding, scoring): no
 * gradients, no logits until moe_model_logprobs needs them, the residual stream in two
 * buffers and one shared set of layer intermediates.
 * moe_model_forward and moe_model_backward refuse such a model (MOE_ERR_RUNTIME). */
moe_status moe_model_create_forward_only(moe_model *m, const moe_model_config *cfg,
                                         moe_recipe recipe, const moe_backend *be, int max_batch,
                                         int max_seq, moe_err *err);
/* Keeps the products of the layers with skip[l] = 1 (skip [layers] host, or NULL for none)
 * unquantized - run as under bf16 - when the recipe is an fp8 one (precision.skip_layers);
 * no effect under fp32 and bf16. Under fp8-block those layers get no fp8 weight copies (the
 * copies are laid out again by the next pass); under mxfp8 the activations are laid out
 * again at once (those layers' expert activations are bf16, the others' MXFP8), so what a
 * forward left for its backward is gone. Out of memory: MOE_ERR_RUNTIME. */
moe_status moe_model_set_skip_layers(moe_model *m, const uint8_t *skip, moe_err *err);
/* normal(0, initializer_range) for matrices and the embedding, ones for norms; Philox
 * keyed by seed, each tensor its own stream: same result for any thread count. */
void moe_model_init_weights(moe_model *m, uint64_t seed);
void moe_model_free(moe_model *m);              /* safe on a zeroed or failed-create struct */
int64_t moe_model_n_params(const moe_model *m); /* number of parameter elements */
/* Whole flat parameter array <-> host memory ([n_elems] floats, table order). */
void moe_model_copy_params_to_host(const moe_model *m, float *dst);
void moe_model_copy_params_from_host(moe_model *m, const float *src);
void moe_model_copy_grads_to_host(const moe_model *m, float *dst);
/* Keeps the master weights as master says (optim.master): MOE_MASTER_FP32 (the default) or
 * MOE_MASTER_SPLIT: every tensor whose bf16 copy is all the ops read (not the norms, the
 * embedding table or the router gates, which the forward reads in fp32) is held as that
 * copy in param16_mem plus its low 16 bits in param_lo_mem (moe_f32_split_bf16: the copy
 * rounds ties away from zero), 2 bytes a parameter less; AdamW updates the halves in place
 * (moe_backend.adamw's param_lo) and every function here reads and writes the same fp32
 * values as with fp32 masters. The weight allocations are made again (zero weights): call it
 * before moe_model_init_weights or a load. Errors: another value (MOE_ERR_INPUT); split on a
 * model without bf16 copies (another recipe, a forward-only model: MOE_ERR_INPUT); no memory
 * (MOE_ERR_RUNTIME). */
moe_status moe_model_set_master(moe_model *m, moe_master master, moe_err *err);
/* The elements of table elements [0, i) whose master is an fp32 value in param_mem: i, or
 * in a packed layout those of the tensors it keeps (param_mem's index of element i when that
 * tensor is one of them; i minus it is param_lo_mem's under a split master). For moving
 * flat ranges of masters between ranks. */
int64_t moe_model_f32_masters_before(const moe_model *m, int64_t i);
/* Says that the masters (param_mem, a split master's halves) were written by other means than
 * this API (an all-gather, a backend op): the weight copies (bf16, fp8-block) are refreshed
 * before the next forward. Every function here that writes weights (init, copy from host,
 * load, moe_model_adamw) keeps them right by itself. */
void moe_model_params_written(moe_model *m);
/* One AdamW step (moe_backend.adamw) on the flat element range [lo, hi) of the parameters,
 * with moments mom, var [hi - lo] dev (element lo first; F32 or BF16, both of one type: the
 * trainer's optim.moments): weight decay o->weight_decay for
 * matrices, and for norms and embeddings only with o->decay_norms_and_embeddings; the bf16
 * copies of the range are rewritten in the same pass (a split master's high half is its
 * copy: the pass updates both halves), the fp8-block copies of the quantized
 * weights wholly inside it right after (be->quantize_weight; a weight the range cuts gets
 * its copies before the next pass). Copies already stale (moe_model_params_written, as the
 * trainer says before a step of several ranks) are left to that refresh. Consecutive tensors
 * with the same decay are one call (the expert part is one; with bf16 expert gradients it
 * starts a call of its own; fp32 and split masters are calls of their own). */
void moe_model_adamw(moe_model *m, int64_t lo, int64_t hi, moe_buf mom, moe_buf var,
                     const moe_optim_config *o, double lr, int64_t step, float grad_scale);

/* The document mask inside packed rows (docs/model.md): with sep >= 0 (the tokenizer's
 * EOS), position t of a row belongs to the document that starts after the last sep token
 * before t (or at the row start); its queries attend only to keys of that document and its
 * RoPE position restarts at 0 there (Hugging Face position_ids, flash-attn varlen), so every
 * pass (forward, backward, hidden states, logprobs) computes for a packed row what each
 * document computes alone. Targets are the caller's: the trainer ignores the one at a sep
 * position (it is the next document's first token). sep -1 (the default after create) turns
 * the mask off. Errors: sep outside [-1, V) (MOE_ERR_INPUT); sep >= 0 on a forward-only
 * model (MOE_ERR_RUNTIME: embedding and scoring run one sequence per row). */
moe_status moe_model_set_document_separator(moe_model *m, int32_t sep, moe_err *err);

/* tokens/targets [B, T] host (target -1 = ignored), weights [B, T] host or NULL.
 * Fills *st (may be NULL). Errors: B/T above the limits given to create, T above
 * max_position_embeddings, token or target out of range (MOE_ERR_INPUT, names the
 * position). The activations are kept for moe_model_backward. */
moe_status moe_model_forward(moe_model *m, const int32_t *tokens, const int32_t *targets,
                             const float *weights, int B, int T, moe_step_stats *st, moe_err *err);
/* grads += grad_scale * d(loss of the last forward)/d(params) (the first backward after
 * moe_model_zero_grad writes them: grads = ...). Fails (MOE_ERR_RUNTIME) without a
 * preceding forward with targets. */
moe_status moe_model_backward(moe_model *m, float grad_scale, moe_err *err);
/* The gradients are zero from here on. No pass over them: the next moe_model_backward writes
 * every gradient instead of adding to it (each has one producer per backward; the few that
 * accumulate within one, the embedding's and the norms', are zeroed there), and
 * moe_model_grads_at zeroes them if it comes first. */
void moe_model_zero_grad(moe_model *m);
/* The gradients from flat element i on (reduce, norm, optimizer), typed: F32 in the dense
 * part [0, dense_elems), expert_grad_dt in the experts' part, so a range read through it
 * stays on one side of dense_elems. Zeroed first when moe_model_zero_grad had no backward
 * after it. .p NULL for a forward-only model. */
moe_buf moe_model_grads_at(moe_model *m, int64_t i);
/* Sum of squares of the gradients [lo, hi) (be->sum_squares on each side of dense_elems). */
double moe_model_grad_sum_squares(moe_model *m, int64_t lo, int64_t hi);
/* Keeps the experts' weight gradients in dt (F32, the default, or BF16: optim.expert_grads):
 * the gradient allocation is made again (zero) in the new layout. BF16 halves their memory
 * and the bytes the wgrad products write and the gradient norm and AdamW read; each backward
 * stores the rounded fp32 result (added: the rounded sum), as Megatron-Core's bf16 gradient
 * buffers do. Errors: another type (MOE_ERR_INPUT), a forward-only model or no memory
 * (MOE_ERR_RUNTIME). */
moe_status moe_model_set_expert_grads(moe_model *m, moe_dtype dt, moe_err *err);

/* Hidden states, forward only: layer 0 = embeddings, l = output of layer l,
 * num_hidden_layers = output of the final norm. tokens [B, T] host; out [B, T, C] host. */
moe_status moe_model_hidden(moe_model *m, const int32_t *tokens, int B, int T, int layer,
                            float *out, moe_err *err);
/* The same hidden states pooled on the backend, so that only [B, C] leaves it: out[b] = the
 * mean (max = 0) or elementwise max (max = 1) of row b's states at positions
 * [range[b, 0], range[b, 0] + range[b, 1]) (count >= 1, inside [0, T)).
 * tokens [B, T] host; range [B, 2] host; out [B, C] host. */
moe_status moe_model_hidden_pooled(moe_model *m, const int32_t *tokens, int B, int T, int layer,
                                   const int32_t *range, int max, float *out, moe_err *err);

/* Log-probabilities of the targets, forward only (scoring): out[b, t] = log softmax(
 * logits[b, t])[targets[b, t]] in nats, 0 where the target is -1. The same per-token
 * cross-entropy op as training (fp32, on the backend), negated. Works on every model; a
 * forward-only model allocates its [max_batch * max_seq, V] logits on the first call. The
 * activations then belong to no forward that moe_model_backward could use.
 * tokens/targets [B, T] host; out [B, T] host. Input errors as moe_model_forward. */
moe_status moe_model_logprobs(moe_model *m, const int32_t *tokens, const int32_t *targets, int B,
                              int T, float *out, moe_err *err);

/* ---- cached keys (scoring: an ALT window continues its REF window's first positions) ----
 * A cache holds every layer's keys and values after RoPE (in the attention's operand type)
 * of the rows of one logprobs pass that saved them: row b of a pass of T positions at
 * positions [b * T, (b + 1) * T). A pass that continues rows src[b] of a cache after their
 * first P positions gives its tokens (positions P, P + 1, ... of those rows) exactly what
 * one pass over the whole rows gives them: their attention reads the cached keys, and every
 * other op is per token. Not with a document mask. */
typedef struct moe_kv_cache {
    void *k, *v;    /* [L, tokens, KV * D] dev */
    void *wk, *wv;  /* [tokens, KV * D] dev: a continuing pass's keys, cached prefix + own */
    int64_t tokens; /* capacity in positions */
    int64_t T;      /* row length of the pass that saved (0: none yet) */
    int rows;       /* rows that pass saved */
} moe_kv_cache;

typedef struct moe_kv_use {
    moe_kv_cache *save; /* the pass's rows are saved into it, or NULL */
    moe_kv_cache *from; /* the pass continues rows src[b] of it after P positions, or NULL */
    const int32_t *src; /* [B] host */
    int64_t P;          /* >= 1 and <= from->T; P + T <= the model's positions */
} moe_kv_use;

/* A cache for up to `tokens` positions of m's passes (zeroed first; free it even when this
 * fails). MOE_ERR_RUNTIME when the backend is out of memory. */
moe_status moe_kv_cache_create(moe_kv_cache *c, const moe_model *m, int64_t tokens, moe_err *err);
void moe_kv_cache_free(moe_kv_cache *c, const moe_model *m);
/* Bytes of a cache of `tokens` positions for model shape cfg and recipe. */
size_t moe_kv_cache_bytes(const moe_model_config *cfg, moe_recipe recipe, int64_t tokens);
/* moe_model_logprobs that saves its keys (kv->save), or continues cached ones (kv->from: then
 * B * (P + T) <= from->tokens, src[b] in [0, from->rows)); kv NULL: moe_model_logprobs.
 * Errors: a use outside those bounds, both or neither of save and from, a document mask
 * (MOE_ERR_INPUT). */
moe_status moe_model_logprobs_kv(moe_model *m, const int32_t *tokens, const int32_t *targets, int B,
                                 int T, const moe_kv_use *kv, float *out, moe_err *err);

/* ---- sizes for --dry-run (no model needed) ---- */
/* total: all parameters (lm_head counted once when tied); active: those touched per token
 * (k of E experts per layer). */
void moe_model_count_params(const moe_model_config *cfg, int64_t *total, int64_t *active);
/* 6 x (matmul weights touched per token: q,k,v,o + k experts x 3 + router, per layer,
 * + lm_head) + 6 x layers x seq x hidden (causal attention). Training FLOPs per token. */
double moe_model_flops_per_token(const moe_model_config *cfg, int64_t seq);
/* Bytes of the one activation allocation (saved activations, the shared recompute set and
 * the activation-gradient scratch) moe_model_create makes for batch x seq tokens under this
 * recompute mode and recipe (mxfp8: every layer's expert path MXFP8, none skipped). Exact:
 * the same plan function sizes the allocation. */
int64_t moe_model_activation_bytes(const moe_model_config *cfg, moe_recipe recipe,
                                   moe_recompute recompute, int64_t batch, int64_t seq);

typedef struct moe_model_memory { /* bytes, one rank, no sharding */
    int64_t params;               /* master weights outside the copies: fp32 (one allocation),
                                     under optim.master split those that stay fp32 and the
                                     split ones' low halves (a second allocation) */
    int64_t expert_params;        /* the part of params that is the rank's experts */
    int64_t expert_elems;         /* the rank's expert parameters (elements) */
    int64_t weight_copies;        /* their bf16 copies (bf16 recipe; one allocation), the split
                                     masters' high halves among them */
    int64_t fp8_copies;           /* fp8-block: the e4m3 copies (row-wise and transposed) of
                                     the quantized weights of the layers not skipped, with
                                     their tile scales (one allocation) */
    int64_t grads;                /* gradients (one allocation: fp32, the experts' bf16 under
                                     optim.expert_grads bf16) */
    int64_t optimizer;            /* AdamW m and v, fp32 or bf16 (allocated by the trainer) */
    int64_t activations;          /* moe_model_activation_bytes */
    int64_t total;                /* the six above: everything allocated through be->alloc */
    int64_t gpu_scratch;          /* CUDA backend working memory on top (cuBLASLt workspace,
                                     operand conversions and quantized activations; upper bound)
                                     on a compute capability 9.0 device (H100, H200):
                                     moe_backend_scratch_estimate("cuda", ..., MOE_SCRATCH_SM90) */
    int64_t gpu_scratch_other;    /* the same on other CUDA devices (larger under fp8-block,
                                     whose expert operands are quantized into scratch there) */
} moe_model_memory;
/* The sizes of the op calls of a model of config c for batches of batch x seq tokens: what
 * moe_model_create asks moe_backend_check about and the scratch estimate is computed for. */
void moe_model_op_dims(const moe_model_config *c, int64_t batch, int64_t seq, moe_op_dims *d);
/* What a training run allocates on one rank of an expert group of ep ranks (1: every
 * expert; moe_model_create_ep's tensors and expert-side buffers, and the fp8-block copies of
 * its first pass, without the layers skip [layers] names, NULL for none; under mxfp8 those
 * layers' expert activations are bf16, the others' MXFP8): total exactly for
 * any backend, with AdamW moments of type moments (MOE_DTYPE_F32 or MOE_DTYPE_BF16:
 * optim.moments) for every tensor of the rank (a ZeRO-1 trainer holds a share), the
 * experts' gradients of type expert_grads (optim.expert_grads) and the masters stored as
 * master says (optim.master; split only under bf16); add gpu_scratch (gpu_scratch_other) for
 * the peak device memory of the CUDA backend on an sm_90 device (on others). */
void moe_model_memory_estimate(const moe_model_config *cfg, moe_recipe recipe,
                               moe_recompute recompute, int64_t batch, int64_t seq, int ep,
                               const uint8_t *skip, moe_dtype moments, moe_dtype expert_grads,
                               moe_master master, moe_model_memory *out);

#ifdef __cplusplus
}
#endif

#endif
