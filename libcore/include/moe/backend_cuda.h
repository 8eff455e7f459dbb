/* backend_cuda: the CUDA implementation of the ops.h backend table (code in kernels/).
 *
 * Only present when the library is built with CUDA (MOE_HAVE_CUDA). The table keeps fp32
 * buffers in device memory, exactly like the CPU table keeps them in host memory; under the
 * bf16 recipe the matrix products (cuBLASLt GEMMs, grouped expert GEMMs, flash attention)
 * take bf16 copies of their operands and accumulate in fp32, which is what the CPU backend
 * emulates. The one thing a reader must know: op entries return void, so an asynchronous
 * CUDA failure is kept in the backend and reported by be->synchronize(be, err) - call it at
 * least once per step and before trusting any result. */
#ifndef MOE_BACKEND_CUDA_H
#define MOE_BACKEND_CUDA_H

#include "moe/err.h"
#include "moe/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the CUDA backend on the current device (cudaGetDevice; select one beforehand with
 * CUDA_VISIBLE_DEVICES or moe_backend_cuda_on). Returns NULL with a runtime error that says
 * why (no device, driver too old, out of memory) when no usable GPU is present. */
const moe_backend *moe_backend_cuda(moe_err *err);
/* Same, on device `device` (0-based). */
const moe_backend *moe_backend_cuda_on(int device, moe_err *err);
/* Waits for queued work and releases the stream, handles, scratch and the table. NULL is ok. */
void moe_backend_cuda_free(const moe_backend *be);
/* Device memory this backend holds now and the most it has held (bytes): allocations made
 * through be->alloc, scratch buffers and the cuBLASLt workspace; not the CUDA context. */
void moe_backend_cuda_memory(const moe_backend *be, size_t *current, size_t *peak);
/* Number of CUDA devices visible to this process (0 when none or no driver). */
int moe_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
