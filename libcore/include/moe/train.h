/* train: the training loop of moe-train - data, model, AdamW, evaluation, metrics and
 * checkpoints of one run directory.
 *
 * One optimizer step = global_batch_tokens / micro_batch_tokens micro-steps of forward and
 * backward (gradients summed with scale 1/micro-steps), global-norm clipping folded into
 * AdamW's grad_scale, AdamW (fp32 master weights, moments in fp32 or, optim.moments, bf16;
 * decay only on parameters with moe_param.decay unless optim.decay_norms_and_embeddings),
 * learning rate from moe/schedule.h. Metrics go to RUN/metrics.jsonl (and --log-json),
 * loss.svg is redrawn at every evaluation and at the end, checkpoints (moe/ckpt.h) every
 * checkpoint.every steps and at the end of the invocation. With parallel.dp ranks
 * (moe/comm.h) rank r runs micro-steps r, r + dp, ...; the gradients are summed over the
 * ranks, each rank updates its 1/dp slice of the flat parameter array with its slice of the
 * AdamW state (ZeRO-1) and the slices are exchanged; rank 0 evaluates and writes the run
 * directory.
 *
 * The one thing to know: a checkpoint holds everything the next step depends on - weights,
 * both Adam moments, the step, the data position (epoch, index) and the seed - and every
 * computation is deterministic for a given thread count, so on the CPU a run stopped with
 * --stop-at N and resumed is bit-identical to an uninterrupted one. */
#ifndef MOE_TRAIN_H
#define MOE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "moe/ckpt.h"
#include "moe/config.h"
#include "moe/err.h"
#include "moe/model.h"

typedef struct moe_train_opts {
    const char *data_path; /* --data; NULL or "": cfg->data.path */
    const char *run_dir;   /* -o; NULL: "run" */
    const char *resume;    /* NULL: fresh run; "auto": RUN/latest if any; else a ckpt dir */
    const char *init;      /* --init CKPT: a run that starts (step 0, fresh AdamW) from the
                              weights of CKPT; with --resume, only when nothing is resumed */
    int64_t stop_at;       /* end this invocation after this step (0: run to train.steps) */
    const char *log_json;  /* --log-json FILE ("-" = stdout); NULL: cfg->log.json */
    int quiet;             /* no progress bar */
    int threads;           /* -@: CPU threads (moe_backend_open); 0: OpenMP's default */
    struct moe_comm *comm; /* the processes of the run (moe/comm.h; grouped by
                              moe_train_run for parallel.ep); NULL: one */
    int stop_on_signals;   /* 1: SIGTERM, SIGINT, train.stop_signal stop the run cleanly
                              (finish the step, checkpoint, return MOE_OK); moe-train */
    const char *command;   /* the command line, for RUN/provenance.txt (NULL: none) */
} moe_train_opts;

/* Runs (or resumes) training as configured. Input problems (data, config, checkpoint, run
 * directory) are MOE_ERR_INPUT; I/O and memory failures MOE_ERR_RUNTIME. */
moe_status moe_train_run(const moe_config *cfg, const moe_train_opts *opts, moe_err *err);

/* --dry-run: the resolved config (YAML) followed by YAML comments with total and active
 * parameters, training FLOPs per token and per step, and a memory estimate. */
moe_status moe_train_dry_run(const moe_config *cfg, FILE *out, moe_err *err);

/* Appends this invocation's @PG line to RUN/provenance.txt (samtools style, tab-separated:
 * ID/PN moe-train, VN version, CL command (left out when NULL), DS the UTC start time, the
 * step it starts from and, when step > 0, the checkpoint it resumed). */
moe_status moe_train_write_provenance(const char *run_dir, const char *command, int64_t step,
                                      moe_err *err);

/* Expert-parallel rank ep_rank's part of a checkpoint (moe/ckpt.h layouts) into dir: its
 * model file and optimizer file with the tensors of model's table (dense ones on rank 0
 * only); m, v [n_elems] backend memory, the full Adam moments of those tensors, F32 or BF16
 * (written as fp32 either way: BF16 values widened exactly). */
moe_status moe_train_write_shard(const char *dir, int ep_rank, int ep, const moe_model *model,
                                 moe_cbuf m, moe_cbuf v, int64_t step, moe_err *err);
/* After every rank's shard is in w's temporary directory: config.yaml (cfg, whose
 * parallel.ep is the layout), tokenizer.json, the index (ep > 1), trainer_state.json, then
 * moe_ckpt_commit (keep). On failure the temporary directory is removed. */
moe_status moe_train_finish_checkpoint(moe_ckpt_writer *w, int64_t keep, const moe_config *cfg,
                                       const char *tokenizer_json, const moe_trainer_state *ts,
                                       moe_err *err);
/* Writes RUN/ckpt-<step>/ in the single-file layout from a model holding every expert, its
 * Adam moments m, v ([n_elems] backend memory, in parameter-table order, F32 or BF16 as in
 * moe_train_write_shard; moe_trainer_state is in moe/ckpt.h), the resolved config, the
 * tokenizer spec and the state. */
moe_status moe_train_save_checkpoint(const char *run_dir, int64_t keep, const moe_config *cfg,
                                     const char *tokenizer_json, const moe_model *model, moe_cbuf m,
                                     moe_cbuf v, const moe_trainer_state *ts, moe_err *err);

/* Loads a checkpoint directory (opened and verified with moe_ckpt_open) into model, m, v and *ts
 * (ts->last_metrics is malloc'ed). Checks that the checkpoint's model config equals cfg->model and
 * that its tokenizer has the vocabulary hash `vocab_hash` (0: not checked). m, v [n_elems]
 * backend memory, F32 or BF16: the checkpoint's fp32 moments are rounded to nearest even for
 * BF16, exact for a checkpoint of a bf16-moment run, a rounding once of an fp32 one's. */
moe_status moe_train_load_checkpoint(const char *ckpt_dir, const moe_config *cfg,
                                     uint64_t vocab_hash, moe_model *model, moe_buf m, moe_buf v,
                                     moe_trainer_state *ts, moe_err *err);

/* --init CKPT, before moe_train_run: cfg->model becomes the checkpoint's model config
 * (a model.* override among overrides [n_overrides] that differs from it is MOE_ERR_INPUT
 * naming the key), then cfg is validated again. */
moe_status moe_train_init_config(moe_config *cfg, const char *init, int n_overrides,
                                 char *const *overrides, moe_err *err);

/* The fp32 weights of a verified checkpoint into model (no optimizer state, no trainer
 * state), checked like moe_train_load_checkpoint; the directory used goes to used [n]. */
moe_status moe_train_load_weights(const char *ckpt_dir, const moe_config *cfg, uint64_t vocab_hash,
                                  moe_model *model, char *used, size_t n, moe_err *err);

#endif
