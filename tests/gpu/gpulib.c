/* gpulib: see gpulib.h. */
#include "gpulib.h"

#include <stdio.h>

#include "moe/backend_cuda.h"

const moe_backend *test_cuda_backend(const char *test) {
    if (moe_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return NULL;
    }
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *be = moe_backend_cuda(&err);
    if (!be) {
        moe_err_print(&err, test, stderr);
        printf("skipped: the CUDA backend could not start\n");
    }
    return be;
}
