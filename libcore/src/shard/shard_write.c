/* shard_write: the streaming .mtok writer (format in docs/formats.md, offsets in
 * shard_format.h).
 *
 * The one thing to know: tokens go to the file as documents arrive; the lower-case mask
 * (one bit per token) and the document index are kept in memory and written at commit,
 * followed by a trailer holding the counts, so a pipe works. When the output is a regular
 * file the header counts are patched too (flag COUNTS), so `head -c 80` tells the sizes. */
#include <stdlib.h>
#include <string.h>

#include "moe/fileio.h"
#include "moe/shard.h"
#include "shard/shard_format.h"

typedef struct doc_entry {
    uint64_t start, length, src_start, src_end, name_off;
    uint32_t source;
    char strand;
} doc_entry;

struct moe_shard_writer {
    moe_outfile out;
    const moe_tokenizer *tok;
    int width, has_mask;
    uint64_t n_tokens, header_size;
    uint64_t doc_start; /* first token of the document being appended */
    uint8_t *buf;       /* conversion buffer for tokens */
    size_t buf_cap;
    uint8_t *mask;
    size_t mask_cap;
    doc_entry *docs;
    size_t n_docs, docs_cap;
    char *strings;
    size_t strings_len, strings_cap;
    uint64_t *sources; /* offsets into strings */
    size_t n_sources, sources_cap;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static void writer_free(moe_shard_writer *w) {
    free(w->buf);
    free(w->mask);
    free(w->docs);
    free(w->strings);
    free(w->sources);
    free(w);
}

moe_status moe_shard_writer_open(moe_shard_writer **out, const char *path, const moe_tokenizer *t,
                                 moe_err *err) {
    *out = NULL;
    moe_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    w->tok = t;
    w->width = moe_shard_width_for_vocab(t->vocab_size);
    w->has_mask = t->opts.case_policy == MOE_CASE_UPPER_MASK;
    const char *spec = moe_tokenizer_spec_json(t);
    size_t spec_len = strlen(spec);
    w->header_size = moe_align8(MOE_SHARD_HEADER_FIXED + spec_len);
    uint8_t *h = calloc(1, w->header_size);
    if (!h) {
        writer_free(w);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    memcpy(h, MOE_SHARD_MAGIC, 8);
    moe_put_u32(h + MOE_SHARD_OFF_VERSION, MOE_SHARD_VERSION);
    moe_put_u32(h + MOE_SHARD_OFF_HEADER_SIZE, (uint32_t)w->header_size);
    moe_put_u32(h + MOE_SHARD_OFF_TOKENIZER, (uint32_t)t->kind);
    moe_put_u32(h + MOE_SHARD_OFF_WIDTH, (uint32_t)w->width);
    moe_put_u64(h + MOE_SHARD_OFF_VOCAB_SIZE, (uint64_t)t->vocab_size);
    moe_put_u64(h + MOE_SHARD_OFF_VOCAB_HASH, t->vocab_hash);
    moe_put_u32(h + MOE_SHARD_OFF_FLAGS, w->has_mask ? MOE_SHARD_FLAG_MASK : 0);
    moe_put_u32(h + MOE_SHARD_OFF_SPEC_LEN, (uint32_t)spec_len);
    memcpy(h + MOE_SHARD_HEADER_FIXED, spec, spec_len);
    moe_status st = moe_outfile_open(&w->out, path, err);
    if (st == MOE_OK) {
        setvbuf(w->out.fp, NULL, _IOFBF, 1 << 20);
        st = moe_outfile_write(&w->out, h, w->header_size, err);
        if (st != MOE_OK) moe_outfile_abort(&w->out);
    }
    free(h);
    if (st != MOE_OK) {
        writer_free(w);
        return st;
    }
    *out = w;
    return MOE_OK;
}

static uint64_t add_string(moe_shard_writer *w, const char *s, int *fail) {
    size_t n = strlen(s) + 1;
    if (grow((void **)&w->strings, &w->strings_cap, w->strings_len + n, 1) < 0) {
        *fail = 1;
        return 0;
    }
    uint64_t off = w->strings_len;
    memcpy(w->strings + off, s, n);
    w->strings_len += n;
    return off;
}

static uint32_t source_index(moe_shard_writer *w, const char *src, int *fail) {
    /* few sources, and documents of one source arrive together: scan from the end */
    for (size_t i = w->n_sources; i-- > 0;)
        if (strcmp(w->strings + w->sources[i], src) == 0) return (uint32_t)i;
    if (grow((void **)&w->sources, &w->sources_cap, w->n_sources + 1, sizeof *w->sources) < 0) {
        *fail = 1;
        return 0;
    }
    w->sources[w->n_sources] = add_string(w, src, fail);
    return (uint32_t)w->n_sources++;
}

int moe_shard_pack_width(const moe_tokenizer *t) {
    return moe_shard_width_for_vocab(t->vocab_size);
}

int moe_shard_pack_tokens(const moe_tokenizer *t, const int32_t *ids, int64_t n, uint8_t *out) {
    /* one pass: convert and check the range (unsigned compare catches negatives too) */
    const uint32_t vs = (uint32_t)t->vocab_size;
    const int width = moe_shard_width_for_vocab(t->vocab_size);
    uint32_t bad = 0;
    uint8_t *restrict buf = out;
    if (width == 1)
        for (int64_t i = 0; i < n; i++) {
            bad |= (uint32_t)ids[i] >= vs;
            buf[i] = (uint8_t)ids[i];
        }
    else if (width == 2)
        for (int64_t i = 0; i < n; i++) {
            bad |= (uint32_t)ids[i] >= vs;
            buf[2 * i] = (uint8_t)ids[i];
            buf[2 * i + 1] = (uint8_t)(ids[i] >> 8);
        }
    else
        for (int64_t i = 0; i < n; i++) {
            bad |= (uint32_t)ids[i] >= vs;
            moe_put_u32(buf + 4 * i, (uint32_t)ids[i]);
        }
    return bad ? -1 : 0;
}

moe_status moe_shard_writer_append_packed(moe_shard_writer *w, const uint8_t *packed,
                                          const uint8_t *lower, int64_t n, moe_err *err) {
    if (w->has_mask &&
        grow((void **)&w->mask, &w->mask_cap, (w->n_tokens + (uint64_t)n) / 8 + 1, 1) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory");
    if (moe_outfile_write(&w->out, packed, (size_t)n * (size_t)w->width, err) != MOE_OK)
        return MOE_ERR_RUNTIME;
    if (w->has_mask) {
        /* bytes past the last token are zero, so only the newly used bytes need clearing */
        size_t old_len = (size_t)((w->n_tokens + 7) / 8);
        size_t new_len = (size_t)((w->n_tokens + (uint64_t)n + 7) / 8);
        memset(w->mask + old_len, 0, new_len - old_len);
        for (int64_t i = 0; lower && i < n; i++)
            if (lower[i]) {
                uint64_t k = w->n_tokens + (uint64_t)i;
                w->mask[k / 8] |= (uint8_t)(1u << (k % 8));
            }
    }
    w->n_tokens += (uint64_t)n;
    return MOE_OK;
}

moe_status moe_shard_writer_append(moe_shard_writer *w, const int32_t *ids, const uint8_t *lower,
                                   int64_t n, moe_err *err) {
    size_t bytes = (size_t)n * (size_t)w->width;
    if (grow((void **)&w->buf, &w->buf_cap, bytes, 1) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory");
    if (moe_shard_pack_tokens(w->tok, ids, n, w->buf) != 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path,
                           "internal error: a token id is outside the vocabulary (%lld ids)",
                           (long long)w->tok->vocab_size);
    return moe_shard_writer_append_packed(w, w->buf, lower, n, err);
}

moe_status moe_shard_writer_end_doc(moe_shard_writer *w, const moe_shard_doc *doc, moe_err *err) {
    int fail = 0;
    if (grow((void **)&w->docs, &w->docs_cap, w->n_docs + 1, sizeof *w->docs) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory");
    doc_entry *d = &w->docs[w->n_docs];
    d->start = w->doc_start;
    d->length = w->n_tokens - w->doc_start;
    d->src_start = (uint64_t)doc->src_start;
    d->src_end = (uint64_t)doc->src_end;
    d->strand = doc->strand == '-' ? '-' : '+';
    d->name_off = add_string(w, doc->name ? doc->name : "", &fail);
    d->source = source_index(w, doc->source ? doc->source : "", &fail);
    if (fail) return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory");
    w->n_docs++;
    w->doc_start = w->n_tokens;
    return MOE_OK;
}

moe_status moe_shard_writer_add(moe_shard_writer *w, const int32_t *ids, const uint8_t *lower,
                                int64_t n, const moe_shard_doc *doc, moe_err *err) {
    if (moe_shard_writer_append(w, ids, lower, n, err) != MOE_OK) return err->status;
    return moe_shard_writer_end_doc(w, doc, err);
}

int64_t moe_shard_writer_n_tokens(const moe_shard_writer *w) {
    return (int64_t)w->n_tokens;
}
int64_t moe_shard_writer_n_docs(const moe_shard_writer *w) {
    return (int64_t)w->n_docs;
}

static const uint8_t ZEROS[8];

static moe_status write_padded(moe_shard_writer *w, const void *p, uint64_t n, moe_err *err) {
    if (n && moe_outfile_write(&w->out, p, (size_t)n, err) != MOE_OK) return MOE_ERR_RUNTIME;
    return MOE_OK;
}

static moe_status write_tail(moe_shard_writer *w, moe_err *err) {
    uint64_t pos = w->header_size + w->n_tokens * (uint64_t)w->width;
    if (write_padded(w, ZEROS, moe_align8(pos) - pos, err) != MOE_OK) return MOE_ERR_RUNTIME;
    pos = moe_align8(pos);
    if (w->has_mask) {
        uint64_t mbytes = (w->n_tokens + 7) / 8;
        if (write_padded(w, w->mask, mbytes, err) != MOE_OK ||
            write_padded(w, ZEROS, moe_align8(mbytes) - mbytes, err) != MOE_OK)
            return MOE_ERR_RUNTIME;
        pos += moe_align8(mbytes);
    }
    uint64_t index_off = pos;
    /* the whole index in one buffer, so its CRC can go into its fixed part */
    size_t body = MOE_SHARD_DOC_ENTRY * w->n_docs + 8 * w->n_sources + w->strings_len;
    size_t total = MOE_SHARD_INDEX_FIXED + (size_t)moe_align8(body);
    uint8_t *ix = calloc(1, total);
    if (!ix) return moe_err_set(err, MOE_ERR_RUNTIME, w->out.path, "out of memory (index)");
    moe_put_u64(ix, w->n_docs);
    moe_put_u64(ix + 8, w->n_sources);
    moe_put_u64(ix + 16, w->strings_len);
    uint8_t *e = ix + MOE_SHARD_INDEX_FIXED;
    for (size_t i = 0; i < w->n_docs; i++, e += MOE_SHARD_DOC_ENTRY) {
        const doc_entry *d = &w->docs[i];
        moe_put_u64(e, d->start);
        moe_put_u64(e + 8, d->length);
        moe_put_u64(e + 16, d->src_start);
        moe_put_u64(e + 24, d->src_end);
        moe_put_u64(e + 32, d->name_off);
        moe_put_u32(e + 40, d->source);
        e[44] = (uint8_t)d->strand;
    }
    for (size_t i = 0; i < w->n_sources; i++, e += 8)
        moe_put_u64(e, w->sources[i]);
    if (w->strings_len) memcpy(e, w->strings, w->strings_len);
    moe_put_u32(ix + 24, moe_crc32(0, ix + MOE_SHARD_INDEX_FIXED, body));
    moe_status st = write_padded(w, ix, total, err);
    free(ix);
    if (st != MOE_OK) return st;
    uint8_t tr[MOE_SHARD_TRAILER];
    moe_put_u64(tr, index_off);
    moe_put_u64(tr + 8, w->n_tokens);
    moe_put_u64(tr + 16, w->n_docs);
    memcpy(tr + 24, MOE_SHARD_TRAILER_MAGIC, 8);
    if (write_padded(w, tr, sizeof tr, err) != MOE_OK) return MOE_ERR_RUNTIME;
    /* patch the header counts when the output can seek (not on a pipe) */
    if (w->out.tmp && fflush(w->out.fp) == 0 &&
        fseek(w->out.fp, MOE_SHARD_OFF_N_TOKENS, SEEK_SET) == 0) {
        uint8_t h[28];
        moe_put_u64(h, w->n_tokens);
        moe_put_u64(h + 8, w->n_docs);
        moe_put_u64(h + 16, index_off);
        moe_put_u32(h + 24, (w->has_mask ? MOE_SHARD_FLAG_MASK : 0) | MOE_SHARD_FLAG_COUNTS);
        if (write_padded(w, h, sizeof h, err) != MOE_OK) return MOE_ERR_RUNTIME;
        if (fseek(w->out.fp, 0, SEEK_END) != 0)
            return moe_err_errno(err, w->out.path, "seeking to the end of the shard");
    }
    return MOE_OK;
}

moe_status moe_shard_writer_commit(moe_shard_writer *w, moe_err *err) {
    moe_status st = w->doc_start == w->n_tokens
                        ? write_tail(w, err)
                        : moe_err_set(err, MOE_ERR_RUNTIME, w->out.path,
                                      "internal error: commit inside an unfinished document");
    if (st == MOE_OK)
        st = moe_outfile_commit(&w->out, err);
    else
        moe_outfile_abort(&w->out);
    writer_free(w);
    return st;
}

void moe_shard_writer_abort(moe_shard_writer *w) {
    if (!w) return;
    moe_outfile_abort(&w->out);
    writer_free(w);
}
