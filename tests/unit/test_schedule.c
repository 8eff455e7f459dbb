/* test_schedule: learning-rate values at the landmarks of each schedule shape (warmup ramp,
 * peak, midpoint, floor at the last step), against values computed by hand. */
#include <math.h>
#include <string.h>

#include "moe/schedule.h"
#include "testlib.h"

static moe_optim_config base(moe_lr_schedule s) {
    moe_optim_config o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.warmup_steps = 10;
    o.schedule = s;
    return o;
}

int main(void) {
    moe_optim_config c = base(MOE_SCHED_COSINE);
    /* warmup: step/warmup * lr */
    CHECK_NEAR(moe_schedule_lr(&c, 1, 110), 1e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 5, 110), 5e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 10, 110), 1e-3, 1e-15);
    /* cosine: halfway through the decay (step 60 of 10..110) is the mean of lr and min_lr;
     * a quarter of the way is min + (lr-min) * (1 + cos(pi/4)) / 2 */
    CHECK_NEAR(moe_schedule_lr(&c, 60, 110), 5.5e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 35, 110), 1e-4 + 9e-4 * (1 + sqrt(0.5)) / 2, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 110, 110), 1e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 500, 110), 1e-4, 1e-15); /* past the end: the floor */
    /* decreasing after warmup */
    for (int s = 11; s <= 110; s++)
        CHECK(moe_schedule_lr(&c, s, 110) <= moe_schedule_lr(&c, s - 1, 110) + 1e-18);

    moe_optim_config l = base(MOE_SCHED_LINEAR);
    CHECK_NEAR(moe_schedule_lr(&l, 60, 110), 5.5e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&l, 35, 110), 1e-3 - 9e-4 * 0.25, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&l, 110, 110), 1e-4, 1e-15);

    moe_optim_config k = base(MOE_SCHED_CONSTANT);
    CHECK_NEAR(moe_schedule_lr(&k, 3, 110), 3e-4, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&k, 11, 110), 1e-3, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&k, 110, 110), 1e-3, 1e-15);

    /* no warmup: step 1 already decays from the peak; run shorter than the warmup */
    c.warmup_steps = 0;
    CHECK_NEAR(moe_schedule_lr(&c, 1, 2), 1e-4 + 9e-4 * 0.5, 1e-15);
    CHECK_NEAR(moe_schedule_lr(&c, 2, 2), 1e-4, 1e-15);
    c.warmup_steps = 10;
    CHECK_NEAR(moe_schedule_lr(&c, 4, 4), 4e-4, 1e-15);
    return test_summary("schedule");
}
