/* ckpt_write: writing checkpoint directories and finding them in a run directory
 * (moe/ckpt.h). Ordering is what makes it crash-safe: files fsynced, MANIFEST last, rename,
 * fsync the parent, and only then `latest` and pruning. */
#include "ckpt/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "moe/fileio.h"

void moe_ckpt_dir_name(int64_t step, char *buf, size_t n) {
    snprintf(buf, n, "ckpt-%08" PRId64, step);
}

int64_t moe_ckpt_step_of(const char *ckpt_dir) {
    size_t len = strlen(ckpt_dir);
    while (len > 1 && ckpt_dir[len - 1] == '/')
        len--;
    size_t b = len;
    while (b > 0 && ckpt_dir[b - 1] != '/')
        b--;
    const char *base = ckpt_dir + b;
    size_t blen = len - b;
    if (blen < 6 || strncmp(base, "ckpt-", 5) != 0) return -1;
    int64_t step = 0;
    for (size_t i = 5; i < blen; i++) {
        if (base[i] < '0' || base[i] > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (base[i] - '0');
    }
    return step;
}

/* out = a "/" b; 0 when it does not fit. */
static int join(char *out, size_t n, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la + 1 + lb + 1 > n) return 0;
    memmove(out, a, la);
    out[la] = '/';
    memcpy(out + la + 1, b, lb + 1);
    return 1;
}

moe_status moe_ckpt_begin(moe_ckpt_writer *w, const char *run_dir, int64_t step, moe_err *err) {
    memset(w, 0, sizeof *w);
    char name[64];
    moe_ckpt_dir_name(step, name, sizeof name);
    char tmpname[80];
    snprintf(tmpname, sizeof tmpname, ".%s.tmp", name);
    if (snprintf(w->run_dir, sizeof w->run_dir, "%s", run_dir) >= (int)sizeof w->run_dir ||
        !join(w->tmp_dir, sizeof w->tmp_dir, run_dir, tmpname) ||
        !join(w->final_dir, sizeof w->final_dir, run_dir, name))
        return moe_err_set(err, MOE_ERR_INPUT, run_dir, "run directory path too long");
    w->step = step;
    moe_status st = moe_mkdirs(run_dir, err);
    if (st != MOE_OK) {
        moe_err_hint(err, "choose a writable run directory with -o");
        return st;
    }
    st = moe_remove_tree(w->tmp_dir, err);
    if (st != MOE_OK) return st;
    if (mkdir(w->tmp_dir, 0777) != 0) {
        moe_err_errno(err, run_dir, "cannot create a checkpoint directory in the run directory");
        err->status = MOE_ERR_INPUT;
        moe_err_hint(err, "choose a writable run directory with -o");
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

const char *moe_ckpt_path(const moe_ckpt_writer *w, const char *name, char *buf, size_t n) {
    return join(buf, n, w->tmp_dir, name) ? buf : NULL;
}

void moe_ckpt_abort(moe_ckpt_writer *w) {
    moe_err ignored;
    moe_err_clear(&ignored);
    if (w->tmp_dir[0]) moe_remove_tree(w->tmp_dir, &ignored);
    w->tmp_dir[0] = '\0';
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Regular files in dir except MANIFEST, sorted; *names malloc'ed array of strdup'ed names. */
static moe_status list_files(const char *dir, char ***names, int *n, moe_err *err) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return moe_err_errno(err, dir, "cannot open directory");
    int cap = 0;
    moe_status st = MOE_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "MANIFEST") == 0) continue;
        char path[MOE_CKPT_PATH_MAX];
        struct stat sb;
        if (!join(path, sizeof path, dir, e->d_name) || stat(path, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
                break;
            }
            *names = nn;
        }
        (*names)[*n] = strdup(e->d_name);
        if (!(*names)[*n]) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (*n > 1) qsort(*names, (size_t)*n, sizeof **names, cmp_str);
    return st;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static moe_status fsync_file(const char *path, moe_err *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moe_err_errno(err, path, "cannot open for fsync");
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? MOE_OK : moe_err_errno(err, path, "fsync failed");
}

void moe_ckpt_manifest_header(char *buf, size_t n, int files, uint32_t crc) {
    snprintf(buf, n, "%s %d files, CRC32 %08" PRIx32 " of the lines below", MOE_CKPT_MANIFEST_MAGIC,
             files, crc);
}

moe_status moe_ckpt_write_manifest(const char *dir, moe_err *err) {
    char **names;
    int n;
    moe_status st = list_files(dir, &names, &n, err);
    char path[MOE_CKPT_PATH_MAX];
    char *body = NULL; /* the file lines, "<size> <crc32 hex> <name>\n" each */
    size_t body_len = 0;
    FILE *mem = st == MOE_OK ? open_memstream(&body, &body_len) : NULL;
    if (st == MOE_OK && !mem) st = moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
    if (st == MOE_OK && !join(path, sizeof path, dir, "MANIFEST"))
        st = moe_err_set(err, MOE_ERR_INPUT, dir, "path too long");
    for (int i = 0; st == MOE_OK && i < n; i++) {
        char fpath[MOE_CKPT_PATH_MAX];
        uint32_t crc;
        uint64_t size;
        join(fpath, sizeof fpath, dir, names[i]);
        st = fsync_file(fpath, err);
        if (st == MOE_OK) st = moe_crc32_file(fpath, &crc, &size, err);
        if (st == MOE_OK) fprintf(mem, "%" PRIu64 " %08" PRIx32 " %s\n", size, crc, names[i]);
    }
    if (mem && fclose(mem) != 0 && st == MOE_OK)
        st = moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
    moe_outfile out;
    if (st == MOE_OK) st = moe_outfile_open(&out, path, err);
    if (st == MOE_OK) {
        char head[160];
        moe_ckpt_manifest_header(head, sizeof head, n, moe_crc32(0, body, body_len));
        st = moe_outfile_write(&out, head, strlen(head), err);
        if (st == MOE_OK) st = moe_outfile_write(&out, "\n", 1, err);
        if (st == MOE_OK) st = moe_outfile_write(&out, body, body_len, err);
        if (st == MOE_OK)
            st = moe_outfile_commit(&out, err);
        else
            moe_outfile_abort(&out);
    }
    free(body);
    free_names(names, n);
    return st;
}

moe_status moe_ckpt_list(const char *run_dir, int64_t **steps, int *n, moe_err *err) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR
                   ? MOE_OK
                   : moe_err_errno(err, run_dir, "cannot open directory");
    int cap = 0;
    moe_status st = MOE_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = moe_ckpt_step_of(e->d_name);
        char man[MOE_CKPT_PATH_MAX];
        if (s < 0 ||
            snprintf(man, sizeof man, "%s/%s/MANIFEST", run_dir, e->d_name) >= (int)sizeof man ||
            access(man, F_OK) != 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
            if (!ns) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, run_dir, "out of memory");
                break;
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return st;
}

moe_status moe_ckpt_commit(moe_ckpt_writer *w, int64_t keep, moe_err *err) {
    moe_status st = moe_ckpt_write_manifest(w->tmp_dir, err);
    if (st == MOE_OK) st = moe_fsync_dir(w->tmp_dir, err);
    if (st == MOE_OK && access(w->final_dir, F_OK) == 0) st = moe_remove_tree(w->final_dir, err);
    if (st == MOE_OK && rename(w->tmp_dir, w->final_dir) != 0)
        st = moe_err_errno(err, w->final_dir, "cannot rename the checkpoint into place");
    if (st != MOE_OK) {
        moe_ckpt_abort(w);
        return st;
    }
    w->tmp_dir[0] = '\0';
    st = moe_fsync_dir(w->run_dir, err);
    if (st != MOE_OK) return st;

    char latest[MOE_CKPT_PATH_MAX], name[64];
    moe_ckpt_dir_name(w->step, name, sizeof name);
    if (!join(latest, sizeof latest, w->run_dir, "latest"))
        return moe_err_set(err, MOE_ERR_INPUT, w->run_dir, "path too long");
    moe_outfile out;
    st = moe_outfile_open(&out, latest, err);
    if (st != MOE_OK) return st;
    if (fprintf(out.fp, "%s\n", name) < 0) {
        moe_outfile_abort(&out);
        return moe_err_errno(err, latest, "write failed");
    }
    st = moe_outfile_commit(&out, err);
    if (st == MOE_OK) st = moe_fsync_dir(w->run_dir, err);
    if (st != MOE_OK || keep <= 0) return st;

    int64_t *steps;
    int n;
    st = moe_ckpt_list(w->run_dir, &steps, &n, err);
    for (int i = 0; st == MOE_OK && i < n - keep; i++) {
        if (steps[i] == w->step) continue;
        char old[MOE_CKPT_PATH_MAX], oname[64];
        moe_ckpt_dir_name(steps[i], oname, sizeof oname);
        join(old, sizeof old, w->run_dir, oname);
        st = moe_remove_tree(old, err);
    }
    free(steps);
    return st;
}

moe_status moe_ckpt_latest(const char *run_dir, char *out, size_t n, int *found, moe_err *err) {
    *found = 0;
    char path[MOE_CKPT_PATH_MAX];
    if (!join(path, sizeof path, run_dir, "latest"))
        return moe_err_set(err, MOE_ERR_INPUT, run_dir, "path too long");
    if (access(path, F_OK) == 0) {
        char *text;
        size_t len;
        moe_status st = moe_read_file(path, &text, &len, err);
        if (st != MOE_OK) return st;
        while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
            text[--len] = '\0';
        if (moe_ckpt_step_of(text) < 0 || strchr(text, '/')) {
            moe_err_set(err, MOE_ERR_INPUT, path,
                        "expected a name like ckpt-00000100, got \"%.60s\"", text);
            moe_err_hint(err, "delete the file to fall back to the newest checkpoint directory");
            free(text);
            return MOE_ERR_INPUT;
        }
        int ok = join(out, n, run_dir, text);
        free(text);
        if (!ok) return moe_err_set(err, MOE_ERR_INPUT, run_dir, "path too long");
        *found = 1;
        return MOE_OK;
    }
    int64_t *steps;
    int cnt;
    moe_status st = moe_ckpt_list(run_dir, &steps, &cnt, err);
    if (st == MOE_OK && cnt > 0) {
        char name[64];
        moe_ckpt_dir_name(steps[cnt - 1], name, sizeof name);
        if (!join(out, n, run_dir, name))
            st = moe_err_set(err, MOE_ERR_INPUT, run_dir, "path too long");
        else
            *found = 1;
    }
    free(steps);
    return st;
}

moe_status moe_ckpt_resolve(const char *path, char *out, size_t n, moe_err *err) {
    struct stat sb;
    char man[MOE_CKPT_PATH_MAX];
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        moe_err_set(err, MOE_ERR_INPUT, path, "no such checkpoint directory");
        moe_err_hint(err, "pass a checkpoint (RUN/ckpt-00000100) or a run directory written "
                          "by moe-train");
        return MOE_ERR_INPUT;
    }
    if (join(man, sizeof man, path, "MANIFEST") && access(man, F_OK) == 0) {
        if (snprintf(out, n, "%s", path) >= (int)n)
            return moe_err_set(err, MOE_ERR_INPUT, path, "path too long");
        return MOE_OK;
    }
    int found = 0;
    moe_status st = moe_ckpt_latest(path, out, n, &found, err);
    if (st != MOE_OK) return st;
    if (!found) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "not a checkpoint (no MANIFEST) and not a run directory with one");
        moe_err_hint(err, "pass a ckpt-<step> directory written by moe-train or "
                          "moe-convert from-hf");
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

moe_status moe_ckpt_write_index(const char *dir, const moe_param_table *t, int ep, moe_err *err) {
    json_t *o = json_object(), *meta = json_object(), *map = json_object();
    int64_t total = 0, E = t->e1 - t->e0;
    for (int i = 0; i < t->n_params; i++) {
        char file[64];
        moe_ckpt_model_file(moe_param_rank(&t->params[i], E, ep), ep, file, sizeof file);
        json_object_set_new(map, t->params[i].name, json_string(file));
        total += t->params[i].numel * (int64_t)sizeof(float);
    }
    json_object_set_new(meta, "total_size", json_integer(total));
    json_object_set_new(meta, "moe_ep", json_integer(ep));
    json_object_set_new(o, "metadata", meta);
    json_object_set_new(o, "weight_map", map);
    char path[MOE_CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, MOE_CKPT_INDEX_FILE);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot encode JSON");
    moe_status st = moe_write_text_file(path, text, "\n", err);
    free(text);
    return st;
}
