/* cuda_dtype: C entry points of kernels/dtype.cu (dtype conversion on a CUDA device).
 *
 * The device kernels call the same MOE_HD functions as the CPU (moe/dtype.h), so their
 * results are bit-identical to moe_convert_ex(); tests/gpu/test_dtype_cuda.c checks it for
 * every 8/16-bit code and a dense f32 sweep. Only float dtypes are converted on the device.
 * Every CUDA failure comes back as MOE_ERR_RUNTIME naming the CUDA call and its error
 * string; nothing here aborts. Declared only when the CUDA backend is built (MOE_HAVE_CUDA). */
#ifndef MOE_CUDA_DTYPE_H
#define MOE_CUDA_DTYPE_H

#include <stdint.h>

#include "moe/dtype.h" /* includes moe/err.h with C linkage */

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is none, no driver, or any error. */
int moe_cuda_available(void);

/* dst (dst_dt) = src (src_dt) converted, both DEVICE buffers of n elements; flags as
 * moe_convert_ex (MOE_CVT_*). Enqueued on `stream` (a cudaStream_t; NULL = default stream)
 * and not synchronised; launch errors are reported. */
moe_status moe_cuda_convert(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt,
                            int64_t n, unsigned flags, void *stream, moe_err *err);

/* The same on HOST buffers: copies src to the current device, converts, copies the result
 * back and synchronises. For tests and one-off conversions, not for hot paths. */
moe_status moe_cuda_convert_host(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt,
                                 int64_t n, unsigned flags, moe_err *err);

#ifdef __cplusplus
}
#endif

#endif
