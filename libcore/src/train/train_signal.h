/* train_signal: stop requests for moe-train (Slurm preemption, Ctrl-C).
 *
 * SIGTERM, SIGINT and the signal of train.stop_signal ask the run to stop: the training loop
 * polls moe_train_signal_pending() after every step, agrees with the other ranks on the
 * step, writes a checkpoint and returns as a successful run. A second SIGINT while a stop is
 * pending ends the process at once (the default action). The one thing to know: a signal
 * handler can reach nothing but a global, so the pending signal is the library's one piece of
 * process-wide mutable state besides the log level; it is set only by the handlers installed
 * here and read only by the loop. */
#ifndef MOE_TRAIN_SIGNAL_H
#define MOE_TRAIN_SIGNAL_H

#include <signal.h>

#include "moe/config.h"
#include "moe/err.h"

typedef struct moe_train_signals {
    int signo[3];              /* the handled signals, 0 = unused slot */
    struct sigaction saved[3]; /* the actions they had before */
} moe_train_signals;

/* Installs the stop handlers for SIGTERM, SIGINT and `extra` (MOE_STOP_SIGNAL_NONE: none)
 * and clears any earlier request; restore puts the previous actions back. */
moe_status moe_train_signals_install(moe_train_signals *s, moe_stop_signal extra, moe_err *err);
void moe_train_signals_restore(moe_train_signals *s);
/* The signal number that asked the run to stop, 0 when none did. */
int moe_train_signal_pending(void);

#endif
