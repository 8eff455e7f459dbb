/* train_health: see train_health.h. */
#include "train/train_health.h"

#include <math.h>

#include "moe/log.h"

void moe_train_health_init(moe_train_health *h, int64_t max_bad_steps, int64_t vocab_size) {
    *h = (moe_train_health){.max_bad = max_bad_steps, .ln_vocab = log((double)vocab_size)};
}

void moe_train_health_good(moe_train_health *h, int64_t step, double loss) {
    h->bad_in_row = 0;
    int spike = (h->good >= 5 && loss > 2 * h->mean) || loss > 2 * h->ln_vocab;
    if (spike && !h->spiking) {
        h->rising = 1;
        moe_log_warn("step %lld: loss spike: %.4g nats (recent mean %.4g, a uniform guess is "
                     "%.4g); if it keeps rising, lower optim.lr or raise optim.warmup_steps "
                     "(optim.grad_clip bounds each update)",
                     (long long)step, loss, h->good ? h->mean : loss, h->ln_vocab);
    }
    h->spiking = spike || (h->spiking && loss > 1.5 * h->mean);
    if (loss > h->ln_vocab) h->rising = 1;
    if (!h->spiking) h->mean = h->good ? 0.9 * h->mean + 0.1 * loss : loss;
    h->good++;
}

moe_status moe_train_health_bad(moe_train_health *h, int64_t step, double loss, double grad_norm,
                                const char *last_ckpt, moe_err *err) {
    h->bad_in_row++;
    if (h->bad_in_row <= h->max_bad) {
        moe_log_warn("step %lld: non-finite loss %g or gradient norm %g: the update is skipped "
                     "(%lld in a row, train.max_bad_steps=%lld)",
                     (long long)step, loss, grad_norm, (long long)h->bad_in_row,
                     (long long)h->max_bad);
        return MOE_OK;
    }
    moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                "training diverged at step %lld: loss %g, gradient norm %g (%lld non-finite "
                "steps in a row, train.max_bad_steps=%lld); %s%s",
                (long long)step, loss, grad_norm, (long long)h->bad_in_row, (long long)h->max_bad,
                last_ckpt[0] ? "the last good checkpoint is intact: " : "no checkpoint was written",
                last_ckpt);
    if (h->rising)
        moe_err_hint(err, "the loss was rising before: lower optim.lr or raise "
                          "optim.warmup_steps, and resume from the last checkpoint");
    else
        moe_err_hint(err, "the loss was not rising before, so the learning rate is an unlikely "
                          "cause: check the weights (moe-convert inspect) and the data");
    return MOE_ERR_RUNTIME;
}

void moe_train_health_save(const moe_train_health *h, moe_trainer_state *ts) {
    ts->health.bad_in_row = h->bad_in_row;
    ts->health.good = h->good;
    ts->health.loss_mean = h->mean;
    ts->health.spiking = h->spiking;
    ts->health.rising = h->rising;
}

void moe_train_health_restore(moe_train_health *h, const moe_trainer_state *ts) {
    h->bad_in_row = ts->health.bad_in_row;
    h->good = ts->health.good;
    h->mean = ts->health.loss_mean;
    h->spiking = ts->health.spiking;
    h->rising = ts->health.rising;
}
