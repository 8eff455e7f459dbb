/* adamw.cuh: one AdamW element in the CPU backend's arithmetic (libcore/src/ops/cpu/
 * ops_optim.c), for every kernel that updates weights: the flat AdamW of backend_cuda.cu and
 * the fused AdamW and fp8-block copies of quant_tiles.cu (k_adamw_tiles), so that both give the
 * same bits for the same element. */
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

/* How the gradient AdamW reads is stored (G below): fp32, or bf16 (optim.expert_grads: bf16);
 * ld4 reads 4 in one streamed access (16 bytes of fp32, 8 of bf16). */
struct grad_f32 {
    typedef float T;
    static __device__ __forceinline__ float ld(const T *p, int64_t i) {
        return p[i];
    }
    static __device__ __forceinline__ float4 ld4(const T *p, int64_t i4) {
        return __ldcs(reinterpret_cast<const float4 *>(p) + i4);
    }
};
struct grad_bf16 {
    typedef uint16_t T; /* bf16 codes */
    static __device__ __forceinline__ float ld(const T *p, int64_t i) {
        return moe_bf16_to_f32(p[i]);
    }
    static __device__ __forceinline__ float4 ld4(const T *p, int64_t i4) {
        return adamw_bf16::ld4(p, i4);
    }
};

struct adamw_hp {
    float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};
/* The step's constants: the bias corrections of step (counted from 1) in double, then fp32,
 * as the CPU computes them. */
static inline adamw_hp adamw_params(float lr, float beta1, float beta2, float eps,
                                    float weight_decay, int64_t step, float grad_scale) {
    adamw_hp h;
    h.lr = lr, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.wd = weight_decay;
    h.bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    h.bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    h.grad_scale = grad_scale;
    return h;
}

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

#endif
