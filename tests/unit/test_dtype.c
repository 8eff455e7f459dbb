/* test_dtype: the dtype conversions against references computed from the format definitions.
 *
 * Decoding: every code of every 8- and 16-bit format is compared with sign * mantissa *
 * 2^exponent evaluated with ldexp() in double from the format's field layout (nothing here
 * calls the code under test to build expectations). Encoding: for each format a table of
 * every non-negative finite value (plus the value one step past the largest, which stands
 * for "overflow") is built the same way; the expected code of an f32 x is found by binary
 * search in that table and an exact comparison against the midpoint of the two neighbours
 * (ties go to the even code). The f32 inputs: every midpoint between adjacent codes of every
 * format, every code value, and one f32 ulp either side of each (the tie and near-tie cases);
 * +-0, +-Inf, NaNs, f32 subnormals; and a strided sweep over all 2^32 bit patterns whose
 * stride adapts to the build (dense under -O2, sparser under -O0/ASan, so the test stays
 * well under a minute). MOE_TEST_DTYPE_FULL=1 sweeps all 2^32 patterns. The same inputs go
 * through the split master (moe_f32_split_bf16 / moe_f32_join_bf16, optim.master split): the
 * halves join to the input's bits and the high half is the reference's bf16 code with ties
 * away from zero (a NaN joins to a NaN of its sign). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/dtype.h"
#include "testlib.h"

/* ---- format definitions (the reference) ---- */

typedef enum { KIND_IEEE, KIND_FN, KIND_E8M0 } fmt_kind; /* FN: e4m3, NaN only at all-ones */

typedef struct fmt {
    const char *name;
    int ebits, mbits, bias;
    fmt_kind kind;
    int ncodes_mag; /* number of magnitude codes incl. specials (2^(E+M)) */
    int max_code;   /* largest finite magnitude code */
    double *val;    /* [max_code + 2]: values of magnitude codes 0..max_code, then "overflow" */
} fmt;

static fmt F_BF16 = {"bf16", 8, 7, 127, KIND_IEEE, 0, 0, NULL};
static fmt F_F16 = {"f16", 5, 10, 15, KIND_IEEE, 0, 0, NULL};
static fmt F_E4M3 = {"e4m3", 4, 3, 7, KIND_FN, 0, 0, NULL};
static fmt F_E5M2 = {"e5m2", 5, 2, 15, KIND_IEEE, 0, 0, NULL};
static fmt F_E8M0 = {"e8m0", 8, 0, 127, KIND_E8M0, 0, 0, NULL};

/* Magnitude code -> value by the definition, as if every code were a finite number. */
static double def_value(const fmt *f, uint32_t mag) {
    if (f->kind == KIND_E8M0) return ldexp(1.0, (int)mag - 127);
    uint32_t e = mag >> f->mbits, m = mag & ((1u << f->mbits) - 1u);
    if (e == 0) return ldexp((double)m, 1 - f->bias - f->mbits);
    return ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
}

/* 1 when magnitude code is NaN, 2 when Inf, 0 when finite. */
static int def_special(const fmt *f, uint32_t mag) {
    uint32_t emax = (1u << f->ebits) - 1u, e = mag >> f->mbits, m = mag & ((1u << f->mbits) - 1u);
    switch (f->kind) {
    case KIND_IEEE:
        return e == emax ? (m ? 1 : 2) : 0;
    case KIND_FN:
        return mag == (1u << (f->ebits + f->mbits)) - 1u ? 1 : 0;
    default:
        return mag == 0xffu ? 1 : 0;
    }
}

static void fmt_init(fmt *f) {
    f->ncodes_mag = 1 << (f->ebits + f->mbits);
    f->max_code = 0;
    for (int c = 0; c < f->ncodes_mag; c++)
        if (!def_special(f, (uint32_t)c)) f->max_code = c;
    f->val = malloc(sizeof(double) * (size_t)(f->max_code + 2));
    for (int c = 0; c <= f->max_code + 1; c++)
        f->val[c] = def_value(f, (uint32_t)c);
}

/* ---- decode: every code ---- */

static float dec(const fmt *f, uint32_t code) {
    if (f == &F_BF16) return moe_bf16_to_f32((uint16_t)code);
    if (f == &F_F16) return moe_f16_to_f32((uint16_t)code);
    if (f == &F_E4M3) return moe_e4m3_to_f32((uint8_t)code);
    if (f == &F_E5M2) return moe_e5m2_to_f32((uint8_t)code);
    return moe_e8m0_to_f32((uint8_t)code);
}

static void test_decode_all(fmt *f) {
    int signed_fmt = f->kind != KIND_E8M0;
    uint32_t ncodes = (uint32_t)f->ncodes_mag * (signed_fmt ? 2u : 1u);
    int bad = 0;
    for (uint32_t code = 0; code < ncodes; code++) {
        uint32_t mag = code & (uint32_t)(f->ncodes_mag - 1);
        int neg = signed_fmt && code >= (uint32_t)f->ncodes_mag;
        float got = dec(f, code);
        int sp = def_special(f, mag);
        int ok;
        if (sp == 1)
            ok = isnan(got);
        else if (sp == 2)
            ok = isinf(got) && (signbit(got) != 0) == neg;
        else {
            double want = neg ? -def_value(f, mag) : def_value(f, mag);
            ok = (double)got == want && (signbit(got) != 0) == neg;
        }
        if (!ok && bad++ < 5)
            test_fail(__FILE__, __LINE__, "%s decode 0x%x -> %a", f->name, code, (double)got);
    }
    CHECK_MSG(bad == 0, "%s: %d codes decode wrongly", f->name, bad);
}

/* ---- encode reference ---- */

/* Nearest magnitude code to a >= 0 (finite), ties to even (away: to the larger); may return
 * max_code + 1. */
static uint32_t ref_nearest_ties(const fmt *f, double a, int away) {
    int lo = 0, hi = f->max_code + 1; /* largest i with val[i] <= a */
    if (a >= f->val[hi]) return (uint32_t)hi;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (f->val[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    if (a == f->val[lo]) return (uint32_t)lo;
    double m = 0.5 * (f->val[lo] + f->val[lo + 1]); /* exact: few significant bits */
    if (a < m) return (uint32_t)lo;
    if (a > m) return (uint32_t)lo + 1;
    return (uint32_t)((lo & 1) || away ? lo + 1 : lo);
}
static uint32_t ref_nearest(const fmt *f, double a) {
    return ref_nearest_ties(f, a, 0);
}

/* moe_f32_split_bf16 of the f32 with these bits: its halves join to the same bits (a NaN to
 * a NaN of its sign, the high half then moe_f32_to_bf16's), and the high half is the
 * bf16 nearest to x with ties away from zero (beyond the largest finite: Inf). */
static int check_split(uint32_t bits) {
    float x;
    memcpy(&x, &bits, 4);
    uint16_t hi, lo;
    moe_f32_split_bf16(x, &hi, &lo);
    float y = moe_f32_join_bf16(hi, lo);
    uint32_t yb;
    memcpy(&yb, &y, 4);
    if (isnan(x)) return isnan(y) && (yb >> 31) == (bits >> 31) && hi == moe_f32_to_bf16(x);
    uint32_t sign = bits >> 31 ? 0x8000u : 0u;
    uint32_t want = isinf(x) ? 0x7f80u : ref_nearest_ties(&F_BF16, fabs((double)x), 1);
    return yb == bits && hi == (sign | want);
}

/* Expected code of x for a signed format with the given saturation. */
static uint32_t ref_encode(const fmt *f, float x, int sat, int *want_nan) {
    uint32_t sign = signbit(x) ? (uint32_t)f->ncodes_mag : 0u;
    uint32_t inf_code = (uint32_t)f->max_code + 1; /* IEEE formats: Inf follows max */
    *want_nan = 0;
    if (isnan(x)) {
        *want_nan = 1;
        return sign | (uint32_t)(f->ncodes_mag - 1); /* checked exactly for fp8 only */
    }
    uint32_t r = isinf(x) ? inf_code : ref_nearest(f, fabs((double)x));
    if (r > (uint32_t)f->max_code) {
        if (sat)
            r = (uint32_t)f->max_code;
        else if (f->kind == KIND_FN)
            r = (uint32_t)(f->ncodes_mag - 1), *want_nan = 1;
        else
            r = inf_code;
    }
    return sign | r;
}

/* e8m0: mode 0 nearest (ties even), 1 floor, 2 ceil. */
static uint32_t ref_e8m0(float x, int mode) {
    if (isnan(x) || (x < 0) || isinf(x)) return 0xffu;
    if (x == 0) return 0;
    double a = (double)x;
    const double *v = F_E8M0.val;
    if (mode == 0) {
        uint32_t r = ref_nearest(&F_E8M0, a);
        return r > 254u ? 254u : r;
    }
    int c;
    if (mode == 1) {
        for (c = 254; c > 0 && v[c] > a; c--)
            continue;
    } else {
        for (c = 0; c < 254 && v[c] < a; c++)
            continue;
    }
    return (uint32_t)c;
}

/* ---- the sweep ---- */

typedef struct sweep_stats {
    int64_t points, bad[10];
    uint32_t first_bad[10];
} sweep_stats;

static const char *k_enc_names[10] = {"bf16",      "f16",        "e4m3 sat",  "e4m3 nosat",
                                      "e5m2 sat",  "e5m2 nosat", "e8m0 near", "e8m0 floor",
                                      "e8m0 ceil", "bf16 split"};

static int check_one(uint32_t bits, int which) {
    float x;
    memcpy(&x, &bits, 4);
    int nan = 0;
    uint32_t want, got;
    switch (which) {
    case 0:
        want = ref_encode(&F_BF16, x, 0, &nan), got = moe_f32_to_bf16(x);
        return nan ? (isnan(moe_bf16_to_f32((uint16_t)got)) && (got >> 15) == (bits >> 31))
                   : got == want;
    case 1:
        want = ref_encode(&F_F16, x, 0, &nan), got = moe_f32_to_f16(x);
        return nan ? (isnan(moe_f16_to_f32((uint16_t)got)) && (got >> 15) == (bits >> 31))
                   : got == want;
    case 2:
        return moe_f32_to_e4m3(x, 1) == ref_encode(&F_E4M3, x, 1, &nan);
    case 3:
        return moe_f32_to_e4m3(x, 0) == ref_encode(&F_E4M3, x, 0, &nan);
    case 4:
        return moe_f32_to_e5m2(x, 1) == ref_encode(&F_E5M2, x, 1, &nan);
    case 5:
        return moe_f32_to_e5m2(x, 0) == ref_encode(&F_E5M2, x, 0, &nan);
    case 6:
        return moe_f32_to_e8m0(x) == ref_e8m0(x, 0);
    case 7:
        return moe_f32_to_e8m0_floor(x) == ref_e8m0(x, 1);
    case 8:
        return moe_f32_to_e8m0_ceil(x) == ref_e8m0(x, 2);
    default:
        return check_split(bits);
    }
}

static void check_bits(sweep_stats *st, uint32_t bits) {
    st->points++;
    for (int w = 0; w < 10; w++)
        if (!check_one(bits, w) && st->bad[w]++ == 0) st->first_bad[w] = bits;
}

static uint32_t f32bits(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* value, midpoint to the next code, and one f32 ulp either side of each, both signs */
static void sweep_format_points(sweep_stats *st, const fmt *f) {
    for (int c = 0; c <= f->max_code; c++) {
        double pts[2] = {f->val[c], 0.5 * (f->val[c] + f->val[c + 1])};
        for (int k = 0; k < 2; k++) {
            uint32_t u = f32bits(pts[k]);
            if ((double)((float)pts[k]) != pts[k]) continue; /* not an f32: not a tie */
            for (uint32_t d = 0; d < 3; d++) {
                uint32_t v = u + d - 1u;
                if (u == 0 && d == 0) continue;
                check_bits(st, v);
                check_bits(st, v | 0x80000000u);
            }
        }
    }
}

static void test_encode(void) {
    sweep_stats st;
    memset(&st, 0, sizeof st);
    const fmt *fs[5] = {&F_BF16, &F_F16, &F_E4M3, &F_E5M2, &F_E8M0};
    for (int i = 0; i < 5; i++)
        sweep_format_points(&st, fs[i]);
    /* specials: zeros, infinities, NaN payloads, extremes, f32 subnormals (strided) */
    uint32_t specials[] = {0x0u,        0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fffffffu,
                           0x7fa00000u, 0x7f7fffffu, 0x00800000u, 0x00000001u, 0x007fffffu,
                           0x00400000u, 0x00600000u, 0x00600001u, 0x005fffffu, 0x3f800000u};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        check_bits(&st, specials[i]);
        check_bits(&st, specials[i] | 0x80000000u);
    }
    for (uint32_t u = 1; u < 0x00800000u; u += 97)
        check_bits(&st, u);
    /* strided sweep over all bit patterns: an odd stride hits every pattern of the low
     * (rounding and sticky) bits many times, across every exponent */
    uint64_t stride;
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
    stride = 211; /* ~20M patterns */
#else
    stride = 1031; /* ~4M patterns: -O0 and sanitizers are ~10-30x slower */
#endif
    const char *full = getenv("MOE_TEST_DTYPE_FULL");
    if (full && strcmp(full, "1") == 0) stride = 1;
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        sweep_stats loc;
        memset(&loc, 0, sizeof loc);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < (int64_t)((1ull << 32) / stride); i++)
            check_bits(&loc, (uint32_t)((uint64_t)i * stride));
#ifdef _OPENMP
#pragma omp critical
#endif
        {
            st.points += loc.points;
            for (int w = 0; w < 10; w++) {
                if (loc.bad[w] && !st.bad[w]) st.first_bad[w] = loc.first_bad[w];
                st.bad[w] += loc.bad[w];
            }
        }
    }
    for (int w = 0; w < 10; w++)
        CHECK_MSG(st.bad[w] == 0, "encode %s: %lld of %lld inputs wrong, first 0x%08x",
                  k_enc_names[w], (long long)st.bad[w], (long long)st.points, st.first_bad[w]);
    fprintf(stderr, "encode sweep: %lld f32 inputs x 10 encoders (stride %llu)\n",
            (long long)st.points, (unsigned long long)stride);
}

/* ---- the documented rules, spelled out (values from the format definitions) ---- */

static void test_documented_rules(void) {
    CHECK_INT_EQ(moe_f32_to_e4m3(448.0f, 0), 0x7e);
    CHECK_INT_EQ(moe_f32_to_e4m3(464.0f, 0), 0x7e); /* tie between 448 and "480": even */
    CHECK_INT_EQ(moe_f32_to_e4m3(465.0f, 0), 0x7f); /* overflow -> NaN */
    CHECK_INT_EQ(moe_f32_to_e4m3(465.0f, 1), 0x7e);
    CHECK_INT_EQ(moe_f32_to_e4m3(-INFINITY, 1), 0xfe);
    CHECK_INT_EQ(moe_f32_to_e4m3(-INFINITY, 0), 0xff);
    CHECK_INT_EQ(moe_f32_to_e4m3(ldexpf(1.0f, -10), 0), 0x00); /* half the smallest: tie to 0 */
    CHECK_INT_EQ(moe_f32_to_e4m3(ldexpf(3.0f, -10), 0), 0x02); /* 1.5 units: tie to even 2 */
    CHECK_INT_EQ(moe_f32_to_e5m2(57344.0f, 0), 0x7b);
    CHECK_INT_EQ(moe_f32_to_e5m2(61440.0f, 0), 0x7c); /* tie: max has odd mantissa -> Inf */
    CHECK_INT_EQ(moe_f32_to_e5m2(61440.0f, 1), 0x7b);
    CHECK_INT_EQ(moe_f32_to_e5m2(INFINITY, 0), 0x7c);
    CHECK_INT_EQ(moe_f32_to_e5m2(INFINITY, 1), 0x7b);
    CHECK_INT_EQ(moe_f32_to_e5m2(NAN, 0), 0x7f);
    CHECK_INT_EQ(moe_f32_to_f16(65504.0f), 0x7bff);
    CHECK_INT_EQ(moe_f32_to_f16(65519.0f), 0x7bff);
    CHECK_INT_EQ(moe_f32_to_f16(65520.0f), 0x7c00);
    CHECK_INT_EQ(moe_f32_to_f16(-0.0f), 0x8000);
    CHECK_INT_EQ(moe_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80); /* tie: down to even */
    CHECK_INT_EQ(moe_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82); /* tie: up to even */
    CHECK_INT_EQ(moe_f32_to_bf16(FLT_MAX), 0x7f80);                 /* rounds to Inf */
    CHECK(isnan(moe_bf16_to_f32(moe_f32_to_bf16(NAN))));
    CHECK(isnan(moe_bf16_to_f32(moe_f32_to_bf16(-NAN))));
    /* the split master's halves (hi, lo as 16-bit codes) */
    const struct {
        uint32_t x;
        uint16_t hi, lo;
    } split[] = {
        {0x3f808000u, 0x3f81, 0x8000}, /* tie 1 + 2^-8: away from zero (even would be 0x3f80) */
        {0xbf808000u, 0xbf81, 0x8000}, /* the same, negative */
        {0x3f818000u, 0x3f82, 0x8000}, /* tie whose even neighbour is above: both rules agree */
        {0x3f807fffu, 0x3f80, 0x7fff}, /* just below the tie */
        {0x3f808001u, 0x3f81, 0x8001}, /* just above: lo -32767 */
        {0x7f7fffffu, 0x7f80, 0xffff}, /* FLT_MAX: hi Inf, lo -1 */
        {0x7f800000u, 0x7f80, 0x0000}, /* Inf */
        {0x80000000u, 0x8000, 0x0000}, /* -0 */
        {0x00000001u, 0x0000, 0x0001}, /* the smallest subnormal */
        {0x00008000u, 0x0001, 0x8000}, /* a subnormal tie */
        {0x7f800001u, 0x7fc0, 0x0000}, /* a signalling NaN: quietened, low payload gone */
        {0xffffffffu, 0xffff, 0x0000}, /* a NaN whose rounding would carry out of the field */
    };
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) {
        float x, y;
        uint16_t hi, lo;
        uint32_t u = split[i].x, yb;
        memcpy(&x, &u, 4);
        moe_f32_split_bf16(x, &hi, &lo);
        y = moe_f32_join_bf16(hi, lo);
        memcpy(&yb, &y, 4);
        CHECK_MSG(hi == split[i].hi && lo == split[i].lo, "split 0x%08x: hi 0x%04x lo 0x%04x", u,
                  hi, lo);
        CHECK_MSG(isnan(x) ? isnan(y) && (yb >> 31) == (u >> 31) : yb == u,
                  "join of split 0x%08x: 0x%08x", u, yb);
    }
    /* e8m0: 3 = 1.5*2 is a tie between 2^1 (code 128) and 2^2 (129): even code 128 */
    CHECK_INT_EQ(moe_f32_to_e8m0(3.0f), 128);
    CHECK_INT_EQ(moe_f32_to_e8m0(6.0f), 130); /* 1.5*4: 129 or 130 -> 130 */
    CHECK_INT_EQ(moe_f32_to_e8m0(3.0001f), 129);
    CHECK_INT_EQ(moe_f32_to_e8m0_floor(3.9f), 128);
    CHECK_INT_EQ(moe_f32_to_e8m0_ceil(2.1f), 129);
    CHECK_INT_EQ(moe_f32_to_e8m0_ceil(2.0f), 128);
    CHECK_INT_EQ(moe_f32_to_e8m0(0.0f), 0);
    CHECK_INT_EQ(moe_f32_to_e8m0(-0.0f), 0);
    CHECK_INT_EQ(moe_f32_to_e8m0(-1.0f), 0xff);
    CHECK_INT_EQ(moe_f32_to_e8m0(INFINITY), 0xff);
    CHECK_INT_EQ(moe_f32_to_e8m0_ceil(FLT_MAX), 254);
    CHECK(moe_e8m0_to_f32(0) == ldexpf(1.0f, -127));
    CHECK(isnan(moe_e8m0_to_f32(0xff)));
}

/* ---- names, sizes, bulk conversion ---- */

static void test_names(void) {
    moe_err err;
    for (int i = 0; i < MOE_DTYPE_COUNT; i++) {
        moe_dtype d = (moe_dtype)-1;
        moe_err_clear(&err);
        CHECK_INT_EQ(moe_dtype_parse(moe_dtype_name((moe_dtype)i), &d, &err), MOE_OK);
        CHECK_INT_EQ(d, i);
        CHECK_INT_EQ(moe_dtype_parse(moe_dtype_safetensors_name((moe_dtype)i), &d, &err), MOE_OK);
        CHECK_INT_EQ(d, i);
    }
    CHECK(strcmp(moe_dtype_name(MOE_DTYPE_E4M3), "e4m3") == 0);
    CHECK(strcmp(moe_dtype_safetensors_name(MOE_DTYPE_E5M2), "F8_E5M2") == 0);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_F32), 4);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_BF16), 2);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_E8M0), 1);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_I64), 8);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_U16), 2);
    CHECK_INT_EQ(moe_dtype_size(MOE_DTYPE_COUNT), 0);
    CHECK(moe_dtype_is_float(MOE_DTYPE_E8M0) && !moe_dtype_is_float(MOE_DTYPE_U8));
    moe_dtype d;
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_dtype_parse("fp32", &d, &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "fp32") != NULL && strstr(err.hint, "bf16") != NULL);
}

static void test_bulk(void) {
    enum { N = 70001 }; /* several chunks and a ragged tail; large enough for threads */
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * 2);
    uint8_t *b = malloc(N);
    moe_err err;
    moe_err_clear(&err);
    for (int i = 0; i < N; i++) { /* a spread of magnitudes and signs, some specials */
        uint32_t u = (uint32_t)i * 2654435761u;
        memcpy(&x[i], &u, 4);
    }
    x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = 1e30f;
    int bad = 0;
    CHECK_INT_EQ(moe_convert(h, MOE_DTYPE_BF16, x, MOE_DTYPE_F32, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += h[i] != moe_f32_to_bf16(x[i]);
    CHECK_INT_EQ(moe_convert(y, MOE_DTYPE_F32, h, MOE_DTYPE_BF16, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += moe_f32_bits(y[i]) != moe_f32_bits(moe_bf16_to_f32(h[i]));
    CHECK_INT_EQ(moe_convert(h, MOE_DTYPE_F16, x, MOE_DTYPE_F32, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += h[i] != moe_f32_to_f16(x[i]);
    CHECK_INT_EQ(moe_convert(b, MOE_DTYPE_E4M3, x, MOE_DTYPE_F32, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b[i] != moe_f32_to_e4m3(x[i], 1);
    CHECK_INT_EQ(moe_convert_ex(b, MOE_DTYPE_E5M2, x, MOE_DTYPE_F32, N, MOE_CVT_NOSAT, &err),
                 MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b[i] != moe_f32_to_e5m2(x[i], 0);
    /* e5m2 -> e4m3 goes through f32 */
    uint8_t *b2 = malloc(N);
    CHECK_INT_EQ(moe_convert(b2, MOE_DTYPE_E4M3, b, MOE_DTYPE_E5M2, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b2[i] != moe_f32_to_e4m3(moe_e5m2_to_f32(b[i]), 1);
    CHECK_INT_EQ(moe_convert(b2, MOE_DTYPE_E8M0, x, MOE_DTYPE_F32, N, &err), MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b2[i] != moe_f32_to_e8m0(x[i]);
    CHECK_INT_EQ(moe_convert_ex(b2, MOE_DTYPE_E8M0, h, MOE_DTYPE_F16, N, MOE_CVT_E8M0_CEIL, &err),
                 MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b2[i] != moe_f32_to_e8m0_ceil(moe_f16_to_f32(h[i]));
    CHECK_INT_EQ(moe_convert_ex(b2, MOE_DTYPE_E8M0, x, MOE_DTYPE_F32, N, MOE_CVT_E8M0_FLOOR, &err),
                 MOE_OK);
    for (int i = 0; i < N; i++)
        bad += b2[i] != moe_f32_to_e8m0_floor(x[i]);
    CHECK_INT_EQ(bad, 0);
    free(b2);
    /* integers */
    int32_t iv[4] = {-1, 0, 255, 70000};
    uint8_t u8[4];
    int64_t i64[4];
    float fv[4];
    CHECK_INT_EQ(moe_convert(i64, MOE_DTYPE_I64, iv, MOE_DTYPE_I32, 4, &err), MOE_OK);
    CHECK(i64[0] == -1 && i64[3] == 70000);
    CHECK_INT_EQ(moe_convert(fv, MOE_DTYPE_F32, iv, MOE_DTYPE_I32, 4, &err), MOE_OK);
    CHECK(fv[0] == -1.0f && fv[3] == 70000.0f);
    CHECK_INT_EQ(moe_convert(u8, MOE_DTYPE_U8, iv + 1, MOE_DTYPE_I32, 2, &err), MOE_OK);
    CHECK(u8[0] == 0 && u8[1] == 255);
    CHECK_INT_EQ(moe_convert(u8, MOE_DTYPE_U8, iv, MOE_DTYPE_I32, 4, &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "element 0") != NULL);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_convert(iv, MOE_DTYPE_I32, fv, MOE_DTYPE_F32, 4, &err), MOE_ERR_INPUT);
    free(x), free(y), free(h), free(b);
}

int main(void) {
    fmt *fs[5] = {&F_BF16, &F_F16, &F_E4M3, &F_E5M2, &F_E8M0};
    for (int i = 0; i < 5; i++)
        fmt_init(fs[i]);
    CHECK_INT_EQ(F_E4M3.max_code, 0x7e);
    CHECK(F_E4M3.val[0x7e] == 448.0 && F_E5M2.val[0x7b] == 57344.0 && F_F16.val[0x7bff] == 65504.0);
    for (int i = 0; i < 5; i++)
        test_decode_all(fs[i]);
    test_documented_rules();
    test_names();
    test_bulk();
    double t0 = (double)clock();
    test_encode();
    fprintf(stderr, "encode sweep: %.1f s CPU\n", ((double)clock() - t0) / CLOCKS_PER_SEC);
    for (int i = 0; i < 5; i++)
        free(fs[i]->val);
    return test_summary("test_dtype");
}
