/* schedule: see moe/schedule.h. */
#include "moe/schedule.h"

#include <math.h>

double moe_schedule_lr(const moe_optim_config *o, int64_t step, int64_t total_steps) {
    if (step < 1) step = 1;
    if (o->warmup_steps > 0 && step <= o->warmup_steps)
        return o->lr * (double)step / (double)o->warmup_steps;
    if (o->schedule == MOE_SCHED_CONSTANT) return o->lr;
    int64_t span = total_steps - o->warmup_steps;
    double p = span > 0 ? (double)(step - o->warmup_steps) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    double shape = o->schedule == MOE_SCHED_COSINE ? 0.5 * (1.0 + cos(M_PI * p)) : 1.0 - p;
    return o->min_lr + (o->lr - o->min_lr) * shape;
}
