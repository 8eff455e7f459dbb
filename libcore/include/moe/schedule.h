/* schedule: the learning rate of each optimizer step.
 *
 * Linear warmup from lr/warmup_steps to lr over the first warmup_steps steps, then decay to
 * the floor min_lr at the last step, by the configured shape: cosine (half cosine), linear,
 * or constant (stays at lr). Steps count from 1; `total_steps` is train.steps, the length
 * of the whole run, so a run stopped and resumed sees the same schedule. The one thing to
 * know: the value depends only on (optim config, step, total_steps), never on history. */
#ifndef MOE_SCHEDULE_H
#define MOE_SCHEDULE_H

#include <stdint.h>

#include "moe/config.h"

/* Learning rate for step (1-based, 1 <= step <= total_steps; later steps stay at the end
 * value). */
double moe_schedule_lr(const moe_optim_config *o, int64_t step, int64_t total_steps);

#endif
