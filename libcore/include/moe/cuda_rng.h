/* cuda_rng: C entry points of kernels/rng.cu (Philox fills on a CUDA device).
 *
 * Element i of a fill is draw i of (seed, stream), computed with the same MOE_HD functions
 * as moe_rng_fill_normal / moe_rng_fill_uniform (moe/rng.h), so GPU and CPU fills are
 * bit-identical (tests/gpu/test_rng_cuda.c). CUDA failures: MOE_ERR_RUNTIME naming the call. */
#ifndef MOE_CUDA_RNG_H
#define MOE_CUDA_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "moe/err.h"

/* x: [n] DEVICE buffer; enqueued on `stream` (cudaStream_t, NULL = default), not synchronised. */
moe_status moe_cuda_rng_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed,
                                    uint64_t rng_stream, void *stream, moe_err *err);
moe_status moe_cuda_rng_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed,
                                     uint64_t rng_stream, void *stream, moe_err *err);
/* x: [n] HOST buffer: fills on the current device and copies back (tests, one-off use).
 * normal != 0 selects the normal fill (a, b = mean, std) else uniform (a, b = lo, hi). */
moe_status moe_cuda_rng_fill_host(float *x, int64_t n, int normal, float a, float b, uint64_t seed,
                                  uint64_t rng_stream, moe_err *err);

#ifdef __cplusplus
}
#endif

#endif
