/* testlib: see testlib.h. */
#include "testlib.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int test_failures = 0;
int test_checks = 0;

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    test_failures++;
    if (test_failures > 50) return; /* the count still tells how many */
    fprintf(stderr, "%s:%d: FAILED: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static const char *join(const char *envvar, const char *rel) {
    static char buf[4096];
    const char *root = getenv(envvar);
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

const char *test_src_path(const char *rel) {
    return join("MOE_SRC_DIR", rel);
}

const char *test_build_path(const char *rel) {
    return join("MOE_BUILD_DIR", rel);
}

int test_summary(const char *name) {
    fprintf(stderr, "%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

moe_optim_config test_optim(double wd) {
    moe_optim_config o;
    memset(&o, 0, sizeof o);
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    o.weight_decay = wd;
    o.decay_norms_and_embeddings = true;
    return o;
}
