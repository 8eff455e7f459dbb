/* safetensors: strict reader and writer of the Hugging Face safetensors format.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON (an object mapping tensor
 * names to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
 * "__metadata__" object of string -> string), then the data area; offsets are relative to
 * the start of the data area. Used for checkpoints (model, optimizer state) and by
 * moe-convert for Hugging Face import/export, so it is general: any dtype, metadata both
 * ways, conversion to f32 on read.
 *
 * The one thing to know: nothing in a file is trusted before the whole header validated.
 * The reader checks the header length bounds (<= 100 MB and inside the file), parses the
 * JSON with jansson (never by hand), checks every tensor (known dtype, non-negative shape,
 * end - begin == numel * dtype size, inside the data area) and that no two tensors overlap,
 * and only then hands out data pointers into the read-only mmap. Every error names the file
 * and, where one is involved, the tensor. */
#ifndef MOE_SAFETENSORS_H
#define MOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/err.h"

#define MOE_ST_MAX_DIMS 8
#define MOE_ST_MAX_HEADER 100000000ull /* as the reference implementation */

/* The dtypes of the safetensors spec. */
typedef enum moe_st_dtype {
    MOE_ST_BOOL,
    MOE_ST_U8,
    MOE_ST_I8,
    MOE_ST_U16,
    MOE_ST_I16,
    MOE_ST_F16,
    MOE_ST_BF16,
    MOE_ST_U32,
    MOE_ST_I32,
    MOE_ST_F32,
    MOE_ST_U64,
    MOE_ST_I64,
    MOE_ST_F64,
    MOE_ST_F8_E4M3,
    MOE_ST_F8_E5M2,
    MOE_ST_N_DTYPES
} moe_st_dtype;

const char *moe_st_dtype_name(moe_st_dtype d); /* "F32", "BF16", ... */
size_t moe_st_dtype_size(moe_st_dtype d);      /* bytes per element */
/* Parses a spec name ("F32"); returns -1 when unknown. */
int moe_st_dtype_parse(const char *name);

typedef struct moe_st_tensor {
    char *name;
    moe_st_dtype dtype;
    int ndim;
    int64_t shape[MOE_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* byte offsets in the data area */
    const void *data;    /* points into the mapping; little-endian elements */
} moe_st_tensor;

typedef struct moe_st_file {
    char *path;
    void *map; /* whole file, read-only (NULL for an empty data area) */
    size_t map_size;
    const uint8_t *data; /* start of the data area */
    uint64_t data_size;
    int n_tensors;
    moe_st_tensor *tensors; /* sorted by name */
    int n_meta;
    char **meta_keys, **meta_values;
    int owns_buffer; /* map is malloc'ed, not mmap'ed */
} moe_st_file;

/* Opens and validates path (mmap). On error *f is left closed (nothing to free). Errors
 * are MOE_ERR_INPUT naming the file (and the tensor) for a malformed file. */
moe_status moe_st_open(moe_st_file *f, const char *path, moe_err *err);
/* Validates an in-memory image (copied); `name` is used as the file name in errors. */
moe_status moe_st_open_memory(moe_st_file *f, const void *buf, size_t n, const char *name,
                              moe_err *err);
void moe_st_close(moe_st_file *f);

const moe_st_tensor *moe_st_find(const moe_st_file *f, const char *name);
/* Value of a __metadata__ key, NULL when absent. */
const char *moe_st_meta(const moe_st_file *f, const char *key);

/* Finds `name` and checks its shape (ndim dims); a missing tensor or another shape is a
 * MOE_ERR_INPUT naming the file, the tensor, and both shapes. */
moe_status moe_st_expect(const moe_st_file *f, const char *name, int ndim, const int64_t *shape,
                         const moe_st_tensor **out, moe_err *err);
/* Copies tensor t converted to f32 into out [t->numel] (moe/dtype.h rules): every dtype;
 * F8 values are decoded as stored (any block scales are separate tensors). */
moe_status moe_st_read_f32(const moe_st_file *f, const moe_st_tensor *t, float *out, moe_err *err);

/* ---- writer ---- */

typedef struct moe_st_entry {
    char *name;
    moe_st_dtype dtype; /* dtype written */
    int ndim;
    int64_t shape[MOE_ST_MAX_DIMS];
    const void *data; /* borrowed until moe_st_writer_write returns */
    int from_f32;     /* data is f32 and is converted to dtype while writing */
} moe_st_entry;

typedef struct moe_st_writer {
    int n, cap;
    moe_st_entry *entries;
    int n_meta;
    char **meta_keys, **meta_values;
} moe_st_writer;

void moe_st_writer_init(moe_st_writer *w);
/* Adds a tensor whose bytes (little-endian, dtype) are `data` [shape]; the data is not
 * copied. Duplicate names are refused at write time. */
moe_status moe_st_writer_add(moe_st_writer *w, const char *name, moe_st_dtype dtype, int ndim,
                             const int64_t *shape, const void *data, moe_err *err);
/* Adds f32 data [shape] to be stored as dtype (F32, F16, BF16; round to nearest even). */
moe_status moe_st_writer_add_f32(moe_st_writer *w, const char *name, moe_st_dtype dtype, int ndim,
                                 const int64_t *shape, const float *data, moe_err *err);
moe_status moe_st_writer_meta(moe_st_writer *w, const char *key, const char *value, moe_err *err);
/* Writes path atomically (temporary file, fsync, rename): tensors sorted by name, packed
 * back to back, header padded with spaces so the data area starts 8-byte aligned. */
moe_status moe_st_writer_write(const moe_st_writer *w, const char *path, moe_err *err);
void moe_st_writer_free(moe_st_writer *w);

#endif
