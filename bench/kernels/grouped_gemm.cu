/* grouped_gemm.cu: a playground for issue 12's grouped expert product - one persistent launch
 * over all experts, the experts' row offsets read on the device (no host synchronisation, no
 * plan per row count) - against cuBLASLt called once per expert (kernels/gemm_cublaslt.cu's
 * way, both with a plan made for each call, as when the row counts changed since the last
 * step, and with cached plans), on the mixtral8x7b-2L expert shapes with even and uneven
 * counts; it also prints the host time of one plan (descriptor, layouts, heuristic query).
 *
 * Status: written without a GPU on 2026-12-01; first run on an H200 on 2026-12-02 (07:58 UTC):
 * the check passed on every case (NMSE 0 to 7.9e-11 against cuBLASLt, every element written)
 * at 622-734 TFLOP/s on the 16,384-row products, against 746-828 for cuBLASLt per expert.
 * The B-multicast form (k_grouped<true>, 2-CTA clusters), written afterwards, first ran on
 * 2026-12-02 (15:5x UTC): correct on every case and much slower, 355-418 TFLOP/s against the
 * plain form's 641-737 (not analysed; a likely cause: a stage is refilled only when both CTAs
 * have released it, so the two CTAs run in lockstep at the slower one's pace). Each form checks its own output against
 * cuBLASLt before it prints a rate, and a failed check means the kernel is wrong, not the rate.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include -Ilibcore/src -Ikernels \
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

/* the multicast form: one box of B's half-tile into both CTAs of the cluster (mask 0b11),
 * completing on the barrier at the same offset in each */
__device__ __forceinline__ void gg_tma_mc(uint32_t dst, const CUtensorMap *map, int col, int row,
                                          uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar), "h"((uint16_t)3)
                 : "memory");
}
__device__ __forceinline__ uint32_t gg_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void gg_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
/* arrive on the barrier at shared address bar of CTA `cta` of the cluster */
__device__ __forceinline__ void gg_arrive_at(uint32_t bar, uint32_t cta) {
    uint32_t ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(bar), "r"(cta));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(ra)
                 : "memory");
}

/* Tile t of the list: expert e, first row r0 (global), first column n0; 0 past the end.
 * MC: t numbers pairs of m-tiles (the two CTAs of a cluster, rank `half`, share the B tile);
 * the second tile of an expert's odd last pair starts at or past its end (nothing stored). */
struct gg_tile {
    int e, r0, rend, n0;
};
template <bool MC>
__device__ __forceinline__ int gg_find(const int *pref, const int *off, int E, int t, int half,
                                       gg_tile *tl) {
    if (t >= pref[E]) return 0;
    int e = 0;
    while (pref[e + 1] <= t)
        e++;
    int mt_e = (off[e + 1] - off[e] + GG_BM - 1) / GG_BM;
    if (MC) mt_e = (mt_e + 1) / 2;
    const int local = t - pref[e], mt = local % mt_e;
    tl->e = e;
    tl->r0 = off[e] + (MC ? 2 * mt + half : mt) * GG_BM;
    tl->rend = off[e + 1];
    tl->n0 = (local / mt_e) * GG_BN;
    return 1;
}

/* y [M, N] = x W_e^T per expert (maps: x [M, K], w [E * N, K]: boxes of 256 rows, or of 128
 * under MC); off [E + 1] on the device. MC: clusters of two CTAs on neighbouring m-tiles of
 * the same expert and n-tile; each CTA loads its A tile and one half of the B tile into both
 * (TMA multicast: half the L2 reads of B), so a stage is refilled only after the consumers
 * of both CTAs released it (their arrivals go to both CTAs' empty barriers). */
template <bool MC>
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_grouped(bf16 *__restrict__ y, const __grid_constant__ CUtensorMap mx,
              const __grid_constant__ CUtensorMap mw, const int32_t *__restrict__ off, int E,
              int N, int K) {
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_off[GG_MAXE + 1], s_pref[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + GG_NS * GG_A_BYTES;
    const uint32_t bfull = sB + GG_NS * GG_B_BYTES, bempty = bfull + 8 * GG_NS;
    const int NT = (N + GG_BN - 1) / GG_BN, KB = (K + GG_BK - 1) / GG_BK;
    const int half = MC ? (int)gg_ctarank() : 0;
    const int t0 = MC ? blockIdx.x / 2 : blockIdx.x, dt = MC ? gridDim.x / 2 : gridDim.x;
    if (threadIdx.x == 0) {
        s_pref[0] = 0;
        for (int e = 0; e < E; e++) {
            int mt = (off[e + 1] - off[e] + GG_BM - 1) / GG_BM;
            s_off[e] = off[e];
            s_pref[e + 1] = s_pref[e] + (MC ? (mt + 1) / 2 : mt) * NT;
        }
        s_off[E] = off[E];
        for (int s = 0; s < GG_NS; s++) {
            fa3_bar_init(bfull + 8 * s, 1);
            fa3_bar_init(bempty + 8 * s, MC ? 2 * 8 : 2 * 128); /* MC: a lane per warp, both CTAs */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (MC) gg_cluster_sync(); /* the peer's barriers exist before anything reaches them */
    gg_tile tl;

    if (threadIdx.x >= 256) { /* the producer warp: lane 0 issues every load */
        if (threadIdx.x == 256)
            for (int t = t0, it = 0; gg_find<MC>(s_pref, s_off, E, t, half, &tl); t += dt)
                for (int kb = 0; kb < KB; kb++, it++) {
                    const int s = it % GG_NS;
                    if (it >= GG_NS) fa3_bar_wait(bempty + 8 * s, ((it / GG_NS) - 1) & 1);
                    fa3_bar_expect(bfull + 8 * s, GG_A_BYTES + GG_B_BYTES);
                    gg_tma(sA + s * GG_A_BYTES, &mx, kb * GG_BK, tl.r0, bfull + 8 * s);
                    if (MC)
                        gg_tma_mc(sB + s * GG_B_BYTES + half * (GG_B_BYTES / 2), &mw, kb * GG_BK,
                                  tl.e * N + tl.n0 + half * (GG_BN / 2), bfull + 8 * s);
                    else
                        gg_tma(sB + s * GG_B_BYTES, &mw, kb * GG_BK, tl.e * N + tl.n0,
                               bfull + 8 * s);
                }
        __syncwarp();
        if (MC) gg_cluster_sync(); /* no CTA leaves while its peer may still write into it */
        return;
    }

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    float acc0[16][4], acc1[16][4]; /* columns n0 + [0, 128) and n0 + [128, 256) */
    /* a consumed stage is released in this CTA and, under MC, in the peer (one lane a warp) */
    auto release = [&](int s) {
        if (!MC) {
            fa3_bar_arrive(bempty + 8 * s);
        } else if (lane == 0) {
            fa3_bar_arrive(bempty + 8 * s);
            gg_arrive_at(bempty + 8 * s, half ^ 1);
        }
    };
    for (int t = t0, it = 0; gg_find<MC>(s_pref, s_off, E, t, half, &tl); t += dt) {
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
            if (kb > 0) release((it - 1) % GG_NS);
        }
        gg_wait<0>();
        fa3_hold(acc0);
        fa3_hold(acc1);
        release((it - 1) % GG_NS);
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
    if (MC) gg_cluster_sync();
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

/* One grouped product: the plain kernel, or (mc) the cluster-multicast one on sms & ~1 CTAs. */
static void grouped(bf16 *y, const bf16 *x, const bf16 *w, const int32_t *doff, int64_t M, int E,
                    int N, int K, int sms, bool mc) {
    static const size_t smem = GG_NS * (GG_A_BYTES + GG_B_BYTES) + 1024 + 16 * GG_NS;
    static int once;
    if (!once++) {
        CK(cudaFuncSetAttribute(k_grouped<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem));
        CK(cudaFuncSetAttribute(k_grouped<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem));
    }
    CUtensorMap mx = map2d(x, M, K, GG_BM), mw = map2d(w, (int64_t)E * N, K, mc ? GG_BN / 2 : GG_BN);
    if (!mc) {
        k_grouped<false><<<sms, GG_THREADS, smem>>>(y, mx, mw, doff, E, N, K);
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 2, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)(sms & ~1)), cfg.blockDim = dim3(GG_THREADS);
        cfg.dynamicSmemBytes = smem, cfg.attrs = at, cfg.numAttrs = 1;
        /* persistent: only as many clusters as fit at once (a GPC with an odd number of free
         * SMs holds one CTA fewer), else the last ones would run as a second wave */
        static int clusters;
        if (!clusters) {
            CK(cudaOccupancyMaxActiveClusters(&clusters, k_grouped<true>, &cfg));
            printf("    (multicast kernel: %d clusters of 2 resident at once on %d SMs)\n", clusters,
                   sms);
        }
        cfg.gridDim = dim3((unsigned)(2 * clusters));
        CK(cudaLaunchKernelEx(&cfg, k_grouped<true>, y, mx, mw, doff, E, N, K));
    }
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
    per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL);
    CK(cudaDeviceSynchronize());
    std::vector<bf16> h0((size_t)M * N), h1((size_t)M * N);
    CK(cudaMemcpy(h0.data(), y0, h0.size() * 2, cudaMemcpyDeviceToHost));
    double nmse[2] = {0, 0};
    size_t bad[2] = {0, 0};
    int ok[2];
    for (int mc = 0; mc < 2; mc++) {
        CK(cudaMemset(y1, 0xff, (size_t)M * N * 2)); /* NaN: every element must be written */
        grouped(y1, x, w, doff, M, E, N, K, sms, mc);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h1.data(), y1, h1.size() * 2, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < h0.size(); i++) {
            double a = bf(h0[i]), b = bf(h1[i]);
            if (b != b) bad[mc]++;
            num += (a - b) * (a - b);
            den += a * a;
        }
        nmse[mc] = den > 0 ? num / den : num;
        ok[mc] = bad[mc] == 0 && nmse[mc] < 1e-4;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double fl = 2.0 * M * N * K;
    float ms_miss = 0, ms_hit = 0, ms_gg[2] = {0, 0};
    const int reps = 10;
    /* as in a training step: the queue is empty when the products are issued (the layer's
     * offsets were just synchronised), so the host's plan building shows in the time */
    /* ms per call of f, each call waited for (the queue empty before the next) */
    auto time_ms = [&](auto f) {
        float ms = 0;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) {
            f();
            CK(cudaStreamSynchronize(0));
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms / reps;
    };
    ms_miss = time_ms([&] { per_expert(lt, ws, wsb, y0, x, w, off, N, K, NULL); });
    std::vector<plan> plans(E);
    auto h0t = std::chrono::steady_clock::now();
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plans[e] = plan_make(lt, wsb, counts[e], N, K);
    double us_plan = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0t)
                         .count();
    int nonempty = 0;
    for (int e = 0; e < E; e++)
        nonempty += counts[e] > 0;
    ms_hit = time_ms([&] { per_expert(lt, ws, wsb, y0, x, w, off, N, K, plans.data()); });
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) plan_free(&plans[e]);
    for (int mc = 0; mc < 2; mc++)
        ms_gg[mc] = time_ms([&] { grouped(y1, x, w, doff, M, E, N, K, sms, mc); });
    printf("%-28s M=%6lld N=%5d K=%5d | cuBLASLt per expert: plans made per call %.3f ms %4.0f "
           "TFLOP/s, cached %.3f ms %4.0f TFLOP/s (%.0f us of host a plan)\n",
           name, (long long)M, N, K, ms_miss, fl / ms_miss / 1e9, ms_hit, fl / ms_hit / 1e9,
           nonempty ? us_plan / nonempty : 0.0);
    for (int mc = 0; mc < 2; mc++)
        printf("    grouped%s: check %s (nmse %.2e, %zu unwritten) %.3f ms %4.0f TFLOP/s\n",
               mc ? ", B multicast over 2-CTA clusters" : "", ok[mc] ? "ok" : "FAILED", nmse[mc],
               bad[mc], ms_gg[mc], ok[mc] ? fl / ms_gg[mc] / 1e9 : 0.0);
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
    /* The plans above were timed on row counts cuBLASLt had seen (its own heuristic cache
     * answered). A training step meets new counts: the host time of a plan for 64 counts
     * never queried before, the first time and again. */
    for (int pass = 0; pass < 2; pass++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int n = 3001; n < 3065; n++) {
            plan q = plan_make(lt, wsb, n, 14336, 4096);
            plan_free(&q);
        }
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count();
        printf("plan for a %s row count (w1 forward shape): %.1f us of host each\n",
               pass ? "repeated" : "new", us / 64);
    }
    return 0;
}
