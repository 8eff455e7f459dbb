/* cuda_common.h: error reporting shared by the kernels/ entry points (private header).
 *
 * The one thing to know: libmoe_cuda is linked AFTER libmoe (it is libmoe's dependency), so
 * with static libraries code here must not call functions defined in libcore/src/ (the .c files)
 * (they may not be pulled into the link). MOE_HD header functions are fine; errors are
 * written into moe_err directly, with moe_err_set's "first error wins" rule. */
#ifndef MOE_KERNELS_CUDA_COMMON_H
#define MOE_KERNELS_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "moe/err.h"
}

static inline moe_status moe_cuda_err(moe_err *err, moe_status status, const char *fmt, ...) {
    if (!err || err->status != MOE_OK) return status;
    memset(err, 0, sizeof *err);
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return status;
}

/* Evaluates a CUDA runtime call; on failure records "CUDA <call> failed: <reason>" as a
 * runtime error in `err`, sets `st` and jumps to the function's `done:` cleanup label. */
#define MOE_CUDA_TRY(call)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = moe_cuda_err(err, MOE_ERR_RUNTIME, "CUDA %s failed: %s", #call,                   \
                              cudaGetErrorString(e_));                                             \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

#endif
