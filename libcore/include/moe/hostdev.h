/* hostdev: one macro so that small pure functions compile for both the CPU and the GPU.
 *
 * Headers such as moe/dtype.h and moe/rng.h define their bit-exact arithmetic (format
 * conversions, Philox rounds, Box-Muller) as MOE_HD functions: `static inline` in C11, and
 * additionally `__host__ __device__` when the header is compiled by nvcc, so that a kernel
 * including them computes bit-identical results to the CPU. (No kernel in kernels/ calls
 * them today: the device fill and conversion kernels, used only by tests, were removed in
 * issue 11; the fp8 recipes' quantize kernels are meant to build on them.)
 * Functions marked MOE_HD must use only integer operations and IEEE basic operations
 * (+ - * / sqrt, no contraction into FMA: see MOE_FMUL/MOE_FADD) and no libm calls. */
#ifndef MOE_HOSTDEV_H
#define MOE_HOSTDEV_H

#if defined(__CUDACC__)
#define MOE_HD static inline __host__ __device__
#else
#define MOE_HD static inline
#endif

/* Correctly rounded multiply/add that nvcc will never fuse into an FMA (the host side is
 * compiled as ISO C11, where GCC does not contract either). */
#if defined(__CUDA_ARCH__)
#define MOE_FMUL(a, b) __fmul_rn((a), (b))
#define MOE_FADD(a, b) __fadd_rn((a), (b))
#define MOE_DMUL(a, b) __dmul_rn((a), (b))
#define MOE_DADD(a, b) __dadd_rn((a), (b))
#define MOE_DSQRT(a) __dsqrt_rn(a)
#else
#define MOE_FMUL(a, b) ((a) * (b))
#define MOE_FADD(a, b) ((a) + (b))
#define MOE_DMUL(a, b) ((a) * (b))
#define MOE_DADD(a, b) ((a) + (b))
#define MOE_DSQRT(a) moe_hd_sqrt_(a)
#include <math.h>
static inline double moe_hd_sqrt_(double a) {
    return sqrt(a); /* IEEE 754 requires sqrt to be correctly rounded */
}
#endif

#endif
