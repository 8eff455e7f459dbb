/* recipe: the precision recipe, the one setting that decides the dtype of every GEMM operand,
 * stored activation and weight copy (docs/model.md's precision table).
 *
 * Its own header because the ops layer needs the enum and nothing else of the configuration
 * (moe/config.h includes this file; its `precision.recipe` key holds one of these values and
 * moe_recipe_name() lives there with the other schema names). Master weights and optimizer
 * state are fp32 under every recipe. */
#ifndef MOE_RECIPE_H
#define MOE_RECIPE_H

typedef enum moe_recipe {
    MOE_RECIPE_FP32,      /* fp32 operands: the CPU reference */
    MOE_RECIPE_BF16,      /* bf16 GEMM operands and stored activations, fp32 accumulation */
    MOE_RECIPE_FP8_BLOCK, /* e4m3, 128x128 / 1x128 block scales (moe/quant.h): the CPU
                             emulates it, the CUDA backend runs it through cuBLASLt */
    MOE_RECIPE_MXFP8,     /* e4m3, e8m0 scale per 32 values: the CPU emulates it; the CUDA
                             backend multiplies bf16 tiles of the quantized values (sm_90 has
                             no MXFP8 GEMM) */
    /* the same two formats under their other options (precision.fp8_scale,
     * precision.fp8_wgrad); what the model hands to the ops, never a precision.recipe value
     * of its own: */
    MOE_RECIPE_FP8_BLOCK_POW2,   /* fp8-block, each scale rounded up to a power of two */
    MOE_RECIPE_MXFP8_FLOOR,      /* mxfp8 with OCP's floor rule instead of ceil */
    MOE_RECIPE_FP8_BLOCK_XT,     /* fp8-block, the wgrad's x in 128 x 128 tiles (x-tiles) */
    MOE_RECIPE_FP8_BLOCK_POW2_XT /* both options */
} moe_recipe;

/* 1 for the recipes that quantize products to e4m3 (fp8-block, mxfp8, either scale rule). */
static inline int moe_recipe_is_fp8(moe_recipe r) {
    return r >= MOE_RECIPE_FP8_BLOCK;
}

/* The format of an fp8 recipe without its options: FP8_BLOCK or MXFP8; else r. */
static inline moe_recipe moe_recipe_format(moe_recipe r) {
    return r == MOE_RECIPE_FP8_BLOCK_POW2 || r == MOE_RECIPE_FP8_BLOCK_XT ||
                   r == MOE_RECIPE_FP8_BLOCK_POW2_XT
               ? MOE_RECIPE_FP8_BLOCK
           : r == MOE_RECIPE_MXFP8_FLOOR ? MOE_RECIPE_MXFP8
                                         : r;
}

/* 1 for fp8-block under precision.fp8_scale pow2: every scale a power of two. */
static inline int moe_recipe_pow2(moe_recipe r) {
    return r == MOE_RECIPE_FP8_BLOCK_POW2 || r == MOE_RECIPE_FP8_BLOCK_POW2_XT;
}

/* 1 for fp8-block under precision.fp8_wgrad x-tiles: a wgrad dW = dy^T x reads x with one
 * scale per 128 x 128 tile of tokens and features (each group's tokens from its first row)
 * instead of 1 x 128 blocks along the tokens; dy keeps its blocks (docs/dtypes.md). */
static inline int moe_recipe_wgrad_tiles(moe_recipe r) {
    return r == MOE_RECIPE_FP8_BLOCK_XT || r == MOE_RECIPE_FP8_BLOCK_POW2_XT;
}

/* The recipe of everything an fp8 recipe does not quantize (the attention products, lm_head,
 * norms, SwiGLU; which of the products it quantizes is the model's choice, docs/dtypes.md):
 * bf16 for the fp8 recipes, else the recipe itself. */
static inline moe_recipe moe_recipe_unquantized(moe_recipe r) {
    return moe_recipe_is_fp8(r) ? MOE_RECIPE_BF16 : r;
}

#endif
