/* test_rng: Philox-4x32-10 known answers, the (seed, stream, index) mapping, and the
 * libm-free ln/sin/cos/Box-Muller against libm in double.
 *
 * The known-answer vectors are the philox4x32 10-round lines of Random123's
 * tests/kat_vectors (D. E. Shaw Research). The frozen hash at the end pins the exact
 * normal stream: if it changes, every model initialised from a seed changes too, so change
 * it only on purpose (and say so in the commit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/rng.h"
#include "testlib.h"

#define FROZEN_HASH 0xe741598abb8a24ccull /* see the banner before changing */

static void test_kat(void) {
    static const uint32_t kat[3][10] = {
        /* ctr[4], key[2], expected[4] */
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        moe_philox4x32_10(kat[t], kat[t] + 4, out);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(out[i] == kat[t][6 + i], "KAT %d word %d: 0x%08x, expected 0x%08x", t, i,
                      out[i], kat[t][6 + i]);
    }
}

static void test_mapping(void) {
    /* word `index` of (seed, stream) is lane index%4 of block index/4, key = seed halves,
     * counter = {block lo, block hi, stream lo, stream hi} */
    uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
    uint64_t block = 0x100000002ull;
    uint32_t ctr[4] = {2, 1, 0x76543210u, 0xfedcba98u}, key[2] = {0x89abcdefu, 0x01234567u}, w[4];
    moe_philox4x32_10(ctr, key, w);
    for (int lane = 0; lane < 4; lane++) {
        CHECK(moe_rng_u32(seed, stream, 4 * block + (uint64_t)lane) == w[lane]);
        float u = moe_rng_uniform(seed, stream, 4 * block + (uint64_t)lane);
        CHECK(u == ldexpf((float)(w[lane] >> 8), -24));
    }
    CHECK(moe_rng_u32_to_uniform(0xffffffffu) == 1.0f - ldexpf(1.0f, -24));
    CHECK(moe_rng_u32_to_uniform(0xffu) == 0.0f);
    /* different seeds / streams / indices give different words */
    CHECK(moe_rng_u32(1, 0, 0) != moe_rng_u32(2, 0, 0));
    CHECK(moe_rng_u32(1, 0, 0) != moe_rng_u32(1, 1, 0));
    CHECK(moe_rng_u32(1, 0, 0) != moe_rng_u32(1, 0, 1));
}

static void test_math(int stride) {
    double worst_log = 0, worst_trig = 0;
    for (uint32_t m = 1; m <= (1u << 24); m += (m < 4096 ? 1u : (uint32_t)stride)) {
        double want = log(ldexp((double)m, -24)), got = moe_rng_log_u24_(m);
        double e = fabs(got - want) / fmax(1.0, fabs(want));
        if (e > worst_log) worst_log = e;
    }
    for (uint32_t j = 0; j < (1u << 24); j += (uint32_t)stride) {
        double sn, cs, a = 2.0 * M_PI * ldexp((double)j, -24);
        moe_rng_sincos_u24_(j, &sn, &cs);
        double e = fmax(fabs(sn - sin(a)), fabs(cs - cos(a)));
        if (e > worst_trig) worst_trig = e;
    }
    /* quadrant boundaries and the pi/4 fold exactly */
    for (uint32_t j = 0; j < (1u << 24); j += 1u << 21) {
        double sn, cs, a = 2.0 * M_PI * ldexp((double)j, -24);
        moe_rng_sincos_u24_(j, &sn, &cs);
        CHECK_NEAR(sn, sin(a), 1e-15);
        CHECK_NEAR(cs, cos(a), 1e-15);
    }
    CHECK_MSG(worst_log < 1e-15, "ln error %g", worst_log);
    CHECK_MSG(worst_trig < 1e-15, "sin/cos error %g", worst_trig);
    fprintf(stderr, "ln rel err %.2g, sin/cos abs err %.2g\n", worst_log, worst_trig);
}

static void test_normal(void) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float));
    uint64_t seed = 20260101, stream = 3;
    moe_rng_fill_normal(x, N - 3, 0.0f, 1.0f, seed, stream); /* ragged: not a multiple of 4 */
    int mism = 0, off = 0;
    double s1 = 0, s2 = 0, maxabs = 0, in1 = 0;
    for (int i = 0; i < N - 3; i++) {
        float z = moe_rng_normal(seed, stream, (uint64_t)i);
        if (memcmp(&z, &x[i], 4) != 0) mism++;
        /* independent Box-Muller with libm from the same words */
        uint32_t we = moe_rng_u32(seed, stream, (uint64_t)(i & ~1)),
                 wo = moe_rng_u32(seed, stream, (uint64_t)(i | 1));
        double r = sqrt(-2.0 * log(ldexp((double)((we >> 8) + 1), -24)));
        double th = 2.0 * M_PI * ldexp((double)(wo >> 8), -24);
        double ref = r * ((i & 1) ? sin(th) : cos(th));
        if (fabs((double)z - ref) > 1e-6 * fmax(1.0, fabs(ref))) off++;
        s1 += z, s2 += (double)z * z;
        if (fabs(z) > maxabs) maxabs = fabs(z);
        in1 += fabs(z) < 1.0;
    }
    double n = N - 3, mean = s1 / n, var = s2 / n - mean * mean;
    CHECK_INT_EQ(mism, 0);
    CHECK_INT_EQ(off, 0);
    CHECK_NEAR(mean, 0.0, 5.0 / sqrt(n));
    CHECK_NEAR(var, 1.0, 0.01);
    CHECK_NEAR(in1 / n, 0.682689, 0.003);
    CHECK(maxabs <= sqrt(2.0 * 24.0 * log(2.0)) + 1e-6);
    /* affine fill */
    moe_rng_fill_normal(x, 1000, 2.0f, 0.5f, seed, stream + 1);
    int aff = 0;
    for (int i = 0; i < 1000; i++)
        aff += x[i] != 2.0f + 0.5f * moe_rng_normal(seed, stream + 1, (uint64_t)i);
    CHECK_INT_EQ(aff, 0);
    /* uniform fill: range and a 16-bin chi-square (15 dof; 99.9% point ~37.7) */
    moe_rng_fill_uniform(x, N, -1.0f, 3.0f, seed, stream);
    double bins[16] = {0}, chi = 0;
    int outside = 0;
    for (int i = 0; i < N; i++) {
        if (!(x[i] >= -1.0f && x[i] < 3.0f))
            outside++;
        else
            bins[(int)((x[i] + 1.0f) * 4.0f)]++;
    }
    for (int b = 0; b < 16; b++)
        chi += (bins[b] - N / 16.0) * (bins[b] - N / 16.0) / (N / 16.0);
    CHECK_INT_EQ(outside, 0);
    CHECK_MSG(chi < 37.7, "uniform chi-square %g", chi);
    free(x);
}

/* FNV-1a over the bits of the first 4096 normals of (seed 1234, stream 7): pins the stream. */
static void test_frozen(void) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < 4096; i++) {
        float z = moe_rng_normal(1234, 7, i);
        uint32_t u;
        memcpy(&u, &z, 4);
        for (int b = 0; b < 4; b++)
            h = (h ^ ((u >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
    fprintf(stderr, "normal stream hash 0x%016llx\n", (unsigned long long)h);
    CHECK_MSG(h == FROZEN_HASH, "normal stream changed: hash 0x%016llx", (unsigned long long)h);
}

int main(void) {
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
    int stride = 7;
#else
    int stride = 97;
#endif
    test_kat();
    test_mapping();
    test_math(stride);
    test_normal();
    test_frozen();
    return test_summary("test_rng");
}
