/* rng.cu: Philox normal/uniform fills on the device.
 *
 * The one thing to know: each thread computes its elements from (seed, stream, index)
 * with moe/rng.h's MOE_HD functions (Philox block, libm-free Box-Muller, no FMA
 * contraction), so the result equals the CPU fill bit for bit, whatever the launch shape. */
#include <cuda_runtime.h>

#include "cuda_common.h"

#include "moe/cuda_rng.h"
#include "moe/rng.h"

/* one thread per Philox block of 4 elements */
__global__ void moe_rng_normal_kernel(float *x, int64_t n, float mean, float std, uint64_t seed,
                                      uint64_t rng_stream) {
    int64_t nblocks = (n + 3) / 4, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += stride) {
        float z[4];
        moe_rng_normal4(seed, rng_stream, (uint64_t)b, z);
        for (int k = 0; k < 4 && 4 * b + k < n; k++)
            x[4 * b + k] = moe_rng_affine(z[k], mean, std);
    }
}

__global__ void moe_rng_uniform_kernel(float *x, int64_t n, float lo, float span, uint64_t seed,
                                       uint64_t rng_stream) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = moe_rng_affine(moe_rng_uniform(seed, rng_stream, (uint64_t)i), lo, span);
}

static int grid_for(int64_t work, int threads) {
    int64_t want = (work + threads - 1) / threads;
    return want > 65536 ? 65536 : (want < 1 ? 1 : (int)want);
}

extern "C" moe_status moe_cuda_rng_fill_normal(float *x, int64_t n, float mean, float std,
                                               uint64_t seed, uint64_t rng_stream, void *stream,
                                               moe_err *err) {
    moe_status st = MOE_OK;
    if (n <= 0) return MOE_OK;
    moe_rng_normal_kernel<<<grid_for((n + 3) / 4, 256), 256, 0, (cudaStream_t)stream>>>(
        x, n, mean, std, seed, rng_stream);
    MOE_CUDA_TRY(cudaGetLastError());
done:
    return st;
}

extern "C" moe_status moe_cuda_rng_fill_uniform(float *x, int64_t n, float lo, float hi,
                                                uint64_t seed, uint64_t rng_stream, void *stream,
                                                moe_err *err) {
    moe_status st = MOE_OK;
    if (n <= 0) return MOE_OK;
    /* hi - lo is formed on the host exactly as moe_rng_fill_uniform forms it */
    moe_rng_uniform_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, n, lo, hi - lo,
                                                                               seed, rng_stream);
    MOE_CUDA_TRY(cudaGetLastError());
done:
    return st;
}

extern "C" moe_status moe_cuda_rng_fill_host(float *x, int64_t n, int normal, float a, float b,
                                             uint64_t seed, uint64_t rng_stream, moe_err *err) {
    moe_status st = MOE_OK;
    float *d = NULL;
    if (n <= 0) return MOE_OK;
    MOE_CUDA_TRY(cudaMalloc((void **)&d, (size_t)n * sizeof(float)));
    st = normal ? moe_cuda_rng_fill_normal(d, n, a, b, seed, rng_stream, NULL, err)
                : moe_cuda_rng_fill_uniform(d, n, a, b, seed, rng_stream, NULL, err);
    if (st != MOE_OK) goto done;
    MOE_CUDA_TRY(cudaMemcpy(x, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
done:
    if (d) cudaFree(d);
    return st;
}
