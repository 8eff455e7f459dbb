/* fp8_wgrad_scales.cu: what the fp8-block wgrad products would gain from a 128 x 128-tiled
 * activation operand, and from longer reductions.
 *
 * fp8-block's expert wgrad dW_e = dy_e^T x_e reduces over the expert's tokens, both operands in
 * 1 x 128 blocks along them (VEC128_32F x VEC128_32F: each 128-token block's partial product is
 * promoted with a row scale times a column scale); cuBLASLt ran it at about 700 TFLOP/s inside
 * the mixtral8x7b-2L step (2,048 tokens an expert), where the forward's VEC128 x BLK128x128
 * (the weight in 128 x 128 tiles) runs above 1,100. This times, for one expert's w1/w3 and w2
 * wgrad shapes at n = 2,048, 4,096 and 8,192 tokens, the product with the activation x as
 * VEC128 (today's recipe) and as BLK128x128 tiles (a recipe option it would take), every
 * algorithm cuBLASLt's heuristic offers (up to 8; first and best printed), bf16 output; and the
 * forward shape for reference. Operands are random e4m3 bytes (no NaN) and scales near 1: the
 * speed, not the values, is measured.
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 bench/kernels/fp8_wgrad_scales.cu -lcublasLt -o /tmp/fp8_wgrad
 *   /tmp/fp8_wgrad [n ...]          (default: 2048 4096 8192; C 4096, F 14336)
 *
 * Written 2026-12-06 without a GPU (compiled only); not built by CMake, not run by CI
 * (bench/kernels/README.md). */
#include "playground.cuh"

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 32u << 20;

/* bytes [n]: e4m3 codes of magnitude below 0x78 (|v| < 256, never NaN), either sign */
__global__ void k_fill_e4m3(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 0x2c1b3c6du;
        p[i] = (uint8_t)((h >> 8) % 0x78u | (h & 0x80u));
    }
}
/* floats [n] in [0.5, 1.5) */
__global__ void k_fill_scales(float *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0.5f + (float)(((unsigned)i * 2246822519u ^ seed) >> 8 & 1023u) / 1024.0f;
}

/* Row-major C[M,N] bf16 = A[M,K] B[N,K]^T, e4m3, A with 1 x 128 scales [K/128, M]; B with
 * 1 x 128 scales [K/128, N] (tiles 0) or 128 x 128 tile scales [N/128, round4(K/128)] (1).
 * Every heuristic candidate timed (pg_time_algos); returns the best TFLOP/s, prints the first's
 * and the best's. */
static double product(const char *name, long M, long N, long K, int tiles, const uint8_t *A,
                      const float *sa, const uint8_t *B, const float *sb, void *C) {
    cublasLtMatmulDesc_t d;
    CB(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    /* column-major: C^T [N, M] = B [N, K] (cuBLASLt's A, transposed) x A^T [K, M] */
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cublasLtMatmulMatrixScale_t mvec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                                      mblk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t ma = tiles ? mblk : mvec; /* cuBLASLt's A: our B */
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mvec, sizeof mvec));
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
    cublasLtMatrixLayout_t la, lb, lc;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    float first_ms, best_ms;
    int best_i;
    const int found =
        pg_time_algos(lt, d, la, lb, lc, B, A, C, 0.0f, ws, WS, &first_ms, &best_ms, &best_i);
    const double flops = 2.0 * M * N * K, first = first_ms > 0 ? flops / first_ms * 1e-9 : 0.0,
                 best = best_i >= 0 ? flops / best_ms * 1e-9 : 0.0;
    printf("  %-30s M %5ld N %5ld K %5ld  x as %-6s  %d algos: first %7.1f best %7.1f TFLOP/s\n",
           name, M, N, K, tiles ? "tiles" : "vec128", found, first, best);
    CB(cublasLtMatrixLayoutDestroy(la));
    CB(cublasLtMatrixLayoutDestroy(lb));
    CB(cublasLtMatrixLayoutDestroy(lc));
    CB(cublasLtMatmulDescDestroy(d));
    return best;
}

int main(int argc, char **argv) {
    const long C = 4096, F = 14336;
    long ns[8] = {2048, 4096, 8192};
    int nn = 3;
    if (argc > 1) {
        nn = 0;
        for (int i = 1; i < argc && nn < 8; i++)
            ns[nn++] = atol(argv[i]);
    }
    long nmax = 0;
    for (int i = 0; i < nn; i++)
        if (ns[i] % 128 != 0 || ns[i] <= 0) {
            fprintf(stderr, "fp8_wgrad_scales: n=%ld: a positive multiple of 128 expected\n",
                    ns[i]);
            return 2;
        } else if (ns[i] > nmax) {
            nmax = ns[i];
        }
    CB(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, WS));
    const long big = F * (nmax > C ? nmax : C); /* the largest operand's values */
    uint8_t *A, *B;
    float *sa, *sb;
    void *Cm;
    CK(cudaMalloc(&A, (size_t)big));
    CK(cudaMalloc(&B, (size_t)big));
    CK(cudaMalloc(&sa, (size_t)big / 128 * sizeof(float) + 4096));
    CK(cudaMalloc(&sb, (size_t)big / 128 * sizeof(float) + 4096));
    CK(cudaMalloc(&Cm, (size_t)F * C * 2 + (size_t)nmax * F * 2));
    k_fill_e4m3<<<1024, 256>>>(A, (size_t)big, 1u);
    k_fill_e4m3<<<1024, 256>>>(B, (size_t)big, 2u);
    k_fill_scales<<<256, 256>>>(sa, (size_t)big / 128 + 1024, 3u);
    k_fill_scales<<<256, 256>>>(sb, (size_t)big / 128 + 1024, 4u);
    CK(cudaDeviceSynchronize());
    printf("fp8 e4m3 products, bf16 out (dy's scales 1 x 128 along the reduction; x's as named)\n");
    for (int i = 0; i < nn; i++) {
        const long n = ns[i];
        printf("expert of %ld tokens:\n", n);
        /* w1/w3 wgrad dW [F, C] = dy^T [F, n] x [n, C]; w2 wgrad dW [C, F] = dy^T [C, n] x [n, F]
         */
        const double v13 = product("wgrad w1/w3", F, C, n, 0, A, sa, B, sb, Cm);
        const double t13 = product("wgrad w1/w3", F, C, n, 1, A, sa, B, sb, Cm);
        const double v2 = product("wgrad w2", C, F, n, 0, A, sa, B, sb, Cm);
        const double t2 = product("wgrad w2", C, F, n, 1, A, sa, B, sb, Cm);
        printf("  tiles / vec128: w1/w3 %.2fx, w2 %.2fx\n", t13 / v13, t2 / v2);
        /* the forward for reference: y [n, F] = x [n, C] w1^T, the weight in tiles */
        product("forward w1 (reference)", n, F, C, 1, A, sa, B, sb, Cm);
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(sa));
    CK(cudaFree(sb));
    CK(cudaFree(Cm));
    CK(cudaFree(ws));
    CB(cublasLtDestroy(lt));
    return 0;
}
