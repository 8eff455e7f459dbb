/* testlib: see testlib.h. */
#include "testlib.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ops.h"
#include "moe/quant.h"

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

moe_model_config test_tiny_config(int tied) {
    moe_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 11;
    c.hidden_size = 16;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = 32;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.5; /* large: the aux and z gradients matter in finite differences */
    c.router_z_loss_coef = 0.1;
    c.initializer_range = 0.3;
    c.tie_word_embeddings = tied;
    return c;
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

void test_mxfp8_encode(uint8_t *q, uint8_t *mx, const float *src, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++)
        moe_mxfp8_encode_block(q + 32 * b, mx + b, src + 32 * b, 0);
}

void test_mxfp8_decode(float *dst, const uint8_t *q, const uint8_t *mx, int64_t n) {
    moe_cbuf c = {q, MOE_DTYPE_E4M3, NULL, mx};
    for (int64_t i = 0; i < n; i++)
        dst[i] = moe_cbuf_get(c, i);
}
