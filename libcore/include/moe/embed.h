/* embed: sequences -> vectors with a trained checkpoint (what moe-embed runs).
 *
 * Sequences come from FASTA/FASTQ/SAM/BAM/CRAM (moe/seqio.h, tokenized with the
 * checkpoint's tokenizer.json) or from .mtok shards (checked to use that same tokenizer).
 * A sequence of n content tokens is cut into windows of at most W content tokens every S
 * tokens (the same rule as moe-tokenize --window; without --window only sequences longer
 * than the model's context are cut, at the context length), each window wrapped in BOS/EOS
 * as the tokenizer spec says, and run through the model up to the chosen layer. A window's
 * vector pools its content tokens (mean, max) or takes its last position (`last`: the EOS
 * when the tokenizer adds one); a sequence's vector is the mean of its windows' vectors
 * (and, with rc_average, of the reverse complement's windows, cut on the reverse
 * complement's own grid so that a sequence and its reverse complement get the same
 * vector; with per_window, window k of both strands covers the same bases). Per-token rows
 * are the content tokens, each averaged over the windows (and strands) that cover it.
 *
 * The one thing to know: windows are batched longest first for throughput (right padding
 * is harmless: attention is causal and routing is per token), but rows are written in
 * input order, and the batching depends only on the input and the options, so the output
 * bytes are the same on every run. */
#ifndef MOE_EMBED_H
#define MOE_EMBED_H

#include <stdint.h>

#include "moe/ckpt.h"
#include "moe/config.h"
#include "moe/err.h"
#include "moe/model.h"
#include "moe/npy.h"
#include "moe/seqio.h"
#include "moe/tokenizer.h"

typedef enum moe_embed_pool {
    MOE_EMBED_POOL_MEAN = 0,
    MOE_EMBED_POOL_MAX = 1,
    MOE_EMBED_POOL_LAST = 2,
} moe_embed_pool;

#define MOE_EMBED_LAYER_DEFAULT (-1000000) /* the final norm output */

typedef struct moe_embed_opts {
    const char *ckpt_dir;      /* a checkpoint directory, or a run directory (its latest) */
    const char *const *inputs; /* sequence files ("-" = stdin) or .mtok shards */
    int n_inputs;
    moe_seqio_opts io;   /* filters, regions, reference for SAM/BAM/CRAM */
    const char *output;  /* FILE.npy (+ FILE.ids.tsv); NULL or "-": TSV on stdout */
    moe_npy_dtype dtype; /* of the .npy (and the precision of the TSV values) */
    moe_embed_pool pool;
    int layer; /* 0 = embeddings .. L = final norm; < 0 counts from the top
                  (-1 = L); MOE_EMBED_LAYER_DEFAULT = L */
    int per_token, per_window, rc_average;
    int64_t window, stride; /* content tokens per window / between window starts (0: auto) */
    int64_t batch_tokens;   /* padded tokens per forward pass (0: 8192) */
    moe_device_kind device; /* auto: a usable GPU, else the CPU; cuda needs a CUDA build + GPU */
    int bf16;               /* 1 bf16 recipe, 0 fp32, -1 (default) bf16 on a GPU, fp32 on CPU */
    int quiet;              /* no progress lines */
    int threads;            /* -@: CPU threads (moe_backend_open); 0: OpenMP's default */
    const char *command;    /* the command line, for the provenance line (NULL: none) */
} moe_embed_opts;

void moe_embed_opts_defaults(moe_embed_opts *o);

typedef struct moe_embed_summary {
    int64_t sequences, skipped, windows, tokens, rows, cols;
    double load_seconds;       /* opening the checkpoint and loading the model */
    double seconds;            /* reading, embedding and writing, after the load */
    int64_t device_peak_bytes; /* GPU memory the backend held at most (0 on the CPU) */
} moe_embed_summary;

/* Runs moe-embed. Input problems (checkpoint, sequences, options) are MOE_ERR_INPUT;
 * nothing is left under a final output name on failure. */
moe_status moe_embed_run(const moe_embed_opts *o, moe_embed_summary *sum, moe_err *err);

/* ---- a checkpoint opened for inference ---- */

typedef struct moe_infer_ckpt {
    moe_ckpt ckpt;         /* dir, config, tokenizer, tensors (moe/ckpt.h) */
    const moe_backend *be; /* set by moe_infer_ckpt_load_model, destroyed by close */
    moe_model model;       /* valid after moe_infer_ckpt_load_model */
    int has_model;
} moe_infer_ckpt;

/* Opens dir (a run directory means its latest checkpoint) with moe_ckpt_open: MANIFEST
 * verified (the optimizer files, never read here, by size only), config.yaml and
 * tokenizer.json loaded (the tokenizer fits the model), the weights indexed. */
moe_status moe_infer_ckpt_open(moe_infer_ckpt *c, const char *dir, moe_err *err);
/* Creates the model on a backend (device, threads and bf16 1/0/-1 as in moe_embed_opts) for
 * batches of up to max_batch x max_seq tokens and reads the weights into it. */
moe_status moe_infer_ckpt_load_model(moe_infer_ckpt *c, moe_device_kind device, int threads,
                                     int bf16, int max_batch, int max_seq, moe_err *err);
void moe_infer_ckpt_close(moe_infer_ckpt *c);

#endif
