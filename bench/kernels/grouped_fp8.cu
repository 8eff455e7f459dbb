/* grouped_fp8.cu: the playground of issue 14's grouped block-scaled fp8 expert product, whose
 * kernel (the product, the operands' layouts and the design are described there) is
 * kernels/sm90/grouped_fp8.cuh since 2026-12-04 and runs the fp8-block experts' forward and
 * dgrad in the backend: here it is checked and timed against cuBLASLt's block-scaled fp8
 * called once per expert as kernels/gemm_cublaslt.cu's fp8_group_product does (16-row tails
 * included), on the mixtral8x7b expert shapes (H 4096, F 14336, 8 experts, 16,384 rows) with
 * even and uneven counts, in both tile widths. Goal (issue 14): >= 1,100 TFLOP/s.
 *
 * Status: written without a GPU on 2026-12-04; its first run on an H200 (21:03 UTC) was an
 * illegal instruction (a TMA box of the scales starting off 16 bytes), the second (21:14 UTC)
 * passed every check, bit-identical to cuBLASLt, at 998-1,223 TFLOP/s
 * (docs/performance-gpu.md). Compiled for sm_90a (nvcc 13.0), no spills, no serialised wgmma
 * (C7510-C7520): ptxas reports 168 registers for both forms (the launch's share at 384
 * threads); the consumers run under setmaxnreg's 232, of which they need 149 (NH 1) and 223
 * (NH 2) (the same code built unbounded at 256 threads).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include \
 *       -Ilibcore/src -Ikernels bench/kernels/grouped_fp8.cu -lcublasLt -o /tmp/grouped_fp8
 *   timeout 120 /tmp/grouped_fp8
 *
 * (-Xptxas -v prints the registers and spills. Output is line-buffered: a kernel that hangs,
 * which the timeout ends, leaves every line before it; a form's line comes after its check, so
 * a hang in NH 1 leaves the case's cuBLASLt line last, one in NH 2 the NH 1 line.)
 *
 * Two tile widths, each built and timed, trading registers against the operand stream:
 *   NH 1: 128 x 128, 6 stages of 32.6 KB; acc 64 + p 64 registers. Operands 7.8 bytes a
 *         kFLOP: 9.8 TB/s from L2 into shared memory at 1,250 TFLOP/s.
 *   NH 2: 128 x 256, 4 stages of 48.6 KB; acc 128 + p 64 registers. 5.9 bytes a kFLOP: 7.3
 *         TB/s at 1,250 TFLOP/s.
 * The bf16 cooperative form streamed 8.2-8.6 TB/s (128 x 256 bf16 tiles, 11.7 bytes a kFLOP, at
 * 700-737 TFLOP/s): if that is the ceiling, NH 1 stops near 1,100 and NH 2 does not.
 *
 * Checks, each form, before its time (a failed check prints FAILED and no rate):
 *   (a) against a host double-precision product of the dequantized operands on sampled rows
 *       (each expert's first, 128th, 129th and last rows and two others; all N columns), the
 *       worst expert's NMSE <= 1e-5. The bf16 rounding of Y alone gives 2-3e-6 (up to half an
 *       ulp, 2^-8 relative); the fp8 products are exact and the sums add far less. A host
 *       emulation of this kernel's arithmetic and scale indexing (the tiny and small cases,
 *       every row, NH 1 and 2) gave 1.0-3.8e-6 per expert; with the neighbour row's x scale,
 *       the next kb's w scale, or the first 128 columns' w scale for both halves it gave 3e2,
 *       1.8 and 6.4 (the test data's scales differ by powers of two between neighbouring rows,
 *       blocks and tiles, and one value in 512 is a 48x outlier);
 *   (b) against cuBLASLt per expert over every element, worst expert NMSE <= 1e-5 (both round
 *       the same fp32 sums to bf16: they differ where the sums' order moves a rounding), when
 *       cuBLASLt itself passes (a);
 *   (c) every element written (Y starts as NaN).
 * The cases: tiny (fewer tiles than SMs, an expert without rows), small (odd counts, N = 384:
 * a half-empty 256-wide tile, K = 400: a 16-column last K block), then w1 (N 14336, K 4096)
 * and w2 (N 4096, K 14336), each with even counts (8 x 2048) and uneven odd ones with an empty
 * expert. Times: CUDA events around each of 15 calls issued back to back after 3 warm-ups,
 * the median, beside cuBLASLt per expert (the backend's way: each expert's whole 16-row groups
 * in one product, its last n % 16 rows as a 16-row product into scratch, copied into place)
 * and cuBLASLt's dense rate on the same flops (all rows times expert 0's weight) in the same
 * run.
 *
 * Prediction (2026-12-04, not measured). The roof: cuBLASLt's dense block-scaled fp8 ran
 * 1,356-1,360 TFLOP/s on this H200 (69% of the 1,979 peak), DeepGEMM reports 1,297 for its
 * grouped form on an H800 (the same tensor cores). NH 2: the mainloop at about 1,300 (the
 * promotion hidden under the other warpgroup's batch, as DeepGEMM's), less the epilogue's
 * exposed part (~0.3 us of a 27-us tile at K = 4,096, 1-2%; <0.5% at K = 14,336) and the last
 * wave (w1 7,168 tiles = 54.3 waves: 1.3%; w2 2,048 = 15.5 waves: 3%):
 *   w1 even ~1,250, w2 even ~1,250; uneven 2-3% lower (131 m-tiles, 16,768 rows, for 16,384
 *   rows): ~1,220. NH 1 (w1 14,336 tiles = 108.6 waves, w2 4,096 = 31.03: 3% lost): ~1,100
 *   if the operand stream binds at the bf16 form's 8.6 TB/s, else within 3% of NH 2.
 *   cuBLASLt per expert: even ~1,200 (eight 2,048-row products near the dense rate, each with
 *   its own ramp and tail wave); uneven ~1,050-1,100: the seven 16-row tail products each read
 *   the expert's whole weight (58.7 MB, ~20 us) for 16 rows, +0.1 ms on 1.6 ms.
 * So: NH 2 meets the 1,100 goal on all four products (w1/w2, even/uneven), ~5% above cuBLASLt
 * per expert on even counts and ~15% on uneven ones, ~8% under cuBLASLt's dense rate. The
 * risk in that: if the bf16 form's 641 at K = 4,096 against 727 at K = 14,336 was a fixed
 * cost a tile (~9 us, not understood) and not the operand stream, the same cost on NH 2's
 * 27-us tiles would take w1 to ~950.
 *
 * What the GPU run must check first: (1) the tiny and small checks: a NMSE near 1 on every
 * expert points at the e4m3 descriptors, the swizzle or the boxes of Xq and Wq (the bf16
 * numbers, for rows of 128 bytes), 1e-3 to 1e3 at a scale path (sx's map and its stride lds,
 * the row of a thread, sw's kb & 3 and the second half's rb), unwritten elements at the tile
 * list or the store (shared with the bf16 form that ran); cuBLASLt failing against the host
 * points at this harness's scale gather for it, not at the kernel; (2) a hang: the expect_tx
 * count (16,384 + 16,384 NH + 528 + 16 NH: a box counts whole, its out-of-bounds part
 * included) or the setmaxnreg split; (3) the rates: NH 2 against 1,100 and the dense
 * cuBLASLt line; NH 1 close to NH 2 means the operand stream does not bind; NH 2 well below
 * NH 1 points at the consumers' 223 registers or the promotion's overlap, which an ncu of the
 * tensor pipe's active cycles against the warps' wgmma waits tells apart. */
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_fp8.h>

#include "grouped_common.cuh"

#include "sm90/grouped_fp8.cuh"

#define GF_FORMS 2 /* NH 1 and 2 */

/* ---- test data and the device-side pieces of the checks ---- */

/* A test value of (seed, i) in [-1, 1); one in 512 is an outlier 48 times larger, whose
 * block's scale follows it (its neighbours then keep fewer bits, as in training) */
__device__ __forceinline__ float gf_val(uint64_t seed, uint64_t i) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    return (z & 511) == 0 ? 48.0f * u : u;
}
/* The activations x [M, K] and weights w [E, N, K]: the test values times a power of two that
 * changes from block to block, row to row and tile to tile (2^-4 .. 2^4), so that a scale
 * taken from the wrong place shows. */
__device__ __forceinline__ float gf_x(int64_t r, int k, int K) {
    return ldexpf(gf_val(1, (uint64_t)r * K + k), (int)((r * 7 + (k / 128) * 3) % 9) - 4);
}
__device__ __forceinline__ float gf_w(int e, int n, int k, int N, int K) {
    return ldexpf(gf_val(2, ((uint64_t)e * N + n) * K + k),
                  (e + 5 * (n / 128) + 3 * (k / 128)) % 7 - 3);
}

__device__ __forceinline__ float gf_scale(float amax) {
    return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
}
__device__ __forceinline__ uint8_t gf_e4m3(float v, float scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

/* xq [M, K] e4m3 and sx [KB, lds] of gf_x in 1 x 128 blocks, one warp a block (r, kb): the
 * production's k_fp8_rows (kernels/quant_fp8.cu) with R = M, ls = lds */
__global__ void gf_quant_x(uint8_t *__restrict__ xq /* [M, K] */,
                           float *__restrict__ sx /* [KB, lds] */, int64_t M, int K, int64_t lds) {
    const int KB = (K + 127) / 128, lane = threadIdx.x & 31;
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (blk >= M * KB) return;
    const int64_t r = blk / KB;
    const int kb = (int)(blk % KB), k0 = kb * 128 + lane * 4;
    float v[4], amax = 0.0f;
    for (int t = 0; t < 4; t++) {
        v[t] = k0 + t < K ? gf_x(r, k0 + t, K) : 0.0f;
        amax = fmaxf(amax, fabsf(v[t]));
    }
    for (int o = 16; o > 0; o /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = gf_scale(amax);
    for (int t = 0; t < 4; t++)
        if (k0 + t < K) xq[r * K + k0 + t] = gf_e4m3(v[t], sc);
    if (lane == 0) sx[kb * lds + r] = sc;
}

/* wq [E, N, K] e4m3 and sw [E, RB * KB4] of gf_w in 128 x 128 tiles, one block of 256 a tile
 * (blockIdx: kb, rb, e); sw's padding (kb >= KB) is left as it is (zeros: memset) */
__global__ void __launch_bounds__(256)
    gf_quant_w(uint8_t *__restrict__ wq /* [E, N, K] */, float *__restrict__ sw /* [E, RB * KB4] */,
               int N, int K) {
    __shared__ float red[8];
    const int kb = blockIdx.x, rb = blockIdx.y, e = blockIdx.z, KB4 = (gridDim.x + 3) / 4 * 4;
    float amax = 0.0f;
    for (int j = threadIdx.x; j < 128 * 128; j += 256) {
        const int n = rb * 128 + j / 128, k = kb * 128 + j % 128;
        if (n < N && k < K) amax = fmaxf(amax, fabsf(gf_w(e, n, k, N, K)));
    }
    for (int o = 16; o > 0; o /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < 8; i++)
        amax = fmaxf(amax, red[i]);
    const float sc = gf_scale(amax);
    if (threadIdx.x == 0) sw[((int64_t)e * gridDim.y + rb) * KB4 + kb] = sc;
    for (int j = threadIdx.x; j < 128 * 128; j += 256) {
        const int n = rb * 128 + j / 128, k = kb * 128 + j % 128;
        if (n < N && k < K) wq[((int64_t)e * N + n) * K + k] = gf_e4m3(gf_w(e, n, k, N, K), sc);
    }
}

/* cuBLASLt's x scales for one product over `rows` rows from row0: dst [KB, rows] from sx
 * [KB, lds]; rows from M on (a tail product's rows past the last expert, whose results are
 * dropped) get 1 */
__global__ void gf_gather(float *__restrict__ dst /* [KB, rows] */,
                          const float *__restrict__ sx /* [KB, lds] */, int64_t lds, int64_t M,
                          int64_t row0, int rows, int KB) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < KB * rows;
         i += gridDim.x * blockDim.x) {
        const int kb = i / rows, r = i % rows;
        dst[i] = row0 + r < M ? sx[kb * lds + row0 + r] : 1.0f;
    }
}

/* Per expert over its rows of y [M, N] against y0 [M, N]: acc [E, 2] += (sum of (y - y0)^2,
 * sum of y0^2) over the elements where both are finite; unw [2] += the elements of y (the
 * kernel's: unwritten, it starts as NaN) and of y0 (cuBLASLt's) that are not. One block of 256
 * a row. */
__global__ void __launch_bounds__(256)
    gf_compare(const bf16 *__restrict__ y /* [M, N] */, const bf16 *__restrict__ y0 /* [M, N] */,
               const int32_t *__restrict__ off /* [E + 1] */, int E, int N,
               double *__restrict__ acc /* [E, 2] */,
               unsigned long long *__restrict__ unw /* [2] */) {
    __shared__ double sd[256], sr[256];
    __shared__ unsigned sn[256], sn0[256];
    const int64_t r = blockIdx.x;
    double d = 0.0, ref = 0.0;
    unsigned n1 = 0, n0 = 0;
    for (int c = threadIdx.x; c < N; c += 256) {
        const float a = __bfloat162float(y[r * N + c]), b = __bfloat162float(y0[r * N + c]);
        n1 += !isfinite(a);
        n0 += !isfinite(b);
        if (isfinite(a) && isfinite(b)) {
            d += ((double)a - b) * ((double)a - b);
            ref += (double)b * b;
        }
    }
    sd[threadIdx.x] = d, sr[threadIdx.x] = ref, sn[threadIdx.x] = n1, sn0[threadIdx.x] = n0;
    __syncthreads();
    for (int h = 128; h > 0; h /= 2) {
        if (threadIdx.x < h) {
            sd[threadIdx.x] += sd[threadIdx.x + h];
            sr[threadIdx.x] += sr[threadIdx.x + h];
            sn[threadIdx.x] += sn[threadIdx.x + h];
            sn0[threadIdx.x] += sn0[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    int e = 0;
    while (e + 1 < E && off[e + 1] <= r)
        e++;
    atomicAdd(&acc[2 * e], sd[0]);
    atomicAdd(&acc[2 * e + 1], sr[0]);
    atomicAdd(&unw[0], (unsigned long long)sn[0]);
    atomicAdd(&unw[1], (unsigned long long)sn0[0]);
}

/* ---- host ---- */

static double e4m3_value(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

/* The cuBLASLt plan of y_e [rows, N] (ct: bf16 or fp32) = x_e [rows, K] w_e [N, K]^T (e4m3,
 * rows ld bytes apart), as kernels/gemm_plan.cu's moe_gemm_fp8 builds it: the column-major
 * view y^T = w_e x_e^T, cuBLASLt's A is w_e (transposed; scales swe in mode wm: BLK128x128_32F
 * [RB * KB4] for a weight, VEC128_32F [KB, N] for the wgrad's x^T) and its B is x_e
 * (VEC128_32F scales sxe [KB, rows]); the scale pointers set before the heuristic query (it
 * refuses block scaling without them); the pointers' alignments as minimum-alignment
 * preferences. 0 when cuBLASLt refuses (the plan is then unusable: this harness's check (b)
 * and cuBLASLt's time are skipped). */
#define LT_TILES CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
struct lt_plan {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
#define LT(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            printf("    cuBLASLt: %s -> %d (rows %d N %d K %d)\n", #x, (int)s_, rows, N, K);       \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)
static int lt_make(cublasLtHandle_t lt, size_t wsb, int rows, int N, int K, int64_t ld,
                   cublasLtMatmulMatrixScale_t wm, cudaDataType ct,
                   const uint8_t *x /* [rows, ld] */, const float *sxe /* [KB, rows] */,
                   const uint8_t *w /* [N, ld] */, const float *swe, const void *y /* [rows, N] */,
                   lt_plan *q) {
    memset(q, 0, sizeof *q);
    LT(cublasLtMatmulDescCreate(&q->d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtMatmulMatrixScale_t ma = wm, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &swe,
                                      sizeof swe));
    LT(cublasLtMatmulDescSetAttribute(q->d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxe,
                                      sizeof sxe));
    LT(cublasLtMatrixLayoutCreate(&q->la, CUDA_R_8F_E4M3, K, N, ld));
    LT(cublasLtMatrixLayoutCreate(&q->lb, CUDA_R_8F_E4M3, K, rows, ld));
    LT(cublasLtMatrixLayoutCreate(&q->lc, ct, N, rows, N));
    cublasLtMatmulPreference_t p;
    LT(cublasLtMatmulPreferenceCreate(&p));
    const uint32_t al[4] = {(uint32_t)pg_align_of(w), (uint32_t)pg_align_of(x),
                            (uint32_t)pg_align_of(y), (uint32_t)pg_align_of(y)};
    const cublasLtMatmulPreferenceAttributes_t at[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    LT(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    for (int i = 0; i < 4; i++)
        LT(cublasLtMatmulPreferenceSetAttribute(p, at[i], &al[i], sizeof al[i]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, q->d, q->la, q->lb, q->lc, q->lc, p, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(p);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
        printf("    cuBLASLt: no block-scaled fp8 algorithm (status %d, rows %d N %d K %d)\n",
               (int)st, rows, N, K);
        return 0;
    }
    q->algo = res.algo;
    return 1;
}
static void lt_free(lt_plan *q) {
    if (q->la) cublasLtMatrixLayoutDestroy(q->la);
    if (q->lb) cublasLtMatrixLayoutDestroy(q->lb);
    if (q->lc) cublasLtMatrixLayoutDestroy(q->lc);
    if (q->d) cublasLtMatmulDescDestroy(q->d);
}
static void lt_run(cublasLtHandle_t lt, void *ws, size_t wsb, const lt_plan &q,
                   const uint8_t *x /* [rows, ld] */, const uint8_t *w /* [N, ld] */,
                   void *y /* [rows, N] */, float beta = 0.0f) {
    const float one = 1.0f;
    CB(cublasLtMatmul(lt, q.d, &one, w, q.la, x, q.lb, &beta, y, q.lc, y, q.lc, &q.algo, ws, wsb,
                      0));
}

/* cuBLASLt per expert, the backend's fp8_group_product: expert e's first body[e] rows (whole
 * 16-row groups) in one product (plans[2e]), its last n % 16 as a 16-row product (plans[2e +
 * 1], reading the next rows or xq's slack) into scratch yt [16, N], copied into place */
struct lt_experts {
    std::vector<lt_plan> plans; /* [E, 2] */
    std::vector<int> body;      /* [E] */
    bool ok;
};
static void lt_grouped(cublasLtHandle_t lt, void *ws, size_t wsb, const lt_experts &L,
                       const std::vector<int> &off, int N, int K, const uint8_t *xq /* [M, K] */,
                       const uint8_t *wq /* [E, N, K] */, bf16 *y /* [M, N] */,
                       bf16 *yt /* [16, N] */) {
    for (size_t e = 0; e + 1 < off.size(); e++) {
        const int r0 = off[e], n = off[e + 1] - r0, body = L.body[e];
        const uint8_t *w = wq + e * (size_t)N * K;
        if (body > 0)
            lt_run(lt, ws, wsb, L.plans[2 * e], xq + (size_t)r0 * K, w, y + (size_t)r0 * N);
        if (n == body) continue;
        lt_run(lt, ws, wsb, L.plans[2 * e + 1], xq + (size_t)(r0 + body) * K, w, yt);
        CK(cudaMemcpyAsync(y + (size_t)(r0 + body) * N, yt, (size_t)(n - body) * N * sizeof(bf16),
                           cudaMemcpyDeviceToDevice));
    }
}

/* The grouped kernel of form f (tile width 128 (f + 1)), one persistent block a SM. */
static void grouped_fp8(int f, bf16 *y /* [M, N] */, const CUtensorMap &mx, const CUtensorMap *mw,
                        const CUtensorMap &ms, const float *sw /* [E, RB * KB4] */,
                        const gg_offsets &off, int E, int N, int K, int sms) {
    static int once;
    if (!once++) {
        CK(cudaFuncSetAttribute(k_grouped_fp8<1, bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                GF_SMEM(1)));
        CK(cudaFuncSetAttribute(k_grouped_fp8<2, bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                GF_SMEM(2)));
    }
    const gf_source src = {mx, mw[f], ms, sw}; /* one product: nsrc 1 */
    if (f == 0)
        k_grouped_fp8<1, bf16><<<sms, GF_THREADS, GF_SMEM(1)>>>(y, src, src, off, E, N, K, 0, 1);
    else
        k_grouped_fp8<2, bf16><<<sms, GF_THREADS, GF_SMEM(2)>>>(y, src, src, off, E, N, K, 0, 1);
    CK(cudaGetLastError());
}

/* The median ms of 15 calls of f issued back to back (the device's time, the queue kept full),
 * after 3 warm-up calls */
template <typename F> static float median_ms(F f) {
    const int reps = 15;
    cudaEvent_t ev[reps + 1];
    for (int i = 0; i <= reps; i++)
        CK(cudaEventCreate(&ev[i]));
    for (int i = 0; i < 3; i++)
        f();
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(ev[i]));
        f();
    }
    CK(cudaEventRecord(ev[reps]));
    CK(cudaEventSynchronize(ev[reps]));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++)
        CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
    for (int i = 0; i <= reps; i++)
        CK(cudaEventDestroy(ev[i]));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

/* The host's reference rows: ref [rows.size(), N] = the double-precision product of the
 * dequantized rows rows[i] (of expert ex[i]) of xq with every row of wq_e: xr [rows.size(),
 * K] those rows' bytes, sx [KB, lds], wq [E, N, K], sw [E, RB * KB4]; one thread a row. */
static void host_reference(const std::vector<int> &rows, const std::vector<int> &ex,
                           const std::vector<uint8_t> &xr, const std::vector<float> &sx,
                           int64_t lds, const std::vector<uint8_t> &wq,
                           const std::vector<float> &sw, int N, int K, std::vector<double> &ref) {
    const int KB = (K + 127) / 128, RB = (N + 127) / 128, KB4 = (KB + 3) / 4 * 4;
    double lut[256];
    for (int b = 0; b < 256; b++)
        lut[b] = e4m3_value((uint8_t)b);
    ref.assign(rows.size() * N, 0.0);
    auto one = [&](size_t i) {
        std::vector<double> x(K);
        for (int k = 0; k < K; k++)
            x[k] = lut[xr[i * K + k]];
        const int e = ex[i];
        for (int n = 0; n < N; n++) {
            const uint8_t *w = &wq[((size_t)e * N + n) * K];
            double tot = 0.0;
            for (int kb = 0; kb < KB; kb++) {
                double part = 0.0;
                for (int k = kb * 128; k < std::min(K, kb * 128 + 128); k++)
                    part += x[k] * lut[w[k]];
                tot += part * sx[kb * lds + rows[i]] * sw[((size_t)e * RB + n / 128) * KB4 + kb];
            }
            ref[i * N + n] = tot;
        }
    };
    const unsigned nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back([&, t] {
            for (size_t i = t; i < rows.size(); i += nt)
                one(i);
        });
    for (auto &x : th)
        x.join();
}

/* The worst expert's NMSE of the sampled rows of y (hy [rows.size(), N]) against ref; a NaN
 * (an unwritten element) makes it NaN */
static double worst_nmse(const std::vector<bf16> &hy, const std::vector<double> &ref,
                         const std::vector<int> &ex, int E, int N) {
    std::vector<double> num(E, 0.0), den(E, 0.0);
    for (size_t i = 0; i < ex.size(); i++)
        for (int n = 0; n < N; n++) {
            const double a = __bfloat162float(hy[i * N + n]), b = ref[i * N + n];
            num[ex[i]] += (a - b) * (a - b);
            den[ex[i]] += b * b;
        }
    double worst = 0.0;
    for (int e = 0; e < E; e++) {
        const double v = den[e] > 0 ? num[e] / den[e] : num[e];
        if (!(v <= worst)) worst = v; /* a NaN sticks */
    }
    return worst;
}

/* copies the rows `rows` of y [M, N] into h [rows.size(), N] */
static void fetch_rows(std::vector<bf16> &h, const bf16 *y, const std::vector<int> &rows, int N) {
    h.resize(rows.size() * N);
    for (size_t i = 0; i < rows.size(); i++)
        CK(cudaMemcpy(&h[i * N], y + (size_t)rows[i] * N, N * sizeof(bf16),
                      cudaMemcpyDeviceToHost));
}

static const double GF_TOL = 1e-5; /* NMSE bound of checks (a) and (b): see the header */

/* One case: E experts with these row counts, y [M, N] = x [M, K] w_e^T. The operands, the
 * host's reference rows, cuBLASLt per expert (checked against them), then each form: its
 * checks, and its time if they passed; then cuBLASLt's times (per expert, and dense on all
 * rows when M % 16 == 0). */
static void run(const char *name, const std::vector<int> &counts, int N, int K, cublasLtHandle_t lt,
                void *ws, size_t wsb, int sms) {
    const int E = (int)counts.size();
    if (E > GG_MAXE) {
        printf("%s: %d experts, the tile list holds %d\n", name, E, GG_MAXE);
        exit(1);
    }
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + counts[e];
    const int64_t M = off[E], lds = (M + 3) / 4 * 4;
    const int KB = (K + 127) / 128, RB = (N + 127) / 128, KB4 = (KB + 3) / 4 * 4;
    const size_t nsw = (size_t)E * RB * KB4;
    printf("%s: M=%lld N=%d K=%d, counts", name, (long long)M, N, K);
    for (int e = 0; e < E; e++)
        printf(" %d", counts[e]);
    printf("\n");

    uint8_t *xq, *wq;
    float *sx, *sw;
    bf16 *y0, *y1, *yt;
    int32_t *doff;
    double *dacc;
    unsigned long long *dnan;
    /* xq holds 16 rows of slack: a tail product of the last expert reads them (zeros) */
    CK(cudaMalloc(&xq, (size_t)(M + 16) * K));
    CK(cudaMemset(xq, 0, (size_t)(M + 16) * K));
    CK(cudaMalloc(&wq, (size_t)E * N * K));
    CK(cudaMalloc(&sx, (size_t)KB * lds * sizeof(float)));
    CK(cudaMemset(sx, 0, (size_t)KB * lds * sizeof(float)));
    CK(cudaMalloc(&sw, nsw * sizeof(float)));
    CK(cudaMemset(sw, 0, nsw * sizeof(float)));
    CK(cudaMalloc(&y0, (size_t)M * N * sizeof(bf16)));
    CK(cudaMalloc(&y1, (size_t)M * N * sizeof(bf16)));
    CK(cudaMalloc(&yt, (size_t)16 * N * sizeof(bf16)));
    CK(cudaMalloc(&doff, (E + 1) * sizeof(int32_t)));
    CK(cudaMalloc(&dacc, 2 * E * sizeof(double)));
    CK(cudaMalloc(&dnan, 2 * sizeof(unsigned long long)));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    gg_offsets goff; /* the kernel's: by value */
    std::copy(off.begin(), off.end(), goff.o);
    gf_quant_x<<<(unsigned)((M * KB * 32 + 255) / 256), 256>>>(xq, sx, M, K, lds);
    gf_quant_w<<<dim3(KB, RB, E), 256>>>(wq, sw, N, K);
    CK(cudaGetLastError());

    /* the maps: xq [M, K] and wq [E * N, K] e4m3 (boxes of 128 bytes of K by 128 or 256 rows,
     * the 128-byte swizzle), sx [KB, lds] fp32 (M of each row mapped: rows past M read as 0) */
    const int64_t dx[2] = {K, M}, sxq[1] = {K}, dw[2] = {K, (int64_t)E * N};
    const int64_t dsx[2] = {M, KB}, ssx[1] = {lds * (int64_t)sizeof(float)};
    const CUtensorMap mx = gg_map(xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dx, sxq, GF_BK, GF_BM,
                                  CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap mw[GF_FORMS] = {gg_map(wq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dw, sxq, GF_BK,
                                             GF_BN(1), CU_TENSOR_MAP_SWIZZLE_128B),
                                      gg_map(wq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dw, sxq, GF_BK,
                                             GF_BN(2), CU_TENSOR_MAP_SWIZZLE_128B)};
    const CUtensorMap ms = gg_map(sx, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dsx, ssx, GF_SX_BOX, 1,
                                  CU_TENSOR_MAP_SWIZZLE_NONE);

    /* cuBLASLt's x scales: [KB, body] and [KB, 16] per expert, each on 128 bytes */
    std::vector<size_t> so(2 * E + 1, 0);
    lt_experts L;
    L.plans.assign(2 * E, lt_plan());
    L.body.assign(E, 0);
    for (int e = 0; e < E; e++) {
        L.body[e] = counts[e] - counts[e] % 16;
        so[2 * e + 1] = so[2 * e] + ((size_t)KB * L.body[e] + 31) / 32 * 32;
        so[2 * e + 2] =
            so[2 * e + 1] + (counts[e] > L.body[e] ? ((size_t)KB * 16 + 31) / 32 * 32 : 0);
    }
    float *sxl;
    CK(cudaMalloc(&sxl, std::max<size_t>(so[2 * E], 1) * sizeof(float)));
    L.ok = true;
    for (int e = 0; e < E && L.ok; e++) {
        const int r0 = off[e], body = L.body[e];
        const uint8_t *w = wq + (size_t)e * N * K;
        const float *swe = sw + (size_t)e * RB * KB4;
        if (body > 0) {
            gf_gather<<<256, 256>>>(sxl + so[2 * e], sx, lds, M, r0, body, KB);
            L.ok = lt_make(lt, wsb, body, N, K, K, LT_TILES, CUDA_R_16BF, xq + (size_t)r0 * K,
                           sxl + so[2 * e], w, swe, y0 + (size_t)r0 * N, &L.plans[2 * e]);
        }
        if (L.ok && counts[e] > body) {
            gf_gather<<<256, 256>>>(sxl + so[2 * e + 1], sx, lds, M, r0 + body, 16, KB);
            L.ok =
                lt_make(lt, wsb, 16, N, K, K, LT_TILES, CUDA_R_16BF, xq + (size_t)(r0 + body) * K,
                        sxl + so[2 * e + 1], w, swe, yt, &L.plans[2 * e + 1]);
        }
    }
    CK(cudaGetLastError());
    CK(cudaMemset(y0, 0xff, (size_t)M * N * sizeof(bf16))); /* NaN: cuBLASLt must write all */
    if (L.ok) lt_grouped(lt, ws, wsb, L, off, N, K, xq, wq, y0, yt);
    CK(cudaDeviceSynchronize());

    /* the sampled rows: each expert's first, 128th, 129th and last rows and two others */
    std::vector<int> rows, ex;
    unsigned lcg = 12345u;
    for (int e = 0; e < E; e++) {
        const int n = counts[e];
        if (n == 0) continue;
        lcg = lcg * 1664525u + 1013904223u;
        const int last = n - 1, r1 = (int)(lcg % n), r2 = (int)((lcg >> 16) % n);
        const int cand[6] = {0, std::min(127, last), std::min(128, last), last, r1, r2};
        for (int c = 0; c < 6; c++) {
            rows.push_back(off[e] + cand[c]);
            ex.push_back(e);
        }
    }
    std::vector<uint8_t> hxr(rows.size() * K), hwq((size_t)E * N * K);
    std::vector<float> hsx((size_t)KB * lds), hsw(nsw);
    for (size_t i = 0; i < rows.size(); i++)
        CK(cudaMemcpy(&hxr[i * K], xq + (size_t)rows[i] * K, K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hwq.data(), wq, hwq.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hsx.data(), sx, hsx.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hsw.data(), sw, hsw.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> ref;
    host_reference(rows, ex, hxr, hsx, lds, hwq, hsw, N, K, ref);
    std::vector<bf16> hy;
    bool lt_good = false;
    if (L.ok) {
        fetch_rows(hy, y0, rows, N);
        const double nm = worst_nmse(hy, ref, ex, E, N);
        lt_good = nm <= GF_TOL;
        printf("    cuBLASLt per expert against the host (%zu sampled rows): worst expert nmse "
               "%.2e%s\n",
               rows.size(), nm, lt_good ? "" : " - cuBLASLt FAILED, check (b) skipped");
    }

    const double fl = 2.0 * M * N * K;
    for (int f = 0; f < GF_FORMS; f++) {
        char form[64];
        snprintf(form, sizeof form, "grouped fp8, 128 x %d tiles, %d stages", GF_BN(f + 1),
                 GF_NS(f + 1));
        CK(cudaMemset(y1, 0xff, (size_t)M * N * sizeof(bf16))); /* NaN: all must be written */
        grouped_fp8(f, y1, mx, mw, ms, sw, goff, E, N, K, sms);
        CK(cudaDeviceSynchronize());
        fetch_rows(hy, y1, rows, N);
        const double na = worst_nmse(hy, ref, ex, E, N);
        CK(cudaMemset(dacc, 0, 2 * E * sizeof(double)));
        CK(cudaMemset(dnan, 0, 2 * sizeof(unsigned long long)));
        gf_compare<<<(unsigned)M, 256>>>(y1, y0, doff, E, N, dacc, dnan);
        CK(cudaGetLastError());
        std::vector<double> hacc(2 * E);
        unsigned long long hnan[2];
        CK(cudaMemcpy(hacc.data(), dacc, 2 * E * sizeof(double), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hnan, dnan, sizeof hnan, cudaMemcpyDeviceToHost));
        double nb = 0.0;
        for (int e = 0; e < E; e++) {
            const double v = hacc[2 * e + 1] > 0 ? hacc[2 * e] / hacc[2 * e + 1] : hacc[2 * e];
            if (!(v <= nb)) nb = v;
        }
        char vs_lt[80];
        if (!lt_good)
            snprintf(vs_lt, sizeof vs_lt, "n/a");
        else if (hnan[1] == 0)
            snprintf(vs_lt, sizeof vs_lt, "%.2e", nb);
        else /* cuBLASLt's own gaps: compared where both are finite */
            snprintf(vs_lt, sizeof vs_lt, "%.2e (%llu of cuBLASLt's elements unwritten)", nb,
                     hnan[1]);
        const bool ok = na <= GF_TOL && hnan[0] == 0 && (!lt_good || nb <= GF_TOL);
        printf("    %s: check %s (worst expert nmse: host %.2e, cuBLASLt %s; %llu unwritten)", form,
               ok ? "ok" : "FAILED", na, vs_lt, hnan[0]);
        if (!ok) {
            printf(", not timed\n");
            continue;
        }
        const float ms1 =
            median_ms([&] { grouped_fp8(f, y1, mx, mw, ms, sw, goff, E, N, K, sms); });
        printf(" %.3f ms %5.0f TFLOP/s\n", ms1, fl / ms1 / 1e9);
    }
    if (L.ok) {
        const float ms0 = median_ms([&] { lt_grouped(lt, ws, wsb, L, off, N, K, xq, wq, y0, yt); });
        printf("    cuBLASLt per expert (16-row tails as the backend): %.3f ms %5.0f TFLOP/s\n",
               ms0, fl / ms0 / 1e9);
    }
    if (M % 16 == 0) { /* sx is then [KB, M]: cuBLASLt's layout for all rows */
        lt_plan dense;
        if (lt_make(lt, wsb, (int)M, N, K, K, LT_TILES, CUDA_R_16BF, xq, sx, wq, sw, y0, &dense)) {
            const float msd = median_ms([&] { lt_run(lt, ws, wsb, dense, xq, wq, y0); });
            printf("    cuBLASLt dense, all rows x expert 0's weight (the same flops): %.3f ms "
                   "%5.0f TFLOP/s\n",
                   msd, fl / msd / 1e9);
        }
        lt_free(&dense);
    }
    for (int i = 0; i < 2 * E; i++)
        lt_free(&L.plans[i]);
    CK(cudaFree(xq));
    CK(cudaFree(wq));
    CK(cudaFree(sx));
    CK(cudaFree(sw));
    CK(cudaFree(sxl));
    CK(cudaFree(y0));
    CK(cudaFree(y1));
    CK(cudaFree(yt));
    CK(cudaFree(doff));
    CK(cudaFree(dacc));
    CK(cudaFree(dnan));
}

/* ---- the grouped wgrad: dW_e [O, I] (+)= dy_e^T x_e, written 2026-12-04 without a GPU ----
 *
 * Why: the fp8-block backward runs at 602 TFLOP/s (op harness, H200, 2026-12-04) against the
 * forward's 1,087: dgrad is the grouped kernel above, but wgrad is a cuBLASLt call per expert
 * with 1 x 128 scales on both operands (about 460 TFLOP/s, by subtraction). The operands are
 * the backend's (quant_fp8.cu's k_fp8_cols_t), in one layout for all experts instead of one
 * array per expert (the change integration makes; cuBLASLt reads the same bytes with ld =
 * Mpad):
 *   dyt [O, Mpad] e4m3: column p0_e + t is token t of expert e (t < n_e; zeros up to np_e =
 *       round_up(n_e, 128)), Mpad = the sum of np_e; ds [Mpad / 128, O]: the scale of the 128
 *       tokens from p0_e + 128 kb of row o at ds[(p0_e / 128 + kb) O + o];
 *   xt [I, Mpad] and xs [Mpad / 128, I] the same for x.
 * So both operands are K-major with per-row 1 x 128 scales, the reduction (an expert's padded
 * tokens) has its own length per expert, and the tile's scale factor differs per element:
 * scale_dy[row] x scale_x[column].
 * Design: the forward's (grouped_fp8.cuh: 384 threads, producer warpgroup, cooperative 128 x
 * 128 NH tiles, wgmma e4m3 per 128-token block into p, promoted by the CUDA cores), with:
 *   tiles: every expert with tokens has ceil(O / 128) x ceil(I / BN) of them (m fastest), its
 *     K steps np_e / 128 (the producer's and consumers' walks count them per tile);
 *   a stage: the A box {128 tokens, 128 rows of dyt}, the B box {128 tokens, BN rows of xt},
 *     and the two scale vectors as bulk copies (ds's 128 of this block's rows, xs's BN: rows
 *     and columns past O and I not copied, their products never stored);
 *   the promotion: acc += (sa[row] sb[col]) p with sb read as float2 per 8 columns (16 shared
 *     loads, 64 multiplies and 64 FMAs a thread a 128-column batch, twice the forward's), the
 *     stage released after the last batch's promotion (sb is read from it);
 *   the epilogue: fp32 into dW_e, written (beta 0) or added (beta 1); experts without tokens
 *     are not touched (the backend zeroes them under SET).
 * Prediction (2026-12-04): about 1,000 TFLOP/s at NH 2 on the mixtral shapes (the forward's
 * 998-1,223 less the heavier promotion, if the other warpgroup's batch still hides it).
 * Measured (H200, 2026-12-05 03:22 UTC): 128 x 256 735 / 666 (w1 even / uneven), 739 / 753 (w2),
 * against cuBLASLt per expert 750 / 756 and 774 / 804: below it everywhere.
 * Where the difference goes (2026-12-05, by arithmetic): at 2,048 tokens an expert a 128 x 256
 * tile is 16 K steps, about 15.5 us at the forward's main-loop rate, then writes 128 KB of fp32
 * (the forward's w1 tile 64 KB of bf16 after 32 steps: 4x the epilogue a step); with all SMs
 * in their epilogues together that is about 5 us at the memory's 3.5 TB/s, during which the
 * tensor cores idle. So the epilogue forms below: the staged one halves the store
 * instructions' cost (expected w1 735 -> ~780), the TMA one takes the writes off the consumers'
 * path: each warpgroup writes a 64 x 32 box into shared memory and goes on, the TMA unit
 * drains it while the next tile's main loop runs (expected ~850-900 at w1 and w2, above
 * cuBLASLt's 750-804; beta 1 as fast as beta 0: the adds happen in L2, where the register
 * form read every element first). Measured (H100, 2026-12-05 10:46 UTC): every form passes
 * every check; TMA 739-836 TFLOP/s at beta 0, the fastest form everywhere, ahead of cuBLASLt
 * per expert (733-774) on 5 of 6 cases but behind it on w1 with the step's skewed counts and
 * at beta 1 (549-742 against 571-739); in the backend it made the fp8-block step 0.9 ms
 * slower (docs/performance-gpu.md, "The queue checked"). */
#define GW_SC_BYTES(NH) (512 * (1 + (NH))) /* a stage's scales: 128 of ds, 128 NH of xs */
/* The epilogues the playground compares (2026-12-05): GW_REGS, gg_store's 8-byte stores from
 * the registers (the form that ran: 735 / 666 TFLOP/s at w1's shape, even / uneven, against
 * cuBLASLt's 750 / 756); GW_STAGED, gg_store_staged (the forward's since 2026-12-05: whole
 * 128-byte row segments, +9% on w1's forward); GW_TMA, gw_store_tma below: the block leaves
 * by TMA stores (beta 0) or TMA reduce-adds (beta 1) and the consumers go on to the next
 * tile's main loop while it drains. */
enum { GW_REGS, GW_STAGED, GW_TMA };
#define GW_TMA_BYTES (64 * 128) /* a warpgroup's TMA box: 64 rows of 32 fp32 */
#define GW_EPI_BYTES(EPI)                                                                          \
    ((EPI) == GW_STAGED ? 2 * GG_ST_WG + 16 : (EPI) == GW_TMA ? 2 * GW_TMA_BYTES + 1024 : 0)
#define GW_SMEM(NH, EPI)                                                                           \
    (GF_NS(NH) * (GF_A_BYTES + GF_B_BYTES(NH) + GW_SC_BYTES(NH) + 16) + 1024 + GW_EPI_BYTES(EPI))

/* two floats from shared address a (8-byte aligned), as gf_lds */
__device__ __forceinline__ float2 gw_lds2(uint32_t a) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}

/* The wgrad's tile t: expert e (its padded tokens from p0, ks K steps), rows m0 of O, columns
 * n0 of I; 0 past the end. pref [E + 1]: the first tile of each expert. */
struct gw_tile {
    int e, p0, ks, m0, n0;
};
__device__ __forceinline__ int gw_find(const int *pref, const int *poff, int E, int t, int MT,
                                       int BN, gw_tile *tl) {
    const int e = gg_tile_expert(pref, E, t);
    if (e < 0) return 0;
    const int local = t - pref[e];
    tl->e = e, tl->p0 = poff[e], tl->ks = (poff[e + 1] - poff[e]) / 128;
    tl->m0 = (local % MT) * 128, tl->n0 = (local / MT) * BN;
    return 1;
}

/* GW_TMA's epilogue of one warpgroup's accumulators acc [NH][64 rows, 128 columns] (rows r..,
 * columns c.. of expert e's dW through mdw: [E, O, I] fp32, boxes {32, 64, 1} with the
 * 128-byte swizzle; rows past O and columns past I are dropped by the TMA unit): in boxes of
 * 32 columns through this warpgroup's buffer buf (GW_TMA_BYTES, 1024-byte aligned; named
 * barrier bar, 128 threads), each stored (add 0) or added in L2 (add 1) by its thread 0 and
 * left to drain: the thread waits only for the box's reads of buf before the next box
 * overwrites it. A box row is 128 bytes: the 16-byte chunk q of row y sits at q ^ (y & 7)
 * (the swizzle), and the lanes t >= 2 of a quad store the column block j ^ 2 where the lanes
 * t < 2 store j (attention's dQ store, fb_store_dq: a half-warp's 8-byte stores then meet 8
 * different chunks). */
template <int NH>
__device__ __forceinline__ void gw_store_tma(const CUtensorMap *mdw, const float (&acc)[NH][16][4],
                                             int e, int r, int c, int add, uint32_t buf, int bar) {
    const int t = threadIdx.x & 127, lane = t & 31, y = (t >> 5) * 16 + (lane >> 2), q = lane & 3;
    const bool lo = q < 2;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int box = 0; box < 4; box++) {
            if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory"); /* buf is free */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                /* the column block this lane stores, chosen by value: an index that depends
                 * on the lane would put acc in local memory */
                const int js = lo ? j : j ^ 2;
                const float *a = acc[h][4 * box + j], *b = acc[h][4 * box + (j ^ 2)];
                const uint32_t o = ((((uint32_t)js * 2 + (q >> 1)) ^ (y & 7)) << 4) + 8 * (q & 1);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + y * 128 + o),
                             "f"(lo ? a[0] : b[0]), "f"(lo ? a[1] : b[1])
                             : "memory");
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + (y + 8) * 128 + o),
                             "f"(lo ? a[2] : b[2]), "f"(lo ? a[3] : b[3])
                             : "memory");
            }
            fa3_fence_smem(); /* the writes before the TMA unit's reads */
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
            if (t != 0) continue;
            const int col = c + 128 * h + 32 * box;
            if (add)
                asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
                             " [%0, {%1, %2, %3}], [%4];\n" ::"l"((uint64_t)mdw),
                             "r"(col), "r"(r), "r"(e), "r"(buf)
                             : "memory");
            else
                asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group"
                             " [%0, {%1, %2, %3}], [%4];\n" ::"l"((uint64_t)mdw),
                             "r"(col), "r"(r), "r"(e), "r"(buf)
                             : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
}

/* dw [E, O, I] fp32 (+)= per expert dyt_e xt_e^T (see above); poff [E + 1] the padded token
 * offsets (multiples of 128), by value; maps: mdy dyt [O, Mpad] boxes {128, 128}, mx xt
 * [I, Mpad] boxes {128, BN}, both e4m3 with the 128-byte swizzle; mdw dw for GW_TMA's stores
 * (gw_store_tma; the other epilogues write through dw). */
template <int NH, int EPI>
__global__ void __launch_bounds__(GF_THREADS, 1)
    k_grouped_fp8_wgrad(float *__restrict__ dw /* [E, O, I] */,
                        const __grid_constant__ CUtensorMap mdy,
                        const __grid_constant__ CUtensorMap mx,
                        const __grid_constant__ CUtensorMap mdw,
                        const float *__restrict__ ds /* [Mpad / 128, O] */,
                        const float *__restrict__ xs /* [Mpad / 128, I] */,
                        const __grid_constant__ gg_offsets poff, int E, int O, int I, int beta) {
    constexpr int BN = GF_BN(NH), NS = GF_NS(NH);
    constexpr uint32_t B_BYTES = GF_B_BYTES(NH), SC = GW_SC_BYTES(NH);
    extern __shared__ __align__(16) unsigned char gg_smem[];
    __shared__ int s_pref[GG_MAXE + 1], s_poff[GG_MAXE + 1];
    const uint32_t sA = (smem_u32(gg_smem) + 1023u) & ~1023u, sB = sA + NS * GF_A_BYTES;
    const uint32_t sS = sB + NS * B_BYTES, bfull = sS + NS * SC, bempty = bfull + 8 * NS;
    /* the epilogue's two buffers (GW_STAGED, GW_TMA), one a warpgroup */
    const uint32_t sT =
        EPI == GW_TMA ? (bempty + 8 * NS + 1023) & ~1023u : (bempty + 8 * NS + 15) & ~15u;
    const int MT = (O + 127) / 128, NT = (I + BN - 1) / BN;
    if (threadIdx.x == 0) {
        s_pref[0] = 0;
        for (int e = 0; e < E; e++) {
            s_poff[e] = poff.o[e];
            s_pref[e + 1] = s_pref[e] + (poff.o[e + 1] > poff.o[e] ? MT * NT : 0);
        }
        s_poff[E] = poff.o[E];
        gg_ring_init(bfull, bempty, NS, 256);
    }
    __syncthreads();

    gw_tile tl;
    if (threadIdx.x >= 256) { /* the producer warpgroup: thread 256 issues every load */
        fa3_regs_dec<40>();
        if (threadIdx.x != 256) return;
        for (int t = blockIdx.x, it = 0; gw_find(s_pref, s_poff, E, t, MT, BN, &tl);
             t += gridDim.x) {
            const uint32_t na = 4u * min(128, O - tl.m0), nb = 4u * min(BN, I - tl.n0);
            for (int k = 0; k < tl.ks; k++, it++) {
                const int s = it % NS;
                const uint32_t bar = bfull + 8 * s, sc = sS + s * SC;
                const int64_t blk = tl.p0 / 128 + k; /* the token block's row of ds and xs */
                if (it >= NS) fa3_bar_wait(bempty + 8 * s, ((it / NS) - 1) & 1);
                fa3_bar_expect(bar, GF_A_BYTES + B_BYTES + na + nb);
                gg_tma(sA + s * GF_A_BYTES, &mdy, tl.p0 + 128 * k, tl.m0, bar);
                gg_tma(sB + s * B_BYTES, &mx, tl.p0 + 128 * k, tl.n0, bar);
                gf_bulk(sc, ds + blk * O + tl.m0, na, bar);
                gf_bulk(sc + 512, xs + blk * I + tl.n0, nb, bar);
            }
        }
        return;
    }

    fa3_regs_inc<232>();
    const int wg = threadIdx.x >> 7;
    const int row = wg * 64 + ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
    const int cq = 2 * (threadIdx.x & 3); /* this thread's first column of each 8 */
    float acc[NH][16][4];
    float p[16][4];
    for (int t = blockIdx.x, it = 0; gw_find(s_pref, s_poff, E, t, MT, BN, &tl); t += gridDim.x) {
#pragma unroll
        for (int h = 0; h < NH; h++)
            fa_zero<16>(acc[h]);
        for (int k = 0; k < tl.ks; k++, it++) {
            const int s = it % NS;
            const uint32_t sc = sS + s * SC;
            fa3_bar_wait(bfull + 8 * s, (it / NS) & 1);
            const uint32_t a = sA + s * GF_A_BYTES + wg * 64 * 128, b = sB + s * B_BYTES;
            float sa0, sa1;
#pragma unroll
            for (int h = 0; h < NH; h++) {
                fa3_hold(p);
                fa3_fence();
#pragma unroll
                for (int kk = 0; kk < GF_BK / 32; kk++)
                    gf_mma(p, fa3_desc(a + kk * 32, 16, 1024),
                           fa3_desc(b + h * 128 * 128 + kk * 32, 16, 1024), kk);
                fa3_commit();
                if (h == 0) {
                    sa0 = gf_lds(sc + 4 * row);
                    sa1 = gf_lds(sc + 4 * (row + 8));
                }
                fa3_wait<0>();
                fa3_hold(p);
#pragma unroll
                for (int nt = 0; nt < 16; nt++) {
                    const float2 sb = gw_lds2(sc + 512 + 4 * (128 * h + 8 * nt + cq));
                    acc[h][nt][0] = fmaf(sa0 * sb.x, p[nt][0], acc[h][nt][0]);
                    acc[h][nt][1] = fmaf(sa0 * sb.y, p[nt][1], acc[h][nt][1]);
                    acc[h][nt][2] = fmaf(sa1 * sb.x, p[nt][2], acc[h][nt][2]);
                    acc[h][nt][3] = fmaf(sa1 * sb.y, p[nt][3], acc[h][nt][3]);
                }
            }
            fa3_bar_arrive(bempty + 8 * s); /* after the last read of the stage's scales */
        }
        float *dwe = dw + (int64_t)tl.e * O * I;
        if constexpr (EPI == GW_TMA)
            gw_store_tma<NH>(&mdw, acc, tl.e, tl.m0 + wg * 64, tl.n0, beta, sT + wg * GW_TMA_BYTES,
                             3 + wg);
        else
#pragma unroll
            for (int h = 0; h < NH; h++)
                if constexpr (EPI == GW_STAGED)
                    gg_store_staged(dwe, acc[h], tl.m0 + wg * 64, O, tl.n0 + 128 * h, I, beta,
                                    sT + wg * GG_ST_WG, 3 + wg);
                else
                    gg_store(dwe, acc[h], tl.m0 + wg * 64, O, tl.n0 + 128 * h, I, beta);
    }
    /* the last boxes are performed before the block's shared memory goes */
    if (EPI == GW_TMA && (threadIdx.x & 127) == 0) fa3_bulk_wait();
}

/* The wgrad's operands from gf_val (dy: seed 3, x: seed 4, powers of two varying with the row
 * and the token block as gf_x's): q [K, Mpad] e4m3 and s [Mpad / 128, K] as the backend's
 * column quantizer lays out each expert (amax over the 128 tokens of a block, padding tokens
 * zero), one thread per (row k, token block). poff/off [E + 1] on the device. */
__global__ void gw_quant_cols(uint8_t *__restrict__ q, float *__restrict__ sq, int K, int64_t Mpad,
                              const int32_t *__restrict__ off, const int32_t *__restrict__ poff,
                              int E, uint64_t seed) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, nblk = Mpad / 128;
    if (i >= (int64_t)K * nblk) return;
    const int k = (int)(i / nblk);
    const int64_t blk = i % nblk;
    int e = 0;
    while (e + 1 < E && poff[e + 1] <= blk * 128)
        e++;
    const int64_t t0 = blk * 128 - poff[e], n = off[e + 1] - off[e];
    float v[128], amax = 0.0f;
    for (int j = 0; j < 128; j++) {
        const int64_t t = t0 + j; /* the expert's token */
        v[j] = t < n ? ldexpf(gf_val(seed, (uint64_t)(off[e] + t) * K + k),
                              (int)(((off[e] + t) * 5 + k * 3 + blk) % 9) - 4)
                     : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    const float sc = gf_scale(amax);
    sq[blk * K + k] = sc;
    for (int j = 0; j < 128; j++)
        q[(int64_t)k * Mpad + blk * 128 + j] = gf_e4m3(v[j], sc);
}

/* per expert over dW [E, O * I]: acc [E, 2] += (sum of (a - b)^2, sum of b^2) where both are
 * finite; unw [2] += the non-finite elements of a and of b. Grid (blocks, E). */
__global__ void __launch_bounds__(256)
    gw_compare(const float *__restrict__ a, const float *__restrict__ b, int64_t per,
               double *__restrict__ acc, unsigned long long *__restrict__ unw) {
    const int e = blockIdx.y;
    double d = 0.0, r = 0.0;
    unsigned long long na = 0, nb = 0;
    for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < per; i += (int64_t)gridDim.x * 256) {
        const float x = a[e * per + i], y = b[e * per + i];
        na += !isfinite(x), nb += !isfinite(y);
        if (isfinite(x) && isfinite(y)) d += ((double)x - y) * ((double)x - y), r += (double)y * y;
    }
    atomicAdd(&acc[2 * e], d);
    atomicAdd(&acc[2 * e + 1], r);
    atomicAdd(&unw[0], na);
    atomicAdd(&unw[1], nb);
}

/* One wgrad case: E experts with these token counts, dW [E, O, I] = dy_e^T x_e. The operands;
 * cuBLASLt per expert (the backend's way, with ld = Mpad) checked against a double-precision
 * host product on sampled rows of dW; then each tile width: beta 0 (dW starts NaN: every
 * element of an expert with tokens written, those without left NaN) against the host and
 * cuBLASLt, beta 1 (dW starts at 0.186 on both sides) against cuBLASLt, then its time. */
static void run_wgrad(const char *name, const std::vector<int> &counts, int O, int I,
                      cublasLtHandle_t lt, void *ws, size_t wsb, int sms) {
    const int E = (int)counts.size();
    std::vector<int> off(E + 1, 0), poff(E + 1, 0);
    for (int e = 0; e < E; e++) {
        off[e + 1] = off[e] + counts[e];
        poff[e + 1] = poff[e] + (counts[e] + 127) / 128 * 128;
    }
    const int64_t Mpad = poff[E], M = off[E], nblk = Mpad / 128;
    printf("%s: O=%d I=%d, tokens %lld (padded %lld), counts", name, O, I, (long long)M,
           (long long)Mpad);
    for (int e = 0; e < E; e++)
        printf(" %d", counts[e]);
    printf("\n");
    uint8_t *dyt, *xt;
    float *ds, *xs, *w0, *w1;
    int32_t *doff;
    double *dacc;
    unsigned long long *dnan;
    const size_t nw = (size_t)E * O * I;
    CK(cudaMalloc(&dyt, std::max<size_t>((size_t)O * Mpad, 16)));
    CK(cudaMalloc(&xt, std::max<size_t>((size_t)I * Mpad, 16)));
    CK(cudaMalloc(&ds, std::max<size_t>((size_t)nblk * O, 4) * sizeof(float)));
    CK(cudaMalloc(&xs, std::max<size_t>((size_t)nblk * I, 4) * sizeof(float)));
    CK(cudaMalloc(&w0, nw * sizeof(float)));
    CK(cudaMalloc(&w1, nw * sizeof(float)));
    CK(cudaMalloc(&doff, 2 * (E + 1) * sizeof(int32_t)));
    CK(cudaMalloc(&dacc, 2 * E * sizeof(double)));
    CK(cudaMalloc(&dnan, 2 * sizeof(unsigned long long)));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(doff + E + 1, poff.data(), (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
    gw_quant_cols<<<(unsigned)((O * nblk + 127) / 128), 128>>>(dyt, ds, O, Mpad, doff, doff + E + 1,
                                                               E, 3);
    gw_quant_cols<<<(unsigned)((I * nblk + 127) / 128), 128>>>(xt, xs, I, Mpad, doff, doff + E + 1,
                                                               E, 4);
    CK(cudaGetLastError());
    gg_offsets gpoff;
    std::copy(poff.begin(), poff.end(), gpoff.o);
    const int64_t ddy[2] = {Mpad, O}, dxt[2] = {Mpad, I}, sld[1] = {Mpad};
    const CUtensorMap mdy = gg_map(dyt, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, ddy, sld, 128, GF_BM,
                                   CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap mx[GF_FORMS] = {gg_map(xt, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dxt, sld, 128,
                                             GF_BN(1), CU_TENSOR_MAP_SWIZZLE_128B),
                                      gg_map(xt, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dxt, sld, 128,
                                             GF_BN(2), CU_TENSOR_MAP_SWIZZLE_128B)};
    /* the forms, each a kernel instance, its tile width and epilogue */
    struct gw_form {
        void (*k)(float *, CUtensorMap, CUtensorMap, CUtensorMap, const float *, const float *,
                  gg_offsets, int, int, int, int);
        int nh, smem;
        const char *epi;
    };
    const gw_form forms[] = {
        {k_grouped_fp8_wgrad<1, GW_REGS>, 1, GW_SMEM(1, GW_REGS), "registers"},
        {k_grouped_fp8_wgrad<2, GW_REGS>, 2, GW_SMEM(2, GW_REGS), "registers"},
        {k_grouped_fp8_wgrad<2, GW_STAGED>, 2, GW_SMEM(2, GW_STAGED), "staged"},
        {k_grouped_fp8_wgrad<2, GW_TMA>, 2, GW_SMEM(2, GW_TMA), "TMA stores"}};
    const int nforms = (int)(sizeof forms / sizeof forms[0]);
    /* w1 [E, O, I] for the TMA stores: boxes of 32 columns, 64 rows, one expert */
    const int64_t ddw[3] = {I, O, E}, sdw[2] = {(int64_t)I * 4, (int64_t)O * I * 4};
    const CUtensorMap mdw = gg_map(w1, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ddw, sdw, 32, 64,
                                   CU_TENSOR_MAP_SWIZZLE_128B);
    /* form f into w1 */
    auto grouped = [&](int f, int beta) {
        const gw_form &g = forms[f];
        g.k<<<sms, GF_THREADS, g.smem>>>(w1, mdy, mx[g.nh - 1], mdw, ds, xs, gpoff, E, O, I, beta);
        CK(cudaGetLastError());
    };
    for (const gw_form &g : forms)
        CK(cudaFuncSetAttribute(g.k, cudaFuncAttributeMaxDynamicSharedMemorySize, g.smem));

    /* cuBLASLt per expert: dW_e [O, I] = dyt_e [O, np] xt_e [I, np]^T, ld Mpad */
    std::vector<lt_plan> plans(E);
    bool lt_ok = true;
    for (int e = 0; e < E && lt_ok; e++) {
        const int np = poff[e + 1] - poff[e];
        if (np > 0)
            lt_ok = lt_make(lt, wsb, O, I, np, Mpad, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                            CUDA_R_32F, dyt + poff[e], ds + (size_t)poff[e] / 128 * O, xt + poff[e],
                            xs + (size_t)poff[e] / 128 * I, w0 + (size_t)e * O * I, &plans[e]);
    }
    auto lt_all = [&](float beta) {
        for (int e = 0; e < E; e++)
            if (poff[e + 1] > poff[e])
                lt_run(lt, ws, wsb, plans[e], dyt + poff[e], xt + poff[e], w0 + (size_t)e * O * I,
                       beta);
    };

    /* the host's reference: rows 0, O - 1 and two others of each expert with tokens, all I
     * columns, in double precision from the same bytes and scales */
    std::vector<uint8_t> hdy((size_t)O * Mpad), hx((size_t)I * Mpad);
    std::vector<float> hds((size_t)nblk * O), hxs((size_t)nblk * I);
    CK(cudaMemcpy(hdy.data(), dyt, hdy.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hx.data(), xt, hx.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hds.data(), ds, hds.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hxs.data(), xs, hxs.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double lut[256];
    for (int b = 0; b < 256; b++)
        lut[b] = e4m3_value((uint8_t)b);
    std::vector<int> re, ro; /* sampled (expert, row) */
    for (int e = 0; e < E; e++) {
        if (poff[e + 1] == poff[e]) continue;
        const int cand[4] = {0, O - 1, (e * 37 + 11) % O, (e * 101 + 64) % O};
        for (int c = 0; c < 4; c++)
            re.push_back(e), ro.push_back(cand[c]);
    }
    std::vector<double> ref(re.size() * I, 0.0);
    {
        const unsigned nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
        std::vector<std::thread> th;
        for (unsigned t = 0; t < nt; t++)
            th.emplace_back([&, t] {
                for (size_t j = t; j < re.size(); j += nt) {
                    const int e = re[j], o = ro[j];
                    for (int i = 0; i < I; i++) {
                        double tot = 0.0;
                        for (int64_t b = poff[e] / 128; b < poff[e + 1] / 128; b++) {
                            double part = 0.0;
                            for (int u = 0; u < 128; u++)
                                part += lut[hdy[(size_t)o * Mpad + b * 128 + u]] *
                                        lut[hx[(size_t)i * Mpad + b * 128 + u]];
                            tot += part * hds[b * O + o] * hxs[b * I + i];
                        }
                        ref[j * I + i] = tot;
                    }
                }
            });
        for (auto &x : th)
            x.join();
    }
    /* the worst expert's NMSE of the sampled rows of dw against ref (a NaN sticks) */
    auto vs_host = [&](const float *dw) {
        std::vector<double> num(E, 0.0), den(E, 0.0);
        std::vector<float> h(I);
        for (size_t j = 0; j < re.size(); j++) {
            CK(cudaMemcpy(h.data(), dw + ((size_t)re[j] * O + ro[j]) * I, I * sizeof(float),
                          cudaMemcpyDeviceToHost));
            for (int i = 0; i < I; i++) {
                const double d = h[i] - ref[j * I + i];
                num[re[j]] += d * d, den[re[j]] += ref[j * I + i] * ref[j * I + i];
            }
        }
        double worst = 0.0;
        for (int e = 0; e < E; e++) {
            const double v = den[e] > 0 ? num[e] / den[e] : num[e];
            if (!(v <= worst)) worst = v;
        }
        return worst;
    };
    /* the worst expert's NMSE of a against b over every element, and the non-finite counts
     * (a's, b's) over the experts with tokens */
    auto vs_all = [&](const float *a, const float *b, unsigned long long *bad) {
        CK(cudaMemset(dacc, 0, 2 * E * sizeof(double)));
        CK(cudaMemset(dnan, 0, 2 * sizeof(unsigned long long)));
        gw_compare<<<dim3(64, E), 256>>>(a, b, (int64_t)O * I, dacc, dnan);
        CK(cudaGetLastError());
        std::vector<double> h(2 * E);
        CK(cudaMemcpy(h.data(), dacc, 2 * E * sizeof(double), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(bad, dnan, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int e = 0; e < E; e++) {
            const double v = h[2 * e + 1] > 0 ? h[2 * e] / h[2 * e + 1] : h[2 * e];
            if (!(v <= worst)) worst = v;
        }
        return worst;
    };
    /* the experts without tokens hold O * I NaN each after a beta-0 run from NaN */
    unsigned long long idle = 0;
    for (int e = 0; e < E; e++)
        idle += poff[e + 1] == poff[e] ? (unsigned long long)O * I : 0;
    bool lt_good = false;
    if (lt_ok) {
        CK(cudaMemset(w0, 0xff, nw * sizeof(float)));
        lt_all(0.0f);
        CK(cudaDeviceSynchronize());
        const double nm = vs_host(w0);
        lt_good = nm <= GF_TOL;
        printf("    cuBLASLt per expert against the host (%zu sampled rows): worst expert nmse "
               "%.2e%s\n",
               re.size(), nm, lt_good ? "" : " - cuBLASLt FAILED, its comparison skipped");
    }
    const double fl = 2.0 * M * O * I; /* the tokens' flops, not the padding's */
    for (int f = 0; f < nforms; f++) {
        unsigned long long bad[2];
        CK(cudaMemset(w1, 0xff, nw * sizeof(float)));
        grouped(f, 0);
        CK(cudaDeviceSynchronize());
        const double nh = vs_host(w1);
        double nl = lt_good ? vs_all(w1, w0, bad) : 0.0;
        if (!lt_good) vs_all(w1, w1, bad);
        bool ok = nh <= GF_TOL && bad[0] == idle && nl <= GF_TOL;
        /* beta 1: both from the bytes 0x3e (0.186 each float) */
        double n1 = 0.0;
        if (lt_good) {
            CK(cudaMemset(w0, 0x3e, nw * sizeof(float)));
            CK(cudaMemset(w1, 0x3e, nw * sizeof(float)));
            lt_all(1.0f);
            grouped(f, 1);
            unsigned long long b1[2];
            n1 = vs_all(w1, w0, b1);
            ok = ok && n1 <= GF_TOL && b1[0] == 0;
            /* w0 back to cuBLASLt's beta-0 product, the next form's reference (without this
             * the 128 x 256 form was compared with the beta-1 sums: its "failure" on the
             * small case, 2026-12-05, was this harness's, not the kernel's) */
            CK(cudaMemset(w0, 0xff, nw * sizeof(float)));
            lt_all(0.0f);
        }
        printf("    grouped fp8 wgrad, 128 x %d tiles, %d stages, %s: check %s (worst expert "
               "nmse: host %.2e, cuBLASLt %.2e, beta 1 %.2e; %llu non-finite, %llu expected)",
               GF_BN(forms[f].nh), GF_NS(forms[f].nh), forms[f].epi, ok ? "ok" : "FAILED", nh, nl,
               n1, bad[0], idle);
        if (!ok) {
            printf(", not timed\n");
            continue;
        }
        const float t = median_ms([&] { grouped(f, 0); }), t1 = median_ms([&] { grouped(f, 1); });
        printf(" %.3f ms %5.0f TFLOP/s; beta 1 %.3f ms %5.0f\n", t, fl / t / 1e9, t1,
               fl / t1 / 1e9);
    }
    if (lt_ok) {
        const float t = median_ms([&] { lt_all(0.0f); }), t1 = median_ms([&] { lt_all(1.0f); });
        printf("    cuBLASLt per expert (1 x 128 scales on both, the backend's wgrad): %.3f ms "
               "%5.0f TFLOP/s; beta 1 %.3f ms %5.0f\n",
               t, fl / t / 1e9, t1, fl / t1 / 1e9);
    }
    for (auto &q : plans)
        lt_free(&q);
    CK(cudaFree(dyt));
    CK(cudaFree(xt));
    CK(cudaFree(ds));
    CK(cudaFree(xs));
    CK(cudaFree(w0));
    CK(cudaFree(w1));
    CK(cudaFree(doff));
    CK(cudaFree(dacc));
    CK(cudaFree(dnan));
}

int main(int argc, char **argv) {
    /* `wgrad` runs the weight-gradient part, else the forward's */
    const bool wgrad = argc > 1 && !strcmp(argv[1], "wgrad");
    /* each line out at once: a kernel that hangs leaves the lines before it */
    setvbuf(stdout, NULL, _IOLBF, 0);
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    const size_t wsb = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const std::vector<int> tiny = {3, 0, 125};
    const std::vector<int> small = {1, 127, 129, 0, 255, 64, 3, 300};
    const std::vector<int> even(8, 2048);
    const std::vector<int> uneven = {2047, 1901, 2203, 97, 0, 3001, 1499, 5636};
    /* as the training step's router sends a layer's 16,384 rows at random initialisation
     * (mixtral8x7b-2L, ncu, 2026-12-05): most to three experts, a few dozen to the others,
     * whose products are weight reads (forward) or fp32 gradient writes (wgrad) */
    const std::vector<int> skewed = {4704, 3904, 7456, 48, 64, 32, 80, 96};
    /* the forward's (N, K) and the wgrad's (O: the forward's output width, I: its input's):
     * tiny, small (wgrad: O 272 and I 400, a half-used 128-row and 256-column tile), then
     * w1's and w2's products */
    const struct {
        const char *fwd, *wg;
        const std::vector<int> *counts;
        int fn, fk, o, i;
    } cases[] = {{"tiny (check)", "wgrad tiny (check)", &tiny, 256, 256, 256, 384},
                 {"small (check)", "wgrad small (check)", &small, 384, 400, 272, 400},
                 {"w1 forward, even", "w1 wgrad, even", &even, 14336, 4096, 14336, 4096},
                 {"w1 forward, uneven", "w1 wgrad, uneven", &uneven, 14336, 4096, 14336, 4096},
                 {"w2 forward, even", "w2 wgrad, even", &even, 4096, 14336, 4096, 14336},
                 {"w2 forward, uneven", "w2 wgrad, uneven", &uneven, 4096, 14336, 4096, 14336},
                 {"w1 forward, skewed", "w1 wgrad, skewed", &skewed, 14336, 4096, 14336, 4096},
                 {"w2 forward, skewed", "w2 wgrad, skewed", &skewed, 4096, 14336, 4096, 14336}};
    for (const auto &c : cases)
        if (wgrad)
            run_wgrad(c.wg, *c.counts, c.o, c.i, lt, ws, wsb, sms);
        else
            run(c.fwd, *c.counts, c.fn, c.fk, lt, ws, wsb, sms);
    return 0;
}
