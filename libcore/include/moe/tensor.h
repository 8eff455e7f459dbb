/* tensor: a typed, strided view of up to 4 dimensions on the CPU or a CUDA device.
 *
 * moe_tensor is a plain struct (dtype + dims + strides + device + data pointer), llm.c-
 * and ggml-style: ops take raw pointers with shape comments, and moe_tensor is what code
 * uses where a shape travels with the data (safetensors I/O, checkpoints, the backend
 * table). Strides count ELEMENTS, not bytes; dims[0] is the outermost (slowest) dimension,
 * so a contiguous [R, C] tensor has strides {C, 1}. Unused trailing dims are 1 and their
 * strides 1. `owns` says whether moe_tensor_free() releases data: only host memory from
 * moe_tensor_alloc() is owned here; CUDA memory belongs to the CUDA backend, which wraps
 * it with moe_tensor_wrap(..., MOE_DEV_CUDA). */
#ifndef MOE_TENSOR_H
#define MOE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "moe/dtype.h"
#include "moe/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_TENSOR_MAX_DIMS 4
#define MOE_ALIGN 64 /* bytes: host allocations are aligned for AVX-512 and cache lines */

typedef enum moe_device { MOE_DEV_CPU = 0, MOE_DEV_CUDA = 1 } moe_device;

typedef struct moe_tensor {
    moe_dtype dtype;
    int ndim;                             /* 0..4; 0 is a scalar (numel 1) */
    int64_t dims[MOE_TENSOR_MAX_DIMS];    /* sizes, outermost first */
    int64_t strides[MOE_TENSOR_MAX_DIMS]; /* in elements */
    moe_device device;
    int device_index; /* CUDA ordinal, 0 on the CPU */
    void *data;
    int owns; /* 1: moe_tensor_free() frees data (host memory from moe_tensor_alloc) */
} moe_tensor;

/* 64-byte aligned host memory (NULL on failure or nbytes == 0); free with moe_aligned_free. */
void *moe_aligned_alloc(size_t nbytes);
void moe_aligned_free(void *p);

/* A zero-filled contiguous host tensor. Negative dims, ndim outside 0..4 or a byte size
 * that overflows: MOE_ERR_INPUT; out of memory: MOE_ERR_RUNTIME. *t is zeroed on failure. */
moe_status moe_tensor_alloc(moe_tensor *t, moe_dtype dtype, int ndim, const int64_t *dims,
                            moe_err *err);
/* A contiguous non-owning tensor over existing memory (any device). */
moe_tensor moe_tensor_wrap(void *data, moe_dtype dtype, int ndim, const int64_t *dims,
                           moe_device device);
/* Frees owned data and zeroes *t; safe on a zeroed or non-owning tensor. */
void moe_tensor_free(moe_tensor *t);

int64_t moe_tensor_numel(const moe_tensor *t);
size_t moe_tensor_nbytes(const moe_tensor *t); /* numel * element size (extent of a view) */
int moe_tensor_is_contiguous(const moe_tensor *t);
/* "bf16[4, 128] cuda" into buf; returns buf. */
const char *moe_tensor_describe(const moe_tensor *t, char *buf, size_t n);

/* Views (never own): the same memory seen with another shape.
 * reshape: src must be contiguous and the element counts equal.
 * narrow:  dims[dim] restricted to [start, start + len).
 * transpose: dims d0 and d1 swapped (strides follow, result not contiguous in general). */
moe_status moe_tensor_reshape(moe_tensor *dst, const moe_tensor *src, int ndim, const int64_t *dims,
                              moe_err *err);
moe_status moe_tensor_narrow(moe_tensor *dst, const moe_tensor *src, int dim, int64_t start,
                             int64_t len, moe_err *err);
moe_status moe_tensor_transpose(moe_tensor *dst, const moe_tensor *src, int d0, int d1,
                                moe_err *err);

/* Address of element (i0, i1, i2, i3) (indices past ndim are ignored). */
static inline void *moe_tensor_at(const moe_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                  int64_t i3) {
    int64_t idx[MOE_TENSOR_MAX_DIMS] = {i0, i1, i2, i3}, off = 0;
    for (int d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    return (char *)t->data + off * (int64_t)moe_dtype_size(t->dtype);
}

#ifdef __cplusplus
}
#endif

#endif
