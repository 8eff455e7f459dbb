/* quant: the block-scaled fp8 formats of the fp8 recipes (precision.recipe fp8-block and
 * mxfp8), as the CPU emulates them: "fake quantization", each value replaced by what its
 * block's fp8 encoding decodes back to, in fp32.
 *
 * fp8-block: E4M3 values, one fp32 scale per block of 128 consecutive elements along a
 * vector (activations and gradients: 1 x 128 along the reduction dimension) or per 128 x 128
 * tile of a matrix (weights); scale = amax / 448, at least 2^-126 (amax over the block's finite
 * values; 1 for an all-zero block), or with the pow2 rule the smallest power of two >= that.
 * mxfp8 (OCP MX v1.0): E4M3 values, one E8M0 power-of-two scale per 32 consecutive elements; the
 * `ceil` rule takes the smallest 2^k >= amax / 448 (no element saturates; NVIDIA's MXFP8 recipe,
 * the default), `ocp-floor` 2^(floor(log2 amax) - 8). A value x is encoded as e4m3(x * r), r =
 * 1 / scale correctly rounded once a block (finite: the scale is normal), as Transformer Engine
 * multiplies by its scale; under a power-of-two scale x * r is x / scale exactly, otherwise
 * their last bits may differ (2^-20 of e4m3's own error). Encoding saturates (|x| above 448
 * scale gives 448 scale), NaN stays NaN. The one thing to know: a block never straddles the end
 * of a vector (the last block of a vector may be short), so an expert's rows are quantized as
 * their own group. */
#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#include <stdint.h>

#include "moe/dtype.h"
#include "moe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_quant_opts {
    moe_recipe recipe; /* MOE_RECIPE_FP8_BLOCK or MOE_RECIPE_MXFP8 (the format) */
    int mx_floor;      /* mxfp8: the ocp-floor scale rule instead of ceil */
    int pow2;          /* fp8-block: amax / 448 rounded up to a power of two (as E8M0 ceil) */
} moe_quant_opts;

/* The E8M0 scale of an MXFP8 block whose finite values have magnitude at most amax: the
 * smallest 2^k >= amax / 448 (ceil, the default rule), or with floor_rule OCP's
 * 2^(floor(log2 amax) - 8) (code 0 at least); 1 for a block with nothing finite but zeros.
 * MOE_HD: the CUDA backend's MXFP8 kernels compute the same scales (kernels/mxfp8.cu). */
MOE_HD float moe_mx_block_scale(float amax, int floor_rule) {
    if (!(amax > 0.0f)) return 1.0f;
    if (!floor_rule) return moe_e8m0_to_f32(moe_f32_to_e8m0_ceil(amax / 448.0f));
    int code = (int)moe_f32_to_e8m0_floor(amax) - 8; /* emax of E4M3 is 8 */
    return moe_e8m0_to_f32((uint8_t)(code < 0 ? 0 : code));
}

/* The quantizer options of an fp8 recipe (any of moe_recipe_is_fp8's). */
moe_quant_opts moe_quant_opts_of(moe_recipe r);

/* Elements per block along a vector: 128 (fp8-block) or 32 (mxfp8). */
int64_t moe_quant_block(const moe_quant_opts *o);

/* dst = fake-quantized src for nvec vectors of len elements: element j of vector v is at
 * [v * vstride + j * estride]; consecutive blocks of moe_quant_block elements along each
 * vector share a scale. dst may equal src. */
void moe_quant_fake_vectors(float *dst, const float *src, int64_t nvec, int64_t vstride,
                            int64_t len, int64_t estride, const moe_quant_opts *o);

/* One fp8-block block of n values (n <= 128, contiguous) as the GPU's fp8-block operands
 * store it: *scale its scale (pow2: the power-of-two rule) and q[j] = e4m3(src[j] times the
 * reciprocal of *scale, above), saturating, NaN kept with its sign; decoding gives
 * moe_quant_fake_vectors's values. The CUDA backend's activation quantizers write these bytes
 * (moe_cuda_fp8_block_operand). */
void moe_fp8_encode_block(uint8_t *q, float *scale, const float *src, int64_t n, int pow2);

/* ---- fp8-block activation pairs (moe/ops.h's moe_buf_fp8_pair) ----
 * An activation x [M, K] whose rows fall in E groups (group e: rows offsets[e] .. offsets[e + 1],
 * offsets[0] = 0, M = offsets[E]) stored as both operands of its fp8-block products, in one
 * buffer: the row-wise copy (1 x 128 blocks along K: the operand of a product reducing over K,
 * the forward's x and dgrad's dy) and each group's transposed copy (wgrad's operand: 1 x 128
 * blocks along the group's rows, zero-padded to whole blocks; or, with tiles, one scale per
 * 128 x 128 tile, precision.fp8_wgrad x-tiles' x), in the layouts the CUDA backend's
 * quantizers write (kernels/quant_fp8.cu), each block moe_fp8_encode_block's bytes and each
 * tile moe_quant_tiles_e4m3's:
 *   rows  q [M, K] at byte 0; block (r, kb)'s scale at s_rows[kb * lds + r], lds = M rounded
 *         up to a multiple of 4 (entries of rows M .. lds - 1 unwritten)
 *   cols  group e's rows transposed, q_e [K, np_e] (np_e = 128 ceil(n_e / 128) columns, those
 *         past n_e zero) at q_cols + 128 pb_e K, pb_e the padded blocks of the groups before e
 *         (PB in all); block b (counted over all groups) of column k at s_cols[b * K + k];
 *         with tiles, group e's tile scales as those of a weight [K, np_e]
 *         (moe_fp8_tile_scales) after the earlier groups': tile (kt, j) at
 *         s_cols[ts_e + kt * round4(np_e / 128) + j], ts_e the sum over the groups before e
 * The parts start at the byte offsets of moe_fp8_pair_layout_of, each 256-byte aligned; the
 * gaps between them are unwritten. */
typedef struct moe_fp8_pair_layout {
    int64_t M, K, KB, lds, PB;            /* KB = ceil(K / 128) blocks a row */
    int tiles;                            /* the transposed copy's scales per tile */
    size_t s_rows, q_cols, s_cols, bytes; /* byte offsets of the parts, and the end */
} moe_fp8_pair_layout;
moe_fp8_pair_layout moe_fp8_pair_layout_of(const int32_t *offsets, int64_t E, int64_t K, int tiles);
/* The most bytes a pair of M rows in E groups of K columns takes, whatever the split (the
 * blocks' scales: tiles take fewer). */
size_t moe_fp8_pair_bytes_max(int64_t M, int64_t E, int64_t K);
/* pair = x [M, K] (fp32 values) in that layout; pow2: the power-of-two scale rule. */
void moe_fp8_pair_encode(uint8_t *pair, const float *x, const int32_t *offsets, int64_t E,
                         int64_t K, int pow2, int tiles);
/* x [M, K] = the values of the pair's row-wise copy (moe_quant_fake_vectors's along K). */
void moe_fp8_pair_rows(float *x, const uint8_t *pair, const moe_fp8_pair_layout *l);
/* x [n_e, K] = the values of group e's transposed copy, back in row-major order (group e's
 * rows fake-quantized along its own rows, or in its tiles: moe_quant_fake_tiles's). */
void moe_fp8_pair_cols(float *x, const uint8_t *pair, const moe_fp8_pair_layout *l,
                       const int32_t *offsets, int64_t e);

/* fp8-block weights: dst = fake-quantized src [R, K] (row-major) with one scale per 128 x 128
 * tile (edge tiles smaller), amax / 448 or (pow2) its power-of-two rounding. The same values
 * whichever dimension a product reduces over. */
void moe_quant_fake_tiles(float *dst, const float *src, int64_t R, int64_t K, int pow2);

/* The stored form of those tiles (the fp8-block weight copies of moe/ops.h): q [R, K] the
 * e4m3 bytes of src [R, K] times its tile scale's reciprocal (above), qt [K, R] the same
 * bytes transposed, s the scales of the [R, K] tiles and st of the [K, R] ones, each in
 * moe_fp8_tile_scales's layout (tile (rb, kb) of an [R, K] matrix at rb * round_up(ceil(K / 128),
 * 4) + kb; padding entries untouched). Decoding them gives exactly moe_quant_fake_tiles's values.
 */
void moe_quant_tiles_e4m3(uint8_t *q, float *s, uint8_t *qt, float *st, const float *src, int64_t R,
                          int64_t K, int pow2);
/* Decodes a tiled e4m3 matrix q [R, K] with scales s (layout above): dst [R, K] =
 * e4m3(q) * scale, or with transpose dst [K, R] (the matrix q is the transpose of). */
void moe_quant_tiles_decode(float *dst, const uint8_t *q, const float *s, int64_t R, int64_t K,
                            int transpose);

/* One block of the stored MXFP8 activations (moe/ops.h's moe_buf_mxfp8, kept under the mxfp8
 * recipe; floor_rule 0, the ceil rule) or of a product's operand: src [32] as q [32] e4m3 and
 * *mx e8m0, with the rule's scale (moe_mx_block_scale; an all-zero block 1, code 127), values
 * e4m3(x / scale) saturating, NaN kept: decoding (moe_cbuf_get) gives moe_quant_fake_vectors's
 * values for a block of 32 under the same rule, and encoding what a decode gave returns the same
 * values. Serial: the ops call it inside their loops. */
void moe_mxfp8_encode_block(uint8_t *q, uint8_t *mx, const float *src, int floor_rule);

/* ---- the operands of MXFP8 tensor-core products (cuBLASLt's VEC32_UE8M0, sm_100+) ----
 * An operand [R, K] is K-contiguous e4m3 (one block of 32 along K a scale) with its e8m0
 * scales in the "128 x 4" tiled layout (cuDNN's and Transformer Engine's name): tiles of 128
 * rows x 4 scales (512 bytes), row-major over (ceil(R / 128), ceil(K / 128)); inside a tile,
 * row r's scale j at (r % 32) * 16 + (r % 128) / 32 * 4 + j. Rows past R and scales past K in
 * the last tiles are padding. The byte of row r's block kb for K columns: */
MOE_HD int64_t moe_mx_tiled_index(int64_t r, int64_t kb, int64_t K) {
    return ((r / 128) * ((K + 127) / 128) + kb / 4) * 512 + (r % 32) * 16 + (r % 128) / 32 * 4 +
           kb % 4;
}
/* The bytes of those scales for R rows (whole tiles). */
MOE_HD int64_t moe_mx_tiled_bytes(int64_t R, int64_t K) {
    return (R + 127) / 128 * ((K + 127) / 128) * 512;
}
/* R rounded up to whole 128-row tiles: the tokens of a group quantized along them (wgrad). */
MOE_HD int64_t moe_mx_pad(int64_t R) {
    return (R + 127) / 128 * 128;
}
/* The reference of those operands, from x [R, K] (K a multiple of 32) by the rule floor_rule
 * (as moe_mx_block_scale): along the rows, q [R, K] and sc [moe_mx_tiled_bytes(R, K)]; with
 * transpose, along the columns, q [K, moe_mx_pad(R)] (x's columns, zeros past R) and sc
 * [moe_mx_tiled_bytes(K, moe_mx_pad(R))]. Padding scales are 127 (2^0), so a product reads no
 * NaN there. The CUDA backend's kernels write the same bytes (kernels/mxfp8.cu). */
void moe_mx_encode_tiled(uint8_t *q, uint8_t *sc, const float *x, int64_t R, int64_t K,
                         int floor_rule, int transpose);

#ifdef __cplusplus
}
#endif

#endif
