/* tokenize: the moe-tokenize pipeline - sequence files in, token shards out - plus the
 * `stats` and `decode` views of shards.
 *
 * Records are read in input order (seqio), turned into documents by the document policies
 * of the tokenizer spec (N-run split, reverse complement, windows, minimum length,
 * BOS/EOS), and written in that same order, so the output bytes never depend on the
 * number of threads. The one thing to know: the train/validation split hashes the record
 * name, so every piece of a record lands on the same side - except non-overlapping windows
 * (--window W --stride >= W, no reverse-complement copy), which split one by one under the
 * key "name/index", so a single long genome still gets a validation part. */
#ifndef MOE_TOKENIZE_H
#define MOE_TOKENIZE_H

#include <stdint.h>
#include <stdio.h>

#include "moe/err.h"
#include "moe/seqio.h"
#include "moe/tokenizer.h"

typedef struct moe_tokenize_opts {
    moe_tokenizer_opts tok;
    moe_seqio_opts io;
    const char *const *inputs; /* files, "-" = stdin */
    int n_inputs;
    const char *output;   /* "x.mtok", "dir/" (directory of shards), "-" or NULL = stdout */
    int64_t shard_tokens; /* directory output: start a new shard after this many tokens
                             (at a document boundary); 0 = one shard */
    double val_fraction;  /* 0..1: documents whose name hash falls below go to *.val.mtok */
    int threads;          /* total threads (1 = everything on the calling thread) */
} moe_tokenize_opts;

void moe_tokenize_opts_defaults(moe_tokenize_opts *o);

typedef struct moe_tokenize_summary {
    int64_t records, filtered, empty, docs, tokens, bases, val_docs, val_tokens, shards;
} moe_tokenize_summary;

/* Runs the pipeline. summary may be NULL. On failure nothing is left under a final name. */
moe_status moe_tokenize_run(const moe_tokenize_opts *o, moe_tokenize_summary *summary,
                            moe_err *err);

/* `moe-tokenize merge`: the outputs of the runs `--part 1/N` .. `N/N` (each a FILE.mtok or a
 * DIR/, with their validation companions), in part order, written to output (FILE.mtok,
 * DIR/ or "-") exactly as one run over the whole input with that -o and shard_tokens
 * would have written it. summary counts documents and tokens only. */
moe_status moe_tokenize_merge(const char *const *parts, int n_parts, const char *output,
                              int64_t shard_tokens, moe_tokenize_summary *summary, moe_err *err);

/* 1 when a split key (record name, or "name/index" for a window) goes to validation:
 * (splitmix64(FNV-1a-64(key)) >> 11) * 2^-53 < f. See docs/formats.md. */
int moe_tokenize_is_val(const char *key, double f);

/* `moe-tokenize stats`: counts, per-token frequencies, length histogram and the spec of
 * each file (one shard or a directory/manifest), as text or JSON. */
moe_status moe_tokenize_stats(const char *const *paths, int n_paths, int json, FILE *out,
                              moe_err *err);
/* `moe-tokenize decode`: documents back to FASTA (line width `width`, 0 = one line). */
moe_status moe_tokenize_decode(const char *path, int width, FILE *out, moe_err *err);

#endif
