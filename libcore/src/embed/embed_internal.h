/* embed_internal: the state moe_embed_run shares between embed.c (reading, windows,
 * batches) and embed_out.c (rows to .npy + .ids.tsv, or TSV text). Private to libcore. */
#ifndef MOE_EMBED_INTERNAL_H
#define MOE_EMBED_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "moe/embed.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/npy.h"

typedef struct embed_seq { /* one input sequence of the current chunk */
    char *name;
    int64_t bases;     /* bases in the record (the source range for shard documents) */
    int64_t n;         /* content tokens (no BOS/EOS) */
    int32_t *ids;      /* [n] */
    int32_t *rc;       /* [n] tokens of the reverse complement, or NULL */
    int64_t n_win;     /* windows per strand */
    double *acc;       /* pooled [C]; per-window [n_win, C]; per-token [n, C] */
    int32_t *cover;    /* per-token: [n] windows (and strands) covering each token */
    int64_t *span;     /* [n, 2] base range [start, end) of each token in the record's bases */
    int64_t src_start; /* first base of the record's bases in the source (region offset) */
    char strand;       /* '+', or '-' for a reverse-complement or reverse-strand record */
    int flip;          /* 1: the bases are the reverse complement of [src_start, +bases) */
} embed_seq;

typedef struct embed_out {
    int tsv; /* TSV text on stdout instead of .npy */
    moe_npy_writer npy;
    int npy_open;
    moe_outfile ids, offs; /* FILE.ids.tsv; FILE.offsets.tsv (--per-token) */
    int ids_open, offs_open;
    char ids_path[4200], offs_path[4200];
    int64_t rows, seq_rows; /* npy rows written, sequences written */
    float *row;             /* [C] scratch */
    int64_t C;
} embed_out;

/* Opens the outputs; prov (one line, no newline, or NULL) is written as the ids table's
 * first line after '#'. */
moe_status moe_embed_out_open(embed_out *w, const moe_embed_opts *o, int64_t C, const char *prov,
                              moe_err *err);
/* Writes the rows of one finished sequence (its acc already divided into means). */
moe_status moe_embed_out_seq(embed_out *w, const moe_embed_opts *o, const embed_seq *s,
                             int64_t stride, int64_t window, moe_err *err);
moe_status moe_embed_out_commit(embed_out *w, moe_err *err);
void moe_embed_out_abort(embed_out *w);

#endif
