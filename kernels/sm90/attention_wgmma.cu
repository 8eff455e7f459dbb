/* attention_wgmma: the causal grouped-query flash-attention forward for Hopper (sm_90a), in
 * the FlashAttention-3 design - warpgroup MMAs (wgmma) that read Q and K, and V, straight from
 * 128-byte-swizzled shared memory, the probabilities fed back from registers, fp32 softmax
 * statistics; head dims 64 and 128, GQA any ratio, document masks. The portable kernel of
 * attention_flash.cu serves every other GPU and head dim, and the whole backward.
 *
 * A block owns 128 query rows of one head: two consumer warpgroups of 64 rows and one
 * producer warp. The producer's lane 0 loads Q once and each key block's K and V with TMA
 * into NS stages (mbarriers: "full" when the bytes have landed, "empty" when all 256 consumer
 * threads are done with a stage). Each consumer warpgroup computes S = Q K^T for the block
 * with wgmma (m64 x BK), the online softmax in registers (flash_common.cuh: the same step as
 * the portable kernel), then O += P V with P as the register A operand. The two warpgroups
 * take turns to issue their score products (ping-pong), so one's softmax overlaps the
 * other's products. Key blocks before the first row's document start are skipped, those
 * after a warpgroup's last row are not multiplied. Output and lse as the portable forward:
 * bf16 values, natural-log lse of the scaled scores. Compiled for sm_90a only
 * (CMakeLists.txt); moe_cuda_fa3_supported says when it runs.
 *
 * The one thing a reader must know: shared-memory tiles [rows][D] are stored as D/64 column
 * blocks of [rows][64] bf16 (128 bytes a row), and the 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8) (the 128-byte swizzle the wgmma descriptors name). The same layout is
 * "K-major" for Q and K (S's reduction dim is D, contiguous) and "N-major" for V (PV's
 * reduction dim is the key, and V's contiguous dim D is PV's N): the TMA boxes of 64 columns
 * with the 128-byte swizzle write all three that way, and the descriptors' strides say which
 * operand form is read. PTX ISA 9.7.15 (wgmma) has the layouts. */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "../flash_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wgmma.cu is built for sm_90a only (see kernels/sm90 in CMakeLists.txt)"
#endif

typedef __nv_bfloat16 bf16;

#define FA3_BQ 128 /* query rows per block: two warpgroups of 64 */
/* Variants (-D at compile time, bench/kernels/attn_variants.sh checks and times them):
 * FA3_NS key/value stages in flight; FA3_PINGPONG 1 makes the two warpgroups take turns to
 * issue their score products (named barriers 1 and 2), so that one's softmax runs while the
 * other's products use the tensor cores. */
#ifndef FA3_NS
#define FA3_NS 2
#endif
#ifndef FA3_PINGPONG
#define FA3_PINGPONG 1
#endif
#define FA3_THREADS 288 /* two consumer warpgroups and one producer warp */

/* The wgmma descriptor of a 128-byte-swizzled operand at shared address a, with leading
 * and stride byte offsets lbo and sbo (PTX ISA "matrix descriptor": 14-bit fields in
 * 16-byte units; swizzle mode 1 = 128 bytes in bits 62-63). */
__device__ __forceinline__ uint64_t fa3_desc(uint32_t a, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void fa3_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fa3_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* Keeps the compiler from reading (or reusing) registers of an in-flight wgmma before the
 * wait above: each register passes through an empty asm ordered after it. */
template <int N> __device__ __forceinline__ void fa3_hold(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("" : "+f"(d[j][i])::"memory");
}
template <int N> __device__ __forceinline__ void fa3_hold(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("" : "+r"(a[j][i])::"memory");
}

/* d [64 rows, 64] (+)= A [64, 16] B [16, 64], both from shared memory (K-major) */
__device__ __forceinline__ void fa3_mma_ss(float (&d)[8][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(a), "l"(b), "r"(acc));
}
/* d [64 rows, 64] += A [64, 16] (registers) B [16, 64] (shared memory, N-major) */
__device__ __forceinline__ void fa3_mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* d [64 rows, 128] (+)= A [64, 16] B [16, 128], both from shared memory (K-major) */
__device__ __forceinline__ void fa3_mma_ss(float (&d)[16][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),
                   "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]),
                   "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]),
                   "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "l"(a), "l"(b), "r"(acc));
}
/* d [64 rows, 128] += A [64, 16] (registers) B [16, 128] (shared memory, N-major) */
__device__ __forceinline__ void fa3_mma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),
                   "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]),
                   "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]),
                   "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* ---- mbarriers and TMA (PTX ISA 9.7.9.24 and 9.7.9.25) ---- */

__device__ __forceinline__ void fa3_bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* the producer's arrival that also expects `bytes` of TMA writes before the phase ends */
__device__ __forceinline__ void fa3_bar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void fa3_bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* waits until the phase of parity `parity` of the barrier has completed */
__device__ __forceinline__ void fa3_bar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nFA3_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra FA3_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* named barriers 1 and 2 between the two consumer warpgroups (256 threads: 128 arrive,
 * 128 wait) */
__device__ __forceinline__ void fa3_named_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void fa3_named_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
/* one TMA box {64 columns, 1 head, rows, 1 batch} of the tensor map at (col, head, row, b)
 * into shared address dst, completing on bar */
__device__ __forceinline__ void fa3_tma(uint32_t dst, const CUtensorMap *map, int col, int head,
                                        int row, int b, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(head), "r"(row), "r"(b), "r"(bar)
                 : "memory");
}
/* a [rows][D] tile (D/64 boxes of [rows][64], the layout above) of head `head` from row `row` */
template <int D>
__device__ __forceinline__ void fa3_tma_tile(uint32_t dst, const CUtensorMap *map, int rows,
                                             int head, int64_t row, int b, uint32_t bar) {
#pragma unroll
    for (int a = 0; a < D / 64; a++)
        fa3_tma(dst + a * rows * 128, map, a * 64, head, (int)row, b, bar);
}

/* out [B, T, H, D] (TO: float holding bf16 values, or bf16), lse [B, H, T]; q/k/v: tensor
 * maps of [B, T, H or KV, D] bf16 (fa3_map); dstart [B, T] or NULL; grid (T / 128, B * H).
 * Threads 0-255 are the two consumer warpgroups, warp 8 the producer: its lane 0 issues the
 * TMA loads of Q and of each key block's K and V into NS stages (full barriers: the bytes
 * have landed; empty barriers: all 256 consumer threads are done with a stage). */
template <int D, int BK, int NS, typename TO>
__global__ void __launch_bounds__(FA3_THREADS, 1)
    k_fa3_fwd(TO *__restrict__ out, float *__restrict__ lse, const __grid_constant__ CUtensorMap mq,
              const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv,
              const int32_t *__restrict__ dstart, int64_t T, int H, int KV, float scale) {
    extern __shared__ __align__(16) unsigned char fa3_smem[];
    /* swizzled tiles start on 1024 bytes: Q [128][D], K [NS][BK][D], V [NS][BK][D], then the
     * barriers: q_full, k_full[NS], v_full[NS], empty[NS] */
    constexpr uint32_t TILE = BK * D * 2;
    const uint32_t sQ = (smem_u32(fa3_smem) + 1023u) & ~1023u;
    const uint32_t sKb = sQ + FA3_BQ * D * 2, sVb = sKb + NS * TILE;
    const uint32_t bq = sVb + NS * TILE, bk = bq + 8, bv = bk + 8 * NS, be = bv + 8 * NS;
    const int qb = gridDim.x - 1 - blockIdx.x; /* longest (diagonal-most) blocks first */
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * FA3_BQ;
    const int kb_last = (int)(((q0 + FA3_BQ < T ? q0 + FA3_BQ : T) - 1) / BK);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int kb_first = dsb ? dsb[q0] / BK : 0;
    if (threadIdx.x == 0) {
        fa3_bar_init(bq, 1);
        for (int s = 0; s < NS; s++) {
            fa3_bar_init(bk + 8 * s, 1);
            fa3_bar_init(bv + 8 * s, 1);
            fa3_bar_init(be + 8 * s, 2 * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (threadIdx.x >= 256) { /* the producer warp */
        if (threadIdx.x != 256) return;
        fa3_bar_expect(bq, FA3_BQ * D * 2);
        fa3_tma_tile<D>(sQ, &mq, FA3_BQ, h, q0, b, bq);
        for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) {
            const int s = it % NS;
            if (it >= NS) fa3_bar_wait(be + 8 * s, ((it / NS) - 1) & 1);
            fa3_bar_expect(bk + 8 * s, TILE);
            fa3_tma_tile<D>(sKb + s * TILE, &mk, BK, hk, (int64_t)kb * BK, b, bk + 8 * s);
            fa3_bar_expect(bv + 8 * s, TILE);
            fa3_tma_tile<D>(sVb + s * TILE, &mv, BK, hk, (int64_t)kb * BK, b, bv + 8 * s);
        }
        return;
    }

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t wrow = q0 + wg * 64; /* this warpgroup's first row */
    const int64_t row0 = wrow + warp * 16 + g, row1 = row0 + 8;
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float sl2 = scale * FA_LOG2E;
    fa3_bar_wait(bq, 0);
    if (FA3_PINGPONG && wg == 1) fa3_named_arrive(1); /* warpgroup 0 goes first */

    for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) {
        const int64_t k0 = (int64_t)kb * BK;
        const int s = it % NS;
        const uint32_t parity = (it / NS) & 1;
        if (FA3_PINGPONG) fa3_named_sync(1 + wg);
        if (k0 <= wrow + 63) { /* a key block after all of this warpgroup's rows is skipped */
            const uint32_t sK = sKb + s * TILE, sV = sVb + s * TILE;
            float sc[BK / 8][4];
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
                sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            fa3_bar_wait(bk + 8 * s, parity);
            fa3_fence();
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) { /* 16 columns of D: 32 bytes in a 128-byte row */
                const uint32_t col = (uint32_t)(ks & 3) * 32;
                const uint64_t da =
                    fa3_desc(sQ + (ks >> 2) * FA3_BQ * 128 + wg * 64 * 128 + col, 16, 1024);
                const uint64_t db = fa3_desc(sK + (ks >> 2) * BK * 128 + col, 16, 1024);
                fa3_mma_ss(sc, da, db, ks > 0);
            }
            if (FA3_PINGPONG && (wg == 0 || kb < kb_last)) fa3_named_arrive(2 - wg);
            fa3_commit_wait();
            fa3_hold(sc);
            fa_softmax_block<BK, D>(sc, o, m0, m1, l0, l1, k0, row0, row1, st0, st1, sl2, t,
                                    dsb || k0 + BK - 1 > wrow);
            uint32_t p[BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                c_to_a(p[kk], sc, kk);
            fa3_bar_wait(bv + 8 * s, parity);
            fa3_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) /* 16 keys: 16 rows of 128 bytes */
                fa3_mma_rs(o, p[kk], fa3_desc(sV + kk * 16 * 128, BK * 128, 1024));
            fa3_commit_wait();
            fa3_hold(o);
            fa3_hold(p);
        } else if (FA3_PINGPONG) {
            fa3_named_arrive(2 - wg); /* (only warpgroup 0 skips blocks: never the last) */
        }
        fa3_bar_arrive(be + 8 * s); /* this thread is done with stage s */
    }
    const int64_t qstride = (int64_t)H * D;
    fa_store_rows<D>(out + (int64_t)b * T * qstride + (int64_t)h * D, lse + (int64_t)bh * T, o, m0,
                     m1, l0, l1, row0, row1, T, qstride, t);
}

/* The TMA map of a [B, T, NH, D] bf16 tensor for boxes of {64 columns, 1 head, rows, 1}
 * with the 128-byte swizzle (rows past T read as zeros). 1 on success. */
static int fa3_map(moe_cuda_ctx *c, CUtensorMap *m, const bf16 *p, int64_t B, int64_t T, int64_t NH,
                   int64_t D, int rows) {
    const char *op = "attention_forward";
    if (!c->tmap_encode) {
        cudaDriverEntryPointQueryResult res;
        if (!moe_cuda_check(c,
                            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled",
                                                             &c->tmap_encode, 12000,
                                                             cudaEnableDefault, &res),
                            op, "cuTensorMapEncodeTiled"))
            return 0;
    }
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)NH, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)(D * 2), (cuuint64_t)(NH * D * 2),
                                   (cuuint64_t)(T * NH * D * 2)};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, estr[4] = {1, 1, 1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode)(
        m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)p, dims, strides, box, estr,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return 1;
    return moe_cuda_check(c, cudaErrorInvalidValue, op,
                          "tensor map B=%lld T=%lld NH=%lld D=%lld: CUresult %d", (long long)B,
                          (long long)T, (long long)NH, (long long)D, (int)r);
}

int moe_cuda_fa3_supported(const moe_cuda_ctx *c, int64_t D, const void *q, const void *k,
                           const void *v) {
    return c->sm == 90 && (D == 64 || D == 128) &&
           (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0; /* TMA: 16-byte aligned */
}

template <int D, int BK, int NS, typename TO>
static void fa3_launch(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                       const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                       int64_t KV) {
    const char *op = "attention_forward";
    CUtensorMap mq, mk, mv;
    if (!fa3_map(c, &mq, q, B, T, H, D, FA3_BQ) || !fa3_map(c, &mk, k, B, T, KV, D, BK) ||
        !fa3_map(c, &mv, v, B, T, KV, D, BK))
        return;
    const size_t smem = (size_t)(FA3_BQ + 2 * NS * BK) * D * sizeof(bf16) + 1024 + 8 * (1 + 3 * NS);
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_fa3_fwd<D, BK, NS, TO>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        op, "shared memory %zu bytes", smem))
        return;
    dim3 grid((unsigned)((T + FA3_BQ - 1) / FA3_BQ), (unsigned)(B * H));
    k_fa3_fwd<D, BK, NS, TO><<<grid, FA3_THREADS, smem, c->stream>>>(
        out, lse, mq, mk, mv, dstart, T, (int)H, (int)KV, 1.0f / sqrtf((float)D));
    MOE_CUDA_LAUNCHED(c, op, "wgmma: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B, (long long)T,
                      (long long)H, (long long)KV, D);
}

template <typename TO>
static void fa3_forward_as(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                           const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D) {
    if (D == 64)
        fa3_launch<64, 128, FA3_NS>(c, out, lse, q, k, v, dstart, B, T, H, KV);
    else
        fa3_launch<128, 128, FA3_NS>(c, out, lse, q, k, v, dstart, B, T, H, KV);
}

void moe_cuda_fa3_forward(moe_cuda_ctx *c, moe_buf out, float *lse, const bf16 *q, const bf16 *k,
                          const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                          int64_t KV, int64_t D) {
    if (out.dt == MOE_DTYPE_BF16)
        fa3_forward_as(c, (bf16 *)out.p, lse, q, k, v, dstart, B, T, H, KV, D);
    else
        fa3_forward_as(c, (float *)out.p, lse, q, k, v, dstart, B, T, H, KV, D);
}
