/* metrics: the training curve of a run, as JSON lines and as a hand-written SVG chart.
 *
 * RUN/metrics.jsonl holds one JSON object per step (written by the trainer; at least
 * "step", "loss", "bits_per_base", "lr", "grad_norm", "tokens_per_s", "time", "elapsed_s";
 * evaluations add "val_loss", "val_bits_per_base"), RUN/loss.svg plots train and validation
 * cross-entropy in bits per base (log scale) against the step, and RUN/metrics.tsv is the
 * same table as metrics.jsonl for spreadsheets. moe_metrics_history keeps the (step, train,
 * validation) points needed to redraw the chart. The one thing to know: on
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
    double bpb;     /* training cross-entropy of the step, bits per base (NAN: none) */
    double val_bpb; /* validation cross-entropy after the step, bits per base (NAN: none) */
} moe_metrics_point;

typedef struct moe_metrics_history {
    moe_metrics_point *pts; /* [n], in step order */
    int64_t n, cap;
} moe_metrics_history;

void moe_metrics_history_init(moe_metrics_history *h);
void moe_metrics_history_free(moe_metrics_history *h);
/* Records the training loss of a step (a new point) or, for the step of the last point,
 * sets its values that are not NAN. */
moe_status moe_metrics_history_add(moe_metrics_history *h, int64_t step, double bpb, double val_bpb,
                                   moe_err *err);

/* Rewrites path (atomically) keeping only the JSON lines whose "step" <= max_step, and
 * appends their "bits_per_base"/"val_bits_per_base" to h. A missing file is not an error (h
 * unchanged). A line that is not a JSON object with an integer "step" is MOE_ERR_INPUT naming the
 * file and line. */
moe_status moe_metrics_jsonl_truncate(const char *path, int64_t max_step, moe_metrics_history *h,
                                      moe_err *err);

/* Writes the SVG line chart of h to path atomically: train cross-entropy as a line,
 * validation as a line with markers, a log-scale y axis in bits per base, ticks and labels,
 * a legend, `title` on top. */
moe_status moe_metrics_write_svg(const moe_metrics_history *h, const char *path, const char *title,
                                 moe_err *err);

/* Rewrites tsv_path (atomically) as the table of jsonl_path: a header of every key in order
 * of first appearance, then one line per JSON line (arrays comma-joined, numbers with 9
 * significant digits, a key a line lacks left empty). A line that is not a JSON object is
 * MOE_ERR_INPUT naming the file and line. */
moe_status moe_metrics_write_tsv(const char *jsonl_path, const char *tsv_path, moe_err *err);

/* A run's charts after a step: RUN/loss.svg from h (moe_metrics_write_svg) and
 * RUN/metrics.tsv from RUN/metrics.jsonl (moe_metrics_write_tsv). */
moe_status moe_metrics_write_charts(const moe_metrics_history *h, const char *run_dir,
                                    const char *title, moe_err *err);

/* "Nice" axis ticks covering [lo, hi]: first tick, spacing and count (at most ~8). */
void moe_metrics_ticks(double lo, double hi, double *first, double *spacing, int *count);

#endif
