/* ckpt_open: opening a checkpoint for reading (moe/ckpt.h) - the path resolved, MANIFEST
 * read and parsed once and every file it lists verified, config.yaml, tokenizer.json and
 * (on request) trainer_state.json loaded, then the tensors indexed (ckpt_tensors.c).
 * The parts are checked in the order of moe_ckpt_part, so an error names the first thing a
 * reader of the directory would trip over; with MOE_CKPT_REPORT each part's failure is kept
 * in part_err and the rest is still opened (what moe-convert inspect prints). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/version.h"

/* One MANIFEST line "<size> <crc32 hex> <name>": the offset of the name, 0 when malformed. */
static int manifest_line(const char *p, unsigned long long *size, unsigned int *crc) {
    int name_at = 0;
    if (sscanf(p, "%llu %8x %n", size, crc, &name_at) != 2 || name_at == 0 || !p[name_at] ||
        strchr(p + name_at, '/'))
        return 0;
    return name_at;
}

/* Frees n MANIFEST entries and the array. */
static void free_entries(moe_ckpt_entry *e, int n) {
    for (int i = 0; e && i < n; i++)
        free(e[i].name);
    free(e);
}

/* The first line of a version-2 MANIFEST: *files and *crc from it; 0 when it is not exactly
 * what moe_ckpt_manifest_header writes. */
static int manifest_header(const char *p, int *files, uint32_t *crc) {
    unsigned int x;
    size_t m = strlen(MOE_CKPT_MANIFEST_MAGIC);
    if (strncmp(p, MOE_CKPT_MANIFEST_MAGIC, m) != 0 ||
        sscanf(p + m, " %d files, CRC32 %8x", files, &x) != 2 || *files < 0)
        return 0;
    char again[160];
    moe_ckpt_manifest_header(again, sizeof again, *files, (uint32_t)x);
    *crc = (uint32_t)x;
    return strcmp(again, p) == 0;
}

/* Files every checkpoint lists, whoever wrote it (moe-train, from-hf, reshard): a MANIFEST
 * without one was cut short or edited. (A cut of an older MANIFEST, which has no first
 * line to check, always loses trainer_state.json: its lines are sorted by name.) */
static moe_status check_needed(const moe_ckpt *c, const char *path, moe_err *err) {
    static const char *const needed[] = {"config.yaml", "tokenizer.json", "trainer_state.json"};
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++)
        if (!moe_ckpt_lists(c, needed[i]))
            return moe_ckpt_damaged(err, path,
                                    "MANIFEST does not list %s, which every checkpoint has: it was "
                                    "cut short or edited",
                                    needed[i]);
    if (!moe_ckpt_lists(c, "model.safetensors") && !moe_ckpt_lists(c, MOE_CKPT_INDEX_FILE))
        return moe_ckpt_damaged(err, path,
                                "MANIFEST lists neither model.safetensors nor %s: it was cut "
                                "short or edited",
                                MOE_CKPT_INDEX_FILE);
    return MOE_OK;
}

moe_status moe_ckpt_manifest_parse(moe_ckpt *c, char *text, size_t len, const char *path,
                                   moe_err *err) {
    moe_status st = MOE_OK;
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    int has_head = 0, head_files = 0;
    uint32_t head_crc = 0, body_crc = 0;
    const char *nul = memchr(text, '\0', len);
    if (nul) { /* zeros from a crash or a bad disk; the line parsing below would stop there */
        int64_t at = 1;
        for (const char *q = text; q < nul; q++)
            at += *q == '\n';
        st = moe_ckpt_damaged(err, path, "MANIFEST holds a NUL byte (offset %zu)",
                              (size_t)(nul - text));
        moe_err_at_line(err, at, 0);
    } else if (len && text[len - 1] != '\n') {
        size_t from = len;
        while (from > 0 && text[from - 1] != '\n')
            from--;
        st = moe_ckpt_damaged(
            err, path, "MANIFEST is cut short: its last line \"%.80s\" does not end", text + from);
        moe_err_at_line(err, lines + 1, 0);
    } else if (len && text[0] == '#') {
        char *nl = strchr(text, '\n');
        *nl = '\0';
        if (!manifest_header(text, &head_files, &head_crc)) {
            st = moe_ckpt_damaged(err, path,
                                  "expected \"%s N files, CRC32 X of the lines below\", got "
                                  "\"%.80s\"",
                                  MOE_CKPT_MANIFEST_MAGIC, text);
            moe_err_at_line(err, 1, 0);
        }
        *nl = '\n';
        has_head = 1;
        body_crc = moe_crc32(0, nl + 1, len - (size_t)(nl + 1 - text));
    }
    int cap = 0;
    int64_t line = 0;
    for (char *p = text, *nl; st == MOE_OK && *p; p = nl ? nl + 1 : p + strlen(p)) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        if (!*p || (has_head && line == 1)) continue;
        unsigned long long size;
        unsigned int crc;
        int at = manifest_line(p, &size, &crc);
        if (!at) {
            st = moe_err_set(err, MOE_ERR_INPUT, path,
                             "expected \"<size> <crc32 hex> <file name>\", got \"%.80s\"", p);
            moe_err_at_line(err, line, 0);
            moe_err_hint(err, "the checkpoint is corrupted; use an older checkpoint");
            break;
        }
        if (c->n_files == cap) {
            cap = cap ? 2 * cap : 16;
            moe_ckpt_entry *ne = realloc(c->files, (size_t)cap * sizeof *ne);
            if (!ne) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
                break;
            }
            c->files = ne;
        }
        moe_ckpt_entry *e = &c->files[c->n_files];
        e->size = size;
        e->crc = crc;
        if (!(e->name = strdup(p + at))) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
            break;
        }
        c->n_files++;
    }
    if (st == MOE_OK && has_head && (head_files != c->n_files || head_crc != body_crc)) {
        st = moe_ckpt_damaged(err, path,
                              "MANIFEST does not match its first line (%d files, CRC32 %08" PRIx32
                              "): the lines below hold %d files, CRC32 %08" PRIx32
                              "; it was cut short or edited",
                              head_files, head_crc, c->n_files, body_crc);
        moe_err_at_line(err, 1, 0);
    }
    if (st == MOE_OK && c->n_files == 0) {
        st = moe_err_set(err, MOE_ERR_INPUT, path, "MANIFEST lists no files");
        moe_err_hint(err, "the checkpoint is corrupted; use an older checkpoint");
    }
    if (st == MOE_OK) st = check_needed(c, path, err);
    return st;
}

/* MANIFEST at path into c->files (moe_ckpt_manifest_parse). */
static moe_status read_manifest(moe_ckpt *c, const char *path, moe_err *err) {
    char *text;
    size_t len;
    moe_status st = moe_read_file(path, &text, &len, err);
    if (st != MOE_OK) return st;
    st = moe_ckpt_manifest_parse(c, text, len, path, err);
    free(text);
    return st;
}

/* Size (and CRC32 unless size_only) of a file, as moe_crc32_file reports them. */
static moe_status file_size_crc(const char *path, int size_only, uint32_t *crc, uint64_t *size,
                                moe_err *err) {
    if (!size_only) return moe_crc32_file(path, crc, size, err);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return moe_err_set(err, MOE_ERR_INPUT, path, "%s", strerror(errno ? errno : ENOENT));
    *size = (uint64_t)sb.st_size;
    return MOE_OK;
}

/* Every file MANIFEST lists: present, same size, same CRC32 (size only for optimizer files
 * when skip_optim_crc). */
static moe_status verify_files(const moe_ckpt *c, int skip_optim_crc, moe_err *err) {
    for (int i = 0; i < c->n_files; i++) {
        const moe_ckpt_entry *e = &c->files[i];
        char fpath[MOE_CKPT_PATH_MAX];
        if (snprintf(fpath, sizeof fpath, "%s/%s", c->dir, e->name) >= (int)sizeof fpath)
            return moe_err_set(err, MOE_ERR_INPUT, c->dir, "path too long");
        moe_err sub;
        moe_err_clear(&sub);
        int size_only = skip_optim_crc && strncmp(e->name, "optimizer-", 10) == 0;
        uint32_t got_crc = e->crc;
        uint64_t got_size;
        moe_status st = MOE_OK;
        if (file_size_crc(fpath, size_only, &got_crc, &got_size, &sub) != MOE_OK) {
            st = moe_err_set(err, MOE_ERR_INPUT, fpath,
                             "checkpoint file listed in MANIFEST cannot be read: %s", sub.msg);
        } else if (got_size != e->size) {
            st = moe_err_set(err, MOE_ERR_INPUT, fpath,
                             "checkpoint file is corrupted: size %" PRIu64
                             " bytes, MANIFEST says %" PRIu64,
                             got_size, e->size);
        } else if (got_crc != e->crc) {
            st = moe_err_set(err, MOE_ERR_INPUT, fpath,
                             "checkpoint file is corrupted: CRC32 %08" PRIx32
                             ", MANIFEST says %08" PRIx32,
                             got_crc, e->crc);
        }
        if (st != MOE_OK) {
            moe_err_hint(err, "resume from an older checkpoint (--resume RUN/ckpt-<step>)");
            return st;
        }
    }
    return MOE_OK;
}

int moe_ckpt_lists(const moe_ckpt *c, const char *name) {
    for (int i = 0; i < c->n_files; i++)
        if (strcmp(c->files[i].name, name) == 0) return 1;
    return 0;
}

/* c->cfg from the checkpoint's config.yaml. */
static moe_status load_config(moe_ckpt *c, moe_err *err) {
    char path[MOE_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.yaml", c->dir);
    return moe_config_load(&c->cfg, path, 0, NULL, err);
}

/* c->tokenizer_json and c->tok from tokenizer.json; with the config (have_cfg), also that
 * the tokenizer fits model.vocab_size. */
static moe_status load_tokenizer(moe_ckpt *c, int have_cfg, moe_err *err) {
    char path[MOE_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/tokenizer.json", c->dir);
    size_t len;
    moe_status st = moe_read_file(path, &c->tokenizer_json, &len, err);
    if (st == MOE_OK) st = moe_tokenizer_from_json(&c->tok, c->tokenizer_json, path, err);
    if (st == MOE_OK && have_cfg && c->tok->vocab_size > c->cfg.model.vocab_size) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "tokenizer '%s' has %" PRId64 " tokens but the model's vocab_size is %" PRId64,
                    c->tok->name, c->tok->vocab_size, c->cfg.model.vocab_size);
        moe_err_hint(err, "the checkpoint's tokenizer.json does not belong to its model");
        st = MOE_ERR_INPUT;
    }
    return st;
}

/* c->state from trainer_state.json. */
static moe_status load_state(moe_ckpt *c, moe_err *err) {
    char path[MOE_CKPT_PATH_MAX + 24], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/trainer_state.json", c->dir);
    moe_status st = moe_read_file(path, &text, &len, err);
    if (st != MOE_OK) return st;
    st = moe_ckpt_state_parse(text, path, &c->state, err);
    free(text);
    return st;
}

/* Records the outcome of part p: strict opens stop at the first failure (copied to *err),
 * reports keep it in part_err and go on. Returns whether to go on. */
static int part_done(moe_ckpt *c, moe_ckpt_part p, moe_status st, const moe_err *sub,
                     unsigned flags, moe_err *err) {
    if (st == MOE_OK) return 1;
    c->part_err[p] = *sub;
    if (flags & MOE_CKPT_REPORT) return 1;
    *err = *sub;
    return 0;
}

moe_status moe_ckpt_open(moe_ckpt *c, const char *path, unsigned flags, moe_err *err) {
    memset(c, 0, sizeof *c);
    for (int p = 0; p < MOE_CKPT_N_PARTS; p++)
        moe_err_clear(&c->part_err[p]);
    moe_status st = moe_ckpt_resolve(path, c->dir, sizeof c->dir, err);
    if (st != MOE_OK) return st;
    if (strcmp(c->dir, path) != 0)
        moe_log_info("using the latest checkpoint of %s: %s", path, c->dir);
    char man[MOE_CKPT_PATH_MAX + 16];
    snprintf(man, sizeof man, "%s/MANIFEST", c->dir);
    moe_err sub;
    moe_err_clear(&sub);
    if (access(man, F_OK) != 0) { /* e.g. RUN/latest naming a removed checkpoint */
        st = moe_err_set(&sub, MOE_ERR_INPUT, c->dir,
                         "not a complete checkpoint directory (no MANIFEST)");
        moe_err_hint(&sub, "give a ckpt-<step> directory written by moe-train, or use an "
                           "older checkpoint");
    }
    if (st == MOE_OK) st = read_manifest(c, man, &sub);
    if (st == MOE_OK) st = verify_files(c, (flags & MOE_CKPT_SKIP_OPTIMIZER_CRC) != 0, &sub);
    int go = part_done(c, MOE_CKPT_PART_MANIFEST, st, &sub, flags, err);
    int have_cfg = 0;
    if (go) {
        moe_err_clear(&sub);
        st = load_config(c, &sub);
        have_cfg = st == MOE_OK;
        go = part_done(c, MOE_CKPT_PART_CONFIG, st, &sub, flags, err);
    }
    if (go) {
        moe_err_clear(&sub);
        st = load_tokenizer(c, have_cfg, &sub);
        go = part_done(c, MOE_CKPT_PART_TOKENIZER, st, &sub, flags, err);
    }
    if (go && (flags & MOE_CKPT_TRAINER_STATE)) {
        moe_err_clear(&sub);
        st = load_state(c, &sub);
        go = part_done(c, MOE_CKPT_PART_STATE, st, &sub, flags, err);
    }
    if (go && have_cfg) {
        moe_err_clear(&sub);
        st = moe_ckpt_tensors_open(c, (flags & MOE_CKPT_OPTIMIZER) != 0, &sub);
        go = part_done(c, MOE_CKPT_PART_TENSORS, st, &sub, flags, err);
    }
    if (!go) {
        moe_ckpt_close(c);
        return err->status;
    }
    return MOE_OK;
}

void moe_ckpt_close(moe_ckpt *c) {
    moe_ckpt_tensors_close(c);
    free_entries(c->files, c->n_files);
    c->files = NULL;
    c->n_files = 0;
    moe_tokenizer_free(c->tok);
    c->tok = NULL;
    free(c->tokenizer_json);
    c->tokenizer_json = NULL;
    free(c->state.last_metrics);
    c->state.last_metrics = NULL;
}

void moe_ckpt_id(const moe_ckpt *c, char *out, size_t n) {
    char model[64];
    moe_ckpt_model_file(0, c->ep, model, sizeof model);
    uint32_t crc = 0;
    for (int i = 0; i < c->n_files; i++)
        if (strcmp(c->files[i].name, model) == 0) crc = c->files[i].crc;
    int64_t step = moe_ckpt_step_of(c->dir); /* a resharded copy: its trainer state's, if read */
    if (step < 0) step = c->state.step;
    snprintf(out, n, "%s step %" PRId64 " model-crc32 %08" PRIx32, c->dir, step, crc);
}

void moe_ckpt_provenance(const moe_ckpt *c, const char *prog, const char *command, char *out,
                         size_t n) {
    char id[MOE_CKPT_PATH_MAX + 64];
    moe_ckpt_id(c, id, sizeof id);
    snprintf(out, n, "@PG\tID:%s\tPN:%s\tVN:%s%s%s\tDS:checkpoint %s", prog, prog, moe_version(),
             command ? "\tCL:" : "", command ? command : "", id);
}
