/* tokenize_impl: the three parts of moe_tokenize_run and what passes between them.
 *
 *   encoder (tokenize.c)      records -> documents, packed tokens, in a tok_docbuf
 *   output (tokenize_out.c)   tok_docbuf -> train/val shard writers, rollover, manifest
 *   pool (tokenize_pool.c)    -@ N >= 2: a reader thread, encoder threads, this thread writing
 *   merge (tokenize_merge.c)  the outputs of --part runs -> the output of one run
 *
 * The one thing to know: a tok_docbuf holds finished documents in input order, and the
 * output writes them in that order whoever encoded them, so the bytes do not depend on the
 * number of threads. One thread (-@ 1) encodes and writes through the same buffer. */
#ifndef MOE_TOKENIZE_IMPL_H
#define MOE_TOKENIZE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "moe/shard.h"
#include "moe/tokenize.h"

/* One document of a tok_docbuf (its tokens follow the previous document's). */
typedef struct tok_doc {
    int64_t n_tokens;
    int64_t src_start, src_end;
    size_t name_off; /* into tok_docbuf.names */
    int input;       /* index into moe_tokenize_opts.inputs */
    char strand;
    int is_val;
} tok_doc;

/* Documents of consecutive records, tokens packed as the shard stores them. */
typedef struct tok_docbuf {
    uint8_t *packed; /* [n_tokens * width] */
    uint8_t *lower;  /* [n_tokens] lower-case flags, only with --case upper+mask */
    int64_t n_tokens, cap_tokens;
    tok_doc *docs;
    int64_t n_docs, cap_docs;
    char *names;
    size_t names_len, names_cap;
    int open, open_val;  /* a document is being appended (and its stream) */
    int64_t open_tokens; /* its tokens so far, including those already written */
    int64_t carry;       /* tokens of the first document written by an earlier tok_out_write */
    int64_t records, bases, filtered, empty; /* counted into the summary when written */
    moe_status status;                       /* an error after these documents */
    moe_err err;
} tok_docbuf;

void tok_docbuf_reset(tok_docbuf *b);
/* Room for n more tokens (packed at width bytes; with their lower-case flags when
 * with_lower, the same on every call for one buffer), one more document and name_bytes
 * more of names; -1 when out of memory. */
int tok_docbuf_reserve(tok_docbuf *b, int64_t n, int width, int with_lower, size_t name_bytes);
void tok_docbuf_free(tok_docbuf *b);

/* Per-thread encoding state. tok is shared (read-only). */
typedef struct tok_enc {
    const moe_tokenize_opts *o;
    const moe_tokenizer *tok;
    int width, has_mask;
    moe_token_buf enc, doc;
    char *rc_buf, *clean_buf; /* reverse complement; bases of a raw FASTA record */
    size_t rc_cap, clean_cap;
    tok_docbuf *out;
    /* -@ 1: called when out holds more than TOK_FLUSH_BYTES, to write it straight away (a
       chromosome then needs no buffer of its size); NULL in encoder threads */
    moe_status (*flush)(void *arg, tok_docbuf *b, moe_err *err);
    void *flush_arg;
} tok_enc;

#define TOK_FLUSH_BYTES ((size_t)8 << 20)

void tok_enc_init(tok_enc *e, const moe_tokenize_opts *o, const moe_tokenizer *tok);
void tok_enc_free(tok_enc *e);
/* Encodes one record (input = its index in o->inputs; raw FASTA text is cleaned first) into
 * e->out. */
moe_status tok_enc_record(tok_enc *e, const moe_seq_record *rec, int input, moe_err *err);

/* The output side: train and validation streams of shard files, as o->output and
 * o->shard_tokens say; document sources are o->inputs[doc.input]; with_val: the validation
 * output is written (even if empty); progress is shown in `unit`, "bases" or "tokens". */
typedef struct tok_out tok_out;
moe_status tok_out_open(tok_out **out, const moe_tokenize_opts *o, const moe_tokenizer *tok,
                        int with_val, const char *unit, moe_err *err);
/* Writes everything in b (finished documents and the open one's tokens so far) and empties
 * it, keeping the open document open; then returns b->status (b->err copied to err). */
moe_status tok_out_write(tok_out *out, tok_docbuf *b, moe_err *err);
/* Commits the last shards and the manifest (st == MOE_OK), or removes every file this run
 * wrote; frees out; returns st or the commit error. */
moe_status tok_out_finish(tok_out *out, moe_status st, moe_tokenize_summary *sum, moe_err *err);

/* -@ N >= 2: reads, encodes and writes all inputs with N threads. */
moe_status tok_pool_run(const moe_tokenize_opts *o, const moe_tokenizer *tok, tok_out *out,
                        moe_err *err);

#endif
