/* testlib: the few helpers every C test uses. A check that fails prints file:line and the
 * values involved, counts the failure and carries on, so one run shows every failure;
 * test_main() returns non-zero when anything failed. Exit code 77 means "skipped". */
#ifndef MOE_TESTLIB_H
#define MOE_TESTLIB_H
#include <stdint.h>
#include <stdio.h>

#include "moe/config.h"

extern int test_failures;
extern int test_checks;

void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Path of a file in the checkout (MOE_SRC_DIR) or the build tree (MOE_BUILD_DIR); the
 * returned string is static storage, overwritten by the next call. */
const char *test_src_path(const char *rel);
const char *test_build_path(const char *rel);
/* The AdamW settings of the tests that step a model through moe_model_adamw: betas 0.9 and
 * 0.95, eps 1e-8, weight decay wd on every tensor (norms and embeddings included). */
moe_optim_config test_optim(double wd);
/* The tiny model of the whole-model CPU tests: vocabulary 11, hidden 16, 2 layers of 4 heads
 * (2 kv heads) and 4 experts (top 2) of width 12, 32 positions, strong router losses (aux
 * 0.5, z 0.1), init range 0.3; tied embeddings when tied. */
moe_model_config test_tiny_config(int tied);
/* The stored MXFP8 form of src [n] (n a multiple of 32) into q [n], mx [n / 32], block by
 * block (moe_mxfp8_encode_block); and the values of such a pair into dst [n] (moe_cbuf_get). */
void test_mxfp8_encode(uint8_t *q, uint8_t *mx, const float *src, int64_t n);
void test_mxfp8_decode(float *dst, const uint8_t *q, const uint8_t *mx, int64_t n);
/* Returns 0 when no check failed, 1 otherwise, after printing a summary line. */
int test_summary(const char *name);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) test_fail(__FILE__, __LINE__, "%s", #cond);                                   \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);                                   \
    } while (0)
#define CHECK_INT_EQ(a, b)                                                                         \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        test_checks++;                                                                             \
        if (va_ != vb_) test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, va_, vb_); \
    } while (0)
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double va_ = (double)(a), vb_ = (double)(b);                                               \
        test_checks++;                                                                             \
        if (!(va_ - vb_ <= (tol) && vb_ - va_ <= (tol)))                                           \
            test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, va_, vb_,      \
                      (double)(tol));                                                              \
    } while (0)
#endif
