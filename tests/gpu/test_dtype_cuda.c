/* test_dtype_cuda: GPU dtype conversions are bit-identical to the CPU reference.
 *
 * Every code of every 8- and 16-bit format is decoded and re-encoded into every float
 * format on the device and on the CPU (moe_convert_ex), and a dense strided sweep of f32
 * bit patterns is encoded with every rounding option; the bytes must match exactly.
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77 (ctest: skipped). */
#include <stdlib.h>
#include <string.h>

#include "moe/cuda_dtype.h"
#include "testlib.h"

typedef struct target {
    moe_dtype dt;
    unsigned flags;
    const char *what;
} target;

static const target k_targets[] = {
    {MOE_DTYPE_F32, 0, "f32"},
    {MOE_DTYPE_BF16, 0, "bf16"},
    {MOE_DTYPE_F16, 0, "f16"},
    {MOE_DTYPE_E4M3, 0, "e4m3 sat"},
    {MOE_DTYPE_E4M3, MOE_CVT_NOSAT, "e4m3 nosat"},
    {MOE_DTYPE_E5M2, 0, "e5m2 sat"},
    {MOE_DTYPE_E5M2, MOE_CVT_NOSAT, "e5m2 nosat"},
    {MOE_DTYPE_E8M0, 0, "e8m0 nearest"},
    {MOE_DTYPE_E8M0, MOE_CVT_E8M0_FLOOR, "e8m0 floor"},
    {MOE_DTYPE_E8M0, MOE_CVT_E8M0_CEIL, "e8m0 ceil"},
};
enum { NT = sizeof k_targets / sizeof k_targets[0] };

/* Converts src (n elements of sdt) to every target on both sides and compares bytes. */
static void compare_all(const void *src, moe_dtype sdt, int64_t n, const char *label) {
    size_t cap = (size_t)n * 4;
    unsigned char *a = malloc(cap), *b = malloc(cap);
    for (int t = 0; t < NT; t++) {
        const target *tg = &k_targets[t];
        moe_err err;
        moe_err_clear(&err);
        memset(a, 0xa5, cap), memset(b, 0x5a, cap);
        moe_status s1 = moe_convert_ex(a, tg->dt, src, sdt, n, tg->flags, &err);
        moe_status s2 = moe_cuda_convert_host(b, tg->dt, src, sdt, n, tg->flags, &err);
        CHECK_MSG(s1 == MOE_OK && s2 == MOE_OK, "%s -> %s: %s", label, tg->what, err.msg);
        size_t es = moe_dtype_size(tg->dt);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(a + (size_t)i * es, b + (size_t)i * es, es) != 0 && bad++ == 0) first = i;
        CHECK_MSG(bad == 0, "%s -> %s: %lld of %lld differ (first at %lld)", label, tg->what,
                  (long long)bad, (long long)n, (long long)first);
    }
    free(a);
    free(b);
}

int main(void) {
    int ndev = moe_cuda_available();
    if (ndev == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    fprintf(stderr, "%d CUDA device(s)\n", ndev);
    /* every 16-bit code of bf16 and f16, every byte of e4m3, e5m2, e8m0 */
    uint16_t *codes16 = malloc(65536 * 2);
    uint8_t codes8[256];
    for (int i = 0; i < 65536; i++)
        codes16[i] = (uint16_t)i;
    for (int i = 0; i < 256; i++)
        codes8[i] = (uint8_t)i;
    compare_all(codes16, MOE_DTYPE_BF16, 65536, "bf16 codes");
    compare_all(codes16, MOE_DTYPE_F16, 65536, "f16 codes");
    compare_all(codes8, MOE_DTYPE_E4M3, 256, "e4m3 codes");
    compare_all(codes8, MOE_DTYPE_E5M2, 256, "e5m2 codes");
    compare_all(codes8, MOE_DTYPE_E8M0, 256, "e8m0 codes");
    free(codes16);

    /* dense f32 sweep: stride 13 over all 2^32 bit patterns (~330M inputs), in chunks */
    const uint64_t stride = 13, total = (1ull << 32) / stride;
    const int64_t chunk = 1 << 24;
    uint32_t *x = malloc((size_t)chunk * 4);
    for (uint64_t start = 0; start < total; start += (uint64_t)chunk) {
        int64_t n = (int64_t)(total - start < (uint64_t)chunk ? total - start : (uint64_t)chunk);
        for (int64_t i = 0; i < n; i++)
            x[i] = (uint32_t)((start + (uint64_t)i) * stride);
        compare_all(x, MOE_DTYPE_F32, n, "f32 sweep");
    }
    free(x);

    /* integers are not converted on the device: an input error, not a crash */
    moe_err err;
    moe_err_clear(&err);
    int32_t iv[2] = {1, 2};
    float fv[2];
    CHECK_INT_EQ(moe_cuda_convert_host(fv, MOE_DTYPE_F32, iv, MOE_DTYPE_I32, 2, 0, &err),
                 MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "float dtypes only") != NULL);
    return test_summary("test_dtype_cuda");
}
