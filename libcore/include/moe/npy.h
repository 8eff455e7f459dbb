/* npy: NumPy .npy files (format version 1.0) of float32 or float16 matrices.
 *
 * moe-embed writes its embeddings as .npy so that `numpy.load` reads them with no extra
 * package. Layout: magic "\x93NUMPY", version 1.0, a little-endian uint16 header length,
 * an ASCII Python dict {'descr': '<f4', 'fortran_order': False, 'shape': (n, c), } padded
 * with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes, then
 * the elements in C order. The one thing to know: the writer streams rows whose number is
 * only known at the end, so it reserves a fixed 128-byte header and rewrites it (same
 * length) at commit; the file appears under its final name only then (moe_outfile), and a
 * writer to "-" (stdout, not seekable) is refused. */
#ifndef MOE_NPY_H
#define MOE_NPY_H

#include <stdint.h>

#include "moe/err.h"
#include "moe/fileio.h"

typedef enum moe_npy_dtype {
    MOE_NPY_F32 = 0, /* '<f4' */
    MOE_NPY_F16 = 1, /* '<f2', round to nearest even (moe/dtype.h) */
} moe_npy_dtype;

#define MOE_NPY_HEADER_BYTES 128 /* magic + version + length + dict, data offset */

typedef struct moe_npy_writer {
    moe_outfile out;
    moe_npy_dtype dtype;
    int64_t cols; /* row length (second dimension); 0 writes a 1-D array of rows values */
    int64_t rows; /* rows appended so far */
    void *buf;    /* f16 conversion scratch */
    int64_t buf_cap;
} moe_npy_writer;

/* Opens path (a file, not "-") for a [rows, cols] matrix (cols 0: 1-D [rows]). */
moe_status moe_npy_writer_open(moe_npy_writer *w, const char *path, moe_npy_dtype dtype,
                               int64_t cols, moe_err *err);
/* Appends n rows: data [n, cols] f32 (converted when the file is f16). */
moe_status moe_npy_writer_append(moe_npy_writer *w, const float *data, int64_t n, moe_err *err);
/* Writes the final shape into the header, fsyncs and renames into place; frees the writer
 * whatever the outcome. */
moe_status moe_npy_writer_commit(moe_npy_writer *w, moe_err *err);
/* Removes the temporary file and frees the writer. */
void moe_npy_writer_abort(moe_npy_writer *w);

/* The header (exactly MOE_NPY_HEADER_BYTES bytes) of an array of `ndim` (1 or 2) dims. */
void moe_npy_format_header(char *out, moe_npy_dtype dtype, int ndim, const int64_t *shape);

/* Reads a 1-D or 2-D '<f4' or '<f2' C-order .npy file (any version 1.0 header length,
 * as numpy.save writes it) into *data (malloc'ed f32, [shape[0] * shape[1]]). The header
 * is parsed strictly; a mismatch names the file and what was expected. */
moe_status moe_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[2],
                            moe_npy_dtype *dtype, moe_err *err);

#endif
