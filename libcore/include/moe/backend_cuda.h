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
 * why (no device, driver too old, out of memory) when no usable GPU is present. Callers above
 * the ops layer use moe_backend_open("cuda" | "cuda:N" | "auto") instead. be->destroy(be)
 * waits for queued work and releases the stream, handles, scratch and the table;
 * be->memory reports the device memory held through be->alloc, scratch buffers and the
 * cuBLASLt workspace (not the CUDA context). */
const moe_backend *moe_backend_cuda(moe_err *err);
/* Same, on device `device` (0-based). */
const moe_backend *moe_backend_cuda_on(int device, moe_err *err);
/* Number of CUDA devices visible to this process (0 when none, no driver, or any error; the
 * CUDA error state is reset then, so later calls start clean). */
int moe_cuda_device_count(void);
/* Opens (on 1) or closes (on 0) the region a profiler started with profiling off captures
 * (`ncu --profile-from-start off`, `nsys --capture-range=cudaProfilerApi`), after the GPU has
 * finished the work queued before: cudaProfilerStart / cudaProfilerStop. Errors as
 * be->synchronize reports them. */
void moe_cuda_profile_range(const moe_backend *be, int on);
/* The native MXFP8 operand that mxfp8's products read on MXFP8 tensor cores (be->mx_native,
 * sm_100+): x [M, K] (device; F32, BF16 or MXFP8; K a multiple of 32) in groups of rows
 * (offsets [E + 1], host) quantized by the rule floor_rule into q and sc (device, 16-byte
 * aligned), each group as moe_mx_encode_tiled (moe/quant.h) lays out its rows (transpose 0:
 * q [n, K], moe_mx_tiled_bytes(n, K) of scales) or its columns (transpose 1: q [K,
 * moe_mx_pad(n)], moe_mx_tiled_bytes(K, moe_mx_pad(n))), the groups one after another. The
 * kernels run on any GPU (gpu.quant_operands checks their bytes); errors as be->synchronize
 * reports them. */
void moe_cuda_mx_native_operand(const moe_backend *be, uint8_t *q, uint8_t *sc, moe_cbuf x,
                                const int32_t *offsets, int64_t E, int64_t K, int transpose,
                                int floor_rule);
/* The fp8-block operand that fp8-block's products read for an activation or gradient on
 * sm_90: x [M, K] (device; F32 or BF16) in 1 x 128 blocks along the reduction dimension with
 * the pow2 rule or not (moe_fp8_encode_block's bytes and scales, moe/quant.h), into q and s
 * (device, 16-byte aligned). transpose 0, the forward's and dgrad's rows (K a multiple of
 * 16): q [M, K] and scale of row r's block kb at s[kb * round_up(M, 4) + r]; transpose 1, the
 * wgrad's columns over groups of rows (offsets [E + 1], host; K a multiple of 4): group e as q_e
 * [K, moe_mx_pad(n_e)] (its tokens padded to 128 with zeros), the groups one after another, and the
 * scale of padded block b (counted over all groups) of feature k at s[b * K + k]; transpose 2,
 * the same bytes under precision.fp8_wgrad x-tiles: one scale per 128 x 128 tile of each q_e,
 * in moe_fp8_tile_scales(K, moe_mx_pad(n_e))'s layout (moe_quant_tiles_e4m3's transposed
 * scales), the groups one after another. gpu.quant_operands checks their bytes; errors as
 * be->synchronize reports them. */
void moe_cuda_fp8_block_operand(const moe_backend *be, uint8_t *q, float *s, moe_cbuf x,
                                const int32_t *offsets, int64_t E, int64_t K, int transpose,
                                int pow2);

#ifdef __cplusplus
}
#endif

#endif
