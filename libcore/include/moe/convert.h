/* convert: checkpoints <-> Hugging Face Mixtral directories, and checkpoint inspection
 * (what moe-convert runs).
 *
 *   to-hf    ckpt-N/ -> config.json (MixtralConfig keys, MixtralForCausalLM), weights as
 *            model.safetensors or model-0000i-of-0000n.safetensors + index (shards of at
 *            most max_shard_bytes), Hub tensor names (experts.{j}.w1/w2/w3), f32 or bf16;
 *            tokenizer.json/tokenizer_config.json/special_tokens_map.json
 *            (PreTrainedTokenizerFast), and moe_tokenizer.json +
 *            moe_config.yaml so that from-hf restores the checkpoint exactly.
 *   from-hf  a Mixtral directory (per-expert w1/w2/w3, or the fused experts.gate_up_proj
 *            [E, 2I, H] (gate rows first, then up) / experts.down_proj [E, H, I] layout of
 *            newer transformers; block_sparse_moe or mlp module names; any float dtype)
 *            -> a checkpoint directory with fp32 weights at step 0, weights only (no
 *            optimizer file: its Adam moments read as zeros).
 *   inspect  config, tokenizer, layout, tensor table (shape, dtype, RMS, max |x|),
 *            parameter counts and MANIFEST verification of a checkpoint (or an HF
 *            directory).
 *   reshard  ckpt-N/ -> the same checkpoint in the expert-parallel layout for --ep N
 *            (moe/ckpt.h: index + one model and one optimizer file per EP rank);
 *            consolidate = reshard to ep 1, the single-file layout moe-train writes.
 * Every reader of a checkpoint (to-hf, inspect, reshard, moe-embed, moe-train --resume)
 * opens it through moe_ckpt_open (moe/ckpt.h), either layout; every list of tensors is the
 * parameter table (moe/model_params.h).
 *
 * The one thing to know: f32 round trips (to-hf/from-hf, reshard/consolidate) are
 * bit-identical (weights are copied, never recomputed), and every input is validated
 * before anything is written: a config that is not Mixtral, a missing or misshapen tensor,
 * a truncated safetensors file, a tokenizer that does not fit the vocabulary, a damaged
 * expert-parallel layout are MOE_ERR_INPUT naming the file and the tensor. */
#ifndef MOE_CONVERT_H
#define MOE_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/config.h"
#include "moe/err.h"
#include "moe/safetensors.h"

typedef struct moe_convert_opts {
    int64_t max_shard_bytes; /* to-hf: bytes per safetensors shard (default 5e9) */
    moe_st_dtype dtype;      /* to-hf: MOE_ST_F32 or MOE_ST_BF16 */
    const char *tokenizer;   /* from-hf: moe tokenizer spec file, or "byte"/"nuc"/"kmer"
                                defaults, when HF_DIR has no moe_tokenizer.json */
    const char *command;     /* to-hf: the command line, for README.md (NULL: left out) */
} moe_convert_opts;

void moe_convert_opts_defaults(moe_convert_opts *o);

moe_status moe_convert_to_hf(const char *ckpt_dir, const char *out_dir, const moe_convert_opts *o,
                             moe_err *err);
moe_status moe_convert_from_hf(const char *hf_dir, const char *ckpt_dir, const moe_convert_opts *o,
                               moe_err *err);
moe_status moe_convert_inspect(const char *dir, const moe_convert_opts *o, FILE *out, moe_err *err);
/* reshard --ep N / consolidate (ep = 1): ckpt_dir (either layout; a run directory means its
 * latest checkpoint) rewritten as the new checkpoint directory out_dir (must not exist) in
 * the layout of moe/ckpt.h, config.yaml with parallel.ep = ep and then the
 * "key=value" overrides (not model.* or parallel.ep), which must validate. */
moe_status moe_convert_reshard(const char *ckpt_dir, const char *out_dir, int ep, int n_overrides,
                               char *const *overrides, moe_err *err);

/* "5GB", "500MB", "2GiB", "123456" -> bytes (KB/MB/GB are powers of 1000 as in
 * transformers' max_shard_size); -1 when not a size. */
int64_t moe_convert_parse_size(const char *s);

/* ---- shared by the convert_*.c files ---- */

/* An output directory argument without trailing slashes ("out/" -> "out"), so that the
 * temporary sibling "out.tmp.<pid>" is not created inside it; "" or "/" is MOE_ERR_INPUT. */
moe_status moe_convert_out_dir(const char *arg, char *out, size_t n, moe_err *err);

/* Writes the Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json) of the moe tokenizer spec `spec_json` into dir; *written = 1. */
moe_status moe_convert_write_hf_tokenizer(const char *spec_json, int64_t model_max_length,
                                          const char *dir, int *written, moe_err *err);

#endif
