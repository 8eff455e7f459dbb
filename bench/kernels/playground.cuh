/* playground.cuh: what the bench/kernels programs share - exit-on-error checks of CUDA and
 * cuBLAS calls, and bf16 test data from a hash (values in [-0.5, 0.5), different per seed). */
#ifndef MOE_BENCH_KERNELS_PLAYGROUND_CUH
#define MOE_BENCH_KERNELS_PLAYGROUND_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d cublas %d\n", __FILE__, __LINE__, (int)s_);                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* p [n] = a hash of (i, seed) as a bf16 in [-0.5, 0.5) */
__global__ void pg_fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        p[i] = __float2bfloat16(((h >> 8) & 1023) / 1024.0f - 0.5f);
    }
}

#endif
