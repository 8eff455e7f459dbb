/* train_health: what the training loop watches between steps - non-finite steps (skipped
 * and counted, train.max_bad_steps) and loss spikes - and the hint it gives.
 *
 * The one thing to know: "lower optim.lr" is only suggested when the loss was rising before
 * (a warned spike, or a loss above ln(vocab_size), worse than a uniform guess); a loss that
 * is non-finite from the first step points at the data or the weights instead. The watch
 * goes into every checkpoint (trainer_state.json "health"), so that a resumed run counts on
 * from where the checkpoint was written. */
#ifndef MOE_TRAIN_HEALTH_H
#define MOE_TRAIN_HEALTH_H

#include <stdint.h>

#include "moe/ckpt.h"
#include "moe/err.h"

typedef struct moe_train_health {
    int64_t max_bad;    /* train.max_bad_steps */
    int64_t bad_in_row; /* non-finite steps since the last good one */
    int64_t good;       /* good steps (of the run, also across --resume) */
    double mean;        /* running mean of good losses (exponential, weight 0.1) */
    double ln_vocab;    /* the loss of a uniform guess */
    int spiking;        /* inside a warned spike (no new warning until it is over) */
    int rising;         /* the loss has risen: the learning rate is the likely cause */
} moe_train_health;

void moe_train_health_init(moe_train_health *h, int64_t max_bad_steps, int64_t vocab_size);
/* After a step with a finite loss and gradient norm: updates the mean; warns (once per
 * spike) when the loss is more than twice its recent mean or above 2 ln(vocab_size). */
void moe_train_health_good(moe_train_health *h, int64_t step, double loss);
/* After a non-finite step (its update was skipped): warns and counts it; more than max_bad
 * in a row is MOE_ERR_RUNTIME naming the step, the values and last_ckpt (the newest
 * checkpoint on disk, "" if none), with the hint that fits (see above). */
moe_status moe_train_health_bad(moe_train_health *h, int64_t step, double loss, double grad_norm,
                                const char *last_ckpt, moe_err *err);
/* Copies the watch into ts->health (before a checkpoint is written) and back (after one is
 * loaded: max_bad and ln_vocab stay the run's own). */
void moe_train_health_save(const moe_train_health *h, moe_trainer_state *ts);
void moe_train_health_restore(moe_train_health *h, const moe_trainer_state *ts);

#endif
