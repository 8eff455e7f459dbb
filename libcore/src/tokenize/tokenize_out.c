/* tokenize_out: the output side of moe-tokenize - document buffers (tokenize_impl.h) into
 * train and validation shards: FILE.mtok (+ FILE.val.mtok), "-", or DIR/ with shards rolled
 * over at document boundaries after --shard-tokens and a manifest.json.
 *
 * The one thing to know: every file this run committed is remembered, and removed again
 * when the run fails later, so a failed run leaves nothing under a final name. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/fileio.h"
#include "moe/log.h"
#include "tokenize/tokenize_impl.h"

/* One output stream (train or val): the current writer and the files committed so far. */
typedef struct stream {
    const char *kind; /* "train" / "val" */
    moe_shard_writer *w;
    char **done; /* committed paths */
    int64_t *done_tokens, *done_docs;
    int n_done;
    int64_t tokens, docs;
} stream;

struct tok_out {
    const moe_tokenize_opts *o;
    const moe_tokenizer *tok;
    int dir_mode, width, with_val;
    int count_bases;  /* progress in bases read (else in tokens written) */
    moe_dirlock lock; /* DIR/.lock in dir_mode, for the run's life */
    char dir[4096];
    char file[4096], val_file[4096];
    stream train, val;
    moe_tokenize_summary sum;
    moe_progress prog;
};
typedef struct tok_out ctx;

static moe_status stream_path(ctx *c, stream *s, char *buf, size_t n) {
    int is_val = s == &c->val;
    if (c->dir_mode)
        snprintf(buf, n, "%s/shard-%05d%s", c->dir, s->n_done, is_val ? ".val.mtok" : ".mtok");
    else
        snprintf(buf, n, "%s", is_val ? c->val_file : c->file);
    return MOE_OK;
}

static moe_status stream_open(ctx *c, stream *s, moe_err *err) {
    char path[4200];
    stream_path(c, s, path, sizeof path);
    return moe_shard_writer_open(&s->w, path, c->tok, err);
}

static moe_status stream_commit(ctx *c, stream *s, moe_err *err) {
    if (!s->w) return MOE_OK;
    char path[4200];
    stream_path(c, s, path, sizeof path);
    int64_t t = moe_shard_writer_n_tokens(s->w), d = moe_shard_writer_n_docs(s->w);
    moe_shard_writer *w = s->w;
    s->w = NULL;
    if (moe_shard_writer_commit(w, err) != MOE_OK) return err->status;
    char **nd = realloc(s->done, (size_t)(s->n_done + 1) * sizeof *nd);
    if (nd) s->done = nd;
    int64_t *nt = nd ? realloc(s->done_tokens, (size_t)(s->n_done + 1) * sizeof *nt) : NULL;
    if (nt) s->done_tokens = nt;
    int64_t *ndc = nt ? realloc(s->done_docs, (size_t)(s->n_done + 1) * sizeof *ndc) : NULL;
    if (ndc) s->done_docs = ndc;
    char *p = ndc ? strdup(path) : NULL;
    if (!p) {
        if (strcmp(path, "-") != 0) unlink(path);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    s->done[s->n_done] = p;
    s->done_tokens[s->n_done] = t;
    s->done_docs[s->n_done] = d;
    s->n_done++;
    c->sum.shards++;
    return MOE_OK;
}

static void stream_cleanup(stream *s, int remove_files) {
    if (s->w) moe_shard_writer_abort(s->w);
    s->w = NULL;
    for (int i = 0; i < s->n_done; i++) {
        if (remove_files && strcmp(s->done[i], "-") != 0) unlink(s->done[i]);
        free(s->done[i]);
    }
    free(s->done);
    free(s->done_tokens);
    free(s->done_docs);
}

/* The stream a document goes to, opening its writer if needed. */
static stream *doc_stream(ctx *c, int is_val, moe_err *err) {
    stream *s = is_val ? &c->val : &c->train;
    if (!s->w && stream_open(c, s, err) != MOE_OK) return NULL;
    return s;
}

/* Ends a document of s and rolls the shard over. */
static moe_status end_doc(ctx *c, stream *s, const tok_docbuf *b, const tok_doc *d, moe_err *err) {
    moe_shard_doc doc = {0};
    doc.name = b->names + d->name_off;
    doc.source = c->o->inputs[d->input];
    doc.src_start = d->src_start;
    doc.src_end = d->src_end;
    doc.strand = d->strand;
    if (moe_shard_writer_end_doc(s->w, &doc, err) != MOE_OK) return err->status;
    s->tokens += d->n_tokens;
    s->docs++;
    if (d->is_val) {
        c->sum.val_docs++;
        c->sum.val_tokens += d->n_tokens;
    }
    c->sum.docs++;
    c->sum.tokens += d->n_tokens;
    if (c->dir_mode && c->o->shard_tokens > 0 &&
        moe_shard_writer_n_tokens(s->w) >= c->o->shard_tokens)
        return stream_commit(c, s, err);
    return MOE_OK;
}

moe_status tok_out_write(tok_out *c, tok_docbuf *b, moe_err *err) {
    int64_t at = 0; /* first token of the next document in b->packed */
    for (int64_t i = 0; i <= b->n_docs; i++) {
        int last = i == b->n_docs;
        if (last && !b->open) break;
        const tok_doc *d = last ? NULL : &b->docs[i];
        /* tokens of this document in b: all of them, less those an earlier call wrote */
        int64_t n = (last ? b->open_tokens : d->n_tokens) - (i == 0 ? b->carry : 0);
        stream *s = doc_stream(c, last ? b->open_val : d->is_val, err);
        if (!s || moe_shard_writer_append_packed(s->w, b->packed + at * c->width,
                                                 b->lower ? b->lower + at : NULL, n, err) != MOE_OK)
            return err->status;
        at += n;
        if (!last && end_doc(c, s, b, d, err) != MOE_OK) return err->status;
    }
    b->carry = b->open ? b->open_tokens : 0;
    c->sum.records += b->records;
    c->sum.bases += b->bases;
    c->sum.filtered += b->filtered;
    c->sum.empty += b->empty;
    moe_progress_update(&c->prog, c->count_bases ? c->sum.bases : c->sum.tokens, NULL);
    moe_status st = b->status;
    if (st != MOE_OK) *err = b->err;
    tok_docbuf_reset(b);
    return st;
}

static moe_status write_manifest(ctx *c, moe_err *err) {
    json_error_t je;
    json_t *spec = json_loads(moe_tokenizer_spec_json(c->tok), 0, &je);
    json_t *root = json_pack("{s:s, s:i, s:o, s:[], s:[], s:{s:I, s:I, s:I, s:I}}", "format",
                             "moe-token-shards", "version", 1, "tokenizer", spec, "shards",
                             "val_shards", "totals", "tokens", (json_int_t)c->train.tokens, "docs",
                             (json_int_t)c->train.docs, "val_tokens", (json_int_t)c->val.tokens,
                             "val_docs", (json_int_t)c->val.docs);
    if (!root) return moe_err_set(err, MOE_ERR_RUNTIME, c->dir, "cannot build manifest JSON");
    stream *ss[2] = {&c->train, &c->val};
    const char *keys[2] = {"shards", "val_shards"};
    for (int k = 0; k < 2; k++) {
        json_t *arr = json_object_get(root, keys[k]);
        for (int i = 0; i < ss[k]->n_done; i++) {
            const char *base = strrchr(ss[k]->done[i], '/');
            json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "path",
                                                 base ? base + 1 : ss[k]->done[i], "tokens",
                                                 (json_int_t)ss[k]->done_tokens[i], "docs",
                                                 (json_int_t)ss[k]->done_docs[i]));
        }
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return moe_err_set(err, MOE_ERR_RUNTIME, c->dir, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", c->dir);
    moe_status st = moe_write_text_file(path, text, "\n", err);
    free(text);
    return st;
}

static moe_status setup_output(ctx *c, moe_err *err) {
    const moe_tokenize_opts *o = c->o;
    const char *out = o->output ? o->output : "-";
    struct stat st;
    size_t n = strlen(out);
    c->dir_mode = (n > 1 && out[n - 1] == '/') || (stat(out, &st) == 0 && S_ISDIR(st.st_mode));
    if (strcmp(out, "-") == 0 && c->with_val) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "--val-fraction needs -o FILE.mtok or -o DIR/");
        moe_err_hint(err, "stdout carries one shard; validation shards need a file name");
        return MOE_ERR_INPUT;
    }
    if (o->shard_tokens > 0 && !c->dir_mode) {
        moe_err_set(err, MOE_ERR_INPUT, out, "--shard-tokens needs a directory output");
        moe_err_hint(err, "end the -o argument with '/' to write shard-00000.mtok, ... there");
        return MOE_ERR_INPUT;
    }
    if (c->dir_mode) {
        snprintf(c->dir, sizeof c->dir, "%.*s", (int)(out[n - 1] == '/' && n > 1 ? n - 1 : n), out);
        if (moe_mkdirs(c->dir, err) != MOE_OK) return err->status;
        if (moe_dirlock_take(&c->lock, c->dir, "moe-tokenize", err) != MOE_OK) return err->status;
        /* shards of an earlier run would mix with ours when the directory is read */
        DIR *d = opendir(c->dir);
        struct dirent *e;
        int stale = 0;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, "manifest.json") == 0 ||
                (strncmp(e->d_name, "shard-", 6) == 0 && strstr(e->d_name, ".mtok")))
                stale = 1;
        if (d) closedir(d);
        if (stale) {
            moe_err_set(err, MOE_ERR_INPUT, c->dir, "output directory already holds token shards");
            moe_err_hint(err,
                         "remove them (rm %s/shard-*.mtok %s/manifest.json) or choose another "
                         "directory",
                         c->dir, c->dir);
            return MOE_ERR_INPUT;
        }
        return MOE_OK;
    }
    snprintf(c->file, sizeof c->file, "%s", out);
    size_t base = n > 5 && strcmp(out + n - 5, ".mtok") == 0 ? n - 5 : n;
    snprintf(c->val_file, sizeof c->val_file, "%.*s.val.mtok", (int)base, out);
    return MOE_OK;
}

moe_status tok_out_open(tok_out **out, const moe_tokenize_opts *o, const moe_tokenizer *tok,
                        int with_val, const char *unit, moe_err *err) {
    ctx *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    c->lock.fd = -1;
    c->o = o;
    c->tok = tok;
    c->width = moe_shard_pack_width(tok);
    c->with_val = with_val;
    c->count_bases = strcmp(unit, "bases") == 0;
    moe_progress_start(&c->prog, "tokenize", unit, 0);
    moe_status st = setup_output(c, err);
    /* the train output always exists, even when every document went elsewhere */
    if (st == MOE_OK) st = stream_open(c, &c->train, err);
    /* so does the validation output when asked for: a companion from an earlier run must
       not survive under the name moe-train looks for */
    if (st == MOE_OK && with_val) st = stream_open(c, &c->val, err);
    if (st == MOE_OK && !c->dir_mode && !with_val && strcmp(c->file, "-") != 0 &&
        access(c->val_file, F_OK) == 0)
        moe_log_warn("%s is left from an earlier run; moe-train will use it as the validation "
                     "set of %s (remove it, or give --val-fraction)",
                     c->val_file, c->file);
    return st;
}

moe_status tok_out_finish(tok_out *c, moe_status st, moe_tokenize_summary *summary, moe_err *err) {
    for (int k = 0; k < 2 && st == MOE_OK; k++) {
        stream *s = k ? &c->val : &c->train;
        if (s->w && (moe_shard_writer_n_docs(s->w) > 0 || s->n_done == 0))
            st = stream_commit(c, s, err);
    }
    if (st == MOE_OK && c->dir_mode) st = write_manifest(c, err);
    if (st == MOE_OK) moe_progress_finish(&c->prog, NULL);
    if (st == MOE_OK && c->sum.docs == 0)
        moe_log_warn("no documents were written (%lld records read)", (long long)c->sum.records);
    if (st == MOE_OK && c->with_val && c->sum.docs > 0 && c->sum.val_docs == 0)
        moe_log_warn("--val-fraction %g sent none of the %lld documents to validation (records "
                     "are routed whole by the hash of their name); with few records, cut them "
                     "with --window so that windows are routed one by one",
                     c->o->val_fraction, (long long)c->sum.docs);
    stream_cleanup(&c->train, st != MOE_OK);
    stream_cleanup(&c->val, st != MOE_OK);
    if (summary) *summary = c->sum;
    moe_dirlock_release(&c->lock);
    free(c);
    return st;
}
