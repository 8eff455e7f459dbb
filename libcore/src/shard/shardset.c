/* shardset: what `--data PATH` means - one .mtok file, a directory of them, the
 * manifest.json moe-tokenize writes beside directory output, or "-" (a shard on stdin) -
 * and the validation companions (*.val.mtok) of each.
 *
 * The one thing to know: every shard of a set must carry the same tokenizer (vocabulary
 * hash); the first shard's spec is the set's spec. Shards are ordered by file name (or by
 * manifest order), so a set always reads in the same order. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/shard.h"

struct moe_shardset {
    moe_shard **shards;
    int64_t n;
    int64_t n_tokens, n_docs;
};

void moe_shardset_close(moe_shardset *set) {
    if (!set) return;
    for (int64_t i = 0; i < set->n; i++)
        moe_shard_close(set->shards[i]);
    free(set->shards);
    free(set);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void free_list(char **list, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

static int push(char ***list, int64_t *n, const char *a, const char *b) {
    char **nl = realloc(*list, (size_t)(*n + 1) * sizeof *nl);
    if (!nl) return -1;
    *list = nl;
    size_t len = strlen(a) + strlen(b) + 2;
    if (!(nl[*n] = malloc(len))) return -1;
    snprintf(nl[*n], len, "%s%s%s", a, a[0] && !ends_with(a, "/") ? "/" : "", b);
    (*n)++;
    return 0;
}

/* Files of dir ending in .mtok: want_val selects *.val.mtok, otherwise the others. */
static moe_status list_dir(const char *dir, int want_val, char ***out, int64_t *n, moe_err *err) {
    DIR *d = opendir(dir);
    if (!d) return moe_err_errno(err, dir, "cannot read directory");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".mtok")) continue;
        if (ends_with(e->d_name, ".val.mtok") != want_val) continue;
        if (push(out, n, dir, e->d_name) < 0) {
            closedir(d);
            return moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
        }
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return MOE_OK;
}

static int is_manifest(const char *path) {
    if (ends_with(path, ".json")) return 1;
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    int c = fgetc(fp);
    fclose(fp);
    return c == '{';
}

static moe_status list_manifest(const char *path, const char *key, char ***out, int64_t *n,
                                moe_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        moe_err_set(err, MOE_ERR_INPUT, path, "manifest is not valid JSON: %s", je.text);
        moe_err_at_line(err, je.line, je.column);
        return MOE_ERR_INPUT;
    }
    json_t *arr = json_object_get(root, key);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, "moe-token-shards") != 0 || (arr && !json_is_array(arr))) {
        json_decref(root);
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "not a moe-tokenize manifest (\"format\": \"moe-token-shards\" with a "
                    "\"%s\" array expected)",
                    key);
        return MOE_ERR_INPUT;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    size_t i;
    json_t *v;
    moe_status st = MOE_OK;
    json_array_foreach(arr, i, v) {
        const char *p = json_string_value(json_object_get(v, "path"));
        if (!p || strchr(p, '/')) {
            st = moe_err_set(err, MOE_ERR_INPUT, path,
                             "manifest entry %zu of \"%s\" has no plain file name \"path\"", i + 1,
                             key);
            break;
        }
        if (push(out, n, dir, p) < 0) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
            break;
        }
    }
    json_decref(root);
    return st;
}

static moe_status open_list(moe_shardset **out, char **files, int64_t n, const char *what,
                            moe_err *err) {
    moe_shardset *set = calloc(1, sizeof *set);
    if (!set || !(set->shards = calloc((size_t)(n ? n : 1), sizeof *set->shards))) {
        free(set);
        return moe_err_set(err, MOE_ERR_RUNTIME, what, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) {
        if (moe_shard_open(&set->shards[i], files[i], err) != MOE_OK) {
            moe_shardset_close(set);
            return err->status;
        }
        set->n++;
        if (moe_shard_vocab_hash(set->shards[i]) != moe_shard_vocab_hash(set->shards[0])) {
            moe_err_set(err, MOE_ERR_INPUT, files[i],
                        "this shard's tokenizer differs from the one of %s",
                        moe_shard_path(set->shards[0]));
            moe_err_hint(err, "all shards of one training set must be tokenized alike");
            moe_shardset_close(set);
            return MOE_ERR_INPUT;
        }
        set->n_tokens += moe_shard_n_tokens(set->shards[i]);
        set->n_docs += moe_shard_n_docs(set->shards[i]);
    }
    *out = set;
    return MOE_OK;
}

static moe_status open_any(moe_shardset **out, const char *path, int val, moe_err *err) {
    *out = NULL;
    if (strcmp(path, "-") == 0) {
        if (val) return MOE_OK;
        moe_shardset *set = calloc(1, sizeof *set);
        if (!set || !(set->shards = calloc(1, sizeof *set->shards))) {
            free(set);
            return moe_err_set(err, MOE_ERR_RUNTIME, "-", "out of memory");
        }
        if (moe_shard_open_stream(&set->shards[0], stdin, "-", err) != MOE_OK) {
            moe_shardset_close(set);
            return err->status;
        }
        set->n = 1;
        set->n_tokens = moe_shard_n_tokens(set->shards[0]);
        set->n_docs = moe_shard_n_docs(set->shards[0]);
        *out = set;
        return MOE_OK;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        moe_err_set(err, MOE_ERR_INPUT, path, "no such shard file, directory or manifest");
        return MOE_ERR_INPUT;
    }
    char **files = NULL;
    int64_t n = 0;
    moe_status s = MOE_OK;
    if (S_ISDIR(st.st_mode))
        s = list_dir(path, val, &files, &n, err);
    else if (is_manifest(path))
        s = list_manifest(path, val ? "val_shards" : "shards", &files, &n, err);
    else if (!val)
        s = push(&files, &n, "", path) < 0
                ? moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory")
                : MOE_OK;
    else if (ends_with(path, ".mtok") && !ends_with(path, ".val.mtok")) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s.val.mtok", (int)(strlen(path) - 5), path);
        struct stat vs;
        if (stat(buf, &vs) == 0 && push(&files, &n, "", buf) < 0)
            s = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    if (s == MOE_OK && n == 0 && !val) {
        moe_err_set(err, MOE_ERR_INPUT, path, "no token shards (*.mtok) found");
        moe_err_hint(err, "make them with moe-tokenize");
        s = MOE_ERR_INPUT;
    }
    if (s == MOE_OK && n > 0) s = open_list(out, files, n, path, err);
    free_list(files, n);
    return s;
}

moe_status moe_shardset_open(moe_shardset **out, const char *path, moe_err *err) {
    return open_any(out, path, 0, err);
}

moe_status moe_shardset_open_val(moe_shardset **out, const char *path, moe_err *err) {
    return open_any(out, path, 1, err);
}

int64_t moe_shardset_n_shards(const moe_shardset *set) {
    return set->n;
}
const moe_shard *moe_shardset_shard(const moe_shardset *set, int64_t i) {
    return set->shards[i];
}
int64_t moe_shardset_n_tokens(const moe_shardset *set) {
    return set->n_tokens;
}
int64_t moe_shardset_n_docs(const moe_shardset *set) {
    return set->n_docs;
}
const char *moe_shardset_spec_json(const moe_shardset *set) {
    return moe_shard_spec_json(set->shards[0]);
}
const moe_tokenizer *moe_shardset_tokenizer(const moe_shardset *set) {
    return moe_shard_tokenizer(set->shards[0]);
}
