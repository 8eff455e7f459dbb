/* wgmma.cuh: the Hopper (sm_90a) primitives the kernels of kernels/sm90/ share - warpgroup MMA
 * (wgmma) with shared-memory descriptors, mbarriers, named barriers and TMA tile loads - and
 * fa3_map, the TMA map of a [B, T, heads, D] bf16 tensor.
 *
 * The one thing a reader must know: shared-memory tiles [rows][D] are stored as D/64 column
 * blocks of [rows][64] bf16 (128 bytes a row), and the 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8) - the 128-byte swizzle, which TMA boxes of 64 columns write and the wgmma
 * descriptors name (PTX ISA 9.7.15). The same tile is a "K-major" operand when its columns are
 * the product's reduction dim (descriptor: lbo 16, sbo 1024, start + 32 bytes per 16
 * columns) and an "N-major" B operand when its rows are (lbo = rows * 128 between column
 * blocks, sbo 1024, start + 2048 bytes per 16 rows; transpose bit set). Tiles start on 1024
 * bytes. */
#ifndef MOE_KERNELS_SM90_WGMMA_CUH
#define MOE_KERNELS_SM90_WGMMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>

#include "../flash_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/sm90 is built for sm_90a only (see kernels/sm90 in CMakeLists.txt)"
#endif

/* The wgmma descriptor of a 128-byte-swizzled operand at shared address a, with leading
 * and stride byte offsets lbo and sbo (PTX ISA "matrix descriptor": 14-bit fields in
 * 16-byte units; swizzle mode 1 = 128 bytes in bits 62-63). */
__device__ __forceinline__ uint64_t fa3_desc(uint32_t a, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
}

/* Descriptor d advanced by `bytes` (a multiple of 16) along its start address: one add on
 * its low word, which cannot carry out of the address field (shared addresses are below
 * 2^18). A loop's descriptors as one base and constant steps, not each built from its address. */
__device__ __forceinline__ uint64_t fa3_desc_add(uint64_t d, uint32_t bytes) {
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

/* This thread's warpgroup (threadIdx.x / 128) as lane 0's, shuffled: the compiler then knows
 * it is one value in the whole warp, so a branch on it (producer or consumer) is uniform and
 * what is made from it, the wgmma descriptors above all, is computed once a warp in uniform
 * registers. Taken from threadIdx.x directly, each descriptor was built in every lane and moved
 * into uniform registers for its wgmma (R2UR; with the LOP3 and IMAD building them about a
 * third of the attention backward's instructions: ncu, H100, 2026-12-06). CUTLASS reads its
 * warp-group index the same way. */
__device__ __forceinline__ int fa3_warpgroup() {
    return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
}

__device__ __forceinline__ void fa3_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
/* setmaxnreg: a warpgroup's registers per thread, lowered (the producer's) or raised (the
 * consumers') after the launch's even split; every thread of the warpgroup executes it */
template <int N> __device__ __forceinline__ void fa3_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void fa3_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fa3_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* waits until at most N of this warpgroup's committed groups are in flight */
template <int N> __device__ __forceinline__ void fa3_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fa3_commit_wait() {
    fa3_commit();
    fa3_wait<0>();
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

/* The operand list of a wgmma accumulator d [N][4] for asm statements: 4 registers a row of d
 * (WG_F4), 16 (WG_F16: rows j .. j + 3), 64 (WG_F64: d [16][4], a warpgroup's 64 x 128 fp32
 * block) */
#define WG_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_F16(d, j) WG_F4(d, j), WG_F4(d, j + 1), WG_F4(d, j + 2), WG_F4(d, j + 3)
#define WG_F64(d) WG_F16(d, 0), WG_F16(d, 4), WG_F16(d, 8), WG_F16(d, 12)

/* d [64 rows, 64] (+)= A [64, 16] B [16, 64], both from shared memory: K-major, or with TA
 * (TB) 1 an M-major A (N-major B), whose rows are the reduction dim */
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void fa3_mma_ss(float (&d)[8][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, %35, %36;\n}\n"
                 : WG_F16(d, 0), WG_F16(d, 4)
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
}
/* d [64 rows, 32] (+)= A [64, 16] B [16, 32] from shared memory, A M-major and B N-major (their
 * rows are the reduction dim) */
__device__ __forceinline__ void fa3_mma_ss_t(float (&d)[4][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 1, 1;\n}\n"
                 : WG_F16(d, 0)
                 : "l"(a), "l"(b), "r"(acc));
}
/* d [64 rows, 64] (+)= the same with N = 64 */
__device__ __forceinline__ void fa3_mma_ss_t(float (&d)[8][4], uint64_t a, uint64_t b, int acc) {
    fa3_mma_ss<1, 1>(d, a, b, acc);
}
/* d [64 rows, 64] += A [64, 16] (registers) B [16, 64] (shared memory, N-major) */
__device__ __forceinline__ void fa3_mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_F16(d, 0), WG_F16(d, 4)
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
                 : WG_F64(d)
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
                 : WG_F64(d)
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
/* Ping-pong of NWG consumer warpgroups over a loop of steps, in a ring: each waits for its
 * turn before issuing a step's first products and passes the turn to the next once they are
 * issued, so one warpgroup's softmax or score gradients overlap the others' products. Named
 * barriers 1 .. NWG (256 threads: 128 arrive, 128 wait); warpgroup 0 goes first (the last
 * one's arrival starts the ring), and the last passes no turn after its last step, so every
 * arrival is waited for. */
template <int NWG> __device__ __forceinline__ void fa3_turn_begin(int wg) {
    if (wg == NWG - 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(1) : "memory");
}
/* one barrier instruction with the id in a register, no branch between two immediate ids:
 * the forward ran 409 TFLOP/s this way against 364 with the branch (H200, 2026-12-01) */
__device__ __forceinline__ void fa3_turn_wait(int wg) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
}
template <int NWG> __device__ __forceinline__ void fa3_turn_pass(int wg, bool last) {
    if (wg != NWG - 1 || !last)
        asm volatile("bar.arrive %0, 256;\n" ::"r"(wg + 1 < NWG ? wg + 2 : 1) : "memory");
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

/* adds the box {32 fp32 columns, 1 head, rows, 1 batch} at shared address src into the tensor
 * of `map` at (col, head, row, b) (TMA reduce-add; rows past T are dropped) */
__device__ __forceinline__ void fa3_tma_add(const CUtensorMap *map, uint32_t src, int col, int head,
                                            int row, int b) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
                 " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"((uint64_t)map),
                 "r"(col), "r"(head), "r"(row), "r"(b), "r"(src)
                 : "memory");
}
/* the bulk group of this thread's TMA stores so far: commit, then wait until their reads of
 * shared memory are done (the buffer may be reused) */
__device__ __forceinline__ void fa3_bulk_commit_wait_read() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/* waits until this thread's committed TMA stores have been performed in global memory */
__device__ __forceinline__ void fa3_bulk_wait() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
/* orders this thread's shared-memory writes before later async-proxy reads (wgmma, TMA) */
__device__ __forceinline__ void fa3_fence_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* The TMA map m of a row-major tensor p of `rank` (<= 5) dims of type dt: dims[0] the
 * contiguous one, strides[i] the bytes from one index of dim i + 1 to the next (multiples of
 * 16), boxes of box[0] x box[1] x ... elements with swizzle sw; what lies past the dims reads
 * as zeros, and a box's first element must be 16-byte aligned. 1 on success, else 0 with the
 * error recorded for op. */
int sm90_tmap(moe_cuda_ctx *c, CUtensorMap *m, const void *p, CUtensorMapDataType dt, int rank,
              const int64_t *dims, const int64_t *strides, const int *box, CUtensorMapSwizzle sw,
              const char *op);
/* The TMA map of a [B, T, NH, D] bf16 tensor p for boxes of {64 columns, 1 head, rows, 1}
 * with the 128-byte swizzle (rows past T read as zeros). 1 on success, else 0 with the error
 * recorded for op. */
int fa3_map(moe_cuda_ctx *c, CUtensorMap *m, const __nv_bfloat16 *p, int64_t B, int64_t T,
            int64_t NH, int64_t D, int rows, const char *op);
/* The same for a [B, T, NH, D] fp32 tensor and boxes of {32 columns, 1 head, rows, 1} (128
 * bytes a row, the same swizzle): the TMA reduce-adds into attention's dq. */
int fa3_map(moe_cuda_ctx *c, CUtensorMap *m, const float *p, int64_t B, int64_t T, int64_t NH,
            int64_t D, int rows, const char *op);

#endif
