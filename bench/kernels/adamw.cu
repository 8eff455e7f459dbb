/* adamw.cu: can the AdamW step (kernels/backend_cuda.cu, k_adamw_vec4) move its bytes closer
 * to the copy rate? The production kernel is copied below as the baseline; the variants keep
 * its arithmetic (the same adamw_moments / adamw_update, so the same bits) and change only how
 * many bytes each thread has in flight and how the grid covers the array.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Ilibcore/include -Ikernels bench/kernels/adamw.cu \
 *        -o /tmp/adamw && /tmp/adamw            (optional argument: n, default 256M)
 *
 * Not built by CMake, not run by CI (bench/kernels/README.md).
 *
 * Status: written without a GPU on 2026-12-04, not yet run.
 *
 * Why it could be faster (ptxas -v; H200: 64 K registers, 2,048 threads an SM). The baseline
 * (39 registers with fp32 moments, 40 with bf16) has 6 blocks of 256 resident per SM, 1,536
 * threads; its grid, 16 blocks per SM, is then 2.7 waves, the last one two thirds full. Its
 * grid-stride loop handles one float4 group per iteration: a thread issues 4 loads (64 bytes
 * with fp32 moments, 48 with bf16), waits for them, computes and stores, and only then issues
 * the next loads, so a warp has bytes in flight during part of each iteration only.
 * Variants (registers fp32 / bf16 moments, resident threads per SM):
 *   gs U=1|2|4    grid-stride, U groups per thread per iteration with all 4 U loads issued
 *                 before any arithmetic, the grid exactly the resident blocks (one wave):
 *                 U=1 39 / 40 (1,536: the grid's effect alone), U=2 54 / 62 (1,024 threads,
 *                 2,048 groups in flight), U=4 90 / 106 (512 threads, 2,048 groups);
 *   8 blocks/SM   U=1 built for 8 resident blocks of 256: 32 registers (a 5- or 6-word
 *                 spill), all 2,048 threads, a third more groups in flight than the baseline;
 *   flat U=1|2|4  no loop, as many blocks as the array needs, the block scheduler refilling
 *                 the SMs as blocks retire: U=1 at 128, 256 (also the 8-blocks/SM build) and
 *                 512 threads, U=2 and U=4 at 256.
 * Prediction (H200, n = 256M; the perf harness measured the baseline at 3,936 / 3,802 GB/s):
 * the best variant about 4,150 GB/s with fp32 moments and 4,100 with bf16 moments (about 95%
 * of the D2D copy printed beside them), i.e. the 2.9 B-parameter mixtral8x7b-2L step's AdamW
 * 22.1 -> about 21.0 ms with fp32 moments, 16.8 -> about 15.6 ms with bf16; most likely gs
 * U=2 or the 8-blocks/SM build; U=4 no better than U=2. If every variant stays within 2% of
 * the baseline, AdamW is at what the DRAM gives this mix of reads and writes, and only fewer
 * bytes per parameter can make it faster.
 *
 * What it checks first: after 3 AdamW steps (step 1, 2, 3) from the same random state
 * (weights, gradients with zeros, subnormals, an outlier and a NaN, moments), every variant's
 * weights, bf16 copy, m and v are byte-identical to the baseline's, at n = 256M and at an
 * n whose groups end inside a block and inside an unrolled iteration; a variant that differs
 * prints its first differing byte, FAIL and no rate, and the program exits 1. Then each
 * kernel (variants and baseline taking turns, 3 warm-up rounds, median of 21) as GB/s of the
 * bytes AdamW moves (30 per parameter with fp32 moments, 22 with bf16: read p, g, m, v, write
 * p, m, v and the bf16 copy), beside a cudaMemcpy D2D moving the same bytes (half read, half
 * written) and a read-only pass over the same byte count, in the same run. */
#include <math.h>
#include <string.h>

#include "playground.cuh"

#include "moe/dtype.h"

/* ---- baseline: kernels/backend_cuda.cu f32_rn .. k_adamw_vec4 as of commit 4d85b94 ---- */
/* fp32 numbers whose every operation rounds on its own: nvcc never fuses the __f*_rn
 * intrinsics into multiply-adds, so an expression of them gives the bits the CPU's C11 code
 * (no FP_CONTRACT) gives for the same expression. Written with operators so that one AdamW
 * formula serves both this and plain (contracted) float. */
struct f32_rn {
    float x;
    __device__ __forceinline__ f32_rn(float v) : x(v) {}
    __device__ __forceinline__ explicit operator float() const {
        return x;
    }
};
__device__ __forceinline__ f32_rn operator+(f32_rn a, f32_rn b) {
    return __fadd_rn(a.x, b.x);
}
__device__ __forceinline__ f32_rn operator-(f32_rn a, f32_rn b) {
    return __fsub_rn(a.x, b.x);
}
__device__ __forceinline__ f32_rn operator*(f32_rn a, f32_rn b) {
    return __fmul_rn(a.x, b.x);
}
__device__ __forceinline__ f32_rn operator/(f32_rn a, f32_rn b) {
    return __fdiv_rn(a.x, b.x);
}
__device__ __forceinline__ f32_rn adamw_sqrt(f32_rn a) {
    return __fsqrt_rn(a.x);
}
__device__ __forceinline__ float adamw_sqrt(float a) {
    return sqrtf(a);
}

/* How AdamW's moments are stored (M below), and with it how its arithmetic rounds (M::F).
 *   adamw_f32: fp32 moments and plain float, which nvcc contracts into fused multiply-adds
 *     as it always has: results within rounding of the CPU's, the same bits as before bf16
 *     moments existed.
 *   adamw_bf16: bf16 moments and f32_rn: the CPU's bits exactly. A new moment one fp32 ulp
 *     off can round to another bf16 value, so anything less would let the states of the two
 *     backends drift apart. Stored with the CPU's moe_f32_to_bf16 (moe/dtype.h: nearest
 *     even; a NaN keeps its sign and top payload bits), not __float2bfloat16_rn, which
 *     agrees on every other input but whose fallback in cuda_bf16.hpp gives NaN as the
 *     canonical 0x7fff (and the sm_80 cvt.rn.bf16.f32 is not documented to keep payloads).
 * stored(x) is the value a store of x keeps, which the update reads (adamw_update); st
 * and st4 store values that stored() returned; ld4/st4 move 4 moments in one streamed
 * access (16 bytes of fp32, 8 of bf16). */
struct adamw_f32 {
    typedef float T;
    typedef float F;
    static __device__ __forceinline__ float stored(float x) {
        return x;
    }
    static __device__ __forceinline__ float ld(const T *p, int64_t i) {
        return p[i];
    }
    static __device__ __forceinline__ void st(T *p, int64_t i, float x) {
        p[i] = x;
    }
    static __device__ __forceinline__ float4 ld4(const T *p, int64_t i4) {
        return __ldcs(reinterpret_cast<const float4 *>(p) + i4);
    }
    static __device__ __forceinline__ void st4(T *p, int64_t i4, float4 x) {
        __stcs(reinterpret_cast<float4 *>(p) + i4, x);
    }
};
struct adamw_bf16 {
    typedef uint16_t T; /* bf16 codes */
    typedef f32_rn F;
    static __device__ __forceinline__ float stored(float x) {
        return moe_round_bf16(x);
    }
    static __device__ __forceinline__ float ld(const T *p, int64_t i) {
        return moe_bf16_to_f32(p[i]);
    }
    /* x holds a bf16 value (from stored()): its upper half is the code */
    static __device__ __forceinline__ uint32_t code(float x) {
        return moe_f32_bits(x) >> 16;
    }
    static __device__ __forceinline__ void st(T *p, int64_t i, float x) {
        p[i] = (T)code(x);
    }
    static __device__ __forceinline__ float4 ld4(const T *p, int64_t i4) {
        const uint2 q = __ldcs(reinterpret_cast<const uint2 *>(p) + i4);
        return make_float4(moe_f32_from_bits(q.x << 16), moe_f32_from_bits(q.x & 0xffff0000u),
                           moe_f32_from_bits(q.y << 16), moe_f32_from_bits(q.y & 0xffff0000u));
    }
    static __device__ __forceinline__ void st4(T *p, int64_t i4, float4 x) {
        uint2 q;
        q.x = code(x.x) | code(x.y) << 16;
        q.y = code(x.z) | code(x.w) << 16;
        __stcs(reinterpret_cast<uint2 *>(p) + i4, q);
    }
};

struct adamw_hp {
    float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};

/* One AdamW element in two parts, the CPU backend's expressions (ops_optim.c) in M's
 * arithmetic. adamw_moments: *m, *v hold the stored moments on entry and the new ones as
 * stored on return. adamw_update: the new weight from those stored moments, not from the
 * unrounded new ones, as on the CPU: the stored moments are the whole optimizer state (all a
 * run resumed from a checkpoint has, and all the update depends on). */
template <class M>
__device__ __forceinline__ void adamw_moments(float grad, float *m, float *v, const adamw_hp &h) {
    typedef typename M::F F;
    const F one = 1.0f, b1 = h.beta1, b2 = h.beta2;
    F g = F(grad) * F(h.grad_scale);
    /* both moments computed before either is written back: in this order nvcc fuses the
     * same products as it always did for fp32 moments (so their bits are unchanged) */
    float mi = M::stored(float(b1 * F(*m) + (one - b1) * g));
    float vi = M::stored(float(b2 * F(*v) + (one - b2) * g * g));
    *m = mi;
    *v = vi;
}
template <class M>
__device__ __forceinline__ float adamw_update(float p_, float m, float v, const adamw_hp &h) {
    typedef typename M::F F;
    const F p = p_;
    F upd = (F(m) / F(h.bc1)) / (adamw_sqrt(F(v) / F(h.bc2)) + F(h.eps));
    return float(p - F(h.lr) * (upd + F(h.wd) * p));
}

/* Groups of 4 elements [0, 4 * n4): 16-byte loads and stores of param and grad, 4 moments
 * of m and v per access (M::ld4; streamed: each byte is touched once per step) and 8-byte
 * stores of the bf16 copy. */
template <class M>
__global__ void k_adamw_vec4(float4 *__restrict__ param, uint2 *__restrict__ param16,
                             const float4 *__restrict__ grad, typename M::T *__restrict__ m,
                             typename M::T *__restrict__ v, int64_t n4, adamw_hp h) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 p = __ldcs(param + i), g = __ldcs(grad + i), mi = M::ld4(m, i), vi = M::ld4(v, i);
        float *pp = &p.x, *gg = &g.x, *mm = &mi.x, *vv = &vi.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            adamw_moments<M>(gg[j], mm + j, vv + j, h);
            pp[j] = adamw_update<M>(pp[j], mm[j], vv[j], h);
        }
        __stcs(param + i, p);
        M::st4(m, i, mi);
        M::st4(v, i, vi);
        if (param16) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y),
                           hi = __floats2bfloat162_rn(p.z, p.w);
            uint2 u;
            u.x = *(const uint32_t *)&lo;
            u.y = *(const uint32_t *)&hi;
            __stcs(param16 + i, u);
        }
    }
}

/* ---- end of baseline ---- */

/* The variant: groups [0, n4) of 4 elements, thread t of T = gridDim.x * blockDim.x taking
 * groups base + u * T (u < U) per iteration, base = t, t + U T, ...: each of the 4 U load
 * instructions still reads consecutive 16-byte (8-byte) words across a warp. All loads of an
 * iteration are issued before any arithmetic, so a warp has 4 U accesses in flight instead
 * of 4. With gridDim.x * blockDim.x * U >= n4 the loop runs once (the flat launches). The
 * element arithmetic and the stores are the baseline's lines. */
template <class M, int U>
__device__ __forceinline__ void
adamw_vec4_u(float4 *__restrict__ param, uint2 *__restrict__ param16,
             const float4 *__restrict__ grad, typename M::T *__restrict__ m,
             typename M::T *__restrict__ v, int64_t n4, const adamw_hp &h) {
    const int64_t T = (int64_t)gridDim.x * blockDim.x;
    for (int64_t base = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; base < n4; base += U * T) {
        float4 p[U], g[U], mi[U], vi[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = base + u * T;
            if (i < n4)
                p[u] = __ldcs(param + i), g[u] = __ldcs(grad + i), mi[u] = M::ld4(m, i),
                vi[u] = M::ld4(v, i);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = base + u * T;
            if (i >= n4) break;
            float *pp = &p[u].x, *gg = &g[u].x, *mm = &mi[u].x, *vv = &vi[u].x;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                adamw_moments<M>(gg[j], mm + j, vv + j, h);
                pp[j] = adamw_update<M>(pp[j], mm[j], vv[j], h);
            }
            __stcs(param + i, p[u]);
            M::st4(m, i, mi[u]);
            M::st4(v, i, vi[u]);
            if (param16) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(p[u].x, p[u].y),
                               hi = __floats2bfloat162_rn(p[u].z, p[u].w);
                uint2 w;
                w.x = *(const uint32_t *)&lo;
                w.y = *(const uint32_t *)&hi;
                __stcs(param16 + i, w);
            }
        }
    }
}
/* Without launch bounds, as the baseline (which gets 39 / 40 registers so, and 46 under
 * __launch_bounds__(512)). */
template <class M, int U>
__global__ void k_adamw_vec4_u(float4 *__restrict__ param, uint2 *__restrict__ param16,
                               const float4 *__restrict__ grad, typename M::T *__restrict__ m,
                               typename M::T *__restrict__ v, int64_t n4, adamw_hp h) {
    adamw_vec4_u<M, U>(param, param16, grad, m, v, n4, h);
}
/* U = 1 with ptxas asked for 8 resident blocks of 256: 32 registers, all 2,048 threads of an
 * SM resident instead of 1,536, for a spill of 5 or 6 words. */
template <class M>
__global__ void __launch_bounds__(256, 8)
    k_adamw_vec4_occ(float4 *__restrict__ param, uint2 *__restrict__ param16,
                     const float4 *__restrict__ grad, typename M::T *__restrict__ m,
                     typename M::T *__restrict__ v, int64_t n4, adamw_hp h) {
    adamw_vec4_u<M, 1>(param, param16, grad, m, v, n4, h);
}

/* Reads x [n16] (16-byte words) as the variants read, 4 words per thread in flight; the xor
 * of all of them goes to *out only if it equals a constant, which keeps the loads alive
 * without writing anything in practice. The read-only ceiling of the same byte count. */
__global__ void k_read(const uint4 *__restrict__ x, int64_t n16, unsigned *out) {
    const int64_t T = (int64_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (int64_t base = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; base < n16; base += 4 * T) {
        uint4 a[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            a[u] = base + u * T < n16 ? __ldcs(x + base + u * T) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w;
    }
    if (acc == 0x9e3779b9u) *out = acc;
}

/* The test state at element i: hashes of (i, what), with the values run_adamw of
 * tests/gpu/test_backend_ops.c draws (p, g in [-1, 1), m in [-0.1, 0.1), v in [0, 0.01)),
 * plus edge cases in g: zeros (and then m = v = 0 too: the update's 0 / (0 + eps)), f32
 * subnormals, an outlier of 1e30 (g * g overflows to Inf) and one NaN. Moments stored as
 * M stores them. */
__device__ __forceinline__ float hash_unit(int64_t i, unsigned what) {
    unsigned h = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32) * 0x85ebca6bu ^ what;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    return (h >> 8) / 16777216.0f; /* [0, 1) */
}
template <class M>
__global__ void k_fill(float *__restrict__ p, float *__restrict__ g, typename M::T *__restrict__ m,
                       typename M::T *__restrict__ v, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = 2.0f * hash_unit(i, 2) - 1.0f, mi = 0.2f * hash_unit(i, 3) - 0.1f,
              vi = 0.01f * hash_unit(i, 4);
        const float sel = hash_unit(i, 5);
        if (sel < 1e-3f)
            gi = 0.0f, mi = 0.0f, vi = 0.0f;
        else if (sel < 2e-3f)
            gi *= 1e-39f; /* subnormal */
        if (i == n / 3) gi = 1e30f;
        if (i == n / 2) gi = __uint_as_float(0x7fc00001u);
        p[i] = 2.0f * hash_unit(i, 1) - 1.0f;
        g[i] = gi;
        M::st(m, i, M::stored(mi));
        M::st(v, i, M::stored(vi));
    }
}

/* One AdamW state: weights p [n] fp32, gradients g [n], moments m, v [n] of M::T, bf16 copy
 * p16 [n]. */
template <class M> struct state {
    float *p, *g;
    typename M::T *m, *v;
    __nv_bfloat16 *p16;
};
template <class M> static state<M> state_alloc(int64_t n) {
    state<M> s;
    CK(cudaMalloc(&s.p, n * sizeof(float)));
    CK(cudaMalloc(&s.g, n * sizeof(float)));
    CK(cudaMalloc(&s.m, n * sizeof(typename M::T)));
    CK(cudaMalloc(&s.v, n * sizeof(typename M::T)));
    CK(cudaMalloc(&s.p16, n * sizeof(__nv_bfloat16)));
    return s;
}
template <class M> static void state_free(state<M> *s) {
    CK(cudaFree(s->p));
    CK(cudaFree(s->g));
    CK(cudaFree(s->m));
    CK(cudaFree(s->v));
    CK(cudaFree(s->p16));
}
template <class M> static void state_copy(state<M> *d, const state<M> *s, int64_t n) {
    CK(cudaMemcpy(d->p, s->p, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->g, s->g, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->m, s->m, n * sizeof(typename M::T), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d->v, s->v, n * sizeof(typename M::T), cudaMemcpyDeviceToDevice));
    CK(cudaMemset(d->p16, 0xa5, n * sizeof(__nv_bfloat16)));
}

/* A launch: the baseline (U = 0: production's grid, min(blocks needed, 16 per SM) of 256) or
 * k_adamw_vec4_u with U groups per thread, `threads` per block, and either the resident grid
 * (gs: as many blocks as fit on the GPU at once) or as many as the array needs (flat);
 * min_blocks 8 for the 32-register build. */
typedef struct {
    const char *name;
    int U, threads, flat, min_blocks;
} config;
static const config configs[] = {
    {"baseline (k_adamw_vec4)", 0, 256, 0, 0},
    {"gs U=1 256", 1, 256, 0, 1},
    {"gs U=1 256, 8 blocks/SM", 1, 256, 0, 8},
    {"gs U=2 256", 2, 256, 0, 1},
    {"gs U=4 256", 4, 256, 0, 1},
    {"flat U=1 128", 1, 128, 1, 1},
    {"flat U=1 256", 1, 256, 1, 1},
    {"flat U=1 256, 8 blocks/SM", 1, 256, 1, 8},
    {"flat U=1 512", 1, 512, 1, 1},
    {"flat U=2 256", 2, 256, 1, 1},
    {"flat U=4 256", 4, 256, 1, 1},
};
enum { NCONFIG = sizeof configs / sizeof configs[0] };

static int num_sms;

/* Blocks of config c (kernel `kernel`) over n4 groups; the resident count asked of the runtime
 * once per kernel and block size (no runtime queries between the timing events after the
 * first). */
static unsigned grid_of(const void *kernel, const config *c, int64_t n4) {
    static struct {
        const void *kernel;
        int threads, resident;
    } seen[64];
    static int nseen;
    const int64_t per = (int64_t)c->threads * c->U, blocks = (n4 + per - 1) / per;
    if (c->flat) return (unsigned)blocks;
    int i = 0;
    while (i < nseen && (seen[i].kernel != kernel || seen[i].threads != c->threads))
        i++;
    if (i == nseen) {
        if (nseen == 64) {
            fprintf(stderr, "grid_of: more kernels than expected\n");
            exit(1);
        }
        seen[i].kernel = kernel, seen[i].threads = c->threads, nseen++;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&seen[i].resident, kernel, c->threads, 0));
    }
    const int64_t cap = (int64_t)seen[i].resident * num_sms;
    return (unsigned)(blocks < cap ? blocks : cap);
}

/* One AdamW step over s (n % 4 == 0, arrays 16-byte aligned as cudaMalloc's) by config c. */
template <class M>
static void step(const config *c, const state<M> *s, int64_t n, const adamw_hp &h) {
    float4 *p = (float4 *)s->p;
    uint2 *p16 = (uint2 *)s->p16;
    const float4 *g = (const float4 *)s->g;
    const int64_t n4 = n / 4;
    switch (c->U) {
    case 0: {
        int64_t blocks = (n4 + 255) / 256;
        if (blocks > 16LL * num_sms) blocks = 16LL * num_sms;
        k_adamw_vec4<M><<<(unsigned)blocks, 256>>>(p, p16, g, s->m, s->v, n4, h);
        break;
    }
    case 1:
        if (c->min_blocks == 8)
            k_adamw_vec4_occ<M><<<grid_of((const void *)k_adamw_vec4_occ<M>, c, n4), c->threads>>>(
                p, p16, g, s->m, s->v, n4, h);
        else
            k_adamw_vec4_u<M, 1>
                <<<grid_of((const void *)k_adamw_vec4_u<M, 1>, c, n4), c->threads>>>(
                    p, p16, g, s->m, s->v, n4, h);
        break;
    case 2:
        k_adamw_vec4_u<M, 2><<<grid_of((const void *)k_adamw_vec4_u<M, 2>, c, n4), c->threads>>>(
            p, p16, g, s->m, s->v, n4, h);
        break;
    case 4:
        k_adamw_vec4_u<M, 4><<<grid_of((const void *)k_adamw_vec4_u<M, 4>, c, n4), c->threads>>>(
            p, p16, g, s->m, s->v, n4, h);
        break;
    default:
        fprintf(stderr, "no kernel for U=%d\n", c->U);
        exit(1);
    }
    CK(cudaGetLastError());
}

/* moe_cuda_adamw's hyperparameters for a step (bias corrections in double, as there). */
static adamw_hp hparams(float lr, float wd, int64_t step, float grad_scale) {
    adamw_hp h;
    h.lr = lr, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1e-8f, h.wd = wd;
    h.bc1 = (float)(1.0 - pow(0.9f, (double)step));
    h.bc2 = (float)(1.0 - pow(0.95f, (double)step));
    h.grad_scale = grad_scale;
    return h;
}

/* Checks every config against the baseline after 3 steps (the test's hyperparameters) from
 * init; ok[c] = 0 for a config that differs (its first differing byte printed). */
template <class M>
static void check(const char *mname, const state<M> *init, state<M> *ref, state<M> *cand, int64_t n,
                  int *ok, unsigned long long *d_first) {
    for (int c = 0; c < NCONFIG; c++) {
        state<M> *s = c == 0 ? ref : cand;
        state_copy(s, init, n);
        for (int64_t t = 1; t <= 3; t++)
            step<M>(&configs[c], s, n, hparams(1e-3f, 0.1f, t, 0.5f));
        CK(cudaDeviceSynchronize());
        if (c == 0) continue;
        const struct {
            const char *what;
            const void *a, *b;
            size_t es;
        } arr[4] = {{"p", ref->p, cand->p, 4},
                    {"p16", ref->p16, cand->p16, 2},
                    {"m", ref->m, cand->m, sizeof(typename M::T)},
                    {"v", ref->v, cand->v, sizeof(typename M::T)}};
        int same = 1;
        for (int a = 0; a < 4 && same; a++) {
            long long d =
                pg_first_diff(arr[a].a, arr[a].b, (size_t)n * arr[a].es, d_first, num_sms);
            if (d < 0) continue;
            uint8_t x, y;
            CK(cudaMemcpy(&x, (const uint8_t *)arr[a].a + d, 1, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&y, (const uint8_t *)arr[a].b + d, 1, cudaMemcpyDeviceToHost));
            printf("  %-12s n=%-10lld %-24s %s differs first at element %lld (byte %lld: "
                   "baseline %02x, variant %02x)  FAIL\n",
                   mname, (long long)n, configs[c].name, arr[a].what, d / (long long)arr[a].es, d,
                   x, y);
            same = 0;
        }
        if (same)
            printf("  %-12s n=%-10lld %-24s p, p16, m, v after 3 steps identical  ok\n", mname,
                   (long long)n, configs[c].name);
        ok[c] &= same;
    }
}

/* Times every config that passed, the D2D copy and the read-only pass, taking turns, at the
 * perf harness's hyperparameters; prints GB/s of bytes_per * n. */
template <class M>
static void timing(const char *mname, state<M> *s, int64_t n, double bytes_per, const int *ok,
                   uint8_t *scratch, unsigned *d_out) {
    enum { WARM = 3, ROUNDS = 21, NK = NCONFIG + 2 };
    const double bytes = bytes_per * (double)n;
    const size_t half = (size_t)(bytes / 2);
    const adamw_hp h = hparams(1e-9f, 0.0f, 10, 1.0f);
    int read_grid = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&read_grid, k_read, 256, 0));
    read_grid *= num_sms;
    int on[NK];
    for (int k = 0; k < NK; k++)
        on[k] = k >= NCONFIG || ok[k];
    float med[NK];
    pg_time_turns(
        NK, on, WARM, ROUNDS, [](int) {},
        [&](int k) {
            if (k < NCONFIG)
                step<M>(&configs[k], s, n, h);
            else if (k == NCONFIG)
                CK(cudaMemcpyAsync(scratch + half, scratch, half, cudaMemcpyDeviceToDevice));
            else
                k_read<<<read_grid, 256>>>((const uint4 *)scratch, (int64_t)(bytes / 16), d_out);
        },
        med);
    printf("\n  %s, n=%lld: %.0f bytes per parameter, %.2f GB per step; median of %d, "
           "taking turns\n",
           mname, (long long)n, bytes_per, bytes / 1e9, ROUNDS);
    printf("  %-32s %9s %9s %8s\n", "kernel", "ms", "GB/s", "of copy");
    for (int k = NCONFIG; k < NK; k++)
        printf("  %-32s %9.3f %9.0f %7.1f%%\n",
               k == NCONFIG ? "copy D2D (same bytes moved)" : "read-only (same bytes read)", med[k],
               bytes / med[k] / 1e6, 100.0 * med[NCONFIG] / med[k]);
    for (int k = 0; k < NCONFIG; k++) {
        if (!ok[k])
            printf("  %-32s %9s %9s %8s\n", configs[k].name, "-", "FAIL", "-");
        else
            printf("  %-32s %9.3f %9.0f %7.1f%%\n", configs[k].name, med[k], bytes / med[k] / 1e6,
                   100.0 * med[NCONFIG] / med[k]);
    }
}

/* Checks at n_check_small and n, then times at n, for moments of type M. */
template <class M>
static int run(const char *mname, int64_t n, double bytes_per, uint8_t *scratch, unsigned *d_out,
               unsigned long long *d_first) {
    int ok[NCONFIG];
    for (int c = 0; c < NCONFIG; c++)
        ok[c] = 1;
    /* 4 * 1000003 elements: 1000003 groups, not a multiple of any block or U * block */
    const int64_t sizes[2] = {4 * 1000003LL, n};
    state<M> init = state_alloc<M>(n), ref = state_alloc<M>(n), cand = state_alloc<M>(n);
    for (int i = 0; i < 2; i++) {
        k_fill<M><<<8 * num_sms, 256>>>(init.p, init.g, init.m, init.v, sizes[i]);
        CK(cudaGetLastError());
        check<M>(mname, &init, &ref, &cand, sizes[i], ok, d_first);
    }
    state_free(&ref);
    state_free(&cand);
    timing<M>(mname, &init, n, bytes_per, ok, scratch, d_out);
    state_free(&init);
    int all = 1;
    for (int c = 0; c < NCONFIG; c++)
        all &= ok[c];
    return all;
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) / 4 * 4 : 256LL << 20;
    if (n < 4 * 1000003LL) {
        fprintf(stderr, "usage: adamw [n >= 4000012, default 268435456]\n");
        return 2;
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    num_sms = prop.multiProcessorCount;
    printf("adamw: %s, %d SMs; AdamW vec4 kernels at n=%lld\n", prop.name, num_sms, (long long)n);
    uint8_t *scratch;
    unsigned *d_out;
    unsigned long long *d_first;
    CK(cudaMalloc(&scratch, (size_t)(30.0 * (double)n)));
    CK(cudaMalloc(&d_out, sizeof(unsigned)));
    CK(cudaMalloc(&d_first, sizeof(unsigned long long)));
    CK(cudaMemset(scratch, 0x3c, (size_t)(30.0 * (double)n)));
    int all = run<adamw_f32>("fp32 moments", n, 30.0, scratch, d_out, d_first);
    all &= run<adamw_bf16>("bf16 moments", n, 22.0, scratch, d_out, d_first);
    printf("\nadamw: %s\n",
           all ? "every variant byte-identical to the baseline" : "FAIL (see above)");
    CK(cudaFree(scratch));
    CK(cudaFree(d_out));
    CK(cudaFree(d_first));
    return all ? 0 : 1;
}
