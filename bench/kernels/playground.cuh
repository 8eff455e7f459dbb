/* playground.cuh: what the bench/kernels programs share - exit-on-error checks of CUDA and
 * cuBLAS calls, bf16 test data from a hash (values in [-0.5, 0.5), different per seed), the
 * first differing byte of two device buffers, a 4 x 4 byte transpose, a pointer's alignment,
 * the timing of operations taking turns, and of every algorithm cuBLASLt offers for a product. */
#ifndef MOE_BENCH_KERNELS_PLAYGROUND_CUH
#define MOE_BENCH_KERNELS_PLAYGROUND_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
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

/* p [n] = a hash of (i, seed) in [-0.5, 0.5) as bf16 or fp32 (T) */
template <class T> __global__ void pg_fill(T *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        p[i] = T(((h >> 8) & 1023) / 1024.0f - 0.5f);
    }
}

/* *first = the smallest i < n with a[i] != b[i] (bytes), left as is when none. A thread
 * stops at its first difference (its smallest), so a wrong variant costs one atomic per
 * thread, not one per byte. */
__global__ void pg_k_first_diff(const uint8_t *__restrict__ a, const uint8_t *__restrict__ b,
                                size_t n, unsigned long long *first) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (a[i] != b[i]) {
            atomicMin(first, (unsigned long long)i);
            return;
        }
}

/* First differing byte of device buffers a and b [bytes], or -1; d_first one device word,
 * sms the device's SM count. */
static inline long long pg_first_diff(const void *a, const void *b, size_t bytes,
                                      unsigned long long *d_first, int sms) {
    const unsigned long long none = ~0ull;
    unsigned long long first;
    CK(cudaMemcpy(d_first, &none, sizeof none, cudaMemcpyHostToDevice));
    pg_k_first_diff<<<4 * sms, 256>>>((const uint8_t *)a, (const uint8_t *)b, bytes, d_first);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&first, d_first, sizeof first, cudaMemcpyDeviceToHost));
    return first == none ? -1 : (long long)first;
}

/* the largest power of two up to 256 that divides p's address */
static inline int pg_align_of(const void *p) {
    int a = 256;
    while ((uintptr_t)p % a)
        a /= 2;
    return a;
}

/* qsort's ascending order of floats */
static inline int pg_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Times nk operations taking turns: warm untimed rounds, then rounds timed ones. Round r
 * (negative while warming up) queues round_start(r), then launch(k) between two events for
 * every k with on[k], in order of k; med[k] = the median ms of operation k over the timed
 * rounds (left alone where !on[k]). A round is queued whole and waited for once, so each
 * operation's start event runs as the previous one ends (no launch latency is timed), and
 * with every operation in every round a drift of the GPU's clock over the run falls on all
 * operations alike. */
template <class S, class F>
static void pg_time_turns(int nk, const int *on, int warm, int rounds, S round_start, F launch,
                          float *med) {
    cudaEvent_t *ev = (cudaEvent_t *)malloc(sizeof(cudaEvent_t) * 2 * nk);
    float *ms = (float *)malloc(sizeof(float) * nk * rounds); /* [nk][rounds] */
    for (int k = 0; k < 2 * nk; k++)
        CK(cudaEventCreate(&ev[k]));
    for (int r = -warm; r < rounds; r++) {
        round_start(r);
        for (int k = 0; k < nk; k++) {
            if (!on[k]) continue;
            CK(cudaEventRecord(ev[2 * k]));
            launch(k);
            CK(cudaEventRecord(ev[2 * k + 1]));
        }
        CK(cudaDeviceSynchronize());
        for (int k = 0; k < nk && r >= 0; k++)
            if (on[k]) CK(cudaEventElapsedTime(&ms[k * rounds + r], ev[2 * k], ev[2 * k + 1]));
    }
    for (int k = 0; k < nk; k++) {
        if (!on[k]) continue;
        qsort(ms + k * rounds, rounds, sizeof(float), pg_cmp_float);
        med[k] = ms[k * rounds + rounds / 2];
    }
    for (int k = 0; k < 2 * nk; k++)
        CK(cudaEventDestroy(ev[k]));
    free(ev);
    free(ms);
}

/* Every algorithm cuBLASLt's heuristic offers (up to 16) for the product desc describes
 * (layouts la, lb, lc; cuBLASLt's operands a and b, output c, alpha 1 and beta), each timed over
 * 10 runs after 3, workspace ws of wsb bytes: the heuristic's first choice's ms in *first, the
 * best in *best (its index in *best_i); returns how many were offered. */
static inline int pg_time_algos(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                cublasLtMatrixLayout_t lc, const void *a, const void *b, void *c,
                                float beta, void *ws, size_t wsb, float *first, float *best,
                                int *best_i) {
    cublasLtMatmulPreference_t p;
    CB(cublasLtMatmulPreferenceCreate(&p));
    CB(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, p, 16, res, &found));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float alpha = 1.0f;
    *first = 0, *best = 1e30f, *best_i = -1;
    for (int i = 0; i < found; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        for (int w = 0; w < 3; w++)
            CB(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &res[i].algo, ws,
                              wsb, 0));
        const int reps = 10;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++)
            CB(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &res[i].algo, ws,
                              wsb, 0));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        if (i == 0) *first = ms;
        if (ms < *best) *best = ms, *best_i = i;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CB(cublasLtMatmulPreferenceDestroy(p));
    return found;
}

#endif
