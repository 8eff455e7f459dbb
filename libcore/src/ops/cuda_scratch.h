/* cuda_scratch: the two numbers of the CUDA backend's scratch policy (private header).
 *
 * kernels/backend_cuda.cu allocates by them; src/ops/backend.c's moe_backend_scratch_estimate
 * predicts the same memory without a device (moe-train --dry-run, any build), so both read
 * them from here. Which operand sits in which scratch slot is described next to that
 * estimate; gpu.memory_estimate compares it with the measured peak on a GPU. */
#ifndef MOE_OPS_CUDA_SCRATCH_H
#define MOE_OPS_CUDA_SCRATCH_H

#include <stddef.h>

/* One cuBLASLt workspace for all GEMMs, allocated when the backend starts. */
#define MOE_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)
/* A scratch slot that must grow is reallocated at 1.25 x the request, so that slowly rising
 * sizes do not reallocate every step: a slot holds at most 1.25 x its largest request. */
#define MOE_CUDA_SCRATCH_GROW(bytes) ((bytes) + (bytes) / 4)
/* The RMSNorm backward keeps one fp32 partial weight gradient [C] per this many rows in the
 * reduction slot (its largest user), summed in a fixed order: deterministic. */
#define MOE_CUDA_RMS_ROWS 16

#endif
