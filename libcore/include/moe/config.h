/* config: the resolved run configuration (model shape, data, training, optimizer, precision,
 * parallelism, checkpoints, logging) and its YAML reader/writer.
 *
 * One schema table in config.c lists every key (dotted path, type, default, range or allowed
 * values, one-line doc, offset into moe_config); loading, overrides, validation, the YAML
 * dump and docs/config.md are all driven by it, so adding a key means adding one row and one
 * struct field. Model keys use Hugging Face `MixtralConfig` names; the C field name equals
 * the YAML key. Loading order: defaults, then the file, then "a.b=value" overrides, then
 * validation (ranges + cross-field rules). Every problem is a MOE_ERR_INPUT naming the
 * file:line:col it came from; a bad override names the override text instead. */
#ifndef MOE_CONFIG_H
#define MOE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/dtype.h"
#include "moe/err.h"
#include "moe/recipe.h"

typedef enum moe_device_kind { MOE_DEVICE_AUTO, MOE_DEVICE_CPU, MOE_DEVICE_CUDA } moe_device_kind;
typedef enum moe_lr_schedule {
    MOE_SCHED_COSINE,
    MOE_SCHED_LINEAR,
    MOE_SCHED_CONSTANT
} moe_lr_schedule;
typedef enum moe_recompute {
    MOE_RECOMPUTE_NONE,
    MOE_RECOMPUTE_ATTN,
    MOE_RECOMPUTE_MOE,
    MOE_RECOMPUTE_FULL
} moe_recompute;

/* optim.master: how the model keeps the fp32 master weights (docs/dtypes.md). */
typedef enum moe_master {
    MOE_MASTER_FP32, /* one fp32 array */
    MOE_MASTER_SPLIT /* bf16 recipe: a weight whose bf16 copy is all the ops read is held as
                        that copy (rounded with ties away from zero) and its 16 low bits
                        (moe_f32_split_bf16); the others as fp32 */
} moe_master;

/* train.stop_signal: the signal that, besides SIGTERM and SIGINT, stops a run cleanly. */
typedef enum moe_stop_signal {
    MOE_STOP_SIGNAL_USR1,
    MOE_STOP_SIGNAL_USR2,
    MOE_STOP_SIGNAL_HUP,
    MOE_STOP_SIGNAL_NONE
} moe_stop_signal;

/* `model:` - Hugging Face MixtralConfig names, so config.json export is a copy. */
typedef struct moe_model_config {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, num_local_experts, num_experts_per_tok, max_position_embeddings;
    double rope_theta, rms_norm_eps, router_aux_loss_coef, router_z_loss_coef, initializer_range;
    bool tie_word_embeddings;
} moe_model_config;

/* `data:` - path: shard file, directory of *.mtok, manifest or "-"; "" = given on the CLI.
 * lowercase_weight: loss weight of lowercase (soft-masked) tokens when shards carry a mask. */
typedef struct moe_data_config {
    char path[1024];
    char val_path[1024];
    bool shuffle;
    double lowercase_weight;
} moe_data_config;

/* `train:` - micro_batch_tokens 0 means = global_batch_tokens (no accumulation);
 * eval_every 0 = evaluate only at the end. */
typedef struct moe_train_config {
    int64_t steps, seq_len, global_batch_tokens, micro_batch_tokens, seed, eval_every, eval_tokens;
    int64_t max_bad_steps;
    moe_recompute recompute;
    moe_stop_signal stop_signal;
    bool deterministic;
    bool document_mask; /* attention and RoPE stay inside each packed document */
} moe_train_config;

typedef struct moe_optim_config {
    double lr, min_lr;
    int64_t warmup_steps;
    moe_lr_schedule schedule;
    double weight_decay, beta1, beta2, eps, grad_clip;
    bool decay_norms_and_embeddings;
    moe_dtype moments;      /* how m and v are stored: MOE_DTYPE_F32 or MOE_DTYPE_BF16 (the names
                               `fp32`, `bf16` index the enum: moe_dtype's first two values) */
    moe_dtype expert_grads; /* how the experts' weight gradients are stored: the same two
                               (moe_model_set_expert_grads) */
    moe_master master;      /* how the master weights are stored (moe_model_set_master) */
} moe_optim_config;

/* precision.fp8_scale: how an fp8 recipe rounds its block scales (docs/dtypes.md). */
typedef enum moe_fp8_scale {
    MOE_FP8_SCALE_DEFAULT,  /* fp8-block: amax / 448; mxfp8: E8M0 ceil */
    MOE_FP8_SCALE_POW2,     /* fp8-block: amax / 448 rounded up to a power of two */
    MOE_FP8_SCALE_OCP_FLOOR /* mxfp8: OCP's 2^(floor(log2 amax) - 8) */
} moe_fp8_scale;

/* precision.fp8_wgrad: the scales of an fp8-block wgrad's activation operand (docs/dtypes.md). */
typedef enum moe_fp8_wgrad {
    MOE_FP8_WGRAD_BLOCKS, /* x in 1 x 128 blocks along the tokens, as dy (the default) */
    MOE_FP8_WGRAD_X_TILES /* x in 128 x 128 tiles of tokens and features */
} moe_fp8_wgrad;

typedef struct moe_precision_config {
    moe_recipe recipe;
    moe_fp8_scale fp8_scale;
    moe_fp8_wgrad fp8_wgrad;
    char skip_layers[256]; /* layers whose products stay unquantized under an fp8 recipe:
                              comma-separated indices, negative from the end ("0,-1") */
} moe_precision_config;

typedef struct moe_parallel_config {
    int64_t dp, ep;
    double timeout_s; /* deadline of one collective (moe/comm.h); 0 = none */
} moe_parallel_config;

typedef struct moe_checkpoint_config {
    int64_t every, keep;
} moe_checkpoint_config;

/* `log:` - every: log a metrics line every N steps; json: JSON-lines metrics file ("" none). */
typedef struct moe_log_config {
    int64_t every;
    char json[1024];
} moe_log_config;

typedef struct moe_config {
    moe_device_kind device;
    moe_model_config model;
    moe_data_config data;
    moe_train_config train;
    moe_optim_config optim;
    moe_precision_config precision;
    moe_parallel_config parallel;
    moe_checkpoint_config checkpoint;
    moe_log_config log;
} moe_config;

/* Fills *c with the schema defaults (a small CPU run). Zeroes the struct first, so two
 * default configs compare equal with memcmp. */
void moe_config_defaults(moe_config *c);

/* Defaults, then the YAML file at path (NULL: none), then "a.b=value" overrides, then
 * moe_config_validate. Errors carry the file:line:col of the offending key/value; errors
 * from an override have no file and a message starting "override 'a.b=value': ". A
 * validation failure about a key that the file set points at that key's line. */
moe_status moe_config_load(moe_config *c, const char *path, int n_overrides, char *const *overrides,
                           moe_err *err);

/* Defaults, then the YAML text (name is used as the file name in errors), then validation. */
moe_status moe_config_load_string(moe_config *c, const char *yaml, const char *name, moe_err *err);

/* Sets one key from its text form ("train.steps", "100"; "device", "cpu"), type- and
 * range-checked like a file value. No cross-field validation (call moe_config_validate). */
moe_status moe_config_set(moe_config *c, const char *dotted_key, const char *value, moe_err *err);

/* Per-key ranges and cross-field rules (head_dim even, GQA divisibility, batch sizes, ...).
 * The message names the key(s); the hint says what would be valid. */
moe_status moe_config_validate(const moe_config *c, moe_err *err);

/* The batch split of a step for a validated config: *seqs sequences per micro-batch (one
 * forward/backward of one rank: train.micro_batch_tokens, or global / (dp x ep) tokens when
 * that is 0) and *count micro-batches per step (global / micro, shared by the ranks). */
void moe_config_micro_batch(const moe_config *c, int64_t *seqs, int64_t *count);

/* Every key, sections in schema order, each preceded by its doc line as a comment. Floats
 * are printed with %.17g, so the output loads back to identical values. */
moe_status moe_config_write_yaml(const moe_config *c, FILE *fp, moe_err *err);

/* docs/config.md: intro, one table per section (key, type, default, allowed, description),
 * an override example and a footer on how to regenerate. */
void moe_config_write_markdown(FILE *fp);

const char *moe_recipe_name(moe_recipe r); /* "fp32","bf16","fp8-block","mxfp8" */
/* The recipe the model and the ops run: precision.recipe with its precision.fp8_scale rule
 * and precision.fp8_wgrad (MOE_RECIPE_FP8_BLOCK_POW2, _XT, _POW2_XT, MOE_RECIPE_MXFP8_FLOOR). */
moe_recipe moe_config_recipe(const moe_config *c);
/* precision.skip_layers of c as a mask: skip[l] = 1 for each layer it names (skip [L] host,
 * L = model.num_hidden_layers; may be NULL to only check). MOE_ERR_INPUT naming the item
 * that is not an integer in [-L, L). */
moe_status moe_config_skip_layers(const moe_config *c, uint8_t *skip, moe_err *err);
const char *moe_device_name(moe_device_kind d);      /* "auto","cpu","cuda" */
const char *moe_lr_schedule_name(moe_lr_schedule s); /* "cosine","linear","constant" */
const char *moe_recompute_name(moe_recompute r);     /* "none","attn","moe","full" */
const char *moe_moments_name(moe_dtype d);           /* optim.moments: "fp32","bf16" */
const char *moe_master_name(moe_master m);           /* optim.master: "fp32","split" */

#endif
