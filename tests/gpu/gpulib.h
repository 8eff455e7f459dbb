/* gpulib: what every GPU test does first. */
#ifndef MOE_GPULIB_H
#define MOE_GPULIB_H

#include "moe/ops.h"

/* The CUDA backend on the first GPU, or NULL after printing why the test is skipped (no
 * device, or the backend could not start); the caller then returns 77 (ctest: skipped).
 * Release it with be->destroy(be). */
const moe_backend *test_cuda_backend(const char *test);

#endif
