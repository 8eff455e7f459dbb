/* flash_common.cuh: what the two bf16 flash-attention forward kernels share - the portable
 * one (attention_flash.cu, mma.sync) and the Hopper one (sm90/attention_wgmma.cu, wgmma):
 * bf16 packing, cp.async groups, the online-softmax step over one key block and the store of
 * the normalised output rows and their log-sum-exp; and the backward kernels' score
 * gradients (by rows for dq, transposed for dk/dv) and gradient accumulation.
 *
 * The one thing a reader must know: both kernels hold scores and outputs in the accumulator
 * layout of m16n8 tiles (mma.sync's C fragment, which is also wgmma's per warp): with
 * g = lane / 4 and t = lane % 4, tile nt holds rows g and g + 8, columns nt * 8 + 2t and
 * + 1, as acc[nt][0..1] (row g) and acc[nt][2..3] (row g + 8). A thread owns two query rows. */
#ifndef MOE_KERNELS_FLASH_COMMON_CUH
#define MOE_KERNELS_FLASH_COMMON_CUH

#include <math.h>

#include "backend_cuda.cuh"

#define FA_LOG2E 1.4426950408889634f

/* 2^x on the special-function unit with subnormal results flushed to zero (exp2f is the same
 * instruction wrapped in a range test and two multiplies that keep subnormal results): a
 * probability below 2^-126 is 0, every other one has exp2f's value */
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* A fragment (k block kk of 16 columns) from C accumulators of 8-column tiles acc[nt][4] */
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (*acc)[4], int kk) {
    a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Two adjacent output values: fp32 as a float2, bf16 (rounded to nearest) as a bf16x2. */
__device__ __forceinline__ void fa_st2(float *p, float a, float b) {
    *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}
__device__ __forceinline__ void fa_st2(__nv_bfloat16 *p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
}

/* Masks this thread's raw scores s [NK/8][4] of keys k0.. for its rows row0 and row1 = row0 +
 * 8 (document starts st0, st1): a key after the row or before its document start becomes
 * -inf. In 32 bits: a row sees the block's columns c with lo <= c <= hi, both clamped to
 * [-1, NK]. One call under one branch (`if (mask)`): a test per tile compiled to a branch
 * per tile, 16 in a block of 128 keys (SASS of 2026-12-07). */
__device__ __forceinline__ int fa_rel(int64_t x, int nk) {
    return (int)(x < -1 ? -1 : x > nk ? nk : x);
}
template <int NK>
__device__ __forceinline__ void fa_mask_rows(float (*s)[4], int64_t k0, int64_t row0, int64_t row1,
                                             int64_t st0, int64_t st1, int t) {
    const int hi0 = fa_rel(row0 - k0, NK), hi1 = fa_rel(row1 - k0, NK);
    const int lo0 = fa_rel(st0 - k0, NK), lo1 = fa_rel(st1 - k0, NK);
#pragma unroll
    for (int nt = 0; nt < NK / 8; nt++) {
        const int c = nt * 8 + 2 * t;
        s[nt][0] = c <= hi0 && c >= lo0 ? s[nt][0] : -INFINITY;
        s[nt][1] = c + 1 <= hi0 && c + 1 >= lo0 ? s[nt][1] : -INFINITY;
        s[nt][2] = c <= hi1 && c >= lo1 ? s[nt][2] : -INFINITY;
        s[nt][3] = c + 1 <= hi1 && c + 1 >= lo1 ? s[nt][3] : -INFINITY;
    }
}

/* One key block of the online softmax for this thread's rows row0 and row1 = row0 + 8:
 * s [NK/8][4] raw scores of keys k0.. (replaced by the probabilities exp2(s * sl2 - max),
 * not yet rounded), m/l the running max (log2 units) and sum, a0/a1 get the factors that take
 * the rows' output accumulators to the new max (fa_rescale). Keys after a row or before its
 * document start st are masked when `mask` (a block that holds none of them may skip it: the
 * same arithmetic). */
template <int NK>
__device__ __forceinline__ void fa_softmax_block(float (*s)[4], float &m0, float &m1, float &l0,
                                                 float &l1, float &a0, float &a1, int64_t k0,
                                                 int64_t row0, int64_t row1, int64_t st0,
                                                 int64_t st1, float sl2, int t, bool mask) {
    /* raw scores: the scale (> 0) keeps the order, it enters with the exponent */
    if (mask) fa_mask_rows<NK>(s, k0, row0, row1, st0, st1, t);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NK / 8; nt++) {
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2)) * sl2; /* log2 units */
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2)) * sl2;
    /* a row whose keys in this block are all masked keeps its max, so exp2 gives p = 0 and
     * alpha = 1. Without a mask that max is finite (the first block holds key 0 <= row); a
     * row whose document starts after every key seen so far still has max -inf: it
     * subtracts 0 instead (p = 0, alpha = 0, no -inf - -inf = NaN) */
    float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float r0 = mn0 == -INFINITY ? 0.0f : mn0, r1 = mn1 == -INFINITY ? 0.0f : mn1;
    a0 = fa_exp2(m0 - r0);
    a1 = fa_exp2(m1 - r1);
    m0 = mn0;
    m1 = mn1;
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NK / 8; nt++) {
        s[nt][0] = fa_exp2(fmaf(s[nt][0], sl2, -r0)); /* one FFMA: scale and subtract */
        s[nt][1] = fa_exp2(fmaf(s[nt][1], sl2, -r0));
        s[nt][2] = fa_exp2(fmaf(s[nt][2], sl2, -r1));
        s[nt][3] = fa_exp2(fmaf(s[nt][3], sl2, -r1));
        ls0 += s[nt][0] + s[nt][1];
        ls1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * a0 + ls0;
    l1 = l1 * a1 + ls1;
}

/* o [N][4]: this thread's output accumulators of rows row0 (a0) and row1 (a1) */
template <int N> __device__ __forceinline__ void fa_rescale(float (*o)[4], float a0, float a1) {
#pragma unroll
    for (int nt = 0; nt < N; nt++) {
        o[nt][0] *= a0;
        o[nt][1] *= a0;
        o[nt][2] *= a1;
        o[nt][3] *= a1;
    }
}

/* Stores this thread's two normalised output rows (og: the head's column 0 of row 0, rows
 * qstride apart; rows >= T are not stored) rounded to bf16 values, and their log-sum-exp
 * (natural log) into lg [T] from the running max m (log2 units) and sum l of each row. */
template <int D, typename TO>
__device__ __forceinline__ void fa_store_rows(TO *og, float *lg, const float (*o)[4], float m0,
                                              float m1, float l0, float l1, int64_t row0,
                                              int64_t row1, int64_t T, int64_t qstride, int t) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        int col = nt * 8 + 2 * t;
        float v00 = moe_dev_round_bf16(o[nt][0] * inv0), v01 = moe_dev_round_bf16(o[nt][1] * inv0);
        float v10 = moe_dev_round_bf16(o[nt][2] * inv1), v11 = moe_dev_round_bf16(o[nt][3] * inv1);
        if (row0 < T) fa_st2(og + row0 * qstride + col, v00, v01);
        if (row1 < T) fa_st2(og + row1 * qstride + col, v10, v11);
    }
    if (t == 0) {
        if (row0 < T) lg[row0] = (m0 + log2f(l0)) / FA_LOG2E;
        if (row1 < T) lg[row1] = (m1 + log2f(l1)) / FA_LOG2E;
    }
}

/* The score gradients of one key block for this thread's query rows (the dq kernels): s
 * [NK/8][4] holds the raw scores of keys k0.. and becomes dS = P * (dP - delta), P =
 * exp2(s * sl2 - lse2) (lse2: the row's lse in log2 units; masked keys give 0); dp [NK/8][4]
 * the products dO V^T. Masking as fa_softmax_block. */
template <int NK>
__device__ __forceinline__ void fa_dscores_rows(float (*s)[4], const float (*dp)[4], int64_t k0,
                                                int64_t row0, int64_t row1, int64_t st0,
                                                int64_t st1, float lse0, float lse1, float dl0,
                                                float dl1, float sl2, int t, bool mask) {
    if (mask) fa_mask_rows<NK>(s, k0, row0, row1, st0, st1, t); /* exp2(-inf) = 0 */
#pragma unroll
    for (int nt = 0; nt < NK / 8; nt++) {
        s[nt][0] = fa_exp2(s[nt][0] * sl2 - lse0) * (dp[nt][0] - dl0); /* dS, rounded by c_to_a */
        s[nt][1] = fa_exp2(s[nt][1] * sl2 - lse0) * (dp[nt][1] - dl0);
        s[nt][2] = fa_exp2(s[nt][2] * sl2 - lse1) * (dp[nt][2] - dl1);
        s[nt][3] = fa_exp2(s[nt][3] * sl2 - lse1) * (dp[nt][3] - dl1);
    }
}

/* The transposed form for this thread's key rows key0, key1 = key0 + 8 (the dk/dv kernels),
 * in two halves so that a caller can multiply with P^T before dP^T is ready: fa_probs_cols
 * makes pt [NQ/8][4] = P^T from the raw scores S^T s [NQ/8][4] of queries q0.. (pt may be
 * s: element by element), fa_dgrad_cols ds [NQ/8][4] = P^T * (dP^T - delta) (ds may be dp).
 * The queries' lse (log2 units), delta and document start are sL, sD, sS [NQ] (shared
 * memory, 8-byte aligned: a thread's two adjacent columns are read as one 8-byte load). A
 * query sees a key when it is < T, not before the key and its document starts at or before
 * the key; without `mask` every pair counts. */
template <int NQ>
__device__ __forceinline__ void
fa_probs_cols(float (*pt)[4], const float (*s)[4], int64_t q0, int64_t key0, int64_t key1,
              const float *sL, const int32_t *sS, int64_t T, float sl2, int t, bool mask) {
#pragma unroll
    for (int nt = 0; nt < NQ / 8; nt++) {
        const float2 l = *reinterpret_cast<const float2 *>(sL + nt * 8 + 2 * t);
        pt[nt][0] = fa_exp2(s[nt][0] * sl2 - l.x);
        pt[nt][1] = fa_exp2(s[nt][1] * sl2 - l.y);
        pt[nt][2] = fa_exp2(s[nt][2] * sl2 - l.x);
        pt[nt][3] = fa_exp2(s[nt][3] * sl2 - l.y);
    }
    if (!mask) return; /* one branch, not one a tile (fa_mask_rows) */
    /* in 32 bits (fa_rel): column c is a query < T from c < n, at or after key0 from c >= a0;
     * the document starts are int32 positions, and so are the keys */
    const int n = fa_rel(T - q0, NQ), a0 = fa_rel(key0 - q0, NQ), a1 = fa_rel(key1 - q0, NQ);
    const int k0 = (int)key0, k1 = (int)key1;
#pragma unroll
    for (int nt = 0; nt < NQ / 8; nt++) {
        const int c = nt * 8 + 2 * t;
        const int2 st = *reinterpret_cast<const int2 *>(sS + c);
        pt[nt][0] = c < n && c >= a0 && st.x <= k0 ? pt[nt][0] : 0.0f;
        pt[nt][1] = c + 1 < n && c + 1 >= a0 && st.y <= k0 ? pt[nt][1] : 0.0f;
        pt[nt][2] = c < n && c >= a1 && st.x <= k1 ? pt[nt][2] : 0.0f;
        pt[nt][3] = c + 1 < n && c + 1 >= a1 && st.y <= k1 ? pt[nt][3] : 0.0f;
    }
}
template <int NQ>
__device__ __forceinline__ void fa_dgrad_cols(float (*ds)[4], const float (*pt)[4],
                                              const float (*dp)[4], const float *sD, int t) {
#pragma unroll
    for (int nt = 0; nt < NQ / 8; nt++) {
        const int c = nt * 8 + 2 * t;
        const float2 d = *reinterpret_cast<const float2 *>(sD + c);
        const float da = d.x, db = d.y;
        ds[nt][0] = pt[nt][0] * (dp[nt][0] - da); /* dS^T, rounded to bf16 by c_to_a */
        ds[nt][1] = pt[nt][1] * (dp[nt][1] - db);
        ds[nt][2] = pt[nt][2] * (dp[nt][2] - da);
        ds[nt][3] = pt[nt][3] * (dp[nt][3] - db);
    }
}
/* both halves: s [NQ/8][4] raw scores S^T becomes dS^T and pt gets P^T */
template <int NQ>
__device__ __forceinline__ void fa_dscores_cols(float (*s)[4], const float (*dp)[4], float (*pt)[4],
                                                int64_t q0, int64_t key0, int64_t key1,
                                                const float *sL, const float *sD, const int32_t *sS,
                                                int64_t T, float sl2, int t, bool mask) {
    fa_probs_cols<NQ>(pt, s, q0, key0, key1, sL, sS, T, sl2, t, mask);
    fa_dgrad_cols<NQ>(s, pt, dp, sD, t);
}

/* g[row * stride + col] (+)= scale * acc for this thread's rows row0, row1 = row0 + 8 (< T)
 * of a [*, stride] fp32 gradient (g: the head's column 0 of row 0), acc [D/8][4]; add 1 adds
 * into g, 0 writes it. */
template <int D>
__device__ __forceinline__ void fa_add_rows(float *g, const float (*acc)[4], int64_t row0,
                                            int64_t row1, int64_t T, int64_t stride, float scale,
                                            int t, int add) {
    const float2 zero = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        const int col = nt * 8 + 2 * t;
        if (row0 < T) {
            float2 *p = reinterpret_cast<float2 *>(g + row0 * stride + col);
            const float2 cur = add ? __ldcg(p) : zero; /* L2: another block may have added */
            *p = make_float2(cur.x + scale * acc[nt][0], cur.y + scale * acc[nt][1]);
        }
        if (row1 < T) {
            float2 *p = reinterpret_cast<float2 *>(g + row1 * stride + col);
            const float2 cur = add ? __ldcg(p) : zero;
            *p = make_float2(cur.x + scale * acc[nt][2], cur.y + scale * acc[nt][3]);
        }
    }
}

/* acc [N][4] = 0 (a thread's mma accumulator fragments) */
template <int N> __device__ __forceinline__ void fa_zero(float (*acc)[4]) {
#pragma unroll
    for (int nt = 0; nt < N; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[nt][i] = 0.0f;
}

/* The end of the queries that see a key block ending at k_last: T without a mask; with
 * one (dsb [T]: each position's document start, never decreasing) the first query after
 * k_last whose document starts after it - a binary search, the same in every thread. */
__device__ __forceinline__ int64_t fa_query_end(const int32_t *dsb, int64_t k_last, int64_t T) {
    if (!dsb) return T;
    int64_t lo = k_last + 1, hi = T;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (dsb[mid] > k_last)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

#endif
