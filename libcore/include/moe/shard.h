/* shard: token shards (.mtok) - writing them streaming, reading them by mmap, and opening
 * sets of them (a file, a directory, a manifest, or stdin) for training.
 *
 * Byte layout in docs/formats.md ("Token shard"). The one thing to know: a shard is only
 * trusted after moe_shard_open* has validated all of it - magic, version, every size
 * against the file length, the document index (contiguous, in bounds), the names, the
 * tokenizer spec (rebuilt, vocabulary hash compared) and every token id < vocab_size - so
 * readers can index tokens without further checks. Errors name the file (and document).
 *
 * The writer streams: header, tokens as documents arrive, then the lower-case mask and the
 * document index and a 32-byte trailer; so it can write to a pipe ("-"). Files go through
 * moe_outfile (temporary name, renamed on commit). */
#ifndef MOE_SHARD_H
#define MOE_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/err.h"
#include "moe/tokenizer.h"

#define MOE_SHARD_MAGIC "MOETOK\0\1" /* 8 bytes */
#define MOE_SHARD_VERSION 1

/* One document of a shard. Strings point into the shard (valid until it is closed). */
typedef struct moe_shard_doc {
    int64_t start;      /* index of its first token in the shard */
    int64_t length;     /* number of tokens (BOS/EOS included) */
    int64_t src_start;  /* 0-based, half-open base range in the source record: for a */
    int64_t src_end;    /*   reverse-complement document, the forward range it covers */
    char strand;        /* '+' or '-' */
    const char *name;   /* record (contig/read) name */
    const char *source; /* input file it came from ("-" for stdin) */
} moe_shard_doc;

typedef struct moe_shard moe_shard; /* opaque, read-only, thread-safe to read */

/* mmap + full validation. */
moe_status moe_shard_open(moe_shard **out, const char *path, moe_err *err);
/* Validates a shard held in memory; with take_ownership the shard free()s data on close.
 * `name` is used in messages. */
moe_status moe_shard_open_memory(moe_shard **out, void *data, size_t size, int take_ownership,
                                 const char *name, moe_err *err);
/* Reads a whole stream (e.g. stdin) into memory and opens it. */
moe_status moe_shard_open_stream(moe_shard **out, FILE *fp, const char *name, moe_err *err);
void moe_shard_close(moe_shard *s);

const char *moe_shard_path(const moe_shard *s);
int64_t moe_shard_n_tokens(const moe_shard *s);
int64_t moe_shard_n_docs(const moe_shard *s);
int moe_shard_token_width(const moe_shard *s); /* 1, 2, or 4 (only kmer k=8) bytes */
int64_t moe_shard_vocab_size(const moe_shard *s);
uint64_t moe_shard_vocab_hash(const moe_shard *s);
int moe_shard_has_mask(const moe_shard *s);
/* The tokenizer spec JSON stored in the shard (NUL-terminated); copy it into checkpoints
 * as tokenizer.json. */
const char *moe_shard_spec_json(const moe_shard *s);
/* The tokenizer rebuilt from the spec during open (owned by the shard). */
const moe_tokenizer *moe_shard_tokenizer(const moe_shard *s);

/* Token i (0 <= i < n_tokens; not range-checked). */
int32_t moe_shard_token(const moe_shard *s, int64_t i);
/* 1 if token i came from lower-case (soft-masked) bases; 0 when the shard has no mask. */
int moe_shard_token_is_lower(const moe_shard *s, int64_t i);
/* Copies tokens [start, start + n) (must be in range) to ids and, when lower is not NULL,
 * their lower-case flags (all 0 without a mask). */
void moe_shard_read_tokens(const moe_shard *s, int64_t start, int64_t n, int32_t *ids /* [n] */,
                           uint8_t *lower /* [n] or NULL */);
/* Document i (0 <= i < n_docs). */
void moe_shard_get_doc(const moe_shard *s, int64_t i, moe_shard_doc *doc);
/* Index of the document containing token i (binary search). */
int64_t moe_shard_find_doc(const moe_shard *s, int64_t token_index);

/* ---- writer ---- */
typedef struct moe_shard_writer moe_shard_writer;

/* Opens path ("-" = stdout) for a shard of tokenizer t (t must outlive the writer). */
moe_status moe_shard_writer_open(moe_shard_writer **out, const char *path, const moe_tokenizer *t,
                                 moe_err *err);
/* Appends one document: ids [n] (each < vocab_size), lower [n] or NULL, and its metadata
 * (doc->start and doc->length are ignored; name and source are copied). */
moe_status moe_shard_writer_add(moe_shard_writer *w, const int32_t *ids, const uint8_t *lower,
                                int64_t n, const moe_shard_doc *doc, moe_err *err);
/* The same in pieces, for documents too long to hold as one array: append their tokens in
 * any number of calls, then end the document with its metadata. add = append + end_doc. */
moe_status moe_shard_writer_append(moe_shard_writer *w, const int32_t *ids, const uint8_t *lower,
                                   int64_t n, moe_err *err);
/* Token packing, split out so that threads can pack while one thread writes: the bytes per
 * token of t's shards (1, 2 or 4), and ids [n] packed little-endian into out [n * width];
 * -1 (out partly written) when an id is outside [0, vocab_size). */
int moe_shard_pack_width(const moe_tokenizer *t);
int moe_shard_pack_tokens(const moe_tokenizer *t, const int32_t *ids /* [n] */, int64_t n,
                          uint8_t *out /* [n * width] */);
/* append with tokens already packed by moe_shard_pack_tokens for this writer's tokenizer. */
moe_status moe_shard_writer_append_packed(moe_shard_writer *w,
                                          const uint8_t *packed /* [n * width] */,
                                          const uint8_t *lower /* [n] or NULL */, int64_t n,
                                          moe_err *err);
moe_status moe_shard_writer_end_doc(moe_shard_writer *w, const moe_shard_doc *doc, moe_err *err);
/* Tokens written so far (including those of an unfinished document) and documents ended. */
int64_t moe_shard_writer_n_tokens(const moe_shard_writer *w);
int64_t moe_shard_writer_n_docs(const moe_shard_writer *w);
/* Writes mask, index and trailer, patches the header when seekable, renames into place;
 * frees the writer whatever the outcome. */
moe_status moe_shard_writer_commit(moe_shard_writer *w, moe_err *err);
/* Removes the temporary file and frees the writer. */
void moe_shard_writer_abort(moe_shard_writer *w);

/* ---- sets of shards (what moe-train --data opens) ---- */
typedef struct moe_shardset moe_shardset;

/* path is one .mtok file, a directory (every *.mtok except *.val.mtok, in name order), a
 * manifest.json written by moe-tokenize, or "-" (stdin read into memory). All shards must
 * share one tokenizer (same vocabulary hash); an empty set is an error. */
moe_status moe_shardset_open(moe_shardset **out, const char *path, moe_err *err);
/* The validation companions of path: for x.mtok -> x.val.mtok; for a directory -> its
 * *.val.mtok; for a manifest -> its "val_shards". *out = NULL and MOE_OK when there are
 * none (stdin has none). */
moe_status moe_shardset_open_val(moe_shardset **out, const char *path, moe_err *err);
void moe_shardset_close(moe_shardset *set);
int64_t moe_shardset_n_shards(const moe_shardset *set);
const moe_shard *moe_shardset_shard(const moe_shardset *set, int64_t i);
int64_t moe_shardset_n_tokens(const moe_shardset *set); /* over all shards */
int64_t moe_shardset_n_docs(const moe_shardset *set);
const char *moe_shardset_spec_json(const moe_shardset *set);
const moe_tokenizer *moe_shardset_tokenizer(const moe_shardset *set);

#endif
