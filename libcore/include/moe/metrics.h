/* metrics: the training curve of a run, as JSON lines and as a hand-written SVG chart.
 *
 * RUN/metrics.jsonl holds one JSON object per step (written by the trainer; at least
 * "step", "loss", "lr", "grad_norm", "tokens_per_s"; evaluations add "val_loss"), and
 * RUN/loss.svg plots train and validation loss against the step. moe_metrics_history keeps
 * the (step, loss, val_loss) points needed to redraw the chart. The one thing to know: on
 * resume the history is rebuilt from metrics.jsonl, dropping the lines of steps after the
 * checkpoint (they are recomputed, identically, by the resumed run), so the file always
 * reads as one uninterrupted run. */
#ifndef MOE_METRICS_H
#define MOE_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "moe/err.h"

typedef struct moe_metrics_point {
    int64_t step;
    double loss;     /* training loss of the step (NAN: none) */
    double val_loss; /* validation loss evaluated after the step (NAN: none) */
} moe_metrics_point;

typedef struct moe_metrics_history {
    moe_metrics_point *pts; /* [n], in step order */
    int64_t n, cap;
} moe_metrics_history;

void moe_metrics_history_init(moe_metrics_history *h);
void moe_metrics_history_free(moe_metrics_history *h);
/* Records the training loss of a step (a new point) or, for the step of the last point,
 * sets its values that are not NAN. */
moe_status moe_metrics_history_add(moe_metrics_history *h, int64_t step, double loss,
                                   double val_loss, moe_err *err);

/* Rewrites path (atomically) keeping only the JSON lines whose "step" <= max_step, and
 * appends their "loss"/"val_loss" to h. A missing file is not an error (h unchanged).
 * A line that is not a JSON object with an integer "step" is MOE_ERR_INPUT naming the
 * file and line. */
moe_status moe_metrics_jsonl_truncate(const char *path, int64_t max_step, moe_metrics_history *h,
                                      moe_err *err);

/* Writes the SVG line chart of h to path atomically: train loss as a line, validation loss
 * as a line with markers, axes with ticks and labels, a legend, `title` on top. */
moe_status moe_metrics_write_svg(const moe_metrics_history *h, const char *path, const char *title,
                                 moe_err *err);

/* "Nice" axis ticks covering [lo, hi]: first tick, spacing and count (at most ~8). */
void moe_metrics_ticks(double lo, double hi, double *first, double *spacing, int *count);

#endif
