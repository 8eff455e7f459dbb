/* adamw.cuh: AdamW's arithmetic on the GPU, one element at a time - the CPU backend's
 * expressions (libcore/src/ops/cpu/ops_optim.c) - shared by the flat AdamW kernels
 * (backend_cuda.cu; the vector one is here) and the fp8-block step that updates a weight and
 * writes its copies in one pass (sm90/adamw_fp8.cuh), so that both give the same bits. */
#ifndef MOE_KERNELS_ADAMW_CUH
#define MOE_KERNELS_ADAMW_CUH

#include <math.h>

#include "backend_cuda.cuh"

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
    /* 4 moments as their 4 bf16 codes (element 0 in the low half of .x), and back */
    static __device__ __forceinline__ float4 of4(uint2 q) {
        return make_float4(moe_f32_from_bits(q.x << 16), moe_f32_from_bits(q.x & 0xffff0000u),
                           moe_f32_from_bits(q.y << 16), moe_f32_from_bits(q.y & 0xffff0000u));
    }
    static __device__ __forceinline__ uint2 codes4(float4 x) {
        uint2 q;
        q.x = code(x.x) | code(x.y) << 16;
        q.y = code(x.z) | code(x.w) << 16;
        return q;
    }
    static __device__ __forceinline__ float4 ld4(const T *p, int64_t i4) {
        return of4(__ldcs(reinterpret_cast<const uint2 *>(p) + i4));
    }
    static __device__ __forceinline__ void st4(T *p, int64_t i4, float4 x) {
        __stcs(reinterpret_cast<uint2 *>(p) + i4, codes4(x));
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

/* 4 consecutive elements in registers: masters p, gradients g and stored moments m, v (as
 * M::ld4 gives them) updated in place, one element after the other. */
template <class M>
__device__ __forceinline__ void adamw4(float4 &p, float4 g, float4 &m, float4 &v,
                                       const adamw_hp &h) {
    float *pp = &p.x, *gg = &g.x, *mm = &m.x, *vv = &v.x;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        adamw_moments<M>(gg[j], mm + j, vv + j, h);
        pp[j] = adamw_update<M>(pp[j], mm[j], vv[j], h);
    }
}

/* The flat AdamW kernel (backend_cuda.cu's adamw_launch; here so that bench/kernels/
 * adamw_fp8.cu times this very kernel): groups of 4 elements [0, 4 * n4), 16-byte loads and
 * stores of param and grad, 4 moments of m and v per access (M::ld4; streamed: each byte is
 * touched once per step) and 8-byte stores of the bf16 copy param16 (NULL: none). */
template <class M>
__global__ void k_adamw_vec4(float4 *__restrict__ param, uint2 *__restrict__ param16,
                             const float4 *__restrict__ grad, typename M::T *__restrict__ m,
                             typename M::T *__restrict__ v, int64_t n4, adamw_hp h) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 p = __ldcs(param + i), g = __ldcs(grad + i), mi = M::ld4(m, i), vi = M::ld4(v, i);
        adamw4<M>(p, g, mi, vi, h);
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

/* The hyperparameters of step `step` (from 1): the bias corrections 1 - beta^step in double,
 * rounded once. */
static inline adamw_hp adamw_hp_of(float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step, float grad_scale) {
    adamw_hp h;
    h.lr = lr, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.wd = weight_decay;
    h.bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    h.bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    h.grad_scale = grad_scale;
    return h;
}

#endif
