/* adamw_fp8.cu: the launcher of the one-pass fp8-block optimizer step (adamw_fp8.cuh, the ring
 * design) for the CUDA backend's adamw_quantize_weight (backend_cuda.cu), which runs the two
 * passes (AdamW, then quantize_weight) wherever moe_cuda_adamw_fp8_supported says no. Compiled
 * for sm_90a only (CMakeLists.txt). NOT RUN ON A GPU YET (2026-12-05). */
#include "adamw_fp8.cuh"

#define AF_NST 8 /* stages in the ring: 192 KB of loads ahead of the consumers (ring<8>) */

/* Only bf16 moments: the ring's stage holds 16 rows of m and v as bf16 (fp32 moments would
 * need 32 KB stages and other patches: the two passes serve them). */
int moe_cuda_adamw_fp8_supported(const moe_cuda_ctx *c, int64_t O, int64_t I, const float *w,
                                 const float *grad, const void *m, const void *v, const void *q) {
    return c->sm == 90 && moe_cuda_fp8_shape_ok(I, O) &&
           (((uintptr_t)w | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v | (uintptr_t)q) & 15) ==
               0;
}

int moe_cuda_adamw_fp8(moe_cuda_ctx *c, float *w, const float *grad, uint16_t *m, uint16_t *v,
                       uint8_t *q, float *s, int64_t E, int64_t O, int64_t I, int pow2, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int64_t step,
                       float grad_scale, const char *op) {
    const int smem = RING_SMEM(AF_NST);
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_adamw_fp8_ring<AF_NST>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                        op, "shared memory %d bytes", smem))
        return 0;
    const adamw_hp h = adamw_hp_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    const int64_t tiles = E * ((O + QB - 1) / QB) * ((I + QB - 1) / QB);
    const unsigned grid = (unsigned)(tiles < c->num_sms ? tiles : c->num_sms);
    k_adamw_fp8_ring<AF_NST><<<grid, RING_THREADS, smem, c->stream>>>(
        w, grad, m, v, q, q + E * O * I, s, s + E * moe_fp8_tile_scales(O, I), E, O, I, h, pow2);
    return MOE_CUDA_LAUNCHED(c, op, "ring E=%lld O=%lld I=%lld", (long long)E, (long long)O,
                             (long long)I);
}
