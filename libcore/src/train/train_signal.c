/* train_signal: see train_signal.h. Handlers only store the signal and write one line with
 * write(2): nothing else is async-signal-safe. */
#include "train/train_signal.h"

#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t pending_signal; /* see the header: the one exception */

static void on_stop(int signo) {
    if (pending_signal && signo == SIGINT) { /* a second Ctrl-C: abort now */
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
        return;
    }
    if (pending_signal) return;
    pending_signal = signo;
    static const char msg[] = "moe-train: stop requested: finishing this step, then a "
                              "checkpoint (a second SIGINT aborts at once)\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n; /* nothing to do about a failed message inside a handler */
}

static int extra_signo(moe_stop_signal s) {
    switch (s) {
    case MOE_STOP_SIGNAL_USR1:
        return SIGUSR1;
    case MOE_STOP_SIGNAL_USR2:
        return SIGUSR2;
    case MOE_STOP_SIGNAL_HUP:
        return SIGHUP;
    default:
        return 0;
    }
}

moe_status moe_train_signals_install(moe_train_signals *s, moe_stop_signal extra, moe_err *err) {
    memset(s, 0, sizeof *s);
    pending_signal = 0;
    int sigs[3] = {SIGTERM, SIGINT, extra_signo(extra)};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART; /* reads and writes of the step go on undisturbed */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3 && sigs[i]; i++) {
        if (sigaction(sigs[i], &sa, &s->saved[i]) != 0) {
            moe_train_signals_restore(s);
            return moe_err_errno(err, NULL, "cannot install the stop-signal handlers");
        }
        s->signo[i] = sigs[i];
    }
    return MOE_OK;
}

void moe_train_signals_restore(moe_train_signals *s) {
    for (int i = 0; i < 3; i++)
        if (s->signo[i]) sigaction(s->signo[i], &s->saved[i], NULL);
    memset(s, 0, sizeof *s);
}

int moe_train_signal_pending(void) {
    return (int)pending_signal;
}
