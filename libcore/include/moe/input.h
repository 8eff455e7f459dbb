/* input: the sequences the inference programs (moe-embed, moe-score) read, as token ids.
 *
 * One path - a FASTA/FASTQ/SAM/BAM/CRAM file or "-" (moe/seqio.h, with its filters and
 * regions), a .mtok shard, a directory of shards or a manifest.json - yields one callback
 * per sequence: its content tokens (no BOS/EOS), tokenized with the checkpoint's tokenizer,
 * and on request the tokens of its reverse complement. The one thing to know: a shard must
 * have been written with that same tokenizer (vocabulary hash), and its documents' own
 * BOS/EOS are stripped, so shard documents and sequence records look alike to the caller. */
#ifndef MOE_INPUT_H
#define MOE_INPUT_H

#include <stdint.h>

#include "moe/err.h"
#include "moe/seqio.h"
#include "moe/tokenizer.h"

typedef struct moe_input_seq { /* valid during the callback only */
    const char *name;
    int64_t bases;      /* bases in the record (the source range for shard documents) */
    const int32_t *ids; /* [n] content tokens */
    int64_t n;
    const int32_t *rc;  /* [n] tokens of the reverse complement, or NULL */
    int64_t src_start;  /* first base of the bases in the source (region offset) */
    char strand;        /* '+', or '-' (reverse-complement document, reverse-strand read) */
    int flip;           /* 1: the bases are the reverse complement of [src_start, +bases) */
    const int64_t *pos; /* [n] first base of each token in the bases, or NULL: back to back */
} moe_input_seq;

/* Called once per sequence, in input order; a status other than MOE_OK stops the read. */
typedef moe_status (*moe_input_fn)(void *ctx, const moe_input_seq *s, moe_err *err);

/* Reads every sequence of path (kind sniffed: shards by their magic, directories and
 * manifest.json as shard sets, anything else through seqio with io). with_rc: also the
 * reverse complement's tokens, which needs one base per token (moe_input_check_rc).
 * Errors name the file and the record or document. */
moe_status moe_input_read(const char *path, const moe_seqio_opts *io, const moe_tokenizer *tok,
                          int with_rc, moe_input_fn fn, void *ctx, moe_err *err);
/* MOE_ERR_INPUT unless tok maps one base to one token (what --rc-average needs). */
moe_status moe_input_check_rc(const moe_tokenizer *tok, moe_err *err);

#endif
