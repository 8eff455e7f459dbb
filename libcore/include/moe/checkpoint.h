/* checkpoint: the mechanics of checkpoint directories in a run directory.
 *
 *   RUN/ckpt-00000100/   config.yaml, tokenizer.json, model.safetensors,
 *                        optimizer-rank0.safetensors, trainer_state.json, MANIFEST
 *   RUN/latest           one line naming the newest complete checkpoint ("ckpt-00000100")
 *
 * The step is zero-padded to 8 digits so that names sort. What goes into the files is the
 * trainer's business (moe/train.h); this module makes a set of files appear atomically and
 * proves on load that they are the bytes that were written. The one thing to know: a
 * checkpoint is written into RUN/.ckpt-<step>.tmp/, every file is fsynced, MANIFEST (one
 * line per file: size, CRC32 in hex, name) is written last, the directory is renamed into
 * place and the run directory fsynced; only then is `latest` replaced (atomic rename) and
 * older checkpoints beyond `keep` removed. A crash leaves the previous checkpoint intact. */
#ifndef MOE_CHECKPOINT_H
#define MOE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "moe/err.h"

#define MOE_CKPT_PATH_MAX 4096

typedef struct moe_ckpt_writer {
    char run_dir[MOE_CKPT_PATH_MAX];
    char tmp_dir[MOE_CKPT_PATH_MAX];   /* RUN/.ckpt-<step>.tmp */
    char final_dir[MOE_CKPT_PATH_MAX]; /* RUN/ckpt-<step> */
    int64_t step;
} moe_ckpt_writer;

/* "ckpt-%08lld" of step into buf. */
void moe_ckpt_dir_name(int64_t step, char *buf, size_t n);

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

/* Checks every line of DIR/MANIFEST against the files: present, same size, same CRC32.
 * A mismatch is MOE_ERR_INPUT naming the file, with a hint to use an older checkpoint. */
moe_status moe_ckpt_verify(const char *ckpt_dir, moe_err *err);
/* The same, but files whose names start with skip_crc (e.g. "optimizer-", for readers that
 * never open the optimizer state) are checked for presence and size only: inference on a
 * large checkpoint need not read the moments, twice the weights' bytes. */
moe_status moe_ckpt_verify_except(const char *ckpt_dir, const char *skip_crc, moe_err *err);

/* fsyncs every regular file of dir and writes dir/MANIFEST for them (what
 * moe_ckpt_commit does before its rename); for writers of a checkpoint directory outside a
 * run directory (moe-convert reshard), who then rename dir into place themselves. */
moe_status moe_ckpt_write_manifest(const char *dir, moe_err *err);

/* The file names listed in DIR/MANIFEST (no verification of the files), *names malloc'ed
 * array of malloc'ed strings (free with moe_ckpt_names_free). A malformed line is
 * MOE_ERR_INPUT naming MANIFEST and the line. */
moe_status moe_ckpt_manifest_names(const char *ckpt_dir, char ***names, int *n, moe_err *err);
void moe_ckpt_names_free(char **names, int n);

/* A checkpoint directory (one with a MANIFEST) as is, or a run directory's latest
 * checkpoint, into out. Neither is MOE_ERR_INPUT naming path. */
moe_status moe_ckpt_resolve(const char *path, char *out, size_t n, moe_err *err);

/* Steps of the complete checkpoints (ckpt-<digits> directories with a MANIFEST) in RUN,
 * ascending; *steps is malloc'ed (free it), *n may be 0. A missing RUN gives n = 0. */
moe_status moe_ckpt_list(const char *run_dir, int64_t **steps, int *n, moe_err *err);

/* The checkpoint named by RUN/latest (or, when that file is missing, the highest-step
 * complete checkpoint) into out. *found = 0 when RUN holds no checkpoint. */
moe_status moe_ckpt_latest(const char *run_dir, char *out, size_t n, int *found, moe_err *err);

/* Step of a checkpoint directory from its name ("…/ckpt-00000100" -> 100); -1 if the
 * name does not have that form. */
int64_t moe_ckpt_step_of(const char *ckpt_dir);

#endif
