/* npy: .npy (format 1.0) writer with a fixed, rewritable header, and a strict reader.
 *
 * See moe/npy.h for the layout. The writer's header is always MOE_NPY_HEADER_BYTES long
 * so that the row count, unknown while rows stream in, can be patched in place at commit.
 * The reader accepts what numpy.save writes (keys in any order, 1.0 headers of any
 * length) and nothing else: no pickles, no Fortran order, no big-endian data. */
#include "moe/npy.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/dtype.h"

static const char MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

void moe_npy_format_header(char *out, moe_npy_dtype dtype, int ndim, const int64_t *shape) {
    char dict[MOE_NPY_HEADER_BYTES];
    char dims[64];
    if (ndim == 1)
        snprintf(dims, sizeof dims, "(%" PRId64 ",)", shape[0]);
    else
        snprintf(dims, sizeof dims, "(%" PRId64 ", %" PRId64 ")", shape[0], shape[1]);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     dtype == MOE_NPY_F16 ? "<f2" : "<f4", dims);
    size_t hlen = MOE_NPY_HEADER_BYTES - 10;
    memcpy(out, MAGIC, 6);
    out[6] = 1;
    out[7] = 0;
    out[8] = (char)(hlen & 0xff);
    out[9] = (char)(hlen >> 8);
    memset(out + 10, ' ', hlen);
    memcpy(out + 10, dict, (size_t)n); /* n <= 118 - 1: two 19-digit dims fit */
    out[MOE_NPY_HEADER_BYTES - 1] = '\n';
}

moe_status moe_npy_writer_open(moe_npy_writer *w, const char *path, moe_npy_dtype dtype,
                               int64_t cols, moe_err *err) {
    memset(w, 0, sizeof *w);
    if (strcmp(path, "-") == 0) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "a .npy file cannot be written to stdout");
        moe_err_hint(err, "name an output file (-o emb.npy), or leave -o out for TSV text");
        return MOE_ERR_INPUT;
    }
    w->dtype = dtype;
    w->cols = cols;
    struct stat sb; /* checked before opening: opening a FIFO waits for its reader */
    if (stat(path, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "a .npy needs a seekable output (its header is rewritten at the end)");
        moe_err_hint(err, "write to a file, or leave -o out for TSV text on stdout");
        return MOE_ERR_INPUT;
    }
    moe_status st = moe_outfile_open(&w->out, path, err);
    if (st != MOE_OK) return st;
    char hdr[MOE_NPY_HEADER_BYTES];
    int64_t shape[2] = {0, cols};
    moe_npy_format_header(hdr, dtype, cols ? 2 : 1, shape);
    st = moe_outfile_write(&w->out, hdr, sizeof hdr, err);
    if (st != MOE_OK) moe_npy_writer_abort(w);
    return st;
}

moe_status moe_npy_writer_append(moe_npy_writer *w, const float *data, int64_t n, moe_err *err) {
    int64_t count = n * (w->cols ? w->cols : 1);
    if (w->dtype == MOE_NPY_F32) {
        moe_status st = moe_outfile_write(&w->out, data, (size_t)count * sizeof(float), err);
        if (st == MOE_OK) w->rows += n;
        return st;
    }
    if (count > w->buf_cap) {
        void *nb = realloc(w->buf, (size_t)count * sizeof(uint16_t));
        if (!nb) return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory");
        w->buf = nb;
        w->buf_cap = count;
    }
    uint16_t *h = w->buf;
    for (int64_t i = 0; i < count; i++)
        h[i] = moe_f32_to_f16(data[i]);
    moe_status st = moe_outfile_write(&w->out, h, (size_t)count * sizeof(uint16_t), err);
    if (st == MOE_OK) w->rows += n;
    return st;
}

moe_status moe_npy_writer_commit(moe_npy_writer *w, moe_err *err) {
    char hdr[MOE_NPY_HEADER_BYTES];
    int64_t shape[2] = {w->rows, w->cols};
    moe_npy_format_header(hdr, w->dtype, w->cols ? 2 : 1, shape);
    moe_status st = MOE_OK;
    if (fflush(w->out.fp) != 0 || fseek(w->out.fp, 0, SEEK_SET) != 0 ||
        fwrite(hdr, 1, sizeof hdr, w->out.fp) != sizeof hdr || fseek(w->out.fp, 0, SEEK_END) != 0)
        st = moe_err_errno(err, w->out.path, "cannot rewrite the .npy header");
    if (st == MOE_OK)
        st = moe_outfile_commit(&w->out, err);
    else
        moe_outfile_abort(&w->out);
    free(w->buf);
    w->buf = NULL;
    return st;
}

void moe_npy_writer_abort(moe_npy_writer *w) {
    if (w->out.fp) moe_outfile_abort(&w->out);
    free(w->buf);
    w->buf = NULL;
}

/* ---- reader ---- */

typedef struct hdr_parser {
    const char *p, *end;
} hdr_parser;

static void skip_ws(hdr_parser *h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n'))
        h->p++;
}

static int accept(hdr_parser *h, const char *s) {
    skip_ws(h);
    size_t n = strlen(s);
    if ((size_t)(h->end - h->p) < n || memcmp(h->p, s, n) != 0) return 0;
    h->p += n;
    return 1;
}

/* A quoted Python string into out (no escapes: numpy never writes any in these keys). */
static int parse_str(hdr_parser *h, char *out, size_t cap) {
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return 0;
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        if (n + 1 >= cap) return 0;
        out[n++] = *h->p++;
    }
    if (h->p >= h->end) return 0;
    h->p++;
    out[n] = 0;
    return 1;
}

static int parse_int(hdr_parser *h, int64_t *v) {
    skip_ws(h);
    int64_t x = 0;
    int digits = 0;
    while (h->p < h->end && *h->p >= '0' && *h->p <= '9' && digits < 18) {
        x = x * 10 + (*h->p++ - '0');
        digits++;
    }
    *v = x;
    return digits > 0 && !(h->p < h->end && *h->p >= '0' && *h->p <= '9');
}

static moe_status bad_header(moe_err *err, const char *path, const char *what) {
    moe_err_set(err, MOE_ERR_INPUT, path, "not a supported .npy file: %s", what);
    moe_err_hint(err, "expected a 1-D or 2-D float32/float16 C-order array (numpy.save)");
    return MOE_ERR_INPUT;
}

/* Parses the dict; fills dtype, ndim, shape. */
static moe_status parse_dict(const char *path, const char *s, size_t n, moe_npy_dtype *dtype,
                             int *ndim, int64_t shape[2], moe_err *err) {
    hdr_parser h = {s, s + n};
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!accept(&h, "{")) return bad_header(err, path, "the header is not a dict");
    while (!accept(&h, "}")) {
        char key[32];
        if (!parse_str(&h, key, sizeof key) || !accept(&h, ":"))
            return bad_header(err, path, "malformed header dict");
        if (strcmp(key, "descr") == 0) {
            char d[16];
            if (!parse_str(&h, d, sizeof d)) return bad_header(err, path, "malformed 'descr'");
            if (strcmp(d, "<f4") == 0)
                *dtype = MOE_NPY_F32;
            else if (strcmp(d, "<f2") == 0)
                *dtype = MOE_NPY_F16;
            else
                return bad_header(err, path, "dtype is not '<f4' or '<f2'");
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (accept(&h, "True")) return bad_header(err, path, "Fortran order");
            if (!accept(&h, "False")) return bad_header(err, path, "malformed 'fortran_order'");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!accept(&h, "(")) return bad_header(err, path, "malformed 'shape'");
            *ndim = 0;
            while (!accept(&h, ")")) {
                if (*ndim == 2 || !parse_int(&h, &shape[*ndim]))
                    return bad_header(err, path, "shape is not 1-D or 2-D");
                (*ndim)++;
                if (!accept(&h, ",") && !(skip_ws(&h), h.p < h.end && *h.p == ')'))
                    return bad_header(err, path, "malformed 'shape'");
            }
            if (*ndim == 0) return bad_header(err, path, "0-D array");
            have_shape = 1;
        } else {
            return bad_header(err, path, "unknown key in the header");
        }
        if (!accept(&h, ",") && !(skip_ws(&h), h.p < h.end && *h.p == '}'))
            return bad_header(err, path, "malformed header dict");
    }
    if (!have_descr || !have_order || !have_shape)
        return bad_header(err, path, "the header lacks descr, fortran_order or shape");
    if (*ndim == 1) shape[1] = 1;
    return MOE_OK;
}

moe_status moe_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[2],
                            moe_npy_dtype *dtype, moe_err *err) {
    *data = NULL;
    char *buf;
    size_t len;
    moe_status st = moe_read_file(path, &buf, &len, err);
    if (st != MOE_OK) return st;
    if (len < 10 || memcmp(buf, MAGIC, 6) != 0) {
        free(buf);
        return bad_header(err, path, "no \\x93NUMPY magic");
    }
    if (buf[6] != 1 || buf[7] != 0) {
        free(buf);
        return bad_header(err, path, "format version is not 1.0");
    }
    size_t hlen = (size_t)(uint8_t)buf[8] | (size_t)(uint8_t)buf[9] << 8;
    if (10 + hlen > len) {
        free(buf);
        return bad_header(err, path, "the header runs past the end of the file");
    }
    st = parse_dict(path, buf + 10, hlen, dtype, ndim, shape, err);
    size_t esize = *dtype == MOE_NPY_F16 ? 2 : 4;
    if (st == MOE_OK && (shape[1] != 0 && shape[0] > (int64_t)(len / esize) / shape[1]))
        st = bad_header(err, path, "the shape needs more data than the file holds");
    int64_t count = shape[0] * shape[1];
    if (st == MOE_OK && (size_t)count * esize != len - 10 - hlen)
        st = bad_header(err, path, "the data size does not match the shape");
    if (st == MOE_OK) {
        float *out = malloc((size_t)(count ? count : 1) * sizeof(float));
        if (!out) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        } else {
            const unsigned char *src = (const unsigned char *)buf + 10 + hlen;
            for (int64_t i = 0; i < count; i++) {
                if (esize == 2) {
                    uint16_t v = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
                    out[i] = moe_f16_to_f32(v);
                } else {
                    uint32_t v = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                                 (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
                    out[i] = moe_f32_from_bits(v);
                }
            }
            *data = out;
        }
    }
    free(buf);
    return st;
}
