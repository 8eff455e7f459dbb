/* rng: array fills over the Philox stream (see moe/rng.h for the fixed mapping).
 *
 * Element i always gets draw i of (seed, stream), whatever the thread count or chunking,
 * so these fills equal the scalar functions and the CUDA kernels element for element. */
#include "moe/rng.h"

void moe_rng_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed,
                         uint64_t stream) {
    int64_t nblocks = (n + 3) / 4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= 65536)
#endif
    for (int64_t b = 0; b < nblocks; b++) {
        float z[4];
        moe_rng_normal4(seed, stream, (uint64_t)b, z);
        for (int64_t k = 0; k < 4 && 4 * b + k < n; k++)
            x[4 * b + k] = moe_rng_affine(z[k], mean, std);
    }
}

void moe_rng_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed, uint64_t stream) {
    float span = hi - lo;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= 65536)
#endif
    for (int64_t i = 0; i < n; i++)
        x[i] = moe_rng_affine(moe_rng_uniform(seed, stream, (uint64_t)i), lo, span);
}
