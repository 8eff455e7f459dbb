/* grouped_common.cuh: what the grouped expert-product playgrounds (grouped_gemm.cu, bf16;
 * grouped_fp8.cu, block-scaled e4m3) share beyond kernels/sm90/grouped.cuh (the scheduler,
 * the TMA copies, the stores, which the backend's grouped products use too): the bf16
 * playground's block size and the host's tensor-map encoder. In grouped_gemm.cu the producer
 * is one warp (GG_THREADS); in grouped_fp8.cu a warpgroup, whose registers setmaxnreg hands
 * to the consumers. */
#ifndef MOE_BENCH_KERNELS_GROUPED_COMMON_CUH
#define MOE_BENCH_KERNELS_GROUPED_COMMON_CUH

#include "playground.cuh"
#include "sm90/grouped.cuh"

#define GG_THREADS 288 /* two consumer warpgroups and the producer warp */

/* ---- host ---- */

/* The TMA map of a row-major tensor p of `rank` (2 or 3) dims of type dt, dims[0] the
 * contiguous one, strides[i] the bytes from one index of dim i + 1 to the next (multiples of 16),
 * for boxes {box0, box1(, 1)} with swizzle sw; what lies past the dims reads as zeros. */
static inline CUtensorMap gg_map(const void *p, CUtensorMapDataType dt, int rank,
                                 const int64_t *dims, const int64_t *strides, int box0, int box1,
                                 CUtensorMapSwizzle sw) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc;
    if (!enc) {
        cudaDriverEntryPointQueryResult res;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                            cudaEnableDefault, &res));
    }
    CUtensorMap m;
    const cuuint64_t d[3] = {(cuuint64_t)dims[0], (cuuint64_t)dims[1],
                             (cuuint64_t)(rank > 2 ? dims[2] : 1)};
    const cuuint64_t st[2] = {(cuuint64_t)strides[0], (cuuint64_t)(rank > 2 ? strides[1] : 0)};
    const cuuint32_t box[3] = {(cuuint32_t)box0, (cuuint32_t)box1, 1}, estr[3] = {1, 1, 1};
    CUresult r =
        enc(&m, dt, (cuuint32_t)rank, (void *)p, d, st, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
            sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return m;
}

#endif
