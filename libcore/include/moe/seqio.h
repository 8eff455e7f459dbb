/* seqio: sequence readers for FASTA, FASTQ (plain, gzip, bgzip), SAM, BAM and CRAM.
 *
 * A reader yields records: name, bases with their case kept, optional qualities, and the
 * source coordinates the bases cover. FASTA/FASTQ are parsed from htslib's BGZF layer
 * (never sam_read1, which upper-cases and turns U into N) with line numbers for errors;
 * SAM/BAM/CRAM go through htslib with a read filter and reverse-strand reads restored to
 * their sequenced orientation. The one thing to know: htslib is never allowed to fetch a
 * CRAM reference from the network - REF_PATH/REF_CACHE are pointed at nothing unless the
 * user set them, and a CRAM that needs a reference fails with a hint to pass one.
 * Used by moe-tokenize and moe-embed. */
#ifndef MOE_SEQIO_H
#define MOE_SEQIO_H

#include <stdint.h>

#include "moe/err.h"

typedef enum moe_seq_format {
    MOE_SEQ_UNKNOWN = 0,
    MOE_SEQ_FASTA,
    MOE_SEQ_FASTQ,
    MOE_SEQ_SAM,
    MOE_SEQ_BAM,
    MOE_SEQ_CRAM,
} moe_seq_format;

/* Default read filter: secondary | QC-fail | duplicate | supplementary. */
#define MOE_SEQIO_DEFAULT_EXCLUDE 0xF00u

struct hts_tpool;

typedef struct moe_seqio_opts {
    const char *reference;  /* FASTA for CRAM decoding (NULL: none) */
    int threads;            /* htslib decompression threads beyond the main one (0 = none;
                               files under 256 kB are read without them) */
    struct hts_tpool *pool; /* with threads: a pool of that many, shared by every reader opened
                               with it (outliving them); NULL: each reader starts its own */
    int read_ahead;         /* with pool: BGZF blocks of FASTA/FASTQ/BAM decompressed ahead of
                               the reader at most (0: 2 x threads; CRAM always uses that) */
    int min_mapq;           /* SAM/BAM/CRAM: drop records with MAPQ below (0 = keep all) */
    uint32_t require_flags; /* keep only records with all these flags */
    uint32_t exclude_flags; /* drop records with any of these (default 0xF00) */
    int as_stored;          /* keep reverse-strand reads as stored (no reverse complement) */
    int part, n_parts;      /* read only part `part` (0-based) of n_parts: see moe_seqio_open */
    int skip_qual;          /* SAM/BAM/CRAM: leave record.qual NULL (saves converting them) */
    int raw;       /* FASTA and BAM/CRAM records may come undecoded (record.raw): the caller
                      decodes them with moe_seqio_decode, e.g. on other threads */
    int keep_text; /* with raw, FASTA: the text of the records returned stays in the reader
                      until moe_seqio_take_text hands it over (no copy of it is needed) */
    const char *const *regions; /* "chr", "chr:beg-end" (1-based inclusive); NULL = all */
    int n_regions;
} moe_seqio_opts;

/* Also points REF_PATH/REF_CACHE nowhere unless the user set them (call it before starting
 * threads): htslib then never fetches a CRAM reference from the network. */
void moe_seqio_opts_defaults(moe_seqio_opts *o);

/* One record. Buffers are owned by the reader and overwritten by the next call. */
typedef struct moe_seq_record {
    const char *name;    /* up to the first white space */
    const char *comment; /* rest of the header line ("" if none) */
    const char *seq;     /* bases, case as in the input, NUL-terminated */
    int64_t len;
    const char *qual;  /* FASTQ/BAM qualities (phred+33 text) or NULL */
    int64_t src_start; /* 0-based half-open range of the bases in the source record: */
    int64_t src_end;   /*   0..len, or the region's range in its contig (FASTA regions) */
    char strand;       /* '-' for a reverse-strand read restored to sequenced order */
    int64_t record_no; /* 1-based record ordinal in the file (filtered ones counted) */
    int64_t line;      /* FASTA/FASTQ: line of its header; 0 otherwise */
    int raw;           /* 0, or seq is not bases yet (moe_seq_raw): see moe_seqio_decode */
    int64_t ordinal;   /* 1-based among the records of the whole file that pass the filter and
                          have bases (other parts' included) */
} moe_seq_record;

typedef struct moe_seq_reader moe_seq_reader; /* opaque */

/* Opens path ("-" = stdin), detecting the format from its content. MOE_ERR_INPUT for a
 * missing file, an unknown format, regions on an unindexed input.
 * Parts (n_parts > 1): the file is cut into n_parts deterministic parts whose records, read
 * one after another, are exactly the records of the whole file. FASTA, FASTQ and BAM: a
 * record belongs to the part whose share of the file's bytes ([part, part + 1) * size /
 * n_parts) holds the compressed position of its start (the BGZF block, or htslib's piece
 * of a plain or gzip file, its first byte came from), whatever the other options; a part
 * reads (without decoding) the records before its share and stops after it, except that a
 * bgzip FASTA whose .fai/.gzi match the text seeks to its share's first record. CRAM
 * (coordinate-sorted): a part is a run of whole reference sequences, balanced by length,
 * the last part also holding the unplaced reads; a part decodes the records before its own
 * too. Not for stdin, SAM or with regions. */
moe_status moe_seqio_open(moe_seq_reader **out, const char *path, const moe_seqio_opts *o,
                          moe_err *err);
/* Reads the next record that passes the filter. Returns 1 with a record, 0 at the end of
 * input, -1 on error (err set with file, line and/or record). Empty records are skipped
 * with a warning. */
int moe_seqio_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err);
moe_seq_format moe_seqio_format(const moe_seq_reader *r);
const char *moe_seqio_format_name(moe_seq_format f); /* "FASTA", "BAM", ... */
/* Records read / skipped by the filter / skipped as empty, so far. */
int64_t moe_seqio_n_read(const moe_seq_reader *r);
int64_t moe_seqio_n_filtered(const moe_seq_reader *r);
int64_t moe_seqio_n_empty(const moe_seq_reader *r);
/* The last record.ordinal given so far (other parts' records counted). */
int64_t moe_seqio_n_kept(const moe_seq_reader *r);
void moe_seqio_close(moe_seq_reader *r);

/* The size of path when it is a regular file compressed with plain gzip (not BGZF: one
 * thread must decompress it from start to end), else 0. */
int64_t moe_seqio_plain_gzip_size(const char *path);

/* Reads a BED file (chrom, 0-based start, end; '#', "track", "browser" lines skipped) into
 * region strings "chrom:start+1-end"; *regions is an array of n malloc'ed strings, free with
 * moe_seqio_free_regions. */
moe_status moe_seqio_read_bed(const char *path, char ***regions, int *n, moe_err *err);
void moe_seqio_free_regions(char **regions, int n);

/* What record.seq holds when record.raw is set (moe_seqio_opts.raw): moe_seqio_seq_bytes
 * bytes, not NUL-terminated. */
typedef enum moe_seq_raw {
    MOE_SEQ_RAW_TEXT = 1, /* FASTA text [len] with its line breaks and blanks; len is the text's
                             length, an upper bound of the bases */
    MOE_SEQ_RAW_NT16 = 2, /* BAM 4-bit codes [(len + 1) / 2] of len bases, as stored; strand '-'
                             means they are still to be reverse-complemented */
} moe_seq_raw;
/* Bytes of rec->seq (the NUL after them not counted). */
int64_t moe_seqio_seq_bytes(const moe_seq_record *rec);
/* The bases of rec into out [rec->len + 1], NUL-terminated; returns their number. A record
 * that is not raw is copied. */
int64_t moe_seqio_decode(const moe_seq_record *rec, char *out);

/* opts.keep_text (raw FASTA): the offset of rec->seq (a record just returned) in the text
 * that the next moe_seqio_take_text hands over; -1 for a reader that keeps no text. */
int64_t moe_seqio_text_offset(const moe_seq_reader *r, const moe_seq_record *rec);
/* opts.keep_text: hands the text of every record returned since the open or the last call
 * to the caller and goes on reading in spare [spare_cap] (NULL: a new buffer when needed).
 * 1: *text (malloc'ed, *cap bytes, NULL when nothing was read) is the caller's, to free or
 * give back later as spare, and spare is the reader's; 0: r keeps no text, spare stays the
 * caller's; -1: out of memory (err set), spare stays the caller's. */
int moe_seqio_take_text(moe_seq_reader *r, char *spare, size_t spare_cap, char **text, size_t *cap,
                        moe_err *err);

/* Reverse complement of seq[0, n) in place (IUPAC codes complemented, case kept, other
 * bytes unchanged). */
void moe_seqio_revcomp(char *seq, int64_t n);

#endif
