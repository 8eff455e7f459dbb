/* attention_wgmma: the causal grouped-query flash-attention forward for Hopper (sm_90a), in
 * the FlashAttention-3 design - warpgroup MMAs (wgmma) that read Q and K, and V, straight from
 * 128-byte-swizzled shared memory, the probabilities fed back from registers, fp32 softmax
 * statistics; head dims 64 and 128, GQA any ratio, document masks. The portable kernel of
 * attention_flash.cu serves every other GPU and head dim, and the whole backward.
 *
 * A block owns 128 query rows of one head: two warpgroups of 64 rows, each computing
 * S = Q K^T for a key block with wgmma (m64 x BK), the online softmax in registers
 * (flash_common.cuh: the same step as the portable kernel), then O += P V with P as the
 * register A operand. All 256 threads stream the K and V blocks in with cp.async, double-
 * buffered; the key blocks before the first row's document start are skipped, those after
 * a warpgroup's last row are not multiplied. Output and lse as the portable forward: bf16
 * values, natural-log lse of the scaled scores. Compiled for sm_90a only (CMakeLists.txt);
 * moe_cuda_fa3_supported says when it runs.
 *
 * The one thing a reader must know: shared-memory tiles [rows][D] are stored as D/64 column
 * blocks of [rows][64] bf16 (128 bytes a row), and the 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8) (the 128-byte swizzle the wgmma descriptors name). The same layout is
 * "K-major" for Q and K (S's reduction dim is D, contiguous) and "N-major" for V (PV's
 * reduction dim is the key, and V's contiguous dim D is PV's N): one loader serves all three,
 * and the descriptor's strides say which. PTX ISA 9.7.15 (wgmma) has the layouts. */
#include "../flash_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wgmma.cu is built for sm_90a only (see kernels/sm90 in CMakeLists.txt)"
#endif

typedef __nv_bfloat16 bf16;

#define FA3_BQ 128 /* query rows per block: two warpgroups of 64 */
#define FA3_THREADS 256

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

/* Starts copying rows [row0, row0 + rows) of a [*, stride] bf16 tensor (D columns) into the
 * swizzled tile at shared address s (layout above); rows >= T are zero-filled. The caller
 * commits the group and waits for it. */
template <int D>
__device__ __forceinline__ void fa3_cp_tile(uint32_t s, const bf16 *g, int rows, int64_t row0,
                                            int64_t T, int64_t stride) {
    constexpr int chunks = D / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        int r = i / chunks, c = i % chunks;
        int ok = row0 + r < T;
        const bf16 *src = ok ? g + (row0 + r) * stride + c * 8 : g;
        uint32_t dst = s + (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(ok ? 16 : 0));
    }
}

/* out [B, T, H, D] (TO: float holding bf16 values, or bf16), lse [B, H, T], q [B, T, H, D],
 * k/v [B, T, KV, D], dstart [B, T] or NULL; grid (T / 128 blocks, B * H), BK keys a block */
template <int D, int BK, typename TO>
__global__ void __launch_bounds__(FA3_THREADS, D == 64 ? 2 : 1)
    k_fa3_fwd(TO *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
              const bf16 *__restrict__ k, const bf16 *__restrict__ v,
              const int32_t *__restrict__ dstart, int64_t T, int H, int KV, float scale) {
    extern __shared__ __align__(16) unsigned char fa3_smem[];
    /* swizzled tiles must start on 1024 bytes: Q [128][D], then K [2][BK][D], V [2][BK][D] */
    const uint32_t sQ = (smem_u32(fa3_smem) + 1023u) & ~1023u;
    const uint32_t sKb = sQ + FA3_BQ * D * 2, sVb = sKb + 2 * BK * D * 2;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int qb = gridDim.x - 1 - blockIdx.x; /* longest (diagonal-most) blocks first */
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / KV);
    const int64_t q0 = (int64_t)qb * FA3_BQ;
    const int64_t qstride = (int64_t)H * D, kstride = (int64_t)KV * D;
    const bf16 *kg = k + (int64_t)b * T * kstride + (int64_t)hk * D;
    const bf16 *vg = v + (int64_t)b * T * kstride + (int64_t)hk * D;
    const int kb_last = (int)(((q0 + FA3_BQ < T ? q0 + FA3_BQ : T) - 1) / BK);
    const int32_t *dsb = dstart ? dstart + (int64_t)b * T : NULL;
    const int kb_first = dsb ? dsb[q0] / BK : 0;
    fa3_cp_tile<D>(sQ, q + (int64_t)b * T * qstride + (int64_t)h * D, FA3_BQ, q0, T, qstride);
    fa3_cp_tile<D>(sKb, kg, BK, (int64_t)kb_first * BK, T, kstride);
    fa3_cp_tile<D>(sVb, vg, BK, (int64_t)kb_first * BK, T, kstride);
    cp_commit();

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t wrow = q0 + wg * 64; /* this warpgroup's first row */
    const int64_t row0 = wrow + warp * 16 + g, row1 = row0 + 8;
    const int64_t st0 = dsb && row0 < T ? dsb[row0] : 0, st1 = dsb && row1 < T ? dsb[row1] : 0;
    const float sl2 = scale * FA_LOG2E;

    for (int kb = kb_first, it = 0; kb <= kb_last; kb++, it++) { /* buffer it & 1 holds kb */
        const int64_t k0 = (int64_t)kb * BK;
        if (kb < kb_last) {
            const uint32_t nb = (uint32_t)((it + 1) & 1) * BK * D * 2;
            fa3_cp_tile<D>(sKb + nb, kg, BK, k0 + BK, T, kstride);
            fa3_cp_tile<D>(sVb + nb, vg, BK, k0 + BK, T, kstride);
        }
        cp_commit();
        cp_wait<1>();
        /* the tile written by cp.async (generic proxy) is read by wgmma (async proxy) */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (k0 <= wrow + 63) { /* a key block after all of this warpgroup's rows is skipped */
            const uint32_t sK = sKb + (uint32_t)(it & 1) * BK * D * 2;
            const uint32_t sV = sVb + (uint32_t)(it & 1) * BK * D * 2;
            float s[BK / 8][4];
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            fa3_fence();
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) { /* 16 columns of D: 32 bytes in a 128-byte row */
                const uint32_t col = (uint32_t)(ks & 3) * 32;
                const uint64_t da =
                    fa3_desc(sQ + (ks >> 2) * FA3_BQ * 128 + wg * 64 * 128 + col, 16, 1024);
                const uint64_t db = fa3_desc(sK + (ks >> 2) * BK * 128 + col, 16, 1024);
                fa3_mma_ss(s, da, db, ks > 0);
            }
            fa3_commit_wait();
            fa3_hold(s);
            fa_softmax_block<BK, D>(s, o, m0, m1, l0, l1, k0, row0, row1, st0, st1, sl2, t,
                                    dsb || k0 + BK - 1 > wrow);
            uint32_t p[BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                c_to_a(p[kk], s, kk);
            fa3_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) /* 16 keys: 16 rows of 128 bytes */
                fa3_mma_rs(o, p[kk], fa3_desc(sV + kk * 16 * 128, BK * 128, 1024));
            fa3_commit_wait();
            fa3_hold(o);
            fa3_hold(p);
        }
        __syncthreads(); /* all reads of this buffer are done before it is refilled */
    }
    fa_store_rows<D>(out + (int64_t)b * T * qstride + (int64_t)h * D, lse + (int64_t)bh * T, o, m0,
                     m1, l0, l1, row0, row1, T, qstride, t);
}

int moe_cuda_fa3_supported(const moe_cuda_ctx *c, int64_t D) {
    return c->sm == 90 && (D == 64 || D == 128);
}

template <int D, int BK, typename TO>
static void fa3_launch(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                       const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                       int64_t KV) {
    const char *op = "attention_forward";
    const size_t smem = (size_t)(FA3_BQ + 4 * BK) * D * sizeof(bf16) + 1024;
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_fa3_fwd<D, BK, TO>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        op, "shared memory %zu bytes", smem))
        return;
    dim3 grid((unsigned)((T + FA3_BQ - 1) / FA3_BQ), (unsigned)(B * H));
    k_fa3_fwd<D, BK, TO><<<grid, FA3_THREADS, smem, c->stream>>>(
        out, lse, q, k, v, dstart, T, (int)H, (int)KV, 1.0f / sqrtf((float)D));
    MOE_CUDA_LAUNCHED(c, op, "wgmma: B=%lld T=%lld H=%lld KV=%lld D=%d", (long long)B, (long long)T,
                      (long long)H, (long long)KV, D);
}

template <typename TO>
static void fa3_forward_as(moe_cuda_ctx *c, TO *out, float *lse, const bf16 *q, const bf16 *k,
                           const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D) {
    if (D == 64)
        fa3_launch<64, 64>(c, out, lse, q, k, v, dstart, B, T, H, KV);
    else
        fa3_launch<128, 128>(c, out, lse, q, k, v, dstart, B, T, H, KV);
}

void moe_cuda_fa3_forward(moe_cuda_ctx *c, moe_buf out, float *lse, const bf16 *q, const bf16 *k,
                          const bf16 *v, const int32_t *dstart, int64_t B, int64_t T, int64_t H,
                          int64_t KV, int64_t D) {
    if (out.dt == MOE_DTYPE_BF16)
        fa3_forward_as(c, (bf16 *)out.p, lse, q, k, v, dstart, B, T, H, KV, D);
    else
        fa3_forward_as(c, (float *)out.p, lse, q, k, v, dstart, B, T, H, KV, D);
}
