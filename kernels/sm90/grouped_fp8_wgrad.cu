/* grouped_fp8_wgrad.cu: the launcher of the fp8-block experts' weight gradient
 * (grouped_fp8_wgrad.cuh) for the backend (gemm_cublaslt.cu's fp8_grouped_backward): one launch
 * over all experts where cuBLASLt needs a call per expert. Compiled for sm_90a only
 * (CMakeLists.txt); moe_cuda_grouped_fp8_wgrad_supported says when it runs. */
#include "grouped_fp8_wgrad.cuh"

#define GW_NH 2       /* 128 x 256 tiles: 735-753 TFLOP/s against 666-692 at 128 x 128 */
#define GW_EPI GW_TMA /* the epilogue: see grouped_fp8_wgrad.cuh */

/* A single group is a dense product, for which cuBLASLt stays (as in the forward). */
int moe_cuda_grouped_fp8_wgrad_supported(const moe_cuda_ctx *c, int64_t E, const float *dw) {
    return c->sm == 90 && E >= 2 && E <= GG_MAXE && ((uintptr_t)dw & 15) == 0;
}

int moe_cuda_grouped_fp8_wgrad(moe_cuda_ctx *c, float *dw, float beta, const uint8_t *dyt,
                               const float *ds, const uint8_t *xt, const float *xs,
                               const int32_t *offsets, int64_t E, int64_t O, int64_t I,
                               const char *op) {
    gg_offsets pb; /* the padded token offsets, multiples of 128 */
    pb.o[0] = 0;
    for (int64_t e = 0; e < E; e++)
        pb.o[e + 1] = pb.o[e] + (int32_t)moe_cuda_fp8_pad(offsets[e + 1] - offsets[e]);
    const int64_t Mpad = pb.o[E];
    if (Mpad == 0) return 1;
    /* dyt [O, Mpad] and xt [I, Mpad] e4m3 in boxes of 128 tokens by 128 or 256 rows with the
     * 128-byte swizzle; dw [E, O, I] fp32 in boxes of 32 columns by 64 rows of one expert */
    const int64_t ddy[2] = {Mpad, O}, dxt[2] = {Mpad, I}, sld[1] = {Mpad};
    const int64_t ddw[3] = {I, O, E}, sdw[2] = {I * 4, O * I * 4};
    const int bdy[2] = {GF_BK, GF_BM}, bxt[2] = {GF_BK, GF_BN(GW_NH)}, bdw[3] = {32, 64, 1};
    CUtensorMap mdy, mxt, mdw;
    if (!sm90_tmap(c, &mdy, dyt, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, ddy, sld, bdy,
                   CU_TENSOR_MAP_SWIZZLE_128B, op) ||
        !sm90_tmap(c, &mxt, xt, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dxt, sld, bxt,
                   CU_TENSOR_MAP_SWIZZLE_128B, op) ||
        !sm90_tmap(c, &mdw, dw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ddw, sdw, bdw,
                   CU_TENSOR_MAP_SWIZZLE_128B, op))
        return 0;
    const int smem = GW_SMEM(GW_NH, GW_EPI);
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_grouped_fp8_wgrad<GW_NH, GW_EPI>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                        op, "shared memory %d bytes", smem))
        return 0;
    k_grouped_fp8_wgrad<GW_NH, GW_EPI><<<c->num_sms, GF_THREADS, smem, c->stream>>>(
        dw, mdy, mxt, mdw, ds, xs, pb, (int)E, (int)O, (int)I, beta != 0.0f);
    return MOE_CUDA_LAUNCHED(c, op, "grouped fp8 wgrad E=%lld O=%lld I=%lld", (long long)E,
                             (long long)O, (long long)I);
}
