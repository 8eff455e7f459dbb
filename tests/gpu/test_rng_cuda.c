/* test_rng_cuda: Philox fills on the GPU equal the CPU fills bit for bit.
 *
 * Normal and uniform fills of a few million elements (ragged length, several seeds and
 * streams, 64-bit seeds/streams) are drawn on the device and on the CPU and compared as
 * bytes. Without a CUDA device: "skipped: no CUDA device", exit 77. */
#include <stdlib.h>
#include <string.h>

#include "moe/cuda_dtype.h"
#include "moe/cuda_rng.h"
#include "moe/rng.h"
#include "testlib.h"

int main(void) {
    if (moe_cuda_available() == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    const int64_t n = (1 << 22) + 3;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    const uint64_t seeds[3] = {0, 42, 0xfedcba9876543210ull};
    const uint64_t streams[3] = {0, 7, 0x123456789abull};
    for (int s = 0; s < 3; s++) {
        for (int normal = 0; normal <= 1; normal++) {
            moe_err err;
            moe_err_clear(&err);
            float p = normal ? 0.5f : -2.0f, q = normal ? 0.02f : 3.0f;
            if (normal)
                moe_rng_fill_normal(a, n, p, q, seeds[s], streams[s]);
            else
                moe_rng_fill_uniform(a, n, p, q, seeds[s], streams[s]);
            memset(b, 0xff, (size_t)n * 4);
            CHECK_INT_EQ(moe_cuda_rng_fill_host(b, n, normal, p, q, seeds[s], streams[s], &err),
                         MOE_OK);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&a[i], &b[i], 4) != 0 && bad++ == 0) first = i;
            CHECK_MSG(bad == 0, "%s seed %d: %lld of %lld differ, first %lld (%a vs %a)",
                      normal ? "normal" : "uniform", s, (long long)bad, (long long)n,
                      (long long)first, first >= 0 ? (double)a[first] : 0.0,
                      first >= 0 ? (double)b[first] : 0.0);
        }
    }
    free(a);
    free(b);
    return test_summary("test_rng_cuda");
}
