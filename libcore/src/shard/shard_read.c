/* shard_read: opening .mtok shards (mmap, memory, stream) with full validation, and the
 * accessors of moe/shard.h.
 *
 * The one thing to know: validate() checks every offset and size against the file length
 * before anything is dereferenced, in file order (header, tokens, mask, index, strings,
 * trailer), then the tokenizer spec and every token id; after it succeeds the accessors do
 * no checking at all. Each failure message names the file and what was expected. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/fileio.h"
#include "moe/shard.h"
#include "shard/shard_format.h"

struct moe_shard {
    char *path;
    const uint8_t *data;
    size_t size;
    int mapped, owned;
    int width, has_mask;
    uint64_t n_tokens, n_docs, n_sources, strings_size, vocab_size, vocab_hash;
    const uint8_t *tokens, *mask, *docs, *sources;
    const char *strings;
    char *spec; /* NUL-terminated copy */
    moe_tokenizer *tok;
};

static moe_status bad(moe_shard *s, moe_err *err, const char *fmt, unsigned long long a,
                      unsigned long long b) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    moe_err_set(err, MOE_ERR_INPUT, s->path, "not a valid token shard: %s", msg);
    moe_err_hint(err, "the file is truncated, corrupt or not made by moe-tokenize; "
                      "re-create it");
    return MOE_ERR_INPUT;
}

static moe_status bad0(moe_shard *s, moe_err *err, const char *msg) {
    moe_err_set(err, MOE_ERR_INPUT, s->path, "not a valid token shard: %s", msg);
    moe_err_hint(err, "the file is truncated, corrupt or not made by moe-tokenize; "
                      "re-create it");
    return MOE_ERR_INPUT;
}

static moe_status validate(moe_shard *s, moe_err *err) {
    const uint8_t *d = s->data;
    uint64_t size = s->size;
    if (size < 8 || memcmp(d, MOE_SHARD_MAGIC, 8) != 0)
        return bad0(s, err, "wrong magic (expected \"MOETOK\\0\\1\" in the first 8 bytes)");
    if (size < MOE_SHARD_HEADER_FIXED + MOE_SHARD_TRAILER)
        return bad(s, err, "file is %llu bytes, shorter than header + trailer (%llu)", size,
                   MOE_SHARD_HEADER_FIXED + MOE_SHARD_TRAILER);
    uint32_t version = moe_get_u32(d + MOE_SHARD_OFF_VERSION);
    if (version != MOE_SHARD_VERSION)
        return bad(s, err, "format version %llu, this build reads version %llu", version,
                   MOE_SHARD_VERSION);
    uint64_t hsize = moe_get_u32(d + MOE_SHARD_OFF_HEADER_SIZE);
    uint64_t spec_len = moe_get_u32(d + MOE_SHARD_OFF_SPEC_LEN);
    uint32_t flags = moe_get_u32(d + MOE_SHARD_OFF_FLAGS);
    if (hsize != moe_align8(MOE_SHARD_HEADER_FIXED + spec_len) || hsize > size - MOE_SHARD_TRAILER)
        return bad(s, err, "header size %llu does not fit a %llu-byte spec in this file", hsize,
                   spec_len);
    if (flags & ~(uint32_t)(MOE_SHARD_FLAG_MASK | MOE_SHARD_FLAG_COUNTS))
        return bad(s, err, "unknown flags 0x%llx (version %llu)", flags, version);
    s->has_mask = (flags & MOE_SHARD_FLAG_MASK) != 0;
    s->vocab_size = moe_get_u64(d + MOE_SHARD_OFF_VOCAB_SIZE);
    s->vocab_hash = moe_get_u64(d + MOE_SHARD_OFF_VOCAB_HASH);
    s->width = (int)moe_get_u32(d + MOE_SHARD_OFF_WIDTH);
    if (s->vocab_size == 0 || s->vocab_size > (1ull << 31) ||
        s->width != moe_shard_width_for_vocab((int64_t)s->vocab_size))
        return bad(s, err, "token width %llu does not match vocabulary size %llu",
                   (unsigned long long)s->width, s->vocab_size);
    /* trailer */
    const uint8_t *tr = d + size - MOE_SHARD_TRAILER;
    if (memcmp(tr + 24, MOE_SHARD_TRAILER_MAGIC, 8) != 0)
        return bad(s, err,
                   "trailer magic \"MOETEND\" missing at the end of the %llu-byte file "
                   "(%llu tokens written?): truncated?",
                   size, moe_get_u64(d + MOE_SHARD_OFF_N_TOKENS));
    uint64_t index_off = moe_get_u64(tr);
    s->n_tokens = moe_get_u64(tr + 8);
    s->n_docs = moe_get_u64(tr + 16);
    if ((flags & MOE_SHARD_FLAG_COUNTS) &&
        (moe_get_u64(d + MOE_SHARD_OFF_N_TOKENS) != s->n_tokens ||
         moe_get_u64(d + MOE_SHARD_OFF_N_DOCS) != s->n_docs ||
         moe_get_u64(d + MOE_SHARD_OFF_INDEX) != index_off))
        return bad(s, err, "header counts (%llu tokens) disagree with the trailer (%llu)",
                   moe_get_u64(d + MOE_SHARD_OFF_N_TOKENS), s->n_tokens);
    /* tokens and mask: sizes first, in a way that cannot overflow */
    if (s->n_tokens > (size - hsize) / (uint64_t)s->width)
        return bad(s, err, "%llu tokens do not fit in a %llu-byte file", s->n_tokens, size);
    uint64_t pos = moe_align8(hsize + s->n_tokens * (uint64_t)s->width);
    s->tokens = d + hsize;
    if (s->has_mask) {
        s->mask = d + pos;
        pos += moe_align8((s->n_tokens + 7) / 8);
    }
    if (index_off != pos || pos > size - MOE_SHARD_TRAILER - MOE_SHARD_INDEX_FIXED)
        return bad(s, err, "index offset %llu, expected %llu after the tokens", index_off, pos);
    const uint8_t *ix = d + index_off;
    uint64_t avail = size - MOE_SHARD_TRAILER - index_off - MOE_SHARD_INDEX_FIXED;
    s->n_sources = moe_get_u64(ix + 8);
    s->strings_size = moe_get_u64(ix + 16);
    if (moe_get_u64(ix) != s->n_docs)
        return bad(s, err, "index has %llu documents, trailer says %llu", moe_get_u64(ix),
                   s->n_docs);
    /* each term is bounded by avail first, so the sum cannot overflow */
    if (s->n_docs > avail / MOE_SHARD_DOC_ENTRY || s->n_sources > avail / 8 ||
        s->strings_size > avail ||
        avail != s->n_docs * MOE_SHARD_DOC_ENTRY + s->n_sources * 8 + moe_align8(s->strings_size))
        return bad(s, err,
                   "index sizes (%llu documents, %llu bytes of names) do not match the "
                   "file length",
                   s->n_docs, s->strings_size);
    uint64_t body = s->n_docs * MOE_SHARD_DOC_ENTRY + s->n_sources * 8 + s->strings_size;
    uint32_t crc = moe_crc32(0, ix + MOE_SHARD_INDEX_FIXED, (size_t)body);
    if (crc != moe_get_u32(ix + 24) || moe_get_u32(ix + 28) != 0)
        return bad(s, err, "document index checksum %08llx, expected %08llx: the index is damaged",
                   crc, moe_get_u32(ix + 24));
    s->docs = ix + MOE_SHARD_INDEX_FIXED;
    s->sources = s->docs + s->n_docs * MOE_SHARD_DOC_ENTRY;
    s->strings = (const char *)(s->sources + s->n_sources * 8);
    if (s->strings_size && s->strings[s->strings_size - 1] != '\0')
        return bad0(s, err, "name table is not NUL-terminated");
    for (uint64_t i = 0; i < s->n_sources; i++)
        if (moe_get_u64(s->sources + 8 * i) >= s->strings_size)
            return bad(s, err, "source %llu has a name offset outside the name table (%llu)", i,
                       moe_get_u64(s->sources + 8 * i));
    uint64_t expect = 0;
    for (uint64_t i = 0; i < s->n_docs; i++) {
        const uint8_t *e = s->docs + i * MOE_SHARD_DOC_ENTRY;
        uint64_t start = moe_get_u64(e), len = moe_get_u64(e + 8);
        if (start != expect || len > s->n_tokens - start)
            return bad(s, err,
                       "document %llu starts at token %llu: documents must be "
                       "contiguous and inside the token array",
                       i + 1, start);
        expect = start + len;
        if (moe_get_u64(e + 16) > moe_get_u64(e + 24) || moe_get_u64(e + 32) >= s->strings_size ||
            moe_get_u32(e + 40) >= s->n_sources || (e[44] != '+' && e[44] != '-'))
            return bad(s, err,
                       "document %llu (of %llu) has bad coordinates, name, source or strand", i + 1,
                       s->n_docs);
    }
    if (expect != s->n_tokens)
        return bad(s, err, "documents cover %llu of %llu tokens", expect, s->n_tokens);
    return MOE_OK;
}

/* The spec must rebuild into the tokenizer the header names, and all ids must be in range. */
static moe_status validate_content(moe_shard *s, moe_err *err) {
    uint64_t spec_len = moe_get_u32(s->data + MOE_SHARD_OFF_SPEC_LEN);
    s->spec = malloc(spec_len + 1);
    if (!s->spec) return moe_err_set(err, MOE_ERR_RUNTIME, s->path, "out of memory");
    memcpy(s->spec, s->data + MOE_SHARD_HEADER_FIXED, spec_len);
    s->spec[spec_len] = '\0';
    if (moe_tokenizer_from_json(&s->tok, s->spec, s->path, err) != MOE_OK) return MOE_ERR_INPUT;
    if ((uint64_t)s->tok->vocab_size != s->vocab_size || s->tok->vocab_hash != s->vocab_hash ||
        (uint32_t)s->tok->kind != moe_get_u32(s->data + MOE_SHARD_OFF_TOKENIZER))
        return bad(s, err,
                   "header vocabulary (size %llu) disagrees with the stored tokenizer "
                   "spec (size %llu)",
                   s->vocab_size, (unsigned long long)s->tok->vocab_size);
    if (s->has_mask != (s->tok->opts.case_policy == MOE_CASE_UPPER_MASK))
        return bad0(s, err, "the header's mask flag disagrees with the spec's case policy");
    if (s->width == 1 && s->vocab_size >= 256) return MOE_OK;
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        uint64_t id = (uint64_t)moe_shard_token(s, (int64_t)i);
        if (id >= s->vocab_size)
            return bad(s, err, "token %llu has id %llu, outside the vocabulary", i, id);
    }
    return MOE_OK;
}

void moe_shard_close(moe_shard *s) {
    if (!s) return;
    if (s->mapped)
        munmap((void *)s->data, s->size);
    else if (s->owned)
        free((void *)s->data);
    moe_tokenizer_free(s->tok);
    free(s->spec);
    free(s->path);
    free(s);
}

static moe_status finish_open(moe_shard *s, moe_shard **out, moe_err *err) {
    moe_status st = validate(s, err);
    if (st == MOE_OK) st = validate_content(s, err);
    if (st != MOE_OK) {
        moe_shard_close(s);
        return st;
    }
    *out = s;
    return MOE_OK;
}

static moe_shard *shard_new(const char *name, moe_err *err) {
    moe_shard *s = calloc(1, sizeof *s);
    if (s && !(s->path = strdup(name))) {
        free(s);
        s = NULL;
    }
    if (!s) moe_err_set(err, MOE_ERR_RUNTIME, name, "out of memory");
    return s;
}

moe_status moe_shard_open(moe_shard **out, const char *path, moe_err *err) {
    *out = NULL;
    if (strcmp(path, "-") == 0) return moe_shard_open_stream(out, stdin, "-", err);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        moe_err_set(err, MOE_ERR_INPUT, path, "cannot open shard: %s", strerror(errno));
        return MOE_ERR_INPUT;
    }
    struct stat stt;
    if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode)) {
        close(fd);
        moe_err_set(err, MOE_ERR_INPUT, path, "not a regular file");
        return MOE_ERR_INPUT;
    }
    moe_shard *s = shard_new(path, err);
    if (!s) {
        close(fd);
        return MOE_ERR_RUNTIME;
    }
    s->size = (size_t)stt.st_size;
    if (s->size == 0) {
        close(fd);
        moe_shard_close(s);
        moe_err_set(err, MOE_ERR_INPUT, path, "shard file is empty");
        return MOE_ERR_INPUT;
    }
    void *p = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        moe_err_errno(err, path, "cannot mmap shard");
        moe_shard_close(s);
        return MOE_ERR_RUNTIME;
    }
    s->data = p;
    s->mapped = 1;
    return finish_open(s, out, err);
}

moe_status moe_shard_open_memory(moe_shard **out, void *data, size_t size, int take_ownership,
                                 const char *name, moe_err *err) {
    *out = NULL;
    moe_shard *s = shard_new(name ? name : "(memory)", err);
    if (!s) {
        if (take_ownership) free(data);
        return MOE_ERR_RUNTIME;
    }
    s->data = data;
    s->size = size;
    s->owned = take_ownership;
    return finish_open(s, out, err);
}

moe_status moe_shard_open_stream(moe_shard **out, FILE *fp, const char *name, moe_err *err) {
    *out = NULL;
    char *buf;
    size_t n;
    moe_status st = moe_read_stream(fp, name, &buf, &n, err);
    if (st != MOE_OK) return st;
    if (n == 0) {
        free(buf);
        moe_err_set(err, MOE_ERR_INPUT, name, "the stream is empty: no token shard");
        moe_err_hint(err, "the program writing the stream may have failed; see its messages");
        return MOE_ERR_INPUT;
    }
    return moe_shard_open_memory(out, buf, n, 1, name, err);
}

const char *moe_shard_path(const moe_shard *s) {
    return s->path;
}
int64_t moe_shard_n_tokens(const moe_shard *s) {
    return (int64_t)s->n_tokens;
}
int64_t moe_shard_n_docs(const moe_shard *s) {
    return (int64_t)s->n_docs;
}
int moe_shard_token_width(const moe_shard *s) {
    return s->width;
}
int64_t moe_shard_vocab_size(const moe_shard *s) {
    return (int64_t)s->vocab_size;
}
uint64_t moe_shard_vocab_hash(const moe_shard *s) {
    return s->vocab_hash;
}
int moe_shard_has_mask(const moe_shard *s) {
    return s->has_mask;
}
const char *moe_shard_spec_json(const moe_shard *s) {
    return s->spec;
}
const moe_tokenizer *moe_shard_tokenizer(const moe_shard *s) {
    return s->tok;
}

int32_t moe_shard_token(const moe_shard *s, int64_t i) {
    if (s->width == 1) return s->tokens[i];
    if (s->width == 2) return (int32_t)(s->tokens[2 * i] | (s->tokens[2 * i + 1] << 8));
    return (int32_t)moe_get_u32(s->tokens + 4 * i);
}

int moe_shard_token_is_lower(const moe_shard *s, int64_t i) {
    return s->has_mask ? (s->mask[i / 8] >> (i % 8)) & 1 : 0;
}

void moe_shard_read_tokens(const moe_shard *s, int64_t start, int64_t n, int32_t *ids,
                           uint8_t *lower) {
    if (s->width == 1) {
        const uint8_t *t = s->tokens + start;
        for (int64_t i = 0; i < n; i++)
            ids[i] = t[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            ids[i] = moe_shard_token(s, start + i);
    }
    if (lower)
        for (int64_t i = 0; i < n; i++)
            lower[i] = (uint8_t)moe_shard_token_is_lower(s, start + i);
}

void moe_shard_get_doc(const moe_shard *s, int64_t i, moe_shard_doc *doc) {
    const uint8_t *e = s->docs + (uint64_t)i * MOE_SHARD_DOC_ENTRY;
    doc->start = (int64_t)moe_get_u64(e);
    doc->length = (int64_t)moe_get_u64(e + 8);
    doc->src_start = (int64_t)moe_get_u64(e + 16);
    doc->src_end = (int64_t)moe_get_u64(e + 24);
    doc->name = s->strings + moe_get_u64(e + 32);
    doc->source = s->strings + moe_get_u64(s->sources + 8 * (uint64_t)moe_get_u32(e + 40));
    doc->strand = (char)e[44];
}

int64_t moe_shard_find_doc(const moe_shard *s, int64_t token_index) {
    int64_t lo = 0, hi = (int64_t)s->n_docs - 1;
    while (lo < hi) { /* last doc whose start <= token_index */
        int64_t mid = lo + (hi - lo + 1) / 2;
        if ((int64_t)moe_get_u64(s->docs + (uint64_t)mid * MOE_SHARD_DOC_ENTRY) <= token_index)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}
