/* test_mx_native: the native MXFP8 operands of mxfp8's products on MXFP8 tensor cores
 * (cuBLASLt's VEC32_UE8M0, sm_100+): the CUDA kernels (moe_cuda_mx_native_operand) against
 * the CPU reference moe_mx_encode_tiled, byte for byte, e4m3 values and tiled e8m0 scales with
 * their padding included.
 *
 * Inputs of the three types an operand has (F32; BF16; MXFP8, decoded by the kernels) with
 * outliers, zeros, E4M3 subnormals after scaling, NaN of both signs and infinities; groups of
 * uneven sizes (0, 1, 37, 130, 256 rows: empty groups, partial tiles, a group straddling two
 * tiles), K = 96 (a tile of scales with one padding column) and K = 256; both scale rules;
 * along the rows and transposed (each group's tokens padded to 128 with zeros). Guard bytes
 * after q and sc must stay untouched. The kernels are not specific to sm_100, so this runs on
 * any GPU; the products themselves need one with MXFP8 tensor cores (be->mx_native, printed).
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/dtype.h"
#include "moe/quant.h"
#include "testlib.h"

#define GUARD 64 /* bytes after each output, 0xab before and after */

static uint64_t g_rng = 0x5eed;

static float urand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* x [M, K] with the special values and a row scale from 2^-20 to 2^20 (blocks of very
 * different scales, E4M3 subnormals in the small ones). */
static void fill(float *x, int64_t M, int64_t K) {
    for (int64_t r = 0; r < M; r++) {
        const float rs = ldexpf(1.0f, (int)(r % 41) - 20);
        for (int64_t k = 0; k < K; k++) {
            float v = urand() * rs;
            if ((r * K + k) % 97 == 11) v *= 3e3f;     /* outliers */
            if ((r * K + k) % 53 == 7) v = rs * 1e-5f; /* far below their block's amax */
            x[r * K + k] = v;
        }
    }
    for (int64_t k = 0; k < K && M > 3; k++) /* a row of zeros */
        x[3 * K + k] = 0.0f;
    x[5] = NAN, x[K + 6] = -NAN, x[2 * K + 7] = INFINITY, x[M * K - 1] = -INFINITY;
}

static void *dev(const moe_backend *be, const void *host, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (p && host) be->memcpy_h2d(be, p, host, bytes);
    return p;
}

/* One case: x of type dt (1 F32, 2 BF16, 3 MXFP8) over groups `counts`, transposed or not, by
 * the rule floor_rule. */
static void run_case(const moe_backend *be, const int64_t *counts, int64_t E, int64_t K, int dt,
                     int transpose, int floor_rule) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + (int32_t)counts[e];
    const int64_t M = off[E];
    float *x = malloc((size_t)(M * K) * sizeof *x);
    fill(x, M, K);
    /* the values the kernels read: the input as its type stores it */
    uint8_t *xq = malloc((size_t)(M * K + M * K / 32));
    if (dt == 2)
        for (int64_t i = 0; i < M * K; i++)
            x[i] = moe_bf16_to_f32(moe_f32_to_bf16(x[i]));
    if (dt == 3) {
        test_mxfp8_encode(xq, xq + M * K, x, M * K);
        test_mxfp8_decode(x, xq, xq + M * K, M * K);
    }
    /* the reference: each group by moe_mx_encode_tiled, one after another */
    int64_t qn = 0, sn = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = counts[e], np = moe_mx_pad(n);
        qn += transpose ? K * np : n * K;
        sn += transpose ? moe_mx_tiled_bytes(K, np) : moe_mx_tiled_bytes(n, K);
    }
    uint8_t *rq = malloc((size_t)qn + 1), *rs = malloc((size_t)sn + 1);
    int64_t aq = 0, as = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = counts[e], np = moe_mx_pad(n);
        if (n == 0) continue;
        moe_mx_encode_tiled(rq + aq, rs + as, x + off[e] * K, n, K, floor_rule, transpose);
        aq += transpose ? K * np : n * K;
        as += transpose ? moe_mx_tiled_bytes(K, np) : moe_mx_tiled_bytes(n, K);
    }
    /* the device input */
    moe_cbuf dx;
    void *d_in = NULL, *d_mx = NULL;
    if (dt == 1) {
        d_in = dev(be, x, (size_t)(M * K) * 4);
        dx = moe_cbuf_f32(d_in);
    } else if (dt == 2) {
        uint16_t *h = malloc((size_t)(M * K) * 2);
        for (int64_t i = 0; i < M * K; i++)
            h[i] = moe_f32_to_bf16(x[i]);
        d_in = dev(be, h, (size_t)(M * K) * 2);
        free(h);
        dx = moe_cbuf_of(d_in, MOE_DTYPE_BF16);
    } else {
        d_in = dev(be, xq, (size_t)(M * K));
        d_mx = dev(be, xq + M * K, (size_t)(M * K / 32));
        dx = moe_cbuf_from(moe_buf_mxfp8(d_in, d_mx));
    }
    uint8_t *gq = malloc((size_t)qn + GUARD), *gs = malloc((size_t)sn + GUARD);
    memset(gq, 0xab, (size_t)qn + GUARD);
    memset(gs, 0xab, (size_t)sn + GUARD);
    uint8_t *d_q = dev(be, gq, (size_t)qn + GUARD), *d_s = dev(be, gs, (size_t)sn + GUARD);
    moe_cuda_mx_native_operand(be, d_q, d_s, dx, off, E, K, transpose, floor_rule);
    moe_err err;
    moe_err_clear(&err);
    const int ok = be->synchronize(be, &err) == MOE_OK;
    CHECK_MSG(ok, "mx_native_operand: %s", err.msg);
    be->memcpy_d2h(be, gq, d_q, (size_t)qn + GUARD);
    be->memcpy_d2h(be, gs, d_s, (size_t)sn + GUARD);
    int64_t bad_q = 0, bad_s = 0, first_q = -1, first_s = -1, guard = 0;
    for (int64_t i = 0; i < qn; i++) /* a NaN decoded from MXFP8 may lose its sign there */
        if (gq[i] != rq[i] && !(dt == 3 && (gq[i] & 0x7f) == 0x7f && (rq[i] & 0x7f) == 0x7f) &&
            bad_q++ == 0)
            first_q = i;
    for (int64_t i = 0; i < sn; i++)
        if (gs[i] != rs[i] && bad_s++ == 0) first_s = i;
    for (int64_t i = 0; i < GUARD; i++)
        guard += (gq[qn + i] != 0xab) + (gs[sn + i] != 0xab);
    static const char *names[] = {"", "f32", "bf16", "mxfp8"};
    CHECK_MSG(ok && bad_q == 0 && bad_s == 0 && guard == 0,
              "%s K=%lld %s rule %d: %lld of %lld bytes differ (first %lld: %02x vs %02x), %lld of "
              "%lld scales (first %lld: %02x vs %02x), %lld guard bytes written",
              names[dt], (long long)K, transpose ? "transposed" : "rows", floor_rule,
              (long long)bad_q, (long long)qn, (long long)first_q, first_q >= 0 ? gq[first_q] : 0,
              first_q >= 0 ? rq[first_q] : 0, (long long)bad_s, (long long)sn, (long long)first_s,
              first_s >= 0 ? gs[first_s] : 0, first_s >= 0 ? rs[first_s] : 0, (long long)guard);
    printf("  %-5s K=%-3lld %-10s rule %d: %lld bytes, %lld scale bytes%s\n", names[dt],
           (long long)K, transpose ? "transposed" : "rows", floor_rule, (long long)qn,
           (long long)sn, bad_q || bad_s || guard ? "  FAILED" : "  identical");
    be->free(be, d_q);
    be->free(be, d_s);
    be->free(be, d_in);
    if (d_mx) be->free(be, d_mx);
    free(gq), free(gs), free(rq), free(rs), free(xq), free(x), free(off);
}

int main(void) {
    const moe_backend *be = test_cuda_backend("gpu_test_mx_native");
    if (!be) return 77;
    printf("MXFP8 products on this GPU's tensor cores (cuBLASLt VEC32_UE8M0): %s\n",
           be->mx_native ? "yes" : "no (sm_90 and older: bf16 products of the quantized values)");
    static const int64_t counts[] = {37, 0, 130, 1, 256, 0};
    const int64_t E = sizeof counts / sizeof counts[0];
    static const int64_t Ks[] = {96, 256};
    for (int k = 0; k < 2; k++)
        for (int dt = 1; dt <= 3; dt++)
            for (int t = 0; t < 2; t++)
                for (int rule = 0; rule < 2; rule++)
                    run_case(be, counts, E, Ks[k], dt, t, rule);
    be->destroy(be);
    return test_summary("gpu_test_mx_native");
}
