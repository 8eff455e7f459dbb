/* dtype.cu: dtype conversion kernels and the CUDA availability probe.
 *
 * The one thing to know: the per-element arithmetic is moe_dtype_load_f32 /
 * moe_dtype_store_f32 from moe/dtype.h, compiled here as __host__ __device__ functions, so
 * the GPU rounds exactly like the CPU reference (no cuda_fp8.h / cuda_bf16.h intrinsics,
 * whose NaN and saturation conventions differ in details). */
#include <cuda_runtime.h>

#include "cuda_common.h"

#include "moe/cuda_dtype.h"

__global__ void moe_convert_kernel(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt,
                                   int64_t n, unsigned flags) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        moe_dtype_store_f32(dst, dst_dt, i, moe_dtype_load_f32(src, src_dt, i), flags);
}

extern "C" int moe_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* reset the error state so later calls start clean */
        return 0;
    }
    return n;
}

/* dtype.c's moe_dtype_name/size are not callable from here (see cuda_common.h) */
static size_t float_size(moe_dtype dt) {
    switch (dt) {
    case MOE_DTYPE_F32:
        return 4;
    case MOE_DTYPE_BF16:
    case MOE_DTYPE_F16:
        return 2;
    case MOE_DTYPE_E4M3:
    case MOE_DTYPE_E5M2:
    case MOE_DTYPE_E8M0:
        return 1;
    default:
        return 0; /* not a float dtype */
    }
}

static moe_status check_pair(moe_dtype dst_dt, moe_dtype src_dt, int64_t n, moe_err *err) {
    if (!float_size(dst_dt) || !float_size(src_dt) || n < 0)
        return moe_cuda_err(err, MOE_ERR_INPUT,
                            "moe_cuda_convert: dtype %d -> %d of %lld elements is not supported "
                            "(float dtypes only)",
                            (int)src_dt, (int)dst_dt, (long long)n);
    return MOE_OK;
}

extern "C" moe_status moe_cuda_convert(void *dst, moe_dtype dst_dt, const void *src,
                                       moe_dtype src_dt, int64_t n, unsigned flags, void *stream,
                                       moe_err *err) {
    moe_status st = check_pair(dst_dt, src_dt, n, err);
    if (st != MOE_OK || n == 0) return st;
    if (dst_dt == src_dt) { /* a copy, as moe_convert_ex: NaN payloads and Inf survive */
        MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)n * float_size(src_dt),
                                     cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    } else {
        int64_t want = (n + 255) / 256;
        int blocks = want > 65536 ? 65536 : (int)want;
        moe_convert_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(dst, dst_dt, src, src_dt, n,
                                                                     flags);
        MOE_CUDA_TRY(cudaGetLastError());
    }
done:
    return st;
}

extern "C" moe_status moe_cuda_convert_host(void *dst, moe_dtype dst_dt, const void *src,
                                            moe_dtype src_dt, int64_t n, unsigned flags,
                                            moe_err *err) {
    moe_status st = check_pair(dst_dt, src_dt, n, err);
    if (st != MOE_OK || n == 0) return st;
    size_t sb = (size_t)n * float_size(src_dt), db = (size_t)n * float_size(dst_dt);
    void *dsrc = NULL, *ddst = NULL;
    MOE_CUDA_TRY(cudaMalloc(&dsrc, sb));
    MOE_CUDA_TRY(cudaMalloc(&ddst, db));
    MOE_CUDA_TRY(cudaMemcpy(dsrc, src, sb, cudaMemcpyHostToDevice));
    st = moe_cuda_convert(ddst, dst_dt, dsrc, src_dt, n, flags, NULL, err);
    if (st != MOE_OK) goto done;
    MOE_CUDA_TRY(cudaMemcpy(dst, ddst, db, cudaMemcpyDeviceToHost));
done:
    if (dsrc) cudaFree(dsrc);
    if (ddst) cudaFree(ddst);
    return st;
}
