/* safetensors: see moe/safetensors.h. Validation order matters: length prefix, JSON, every
 * tensor entry, then overlap; only a file that passed all of it gets data pointers. */
#include "moe/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/dtype.h"
#include "moe/fileio.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} k_dtypes[MOE_ST_N_DTYPES] = {
    [MOE_ST_BOOL] = {"BOOL", 1},       [MOE_ST_U8] = {"U8", 1},
    [MOE_ST_I8] = {"I8", 1},           [MOE_ST_U16] = {"U16", 2},
    [MOE_ST_I16] = {"I16", 2},         [MOE_ST_F16] = {"F16", 2},
    [MOE_ST_BF16] = {"BF16", 2},       [MOE_ST_U32] = {"U32", 4},
    [MOE_ST_I32] = {"I32", 4},         [MOE_ST_F32] = {"F32", 4},
    [MOE_ST_U64] = {"U64", 8},         [MOE_ST_I64] = {"I64", 8},
    [MOE_ST_F64] = {"F64", 8},         [MOE_ST_F8_E4M3] = {"F8_E4M3", 1},
    [MOE_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *moe_st_dtype_name(moe_st_dtype d) {
    return (unsigned)d < MOE_ST_N_DTYPES ? k_dtypes[d].name : "?";
}
size_t moe_st_dtype_size(moe_st_dtype d) {
    return (unsigned)d < MOE_ST_N_DTYPES ? k_dtypes[d].size : 0;
}
int moe_st_dtype_parse(const char *name) {
    for (int i = 0; i < MOE_ST_N_DTYPES; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) return i;
    return -1;
}

/* ---- reader ---- */

static void file_free_parts(moe_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->map) {
        if (f->owns_buffer)
            free(f->map);
        else
            munmap(f->map, f->map_size);
    }
    free(f->path);
    memset(f, 0, sizeof *f);
}

void moe_st_close(moe_st_file *f) {
    if (f) file_free_parts(f);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const moe_st_tensor *)a)->name, ((const moe_st_tensor *)b)->name);
}
static int cmp_tensor_begin(const void *a, const void *b) {
    const moe_st_tensor *x = *(const moe_st_tensor *const *)a,
                        *y = *(const moe_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static moe_status bad(moe_err *err, const char *path, const char *tensor, const char *what) {
    if (tensor)
        moe_err_set(err, MOE_ERR_INPUT, path, "invalid safetensors file: tensor '%s': %s", tensor,
                    what);
    else
        moe_err_set(err, MOE_ERR_INPUT, path, "invalid safetensors file: %s", what);
    moe_err_hint(err, "the file is truncated, corrupted or not a safetensors file; "
                      "re-create it or use another copy");
    return MOE_ERR_INPUT;
}

static int json_to_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Parses one tensor entry; on success fills t (name not yet set). */
static moe_status parse_tensor(const char *path, const char *name, json_t *obj, uint64_t data_size,
                               moe_st_tensor *t, moe_err *err) {
    char what[256];
    if (!json_is_object(obj)) return bad(err, path, name, "entry is not a JSON object");
    json_t *jd = json_object_get(obj, "dtype"), *js = json_object_get(obj, "shape"),
           *jo = json_object_get(obj, "data_offsets");
    if (!json_is_string(jd)) return bad(err, path, name, "missing or non-string \"dtype\"");
    int d = moe_st_dtype_parse(json_string_value(jd));
    if (d < 0) {
        snprintf(what, sizeof what,
                 "unknown dtype \"%.40s\" (expected one of F32, F16, BF16, "
                 "F64, I8..I64, U8..U64, BOOL, F8_E4M3, F8_E5M2)",
                 json_string_value(jd));
        return bad(err, path, name, what);
    }
    t->dtype = (moe_st_dtype)d;
    if (!json_is_array(js)) return bad(err, path, name, "missing or non-array \"shape\"");
    if (json_array_size(js) > MOE_ST_MAX_DIMS) {
        snprintf(what, sizeof what, "shape has %zu dimensions (at most %d supported)",
                 json_array_size(js), MOE_ST_MAX_DIMS);
        return bad(err, path, name, what);
    }
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t dim;
        if (!json_to_u64(json_array_get(js, (size_t)i), &dim))
            return bad(err, path, name, "shape entries must be non-negative integers");
        t->shape[i] = (int64_t)dim;
        if (dim && numel > UINT64_MAX / 16 / dim)
            return bad(err, path, name, "shape has too many elements");
        numel *= dim;
    }
    t->numel = (int64_t)numel;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_to_u64(json_array_get(jo, 0), &t->begin) ||
        !json_to_u64(json_array_get(jo, 1), &t->end))
        return bad(err, path, name, "\"data_offsets\" must be [begin, end] non-negative integers");
    if (t->end < t->begin) return bad(err, path, name, "data_offsets end < begin");
    uint64_t want = numel * moe_st_dtype_size(t->dtype);
    if (t->end - t->begin != want) {
        snprintf(what, sizeof what,
                 "data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                 " bytes but dtype %s and shape with %" PRIu64 " elements need %" PRIu64,
                 t->begin, t->end, t->end - t->begin, moe_st_dtype_name(t->dtype), numel, want);
        return bad(err, path, name, what);
    }
    if (t->end > data_size) {
        snprintf(what, sizeof what,
                 "data_offsets [%" PRIu64 ", %" PRIu64 "] end past the data area (%" PRIu64
                 " bytes)",
                 t->begin, t->end, data_size);
        return bad(err, path, name, what);
    }
    return MOE_OK;
}

/* Validates the image at f->map [f->map_size] and fills the tensor table. */
static moe_status parse_image(moe_st_file *f, moe_err *err) {
    const char *path = f->path;
    const uint8_t *base = f->map;
    if (f->map_size < 8) return bad(err, path, NULL, "shorter than the 8-byte header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    char what[256];
    if (hlen > MOE_ST_MAX_HEADER || hlen > f->map_size - 8) {
        snprintf(
            what, sizeof what, "header length %" PRIu64 " is larger than %s (%" PRIu64 " bytes)",
            hlen, hlen > MOE_ST_MAX_HEADER ? "the 100 MB limit" : "the rest of the file",
            hlen > MOE_ST_MAX_HEADER ? (uint64_t)MOE_ST_MAX_HEADER : (uint64_t)(f->map_size - 8));
        return bad(err, path, NULL, what);
    }
    if (hlen < 2) return bad(err, path, NULL, "header too short to be a JSON object");
    json_error_t jerr;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(what, sizeof what, "header is not valid JSON: %s (header byte %d)", jerr.text,
                 jerr.position);
        return bad(err, path, NULL, what);
    }
    moe_status st = MOE_OK;
    if (!json_is_object(root)) {
        st = bad(err, path, NULL, "header is not a JSON object");
        goto out;
    }
    f->data = base + 8 + hlen;
    f->data_size = f->map_size - 8 - hlen;
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                st = bad(err, path, NULL, "__metadata__ is not a JSON object");
                goto out;
            }
            size_t m = json_object_size(val);
            f->meta_keys = calloc(m ? m : 1, sizeof(char *));
            f->meta_values = calloc(m ? m : 1, sizeof(char *));
            if (!f->meta_keys || !f->meta_values) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
                goto out;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    snprintf(what, sizeof what, "__metadata__ value of \"%.60s\" is not a string",
                             mk);
                    st = bad(err, path, NULL, what);
                    goto out;
                }
                f->meta_keys[f->n_meta] = strdup(mk);
                f->meta_values[f->n_meta] = strdup(json_string_value(mv));
                f->n_meta++;
                if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1]) {
                    st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
                    goto out;
                }
            }
            continue;
        }
        moe_st_tensor *t = &f->tensors[f->n_tensors];
        memset(t, 0, sizeof *t);
        st = parse_tensor(path, key, val, f->data_size, t, err);
        if (st != MOE_OK) goto out;
        t->name = strdup(key);
        if (!t->name) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
            goto out;
        }
        f->n_tensors++;
    }
    /* Overlap: sort by begin; each non-empty tensor must start at or after the previous end. */
    if (f->n_tensors > 1) {
        moe_st_tensor **by = malloc((size_t)f->n_tensors * sizeof *by);
        if (!by) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
            goto out;
        }
        for (int i = 0; i < f->n_tensors; i++)
            by[i] = &f->tensors[i];
        qsort(by, (size_t)f->n_tensors, sizeof *by, cmp_tensor_begin);
        const moe_st_tensor *prev = NULL;
        for (int i = 0; i < f->n_tensors && st == MOE_OK; i++) {
            if (by[i]->begin == by[i]->end) continue;
            if (prev && by[i]->begin < prev->end) {
                snprintf(what, sizeof what,
                         "data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%.60s' [%" PRIu64
                         ", %" PRIu64 "]",
                         by[i]->begin, by[i]->end, prev->name, prev->begin, prev->end);
                st = bad(err, path, by[i]->name, what);
            }
            prev = by[i];
        }
        free(by);
        if (st != MOE_OK) goto out;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    for (int i = 0; i < f->n_tensors; i++)
        f->tensors[i].data = f->data + f->tensors[i].begin;
out:
    json_decref(root);
    return st;
}

moe_status moe_st_open(moe_st_file *f, const char *path, moe_err *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        moe_err_errno(err, path, "cannot open");
        err->status = MOE_ERR_INPUT;
        file_free_parts(f);
        return MOE_ERR_INPUT;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        moe_err_set(err, MOE_ERR_INPUT, path, "not a regular file");
        file_free_parts(f);
        return MOE_ERR_INPUT;
    }
    f->map_size = (size_t)sb.st_size;
    if (f->map_size > 0) {
        void *m = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            moe_err_errno(err, path, "cannot mmap");
            file_free_parts(f);
            return MOE_ERR_RUNTIME;
        }
        f->map = m;
    }
    close(fd);
    moe_status st = parse_image(f, err);
    if (st != MOE_OK) file_free_parts(f);
    return st;
}

moe_status moe_st_open_memory(moe_st_file *f, const void *buf, size_t n, const char *name,
                              moe_err *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(name);
    f->map = malloc(n ? n : 1);
    f->owns_buffer = 1;
    if (!f->path || !f->map) {
        file_free_parts(f);
        return moe_err_set(err, MOE_ERR_RUNTIME, name, "out of memory");
    }
    if (n) memcpy(f->map, buf, n);
    f->map_size = n;
    moe_status st = parse_image(f, err);
    if (st != MOE_OK) file_free_parts(f);
    return st;
}

const moe_st_tensor *moe_st_find(const moe_st_file *f, const char *name) {
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, f->tensors[mid].name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *moe_st_meta(const moe_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

moe_status moe_st_expect(const moe_st_file *f, const char *name, int ndim, const int64_t *shape,
                         const moe_st_tensor **out, moe_err *err) {
    const moe_st_tensor *t = moe_st_find(f, name);
    *out = NULL;
    if (!t) {
        moe_err_set(err, MOE_ERR_INPUT, f->path, "tensor '%s' is missing", name);
        moe_err_hint(err, "the file was written for another model configuration");
        return MOE_ERR_INPUT;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char a[128], b[128];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, ndim, shape);
        moe_err_set(err, MOE_ERR_INPUT, f->path, "tensor '%s' has shape %s, expected %s", name, a,
                    b);
        moe_err_hint(err, "the file was written for another model configuration");
        return MOE_ERR_INPUT;
    }
    *out = t;
    return MOE_OK;
}

moe_status moe_st_read_f32(const moe_st_file *f, const moe_st_tensor *t, float *out, moe_err *err) {
    const uint8_t *p = t->data;
    int64_t n = t->numel;
    size_t es = moe_st_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *e = p + (size_t)i * es;
        switch (t->dtype) {
        case MOE_ST_F32:
            memcpy(&out[i], e, 4);
            break;
        case MOE_ST_F64: {
            double d;
            memcpy(&d, e, 8);
            out[i] = (float)d;
            break;
        }
        case MOE_ST_F16: {
            uint16_t h;
            memcpy(&h, e, 2);
            out[i] = moe_f16_to_f32(h);
            break;
        }
        case MOE_ST_BF16: {
            uint16_t h;
            memcpy(&h, e, 2);
            out[i] = moe_bf16_to_f32(h);
            break;
        }
        case MOE_ST_BOOL:
        case MOE_ST_U8:
            out[i] = (float)e[0];
            break;
        case MOE_ST_I8:
            out[i] = (float)(int8_t)e[0];
            break;
        case MOE_ST_U16: {
            uint16_t v;
            memcpy(&v, e, 2);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_I16: {
            int16_t v;
            memcpy(&v, e, 2);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_U32: {
            uint32_t v;
            memcpy(&v, e, 4);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_I32: {
            int32_t v;
            memcpy(&v, e, 4);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_U64: {
            uint64_t v;
            memcpy(&v, e, 8);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_I64: {
            int64_t v;
            memcpy(&v, e, 8);
            out[i] = (float)v;
            break;
        }
        case MOE_ST_F8_E4M3:
            out[i] = moe_e4m3_to_f32(e[0]);
            break;
        case MOE_ST_F8_E5M2:
            out[i] = moe_e5m2_to_f32(e[0]);
            break;
        default:
            return moe_err_set(err, MOE_ERR_RUNTIME, f->path, "tensor '%s': bad dtype %d", t->name,
                               (int)t->dtype);
        }
    }
    return MOE_OK;
}

/* ---- writer ---- */

void moe_st_writer_init(moe_st_writer *w) {
    memset(w, 0, sizeof *w);
}

void moe_st_writer_free(moe_st_writer *w) {
    for (int i = 0; i < w->n; i++)
        free(w->entries[i].name);
    free(w->entries);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}

static moe_status writer_push(moe_st_writer *w, const char *name, moe_st_dtype dtype, int ndim,
                              const int64_t *shape, const void *data, int from_f32, moe_err *err) {
    if ((unsigned)dtype >= MOE_ST_N_DTYPES || ndim < 0 || ndim > MOE_ST_MAX_DIMS ||
        strcmp(name, "__metadata__") == 0 || !name[0])
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "safetensors writer: invalid tensor '%s' (dtype %d, %d dims)", name,
                           (int)dtype, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                               "safetensors writer: tensor '%s' has a negative dimension", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        moe_st_entry *e = realloc(w->entries, (size_t)cap * sizeof *e);
        if (!e) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        w->entries = e;
        w->cap = cap;
    }
    moe_st_entry *e = &w->entries[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->data = data;
    e->from_f32 = from_f32;
    w->n++;
    return MOE_OK;
}

moe_status moe_st_writer_add(moe_st_writer *w, const char *name, moe_st_dtype dtype, int ndim,
                             const int64_t *shape, const void *data, moe_err *err) {
    return writer_push(w, name, dtype, ndim, shape, data, 0, err);
}

moe_status moe_st_writer_add_f32(moe_st_writer *w, const char *name, moe_st_dtype dtype, int ndim,
                                 const int64_t *shape, const float *data, moe_err *err) {
    if (dtype != MOE_ST_F32 && dtype != MOE_ST_F16 && dtype != MOE_ST_BF16)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "safetensors writer: tensor '%s': cannot store f32 data as %s", name,
                           moe_st_dtype_name(dtype));
    return writer_push(w, name, dtype, ndim, shape, data, dtype != MOE_ST_F32, err);
}

moe_status moe_st_writer_meta(moe_st_writer *w, const char *key, const char *value, moe_err *err) {
    char **k = realloc(w->meta_keys, (size_t)(w->n_meta + 1) * sizeof *k);
    if (!k) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    w->meta_keys = k;
    char **v = realloc(w->meta_values, (size_t)(w->n_meta + 1) * sizeof *v);
    if (!v) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    w->meta_values = v;
    k[w->n_meta] = strdup(key);
    v[w->n_meta] = strdup(value);
    if (!k[w->n_meta] || !v[w->n_meta]) {
        free(k[w->n_meta]);
        free(v[w->n_meta]);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    }
    w->n_meta++;
    return MOE_OK;
}

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const moe_st_entry *const *)a)->name, (*(const moe_st_entry *const *)b)->name);
}

static int64_t entry_numel(const moe_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->shape[i];
    return n;
}

/* Writes e's payload, converting from f32 in chunks when needed. */
static moe_status write_payload(moe_outfile *out, const moe_st_entry *e, moe_err *err) {
    int64_t n = entry_numel(e);
    if (!e->from_f32)
        return moe_outfile_write(out, e->data, (size_t)n * moe_st_dtype_size(e->dtype), err);
    uint16_t buf[4096];
    const float *src = e->data;
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t m = n - i < 4096 ? n - i : 4096;
        for (int64_t j = 0; j < m; j++)
            buf[j] =
                e->dtype == MOE_ST_BF16 ? moe_f32_to_bf16(src[i + j]) : moe_f32_to_f16(src[i + j]);
        moe_status st = moe_outfile_write(out, buf, (size_t)m * 2, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

moe_status moe_st_writer_write(const moe_st_writer *w, const char *path, moe_err *err) {
    moe_status st = MOE_OK;
    const moe_st_entry **order = malloc((size_t)(w->n ? w->n : 1) * sizeof *order);
    json_t *root = json_object();
    char *text = NULL;
    if (!order || !root) {
        st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        goto out;
    }
    for (int i = 0; i < w->n; i++)
        order[i] = &w->entries[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_entry_ptr);
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const moe_st_entry *e = order[i];
        if (i > 0 && strcmp(e->name, order[i - 1]->name) == 0) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path,
                             "safetensors writer: tensor '%s' added twice", e->name);
            goto out;
        }
        uint64_t bytes = (uint64_t)entry_numel(e) * moe_st_dtype_size(e->dtype);
        json_t *shape = json_array(), *offs = json_array(), *obj = json_object();
        for (int d = 0; d < e->ndim; d++)
            json_array_append_new(shape, json_integer(e->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(obj, "dtype", json_string(moe_st_dtype_name(e->dtype)));
        json_object_set_new(obj, "shape", shape);
        json_object_set_new(obj, "data_offsets", offs);
        json_object_set_new(root, e->name, obj);
        off += bytes;
    }
    if (w->n_meta) {
        json_t *meta = json_object();
        for (int i = 0; i < w->n_meta; i++)
            json_object_set_new(meta, w->meta_keys[i], json_string(w->meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) {
        st = moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot encode the safetensors header");
        goto out;
    }
    size_t tlen = strlen(text), hlen = (tlen + 7) / 8 * 8; /* 8 + hlen is a multiple of 8 */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    moe_outfile out;
    st = moe_outfile_open(&out, path, err);
    if (st != MOE_OK) goto out;
    st = moe_outfile_write(&out, len8, 8, err);
    if (st == MOE_OK) st = moe_outfile_write(&out, text, tlen, err);
    if (st == MOE_OK) st = moe_outfile_write(&out, "       ", hlen - tlen, err);
    for (int i = 0; st == MOE_OK && i < w->n; i++)
        st = write_payload(&out, order[i], err);
    if (st == MOE_OK)
        st = moe_outfile_commit(&out, err);
    else
        moe_outfile_abort(&out);
out:
    free(text);
    json_decref(root);
    free(order);
    return st;
}
