/* rng: a counter-based random number generator (Philox-4x32-10) shared by CPU and GPU.
 *
 * There is no generator state: every random number is a pure function of
 * (seed, stream, index). That is what makes weight initialisation, data shuffling and
 * dropout-like draws reproducible across thread counts, world sizes, CPU and CUDA: a kernel
 * computes element i's number from i alone. The mapping, fixed forever (checkpoints and
 * tests depend on it):
 *
 *   key     = { seed & 0xffffffff, seed >> 32 }
 *   counter = { block & 0xffffffff, block >> 32, stream & 0xffffffff, stream >> 32 },
 *             block = index / 4
 *   word    = philox4x32_10(counter, key)[index % 4]
 *   uniform = (word >> 8) * 2^-24                      in [0, 1), 24 random bits, exact
 *   normal  = Box-Muller on the block's word pairs (w0,w1) -> lanes 0,1 and (w2,w3) ->
 *             lanes 2,3:  r = sqrt(-2 ln u1), u1 = ((w_even >> 8) + 1) * 2^-24 in (0, 1],
 *             theta = 2 pi (w_odd >> 8) * 2^-24; lane even = r cos theta, lane odd = r sin.
 *
 * ln, sin and cos are evaluated here in double with only + - * / sqrt (no libm, no FMA
 * contraction: see moe/hostdev.h), then rounded to float, so the CPU and nvcc-compiled
 * device code give bit-identical normals. |normal| <= sqrt(2 * 24 ln 2) ~= 5.77. */
#ifndef MOE_RNG_H
#define MOE_RNG_H

#include <stdint.h>

#include "moe/hostdev.h"

/* One Philox-4x32-10 block (Salmon et al., SC'11; Random123's philox4x32_10). */
MOE_HD void moe_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u; /* golden ratio */
            k1 += 0xBB67AE85u; /* sqrt(3) - 1 */
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The four words of block `block` of (seed, stream). */
MOE_HD void moe_rng_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    moe_philox4x32_10(ctr, key, out);
}

/* 32-bit draw -> float in [0, 1): the top 24 bits times 2^-24 (exact, never 1.0). */
MOE_HD float moe_rng_u32_to_uniform(uint32_t w) {
    return (float)(w >> 8) * 5.9604644775390625e-8f;
}

MOE_HD uint32_t moe_rng_u32(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    moe_rng_block(seed, stream, index >> 2, w);
    return w[index & 3];
}

MOE_HD float moe_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return moe_rng_u32_to_uniform(moe_rng_u32(seed, stream, index));
}

/* ln(m * 2^-24) for an integer 1 <= m <= 2^24. */
MOE_HD double moe_rng_log_u24_(uint32_t m) {
    int k = 0;
    while ((m >> k) > 1u)
        k++; /* m = 2^k * f, f in [1, 2) */
    double f = (double)m / (double)(1u << k);
    if (f > 1.4142135623730951) { /* f in [sqrt(1/2), sqrt(2)) keeps the series short */
        f = MOE_DMUL(f, 0.5);
        k++;
    }
    /* ln f = 2 s (1 + z/3 + z^2/5 + ...), s = (f-1)/(f+1), z = s^2 <= 0.0295 */
    double s = (f - 1.0) / (f + 1.0), z = MOE_DMUL(s, s), p = 0.0;
    for (int n = 12; n >= 0; n--)
        p = MOE_DADD(1.0 / (double)(2 * n + 1), MOE_DMUL(z, p));
    return MOE_DADD(MOE_DMUL((double)(k - 24), 0.69314718055994530942), MOE_DMUL(2.0 * s, p));
}

/* sin and cos of 2 pi j / 2^24 for 0 <= j < 2^24. */
MOE_HD void moe_rng_sincos_u24_(uint32_t j, double *sn, double *cs) {
    uint32_t q = j >> 22, t = j & 0x3fffffu, flip = t > 0x200000u;
    if (flip) t = 0x400000u - t; /* angle within the quadrant, folded to [0, pi/4] */
    double a = MOE_DMUL((double)t, 3.14159265358979323846 / 8388608.0), z = MOE_DMUL(a, a);
    double ps = 1.0, pc = 1.0; /* nested Taylor series, 10 terms each: error < 1e-17 */
    for (int n = 10; n >= 1; n--) {
        ps = MOE_DADD(1.0, -MOE_DMUL(z / (double)((2 * n) * (2 * n + 1)), ps));
        pc = MOE_DADD(1.0, -MOE_DMUL(z / (double)((2 * n - 1) * (2 * n)), pc));
    }
    double s = MOE_DMUL(a, ps), c = pc;
    if (flip) {
        double tmp = s;
        s = c;
        c = tmp;
    }
    switch (q) { /* rotate by q quarter turns */
    case 0:
        *sn = s, *cs = c;
        break;
    case 1:
        *sn = c, *cs = -s;
        break;
    case 2:
        *sn = -s, *cs = -c;
        break;
    default:
        *sn = -c, *cs = s;
        break;
    }
}

/* Box-Muller on one word pair: *zc = r cos theta (even lane), *zs = r sin theta (odd lane). */
MOE_HD void moe_rng_box_muller_(uint32_t w_even, uint32_t w_odd, float *zc, float *zs) {
    double r = MOE_DSQRT(-2.0 * moe_rng_log_u24_((w_even >> 8) + 1u)), sn, cs;
    moe_rng_sincos_u24_(w_odd >> 8, &sn, &cs);
    *zc = (float)MOE_DMUL(r, cs);
    *zs = (float)MOE_DMUL(r, sn);
}

/* Standard normal number `index` of (seed, stream). */
MOE_HD float moe_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    float zc, zs;
    moe_rng_block(seed, stream, index >> 2, w);
    unsigned pair = (unsigned)(index & 2u);
    moe_rng_box_muller_(w[pair], w[pair + 1], &zc, &zs);
    return (index & 1u) ? zs : zc;
}

/* Normals 4*block .. 4*block+3 of (seed, stream) at once (same values as moe_rng_normal). */
MOE_HD void moe_rng_normal4(uint64_t seed, uint64_t stream, uint64_t block, float z[4]) {
    uint32_t w[4];
    moe_rng_block(seed, stream, block, w);
    moe_rng_box_muller_(w[0], w[1], &z[0], &z[1]);
    moe_rng_box_muller_(w[2], w[3], &z[2], &z[3]);
}

/* mean + std * z in float, rounded the same way on both sides. */
MOE_HD float moe_rng_affine(float z, float mean, float std) {
    return MOE_FADD(mean, MOE_FMUL(std, z));
}

#ifdef __cplusplus
extern "C" {
#endif

/* x[i] = mean + std * moe_rng_normal(seed, stream, i) for 0 <= i < n.   x: [n] */
void moe_rng_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed,
                         uint64_t stream);
/* x[i] = lo + (hi - lo) * moe_rng_uniform(seed, stream, i).               x: [n] */
void moe_rng_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed, uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif
