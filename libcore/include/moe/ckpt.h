/* ckpt: checkpoint directories - writing them, and opening one for reading (the one way
 * moe-train --resume, moe-embed and moe-convert to-hf/inspect/reshard read a checkpoint).
 *
 *   RUN/ckpt-00000100/   config.yaml, tokenizer.json, model.safetensors,
 *                        optimizer-rank0.safetensors, trainer_state.json, MANIFEST
 *   RUN/latest           one line naming the newest complete checkpoint ("ckpt-00000100")
 *
 * Tensor layouts (either is a checkpoint; the tensor names are those of the parameter table,
 * moe/model_params.h, with GLOBAL expert indices):
 *   ep = 1   model.safetensors + optimizer-rank0.safetensors (what moe-train writes)
 *   ep = N   model.safetensors.index.json  {"metadata": {"total_size", "moe_ep": N},
 *                                           "weight_map": {name: file}}
 *            model-ep<R>-of-<N>.safetensors  (R, N 5 digits) rank 0: every dense tensor +
 *                                           rank 0's experts; rank R > 0: rank R's experts
 *            optimizer-rank<R>.safetensors   exp_avg/exp_avg_sq of exactly rank R's tensors
 * EP rank R owns the experts [R*E/N, (R+1)*E/N) of every layer, so the model files + index
 * are a Hugging Face sharded set. A weights-only checkpoint (moe-convert from-hf: MANIFEST
 * lists no optimizer file) opens with the optimizer too; its Adam moments read as zeros.
 *
 * Writing (ckpt_write.c): into RUN/.ckpt-<step>.tmp/, every file fsynced, MANIFEST (one line
 * per file: size, CRC32 in hex, name) last, the directory renamed into place and RUN
 * fsynced; only then is `latest` replaced (atomic rename) and older checkpoints beyond
 * `keep` removed. A crash leaves the previous checkpoint intact.
 * Reading (ckpt_open.c, ckpt_tensors.c): moe_ckpt_open resolves a run or checkpoint
 * directory, reads and parses MANIFEST once, verifies every file it lists (size + CRC32),
 * loads config.yaml, tokenizer.json (and trainer_state.json), detects the layout and builds
 * the tensor index from the parameter table of the checkpoint's own config, validating the
 * whole layout (index, MANIFEST membership, every parameter present once, F32, of its shape,
 * no strays) before any tensor is handed out. Problems are MOE_ERR_INPUT naming the file. */
#ifndef MOE_CKPT_H
#define MOE_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "moe/config.h"
#include "moe/err.h"
#include "moe/model_params.h"
#include "moe/safetensors.h"
#include "moe/tokenizer.h"

#define MOE_CKPT_PATH_MAX 4096
#define MOE_CKPT_INDEX_FILE "model.safetensors.index.json"

/* ---- names ---- */

/* "ckpt-%08lld" of step into buf. */
void moe_ckpt_dir_name(int64_t step, char *buf, size_t n);
/* Step of a checkpoint directory from its name ("…/ckpt-00000100" -> 100); -1 if the
 * name does not have that form. */
int64_t moe_ckpt_step_of(const char *ckpt_dir);
/* "model.safetensors" (ep 1) or "model-ep0000R-of-0000N.safetensors" into buf. */
void moe_ckpt_model_file(int rank, int ep, char *buf, size_t n);
/* "optimizer-rank<R>.safetensors" into buf. */
void moe_ckpt_optim_file(int rank, char *buf, size_t n);

/* ---- run directories ---- */

/* Steps of the complete checkpoints (ckpt-<digits> directories with a MANIFEST) in RUN,
 * ascending; *steps is malloc'ed (free it), *n may be 0. A missing RUN gives n = 0. */
moe_status moe_ckpt_list(const char *run_dir, int64_t **steps, int *n, moe_err *err);
/* The checkpoint named by RUN/latest (or, when that file is missing, the highest-step
 * complete checkpoint) into out. *found = 0 when RUN holds no checkpoint. */
moe_status moe_ckpt_latest(const char *run_dir, char *out, size_t n, int *found, moe_err *err);
/* A checkpoint directory (one with a MANIFEST) as is, or a run directory's latest
 * checkpoint, into out. Neither is MOE_ERR_INPUT naming path. */
moe_status moe_ckpt_resolve(const char *path, char *out, size_t n, moe_err *err);

/* ---- writing ---- */

typedef struct moe_ckpt_writer {
    char run_dir[MOE_CKPT_PATH_MAX];
    char tmp_dir[MOE_CKPT_PATH_MAX];   /* RUN/.ckpt-<step>.tmp */
    char final_dir[MOE_CKPT_PATH_MAX]; /* RUN/ckpt-<step> */
    int64_t step;
} moe_ckpt_writer;

/* Creates RUN (mkdir -p) and a fresh temporary directory for step (a stale one from a
 * crashed run is removed). An unwritable RUN is MOE_ERR_INPUT naming it. */
moe_status moe_ckpt_begin(moe_ckpt_writer *w, const char *run_dir, int64_t step, moe_err *err);
/* Path of file `name` inside the temporary directory (written by the caller). Returns buf,
 * or NULL when it does not fit. */
const char *moe_ckpt_path(const moe_ckpt_writer *w, const char *name, char *buf, size_t n);
/* fsyncs every file, writes MANIFEST, renames the directory into place (replacing an
 * existing checkpoint of the same step), fsyncs RUN, updates `latest`, and removes the
 * oldest checkpoints so that `keep` remain (0 = keep all). On failure the temporary
 * directory is removed. */
moe_status moe_ckpt_commit(moe_ckpt_writer *w, int64_t keep, moe_err *err);
/* Removes the temporary directory (after a failure while writing files). */
void moe_ckpt_abort(moe_ckpt_writer *w);
/* fsyncs every regular file of dir and writes dir/MANIFEST for them (what
 * moe_ckpt_commit does before its rename); for writers of a checkpoint directory outside a
 * run directory (moe-convert reshard), who then rename dir into place themselves. */
moe_status moe_ckpt_write_manifest(const char *dir, moe_err *err);

/* model.safetensors.index.json of the ep-rank layout into dir: every tensor of table t
 * (which holds every expert; fp32, so total_size is 4 bytes per element) mapped to its rank's
 * model file, plus metadata moe_ep. */
moe_status moe_ckpt_write_index(const char *dir, const moe_param_table *t, int ep, moe_err *err);

/* ---- trainer state (trainer_state.json) ---- */

typedef struct moe_trainer_state {
    int64_t step;        /* optimizer steps done */
    int64_t tokens_seen; /* training tokens consumed (inputs, all micro-steps) */
    int64_t data_epoch, data_index;
    uint64_t seed;
    int data_shuffle;
    int64_t data_samples, data_stream_tokens; /* to detect changed data on resume */
    char *last_metrics;                /* JSON object text of the last step's metrics, or NULL */
    char init_from[MOE_CKPT_PATH_MAX]; /* moe-train --init: the checkpoint the run's first
                                          weights came from ("" for none) */
    /* The loop's watch (train/train_health.h) at this step, so that a resumed run skips,
     * stops and warns as an uninterrupted one; all zero when an older trainer_state.json has
     * no "health". */
    struct {
        int64_t bad_in_row;  /* non-finite steps in a row (train.max_bad_steps counts them) */
        int64_t good;        /* good steps seen */
        double loss_mean;    /* running mean of good losses */
        int spiking, rising; /* inside a warned loss spike; the loss has risen */
    } health;
} moe_trainer_state;

/* trainer_state.json text of ts (malloc'ed), NULL when out of memory. */
char *moe_ckpt_state_json(const moe_trainer_state *ts);
/* Parses trainer_state.json text (path for messages) into *ts (ts->last_metrics malloc'ed);
 * anything else is MOE_ERR_INPUT naming path. */
moe_status moe_ckpt_state_parse(const char *text, const char *path, moe_trainer_state *ts,
                                moe_err *err);

/* ---- reading ---- */

enum {
    MOE_CKPT_OPTIMIZER = 1,          /* also open and validate the optimizer files */
    MOE_CKPT_SKIP_OPTIMIZER_CRC = 2, /* optimizer-* files: presence and size only (inference
                                        readers need not read twice the weights' bytes) */
    MOE_CKPT_TRAINER_STATE = 4,      /* parse trainer_state.json into state */
    MOE_CKPT_REPORT = 8, /* moe-convert inspect: a part that fails is recorded in part_err and
                            opening goes on; only an unresolvable path fails */
};

typedef enum moe_ckpt_part { /* what moe_ckpt_open checks, in order */
                             MOE_CKPT_PART_MANIFEST =
                                 0, /* MANIFEST parsed, every listed file's size and CRC32 */
                             MOE_CKPT_PART_CONFIG,    /* config.yaml */
                             MOE_CKPT_PART_TOKENIZER, /* tokenizer.json, and that it fits
                                                         model.vocab_size */
                             MOE_CKPT_PART_STATE,     /* trainer_state.json (with
                                                         MOE_CKPT_TRAINER_STATE) */
                             MOE_CKPT_PART_TENSORS, /* layout and tensor index (needs the config) */
                             MOE_CKPT_N_PARTS
} moe_ckpt_part;

typedef enum moe_ckpt_slot {                      /* what of a parameter to read */
                             MOE_CKPT_WEIGHT = 0, /* the fp32 master weight */
                             MOE_CKPT_EXP_AVG,    /* Adam's first moment (optimizer files) */
                             MOE_CKPT_EXP_AVG_SQ, /* Adam's second moment */
} moe_ckpt_slot;

typedef struct moe_ckpt_entry { /* one MANIFEST line */
    char *name;
    uint64_t size;
    uint32_t crc;
} moe_ckpt_entry;

typedef struct moe_ckpt_tensor {
    const moe_param *p;              /* its entry in moe_ckpt.table */
    int rank;                        /* EP rank whose files hold it (0 for dense tensors) */
    const moe_st_file *file, *ofile; /* model file; optimizer file (NULL: not opened) */
    const moe_st_tensor *w, *exp_avg, *exp_avg_sq; /* moments NULL without optimizer */
} moe_ckpt_tensor;

typedef struct moe_ckpt {
    char dir[MOE_CKPT_PATH_MAX]; /* the checkpoint directory actually used */
    moe_ckpt_entry *files;       /* [n_files] MANIFEST, in its order */
    int n_files;
    moe_config cfg;          /* its config.yaml */
    char *tokenizer_json;    /* tokenizer.json's text */
    moe_tokenizer *tok;      /* rebuilt from it */
    moe_trainer_state state; /* with MOE_CKPT_TRAINER_STATE */
    moe_param_table table;   /* of cfg.model, every expert */
    int ep;                  /* layout: 1 single file, N index + N rank files; 0 not opened */
    moe_st_file *model;      /* [ep] model files, rank order */
    moe_st_file *optim;      /* [ep] optimizer files, or NULL (not opened, weights-only) */
    int weights_only;        /* opened with the optimizer, but MANIFEST lists none */
    moe_ckpt_tensor *t;      /* [table.n_params] in table order */
    const moe_ckpt_tensor **by_name;    /* [table.n_params] into t, sorted by name */
    moe_err part_err[MOE_CKPT_N_PARTS]; /* MOE_CKPT_REPORT: status MOE_OK = part fine */
} moe_ckpt;

/* Opens path (a checkpoint directory, or a run directory meaning its latest checkpoint)
 * with flags (MOE_CKPT_*). On failure *c is left closed. */
moe_status moe_ckpt_open(moe_ckpt *c, const char *path, unsigned flags, moe_err *err);
/* Parses MANIFEST text [len] (NUL-terminated at len; its line ends are overwritten) into
 * c->files, as moe_ckpt_open reads RUN/ckpt-N/MANIFEST (path names it in errors): the
 * version-2 first line (file count and CRC32 of the lines below) if there is one, then one
 * "<size> <crc32 hex> <name>" line per file. A NUL byte, a malformed line, a last line
 * without its newline, lines that do not match the first line, or no line for a file every
 * checkpoint has is MOE_ERR_INPUT naming MANIFEST. The files are not looked at; c->files is
 * freed by moe_ckpt_close (c zeroed before, also after a failure). */
moe_status moe_ckpt_manifest_parse(moe_ckpt *c, char *text, size_t len, const char *path,
                                   moe_err *err);
/* Whether MANIFEST lists file `name`. */
int moe_ckpt_lists(const moe_ckpt *c, const char *name);
/* The parameter called name, NULL when the model has none (or the tensors were not
 * opened). */
const moe_ckpt_tensor *moe_ckpt_find(const moe_ckpt *c, const char *name);
/* Copies slot of parameter name, which must have shape [ndim dims], as f32 into
 * out [numel] (zeros for the moments of a weights-only checkpoint); a missing name or another
 * shape is MOE_ERR_INPUT. */
moe_status moe_ckpt_read_tensor(const moe_ckpt *c, const char *name, moe_ckpt_slot slot, int ndim,
                                const int64_t *shape, float *out, moe_err *err);
void moe_ckpt_close(moe_ckpt *c); /* safe on a zeroed or closed struct */
/* The checkpoint's id into out [n]: "<dir> step <N> model-crc32 <hex>" (N from the name
 * ckpt-<N>, else from trainer_state when opened with it, else 0; the CRC-32 that
 * MANIFEST records for the first model file, so two checkpoints with one id hold the same
 * weights). */
void moe_ckpt_id(const moe_ckpt *c, char *out, size_t n);
/* A samtools-style @PG line (no newline) into out [n]: "@PG ID:prog PN:prog VN:version
 * CL:command DS:checkpoint <id>", tab-separated; command may be NULL (CL left out). */
void moe_ckpt_provenance(const moe_ckpt *c, const char *prog, const char *command, char *out,
                         size_t n);

#endif
