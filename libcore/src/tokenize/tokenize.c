/* tokenize: the moe-tokenize pipeline - records in (seqio), documents out (shards).
 *
 * For each record, in input order: choose the orientations (revcomp policy), encode each
 * orientation, cut it into segments (N-run split) and windows, drop windows shorter than
 * min_length, wrap in BOS/EOS and append to the train or validation writer (by record-name
 * hash). Directory output rolls over to a new shard at a document boundary once
 * --shard-tokens is reached and ends with manifest.json. The one thing to know: all of
 * this runs on one thread in input order (with -@ N >= 2 a reader thread parses ahead and
 * htslib decompresses BGZF/BAM/CRAM on N - 1 more), which is what makes the bytes
 * independent of --threads; on failure every file this run
 * committed is removed again. */
#include "moe/tokenize.h"

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/shard.h"
#include "tokenize/tokenize_prefetch.h"

void moe_tokenize_opts_defaults(moe_tokenize_opts *o) {
    memset(o, 0, sizeof *o);
    moe_tokenizer_opts_defaults(&o->tok, MOE_TOKENIZER_BYTE);
    moe_seqio_opts_defaults(&o->io);
    o->threads = 1;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

int moe_tokenize_is_val(const char *key, double f) {
    if (f <= 0) return 0;
    /* FNV-1a alone leaves its top bits correlated for names that differ only at the end
       (chr1, chr2, ...); the splitmix64 finaliser spreads them. */
    return (double)(splitmix64(fnv1a64(key)) >> 11) * 0x1.0p-53 < f;
}

/* The split key of window `index` of a record: "name/index". */
static int window_is_val(const char *name, int64_t index, double f) {
    char key[4096];
    snprintf(key, sizeof key, "%s/%lld", name, (long long)index);
    return moe_tokenize_is_val(key, f);
}

/* One output stream (train or val): the current writer and the files committed so far. */
typedef struct stream {
    const char *kind; /* "train" / "val" */
    moe_shard_writer *w;
    char **done; /* committed paths */
    int64_t *done_tokens, *done_docs;
    int n_done;
    int64_t tokens, docs;
} stream;

typedef struct ctx {
    const moe_tokenize_opts *o;
    moe_tokenizer *tok;
    int dir_mode;
    char dir[4096];
    char file[4096], val_file[4096];
    stream train, val;
    moe_token_buf enc, doc;
    char *rc_buf;
    size_t rc_cap;
    int64_t record_ordinal;
    moe_tokenize_summary sum;
} ctx;

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

/* Appends the document in c->doc, covering bases [bs, be) of the encoded orientation, to
 * the right stream. */
static moe_status write_doc(ctx *c, const moe_seq_record *rec, const char *source, int is_val,
                            int rc, int64_t bs, int64_t be, moe_err *err);

/* The stream a document goes to, opening its writer if needed. */
static stream *doc_stream(ctx *c, int is_val, moe_err *err) {
    stream *s = is_val ? &c->val : &c->train;
    if (!s->w && stream_open(c, s, err) != MOE_OK) return NULL;
    return s;
}

/* Ends the document whose n tokens were appended to s, and rolls the shard over. */
static moe_status end_doc(ctx *c, stream *s, const moe_seq_record *rec, const char *source,
                          int is_val, int rc, int64_t bs, int64_t be, int64_t n, moe_err *err) {
    moe_shard_doc doc = {0};
    doc.name = rec->name;
    doc.source = source;
    doc.src_start = rec->src_start + (rc ? rec->len - be : bs);
    doc.src_end = rec->src_start + (rc ? rec->len - bs : be);
    doc.strand = (rec->strand == '-') != rc ? '-' : '+';
    if (moe_shard_writer_end_doc(s->w, &doc, err) != MOE_OK) return err->status;
    s->tokens += n;
    s->docs++;
    if (is_val) {
        c->sum.val_docs++;
        c->sum.val_tokens += n;
    }
    c->sum.docs++;
    c->sum.tokens += n;
    if (c->dir_mode && c->o->shard_tokens > 0 &&
        moe_shard_writer_n_tokens(s->w) >= c->o->shard_tokens)
        return stream_commit(c, s, err);
    return MOE_OK;
}

/* Appends the document in c->doc, covering bases [bs, be) of the encoded orientation, to
 * the right stream. */
static moe_status write_doc(ctx *c, const moe_seq_record *rec, const char *source, int is_val,
                            int rc, int64_t bs, int64_t be, moe_err *err) {
    const moe_token_buf *d = &c->doc;
    stream *s = doc_stream(c, is_val, err);
    if (!s || moe_shard_writer_append(s->w, d->ids, d->lower, d->n, err) != MOE_OK)
        return err->status;
    return end_doc(c, s, rec, source, is_val, rc, bs, be, d->n, err);
}

/* A whole record of a one-token-per-base tokenizer, encoded and written in chunks so that a
 * chromosome needs chunk-sized token buffers rather than 6 bytes per base. */
#define MOE_TOKENIZE_CHUNK ((int64_t)1 << 22)

/* The encoder numbers bases from the start of what it was given ("at base N"); a chunk
 * starts at `off` in the record, so add that to the number in the message. */
static void shift_base_position(moe_err *err, int64_t off) {
    char *p = strstr(err->msg, " at base ");
    long long at;
    if (!p || sscanf(p, " at base %lld", &at) != 1) return;
    char tail[sizeof err->msg];
    const char *rest = strchr(p + 9, ' ');
    snprintf(tail, sizeof tail, "%s", rest ? rest : "");
    snprintf(p, sizeof err->msg - (size_t)(p - err->msg), " at base %lld%s", at + off, tail);
}
static moe_status write_chunked(ctx *c, const moe_seq_record *rec, const char *seq,
                                const char *source, int is_val, int rc, moe_err *err) {
    const moe_tokenizer *t = c->tok;
    if (rec->len < t->opts.min_length) return MOE_OK;
    stream *s = doc_stream(c, is_val, err);
    if (!s) return err->status;
    moe_token_buf *d = &c->doc;
    const uint8_t zero = 0;
    int64_t n = 0;
    if (t->opts.add_bos && moe_shard_writer_append(s->w, &t->bos_id, &zero, 1, err) != MOE_OK)
        return err->status;
    n += t->opts.add_bos != 0;
    for (int64_t off = 0; off < rec->len; off += MOE_TOKENIZE_CHUNK) {
        int64_t len = rec->len - off < MOE_TOKENIZE_CHUNK ? rec->len - off : MOE_TOKENIZE_CHUNK;
        d->n = 0;
        if (moe_tokenizer_encode(t, seq + off, len, d, err) != MOE_OK) {
            shift_base_position(err, off);
            if (rc) moe_err_prefix(err, "reverse complement");
            return err->status;
        }
        if (moe_shard_writer_append(s->w, d->ids, d->lower, d->n, err) != MOE_OK)
            return err->status;
        n += d->n;
    }
    if (t->opts.add_eos && moe_shard_writer_append(s->w, &t->eos_id, &zero, 1, err) != MOE_OK)
        return err->status;
    n += t->opts.add_eos != 0;
    return end_doc(c, s, rec, source, is_val, rc, 0, rec->len, n, err);
}

/* Appends one document (tokens [a, b) of c->enc, wrapped) to the right stream. */
static moe_status emit_doc(ctx *c, const moe_seq_record *rec, const char *source, int is_val,
                           int rc, int64_t a, int64_t b, moe_err *err) {
    const moe_tokenizer *t = c->tok;
    if (b - a < t->opts.min_length || b <= a) return MOE_OK;
    moe_token_buf *d = &c->doc;
    d->n = 0;
    if (moe_token_buf_reserve(d, b - a + 2, err) != MOE_OK) return MOE_ERR_RUNTIME;
    if (t->opts.add_bos) {
        d->ids[d->n] = t->bos_id;
        d->lower[d->n++] = 0;
    }
    memcpy(d->ids + d->n, c->enc.ids + a, (size_t)(b - a) * sizeof *d->ids);
    memcpy(d->lower + d->n, c->enc.lower + a, (size_t)(b - a));
    d->n += b - a;
    if (t->opts.add_eos) {
        d->ids[d->n] = t->eos_id;
        d->lower[d->n++] = 0;
    }
    /* bases covered, in the orientation that was encoded */
    int64_t bs = 0, be = rec->len;
    if (c->enc.want_pos) {
        bs = c->enc.pos[a];
        be = b < c->enc.n ? c->enc.pos[b] : rec->len;
    }
    return write_doc(c, rec, source, is_val, rc, bs, be, err);
}

static moe_status do_orientation(ctx *c, const moe_seq_record *rec, const char *source, int is_val,
                                 int rc, moe_err *err) {
    const moe_tokenizer *t = c->tok;
    const char *seq = rec->seq;
    if (rc) {
        if ((size_t)rec->len + 1 > c->rc_cap) {
            char *nb = realloc(c->rc_buf, (size_t)rec->len + 1);
            if (!nb) return moe_err_set(err, MOE_ERR_RUNTIME, source, "out of memory");
            c->rc_buf = nb;
            c->rc_cap = (size_t)rec->len + 1;
        }
        memcpy(c->rc_buf, rec->seq, (size_t)rec->len);
        moe_seqio_revcomp(c->rc_buf, rec->len);
        seq = c->rc_buf;
    }
    int64_t w = t->opts.window, stride = t->opts.stride ? t->opts.stride : w;
    int split = t->opts.nrun == MOE_NRUN_SPLIT;
    /* byte/nuc without collapse or drop make exactly one token per base, so a long record
       can be written in chunks: its length is known before the first token */
    int one_per_base = t->kind != MOE_TOKENIZER_KMER && t->opts.nrun == MOE_NRUN_KEEP &&
                       t->opts.iupac != MOE_IUPAC_DROP;
    if (w == 0 && one_per_base && rec->len > MOE_TOKENIZE_CHUNK)
        return write_chunked(c, rec, seq, source, is_val, rc, err);
    if (w == 0 && !split) { /* whole record: encode straight into the document buffer */
        c->doc.n = 0;
        if (moe_tokenizer_encode_doc(t, seq, rec->len, &c->doc, err) != MOE_OK) {
            if (rc) moe_err_prefix(err, "reverse complement");
            return err->status;
        }
        int64_t inner = c->doc.n - (t->opts.add_bos != 0) - (t->opts.add_eos != 0);
        if (inner < t->opts.min_length || inner <= 0) return MOE_OK;
        return write_doc(c, rec, source, is_val, rc, 0, rec->len, err);
    }
    c->enc.n = 0;
    if (moe_tokenizer_encode(t, seq, rec->len, &c->enc, err) != MOE_OK) {
        if (rc) moe_err_prefix(err, "reverse complement");
        return err->status;
    }
    int64_t n = c->enc.n;
    /* Non-overlapping windows of one orientation split one by one (a single genome still
       gets a validation part, and no base lands on both sides); otherwise the record does. */
    int per_window = w > 0 && stride >= w && t->opts.revcomp != MOE_REVCOMP_ADD;
    int64_t n_windows = 0;
    for (int64_t a = 0; a < n;) {
        int64_t b = n;
        if (split) {
            while (a < n && moe_tokenizer_is_n(t, c->enc.ids[a]))
                a++;
            if (a == n) break;
            b = a;
            while (b < n && !moe_tokenizer_is_n(t, c->enc.ids[b]))
                b++;
        }
        if (w == 0) {
            if (emit_doc(c, rec, source, is_val, rc, a, b, err) != MOE_OK) return err->status;
        } else {
            for (int64_t s = a;; s += stride) {
                int64_t e = s + w < b ? s + w : b;
                int v =
                    per_window ? window_is_val(rec->name, n_windows, c->o->val_fraction) : is_val;
                n_windows++;
                if (emit_doc(c, rec, source, v, rc, s, e, err) != MOE_OK) return err->status;
                if (e == b) break;
            }
        }
        a = b;
    }
    return MOE_OK;
}

static moe_status do_record(ctx *c, const moe_seq_record *rec, const char *source, moe_err *err) {
    const moe_tokenizer_opts *to = &c->tok->opts;
    int is_val = moe_tokenize_is_val(rec->name, c->o->val_fraction);
    c->record_ordinal++;
    c->sum.records++;
    c->sum.bases += rec->len;
    moe_status st = MOE_OK;
    if (to->revcomp == MOE_REVCOMP_RANDOM) {
        uint64_t h =
            splitmix64(to->seed ^ splitmix64(fnv1a64(rec->name) + (uint64_t)c->record_ordinal));
        st = do_orientation(c, rec, source, is_val, (int)(h & 1), err);
    } else {
        st = do_orientation(c, rec, source, is_val, 0, err);
        if (st == MOE_OK && to->revcomp == MOE_REVCOMP_ADD)
            st = do_orientation(c, rec, source, is_val, 1, err);
    }
    if (st != MOE_OK) {
        moe_err_prefix(err, "record %lld (%s)", (long long)rec->record_no, rec->name);
        if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", source);
        if (rec->line > 0 && err->line == 0) err->line = rec->line;
    }
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
    if (strcmp(out, "-") == 0 && o->val_fraction > 0) {
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

/* -@ N >= 2: a reader thread parses while this thread tokenizes and writes. */
static moe_status run_prefetched(ctx *c, const moe_seqio_opts *io, moe_progress *prog,
                                 moe_err *err) {
    const moe_tokenize_opts *o = c->o;
    moe_prefetch *p = NULL;
    if (moe_prefetch_start(&p, o->inputs, o->n_inputs, io, err) != MOE_OK) return err->status;
    moe_seq_record rec;
    int input, ret;
    moe_status st = MOE_OK;
    while ((ret = moe_prefetch_next(p, &rec, &input, &c->sum.filtered, &c->sum.empty, err)) == 1) {
        if ((st = do_record(c, &rec, o->inputs[input], err)) != MOE_OK) break;
        moe_progress_update(prog, c->sum.bases, NULL);
    }
    if (ret < 0) st = err->status;
    moe_prefetch_finish(p);
    return st;
}

static moe_status run_inputs(ctx *c, moe_err *err) {
    const moe_tokenize_opts *o = c->o;
    moe_seqio_opts io = o->io;
    io.threads = o->threads > 1 ? o->threads - 1 : 0;
    moe_progress prog;
    moe_progress_start(&prog, "tokenize", "bases", 0);
    if (o->threads > 1) {
        moe_status st = run_prefetched(c, &io, &prog, err);
        if (st == MOE_OK) moe_progress_finish(&prog, NULL);
        return st;
    }
    for (int i = 0; i < o->n_inputs; i++) {
        moe_seq_reader *r = NULL;
        if (moe_seqio_open(&r, o->inputs[i], &io, err) != MOE_OK) return err->status;
        moe_seq_record rec;
        int ret;
        while ((ret = moe_seqio_next(r, &rec, err)) == 1) {
            if (do_record(c, &rec, o->inputs[i], err) != MOE_OK) {
                moe_seqio_close(r);
                return err->status;
            }
            moe_progress_update(&prog, c->sum.bases, NULL);
        }
        c->sum.filtered += moe_seqio_n_filtered(r);
        c->sum.empty += moe_seqio_n_empty(r);
        moe_log_debug("%s: %s, %lld records read, %lld filtered out, %lld empty", o->inputs[i],
                      moe_seqio_format_name(moe_seqio_format(r)), (long long)moe_seqio_n_read(r),
                      (long long)moe_seqio_n_filtered(r), (long long)moe_seqio_n_empty(r));
        moe_seqio_close(r);
        if (ret < 0) return err->status;
    }
    moe_progress_finish(&prog, NULL);
    return MOE_OK;
}

moe_status moe_tokenize_run(const moe_tokenize_opts *o, moe_tokenize_summary *summary,
                            moe_err *err) {
    ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    if (summary) memset(summary, 0, sizeof *summary);
    if (o->n_inputs < 1) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "no input files");
        moe_err_hint(err, "give FASTA/FASTQ/SAM/BAM/CRAM files, or - for stdin");
        return MOE_ERR_INPUT;
    }
    if (o->val_fraction < 0 || o->val_fraction > 1) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "--val-fraction must be in [0, 1], not %g",
                    o->val_fraction);
        return MOE_ERR_INPUT;
    }
    moe_status st = moe_tokenizer_create(&c.tok, &o->tok, err);
    if (st == MOE_OK) st = setup_output(&c, err);
    /* token -> base offsets are only needed when a document is part of a record */
    c.enc.want_pos = o->tok.window > 0 || o->tok.nrun == MOE_NRUN_SPLIT;
    /* the train output always exists, even when every document went elsewhere */
    if (st == MOE_OK) st = stream_open(&c, &c.train, err);
    /* so does the validation output when asked for: a companion from an earlier run must
       not survive under the name moe-train looks for */
    if (st == MOE_OK && o->val_fraction > 0) st = stream_open(&c, &c.val, err);
    if (st == MOE_OK && !c.dir_mode && o->val_fraction == 0 && strcmp(c.file, "-") != 0 &&
        access(c.val_file, F_OK) == 0)
        moe_log_warn("%s is left from an earlier run; moe-train will use it as the validation "
                     "set of %s (remove it, or give --val-fraction)",
                     c.val_file, c.file);
    if (st == MOE_OK) st = run_inputs(&c, err);
    for (int k = 0; k < 2 && st == MOE_OK; k++) {
        stream *s = k ? &c.val : &c.train;
        if (s->w && (moe_shard_writer_n_docs(s->w) > 0 || s->n_done == 0))
            st = stream_commit(&c, s, err);
    }
    if (st == MOE_OK && c.dir_mode) st = write_manifest(&c, err);
    if (st == MOE_OK && c.sum.docs == 0)
        moe_log_warn("no documents were written (%lld records read)", (long long)c.sum.records);
    stream_cleanup(&c.train, st != MOE_OK);
    stream_cleanup(&c.val, st != MOE_OK);
    moe_token_buf_free(&c.enc);
    moe_token_buf_free(&c.doc);
    free(c.rc_buf);
    moe_tokenizer_free(c.tok);
    if (summary) *summary = c.sum;
    return st;
}
