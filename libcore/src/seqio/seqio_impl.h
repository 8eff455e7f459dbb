/* seqio_impl: the reader struct shared by seqio.c (open, dispatch), seqio_fastx.c (FASTA,
 * FASTQ from BGZF), seqio_seek.c (where a FASTA part starts) and seqio_hts.c (SAM/BAM/CRAM,
 * indexed FASTA regions).
 *
 * The one thing to know: exactly one of bgzf / hts / fai is open, chosen by the detected
 * format and whether regions were given. */
#ifndef MOE_SEQIO_IMPL_H
#define MOE_SEQIO_IMPL_H

#include <htslib/bgzf.h>
#include <htslib/faidx.h>
#include <htslib/hts.h>
#include <htslib/kstring.h>
#include <htslib/sam.h>

#include "moe/seqio.h"

struct moe_seq_reader {
    char *path;
    moe_seq_format fmt;
    moe_seqio_opts opts;
    char **regions; /* owned copies of opts.regions */
    int n_regions;
    /* FASTA/FASTQ */
    BGZF *bgzf;
    kstring_t line; /* current line (CR stripped) */
    int have_line;  /* line holds an unconsumed header of the next record */
    int64_t lineno;
    kstring_t name, comment, seq, qual;
    kstring_t blk; /* FASTA: decompressed text, unread from blk_pos */
    size_t blk_pos;
    size_t blk_next; /* bytes the next fill reads (0: the first, 64 KB), growing to 1 MB */
    int blk_eof;
    int blk_handed; /* keep_text: records were returned since the last moe_seqio_take_text */
    /* SAM/BAM/CRAM */
    htsFile *hts;
    sam_hdr_t *hdr;
    bam1_t *b;
    hts_idx_t *idx;
    hts_itr_t *itr;
    /* indexed FASTA regions */
    faidx_t *fai;
    char *fai_seq;
    int region_i;
    /* parts: records whose start lies at compressed offsets [part_lo, part_hi) */
    int64_t part_lo, part_hi;
    int part_by_pos; /* ownership by position (FASTA, FASTQ, BAM) */
    int *tid_owner;  /* CRAM: the part of each reference sequence [n_tids + 1, unplaced last] */
    int n_tids, last_tid;
    int64_t line_key; /* FASTQ: compressed position of the line read last */
    /* FASTA parts: blk [seg_off[i], seg_off[i + 1]) came from the block at seg_key[i] */
    size_t *seg_off;
    int64_t *seg_key;
    size_t n_seg, cap_seg;
    /* counters */
    int64_t record_no, n_read, n_filtered, n_empty, n_kept;
};

int moe_seqio_fastx_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err);
int moe_seqio_sam_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err);
int moe_seqio_fai_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err);
/* Opens r->hts (already hopen'ed as hf) with reference, threads and regions. */
moe_status moe_seqio_sam_open(moe_seq_reader *r, struct hFILE *hf, moe_err *err);
moe_status moe_seqio_fai_open(moe_seq_reader *r, moe_err *err);
/* How many BGZF blocks (CRAM: containers) r's pool decompresses ahead of it at most. */
int moe_seqio_read_ahead(const moe_seq_reader *r);
/* Points REF_PATH/REF_CACHE nowhere unless the user set them (idempotent). */
void moe_seqio_no_network_refs(void);
/* BAM 4-bit codes s [(n + 1) / 2] -> n bases in out, reverse-complemented if asked. */
void moe_seqio_unpack_nt16(const uint8_t *s, int64_t n, int reverse, char *out);
/* FASTA text raw [n] -> its bases in out (may be raw); returns their number. */
int64_t moe_seqio_clean(const char *raw, int64_t n, char *out);
/* Where a record found at compressed position key lies for r's part: -1 before it, 0 in it,
 * 1 after it (nothing more of the part follows); always 0 without parts. */
int moe_seqio_part_where(const moe_seq_reader *r, int64_t key);
/* FASTA/FASTQ parts (after the format was detected): a bgzip FASTA whose .fai and .gzi match
 * the text seeks to the part's first record, with the record, ordinal and line counters of
 * the records before it set (seqio_seek.c); anything else reads from the start. -v logs
 * which. 0, or -1 (err set) when r cannot be used any more. */
int moe_seqio_part_seek(moe_seq_reader *r, int bgzip, moe_err *err);
/* CRAM parts: each reference sequence (and the unplaced reads) goes to one part, runs of
 * them balanced by length; needs a coordinate-sorted file. */
moe_status moe_seqio_part_by_tid(moe_seq_reader *r, moe_err *err);
/* Logs the first few empty records, then one line saying further ones are not reported. */
void moe_seqio_note_empty(moe_seq_reader *r, const char *name);

#endif
