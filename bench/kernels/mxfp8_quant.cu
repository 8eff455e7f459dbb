/* mxfp8_quant.cu: issue 14's MXFP8 quantizer for the GPU - one kernel that reads an expert-
 * grouped activation x [M, K] bf16 once and writes both of its MXFP8 copies: the row-wise one
 * (q [M, K] e4m3, sr [M, K / 32] e8m0; blocks of 32 along K, the forward's reduction
 * dimension) and the column-wise one for the weight gradient, transposed (qt [K, Mcap] e4m3,
 * sc [K, Mcap / 32] e8m0; blocks of 32 consecutive rows of one expert, the wgrad's reduction
 * dimension, each expert's rows padded with zeros to a multiple of `pad`). Both copies are
 * checked byte for byte against what libcore's CPU emulation (moe/quant.h) implies, under both
 * scale rules, then timed at the mixtral8x7b sizes beside a device copy of the same bytes.
 *
 *   gcc -std=c11 -O2 -fopenmp -Ilibcore/include -c libcore/src/num/quant.c -o /tmp/mxq_quant.o &&
 * nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -Xcompiler -fopenmp -Ilibcore/include
 * bench/kernels/mxfp8_quant.cu /tmp/mxq_quant.o -lgomp -o /tmp/mxfp8_quant && /tmp/mxfp8_quant
 *
 * quant.c is the reference and the only libcore source needed: the E4M3 and E8M0 encoders and
 * decoders it calls are moe/dtype.h's MOE_HD inline functions (dtype.c holds only the bulk
 * converter and the dtype names, and would pull in err.c). The host build of quant.c is ISO
 * C11, so nothing contracts; OpenMP only spreads its loops (bit-identical for any thread
 * count). Not built by CMake, not run by CI (bench/kernels/README.md).
 *
 * Status: written without a GPU on 2026-12-04 and first run on an H200 at 21:03 UTC: every
 * check passed, 1.67-1.80 TB/s (docs/performance-gpu.md). Before that its device code (the text
 * between "the kernel" and "host" below, unchanged) was run here through a host emulation
 * (each block as 256 OS threads, shuffles and barriers emulated, cuda_fp8.hpp's host cvt) on
 * K 96 and 544 with 1 to 8 experts, both rules, both pads and grids of 3, 7 and every item:
 * every check below passed, and a dropped sign OR and a wrong swizzle each failed it. That
 * emulator is not kept: the GPU run is the test.
 *
 * The format (docs/dtypes.md, OCP MX v1.0): a block's amax is over its finite values (quant.c);
 * its scale is 2^(code - 127) with code = E8M0 ceil of amax / 448 (fp32 IEEE division; the
 * default rule, nothing saturates) or, under ocp-floor, floor(log2 amax) - 8 clamped at 0
 * (values up to 512 scale, above 448 scale saturate); an all-zero (or all-NaN/Inf) block
 * gets scale 1 (code 127) as quant.c's block_scale; each value is e4m3(x / scale), nearest
 * even, saturating (+-Inf to +-448), NaN to sign | 0x7f. A block never straddles the end of
 * a vector, so an expert's rows are their own group along the tokens.
 *
 * Layout of the column-wise copy. The offsets off [E + 1] (off[0] = 0, off[E] = M) are on the
 * device, so the host does not know the padded sizes: qt has Mcap columns, Mcap = floor((M +
 * E (pad - 1)) / pad) pad, the most the padded experts can need. Expert e owns qt's columns
 * [poff[e], poff[e + 1]), poff[e] = sum over j < e of round_up(n_j, pad), which the kernel
 * also writes out (poff [E + 1], for the wgrad product); column poff[e] + t holds token
 * off[e] + t for t < n_e, and zeros from n_e on. Columns from poff[E] to Mcap are zeros too.
 * A block of 32 columns with no token has scale code 127 (quant.c's all-zero block), so every
 * byte of q, sr, qt, sc and poff is written and defined. pad is 32 or 128, both checked: 32 is
 * the block, all the format needs (torchao/torchtitan pad MXFP8 expert groups to 32); 128 is
 * what TransformerEngine needed (issue #2966: its MXFP8 expert path failed with 32 and passed
 * with 128), most likely because cuBLASLt's Blackwell MXFP8 scales come in swizzled tiles of
 * 128 rows x 4 scales, so an expert's slice along the reduction must start on a multiple of
 * 4 scales, 128 tokens. sm_90 has no MXFP8 GEMM (cuBLASLt refuses VEC32_UE8M0) and the scales
 * here are plain row-major for a kernel of our own, so pad 32 is the default; 128 is one
 * argument away if a consumer wants it, at 1% more bytes at the mixtral shape (qt 17,280
 * columns for 16,768 used, against 16,608 for 16,480 at pad 32).
 *
 * Design: one pass, both copies from the same registers. The work is Mcap / 32 x ceil(K /
 * 256) items: the tile of 32 padded token positions pb*32 .. pb*32 + 31 (one block of the column-
 * wise copy, all of one expert) by 256 columns kt*256 .. of K. Such a tile holds for each of
 * its 32 rows 8 whole row-wise blocks and for each of its 256 columns one whole column-wise
 * block, so both kinds of amax close inside it. Persistent blocks of 256 threads, one wave
 * (3 or 4 per SM), block b taking items b, b + gridDim.x, ... with the padded block fastest,
 * so the blocks resident together work on consecutive token blocks of the same columns: they
 * write whole rows of qt and sc between them, and the L2 merges their 32-byte and 1-byte
 * pieces into full sectors. Each block first builds the padded offsets in shared memory
 * (warp 0: a prefix sum of the padded counts, 32 experts a step, from the device offsets);
 * an item's expert is then a binary search there. Per item:
 *   load    warp w reads tile rows 4w .. 4w + 3, a row's 512 bytes per warp load (16 bytes,
 *           8 columns a lane); rows of padding or past every expert are zeros. The block's
 *           next item is located and its loads issued before this one is worked on (16
 *           registers), so each block keeps 16 KB of reads in flight through its barriers.
 *   amax    finite magnitudes as 16-bit integers, two per word (set.lt.bf16x2 masks NaN
 *           and Inf, max.u16x2 takes maxima: integer order is bf16 order for non-negative
 *           values, and no bf16 subnormal is flushed). Row blocks: the 4 lanes of a block
 *           reduce-scatter their 4 rows in 2 shuffles, so lane 4b + i ends with the amax of
 *           row i's block b, computes its scale code (one IEEE division a lane an item) and
 *           writes it to sr; 2 more shuffles give every lane the 4 codes of its rows.
 *           Column blocks: each thread's 4 rows, then the 8 warps' partials through shared
 *           memory (barrier 1); thread c reduces column c and writes its code to sc and to
 *           shared memory (barrier 2).
 *   values  x * 2^(127 - code): the scale is a power of two, so the product is exactly the
 *           quotient x / scale rounded once, the value quant.c's x / scale gives (an f32
 *           multiply instead of an IEEE division per value and copy); then
 *           cvt.rn.satfinite.e4m3x2.f32, two values per instruction, for the row scale (q,
 *           8-byte stores, a warp writing a row's 256 bytes) and for the column scale. The
 *           sign of every byte is ORed in from x: the GPU's multiply may return a NaN as
 *           the canonical positive 0x7fffffff (the probe prints what it does) and
 *           cuda_fp8.hpp's own fallback drops a NaN's sign, where quant.c keeps -NaN's sign
 *           (0xff); for every other value it is the sign the byte has anyway, as
 *           moe_f32_to_e4m3 keeps it.
 *   qt      the column-scaled bytes go out transposed: each thread turns its 4 rows x 8
 *           columns into 8 column words (4 tokens each, __byte_perm) stored in a swizzled
 *           8 KB tile (tt_word: no bank conflict on the word stores nor on the 16-byte reads,
 *           checked by enumeration); after barrier 3 thread c writes column c's 32 bytes
 *           (two 16-byte stores) to qt row k0 + c.
 * Registers (nvcc 13.0, -Xptxas -v): k_mxfp8_quant<3> (MINB 3) 80 and no spill, 3 blocks of
 * 256 per SM; <4> 64 with an 8-byte spill (40-byte stack frame), 4 per SM: both are built,
 * <3> is checked against the CPU and <4> against <3>'s bytes, and both are timed.
 *
 * Fusion (the issue's "quantization fused with what produces its input"): the load stage is
 * the only place x is read; a producer that can emit a 32-token x 256-column tile of one
 * expert per block (the token permutation after the norm for w1/w3's input, SwiGLU for w2's,
 * the gradient kernels for dy) can end with the rest of this kernel as its epilogue and never
 * write x. Fused or not, the pass writes each copy once: separate row and column passes would
 * move 6.1 bytes an element, this one 4.1 (2 read, 2 written, 1/16 of scales).
 *
 * Prediction (H200; bytes = x read + q, sr, qt, sc, poff written): 273.6 MB a call at M
 * 16,384 K 4096 pad 32 (276.4 at pad 128), 957.5 MB at K 14,336 (967.5). The copy beside it
 * should print about 4,300 GB/s (as beside the fp8 weight quantizer, 2026-12-04), 64 and 223
 * us. Per element the
 * kernel issues about 16 instructions by a count of the source (2.7 for the two amaxes, 2
 * multiplies, 1 cvt, 1.5 sign and packing, 2 for the transpose and shared memory, the rest
 * addresses, shuffles, barriers and the per-block codes): about 35 us of issue at K 4096
 * against 64 us of DRAM, so it should stay memory-bound at about 3,600-3,900 GB/s (84-90% of
 * the copy): 70-76 us at K 4096, 245-265 us at K 14,336, the same rate at pad 128; <4> no
 * more than 3% faster than <3> (48 KB of reads in flight per SM already cover the latency).
 * Below 3,300 GB/s the latency is not hidden after all: <4> well ahead of <3> would say so;
 * if both are slow alike, the ALU work is the suspect (the two multiply-and-convert paths
 * are most of it).
 *
 * What the GPU run must check first (printed in this order):
 *   1. The registers and blocks per SM of both builds (3 and 4 expected), then the probe
 *      line: the raw bytes of cvt.rn.satfinite.e4m3x2.f32 for +-NaN, +-Inf, -0 and a
 *      negative value below half the smallest subnormal, and the bits of -NaN * 1. This
 *      kernel does not depend on them (it ORs the sign in), but kernels/quant_fp8.cu's
 *      fp8-block quantizer divides first and does not: if the -NaN byte prints 0x7f or
 *      -NaN * 1 prints 7fffffff, that kernel writes 0x7f where the CPU writes 0xff for a
 *      negative NaN (a NaN either way once decoded).
 *   2. Every check line "ok": shapes K 96 (6 experts with 0, 1, 31, 32, 33 and 100 rows; 4
 *      even experts of 64), K 4096 (8 experts: 300, 0, 33, 512, 1, 95, 1000, 64; 3 experts
 *      without rows, so only padding) and the two timed mixtral shapes (16,384 rows over 8
 *      experts, 1407 to 2890 each, 2048 the one multiple of 32), each under the ceil and
 *      ocp-floor rules with pad 32 and 128. For every byte: sr and sc against the E8M0 code
 *      of the scale quant.c's rule picks for that block (ref_code below: the rule rewritten
 *      from quant.c's static block_scale, which returns the scale, not its code); q and qt
 *      against moe_f32_to_e4m3(x / scale, 1), and their decoded values e4m3 * scale against
 *      moe_quant_fake_vectors's bit for bit (along rows for q; per expert along its rows, per
 *      column, for qt: the call ops_fp8.c makes); padding bytes of qt against 0, blocks
 *      without tokens against code 127, poff against the host's sums. Each configuration
 *      runs twice, onto buffers prefilled with 0xa5 and with 0x5a: a byte the kernel does
 *      not write differs between the two runs and FAILs. A failed check prints its first
 *      difference (array, row, column, the input's bits, both bytes and both codes). Then
 *      <4> must give <3>'s bytes on both prefills.
 *   3. The coverage line: the data (hash-generated bf16 in 64-row x 32-column regions of one
 *      kind: zeros of either sign, bf16 subnormals only, near the bf16 maximum, only NaN /
 *      +-Inf / +-0, the saturation edge 446 .. 510 x 2^e, values near 2^-120 (scale code 0),
 *      and otherwise random values of the region's own magnitude with outliers, zeros,
 *      subnormals, NaN of both signs with quiet and signalling payloads, and +-Inf) must have
 *      produced all-zero row and column blocks, code-0 blocks, NaN, Inf, subnormals,
 *      saturated values (ocp-floor), padding and blocks without tokens: a kind that never
 *      occurred is a FAIL of the test, not of the kernel.
 *   4. The rates (ceil rule; rounds of copy, <3> pad 32, <4> pad 32, <3> pad 128 behind an
 *      untimed memset, 3 warm-up rounds, median of 21), against the prediction above.
 * Exit 1 on any FAIL. About 1-2 minutes on an H200 host of 16 cores, most of it the host's
 * reference and checks of the two mixtral shapes (4.5 GB of host memory at K 14,336). */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "playground.cuh"

#include "moe/dtype.h"
#include "moe/quant.h"

#define TM 32    /* padded token positions per tile: one block of the column-wise copy */
#define TK 256   /* hidden columns per tile: 8 blocks of the row-wise copy */
#define NT 256   /* threads per block: warp w holds tile rows 4w .. 4w + 3 */
#define MAXE 256 /* experts at most (shared memory for their offsets) */

/* ---- the kernel ---- */

/* The 15-bit magnitudes of the two bf16 of u, 0 for NaN and +-Inf (quant.c's amax is over
 * finite values). set.lt.bf16x2 compares the magnitudes with Inf (false for NaN); the maxima
 * are taken on these as 16-bit integers (max.u16x2), which order non-negative bf16 as their
 * values do and flush no subnormal. */
__device__ __forceinline__ uint32_t finite_mag2(uint32_t u) {
    const uint32_t a = u & 0x7fff7fffu;
    __nv_bfloat162_raw inf;
    inf.x = inf.y = 0x7f80u;
    return a & __hlt2_mask(*(const __nv_bfloat162 *)&a, __nv_bfloat162(inf));
}

/* The E8M0 code of the scale quant.c's block_scale picks for a block whose finite values have
 * magnitude at most amax (a16: a bf16 magnitude): 127 (scale 1) for amax 0; ceil: the E8M0
 * ceil of amax / 448, the same IEEE division; ocp-floor: floor(log2 amax) - 8, at least 0. */
__device__ __forceinline__ uint32_t mx_code(uint32_t a16, int floor_rule) {
    const float amax = __uint_as_float(a16 << 16);
    if (!(amax > 0.0f)) return 127u;
    if (floor_rule) {
        const int c = (int)moe_f32_to_e8m0_floor(amax) - 8;
        return c < 0 ? 0u : (uint32_t)c;
    }
    return moe_f32_to_e8m0_ceil(__fdiv_rn(amax, 448.0f));
}

/* 1 / scale for a code 0..254: 2^(127 - code), exact (2^-127 for code 254 is an f32
 * subnormal, so x * it is still x / scale rounded once). */
__device__ __forceinline__ float mx_inv(uint32_t code) {
    return __uint_as_float(code == 254u ? 0x00400000u : (254u - code) << 23);
}

/* e4m3 bytes of a, b, c, d (byte 0 from a): nearest even, saturating, +-Inf to +-448. */
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3),
                   hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

/* Word (c, g) of the staged transposed tile: column c's tokens 4g .. 4g + 3. Column c's 8
 * words stay in 128-byte line c / 4, at a 32-byte slot permuted by c / 8 and words permuted by
 * c / 32 and c / 4: the 32 lanes of a word store (c = 8 lane + const) hit 32 banks and the 8
 * lanes of a quarter-warp's 16-byte read (8 consecutive c) 8 different 16-byte units. */
__device__ __forceinline__ int tt_word(int c, int g) {
    return c / 4 * 32 + ((c % 4) ^ (c / 8 % 4)) * 8 + (g ^ (c / 32) ^ (c / 4 % 2 * 4));
}

/* Where one work item's tile is: padded block pb (tokens 32 pb ..), column tile kt, and for
 * this thread's warp w the token of its first tile row (4w) and the mask of its 4 rows that
 * hold a token (rows of padding, or past every expert, hold none). */
typedef struct {
    int64_t pb, src;
    int kt;
    unsigned ok;
} item;

/* Fills it->src and it->ok for it->pb from the padded offsets s_poff [E + 1] and the offsets
 * s_off [E + 1] (shared memory): the expert is the last e with s_poff[e] <= 32 pb (a binary
 * search, so experts without rows are passed over; e = E past every expert). */
__device__ __forceinline__ void locate(item *it, const int *s_poff, const int *s_off, int E,
                                       int w) {
    const int p0 = (int)it->pb * TM;
    int lo = 0, hi = E;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s_poff[mid] <= p0)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int first = s_off[lo] + (p0 - s_poff[lo]) + 4 * w;
    const int n = lo < E ? s_off[lo + 1] - first : 0; /* tokens from this warp's row 4w on */
    it->src = first;
    it->ok = n >= 4 ? 15u : n > 0 ? (1u << n) - 1u : 0u;
}

/* The 4 rows of this thread's slice of item it's tile: v[i] = x[src + i][k0 + 8 lane ..] as 4
 * words (two bf16 each), zeros for rows without a token or columns past K (K % 32 == 0: a
 * lane's 8 columns are all in or all out). */
__device__ __forceinline__ void load_rows(uint32_t v[4][4], const uint16_t *__restrict__ x,
                                          const item *it, int K, int lane) {
    const int kc = it->kt * TK + 8 * lane;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint4 t = make_uint4(0u, 0u, 0u, 0u);
        if ((it->ok >> i & 1u) && kc < K) t = *(const uint4 *)(x + (it->src + i) * K + kc);
        v[i][0] = t.x, v[i][1] = t.y, v[i][2] = t.z, v[i][3] = t.w;
    }
}

/* Both MXFP8 copies of x [M, K] bf16 (K % 32 == 0, rows grouped by expert: off [E + 1] i32,
 * off[0] = 0, off[E] = M, E <= MAXE) under one scale rule (floor_rule: ocp-floor, else ceil),
 * experts padded to multiples of pad (32 or 128) in the column-wise copy. Persistent: any
 * grid of NT-thread blocks, block b taking the items b, b + gridDim.x, ... of the Mcap / 32
 * x ceil(K / 256) items (padded block fastest). See the header for layouts and steps.
 * MINB: the blocks per SM asked of ptxas (3: 80 registers; 4: 64 and a spill of 2 words). */
template <int MINB>
__global__ void __launch_bounds__(NT, MINB)
    k_mxfp8_quant(uint8_t *__restrict__ q,    /* q [M, K] e4m3 */
                  uint8_t *__restrict__ sr,   /* sr [M, K / 32] e8m0 */
                  uint8_t *__restrict__ qt,   /* qt [K, Mcap] e4m3 */
                  uint8_t *__restrict__ sc,   /* sc [K, Mcap / 32] e8m0 */
                  int32_t *__restrict__ poff, /* poff [E + 1] i32: expert e's first column of qt */
                  const uint16_t *__restrict__ x,  /* x [M, K] bf16 */
                  const int32_t *__restrict__ off, /* off [E + 1] i32 */
                  int E, int K, int64_t Mcap, int pad, int floor_rule) {
    __shared__ __align__(16) uint32_t red[NT / 32][TK / 2]; /* column amax of each warp's rows */
    __shared__ __align__(8) uint8_t codes[TK];              /* the tile's column codes */
    __shared__ __align__(16) uint32_t tt[TK * TM / 4];      /* the transposed tile (tt_word) */
    __shared__ int s_off[MAXE + 1], s_poff[MAXE + 1];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;

    /* Warp 0: the padded offsets, a prefix sum of the padded counts 32 experts a step; block 0
     * also writes them out. */
    if (w == 0) {
        int carry = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane, lo = e < E ? off[e] : 0, n = e < E ? off[e + 1] - lo : 0;
            const int np = (n + pad - 1) / pad * pad;
            int incl = np;
#pragma unroll
            for (int d = 1; d < 32; d *= 2) {
                const int t = __shfl_up_sync(~0u, incl, d);
                if (lane >= d) incl += t;
            }
            if (e < E) {
                s_off[e] = lo, s_poff[e] = carry + incl - np;
                if (blockIdx.x == 0) poff[e] = carry + incl - np;
            }
            carry += __shfl_sync(~0u, incl, 31);
        }
        if (lane == 0) {
            s_off[E] = off[E], s_poff[E] = carry;
            if (blockIdx.x == 0) poff[E] = carry;
        }
    }
    __syncthreads();

    const int64_t KB = K / 32, CB = Mcap / 32;
    const int nkt = (K + TK - 1) / TK;
    /* the step from one item of this block to its next: gridDim.x items, as (blocks, tiles) */
    const int64_t gpb = gridDim.x % CB;
    const int gkt = (int)(gridDim.x / CB);
    item it = {blockIdx.x % CB, 0, (int)(blockIdx.x / CB), 0u}, nit;
    if (it.kt >= nkt) return; /* a grid larger than the items */
    locate(&it, s_poff, s_off, E, w);
    uint32_t v[4][4], nx[4][4];
    load_rows(v, x, &it, K, lane);
    while (it.kt < nkt) {
        /* the next item's loads go out before this one is worked on */
        nit.pb = it.pb + gpb, nit.kt = it.kt + gkt;
        if (nit.pb >= CB) nit.pb -= CB, nit.kt++;
        if (nit.kt < nkt) {
            locate(&nit, s_poff, s_off, E, w);
            load_rows(nx, x, &nit, K, lane);
        }
        const int64_t pb = it.pb;
        const int k0 = it.kt * TK, kc = k0 + 8 * lane;

        /* finite magnitudes; per row (4 words) and per column pair (4 rows) maxima */
        uint32_t m[4][4], rmax[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                m[i][j] = finite_mag2(v[i][j]);
            const uint32_t t = __vmaxu2(__vmaxu2(m[i][0], m[i][1]), __vmaxu2(m[i][2], m[i][3]));
            rmax[i] = __vmaxu2(t, t >> 16) & 0xffffu;
        }

        /* row blocks: reduce-scatter over the 4 lanes of block b = lane / 4 (rows 0, 1 | 2, 3
         * over lane bit 1, then one row of the pair over bit 0): lane 4b + i ends with row
         * i's amax */
        const bool b1 = lane & 2, b0 = lane & 1;
        const uint32_t p01 = rmax[0] | rmax[1] << 16, p23 = rmax[2] | rmax[3] << 16;
        const uint32_t pair = __vmaxu2(b1 ? p23 : p01, __shfl_xor_sync(~0u, b1 ? p01 : p23, 2));
        const uint32_t mine = b0 ? pair >> 16 : pair & 0xffffu,
                       other = b0 ? pair & 0xffffu : pair >> 16;
        const uint32_t rc = mx_code(max(mine, __shfl_xor_sync(~0u, other, 1)), floor_rule);
        if ((it.ok >> lane % 4 & 1u) && kc < K)
            sr[(it.src + lane % 4) * KB + kc / 32] = (uint8_t)rc;
        /* all-gather: byte i of rcodes is row i's code */
        const uint32_t c1 = __shfl_xor_sync(~0u, rc, 1);
        const uint32_t c01 = b0 ? c1 | rc << 8 : rc | c1 << 8;
        const uint32_t c2 = __shfl_xor_sync(~0u, c01, 2);
        const uint32_t rcodes = b1 ? c2 | c01 << 16 : c01 | c2 << 16;

        /* column blocks: this thread's 4 rows, then the 8 warps' through shared memory */
        uint4 cm;
        cm.x = __vmaxu2(__vmaxu2(m[0][0], m[1][0]), __vmaxu2(m[2][0], m[3][0]));
        cm.y = __vmaxu2(__vmaxu2(m[0][1], m[1][1]), __vmaxu2(m[2][1], m[3][1]));
        cm.z = __vmaxu2(__vmaxu2(m[0][2], m[1][2]), __vmaxu2(m[2][2], m[3][2]));
        cm.w = __vmaxu2(__vmaxu2(m[0][3], m[1][3]), __vmaxu2(m[2][3], m[3][3]));
        *(uint4 *)&red[w][4 * lane] = cm;
        __syncthreads(); /* 1: the partial maxima */
        {
            const uint16_t *r16 = (const uint16_t *)&red[0][0];
            uint32_t a = 0;
#pragma unroll
            for (int g = 0; g < NT / 32; g++)
                a = max(a, (uint32_t)r16[g * TK + threadIdx.x]);
            const uint32_t cc = mx_code(a, floor_rule);
            codes[threadIdx.x] = (uint8_t)cc;
            if (k0 + (int)threadIdx.x < K) sc[(int64_t)(k0 + threadIdx.x) * CB + pb] = (uint8_t)cc;
        }
        __syncthreads(); /* 2: the column codes */
        const uint2 cb = *(const uint2 *)&codes[8 * lane];
        float ic[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            ic[j] = mx_inv((j < 4 ? cb.x >> 8 * j : cb.y >> 8 * (j - 4)) & 0xffu);

        /* the values: row-scaled to q, column-scaled into cw (4 rows x 8 columns) */
        uint32_t cw[2][4]; /* [column half h][row i]: columns 4h .. 4h + 3 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float ir = mx_inv(rcodes >> 8 * i & 0xffu);
            uint32_t rw[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t u0 = v[i][2 * h], u1 = v[i][2 * h + 1];
                const float f0 = __uint_as_float(u0 << 16), f1 = __uint_as_float(u0 & 0xffff0000u),
                            f2 = __uint_as_float(u1 << 16), f3 = __uint_as_float(u1 & 0xffff0000u);
                const uint32_t sign = __byte_perm(u0, u1, 0x7531) & 0x80808080u;
                rw[h] = e4m3x4(__fmul_rn(f0, ir), __fmul_rn(f1, ir), __fmul_rn(f2, ir),
                               __fmul_rn(f3, ir)) |
                        sign;
                cw[h][i] = e4m3x4(__fmul_rn(f0, ic[4 * h]), __fmul_rn(f1, ic[4 * h + 1]),
                                  __fmul_rn(f2, ic[4 * h + 2]), __fmul_rn(f3, ic[4 * h + 3])) |
                           sign;
            }
            if ((it.ok >> i & 1u) && kc < K)
                *(uint2 *)(q + (it.src + i) * K + kc) = make_uint2(rw[0], rw[1]);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t col[4];
            moe_transpose4x4_bytes(cw[h], col);
#pragma unroll
            for (int j = 0; j < 4; j++)
                tt[tt_word(8 * lane + 4 * h + j, w)] = col[j];
        }
        __syncthreads(); /* 3: the transposed tile */
        {
            const int c = threadIdx.x, s = c / 32;
            if (k0 + c < K) {
                uint8_t *dst = qt + (k0 + c) * Mcap + pb * TM;
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    /* tokens 16 hf .. 16 hf + 15: word p' of them sits at p' ^ (s % 4) */
                    uint4 a = *(const uint4 *)&tt[c / 4 * 32 + ((c % 4) ^ (c / 8 % 4)) * 8 +
                                                  4 * (hf ^ (s >> 2) ^ (c / 4 % 2))];
                    uint32_t t;
                    if (s & 1) t = a.x, a.x = a.y, a.y = t, t = a.z, a.z = a.w, a.w = t;
                    if (s & 2) t = a.x, a.x = a.z, a.z = t, t = a.y, a.y = a.w, a.w = t;
                    *(uint4 *)(dst + 16 * hf) = a;
                }
            }
        }
        /* No barrier of its own between items: red is last read before barrier 2 and
         * rewritten after barrier 3, codes last read before barrier 3 and rewritten after the
         * next barrier 1, tt last read before the next barrier 1 and rewritten after it. */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[i][j] = nx[i][j];
        it = nit;
    }
}

/* The probe of check 1: raw cvt bytes and a multiply's NaN. out [8]. */
__global__ void k_probe(uint32_t *out) {
    const float nneg = __uint_as_float(0xffc00000u), npos = __uint_as_float(0x7fc00000u);
    out[0] = __nv_cvt_float2_to_fp8x2(make_float2(nneg, npos), __NV_SATFINITE, __NV_E4M3);
    out[1] = __nv_cvt_float2_to_fp8x2(make_float2(-INFINITY, INFINITY), __NV_SATFINITE, __NV_E4M3);
    out[2] = __nv_cvt_float2_to_fp8x2(make_float2(-0.0f, -1e-30f), __NV_SATFINITE, __NV_E4M3);
    out[3] = __float_as_uint(__fmul_rn(nneg, (float)(threadIdx.x + 1)));
}

/* ---- host: test data, reference, checks ---- */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* x[r][k] as bf16 bits. Regions of 64 rows x 32 columns share a kind (the first two region
 * rows' first three columns one of each special kind, so every shape with 128 rows and 96
 * columns has them all; elsewhere 1 in 8 special): 0 zeros of either sign; 1 bf16 subnormals
 * only; 2 near the bf16 maximum; 3 only NaN (both signs, quiet and signalling), +-Inf, +-0;
 * 4 the saturation edge: +-{446 .. 510} x 2^e, each row's largest value 448, 464 or 510;
 * 5 values near 2^-120 with subnormals (scale code 0); otherwise uniform in (-1, 1) x 2^e
 * (e per region, -20 .. 20) with 0.5% outliers x 2^8 .. 2^12, 1% zeros, 0.2% subnormals,
 * 0.05% NaN, 0.05% +-Inf. */
static uint16_t gen_x(uint64_t seed, int64_t r, int64_t k) {
    const int64_t rr = r / 64, rc = k / 32;
    const uint64_t rh = mix64(seed ^ mix64((uint64_t)rr << 32 ^ (uint64_t)rc));
    const int kind = rr < 2 && rc < 3 ? (int)(3 * rr + rc) : (int)(rh % 48);
    const uint64_t h = mix64(rh ^ mix64((uint64_t)r << 24 ^ (uint64_t)k ^ seed << 56));
    const uint16_t sgn = (uint16_t)(h >> 63 << 15);
    const float u = (float)(h >> 40 & 0xffffff) / 16777216.0f; /* [0, 1) */
    const int e = (int)((rh >> 8) % 41) - 20;
    static const uint16_t special[8] = {0x7fc0, 0xffc0, 0x7f81, 0xff81,
                                        0x7f80, 0xff80, 0x0000, 0x8000};
    static const float edge[8] = {446.0f, 448.0f, 450.0f, 464.0f, 466.0f, 480.0f, 496.0f, 510.0f};
    switch (kind) {
    case 0:
        return sgn;
    case 1:
        return (uint16_t)(sgn | (1 + h % 0x7f));
    case 2:
        return (uint16_t)(sgn | moe_f32_to_bf16(ldexpf(1.0f + 0.99f * u, 127)));
    case 3:
        return special[h % 8];
    case 4: {
        const int top = (int)(mix64(rh ^ (uint64_t)r) % 3); /* largest value: 448, 464 or 510 */
        const int n = top == 0 ? 2 : top == 1 ? 4 : 8;
        return (uint16_t)(sgn | moe_f32_to_bf16(ldexpf(edge[h % n], e)));
    }
    case 5:
        return h % 4 == 0
                   ? (uint16_t)(sgn | (1 + h % 0x7f))
                   : (uint16_t)(sgn | moe_f32_to_bf16(ldexpf(1.0f + u, -126 + (int)(h % 8))));
    default:
        break;
    }
    const unsigned p = (unsigned)((h >> 20) % 10000);
    if (p < 50) return moe_f32_to_bf16(ldexpf(2.0f * u - 1.0f, e + 8 + (int)(h % 5)));
    if (p < 150) return sgn;
    if (p < 170) return (uint16_t)(sgn | (1 + h % 0x7f));
    if (p < 175) return special[h % 4];
    if (p < 180) return special[4 + h % 2];
    return moe_f32_to_bf16(ldexpf(2.0f * u - 1.0f, e));
}

/* The E8M0 code of the scale libcore/src/num/quant.c's block_scale picks for n values v[0],
 * v[st], ...: that function is static and returns the scale's value, so its mxfp8 rule is
 * rewritten here to return the code. *amax_out = the block's finite amax. */
static uint8_t ref_code(const float *v, int64_t st, int64_t n, int floor_rule, float *amax_out) {
    float amax = 0.0f;
    for (int64_t j = 0; j < n; j++)
        if (isfinite(v[j * st])) amax = fmaxf(amax, fabsf(v[j * st]));
    *amax_out = amax;
    if (!(amax > 0.0f)) return 127; /* scale 1 */
    if (!floor_rule) return moe_f32_to_e8m0_ceil(amax / 448.0f);
    const int c = (int)moe_f32_to_e8m0_floor(amax) - 8;
    return (uint8_t)(c < 0 ? 0 : c);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* What quant.c does to x with this code's scale: byte == e4m3(x / scale, saturating), and
 * decoded e4m3(byte) * scale == the fake-quantized value, bit for bit. */
static int elem_ok(uint8_t byte, uint8_t code, float x, float fake) {
    const float scale = moe_e8m0_to_f32(code);
    return byte == moe_f32_to_e4m3(x / scale, 1) &&
           bits(moe_e4m3_to_f32(byte) * scale) == bits(fake);
}

/* What the test data exercised (summed over every check). */
typedef struct {
    int64_t zero_rblk, zero_cblk, code0, nan, inf, sub, sat, pad_bytes, empty_blk;
} cover;

/* The row-wise copy: first mismatch as key 2 (r K + k) + (0 scale of the block at k, 1 value). */
static int64_t check_rows(const uint8_t *q, const uint8_t *sr, const float *xf, const float *fake,
                          int64_t M, int64_t K, int floor_rule, cover *cv, int64_t *first) {
    const int64_t KB = K / 32;
    int64_t bad = 0, f = INT64_MAX, zr = 0, c0 = 0, nn = 0, ni = 0, ns = 0, nsat = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad, zr, c0, nn, ni, ns, nsat)            \
    reduction(min : f)
    for (int64_t r = 0; r < M; r++)
        for (int64_t b = 0; b < KB; b++) {
            const int64_t i0 = r * K + 32 * b;
            float amax;
            const uint8_t code = ref_code(xf + i0, 1, 32, floor_rule, &amax);
            if (sr[r * KB + b] != code) {
                bad++, f = f < 2 * i0 ? f : 2 * i0;
                continue;
            }
            zr += amax == 0.0f, c0 += code == 0;
            const float scale = moe_e8m0_to_f32(code);
            for (int64_t j = 0; j < 32; j++) {
                const float xv = xf[i0 + j];
                nn += isnan(xv), ni += isinf(xv), ns += xv != 0.0f && fabsf(xv) < 1.17549435e-38f;
                nsat += isfinite(xv) && fabsf(xv / scale) > 448.0f;
                if (!elem_ok(q[i0 + j], code, xv, fake[i0 + j]))
                    bad++, f = f < 2 * (i0 + j) + 1 ? f : 2 * (i0 + j) + 1;
            }
        }
    cv->zero_rblk += zr, cv->code0 += c0, cv->nan += nn, cv->inf += ni, cv->sub += ns,
        cv->sat += nsat;
    *first = f;
    return bad;
}

/* Expert of padded position p (host poff), -1 past every expert. */
static int expert_of(const int32_t *poff, int E, int64_t p) {
    for (int e = 0; e < E; e++)
        if (poff[e] <= p && p < poff[e + 1]) return e;
    return -1;
}

/* The column-wise copy: first mismatch as key 2 (k Mcap + p) + (0 scale of p's block, 1 byte). */
static int64_t check_cols(const uint8_t *qt, const uint8_t *sc, const float *xf, const float *fake,
                          const int32_t *off, const int32_t *poff, int E, int64_t K, int64_t Mcap,
                          int floor_rule, cover *cv, int64_t *first) {
    const int64_t CB = Mcap / 32;
    int64_t bad = 0, f = INT64_MAX, zc = 0, c0 = 0, npad = 0, nempty = 0;
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : bad, zc, c0, npad, nempty)            \
    reduction(min : f)
    for (int64_t pb = 0; pb < CB; pb++) {
        const int e = expert_of(poff, E, 32 * pb);
        const int64_t r0 = e < 0 ? 0 : off[e] + 32 * pb - poff[e];
        const int64_t left = e < 0 ? 0 : off[e + 1] - r0, nv = left < 0 ? 0 : left < 32 ? left : 32;
        for (int64_t k = 0; k < K; k++) {
            const int64_t i0 = k * Mcap + 32 * pb;
            float amax;
            const uint8_t code = ref_code(xf + r0 * K + k, K, nv, floor_rule, &amax);
            if (sc[k * CB + pb] != code) {
                bad++, f = f < 2 * i0 ? f : 2 * i0;
                continue;
            }
            zc += nv > 0 && amax == 0.0f, c0 += nv > 0 && code == 0, nempty += nv == 0;
            for (int64_t t = 0; t < 32; t++) {
                const int64_t xi = (r0 + t) * K + k;
                const int ok =
                    t < nv ? elem_ok(qt[i0 + t], code, xf[xi], fake[xi]) : qt[i0 + t] == 0;
                npad += t >= nv;
                if (!ok) bad++, f = f < 2 * (i0 + t) + 1 ? f : 2 * (i0 + t) + 1;
            }
        }
    }
    cv->zero_cblk += zc, cv->code0 += c0, cv->pad_bytes += npad, cv->empty_blk += nempty;
    *first = f;
    return bad;
}

/* ---- host: the configurations ---- */

typedef struct {
    const char *name;
    int K, E;
    int32_t counts[8];
    int timed;
} shape;
static const shape shapes[] = {
    {"K96 uneven", 96, 6, {0, 1, 31, 32, 33, 100}, 0},
    {"K96 even", 96, 4, {64, 64, 64, 64}, 0},
    {"K4096 uneven", 4096, 8, {300, 0, 33, 512, 1, 95, 1000, 64}, 0},
    {"K4096 no rows", 4096, 3, {0, 0, 0}, 0},
    {"mixtral K4096", 4096, 8, {2521, 1733, 2890, 1407, 2048, 1966, 1811, 2008}, 1},
    {"mixtral K14336", 14336, 8, {2521, 1733, 2890, 1407, 2048, 1966, 1811, 2008}, 1},
};
enum { NSHAPE = sizeof shapes / sizeof shapes[0] };

/* The two builds of the kernel: variant 0 is checked against the CPU, variant 1 against
 * variant 0's bytes. */
enum { NVAR = 2 };
static const int var_minb[NVAR] = {3, 4};
static int num_sms, var_per_sm[NVAR];

static int64_t mx_cap(int64_t M, int E, int pad) {
    return (M + (int64_t)E * (pad - 1)) / pad * pad;
}

typedef struct {
    uint16_t *x;
    int32_t *off, *poff;
    uint8_t *q, *sr, *qt, *sc;
} dev_bufs;

/* Blocks of a launch: one wave (every block resident at once), fewer when there are fewer
 * items. */
static int grid_of(int var, int64_t Mcap, int K) {
    const int64_t items = Mcap / 32 * ((K + TK - 1) / TK),
                  wave = (int64_t)var_per_sm[var] * num_sms;
    return (int)(items < wave ? items : wave);
}

/* Needs Mcap > 0 (some expert or some row), E <= MAXE, and the items and Mcap within int (the
 * kernel's token positions are 32-bit): main checks the shapes. */
static void launch(int var, const dev_bufs *d, int E, int K, int64_t Mcap, int pad,
                   int floor_rule) {
    const int g = grid_of(var, Mcap, K);
    if (var == 0)
        k_mxfp8_quant<3><<<g, NT>>>(d->q, d->sr, d->qt, d->sc, d->poff, d->x, d->off, E, K, Mcap,
                                    pad, floor_rule);
    else
        k_mxfp8_quant<4><<<g, NT>>>(d->q, d->sr, d->qt, d->sc, d->poff, d->x, d->off, E, K, Mcap,
                                    pad, floor_rule);
    CK(cudaGetLastError());
}

static int64_t bytes_moved(int64_t M, int E, int K, int64_t Mcap) {
    return 2 * M * K + M * K + M * K / 32 + K * Mcap + K * Mcap / 32 + 8 * (int64_t)(E + 1);
}

/* Host copies of one run's outputs. */
typedef struct {
    uint8_t *q, *sr, *qt, *sc;
    int32_t *poff;
} host_out;

static void fetch(host_out *h, const dev_bufs *d, int64_t M, int E, int K, int64_t Mcap) {
    CK(cudaMemcpy(h->q, d->q, (size_t)(M * K), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h->sr, d->sr, (size_t)(M * K / 32), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h->qt, d->qt, (size_t)(K * Mcap), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h->sc, d->sc, (size_t)(K * Mcap / 32), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h->poff, d->poff, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost));
}

/* One run of variant var onto output buffers prefilled with byte, fetched into h. */
static void run_once(int var, host_out *h, const dev_bufs *d, int64_t M, int E, int K, int64_t Mcap,
                     int pad, int floor_rule, int byte) {
    CK(cudaMemset(d->q, byte, (size_t)(M * K)));
    CK(cudaMemset(d->sr, byte, (size_t)(M * K / 32)));
    CK(cudaMemset(d->qt, byte, (size_t)(K * Mcap)));
    CK(cudaMemset(d->sc, byte, (size_t)(K * Mcap / 32)));
    CK(cudaMemset(d->poff, byte, sizeof(int32_t) * (E + 1)));
    launch(var, d, E, K, Mcap, pad, floor_rule);
    CK(cudaDeviceSynchronize());
    fetch(h, d, M, E, K, Mcap);
}

/* The first byte where two runs' outputs differ, as "q byte 123" into out; 0 when none. */
static int outputs_differ(const host_out *a, const host_out *b, int64_t M, int E, int K,
                          int64_t Mcap, char *out, size_t cap) {
    const char *name[5] = {"q", "sr", "qt", "sc", "poff"};
    const void *pa[5] = {a->q, a->sr, a->qt, a->sc, a->poff},
               *pb[5] = {b->q, b->sr, b->qt, b->sc, b->poff};
    const int64_t n[5] = {M * K, M * K / 32, K * Mcap, K * Mcap / 32, 4 * (int64_t)(E + 1)};
    for (int i = 0; i < 5; i++) {
        const uint8_t *x = (const uint8_t *)pa[i], *y = (const uint8_t *)pb[i];
        if (memcmp(x, y, (size_t)n[i]) == 0) continue;
        int64_t j = 0;
        while (x[j] == y[j])
            j++;
        snprintf(out, cap, "%s byte %lld (0x%02x, 0x%02x)", name[i], (long long)j, x[j], y[j]);
        return 1;
    }
    return 0;
}

/* Prints the first mismatch (key of check_rows / check_cols) with everything about it. */
static void explain(int cols, int64_t key, const host_out *h, const uint16_t *xb, const float *fake,
                    const int32_t *off, const int32_t *poff, int E, int64_t K, int64_t Mcap,
                    int floor_rule) {
    const int is_val = (int)(key & 1);
    const int64_t i = key / 2;
    float amax, xs[32];
    if (!cols) {
        const int64_t r = i / K, k = i % K;
        for (int j = 0; j < 32; j++)
            xs[j] = moe_bf16_to_f32(xb[r * K + k / 32 * 32 + j]);
        const uint8_t want = ref_code(xs, 1, 32, floor_rule, &amax),
                      got = h->sr[r * (K / 32) + k / 32];
        printf("      first difference: q row %lld column %lld (block %lld): x bits 0x%04x, code "
               "GPU %u CPU %u (amax %g)",
               (long long)r, (long long)k, (long long)(k / 32), xb[r * K + k], got, want, amax);
        if (is_val)
            printf(", byte GPU 0x%02x CPU 0x%02x, decoded %08x, fake %08x", h->q[i],
                   moe_f32_to_e4m3(xs[k % 32] / moe_e8m0_to_f32(want), 1),
                   bits(moe_e4m3_to_f32(h->q[i]) * moe_e8m0_to_f32(got)), bits(fake[i]));
        printf("\n");
        return;
    }
    const int64_t k = i / Mcap, p = i % Mcap, pb = p / 32;
    const int e = expert_of(poff, E, p);
    const int64_t r0 = e < 0 ? 0 : off[e] + 32 * pb - poff[e];
    const int64_t left = e < 0 ? 0 : off[e + 1] - r0, nv = left < 0 ? 0 : left < 32 ? left : 32;
    for (int64_t t = 0; t < nv; t++)
        xs[t] = moe_bf16_to_f32(xb[(r0 + t) * K + k]);
    const uint8_t want = ref_code(xs, 1, nv, floor_rule, &amax), got = h->sc[k * (Mcap / 32) + pb];
    printf("      first difference: qt row %lld column %lld (expert %d, block %lld, %lld tokens "
           "from row %lld): code GPU %u CPU %u (amax %g)",
           (long long)k, (long long)p, e, (long long)pb, (long long)nv, (long long)r0, got, want,
           amax);
    if (is_val) {
        const int64_t t = p % 32;
        if (t < nv)
            printf(", token row %lld x bits 0x%04x, byte GPU 0x%02x CPU 0x%02x, decoded %08x, "
                   "fake %08x",
                   (long long)(r0 + t), xb[(r0 + t) * K + k], h->qt[i],
                   moe_f32_to_e4m3(xs[t] / moe_e8m0_to_f32(want), 1),
                   bits(moe_e4m3_to_f32(h->qt[i]) * moe_e8m0_to_f32(got)),
                   bits(fake[(r0 + t) * K + k]));
        else
            printf(", padding byte 0x%02x (0 expected)", h->qt[i]);
    }
    printf("\n");
}

/* Times the variants that passed (ceil rule, pad 32; variant 0 also pad 128) and a D2D copy
 * moving pad 32's bytes, taking turns: 3 warm-up rounds, median of 21. */
static void timing(const shape *sh, const dev_bufs *d, int64_t M, uint8_t *scratch,
                   const int *var_ok) {
    enum { WARM = 3, ROUNDS = 21, NK = NVAR + 2 }; /* copy, variants at pad 32, variant 0 at 128 */
    const int64_t cap32 = mx_cap(M, sh->E, 32), bytes32 = bytes_moved(M, sh->E, sh->K, cap32);
    int var[NK], pad[NK], on[NK];
    for (int k = 0; k < NK; k++) {
        var[k] = k == 0 ? -1 : k <= NVAR ? k - 1 : 0, pad[k] = k <= NVAR ? 32 : 128;
        on[k] = k == 0 || var_ok[var[k]];
    }
    float med[NK];
    pg_time_turns(
        NK, on, WARM, ROUNDS,
        /* an untimed memset first, long enough for the host to queue the whole round behind
         * it, so that no timed operation waits for the host (and the L2 starts cold) */
        [&](int r) { CK(cudaMemsetAsync(scratch, r & 0xff, (size_t)(bytes32 / 2))); },
        [&](int k) {
            if (k == 0)
                CK(cudaMemcpyAsync(scratch, scratch + bytes32 / 2, (size_t)(bytes32 / 2),
                                   cudaMemcpyDeviceToDevice));
            else
                launch(var[k], d, sh->E, sh->K, mx_cap(M, sh->E, pad[k]), pad[k], 0);
        },
        med);
    printf("\n  %s: M %lld, K %d, E %d; median of %d, taking turns\n", sh->name, (long long)M,
           sh->K, sh->E, ROUNDS);
    printf("  %-40s %9s %9s %8s %8s\n", "", "MB moved", "us", "GB/s", "of copy");
    for (int k = 0; k < NK; k++) {
        if (!on[k]) continue;
        const int64_t b = k == 0 ? bytes32 : bytes_moved(M, sh->E, sh->K, mx_cap(M, sh->E, pad[k]));
        char name[64];
        if (k == 0)
            snprintf(name, sizeof name, "copy D2D (pad 32's bytes)");
        else
            snprintf(name, sizeof name, "k_mxfp8_quant<%d> pad %d, %d blocks", var_minb[var[k]],
                     pad[k], grid_of(var[k], mx_cap(M, sh->E, pad[k]), sh->K));
        printf("  %-40s %9.1f %9.1f %8.0f %7.1f%%\n", name, b / 1e6, med[k] * 1e3, b / med[k] / 1e6,
               100.0 * (b / med[k]) / (bytes32 / med[0]));
    }
}

int main(void) {
    cudaDeviceProp prop;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    num_sms = prop.multiProcessorCount;
    printf("mxfp8_quant: %s, %d SMs, %d host threads\n", prop.name, num_sms, omp_get_max_threads());
    for (int v = 0; v < NVAR; v++) {
        const void *fn = v == 0 ? (const void *)k_mxfp8_quant<3> : (const void *)k_mxfp8_quant<4>;
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, fn));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&var_per_sm[v], fn, NT, 0));
        printf("  k_mxfp8_quant<%d>: %d registers, %zu bytes local, %zu bytes shared, %d blocks of "
               "%d threads per SM\n",
               var_minb[v], fa.numRegs, fa.localSizeBytes, fa.sharedSizeBytes, var_per_sm[v], NT);
        if (var_per_sm[v] < 1) return 1;
    }

    /* 1. the probe */
    uint32_t *d_probe, probe[4];
    CK(cudaMalloc(&d_probe, sizeof probe));
    k_probe<<<1, 1>>>(d_probe);
    CK(cudaMemcpy(probe, d_probe, sizeof probe, cudaMemcpyDeviceToHost));
    printf("probe: cvt.rn.satfinite.e4m3x2.f32 bytes: -NaN 0x%02x +NaN 0x%02x, -Inf 0x%02x +Inf "
           "0x%02x, -0 0x%02x -1e-30 0x%02x (CPU: ff 7f fe 7e 80 80); -NaN * 1 = %08x (CPU "
           "ffc00000)\n",
           probe[0] & 0xff, probe[0] >> 8 & 0xff, probe[1] & 0xff, probe[1] >> 8 & 0xff,
           probe[2] & 0xff, probe[2] >> 8 & 0xff, probe[3]);
    CK(cudaFree(d_probe));

    /* 2. the checks (and 4. the rates of the timed shapes) */
    cover cv = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    int fails = 0, var_ok[NVAR] = {1, 1};
    for (int s = 0; s < NSHAPE; s++) {
        const shape *sh = &shapes[s];
        const int E = sh->E, K = sh->K;
        int32_t off[9], poff[9];
        off[0] = 0;
        for (int e = 0; e < E; e++)
            off[e + 1] = off[e] + sh->counts[e];
        const int64_t M = off[E], MK = M * K, cap32 = mx_cap(M, E, 32), cap128 = mx_cap(M, E, 128);
        const int64_t capmax = cap32 > cap128 ? cap32 : cap128;
        if (E > MAXE || K % 32 || cap32 == 0 || capmax / 32 * ((K + TK - 1) / TK) > INT32_MAX) {
            printf("  %s: shape outside the kernel's limits  FAIL\n", sh->name);
            fails++;
            continue;
        }
        uint16_t *xb = (uint16_t *)malloc(sizeof(uint16_t) * (MK + 1));
        float *xf = (float *)malloc(sizeof(float) * (MK + 1)),
              *fr = (float *)malloc(sizeof(float) * (MK + 1)),
              *fc = (float *)malloc(sizeof(float) * (MK + 1));
        host_out h[2];
        for (int j = 0; j < 2; j++) {
            h[j].q = (uint8_t *)malloc((size_t)MK + 1);
            h[j].sr = (uint8_t *)malloc((size_t)MK / 32 + 1);
            h[j].qt = (uint8_t *)malloc((size_t)(K * capmax));
            h[j].sc = (uint8_t *)malloc((size_t)(K * capmax / 32));
            h[j].poff = (int32_t *)malloc(sizeof(int32_t) * (E + 1));
        }
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < M; r++)
            for (int64_t k = 0; k < K; k++)
                xb[r * K + k] = gen_x(0x5eed0000ull + (uint64_t)s, r, k),
                           xf[r * K + k] = moe_bf16_to_f32(xb[r * K + k]);
        dev_bufs d;
        CK(cudaMalloc(&d.x, sizeof(uint16_t) * (MK + 1)));
        CK(cudaMalloc(&d.off, sizeof(int32_t) * (E + 1)));
        CK(cudaMalloc(&d.poff, sizeof(int32_t) * (E + 1)));
        CK(cudaMalloc(&d.q, (size_t)MK + 1));
        CK(cudaMalloc(&d.sr, (size_t)MK / 32 + 1));
        CK(cudaMalloc(&d.qt, (size_t)(K * capmax)));
        CK(cudaMalloc(&d.sc, (size_t)(K * capmax / 32)));
        CK(cudaMemcpy(d.x, xb, sizeof(uint16_t) * MK, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d.off, off, sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice));
        int shape_ok = 1;
        for (int fl = 0; fl <= 1; fl++) {
            const moe_quant_opts o =
                moe_quant_opts_of(fl ? MOE_RECIPE_MXFP8_FLOOR : MOE_RECIPE_MXFP8);
            moe_quant_fake_vectors(fr, xf, M, K, K, 1, &o);
            for (int e = 0; e < E; e++) /* ops_fp8.c's column call, one expert's rows at a time */
                moe_quant_fake_vectors(fc + off[e] * K, xf + off[e] * K, K, 1, off[e + 1] - off[e],
                                       K, &o);
            for (int pi = 0; pi < 2; pi++) {
                const int pad = pi ? 128 : 32;
                const int64_t Mcap = mx_cap(M, E, pad);
                const char *rule = fl ? "ocp-floor" : "ceil";
                poff[0] = 0;
                for (int e = 0; e < E; e++)
                    poff[e + 1] = poff[e] + (sh->counts[e] + pad - 1) / pad * pad;
                /* variant 0 against the CPU, onto 0xa5 and onto 0x5a */
                char at[96];
                run_once(0, &h[0], &d, M, E, K, Mcap, pad, fl, 0xa5);
                run_once(0, &h[1], &d, M, E, K, Mcap, pad, fl, 0x5a);
                const int unwritten = outputs_differ(&h[0], &h[1], M, E, K, Mcap, at, sizeof at);
                if (unwritten)
                    printf("  %-15s %-9s pad %3d: the runs onto 0xa5 and 0x5a differ at %s: not "
                           "written (or not deterministic)  FAIL\n",
                           sh->name, rule, pad, at);
                int64_t fr_key, fc_key;
                const int64_t bad_r = check_rows(h[0].q, h[0].sr, xf, fr, M, K, fl, &cv, &fr_key);
                const int64_t bad_c =
                    check_cols(h[0].qt, h[0].sc, xf, fc, off, poff, E, K, Mcap, fl, &cv, &fc_key);
                const int bad_p = memcmp(h[0].poff, poff, sizeof(int32_t) * (E + 1)) != 0;
                const int ok = !unwritten && bad_r == 0 && bad_c == 0 && !bad_p;
                printf("  %-15s %-9s pad %3d: M %lld Mcap %lld: <%d> q, sr %lld bad; qt, sc %lld "
                       "bad; poff %s  %s\n",
                       sh->name, rule, pad, (long long)M, (long long)Mcap, var_minb[0],
                       (long long)bad_r, (long long)bad_c, bad_p ? "differs" : "ok",
                       ok ? "ok" : "FAIL");
                if (bad_r) explain(0, fr_key, &h[0], xb, fr, off, poff, E, K, Mcap, fl);
                if (bad_c) explain(1, fc_key, &h[0], xb, fc, off, poff, E, K, Mcap, fl);
                shape_ok &= ok, var_ok[0] &= ok;
                /* the other variants against variant 0's bytes, onto both patterns */
                for (int v = 1; v < NVAR; v++) {
                    int same = 1;
                    for (int j = 0; j < 2 && same; j++) {
                        run_once(v, &h[1], &d, M, E, K, Mcap, pad, fl, j ? 0x5a : 0xa5);
                        same = !outputs_differ(&h[0], &h[1], M, E, K, Mcap, at, sizeof at);
                    }
                    if (same)
                        printf("  %-15s %-9s pad %3d: <%d> the same bytes as <3>  ok\n", sh->name,
                               rule, pad, var_minb[v]);
                    else
                        printf("  %-15s %-9s pad %3d: <%d> differs from <3> at %s  FAIL\n",
                               sh->name, rule, pad, var_minb[v], at);
                    var_ok[v] &= same;
                }
            }
        }
        fails += !shape_ok;
        if (sh->timed && var_ok[0]) {
            uint8_t *scratch;
            CK(cudaMalloc(&scratch, (size_t)bytes_moved(M, E, K, cap32)));
            timing(sh, &d, M, scratch, var_ok);
            CK(cudaFree(scratch));
        } else if (sh->timed) {
            printf("  %s: not timed (FAIL above)\n", sh->name);
        }
        CK(cudaFree(d.x));
        CK(cudaFree(d.off));
        CK(cudaFree(d.poff));
        CK(cudaFree(d.q));
        CK(cudaFree(d.sr));
        CK(cudaFree(d.qt));
        CK(cudaFree(d.sc));
        for (int j = 0; j < 2; j++)
            free(h[j].q), free(h[j].sr), free(h[j].qt), free(h[j].sc), free(h[j].poff);
        free(xb), free(xf), free(fr), free(fc);
    }
    for (int v = 1; v < NVAR; v++)
        fails += !var_ok[v];

    /* 3. coverage */
    const int covered = cv.zero_rblk && cv.zero_cblk && cv.code0 && cv.nan && cv.inf && cv.sub &&
                        cv.sat && cv.pad_bytes && cv.empty_blk;
    printf("\ncoverage (all checks of <3>): all-zero row blocks %lld, all-zero column blocks %lld, "
           "code-0 blocks %lld, NaN %lld, Inf %lld, subnormal inputs %lld, saturated values %lld, "
           "padding bytes %lld, blocks without tokens %lld  %s\n",
           (long long)cv.zero_rblk, (long long)cv.zero_cblk, (long long)cv.code0, (long long)cv.nan,
           (long long)cv.inf, (long long)cv.sub, (long long)cv.sat, (long long)cv.pad_bytes,
           (long long)cv.empty_blk, covered ? "ok" : "FAIL (the test data missed a case)");
    fails += !covered;
    printf("%s\n", fails ? "mxfp8_quant: FAIL" : "mxfp8_quant: all checks passed");
    return fails ? 1 : 0;
}
