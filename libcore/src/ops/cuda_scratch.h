/* cuda_scratch: the numbers of the CUDA backend's scratch policy (private header).
 *
 * kernels/backend_cuda.cu allocates by them; src/ops/backend.c's moe_backend_scratch_estimate
 * predicts the same memory without a device (moe-train --dry-run, any build), so both read
 * them from here, and also which products the skinny kernels take (they need no converted
 * operands, and keep partial sums in the reduction slot). Which operand sits in which scratch
 * slot is described next to that estimate; gpu.memory_estimate compares it with the measured
 * peak on a GPU. */
#ifndef MOE_OPS_CUDA_SCRATCH_H
#define MOE_OPS_CUDA_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

/* One cuBLASLt workspace for all GEMMs, allocated when the backend starts. */
#define MOE_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)
/* A scratch slot that must grow is reallocated at 1.25 x the request, so that slowly rising
 * sizes do not reallocate every step: a slot holds at most 1.25 x its largest request. */
#define MOE_CUDA_SCRATCH_GROW(bytes) ((bytes) + (bytes) / 4)
/* The RMSNorm backward keeps one fp32 partial weight gradient [C] per this many rows in the
 * reduction slot (its largest user), summed in a fixed order: deterministic. */
#define MOE_CUDA_RMS_ROWS 16
/* The fp32 recipe's products of at most MOE_CUDA_SKINNY_MAX_O outputs (the router's gate, E
 * outputs) run on kernels/gemm_skinny.cu, which read a bf16 input as it is (no fp32 copy in
 * scratch) when I is a multiple of 8 and at most MOE_CUDA_SKINNY_MAX_I (the forward holds 8
 * rows of the fp32 weight, 128 KiB, in a block's shared memory: sm_80 and later give that).
 * Their weight gradient keeps one fp32 partial [O, I] per MOE_CUDA_SKINNY_ROWS rows in the
 * reduction slot, summed in a fixed order: deterministic. */
#define MOE_CUDA_SKINNY_MAX_O 32
#define MOE_CUDA_SKINNY_MAX_I 4096
#define MOE_CUDA_SKINNY_ROWS 256
/* The most groups (experts) the sm_90 grouped products take in one launch: on a compute
 * capability 9.0 device the backend takes fp8-block activation pairs of up to this many groups
 * (be->fp8_pairs), so the experts' fp8-block operands are pairs among the activations rather
 * than quantized into scratch (moe_backend_scratch_estimate's MOE_SCRATCH_SM90). */
#define MOE_CUDA_GROUPED_MAXE 128

static inline int moe_cuda_skinny_shape(int64_t I, int64_t O) {
    return O >= 1 && O <= MOE_CUDA_SKINNY_MAX_O && I >= 8 && I <= MOE_CUDA_SKINNY_MAX_I &&
           I % 8 == 0;
}

#endif
