/* dtype: names, sizes and bulk array conversion (see moe/dtype.h).
 *
 * The scalar conversions live in the header (shared with kernels/dtype.cu); this file only
 * loops over arrays. Float-to-float conversion goes through f32 in chunks so that every
 * pair of formats is one decode loop and one encode loop; large arrays are split over the
 * OpenMP threads (the result does not depend on the thread count: each element is
 * converted independently). */
#include "moe/dtype.h"

#include <string.h>

static const struct {
    const char *name, *st_name;
    size_t size;
    int is_float;
} k_dtypes[MOE_DTYPE_COUNT] = {
    [MOE_DTYPE_F32] = {"f32", "F32", 4, 1},       [MOE_DTYPE_BF16] = {"bf16", "BF16", 2, 1},
    [MOE_DTYPE_F16] = {"f16", "F16", 2, 1},       [MOE_DTYPE_E4M3] = {"e4m3", "F8_E4M3", 1, 1},
    [MOE_DTYPE_E5M2] = {"e5m2", "F8_E5M2", 1, 1}, [MOE_DTYPE_E8M0] = {"e8m0", "F8_E8M0", 1, 1},
    [MOE_DTYPE_I32] = {"i32", "I32", 4, 0},       [MOE_DTYPE_I64] = {"i64", "I64", 8, 0},
    [MOE_DTYPE_U8] = {"u8", "U8", 1, 0},          [MOE_DTYPE_U16] = {"u16", "U16", 2, 0},
};

static int valid(moe_dtype dt) {
    return (int)dt >= 0 && dt < MOE_DTYPE_COUNT;
}

size_t moe_dtype_size(moe_dtype dt) {
    return valid(dt) ? k_dtypes[dt].size : 0;
}

const char *moe_dtype_name(moe_dtype dt) {
    return valid(dt) ? k_dtypes[dt].name : "?";
}

const char *moe_dtype_safetensors_name(moe_dtype dt) {
    return valid(dt) ? k_dtypes[dt].st_name : "?";
}

int moe_dtype_is_float(moe_dtype dt) {
    return valid(dt) && k_dtypes[dt].is_float;
}

moe_status moe_dtype_parse(const char *name, moe_dtype *out, moe_err *err) {
    for (int i = 0; i < MOE_DTYPE_COUNT; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0 || strcmp(name, k_dtypes[i].st_name) == 0) {
            *out = (moe_dtype)i;
            return MOE_OK;
        }
    }
    moe_err_set(err, MOE_ERR_INPUT, NULL, "unknown dtype '%s'", name);
    moe_err_hint(err, "valid dtypes: f32, bf16, f16, e4m3, e5m2, e8m0, i32, i64, u8, u16");
    return MOE_ERR_INPUT;
}

/* ---- array loops ---- */

enum { CHUNK = 2048 };

/* n float-format elements -> f32 */
static void decode_f32(float *dst, const void *src, moe_dtype dt, int64_t n) {
    switch (dt) {
    case MOE_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case MOE_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = moe_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MOE_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = moe_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MOE_DTYPE_E4M3:
        for (int64_t i = 0; i < n; i++)
            dst[i] = moe_e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    case MOE_DTYPE_E5M2:
        for (int64_t i = 0; i < n; i++)
            dst[i] = moe_e5m2_to_f32(((const uint8_t *)src)[i]);
        break;
    case MOE_DTYPE_E8M0:
        for (int64_t i = 0; i < n; i++)
            dst[i] = moe_e8m0_to_f32(((const uint8_t *)src)[i]);
        break;
    /* integers: the nearest f32 (C's conversion rounds to nearest) */
    case MOE_DTYPE_I32:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const int32_t *)src)[i];
        break;
    case MOE_DTYPE_I64:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const int64_t *)src)[i];
        break;
    case MOE_DTYPE_U8:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const uint8_t *)src)[i];
        break;
    case MOE_DTYPE_U16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const uint16_t *)src)[i];
        break;
    default:
        break;
    }
}

/* n f32 -> float-format elements */
static void encode_f32(void *dst, moe_dtype dt, const float *src, int64_t n, unsigned flags) {
    switch (dt) {
    case MOE_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case MOE_DTYPE_BF16: /* the hot pair gets its own loop */
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = moe_f32_to_bf16(src[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            moe_dtype_store_f32(dst, dt, i, src[i], flags);
        break;
    }
}

static int64_t load_int(const void *src, moe_dtype dt, int64_t i) {
    switch (dt) {
    case MOE_DTYPE_I32:
        return ((const int32_t *)src)[i];
    case MOE_DTYPE_I64:
        return ((const int64_t *)src)[i];
    case MOE_DTYPE_U8:
        return ((const uint8_t *)src)[i];
    default:
        return ((const uint16_t *)src)[i];
    }
}

static moe_status convert_int(void *dst, moe_dtype dd, const void *src, moe_dtype sd, int64_t n,
                              moe_err *err) {
    int64_t lo = 0, hi = 0;
    switch (dd) {
    case MOE_DTYPE_I32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    case MOE_DTYPE_I64:
        lo = INT64_MIN, hi = INT64_MAX;
        break;
    case MOE_DTYPE_U8:
        hi = UINT8_MAX;
        break;
    default:
        hi = UINT16_MAX;
        break;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = load_int(src, sd, i);
        if (v < lo || v > hi) {
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "element %lld = %lld does not fit in %s (range %lld..%lld)", (long long)i,
                        (long long)v, moe_dtype_name(dd), (long long)lo, (long long)hi);
            return MOE_ERR_INPUT;
        }
        switch (dd) {
        case MOE_DTYPE_I32:
            ((int32_t *)dst)[i] = (int32_t)v;
            break;
        case MOE_DTYPE_I64:
            ((int64_t *)dst)[i] = v;
            break;
        case MOE_DTYPE_U8:
            ((uint8_t *)dst)[i] = (uint8_t)v;
            break;
        default:
            ((uint16_t *)dst)[i] = (uint16_t)v;
            break;
        }
    }
    return MOE_OK;
}

moe_status moe_convert_ex(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt, int64_t n,
                          unsigned flags, moe_err *err) {
    if (!valid(dst_dt) || !valid(src_dt) || n < 0)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "moe_convert: invalid dtype or count");
    if (dst_dt == src_dt) {
        memmove(dst, src, (size_t)n * k_dtypes[src_dt].size);
        return MOE_OK;
    }
    if (!k_dtypes[dst_dt].is_float) {
        if (k_dtypes[src_dt].is_float) {
            moe_err_set(err, MOE_ERR_INPUT, NULL, "cannot convert %s to %s", moe_dtype_name(src_dt),
                        moe_dtype_name(dst_dt));
            moe_err_hint(err, "float to integer conversion is not defined; round explicitly");
            return MOE_ERR_INPUT;
        }
        return convert_int(dst, dst_dt, src, src_dt, n, err);
    }
    size_t ss = k_dtypes[src_dt].size, ds = k_dtypes[dst_dt].size;
    int64_t nchunks = (n + CHUNK - 1) / CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= 8 * CHUNK)
#endif
    for (int64_t c = 0; c < nchunks; c++) {
        float tmp[CHUNK];
        int64_t off = c * CHUNK, m = n - off < CHUNK ? n - off : CHUNK;
        const char *s = (const char *)src + (size_t)off * ss;
        char *d = (char *)dst + (size_t)off * ds;
        if (src_dt == MOE_DTYPE_F32) {
            encode_f32(d, dst_dt, (const float *)s, m, flags);
        } else if (dst_dt == MOE_DTYPE_F32) {
            decode_f32((float *)d, s, src_dt, m);
        } else {
            decode_f32(tmp, s, src_dt, m);
            encode_f32(d, dst_dt, tmp, m, flags);
        }
    }
    return MOE_OK;
}

moe_status moe_convert(void *dst, moe_dtype dst_dt, const void *src, moe_dtype src_dt, int64_t n,
                       moe_err *err) {
    return moe_convert_ex(dst, dst_dt, src, src_dt, n, 0, err);
}
