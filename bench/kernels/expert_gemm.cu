/* expert_gemm.cu: where the per-expert cuBLASLt products of the mixtral8x7b-2L step lose time.
 *
 * Times each of the six expert products of one MoE layer (forward w1/w3 and w2, dgrad of both,
 * wgrad of both) for one expert of n rows, with every algorithm cuBLASLt's heuristic offers
 * (up to 16), and prints the heuristic's first choice (what kernels/gemm_plan.cu runs)
 * beside the fastest; then the same products on all experts' rows at once (one dense product,
 * the rate a grouped kernel could aim at); then the attention projections of the step (8,192
 * tokens: q and o 4096 -> 4096, k and v 4096 -> 1024), whose products ran at about 520
 * TFLOP/s inside the mixtral8x7b-2L step (docs/performance-gpu.md): does the heuristic's first
 * choice lose there? Row-major shapes as gemm_cublaslt.cu phrases them.
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 bench/kernels/expert_gemm.cu -lcublasLt -o /tmp/expert_gemm
 *   /tmp/expert_gemm [n ...]        (default: 2048 1900 2200; H 4096, F 14336)
 *
 * Not built by CMake, not run by CI (bench/kernels/README.md). */
#include "playground.cuh"

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 32u << 20;

/* Row-major C[M,N] (ctype) = op(A) op(B) + beta C, A [M,K] ([K,M] if ta), B [K,N] ([N,K] if
 * tb), bf16; every heuristic candidate timed; prints first and best. */
static void bench(const char *name, int ta, int tb, long M, long N, long K, cudaDataType ctype,
                  float beta, const void *A, const void *B, void *C) {
    cublasLtMatmulDesc_t d;
    CB(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    cublasLtMatrixLayout_t la, lb, lc;
    long ar = tb ? K : N, ac = tb ? N : K, br = ta ? M : K, bc = ta ? K : M;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, ar));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, br));
    CB(cublasLtMatrixLayoutCreate(&lc, ctype, N, M, N));
    float first, best;
    int best_i;
    const int found =
        pg_time_algos(lt, d, la, lb, lc, B, A, C, beta, ws, WS, &first, &best, &best_i);
    double fl = 2.0 * M * N * K;
    printf("%-28s M=%6ld N=%6ld K=%6ld %s beta=%g: heuristic #0 %.3f ms %6.0f TFLOP/s | best of "
           "%d #%d %.3f ms %6.0f TFLOP/s\n",
           name, M, N, K, ctype == CUDA_R_32F ? "f32" : "bf16", beta, first, fl / first / 1e9,
           found, best_i, best, fl / best / 1e9);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
}

static void *dev(size_t bytes, int bf16) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    if (bf16)
        pg_fill<<<1024, 256>>>((__nv_bfloat16 *)p, bytes / 2, 1);
    else
        CK(cudaMemset(p, 0, bytes));
    return p;
}

static void layer(long n, const char *tag) {
    const long H = 4096, F = 14336;
    void *x = dev(2 * n * H, 1), *g = dev(2 * n * F, 1), *w1 = dev(2 * F * H, 1),
         *w2 = dev(2 * H * F, 1), *dh = dev(2 * n * F, 1), *dy = dev(2 * n * H, 1);
    void *cF = dev(4 * n * F, 0), *cH = dev(4 * n * H, 0), *cW = dev(4 * F * H, 0);
    printf("-- %s: n = %ld rows\n", tag, n);
    bench("fwd w1 (x W1^T)", 0, 1, n, F, H, CUDA_R_16BF, 0, x, w1, cF);
    bench("fwd w2 (g W2^T)", 0, 1, n, H, F, CUDA_R_16BF, 0, g, w2, cH);
    bench("dgrad w1 (dh W1)", 0, 0, n, H, F, CUDA_R_32F, 0, dh, w1, cH);
    bench("dgrad w3 (dh W3, +=)", 0, 0, n, H, F, CUDA_R_32F, 1, dh, w1, cH);
    bench("dgrad w2 (dy W2)", 0, 0, n, F, H, CUDA_R_32F, 0, dy, w2, cF);
    bench("wgrad w1 (dh^T x)", 1, 0, F, H, n, CUDA_R_32F, 0, dh, x, cW);
    bench("wgrad w1, bf16 out", 1, 0, F, H, n, CUDA_R_16BF, 0, dh, x, cW);
    bench("wgrad w2 (dy^T g)", 1, 0, H, F, n, CUDA_R_32F, 0, dy, g, cW);
    void *bufs[] = {x, g, w1, w2, dh, dy, cF, cH, cW};
    for (void *b : bufs)
        CK(cudaFree(b));
}

/* The attention projections of n tokens (H 4096 -> q, o 4096, k, v 1024), as the model runs
 * them under bf16: forward bf16 out, dgrad fp32 out (k's and v's added into q's), wgrad fp32. */
static void projections(long n) {
    const long H = 4096, KV = 1024;
    void *x = dev(2 * n * H, 1), *wq = dev(2 * H * H, 1), *wk = dev(2 * KV * H, 1),
         *dq = dev(2 * n * H, 1), *dk = dev(2 * n * KV, 1);
    void *cH = dev(4 * n * H, 0), *cW = dev(4 * H * H, 0);
    printf("-- attention projections: n = %ld tokens\n", n);
    bench("fwd q/o (x Wq^T)", 0, 1, n, H, H, CUDA_R_16BF, 0, x, wq, cH);
    bench("fwd k/v (x Wk^T)", 0, 1, n, KV, H, CUDA_R_16BF, 0, x, wk, cH);
    bench("dgrad q/o (dq Wq)", 0, 0, n, H, H, CUDA_R_32F, 0, dq, wq, cH);
    bench("dgrad k/v (dk Wk, +=)", 0, 0, n, H, KV, CUDA_R_32F, 1, dk, wk, cH);
    bench("wgrad q/o (dq^T x)", 1, 0, H, H, n, CUDA_R_32F, 0, dq, x, cW);
    bench("wgrad k/v (dk^T x)", 1, 0, KV, H, n, CUDA_R_32F, 0, dk, x, cW);
    void *bufs[] = {x, wq, wk, dq, dk, cH, cW};
    for (void *b : bufs)
        CK(cudaFree(b));
}

int main(int argc, char **argv) {
    CB(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, WS));
    if (argc < 2) {
        const long ns[] = {2048, 1900, 2200};
        for (long n : ns)
            layer(n, "one expert");
    } else {
        for (int i = 1; i < argc; i++)
            layer(atol(argv[i]), "one expert");
    }
    layer(16384, "all 8 experts' rows as one product");
    projections(8192);
    return 0;
}
