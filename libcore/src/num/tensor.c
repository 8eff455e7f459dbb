/* tensor: allocation, shape bookkeeping and views (see moe/tensor.h). */
#include "moe/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *moe_aligned_alloc(size_t nbytes) {
    if (nbytes == 0) return NULL;
    void *p = NULL;
    size_t rounded = (nbytes + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN;
    if (rounded < nbytes || posix_memalign(&p, MOE_ALIGN, rounded) != 0) return NULL;
    return p;
}

void moe_aligned_free(void *p) {
    free(p);
}

static void set_contiguous(moe_tensor *t) {
    int64_t s = 1;
    for (int d = MOE_TENSOR_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= t->ndim) {
            t->dims[d] = 1;
            t->strides[d] = 1;
            continue;
        }
        t->strides[d] = s;
        s *= t->dims[d];
    }
}

/* Checks a shape; on success *numel holds the element count and nbytes fits in size_t. */
static moe_status check_shape(moe_dtype dtype, int ndim, const int64_t *dims, int64_t *numel,
                              moe_err *err) {
    if (ndim < 0 || ndim > MOE_TENSOR_MAX_DIMS)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "tensor rank %d outside 0..%d", ndim,
                           MOE_TENSOR_MAX_DIMS);
    if (moe_dtype_size(dtype) == 0)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "invalid dtype %d", (int)dtype);
    int64_t n = 1, limit = INT64_MAX / (int64_t)moe_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (dims[d] < 0)
            return moe_err_set(err, MOE_ERR_INPUT, NULL, "tensor dim %d is negative (%lld)", d,
                               (long long)dims[d]);
        if (dims[d] > 0 && n > limit / dims[d])
            return moe_err_set(err, MOE_ERR_INPUT, NULL, "tensor of %s too large",
                               moe_dtype_name(dtype));
        n *= dims[d];
    }
    if ((uint64_t)n * moe_dtype_size(dtype) > (uint64_t)SIZE_MAX)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "tensor too large for this machine");
    *numel = n;
    return MOE_OK;
}

moe_status moe_tensor_alloc(moe_tensor *t, moe_dtype dtype, int ndim, const int64_t *dims,
                            moe_err *err) {
    memset(t, 0, sizeof *t);
    int64_t n;
    if (check_shape(dtype, ndim, dims, &n, err) != MOE_OK) return MOE_ERR_INPUT;
    size_t nbytes = (size_t)n * moe_dtype_size(dtype);
    void *p = NULL;
    if (nbytes > 0) {
        p = moe_aligned_alloc(nbytes);
        if (!p)
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory allocating %zu bytes",
                               nbytes);
        memset(p, 0, nbytes);
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->dims[d] = dims[d];
    set_contiguous(t);
    t->device = MOE_DEV_CPU;
    t->data = p;
    t->owns = p != NULL;
    return MOE_OK;
}

moe_tensor moe_tensor_wrap(void *data, moe_dtype dtype, int ndim, const int64_t *dims,
                           moe_device device) {
    moe_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = ndim < 0 ? 0 : ndim > MOE_TENSOR_MAX_DIMS ? MOE_TENSOR_MAX_DIMS : ndim;
    for (int d = 0; d < t.ndim; d++)
        t.dims[d] = dims[d];
    set_contiguous(&t);
    t.device = device;
    t.data = data;
    return t;
}

void moe_tensor_free(moe_tensor *t) {
    if (!t) return;
    if (t->owns && t->device == MOE_DEV_CPU) moe_aligned_free(t->data);
    memset(t, 0, sizeof *t);
}

int64_t moe_tensor_numel(const moe_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->dims[d];
    return n;
}

size_t moe_tensor_nbytes(const moe_tensor *t) {
    return (size_t)moe_tensor_numel(t) * moe_dtype_size(t->dtype);
}

int moe_tensor_is_contiguous(const moe_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->dims[d] != 1 && t->strides[d] != s) return 0; /* size-1 dims: any stride */
        s *= t->dims[d];
    }
    return 1;
}

const char *moe_tensor_describe(const moe_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "%s[", moe_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)t->dims[d]);
    if (k < n) snprintf(buf + k, n - k, "] %s", t->device == MOE_DEV_CUDA ? "cuda" : "cpu");
    return buf;
}

static void view_of(moe_tensor *dst, const moe_tensor *src) {
    *dst = *src;
    dst->owns = 0;
}

moe_status moe_tensor_reshape(moe_tensor *dst, const moe_tensor *src, int ndim, const int64_t *dims,
                              moe_err *err) {
    int64_t n;
    if (check_shape(src->dtype, ndim, dims, &n, err) != MOE_OK) return MOE_ERR_INPUT;
    if (!moe_tensor_is_contiguous(src))
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "reshape of a non-contiguous tensor");
    if (n != moe_tensor_numel(src))
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "reshape from %lld to %lld elements",
                           (long long)moe_tensor_numel(src), (long long)n);
    view_of(dst, src);
    dst->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        dst->dims[d] = dims[d];
    set_contiguous(dst);
    return MOE_OK;
}

moe_status moe_tensor_narrow(moe_tensor *dst, const moe_tensor *src, int dim, int64_t start,
                             int64_t len, moe_err *err) {
    if (dim < 0 || dim >= src->ndim)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "narrow: dim %d of a rank-%d tensor", dim,
                           src->ndim);
    if (start < 0 || len < 0 || start > src->dims[dim] - len)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "narrow: [%lld, %lld) outside dim %d of size %lld", (long long)start,
                           (long long)(start + len), dim, (long long)src->dims[dim]);
    moe_tensor v;
    view_of(&v, src);
    if (src->data)
        v.data =
            (char *)src->data + start * src->strides[dim] * (int64_t)moe_dtype_size(src->dtype);
    v.dims[dim] = len;
    *dst = v;
    return MOE_OK;
}

moe_status moe_tensor_transpose(moe_tensor *dst, const moe_tensor *src, int d0, int d1,
                                moe_err *err) {
    if (d0 < 0 || d1 < 0 || d0 >= src->ndim || d1 >= src->ndim)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "transpose: dims %d, %d of a rank-%d tensor",
                           d0, d1, src->ndim);
    moe_tensor v;
    view_of(&v, src);
    int64_t td = v.dims[d0], ts = v.strides[d0];
    v.dims[d0] = v.dims[d1], v.strides[d0] = v.strides[d1];
    v.dims[d1] = td, v.strides[d1] = ts;
    *dst = v;
    return MOE_OK;
}
