/* ckpt_tensors: the tensor part of moe_ckpt_open (moe/ckpt.h) - either layout, indexed by
 * the parameter table of the checkpoint's own config (moe/model_params.h), and
 * moe_ckpt_read_tensor. CRCs were checked before (ckpt_open.c). Validation order: layout (index or
 * single file), MANIFEST membership, the files' headers (moe_st_open), then every parameter against
 * the table of the checkpoint's own model config, then the reverse direction (stray tensors in a
 * file, stray names in the index), so that an error names the first thing a reader of the
 * directory would trip over. */
#include "ckpt/ckpt_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void moe_ckpt_model_file(int rank, int ep, char *buf, size_t n) {
    if (ep <= 1)
        snprintf(buf, n, "model.safetensors");
    else
        snprintf(buf, n, "model-ep%05d-of-%05d.safetensors", rank, ep);
}

void moe_ckpt_optim_file(int rank, char *buf, size_t n) {
    snprintf(buf, n, "optimizer-rank%d.safetensors", rank);
}

/* ---- lookup ---- */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const moe_ckpt_tensor *const *)a)->p->name,
                  (*(const moe_ckpt_tensor *const *)b)->p->name);
}

const moe_ckpt_tensor *moe_ckpt_find(const moe_ckpt *c, const char *name) {
    int lo = 0, hi = c->by_name ? c->table.n_params - 1 : -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const moe_ckpt_tensor *t = c->by_name[mid];
        int r = strcmp(t->p->name, name);
        if (r == 0) return t;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

moe_status moe_ckpt_read_tensor(const moe_ckpt *c, const char *name, moe_ckpt_slot slot, int ndim,
                                const int64_t *shape, float *out, moe_err *err) {
    const moe_ckpt_tensor *t = moe_ckpt_find(c, name);
    const moe_st_tensor *st = !t                         ? NULL
                              : slot == MOE_CKPT_WEIGHT  ? t->w
                              : slot == MOE_CKPT_EXP_AVG ? t->exp_avg
                                                         : t->exp_avg_sq;
    const moe_st_file *f = t && slot == MOE_CKPT_WEIGHT ? t->file : t ? t->ofile : NULL;
    if (t && slot != MOE_CKPT_WEIGHT && c->weights_only) {
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= shape[d];
        if (ndim != t->p->ndim || numel != t->p->numel)
            return moe_err_set(err, MOE_ERR_INPUT, c->model[0].path,
                               "tensor '%s' has another shape in this checkpoint", name);
        memset(out, 0, (size_t)numel * sizeof(float));
        return MOE_OK;
    }
    if (!st || !f) {
        moe_err_set(err, MOE_ERR_INPUT, c->ep && c->model ? c->model[0].path : NULL,
                    "the checkpoint has no %s of tensor '%s'",
                    slot == MOE_CKPT_WEIGHT ? "weights" : "optimizer state", name);
        moe_err_hint(err, "the checkpoint was written for another model configuration");
        return MOE_ERR_INPUT;
    }
    const moe_st_tensor *checked;
    moe_status s = moe_st_expect(f, st->name, ndim, shape, &checked, err);
    return s == MOE_OK ? moe_st_read_f32(f, checked, out, err) : s;
}

/* ---- opening ---- */

static void close_files(moe_st_file *files, int n) {
    for (int i = 0; files && i < n; i++)
        if (files[i].path) moe_st_close(&files[i]);
    free(files);
}

void moe_ckpt_tensors_close(moe_ckpt *c) {
    close_files(c->model, c->ep);
    close_files(c->optim, c->ep);
    free(c->t);
    free(c->by_name);
    moe_param_table_free(&c->table);
    c->model = c->optim = NULL;
    c->t = NULL;
    c->by_name = NULL;
    c->ep = c->weights_only = 0;
}

static const char HINT_DAMAGED[] =
    "the checkpoint directory was changed after it was written; use an older checkpoint or "
    "rewrite it with moe-convert reshard/consolidate from an intact copy";

moe_status moe_ckpt_damaged(moe_err *err, const char *file, const char *fmt, ...) {
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moe_err_set(err, MOE_ERR_INPUT, file, "%s", msg);
    moe_err_hint(err, "%s", HINT_DAMAGED);
    return MOE_ERR_INPUT;
}

/* Checks that `name` is listed in MANIFEST, then opens dir/name into *f. */
static moe_status open_listed(const moe_ckpt *c, const char *name, moe_st_file *f, moe_err *err) {
    const char *dir = c->dir;
    char path[MOE_CKPT_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return moe_err_set(err, MOE_ERR_INPUT, dir, "path too long");
    if (!moe_ckpt_lists(c, name))
        return moe_ckpt_damaged(err, path, "%s is not listed in the checkpoint's MANIFEST", name);
    moe_status st = moe_st_open(f, path, err);
    if (st != MOE_OK) moe_err_hint(err, "%s", HINT_DAMAGED);
    return st;
}

/* moe_ep and total_size may be JSON integers or decimal strings; -1 when neither. */
static int64_t json_count(json_t *v) {
    if (json_is_integer(v)) return json_integer_value(v);
    if (!json_is_string(v)) return -1;
    const char *s = json_string_value(v);
    char *end;
    long long x = strtoll(s, &end, 10);
    return *s && !*end && x >= 0 ? (int64_t)x : -1;
}

/* Reads the index: *ep from metadata.moe_ep, *total from metadata.total_size (-1 when
 * absent), *map borrowed from *root (json_decref(*root) when done). */
static moe_status read_index(const char *path, json_t **root, json_t **map, int *ep, int64_t *total,
                             moe_err *err) {
    json_error_t jerr;
    *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root) {
        moe_err_set(err, MOE_ERR_INPUT, path, "invalid index JSON: %s", jerr.text);
        moe_err_at_line(err, jerr.line, jerr.column);
        moe_err_hint(err, "%s", HINT_DAMAGED);
        return MOE_ERR_INPUT;
    }
    json_t *meta = json_object_get(*root, "metadata");
    *map = json_object_get(*root, "weight_map");
    int64_t e = json_count(json_object_get(meta, "moe_ep"));
    *total = json_count(json_object_get(meta, "total_size"));
    if (!json_is_object(*root) || !json_is_object(meta) || !json_is_object(*map) || e < 1 ||
        e > 65536) {
        moe_ckpt_damaged(err, path,
                         "expected {\"metadata\": {\"total_size\": BYTES, \"moe_ep\": N}, "
                         "\"weight_map\": {tensor: file}} with N >= 1");
        json_decref(*root);
        *root = NULL;
        return MOE_ERR_INPUT;
    }
    *ep = (int)e;
    return MOE_OK;
}

/* Every tensor of file f must be one of rank's parameters (name.exp_avg/.exp_avg_sq in an
 * optimizer file); names the first that is not. Called when f holds more tensors than
 * rank owns, after every owned one was found. */
static moe_status check_no_strays(const moe_ckpt *c, const moe_st_file *f, int rank, int optimizer,
                                  moe_err *err) {
    for (int i = 0; i < f->n_tensors; i++) {
        char name[200];
        snprintf(name, sizeof name, "%s", f->tensors[i].name);
        if (optimizer) { /* strip .exp_avg / .exp_avg_sq */
            char *dot = strrchr(name, '.');
            if (dot && (!strcmp(dot, ".exp_avg") || !strcmp(dot, ".exp_avg_sq")))
                *dot = '\0';
            else
                name[0] = '\0';
        }
        const moe_ckpt_tensor *t = moe_ckpt_find(c, name);
        if (!t)
            return moe_ckpt_damaged(err, f->path,
                                    "tensor '%s' is not a parameter of the checkpoint's model",
                                    f->tensors[i].name);
        if (t->rank != rank)
            return moe_ckpt_damaged(err, f->path,
                                    "tensor '%s' belongs to EP rank %d's file, not rank %d's "
                                    "(it is in the checkpoint twice)",
                                    f->tensors[i].name, t->rank, rank);
    }
    return MOE_OK;
}

static moe_status check_f32(const moe_st_file *f, const moe_st_tensor *t, moe_err *err) {
    if (t->dtype == MOE_ST_F32) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, f->path,
                "tensor '%s' is %s; checkpoints hold F32 master weights and moments", t->name,
                moe_st_dtype_name(t->dtype));
    moe_err_hint(err, "import other dtypes with moe-convert from-hf");
    return MOE_ERR_INPUT;
}

/* Finds and checks the optimizer moments of every parameter. A checkpoint whose MANIFEST
 * lists no optimizer file at all is weights-only (moe-convert from-hf): moments read as 0. */
static moe_status open_optimizer(moe_ckpt *c, const int *counts, moe_err *err) {
    const char *dir = c->dir;
    int listed = 0;
    for (int r = 0; r < c->ep; r++) {
        char name[64];
        moe_ckpt_optim_file(r, name, sizeof name);
        listed += moe_ckpt_lists(c, name);
    }
    if (listed == 0) {
        c->weights_only = 1;
        return MOE_OK;
    }
    c->optim = calloc((size_t)c->ep, sizeof *c->optim);
    if (!c->optim) return moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
    for (int r = 0; r < c->ep; r++) {
        char name[64];
        moe_ckpt_optim_file(r, name, sizeof name);
        moe_status st = open_listed(c, name, &c->optim[r], err);
        if (st != MOE_OK) return st;
    }
    for (int i = 0; i < c->table.n_params; i++) {
        moe_ckpt_tensor *t = &c->t[i];
        const moe_st_file *f = &c->optim[t->rank];
        char name[200];
        snprintf(name, sizeof name, "%s.exp_avg", t->p->name);
        moe_status st = moe_st_expect(f, name, t->p->ndim, t->p->shape, &t->exp_avg, err);
        if (st == MOE_OK) st = check_f32(f, t->exp_avg, err);
        snprintf(name, sizeof name, "%s.exp_avg_sq", t->p->name);
        if (st == MOE_OK) st = moe_st_expect(f, name, t->p->ndim, t->p->shape, &t->exp_avg_sq, err);
        if (st == MOE_OK) st = check_f32(f, t->exp_avg_sq, err);
        if (st != MOE_OK) return st;
        t->ofile = f;
    }
    for (int r = 0; r < c->ep; r++) {
        if (c->optim[r].n_tensors == 2 * counts[r]) continue;
        moe_status st = check_no_strays(c, &c->optim[r], r, 1, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* The index's entry for every parameter names its rank's file; no other names; the total. */
static moe_status check_index(const moe_ckpt *c, const char *path, json_t *map, int64_t total,
                              moe_err *err) {
    int64_t bytes = 0;
    for (int i = 0; i < c->table.n_params; i++) {
        const moe_ckpt_tensor *t = &c->t[i];
        const char *file = json_string_value(json_object_get(map, t->p->name));
        char want[64];
        moe_ckpt_model_file(t->rank, c->ep, want, sizeof want);
        if (!file)
            return moe_ckpt_damaged(err, path, "the weight_map has no file for tensor '%s'",
                                    t->p->name);
        if (strcmp(file, want) != 0)
            return moe_ckpt_damaged(
                err, path, "the weight_map puts tensor '%s' in %s; EP rank %d owns it: expected %s",
                t->p->name, file, t->rank, want);
        bytes += (int64_t)(t->w->end - t->w->begin);
    }
    if ((int)json_object_size(map) != c->table.n_params) {
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            if (!moe_ckpt_find(c, key))
                return moe_ckpt_damaged(
                    err, path,
                    "the weight_map names tensor '%s', which is not a parameter of "
                    "the checkpoint's model",
                    key);
        }
    }
    if (total >= 0 && total != bytes) {
        return moe_ckpt_damaged(
            err, path, "metadata.total_size is %" PRId64 " but the tensors hold %" PRId64 " bytes",
            total, bytes);
    }
    return MOE_OK;
}

/* Picks the layout: *ep from the index, or 1 for a lone model.safetensors. */
static moe_status detect_layout(const char *dir, const moe_config *ck, json_t **index, json_t **map,
                                int *ep, int64_t *total, char *ipath, size_t n, moe_err *err) {
    struct stat sb;
    char single[MOE_CKPT_PATH_MAX + 32];
    snprintf(ipath, n, "%s/%s", dir, MOE_CKPT_INDEX_FILE);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    int has_index = stat(ipath, &sb) == 0, has_single = stat(single, &sb) == 0;
    *index = *map = NULL;
    *ep = 1;
    *total = -1;
    if (has_index && has_single)
        return moe_ckpt_damaged(err, dir,
                                "holds both model.safetensors and %s: which layout is it?",
                                MOE_CKPT_INDEX_FILE);
    if (!has_index && !has_single) {
        moe_err_set(err, MOE_ERR_INPUT, dir, "no model.safetensors and no %s", MOE_CKPT_INDEX_FILE);
        moe_err_hint(err, "pass a checkpoint directory written by moe-train or moe-convert");
        return MOE_ERR_INPUT;
    }
    if (has_index) {
        moe_status st = read_index(ipath, index, map, ep, total, err);
        if (st != MOE_OK) return st;
    }
    if (ck->parallel.ep != *ep) {
        moe_err_set(err, MOE_ERR_INPUT, has_index ? ipath : single,
                    "config.yaml says parallel.ep=%lld but the tensor files are laid out for "
                    "ep=%d",
                    (long long)ck->parallel.ep, *ep);
        moe_err_hint(err, "config.yaml and the tensor files must agree; rewrite both with "
                          "moe-convert reshard --ep N or consolidate");
        return MOE_ERR_INPUT;
    }
    if (ck->model.num_local_experts % *ep)
        return moe_ckpt_damaged(err, ipath,
                                "moe_ep=%d does not divide model.num_local_experts (%lld)", *ep,
                                (long long)ck->model.num_local_experts);
    return MOE_OK;
}

moe_status moe_ckpt_tensors_open(moe_ckpt *c, int with_optimizer, moe_err *err) {
    const moe_config *ck = &c->cfg;
    const char *ckpt_dir = c->dir;
    char ipath[MOE_CKPT_PATH_MAX + 32];
    json_t *index, *map;
    int ep;
    int64_t total;
    moe_status st =
        detect_layout(ckpt_dir, ck, &index, &map, &ep, &total, ipath, sizeof ipath, err);
    if (st != MOE_OK) {
        json_decref(index); /* NULL, or an index whose ep does not fit */
        return st;
    }
    st = moe_param_table_build(&c->table, &ck->model, 0, ck->model.num_local_experts, err);
    if (st != MOE_OK) {
        json_decref(index);
        return st;
    }
    int n = c->table.n_params, *counts = calloc((size_t)ep, sizeof *counts);
    c->ep = ep;
    c->model = calloc((size_t)ep, sizeof *c->model);
    c->t = calloc((size_t)n, sizeof *c->t);
    c->by_name = calloc((size_t)n, sizeof *c->by_name);
    if (!counts || !c->model || !c->t || !c->by_name)
        st = moe_err_set(err, MOE_ERR_RUNTIME, ckpt_dir, "out of memory");
    if (st == MOE_OK && index && !moe_ckpt_lists(c, MOE_CKPT_INDEX_FILE))
        st = moe_ckpt_damaged(err, ipath, "%s is not listed in the checkpoint's MANIFEST",
                              MOE_CKPT_INDEX_FILE);
    if (st == MOE_OK) {
        for (int i = 0; i < n; i++) {
            c->t[i].p = &c->table.params[i];
            c->t[i].rank = moe_param_rank(c->t[i].p, ck->model.num_local_experts, ep);
            counts[c->t[i].rank]++;
            c->by_name[i] = &c->t[i];
        }
        qsort(c->by_name, (size_t)n, sizeof *c->by_name, cmp_by_name);
    }
    for (int r = 0; st == MOE_OK && r < ep; r++) {
        char name[64];
        moe_ckpt_model_file(r, ep, name, sizeof name);
        st = open_listed(c, name, &c->model[r], err);
    }
    for (int i = 0; st == MOE_OK && i < n; i++) {
        moe_ckpt_tensor *t = &c->t[i];
        const moe_st_file *f = &c->model[t->rank];
        st = moe_st_expect(f, t->p->name, t->p->ndim, t->p->shape, &t->w, err);
        if (st == MOE_OK) st = check_f32(f, t->w, err);
        t->file = f;
    }
    for (int r = 0; st == MOE_OK && r < ep; r++)
        if (c->model[r].n_tensors != counts[r]) st = check_no_strays(c, &c->model[r], r, 0, err);
    if (st == MOE_OK && index) st = check_index(c, ipath, map, total, err);
    if (st == MOE_OK && with_optimizer) st = open_optimizer(c, counts, err);
    json_decref(index);
    free(counts);
    if (st != MOE_OK) moe_ckpt_tensors_close(c);
    return st;
}
