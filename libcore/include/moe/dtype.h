/* dtype: element types and the bit-exact conversions between them and f32.
 *
 * Every number format the toolkit stores or computes in is listed in moe_dtype. The scalar
 * conversions are MOE_HD (static inline, and __host__ __device__ under nvcc) and use only
 * integer bit manipulation, so the CPU reference and the CUDA kernels (kernels/dtype.cu
 * includes this header) produce identical bits. Rounding is round-to-nearest, ties to even,
 * everywhere but in the split master's high half (ties away from zero: moe_f32_split_bf16).
 * The rules a reader must know:
 *
 *   bf16  1-8-7, bias 127. NaN stays NaN (quietened, sign and top payload kept).
 *   f16   IEEE binary16 1-5-10, bias 15, max 65504; overflow rounds to Inf (IEEE).
 *   e4m3  OCP FP8 1-4-3, bias 7, max 448, no Inf; NaN = 0x7f/0xff. Subnormals 2^-9 steps.
 *   e5m2  OCP FP8 1-5-2, bias 15, max 57344, Inf 0x7c/0xfc, NaN 0x7d..0x7f/0xfd..0xff.
 *         fp8 encoders take `saturate`: 1 clamps every finite overflow AND +-Inf to +-max
 *         finite (like PTX cvt .satfinite); 0 is IEEE-like: a value whose rounded magnitude
 *         exceeds max becomes NaN (e4m3) or Inf (e5m2), Inf maps to NaN (e4m3) / Inf (e5m2).
 *         NaN always encodes as sign|0x7f.
 *   e8m0  OCP MX scale: unsigned, 8 exponent bits, value 2^(code-127), code 0..254, 0xff NaN,
 *         no zero, no sign. Encoders (three rounding rules, see below): NaN, negative values
 *         and +Inf -> 0xff; +-0 and tiny values clamp to code 0 (2^-127); large values
 *         saturate to 254 (2^127).
 *
 * Bulk conversion of arrays: moe_convert(). */
#ifndef MOE_DTYPE_H
#define MOE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe/hostdev.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "moe/err.h"

typedef enum moe_dtype {
    MOE_DTYPE_F32 = 0,
    MOE_DTYPE_BF16,
    MOE_DTYPE_F16,
    MOE_DTYPE_E4M3,
    MOE_DTYPE_E5M2,
    MOE_DTYPE_E8M0,
    MOE_DTYPE_I32,
    MOE_DTYPE_I64,
    MOE_DTYPE_U8,
    MOE_DTYPE_U16,
    MOE_DTYPE_COUNT /* number of dtypes, not a dtype */
} moe_dtype;

/* Bytes per element; 0 for an invalid value. */
size_t moe_dtype_size(moe_dtype dt);
/* "f32","bf16","f16","e4m3","e5m2","e8m0","i32","i64","u8","u16"; "?" for an invalid value. */
const char *moe_dtype_name(moe_dtype dt);
/* safetensors spelling: "F32","BF16","F16","F8_E4M3","F8_E5M2","F8_E8M0","I32","I64","U8","U16". */
const char *moe_dtype_safetensors_name(moe_dtype dt);
/* Accepts the moe_dtype_name() spelling (exact, lower case) or the safetensors spelling.
 * Unknown name: MOE_ERR_INPUT naming it and listing the valid names. */
moe_status moe_dtype_parse(const char *name, moe_dtype *out, moe_err *err);
/* 1 for f32, bf16, f16, e4m3, e5m2, e8m0. */
int moe_dtype_is_float(moe_dtype dt);

/* Flags of moe_convert_ex (0 = the defaults of moe_convert). */
#define MOE_CVT_NOSAT 1u      /* fp8 targets: overflow -> NaN (e4m3) / Inf (e5m2), no clamping */
#define MOE_CVT_E8M0_FLOOR 2u /* e8m0 targets: largest 2^k <= x instead of the nearest */
#define MOE_CVT_E8M0_CEIL 4u  /* e8m0 targets: smallest 2^k >= x */

/* Converts n elements src (src_dt) -> dst (dst_dt); buffers must not overlap unless the
 * dtypes are equal (then it is a memmove). Float formats convert through f32 with the rules
 * above; by default fp8 targets saturate and e8m0 targets round to nearest (see the flags).
 * Integer -> integer keeps values (out of range: MOE_ERR_INPUT naming the index); integer ->
 * float goes through f32 (integers beyond 2^24 round to f32 first); float -> integer is
 * refused (MOE_ERR_INPUT). Host memory only; the per-element functions above are MOE_HD, so
 * device kernels can convert with the same rounding. */
moe_status moe_convert(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt, int64_t n,
                       moe_err *err);
moe_status moe_convert_ex(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt, int64_t n,
                          unsigned flags, moe_err *err);

#ifdef __cplusplus
}
#endif

/* ---- bit casts ---- */

MOE_HD uint32_t moe_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

MOE_HD float moe_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- bf16: on every matmul emulation's hot path ---- */

MOE_HD uint16_t moe_f32_to_bf16(float x) {
    uint32_t u = moe_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* RNE; carries into the exponent, up to Inf */
    return (uint16_t)(u >> 16);
}

MOE_HD float moe_bf16_to_f32(uint16_t h) {
    return moe_f32_from_bits((uint32_t)h << 16);
}

/* x rounded to bf16 precision and back: what a bf16 GEMM operand holds. */
MOE_HD float moe_round_bf16(float x) {
    return moe_bf16_to_f32(moe_f32_to_bf16(x));
}

/* ---- an f32 held as two 16-bit halves (optim.master split, docs/dtypes.md) ----
 * hi is x's bf16 rounding to nearest with ties AWAY from zero (the bf16 weight copy the
 * products read), lo the signed difference x - hi in units of x's last bit: for a finite x
 * of sign s and magnitude bits u (31 of them), hi = s | (u + 0x8000) >> 16 and
 * lo = u - ((u + 0x8000) >> 16 << 16), in [-32768, 32767]. Every finite x, +-Inf and the
 * largest finite values (whose hi is Inf) come back bit for bit. Ties must go away from
 * zero: under ties to even an even hi is the nearest for 65,537 magnitudes (both ties),
 * one more than 16 bits tell apart. A NaN's hi is moe_f32_to_bf16's (sign, quiet bit, top
 * payload) and its lo 0: it comes back a NaN, the low payload bits lost. */
MOE_HD void moe_f32_split_bf16(float x, uint16_t *hi, uint16_t *lo) {
    uint32_t u = moe_f32_bits(x), a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        *hi = moe_f32_to_bf16(x);
        *lo = 0;
        return;
    }
    uint32_t h = (a + 0x8000u) >> 16; /* at most 0x7f80: Inf */
    *hi = (uint16_t)((u >> 16 & 0x8000u) | h);
    *lo = (uint16_t)(a - (h << 16)); /* two's complement of the difference */
}

/* The f32 whose halves moe_f32_split_bf16 gave. */
MOE_HD float moe_f32_join_bf16(uint16_t hi, uint16_t lo) {
    uint32_t s = (uint32_t)(hi & 0x8000u) << 16, h = hi & 0x7fffu;
    /* lo as a signed 16-bit number (without C's implementation-defined narrowing) */
    return moe_f32_from_bits(s | ((h << 16) + lo - ((uint32_t)(lo & 0x8000u) << 1)));
}

/* ---- generic small-float rounding (f16, e4m3, e5m2) ---- */

/* a: f32 bits without the sign, finite. Returns the magnitude code (exponent and mantissa
 * fields) of the nearest value (ties to even) in a format with `ebits` exponent bits,
 * `mbits` mantissa bits, IEEE bias and subnormals, without an upper bound: a result above
 * the format's largest finite code means overflow, which the caller handles. */
MOE_HD uint32_t moe_dtype_round_minifloat_(uint32_t a, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1;
    int e32 = (int)(a >> 23);
    if (e32 - 127 + bias >= 1) { /* normal in the target: rebias, round off 23-mbits bits */
        int sh = 23 - mbits;
        uint32_t r = a - ((uint32_t)(127 - bias) << 23);
        r += ((1u << (sh - 1)) - 1u) + ((r >> sh) & 1u);
        return r >> sh;
    }
    /* subnormal (or zero) in the target: count units of 2^(1-bias-mbits) */
    uint32_t full = e32 ? ((a & 0x7fffffu) | 0x800000u) : (a & 0x7fffffu);
    int sh = 151 - bias - mbits - (e32 ? e32 : 1);
    if (sh >= 25) return 0; /* below half the smallest subnormal */
    return (full + ((1u << (sh - 1)) - 1u) + ((full >> sh) & 1u)) >> sh;
}

/* Value of a magnitude code of the same kind of format (no Inf/NaN handling here). */
MOE_HD float moe_dtype_decode_minifloat_(uint32_t code, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1;
    uint32_t e = code >> mbits, m = code & ((1u << mbits) - 1u);
    if (e == 0) /* subnormal: m * 2^(1-bias-mbits), an exact product */
        return (float)m * moe_f32_from_bits((uint32_t)(127 + 1 - bias - mbits) << 23);
    return moe_f32_from_bits(((e + 127u - (uint32_t)bias) << 23) | (m << (23 - mbits)));
}

/* ---- f16 (IEEE binary16) ---- */

MOE_HD uint16_t moe_f32_to_f16(float x) {
    uint32_t u = moe_f32_bits(x), a = u & 0x7fffffffu, s = (u >> 16) & 0x8000u;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a == 0x7f800000u) return (uint16_t)(s | 0x7c00u);
    uint32_t r = moe_dtype_round_minifloat_(a, 5, 10);
    return (uint16_t)(s | (r > 0x7bffu ? 0x7c00u : r));
}

MOE_HD float moe_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, c = h & 0x7fffu;
    if (c >= 0x7c00u) return moe_f32_from_bits(s | 0x7f800000u | ((c & 0x3ffu) << 13));
    return moe_f32_from_bits(s | moe_f32_bits(moe_dtype_decode_minifloat_(c, 5, 10)));
}

/* f32 -> an OCP fp8 format with ebits/mbits whose largest finite code is max: NaN -> 0x7f,
 * Inf and values rounding above max -> max when saturating, else max + 1 (NaN for e4m3, Inf
 * for e5m2); sign kept. */
MOE_HD uint8_t moe_dtype_encode_fp8_(float x, int saturate, int ebits, int mbits, uint32_t max) {
    uint32_t u = moe_f32_bits(x), a = u & 0x7fffffffu, s = (u >> 24) & 0x80u;
    uint32_t over = saturate ? max : max + 1u;
    if (a > 0x7f800000u) return (uint8_t)(s | 0x7fu);
    if (a == 0x7f800000u) return (uint8_t)(s | over);
    uint32_t r = moe_dtype_round_minifloat_(a, ebits, mbits);
    return (uint8_t)(s | (r > max ? over : r));
}

/* ---- fp8 e4m3 (OCP) ---- */

MOE_HD uint8_t moe_f32_to_e4m3(float x, int saturate) {
    return moe_dtype_encode_fp8_(x, saturate, 4, 3, 0x7eu);
}

MOE_HD float moe_e4m3_to_f32(uint8_t c) {
    uint32_t s = (uint32_t)(c & 0x80u) << 24, m = c & 0x7fu;
    if (m == 0x7fu) return moe_f32_from_bits(s | 0x7fc00000u);
    return moe_f32_from_bits(s | moe_f32_bits(moe_dtype_decode_minifloat_(m, 4, 3)));
}

/* ---- fp8 e5m2 (OCP) ---- */

MOE_HD uint8_t moe_f32_to_e5m2(float x, int saturate) {
    return moe_dtype_encode_fp8_(x, saturate, 5, 2, 0x7bu);
}

MOE_HD float moe_e5m2_to_f32(uint8_t c) {
    uint32_t s = (uint32_t)(c & 0x80u) << 24, m = c & 0x7fu;
    if (m >= 0x7cu) return moe_f32_from_bits(s | 0x7f800000u | ((m & 3u) << 21));
    return moe_f32_from_bits(s | moe_f32_bits(moe_dtype_decode_minifloat_(m, 5, 2)));
}

/* ---- e8m0 (OCP MX scale) ---- */

/* Three encoders for a positive value (special inputs as in the file banner):
 *   moe_f32_to_e8m0       nearest power of two in linear distance; a tie (x = 1.5 * 2^k)
 *                         goes to the even code, as IEEE RNE does with zero mantissa bits.
 *   moe_f32_to_e8m0_floor largest 2^k <= x (the OCP MX v1.0 scale rule).
 *   moe_f32_to_e8m0_ceil  smallest 2^k >= x (the round-up rule of NVIDIA's MXFP8 recipe). */
MOE_HD uint8_t moe_f32_to_e8m0(float x) {
    uint32_t u = moe_f32_bits(x);
    if ((u & 0x7fffffffu) == 0) return 0;
    if (u >= 0x7f800000u) return 0xffu;                 /* NaN, +Inf, any negative */
    if ((u >> 23) == 0) return u > 0x600000u ? 1u : 0u; /* f32 subnormal: 2^-127 or 2^-126 */
    u += 0x3fffffu + ((u >> 23) & 1u);
    u >>= 23;
    return (uint8_t)(u > 254u ? 254u : u);
}

MOE_HD uint8_t moe_f32_to_e8m0_floor(float x) {
    uint32_t u = moe_f32_bits(x);
    if ((u & 0x7fffffffu) == 0) return 0;
    if (u >= 0x7f800000u) return 0xffu;
    return (uint8_t)(u >> 23); /* a subnormal's floor is below 2^-127: clamps to code 0 */
}

MOE_HD uint8_t moe_f32_to_e8m0_ceil(float x) {
    uint32_t u = moe_f32_bits(x);
    if ((u & 0x7fffffffu) == 0) return 0;
    if (u >= 0x7f800000u) return 0xffu;
    if ((u >> 23) == 0) return u > 0x400000u ? 1u : 0u;
    u = (u >> 23) + ((u & 0x7fffffu) != 0);
    return (uint8_t)(u > 254u ? 254u : u);
}

MOE_HD float moe_e8m0_to_f32(uint8_t c) {
    if (c == 0xffu) return moe_f32_from_bits(0x7fc00000u);
    return moe_f32_from_bits(c == 0 ? 0x00400000u : (uint32_t)c << 23);
}

/* ---- one element of any float format, by dtype (the bulk converters' inner step) ---- */

/* src[i] of float dtype dt as f32 (dt must be a float dtype). */
MOE_HD float moe_dtype_load_f32(const void *src, moe_dtype dt, int64_t i) {
    switch (dt) {
    case MOE_DTYPE_BF16:
        return moe_bf16_to_f32(((const uint16_t *)src)[i]);
    case MOE_DTYPE_F16:
        return moe_f16_to_f32(((const uint16_t *)src)[i]);
    case MOE_DTYPE_E4M3:
        return moe_e4m3_to_f32(((const uint8_t *)src)[i]);
    case MOE_DTYPE_E5M2:
        return moe_e5m2_to_f32(((const uint8_t *)src)[i]);
    case MOE_DTYPE_E8M0:
        return moe_e8m0_to_f32(((const uint8_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

/* dst[i] of float dtype dt = x, rounded as `flags` (MOE_CVT_*) say. */
MOE_HD void moe_dtype_store_f32(void *dst, moe_dtype dt, int64_t i, float x, unsigned flags) {
    int sat = !(flags & MOE_CVT_NOSAT);
    switch (dt) {
    case MOE_DTYPE_BF16:
        ((uint16_t *)dst)[i] = moe_f32_to_bf16(x);
        break;
    case MOE_DTYPE_F16:
        ((uint16_t *)dst)[i] = moe_f32_to_f16(x);
        break;
    case MOE_DTYPE_E4M3:
        ((uint8_t *)dst)[i] = moe_f32_to_e4m3(x, sat);
        break;
    case MOE_DTYPE_E5M2:
        ((uint8_t *)dst)[i] = moe_f32_to_e5m2(x, sat);
        break;
    case MOE_DTYPE_E8M0:
        ((uint8_t *)dst)[i] = (flags & MOE_CVT_E8M0_FLOOR)  ? moe_f32_to_e8m0_floor(x)
                              : (flags & MOE_CVT_E8M0_CEIL) ? moe_f32_to_e8m0_ceil(x)
                                                            : moe_f32_to_e8m0(x);
        break;
    default:
        ((float *)dst)[i] = x;
        break;
    }
}

#endif
