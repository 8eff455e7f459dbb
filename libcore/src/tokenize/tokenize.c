/* tokenize: the moe-tokenize pipeline - records in (seqio), documents out (shards) - and
 * its encoder.
 *
 * For each record, in input order: choose the orientations (revcomp policy), encode each
 * orientation, cut it into segments (N-run split) and windows, drop windows shorter than
 * min_length, wrap in BOS/EOS and append the packed tokens to a document buffer with the
 * train/validation choice (by record-name hash). tokenize_out.c writes the buffer to the
 * shards; with -@ N >= 2, tokenize_pool.c runs encoders on several threads. The one thing
 * to know: an encoder depends only on the record and its ordinal, and the buffers are
 * written in input order, which is what makes the bytes independent of --threads. */
#include "moe/tokenize.h"

#include <stdlib.h>
#include <string.h>

#include "moe/log.h"
#include "tokenize/tokenize_impl.h"

void moe_tokenize_opts_defaults(moe_tokenize_opts *o) {
    memset(o, 0, sizeof *o);
    moe_tokenizer_opts_defaults(&o->tok, MOE_TOKENIZER_BYTE);
    moe_seqio_opts_defaults(&o->io);
    o->io.skip_qual = 1; /* tokens are made of bases only */
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

/* ---- the document buffer ---- */

void tok_docbuf_reset(tok_docbuf *b) {
    b->n_tokens = b->n_docs = 0;
    b->names_len = 0;
    b->records = b->bases = b->filtered = b->empty = 0;
    b->status = MOE_OK;
    moe_err_clear(&b->err);
}

void tok_docbuf_free(tok_docbuf *b) {
    free(b->packed);
    free(b->lower);
    free(b->docs);
    free(b->names);
    memset(b, 0, sizeof *b);
}

int tok_docbuf_reserve(tok_docbuf *b, int64_t n, int width, int with_lower, size_t name_bytes) {
    if (b->n_tokens + n > b->cap_tokens) {
        int64_t nc = b->cap_tokens ? b->cap_tokens : 1 << 16;
        while (nc < b->n_tokens + n)
            nc *= 2;
        uint8_t *np = realloc(b->packed, (size_t)nc * (size_t)width);
        if (np) b->packed = np;
        uint8_t *nl = np && with_lower ? realloc(b->lower, (size_t)nc) : NULL;
        if (nl) b->lower = nl;
        if (!np || (with_lower && !nl)) return -1;
        b->cap_tokens = nc;
    }
    if (b->n_docs == b->cap_docs) {
        tok_doc *nd = realloc(b->docs, (size_t)(2 * b->cap_docs + 64) * sizeof *nd);
        if (!nd) return -1;
        b->docs = nd;
        b->cap_docs = 2 * b->cap_docs + 64;
    }
    if (b->names_len + name_bytes > b->names_cap) {
        size_t nc = 2 * (b->names_len + name_bytes) + 4096;
        char *nn = realloc(b->names, nc);
        if (!nn) return -1;
        b->names = nn;
        b->names_cap = nc;
    }
    return 0;
}

static moe_status oom(moe_err *err) {
    return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (document buffer)");
}

/* Starts a document of the stream is_val. */
static void sink_begin(tok_enc *e, int is_val) {
    e->out->open = 1;
    e->out->open_val = is_val;
    e->out->open_tokens = 0;
}

/* Appends ids [n] (lower [n]) to the open document, packed. */
static moe_status sink_append(tok_enc *e, const int32_t *ids, const uint8_t *lower, int64_t n,
                              moe_err *err) {
    tok_docbuf *b = e->out;
    if (tok_docbuf_reserve(b, n, e->width, e->has_mask, 0) < 0) return oom(err);
    if (e->has_mask) memcpy(b->lower + b->n_tokens, lower, (size_t)n);
    if (moe_shard_pack_tokens(e->tok, ids, n, b->packed + b->n_tokens * e->width) != 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                           "internal error: a token id is outside the vocabulary");
    b->n_tokens += n;
    b->open_tokens += n;
    if (e->flush && (size_t)(b->n_tokens * e->width) >= TOK_FLUSH_BYTES)
        return e->flush(e->flush_arg, b, err);
    return MOE_OK;
}

/* Ends the open document, covering bases [bs, be) of the encoded orientation. */
static moe_status sink_end(tok_enc *e, const moe_seq_record *rec, int input, int rc, int64_t bs,
                           int64_t be, moe_err *err) {
    tok_docbuf *b = e->out;
    size_t nl = strlen(rec->name) + 1;
    if (tok_docbuf_reserve(b, 0, e->width, e->has_mask, nl) < 0) return oom(err);
    tok_doc *d = &b->docs[b->n_docs++];
    d->n_tokens = b->open_tokens;
    d->src_start = rec->src_start + (rc ? rec->len - be : bs);
    d->src_end = rec->src_start + (rc ? rec->len - bs : be);
    d->strand = (rec->strand == '-') != rc ? '-' : '+';
    d->name_off = b->names_len;
    d->input = input;
    d->is_val = b->open_val;
    memcpy(b->names + b->names_len, rec->name, nl);
    b->names_len += nl;
    b->open = 0;
    b->open_tokens = 0;
    return MOE_OK;
}

/* The document in e->doc, covering bases [bs, be) of the encoded orientation. */
static moe_status sink_doc(tok_enc *e, const moe_seq_record *rec, int input, int is_val, int rc,
                           int64_t bs, int64_t be, moe_err *err) {
    sink_begin(e, is_val);
    if (sink_append(e, e->doc.ids, e->doc.lower, e->doc.n, err) != MOE_OK) return err->status;
    return sink_end(e, rec, input, rc, bs, be, err);
}

/* ---- the encoder ---- */

void tok_enc_init(tok_enc *e, const moe_tokenize_opts *o, const moe_tokenizer *tok) {
    memset(e, 0, sizeof *e);
    e->o = o;
    e->tok = tok;
    e->width = moe_shard_pack_width(tok);
    e->has_mask = tok->opts.case_policy == MOE_CASE_UPPER_MASK;
    /* token -> base offsets are only needed when a document is part of a record */
    e->enc.want_pos = o->tok.window > 0 || o->tok.nrun == MOE_NRUN_SPLIT;
}

void tok_enc_free(tok_enc *e) {
    moe_token_buf_free(&e->enc);
    moe_token_buf_free(&e->doc);
    free(e->rc_buf);
    free(e->clean_buf);
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

static moe_status write_chunked(tok_enc *e, const moe_seq_record *rec, const char *seq, int input,
                                int is_val, int rc, moe_err *err) {
    const moe_tokenizer *t = e->tok;
    if (rec->len < t->opts.min_length) return MOE_OK;
    moe_token_buf *d = &e->doc;
    const uint8_t zero = 0;
    sink_begin(e, is_val);
    if (t->opts.add_bos && sink_append(e, &t->bos_id, &zero, 1, err) != MOE_OK) return err->status;
    for (int64_t off = 0; off < rec->len; off += MOE_TOKENIZE_CHUNK) {
        int64_t len = rec->len - off < MOE_TOKENIZE_CHUNK ? rec->len - off : MOE_TOKENIZE_CHUNK;
        d->n = 0;
        if (moe_tokenizer_encode(t, seq + off, len, d, err) != MOE_OK) {
            shift_base_position(err, off);
            if (rc) moe_err_prefix(err, "reverse complement");
            return err->status;
        }
        if (sink_append(e, d->ids, d->lower, d->n, err) != MOE_OK) return err->status;
    }
    if (t->opts.add_eos && sink_append(e, &t->eos_id, &zero, 1, err) != MOE_OK) return err->status;
    return sink_end(e, rec, input, rc, 0, rec->len, err);
}

/* One document: tokens [a, b) of e->enc, wrapped in BOS/EOS. */
static moe_status emit_doc(tok_enc *e, const moe_seq_record *rec, int input, int is_val, int rc,
                           int64_t a, int64_t b, moe_err *err) {
    const moe_tokenizer *t = e->tok;
    if (b - a < t->opts.min_length || b <= a) return MOE_OK;
    moe_token_buf *d = &e->doc;
    d->n = 0;
    if (moe_token_buf_reserve(d, b - a + 2, err) != MOE_OK) return MOE_ERR_RUNTIME;
    if (t->opts.add_bos) {
        d->ids[d->n] = t->bos_id;
        d->lower[d->n++] = 0;
    }
    memcpy(d->ids + d->n, e->enc.ids + a, (size_t)(b - a) * sizeof *d->ids);
    memcpy(d->lower + d->n, e->enc.lower + a, (size_t)(b - a));
    d->n += b - a;
    if (t->opts.add_eos) {
        d->ids[d->n] = t->eos_id;
        d->lower[d->n++] = 0;
    }
    /* bases covered, in the orientation that was encoded */
    int64_t bs = 0, be = rec->len;
    if (e->enc.want_pos) {
        bs = e->enc.pos[a];
        be = b < e->enc.n ? e->enc.pos[b] : rec->len;
    }
    return sink_doc(e, rec, input, is_val, rc, bs, be, err);
}

static moe_status do_orientation(tok_enc *e, const moe_seq_record *rec, int input, int is_val,
                                 int rc, moe_err *err) {
    const moe_tokenizer *t = e->tok;
    const char *seq = rec->seq;
    if (rc) {
        if ((size_t)rec->len + 1 > e->rc_cap) {
            char *nb = realloc(e->rc_buf, (size_t)rec->len + 1);
            if (!nb) return oom(err);
            e->rc_buf = nb;
            e->rc_cap = (size_t)rec->len + 1;
        }
        memcpy(e->rc_buf, rec->seq, (size_t)rec->len);
        moe_seqio_revcomp(e->rc_buf, rec->len);
        seq = e->rc_buf;
    }
    int64_t w = t->opts.window, stride = t->opts.stride ? t->opts.stride : w;
    int split = t->opts.nrun == MOE_NRUN_SPLIT;
    /* byte/nuc without collapse or drop make exactly one token per base, so a long record
       can be written in chunks: its length is known before the first token */
    int one_per_base = t->kind != MOE_TOKENIZER_KMER && t->opts.nrun == MOE_NRUN_KEEP &&
                       t->opts.iupac != MOE_IUPAC_DROP;
    if (w == 0 && one_per_base && rec->len > MOE_TOKENIZE_CHUNK)
        return write_chunked(e, rec, seq, input, is_val, rc, err);
    if (w == 0 && !split) { /* whole record: encode straight into the document buffer */
        e->doc.n = 0;
        if (moe_tokenizer_encode_doc(t, seq, rec->len, &e->doc, err) != MOE_OK) {
            if (rc) moe_err_prefix(err, "reverse complement");
            return err->status;
        }
        int64_t inner = e->doc.n - (t->opts.add_bos != 0) - (t->opts.add_eos != 0);
        if (inner < t->opts.min_length || inner <= 0) return MOE_OK;
        return sink_doc(e, rec, input, is_val, rc, 0, rec->len, err);
    }
    e->enc.n = 0;
    if (moe_tokenizer_encode(t, seq, rec->len, &e->enc, err) != MOE_OK) {
        if (rc) moe_err_prefix(err, "reverse complement");
        return err->status;
    }
    int64_t n = e->enc.n;
    /* Non-overlapping windows of one orientation split one by one (a single genome still
       gets a validation part, and no base lands on both sides); otherwise the record does. */
    int per_window = w > 0 && stride >= w && t->opts.revcomp != MOE_REVCOMP_ADD;
    int64_t n_windows = 0;
    for (int64_t a = 0; a < n;) {
        int64_t b = n;
        if (split) {
            while (a < n && moe_tokenizer_is_n(t, e->enc.ids[a]))
                a++;
            if (a == n) break;
            b = a;
            while (b < n && !moe_tokenizer_is_n(t, e->enc.ids[b]))
                b++;
        }
        if (w == 0) {
            if (emit_doc(e, rec, input, is_val, rc, a, b, err) != MOE_OK) return err->status;
        } else {
            for (int64_t s = a;; s += stride) {
                int64_t end = s + w < b ? s + w : b;
                int v =
                    per_window ? window_is_val(rec->name, n_windows, e->o->val_fraction) : is_val;
                n_windows++;
                if (emit_doc(e, rec, input, v, rc, s, end, err) != MOE_OK) return err->status;
                if (end == b) break;
            }
        }
        a = b;
    }
    return MOE_OK;
}

moe_status tok_enc_record(tok_enc *e, const moe_seq_record *raw, int input, moe_err *err) {
    const moe_tokenizer_opts *to = &e->tok->opts;
    moe_seq_record clean;
    const moe_seq_record *rec = raw;
    if (raw->raw) { /* undecoded by the reader thread: decoded here, on this thread */
        if ((size_t)raw->len + 1 > e->clean_cap) {
            char *nb = realloc(e->clean_buf, (size_t)raw->len + 1);
            if (!nb) return oom(err);
            e->clean_buf = nb;
            e->clean_cap = (size_t)raw->len + 1;
        }
        clean = *raw;
        clean.len = moe_seqio_decode(raw, e->clean_buf);
        clean.seq = e->clean_buf;
        clean.src_end = raw->src_start + clean.len;
        clean.raw = 0;
        rec = &clean;
    }
    int is_val = moe_tokenize_is_val(rec->name, e->o->val_fraction);
    e->out->records++;
    e->out->bases += rec->len;
    moe_status st = MOE_OK;
    if (to->revcomp == MOE_REVCOMP_RANDOM) {
        uint64_t h = splitmix64(to->seed ^ splitmix64(fnv1a64(rec->name) + (uint64_t)rec->ordinal));
        st = do_orientation(e, rec, input, is_val, (int)(h & 1), err);
    } else {
        st = do_orientation(e, rec, input, is_val, 0, err);
        if (st == MOE_OK && to->revcomp == MOE_REVCOMP_ADD)
            st = do_orientation(e, rec, input, is_val, 1, err);
    }
    if (st != MOE_OK) {
        const char *source = e->o->inputs[input];
        moe_err_prefix(err, "record %lld (%s)", (long long)rec->record_no, rec->name);
        if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", source);
        if (rec->line > 0 && err->line == 0) err->line = rec->line;
    }
    return st;
}

/* ---- the run ---- */

/* Plain gzip inputs larger than this get a hint to bgzip them. */
#define MOE_TOKENIZE_GZIP_HINT ((int64_t)100 * 1000 * 1000)

static moe_status flush_to_out(void *arg, tok_docbuf *b, moe_err *err) {
    return tok_out_write(arg, b, err);
}

/* -@ 1: read, encode and write on this thread. */
static moe_status run_serial(const moe_tokenize_opts *o, const moe_tokenizer *tok, tok_out *out,
                             moe_err *err) {
    tok_enc e;
    tok_docbuf buf;
    memset(&buf, 0, sizeof buf);
    tok_enc_init(&e, o, tok);
    e.out = &buf;
    e.flush = flush_to_out;
    e.flush_arg = out;
    moe_status st = MOE_OK;
    int64_t before = 0; /* records of the inputs before this one */
    for (int i = 0; i < o->n_inputs && st == MOE_OK; i++) {
        moe_seq_reader *r = NULL;
        if ((st = moe_seqio_open(&r, o->inputs[i], &o->io, err)) != MOE_OK) break;
        moe_seq_record rec;
        int ret;
        while ((ret = moe_seqio_next(r, &rec, err)) == 1) {
            if (rec.ordinal) rec.ordinal += before;
            if ((st = tok_enc_record(&e, &rec, i, err)) != MOE_OK) break;
            /* documents of a record are written once it is done: the buffer stays small */
            if ((st = tok_out_write(out, &buf, err)) != MOE_OK) break;
        }
        if (ret < 0) st = err->status;
        before += moe_seqio_n_kept(r);
        buf.filtered += moe_seqio_n_filtered(r);
        buf.empty += moe_seqio_n_empty(r);
        moe_log_debug("%s: %s, %lld records read, %lld filtered out, %lld empty", o->inputs[i],
                      moe_seqio_format_name(moe_seqio_format(r)), (long long)moe_seqio_n_read(r),
                      (long long)moe_seqio_n_filtered(r), (long long)moe_seqio_n_empty(r));
        moe_seqio_close(r);
        if (st == MOE_OK) st = tok_out_write(out, &buf, err);
    }
    tok_enc_free(&e);
    tok_docbuf_free(&buf);
    return st;
}

moe_status moe_tokenize_run(const moe_tokenize_opts *o, moe_tokenize_summary *summary,
                            moe_err *err) {
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
    for (int i = 0; i < o->n_inputs; i++) { /* once per run, for the first such input */
        int64_t size = moe_seqio_plain_gzip_size(o->inputs[i]);
        if (size <= MOE_TOKENIZE_GZIP_HINT) continue;
        moe_log_info("hint: %s is %lld MB of plain gzip, which only one thread can decompress; "
                     "bgzip it for parallel decoding (zcat %s | bgzip -@ 8 > x.fa.bgz)",
                     o->inputs[i], (long long)(size / 1000000), o->inputs[i]);
        break;
    }
    double t0 = moe_time_now();
    moe_tokenizer *tok = NULL;
    tok_out *out = NULL;
    moe_status st = moe_tokenizer_create(&tok, &o->tok, err);
    if (st == MOE_OK) st = tok_out_open(&out, o, tok, o->val_fraction > 0, "bases", err);
    double t1 = moe_time_now();
    if (st == MOE_OK)
        st = o->threads > 1 ? tok_pool_run(o, tok, out, err) : run_serial(o, tok, out, err);
    double t2 = moe_time_now();
    if (out) st = tok_out_finish(out, st, summary, err);
    moe_tokenizer_free(tok);
    moe_log_debug("times: %.3f s setting up, %.3f s reading, encoding and writing, %.3f s "
                  "committing the output (fsync)",
                  t1 - t0, t2 - t1, moe_time_now() - t2);
    return st;
}
