/* seqio_seek: `--part I/N` on a bgzip FASTA with a samtools faidx index (FILE.fai and
 * FILE.gzi) starts reading at the first record of its share instead of at the file's start.
 *
 * A part still needs what the records before its share would have told it: their number
 * (record numbers in messages), how many have bases (the ordinal `--revcomp random` hashes,
 * so the output bytes depend on it) and their lines (line numbers in messages). The .fai
 * lists, in file order, each record with bases: name, bases, the offset of its first base,
 * bases and bytes per line; the .gzi gives each BGZF block's compressed and uncompressed
 * offsets. Neither is taken on trust. Walking the .fai up to the part's first record:
 *   * every header line is read back (only the blocks holding one are decompressed, plus
 *     those holding a record's first and last line) and must be '>', the listed name, then
 *     a blank, a tab or the line's end, ending right before the listed offset;
 *   * every record's bytes up to the next header must be exactly the lines that its bases
 *     and widths give: no blank line, no record missing from the .fai (an empty or a
 *     duplicate one), no line of another width at the record's start or end;
 *   * every block read must be where the .gzi says, of the size it says.
 * Then the records before are as many as the .fai entries before, all with bases, and their
 * lines are one header plus the lines their widths give each. On any mismatch (a stale
 * index, blank lines between records, spaces or CRs that make widths uneven, no .gzi, plain
 * gzip, FASTQ), and when the records before the share are short (fewer than 8 blocks each
 * on average: checking them would read about as many blocks as reading them, on one thread
 * where the reader uses -@'s), the part reads from the start as before; -v logs which way a
 * part went.
 *
 * The one thing to know: the middle of a record's sequence is the one part of the text not
 * read back; it is trusted to be as the .fai says because the .fai is no older than the file
 * and matches it at every header and at both ends of every record. */
#include <errno.h>
#include <htslib/hfile.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/log.h"
#include "seqio/seqio_impl.h"

/* One line of the .fai. */
typedef struct fai_rec {
    char *name;                   /* points into the line read last */
    int64_t len, off, blen, llen; /* bases, offset of the first base, bases and bytes a line */
} fai_rec;

typedef struct seek_ctx {
    const moe_seq_reader *r;
    FILE *fai;
    char *line[2]; /* the .fai lines of the previous and the current record (getline's) */
    size_t cap[2];
    int64_t *caddr, *uaddr; /* block k starts at compressed caddr[k], uncompressed uaddr[k]
                               [n_blk], block 0 at (0, 0) */
    size_t n_blk;
    BGZF *fp;        /* a reader of its own, without threads, loading one block at a time */
    size_t cur;      /* the block in fp->uncompressed_block (n_blk: none) */
    size_t n_loaded; /* blocks decompressed */
    int64_t usize;   /* the uncompressed size once the last block was read, else -1 */
    const char *why; /* set: the part reads from the start, for this reason */
} seek_ctx;

/* 0 with the next .fai line in *e (its name in s->line[slot]), 1 at the end of the .fai,
 * -1 when it is not a FASTA .fai line of a usable record (s->why set). */
static int fai_next(seek_ctx *s, int slot, fai_rec *e) {
    errno = 0;
    ssize_t n = getline(&s->line[slot], &s->cap[slot], s->fai);
    if (n < 0) {
        if (errno) s->why = "the .fai cannot be read";
        return errno ? -1 : 1;
    }
    char *p = s->line[slot], *tab = strchr(p, '\t');
    s->why = tab == p ? "a .fai record with an empty name (which moe-tokenize refuses)"
                      : "a .fai line is not NAME LENGTH OFFSET LINEBASES LINEWIDTH (FASTQ's?)";
    if (!tab || tab == p) return -1;
    *tab = '\0';
    e->name = p;
    int64_t *field[4] = {&e->len, &e->off, &e->blen, &e->llen};
    p = tab + 1;
    for (int i = 0; i < 4; i++) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || (*end != (i < 3 ? '\t' : '\n') && !(i == 3 && *end == '\0')))
            return -1;
        *field[i] = v;
        p = end + (*end != '\0');
    }
    s->why = "a .fai record without bases or with a line width below its bases";
    if (e->len == 0 || e->blen == 0 || e->llen <= e->blen) return -1;
    s->why = NULL;
    return 0;
}

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* Reads FILE.gzi: a count, then (compressed, uncompressed) offsets of the blocks after the
 * first, all little-endian 64-bit. 0, 1 when unusable (s->why), -1 out of memory. */
static int gzi_load(seek_ctx *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        s->why = "no .gzi beside the .fai (samtools faidx writes both)";
        return 1;
    }
    unsigned char b[16];
    int ret = 1;
    s->why = "the .gzi is truncated or has blocks out of order";
    if (fread(b, 8, 1, f) != 1) goto done;
    uint64_t n = le64(b);
    if (n >= (uint64_t)1 << 40) goto done;
    s->caddr = malloc((n + 1) * sizeof *s->caddr);
    s->uaddr = malloc((n + 1) * sizeof *s->uaddr);
    if (!s->caddr || !s->uaddr) {
        ret = -1;
        goto done;
    }
    s->caddr[0] = s->uaddr[0] = 0;
    for (s->n_blk = 1; s->n_blk <= n; s->n_blk++) {
        if (fread(b, 16, 1, f) != 1) goto done;
        int64_t c = (int64_t)le64(b), u = (int64_t)le64(b + 8);
        /* strictly increasing: an empty block inside the file (two blocks at one offset)
           would make the reader's block of a byte differ from the .gzi's */
        if (c <= s->caddr[s->n_blk - 1] || u <= s->uaddr[s->n_blk - 1]) goto done;
        s->caddr[s->n_blk] = c;
        s->uaddr[s->n_blk] = u;
    }
    ret = 0;
    s->why = NULL;
done:
    fclose(f);
    return ret;
}

/* The last k with a[k] <= x in the increasing a [n] (a[0] <= x). */
static size_t last_at_or_before(const int64_t *a, size_t n, int64_t x) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The block holding uncompressed offset u (u >= 0). */
static size_t block_of(const seek_ctx *s, int64_t u) {
    return last_at_or_before(s->uaddr, s->n_blk, u);
}

/* Decompresses block k, checking it is where and as long as the .gzi says (the last one:
 * that the end-of-file block follows it; it sets s->usize). 0, or -1 with s->why. */
static int block_load(seek_ctx *s, size_t k) {
    BGZF *fp = s->fp;
    s->cur = s->n_blk;
    if (bgzf_seek(fp, s->caddr[k] << 16, SEEK_SET) < 0 || bgzf_read_block(fp) != 0) goto bad;
    s->n_loaded++;
    int64_t want = k + 1 < s->n_blk ? s->uaddr[k + 1] - s->uaddr[k] : -1;
    /* without threads the file position is the next block's start */
    if (fp->block_length <= 0 ||
        (want >= 0 && (fp->block_length != want || htell(fp->fp) != s->caddr[k + 1])))
        goto bad;
    if (want < 0) { /* the last data block: only the end-of-file block (28 bytes, checked
                       when the reader was opened) follows it */
        struct stat st;
        if (stat(s->r->path, &st) != 0 || htell(fp->fp) != (off_t)st.st_size - 28) goto bad;
        s->usize = s->uaddr[k] + fp->block_length;
    }
    s->cur = k;
    return 0;
bad:
    if (!s->why) s->why = "the .gzi does not match the file's BGZF blocks";
    return -1;
}

/* The byte at uncompressed offset u, or -1 with s->why (also past the file's end). */
static int at(seek_ctx *s, int64_t u) {
    size_t k = s->cur;
    if (u < 0) {
        if (!s->why) s->why = "the .fai points before the start of the file";
        return -1;
    }
    if (k == s->n_blk || u < s->uaddr[k] || u >= s->uaddr[k] + s->fp->block_length) {
        k = block_of(s, u);
        if (block_load(s, k) < 0) return -1;
        if (u >= s->uaddr[k] + s->fp->block_length) {
            if (!s->why) s->why = "the .fai points past the end of the file";
            return -1;
        }
    }
    return ((const unsigned char *)s->fp->uncompressed_block)[u - s->uaddr[k]];
}

/* Finds the header line of e, the line ending right before e->off, at or after `from`, and
 * checks it is '>' NAME then a blank, a tab or the line's end. 0 with its start in *h; -1
 * with s->why. The first record's (from 0) must start the file. */
static int header_at(seek_ctx *s, const fai_rec *e, int64_t from, int64_t *h) {
    if (at(s, e->off - 1) != '\n') goto differs;
    int64_t p = e->off - 1, c = 0;
    while (p > from && (c = at(s, p - 1)) != '\n') {
        if (c < 0) return -1;
        p--;
    }
    if (p == from && from > 0) goto differs; /* no line break in the record before */
    if (p > 0 && from == 0) goto differs;    /* a line before the first header */
    size_t n = strlen(e->name);
    if (at(s, p) != '>') goto differs;
    for (size_t i = 0; i < n; i++)
        if (at(s, p + 1 + (int64_t)i) != (unsigned char)e->name[i]) goto differs;
    int64_t t = p + 1 + (int64_t)n; /* what ends the name, as moe_seqio's parser sees it */
    c = at(s, t);
    if (!(c == ' ' || c == '\t' || c == '\n' || (c == '\r' && t == e->off - 2))) goto differs;
    *h = p;
    return 0;
differs:
    if (!s->why) s->why = "a header line is not where the .fai says or names another record";
    return -1;
}

/* The lines of e's sequence, which ends at `end` (the next header or the file's end), when
 * they are exactly the lines its bases and widths give. 0 with *lines, -1 with s->why. */
static int seq_lines(seek_ctx *s, const fai_rec *e, int64_t end, int64_t *lines) {
    int64_t bytes = end - e->off, full = bytes / e->llen, rest = bytes % e->llen;
    int64_t eol = e->llen - e->blen; /* "\n" or "\r\n" */
    /* a short last line holds at least one base */
    int ok = bytes >= 2 && (rest == 0 || rest > eol) &&
             e->len == full * e->blen + (rest ? rest - eol : 0);
    /* the last full line ends where the width says (a short last line is the rest); the
       last line ends at end and is not blank (read in file order: one block stays loaded) */
    ok = ok && (full == 0 || at(s, e->off + full * e->llen - 1) == '\n');
    int c3 = ok && bytes > 2 ? at(s, end - 3) : '\n', c2 = ok ? at(s, end - 2) : -1;
    ok = ok && c3 >= 0 && c2 >= 0 && c2 != '\n' && !(c2 == '\r' && c3 == '\n') &&
         at(s, end - 1) == '\n';
    if (!ok) {
        if (!s->why)
            s->why = "a record's lines are not those its .fai line gives (blank lines, uneven "
                     "line widths, or a record the .fai leaves out: empty or a duplicate name)";
        return -1;
    }
    *lines = full + (rest > 0);
    return 0;
}

/* Checking the records before the share (walk) reads the blocks that hold their headers and
 * ends, on one thread; it pays only when they are sparse, else reading from the start (on
 * -@'s threads) is as fast or faster. 1 when the records the .fai lists before the share's
 * first block have SEEK_BLOCKS_PER_RECORD blocks or more each on average; else 0 with
 * s->why. The .fai is rewound either way. */
#define SEEK_BLOCKS_PER_RECORD 8
static int sparse_enough(seek_ctx *s) {
    /* the share's first block: the first at or after part_lo (> 0, block 0 is at 0) */
    const size_t lo = last_at_or_before(s->caddr, s->n_blk, s->r->part_lo - 1) + 1;
    const int64_t ushare = lo < s->n_blk ? s->uaddr[lo] : INT64_MAX;
    int64_t n = 0;
    fai_rec e;
    int ret;
    while ((ret = fai_next(s, 0, &e)) == 0 && e.off < ushare)
        n++;
    rewind(s->fai);
    if (ret < 0) return 0;
    if (n * SEEK_BLOCKS_PER_RECORD <= (int64_t)lo) return 1;
    s->why = "the records before its share average fewer than 8 BGZF blocks, so checking them "
             "would cost about as much as reading them";
    return 0;
}

/* Where r's part starts: walks the .fai (as the banner says) up to the first record whose
 * header lies in a block at or after the share's start. 0 with the record's number *j (0:
 * nothing before it), its header's offset *h (-1: no record starts in or after the share)
 * and the lines before it; -1 with s->why, or on a read error of the .fai. */
static int walk(seek_ctx *s, int64_t *j, int64_t *h, int64_t *lines) {
    fai_rec prev = {0}, cur;
    int ret;
    *lines = 0;
    for (*j = 0; (ret = fai_next(s, (int)(*j & 1), &cur)) == 0; ++*j) {
        if (*j > 0 && cur.off <= prev.off) {
            s->why = "the .fai lists records out of file order";
            return -1;
        }
        int64_t head, l;
        if (header_at(s, &cur, *j ? prev.off : 0, &head) < 0) return -1;
        /* the first line ends where the width says (checked now, while its block is loaded) */
        if (cur.len >= cur.blen && at(s, cur.off + cur.llen - 1) != '\n') {
            if (!s->why) s->why = "a record's first line is not as wide as the .fai says";
            return -1;
        }
        if (*j > 0) {
            if (seq_lines(s, &prev, head, &l) < 0) return -1;
            *lines += 1 + l;
        }
        if (s->caddr[block_of(s, head)] >= s->r->part_lo) {
            *h = head;
            return 0;
        }
        prev = cur;
    }
    if (ret < 0) return -1;
    if (*j == 0) {
        s->why = "the .fai is empty";
        return -1;
    }
    /* every record starts before the share: the last one ends at the file's end */
    int64_t l;
    if (at(s, s->uaddr[s->n_blk - 1]) < 0) return -1;
    if (seq_lines(s, &prev, s->usize, &l) < 0) return -1;
    *lines += 1 + l;
    *h = -1;
    return 0;
}

/* Points r at the record numbered j (0-based) whose header is at uncompressed offset h
 * (-1: at the end of the input), as if the records and lines before had been read. */
static int reader_skip_to(moe_seq_reader *r, const seek_ctx *s, int64_t j, int64_t h, int64_t lines,
                          moe_err *err) {
    r->have_line = 0; /* the first header, read while detecting the format */
    r->record_no = r->n_kept = j;
    r->lineno = lines;
    if (h < 0) {
        r->blk_eof = 1;
        return 0;
    }
    size_t k = block_of(s, h);
    if (bgzf_seek(r->bgzf, s->caddr[k] << 16 | (h - s->uaddr[k]), SEEK_SET) < 0) {
        moe_err_set(err, MOE_ERR_INPUT, r->path, "cannot seek to record %lld (line %lld)",
                    (long long)j + 1, (long long)lines + 1);
        moe_err_hint(err, "the file is truncated or corrupt (test it with `bgzip -t`)");
        return -1;
    }
    return 0;
}

int moe_seqio_part_seek(moe_seq_reader *r, int bgzip, moe_err *err) {
    seek_ctx s = {.r = r, .usize = -1};
    const char *path = r->path;
    size_t plen = strlen(path);
    char *fai = malloc(plen + 5), *gzi = malloc(plen + 5);
    struct stat st, st_fai, st_gzi;
    int ret = 0, part = r->opts.part + 1, n_parts = r->opts.n_parts;
    if (!fai || !gzi) {
        ret = -1;
        moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        goto done;
    }
    snprintf(fai, plen + 5, "%s.fai", path);
    snprintf(gzi, plen + 5, "%s.gzi", path);
    if (r->fmt != MOE_SEQ_FASTA)
        s.why = "not FASTA";
    else if (!bgzip)
        s.why = "not bgzip-compressed (only a BGZF file has blocks to seek to)";
    else if (r->part_lo == 0)
        s.why = "its share starts at the file's start";
    else if (stat(path, &st) != 0 || stat(fai, &st_fai) != 0 || !(s.fai = fopen(fai, "r")))
        s.why = "no .fai (samtools faidx FILE writes FILE.fai and FILE.gzi)";
    else if (stat(gzi, &st_gzi) == 0 &&
             (st_fai.st_mtime < st.st_mtime || st_gzi.st_mtime < st.st_mtime))
        s.why = "the .fai or .gzi is older than the file";
    if (s.why) goto done;
    if ((ret = gzi_load(&s, gzi)) != 0) {
        if (ret < 0) moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        ret = ret < 0 ? -1 : 0;
        goto done;
    }
    if (!sparse_enough(&s)) goto done;
    if (!(s.fp = bgzf_open(path, "r"))) {
        s.why = "the file cannot be opened a second time";
        goto done;
    }
    s.cur = s.n_blk;
    int64_t j, h, lines;
    if (walk(&s, &j, &h, &lines) < 0) goto done;
    ret = reader_skip_to(r, &s, j, h, lines, err);
    if (ret == 0 && h < 0)
        moe_log_debug("%s: part %d/%d seeks to the end: no record starts in or after its share "
                      "(%lld records, %lld lines before); %zu block reads checked the .fai",
                      path, part, n_parts, (long long)j, (long long)lines, s.n_loaded);
    else if (ret == 0)
        moe_log_debug("%s: part %d/%d seeks to record %lld (line %lld), its first; %zu block "
                      "reads checked the .fai (%zu blocks lie before it)",
                      path, part, n_parts, (long long)j + 1, (long long)lines + 1, s.n_loaded,
                      block_of(&s, h));
done:
    if (s.why && ret == 0)
        moe_log_debug("%s: part %d/%d reads from the start: %s", path, part, n_parts, s.why);
    if (s.fp) bgzf_close(s.fp);
    if (s.fai) fclose(s.fai);
    free(s.line[0]);
    free(s.line[1]);
    free(s.caddr);
    free(s.uaddr);
    free(fai);
    free(gzi);
    return ret;
}
