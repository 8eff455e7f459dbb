/* grouped_fp8.cu: the launcher of the grouped block-scaled fp8 expert product (grouped_fp8.cuh)
 * for the backend's fp8-block recipe (gemm_cublaslt.cu): one launch over all experts where
 * cuBLASLt needs a call per expert and a 16-row tail product per expert. Compiled for sm_90a
 * only (CMakeLists.txt); moe_cuda_grouped_fp8_supported says when it runs. */
#include "grouped_fp8.cuh"

#define GF_NH                                                                                      \
    2 /* 128 x 256 tiles: 1,105-1,223 TFLOP/s at w2's shape against 998-1,023 at                   \
         128 x 128, the same at w1's (H200, 2026-12-04) */

/* A single group is a dense product, which cuBLASLt runs faster (1,134-1,179 TFLOP/s at the
 * same flops, against 998-1,223 here). */
int moe_cuda_grouped_fp8_fits(const moe_cuda_ctx *c, int64_t E, const void *y, const void *wq,
                              const float *sw) {
    return c->sm == 90 && E >= 1 && E <= GG_MAXE &&
           (((uintptr_t)y | (uintptr_t)wq | (uintptr_t)sw) & 15) == 0;
}
int moe_cuda_grouped_fp8_supported(const moe_cuda_ctx *c, int64_t E, const void *y, const void *wq,
                                   const float *sw) {
    return E >= 2 && moe_cuda_grouped_fp8_fits(c, E, y, wq, sw);
}

template <typename TO>
static int launch(moe_cuda_ctx *c, TO *y, const gf_source &a, const gf_source &b,
                  const gg_offsets &off, int E, int N, int K, int beta, int nsrc, const char *op) {
    const int smem = GF_SMEM(GF_NH);
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_grouped_fp8<GF_NH, TO>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                        op, "shared memory %d bytes", smem))
        return 0;
    k_grouped_fp8<GF_NH, TO>
        <<<c->num_sms, GF_THREADS, smem, c->stream>>>(y, a, b, off, E, N, K, beta, nsrc);
    return MOE_CUDA_LAUNCHED(c, op, "grouped fp8 E=%d N=%d K=%d (%d products)", E, N, K, nsrc);
}

/* The sum of the nsrc products xq[j] wq[j]^T (moe_cuda_grouped_fp8's operands, j < nsrc),
 * in one launch. */
static int grouped(moe_cuda_ctx *c, moe_buf y, float beta, int nsrc, const uint8_t *const *xq,
                   const float *const *sx, int64_t lds, const uint8_t *const *wq,
                   const float *const *sw, const int32_t *offsets, int64_t E, int64_t N, int64_t K,
                   const char *op) {
    const int64_t M = offsets[E], KB = (K + GF_BK - 1) / GF_BK;
    /* xq [M, K] and wq [E * N, K] e4m3 in boxes of 128 bytes of K by 128 or 256 rows with the
     * 128-byte swizzle; sx [KB, lds] fp32 in boxes of GF_SX_BOX rows (those past M read 0) */
    const int64_t dx[2] = {K, M}, dw[2] = {K, E * N}, dsx[2] = {M, KB}, sk[1] = {K},
                  ssx[1] = {lds * (int64_t)sizeof(float)};
    const int bx[2] = {GF_BK, GF_BM}, bw[2] = {GF_BK, GF_BN(GF_NH)}, bs[2] = {GF_SX_BOX, 1};
    gf_source src[2];
    for (int j = 0; j < nsrc; j++) {
        if (!sm90_tmap(c, &src[j].mx, xq[j], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dx, sk, bx,
                       CU_TENSOR_MAP_SWIZZLE_128B, op) ||
            !sm90_tmap(c, &src[j].mw, wq[j], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dw, sk, bw,
                       CU_TENSOR_MAP_SWIZZLE_128B, op) ||
            !sm90_tmap(c, &src[j].ms, sx[j], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dsx, ssx, bs,
                       CU_TENSOR_MAP_SWIZZLE_NONE, op))
            return 0;
        src[j].sw = sw[j];
    }
    if (nsrc == 1) src[1] = src[0]; /* never read */
    if (y.dt == MOE_DTYPE_BF16 && beta != 0.0f)
        return moe_cuda_check(c, cudaErrorInvalidValue, op, "a bf16 output is written, not added");
    gg_offsets off;
    for (int64_t e = 0; e <= E; e++)
        off.o[e] = offsets[e];
    if (y.dt == MOE_DTYPE_BF16)
        return launch(c, (bf16 *)y.p, src[0], src[1], off, (int)E, (int)N, (int)K, 0, nsrc, op);
    return launch(c, (float *)y.p, src[0], src[1], off, (int)E, (int)N, (int)K, beta != 0.0f, nsrc,
                  op);
}

int moe_cuda_grouped_fp8(moe_cuda_ctx *c, moe_buf y, float beta, const uint8_t *xq, const float *sx,
                         int64_t lds, const uint8_t *wq, const float *sw, const int32_t *offsets,
                         int64_t E, int64_t N, int64_t K, const char *op) {
    return grouped(c, y, beta, 1, &xq, &sx, lds, &wq, &sw, offsets, E, N, K, op);
}

int moe_cuda_grouped_fp8_sum(moe_cuda_ctx *c, moe_buf y, const uint8_t *const xq[2],
                             const float *const sx[2], int64_t lds, const uint8_t *const wq[2],
                             const float *const sw[2], const int32_t *offsets, int64_t E, int64_t N,
                             int64_t K, const char *op) {
    return grouped(c, y, 0.0f, 2, xq, sx, lds, wq, sw, offsets, E, N, K, op);
}
