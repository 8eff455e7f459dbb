/* grouped_gemm.cu: a playground for issue 12's grouped expert product - one persistent launch
 * over all experts, the experts' row offsets read on the device (no host synchronisation, no
 * plan per row count) - against cuBLASLt called once per expert (kernels/gemm_cublaslt.cu's
 * way, both with a plan made for each call, as when the row counts changed since the last
 * step, and with cached plans), on the mixtral8x7b-2L expert shapes with even and uneven
 * counts; it also prints the host time of one plan (descriptor, layouts, heuristic query).
 *
 * Status: WRITTEN WITHOUT A GPU (2026-12-02, no device time was left); it has not been
 * compiled for or run on an H200. First run: build and run it as below; it checks its own
 * output against cuBLASLt before it prints a rate, and a failed check means the kernel is
 * wrong, not the rate.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Ilibcore/include -Ilibcore/src -Ikernels \
 *       bench/kernels/grouped_gemm.cu -lcublasLt -o /tmp/grouped_gemm && /tmp/grouped_gemm
 *
 * The product (forward of w1/w3 and w2): Y[r, :] = X[r, :] W_e^T for the rows r in
 * [off[e], off[e + 1]) of expert e; X [M, K] and W [E, N, K] bf16, both K-contiguous, Y [M, N]
 * bf16, fp32 accumulation. The kernel: a block of two consumer warpgroups (64 rows each, 128 x
 * 256 output tile, wgmma m64n128k16 twice per 16 columns of K) and a producer warp whose lane
 * 0 streams the A tile [128][64] and the B tile [256][64] of each K step into GG_NS stages by
 * TMA (the 128-byte swizzle of kernels/sm90/wgmma.cuh; full/empty mbarriers as the attention
 * kernels). Each block walks the tiles t = blockIdx.x, + gridDim.x, ... of the list expert by
 * expert, n-tile by n-tile, m-tile fastest (so neighbouring blocks share a weight tile in L2),
 * built in shared memory from the device offsets. Rows of the next expert that a 128-row tile
 * reads are multiplied but never stored; the consumers keep one wgmma group in flight
 * (wait_group 1) and release a stage when the group that read it has completed. */
#include <chrono>
#include <vector>

#include "playground.cuh"
#include "sm90/wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define GG_BM 128 /* rows per tile: two consumer warpgroups of 64 */
#define GG_BN 256 /* columns per tile: two wgmma n128 halves */
#define GG_BK 64  /* K per stage: one 128-byte swizzled column block */
#define GG_NS 4   /* stages */
#define GG_MAXE 128
#define GG_THREADS 288
#define GG_A_BYTES (GG_BM * GG_BK * 2)
#define GG_B_BYTES (GG_BN * GG_BK * 2)

__device__ __forceinline__ void gg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void gg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* one TMA box {64 columns, rows} of a 2D map at (col, row) into dst, completing on bar */
__device__ __forceinline__ void gg_tma(uint32_t dst, const CUtensorMap *map, int col, int row,
                                       uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}

/* Tile t of the list: expert e, first row r0 (global), first column n0; 0 past the end. */
struct gg_tile {
    int e, r0, rend, n0;
};
__device__ __forceinline__ int gg_find(const int *pref, const int *off, int E, int NT, int t,
                                       gg_tile *tl) {
    if (t >= pref[E]) return 0;
    int e = 0;
    while (pref[e + 1] <= t)
        e++;
    const int mt_e = (off[e + 1] - off[e] + GG_BM - 1) / GG_BM, local = t - pref[e];
    tl->e = e;
    tl->r0 = off[e] + (local % mt_e) * GG_BM;
    tl->rend = off[e + 1];
    tl->n0 = (local / mt_e) * GG_BN;
    (void)NT;
    return 1;
}

/* y [M, N] = x W_e^T per expert (maps: x [M, K], w [E * N, K]); off [E + 1] on the device. */
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped(bf16 *__restrict__ y, const __grid_constant__ CUtensorMap mx,
              const __grid_constant__ CUtensorMap mw, const int32_t *__restrict__ off, int E,
              int N, int K) {
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + GG_NS * GG_A_BYTES;
    const uint32_t bfull = sB + GG_NS * GG_B_BYTES, bempty = bfull + 8 * GG_NS;
    const int NT = (N + GG_BN - 1) / GG_BN, KB = (K + GG_BK - 1) / GG_BK;
    if (threadIdx.x == 0) {
        s_pref[0] = 0;
        for (int e = 0; e < E; e++) {
            s_off[e] = off[e];
            s_pref[e + 1] = s_pref[e] + (off[e + 1] - off[e] + GG_BM - 1) / GG_BM * NT;
        }
        s_off[E] = off[E];
        for (int s = 0; s < GG_NS; s++) {
            fa3_bar_init(bfull + 8 * s, 1);
            fa3_bar_init(bempty + 8 * s, 2 * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    gg_tile tl;

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x != 256) return;
        for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, NT, t, &tl); t += gridDim.x)
            for (int kb = 0; kb < KB; kb++, it++) {
                const int s = it % GG_NS;
                if (it >= GG_NS) fa3_bar_wait(bempty + 8 * s, ((it / GG_NS) - 1) & 1);
                fa3_bar_expect(bfull + 8 * s, GG_A_BYTES + GG_B_BYTES);
                gg_tma(sA + s * GG_A_BYTES, &mx, kb * GG_BK, tl.r0, bfull + 8 * s);
                gg_tma(sB + s * GG_B_BYTES, &mw, kb * GG_BK, tl.e * N + tl.n0, bfull + 8 * s);
            }
        return;
    }

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    float acc0[16][4], acc1[16][4]; /* columns n0 + [0, 128) and n0 + [128, 256) */
    for (int t = blockIdx.x, it = 0; gg_find(s_pref, s_off, E, NT, t, &tl); t += gridDim.x) {
        for (int kb = 0; kb < KB; kb++, it++) {
            const int s = it % GG_NS;
            fa3_bar_wait(bfull + 8 * s, (it / GG_NS) & 1);
            fa3_hold(acc0); /* the accumulators stay in registers across the asynchronous products */
            fa3_hold(acc1);
            fa3_fence();
            const uint32_t a = sA + s * GG_A_BYTES + wg * 64 * 128, b = sB + s * GG_B_BYTES;
#pragma unroll
            for (int ks = 0; ks < GG_BK / 16; ks++) { /* 16 columns: 32 bytes of a 128-byte row */
                const uint64_t da = fa3_desc(a + ks * 32, 16, 1024);
                fa3_mma_ss(acc0, da, fa3_desc(b + ks * 32, 16, 1024), kb > 0 || ks > 0);
                fa3_mma_ss(acc1, da, fa3_desc(b + 128 * 128 + ks * 32, 16, 1024), kb > 0 || ks > 0);
            }
            gg_commit();
            gg_wait<1>(); /* the previous stage's products are done: release it */
            fa3_hold(acc0);
            fa3_hold(acc1);
            if (kb > 0) fa3_bar_arrive(bempty + 8 * ((it - 1) % GG_NS));
        }
        gg_wait<0>();
        fa3_hold(acc0);
        fa3_hold(acc1);
        fa3_bar_arrive(bempty + 8 * ((it - 1) % GG_NS));
        /* store: thread rows r and r + 8 of its warp's 16, columns nt * 8 + 2 tq (+1) */
        const int r = tl.r0 + wg * 64 + warp * 16 + g;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int nt = 0; nt < 16; nt++) {
                const float(*acc)[4] = h ? acc1 : acc0;
                const int col = tl.n0 + h * 128 + nt * 8 + 2 * tq;
                if (col >= N) continue;
                if (r < tl.rend) fa_st2(y + (int64_t)r * N + col, acc[nt][0], acc[nt][1]);
                if (r + 8 < tl.rend) fa_st2(y + (int64_t)(r + 8) * N + col, acc[nt][2], acc[nt][3]);
            }
    }
}

/* ---- host ---- */

/* The 2D map of a [rows, cols] bf16 row-major tensor for boxes {64 columns, box_rows}. */
static CUtensorMap map2d(const bf16 *p, int64_t rows, int64_t cols, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc;
    if (!enc) {
        cudaDriverEntryPointQueryResult res;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                            cudaEnableDefault, &res));
    }
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(cols * 2)};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return m;
}

static void grouped(bf16 *y, const bf16 *x, const bf16 *w, const int32_t *doff, int64_t M, int E,
                    int N, int K, int sms) {
    static const size_t smem = GG_NS * (GG_A_BYTES + GG_B_BYTES) + 1024 + 16 * GG_NS;
    static int once;
    if (!once++)
        CK(cudaFuncSetAttribute(k_grouped, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUtensorMap mx = map2d(x, M, K, GG_BM), mw = map2d(w, (int64_t)E * N, K, GG_BN);
    k_grouped<<<sms, GG_THREADS, smem>>>(y, mx, mw, doff, E, N, K);
    CK(cudaGetLastError());
}

/* The cuBLASLt plan of one expert's row-major y_e [n, N] = x_e [n, K] W_e^T, as
 * kernels/gemm_cublaslt.cu builds it (descriptor, layouts, the heuristic's first algorithm). */
struct plan {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
static plan plan_make(cublasLtHandle_t lt, size_t wsb, int n, int N, int K) {
    plan q;
    CB(cublasLtMatmulDescCreate(&q.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CB(cublasLtMatrixLayoutCreate(&q.la, CUDA_R_16BF, K, N, K));
    CB(cublasLtMatrixLayoutCreate(&q.lb, CUDA_R_16BF, K, n, K));
    CB(cublasLtMatrixLayoutCreate(&q.lc, CUDA_R_16BF, N, n, N));
    cublasLtMatmulPreference_t p;
    CB(cublasLtMatmulPreferenceCreate(&p));
    CB(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, q.d, q.la, q.lb, q.lc, q.lc, p, 1, &res, &found));
    if (found < 1) {
        fprintf(stderr, "no cuBLASLt algorithm for n=%d N=%d K=%d\n", n, N, K);
        exit(1);
    }
    q.algo = res.algo;
    cublasLtMatmulPreferenceDestroy(p);
    return q;
}
static void plan_free(plan *q) {
    cublasLtMatrixLayoutDestroy(q->la);
    cublasLtMatrixLayoutDestroy(q->lb);
    cublasLtMatrixLayoutDestroy(q->lc);
    cublasLtMatmulDescDestroy(q->d);
}

/* cuBLASLt per expert, as kernels/gemm_cublaslt.cu: with `plans` (one per expert, made
 * beforehand) as a cache hit, without (NULL) as a miss: a plan made and freed for each call,
 * which is what the backend does when an expert's row count changed since the last step. */
static void per_expert(cublasLtHandle_t lt, void *ws, size_t wsb, bf16 *y, const bf16 *x,
                       const bf16 *w, const std::vector<int> &off, int N, int K, plan *plans) {
    for (size_t e = 0; e + 1 < off.size(); e++) {
        int n = off[e + 1] - off[e];
        if (n <= 0) continue;
        plan q = plans ? plans[e] : plan_make(lt, wsb, n, N, K);
        float one = 1.0f, zero = 0.0f;
        CB(cublasLtMatmul(lt, q.d, &one, w + (size_t)e * N * K, q.la, x + (size_t)off[e] * K, q.lb,
                          &zero, y + (size_t)off[e] * N, q.lc, y + (size_t)off[e] * N, q.lc, &q.algo,
                          ws, wsb, 0));
        if (!plans) plan_free(&q);
    }
}

static float bf(bf16 v) {
    return __bfloat162float(v);
}

/* One case: E experts with these row counts, product [n, K] x [N, K]^T. */
static void run(const char *name, const std::vector<int> &counts, int N, int K, cublasLtHandle_t lt,
                void *ws, size_t wsb, int sms) {
    int E = (int)counts.size();
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + counts[e];
    int64_t M = off[E];
    bf16 *x, *w, *y0, *y1;
    int32_t *doff;
    CK(cudaMalloc(&x, (size_t)M * K * 2));
    CK(cudaMalloc(&w, (size_t)E * N * K * 2));
    CK(cudaMalloc(&y0, (size_t)M * N * 2));
    CK(cudaMalloc(&y1, (size_t)M * N * 2));
    CK(cudaMalloc(&doff, (E + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    pg_fill<<<1024, 256>>>(x, (size_t)M * K, 1);
    pg_fill<<<1024, 256>>>(w, (size_t)E * N * K, 2);
    CK(cudaMemset(y1, 0xff, (size_t)M * N * 2)); /* NaN: every element must be written */
    per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL);
    grouped(y1, x, w, doff, M, E, N, K, sms);
    CK(cudaDeviceSynchronize());
    std::vector<bf16> h0((size_t)M * N), h1((size_t)M * N);
    CK(cudaMemcpy(h0.data(), y0, h0.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), y1, h1.size() * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < h0.size(); i++) {
        double a = bf(h0[i]), b = bf(h1[i]);
        if (b != b) bad++;
        num += (a - b) * (a - b);
        den += a * a;
    }
    double nmse = den > 0 ? num / den : num;
    int ok = bad == 0 && nmse < 1e-4;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double fl = 2.0 * M * N * K;
    float ms_miss = 0, ms_hit = 0, ms_gg = 0;
    const int reps = 10;
    /* as in a training step: the queue is empty when the products are issued (the layer's
     * offsets were just synchronised), so the host's plan building shows in the time */
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) {
        per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL);
        CK(cudaStreamSynchronize(0));
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms_miss, e0, e1));
    std::vector<plan> plans(E);
    auto h0t = std::chrono::steady_clock::now();
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plans[e] = plan_make(lt, wsb, counts[e], N, K);
    double us_plan = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0t)
                         .count();
    int nonempty = 0;
    for (int e = 0; e < E; e++)
        nonempty += counts[e] > 0;
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) {
        per_expert(lt, ws, wsb, y0, x, w, off, N, K, plans.data());
        CK(cudaStreamSynchronize(0));
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms_hit, e0, e1));
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plan_free(&plans[e]);
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) {
        grouped(y1, x, w, doff, M, E, N, K, sms);
        CK(cudaStreamSynchronize(0));
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms_gg, e0, e1));
    ms_miss /= reps;
    ms_hit /= reps;
    ms_gg /= reps;
    printf("%-28s M=%6lld N=%5d K=%5d: check %s (nmse %.2e, %zu unwritten) | cuBLASLt per expert: "
           "plans made per call %.3f ms %4.0f TFLOP/s, cached %.3f ms %4.0f TFLOP/s (%.0f us of host "
           "a plan) | grouped %.3f ms %4.0f TFLOP/s\n",
           name, (long long)M, N, K, ok ? "ok" : "FAILED", nmse, bad, ms_miss, fl / ms_miss / 1e9,
           ms_hit, fl / ms_hit / 1e9, nonempty ? us_plan / nonempty : 0.0, ms_gg,
           ok ? fl / ms_gg / 1e9 : 0.0);
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y0));
    CK(cudaFree(y1));
    CK(cudaFree(doff));
}

int main() {
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    size_t wsb = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const std::vector<int> even(8, 2048);
    const std::vector<int> uneven = {2048, 1900, 2200, 100, 0, 3000, 1500, 5636};
    const std::vector<int> small = {1, 127, 129, 0, 255, 64, 3, 300};
    run("small counts (check only)", small, 4096 + 128, 512, lt, ws, wsb, sms);
    run("w1 forward, even", even, 14336, 4096, lt, ws, wsb, sms);
    run("w1 forward, uneven", uneven, 14336, 4096, lt, ws, wsb, sms);
    run("w2 forward, even", even, 4096, 14336, lt, ws, wsb, sms);
    run("w2 forward, uneven", uneven, 4096, 14336, lt, ws, wsb, sms);
    return 0;
}
