/* ckpt_tensors: the model (and optimizer) tensors of a checkpoint directory, whatever its
 * layout - the one reader behind moe-train --resume, moe-embed and moe-convert.
 *
 *   ep = 1   model.safetensors + optimizer-rank0.safetensors (what moe-train writes)
 *   ep = N   model.safetensors.index.json  {"metadata": {"total_size", "moe_ep": N},
 *                                           "weight_map": {name: file}}
 *            model-ep<R>-of-<N>.safetensors  (R, N 5 digits) rank 0: every dense tensor +
 *                                           rank 0's experts; rank R > 0: rank R's experts
 *            optimizer-rank<R>.safetensors   exp_avg/exp_avg_sq of exactly rank R's tensors
 *
 * EP rank R owns the global experts [R*E/N, (R+1)*E/N) of every layer; tensor names are the
 * Hub names with the GLOBAL expert index, so the model files + index are a Hugging Face
 * sharded set. The one thing to know: opening validates the whole layout before any tensor
 * is handed out - the index (well-formed JSON, no duplicate names, moe_ep equal to the
 * config's parallel.ep, every name mapped to the file of the rank that owns it,
 * total_size), every file listed in MANIFEST, every parameter present exactly once (no
 * stray tensors), F32 and of its shape. CRCs are the caller's (moe_ckpt_verify).
 * A weights-only checkpoint (what moe-convert from-hf writes: MANIFEST lists no optimizer
 * file) opens with the optimizer too; its Adam moments read as zeros, the state of a fresh
 * optimizer, instead of storing twice the weights' bytes of zeros. */
#ifndef MOE_CKPT_TENSORS_H
#define MOE_CKPT_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/config.h"
#include "moe/convert.h"
#include "moe/err.h"
#include "moe/safetensors.h"

#define MOE_CKPT_INDEX_FILE "model.safetensors.index.json"

/* What of a parameter to read. */
typedef enum moe_ckpt_slot {
    MOE_CKPT_WEIGHT = 0, /* the fp32 master weight */
    MOE_CKPT_EXP_AVG,    /* Adam's first moment (optimizer files) */
    MOE_CKPT_EXP_AVG_SQ, /* Adam's second moment */
} moe_ckpt_slot;

typedef struct moe_ckpt_tensor {
    moe_convert_tensor p;            /* name, shape, layer, global expert (-1: dense) */
    int rank;                        /* EP rank whose files hold it (0 for dense tensors) */
    const moe_st_file *file, *ofile; /* model file; optimizer file (NULL: not opened) */
    const moe_st_tensor *w, *exp_avg, *exp_avg_sq; /* moments NULL without optimizer */
} moe_ckpt_tensor;

typedef struct moe_ckpt_tensors {
    int ep;             /* layout: 1 single file, N index + N rank files */
    moe_st_file *model; /* [ep] model files, rank order */
    moe_st_file *optim; /* [ep] optimizer files, or NULL when not opened or weights-only */
    int weights_only;   /* opened with the optimizer, but MANIFEST lists no optimizer file */
    int n;
    moe_ckpt_tensor *t;              /* [n] in parameter-table (model) order */
    const moe_ckpt_tensor **by_name; /* [n] into t, sorted by name */
} moe_ckpt_tensors;

/* EP rank that owns a parameter: its expert's rank, 0 for dense tensors. */
int moe_ckpt_rank_of(const moe_convert_tensor *p, int64_t num_experts, int ep);
/* "model.safetensors" (ep 1) or "model-ep0000R-of-0000N.safetensors" into buf. */
void moe_ckpt_model_file(int rank, int ep, char *buf, size_t n);
/* "optimizer-rank<R>.safetensors" into buf. */
void moe_ckpt_optim_file(int rank, char *buf, size_t n);

/* Opens and validates the tensors of ckpt_dir, whose own config.yaml is ck (its model
 * shapes and parallel.ep), with the optimizer files when with_optimizer. Problems are
 * MOE_ERR_INPUT naming the file and the tensor; on failure *c is left closed. */
moe_status moe_ckpt_tensors_open(moe_ckpt_tensors *c, const char *ckpt_dir, const moe_config *ck,
                                 int with_optimizer, moe_err *err);
/* The parameter called name, NULL when the model has none. */
const moe_ckpt_tensor *moe_ckpt_tensors_find(const moe_ckpt_tensors *c, const char *name);
/* Copies slot of parameter name, which must have shape [ndim dims], as f32 into
 * out [numel] (zeros for the moments of a weights-only checkpoint); a missing name or another
 * shape is MOE_ERR_INPUT. */
moe_status moe_ckpt_tensors_read(const moe_ckpt_tensors *c, const char *name, moe_ckpt_slot slot,
                                 int ndim, const int64_t *shape, float *out, moe_err *err);
void moe_ckpt_tensors_close(moe_ckpt_tensors *c);

#endif
