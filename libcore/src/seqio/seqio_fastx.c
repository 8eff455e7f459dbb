/* seqio_fastx: FASTA and FASTQ records from a BGZF stream (plain, gzip or bgzip), with
 * line numbers for every error. FASTQ is read line by line; FASTA in large blocks, a record
 * being the text from one line-start '>' to the next, cleaned by moe_seqio_clean (here, or
 * by the caller's threads when moe_seqio_opts.raw asks for the text as it is; with keep_text
 * that text stays where it was read until moe_seqio_take_text hands it to the caller).
 *
 * Not kseq: kseq silently skips text before the first header and knows no line numbers.
 * Rules: CR before LF is dropped (Windows files); lines may be any length; FASTA sequence
 * lines may wrap and blank lines are ignored, spaces/tabs inside FASTA sequence lines are
 * dropped (as kseq does); FASTQ may wrap too (sequence lines end at the '+' line, quality
 * lines continue until they are as long as the sequence), and is otherwise strict: a '+'
 * line that names another record, qualities outside '!'..'~', truncation and length
 * mismatches are errors. Records without bases are skipped with a warning. */
#include <stdio.h>
#include <string.h>

#include "seqio/seqio_impl.h"

/* 1: a line in r->line, 0: end of input, -1: error. */
static int read_line(moe_seq_reader *r, moe_err *err) {
    int ret = bgzf_getline(r->bgzf, '\n', &r->line);
    if (ret == -1) return 0;
    if (ret < -1) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "cannot read or decompress the input after line %lld", (long long)r->lineno);
        moe_err_hint(err, "the file is truncated or corrupt (test it with `gzip -t`)");
        return -1;
    }
    r->lineno++;
    if (r->line.l && r->line.s[r->line.l - 1] == '\r') r->line.s[--r->line.l] = '\0';
    return 1;
}

static int fail(moe_seq_reader *r, moe_err *err, int64_t line, const char *hint, const char *msg) {
    moe_err_set(err, MOE_ERR_INPUT, r->path, "record %lld (%s): %s", (long long)r->record_no,
                r->name.s ? r->name.s : "", msg);
    moe_err_at_line(err, line, 0);
    if (hint) moe_err_hint(err, "%s", hint);
    return -1;
}

static int oom(moe_seq_reader *r, moe_err *err) {
    moe_err_set(err, MOE_ERR_RUNTIME, r->path, "out of memory at line %lld", (long long)r->lineno);
    return -1;
}

/* Splits the header in r->line into name and comment; an empty name is an input error. */
static int parse_header(moe_seq_reader *r, moe_err *err) {
    const char *s = r->line.s + 1, *end = r->line.s + r->line.l;
    const char *p = s;
    while (p < end && *p != ' ' && *p != '\t')
        p++;
    r->name.l = r->comment.l = 0;
    if (kputsn(s, (size_t)(p - s), &r->name) < 0) return oom(r, err);
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (kputsn(p, (size_t)(end - p), &r->comment) < 0) return oom(r, err);
    if (r->name.l == 0) /* a bare '>' would become a record named "" in the outputs */
        return fail(r, err, r->lineno, "give every record a name ('>chr1', '@read1')",
                    "empty record name");
    return 0;
}

static int next_header(moe_seq_reader *r, moe_err *err) {
    if (r->have_line) {
        r->have_line = 0;
        return 1;
    }
    for (;;) {
        r->line_key = bgzf_tell(r->bgzf) >> 16;
        int ret = read_line(r, err);
        if (ret <= 0) return ret;
        if (r->line.l) return 1;
    }
}

static int read_fastq(moe_seq_reader *r, int64_t header_line, moe_err *err) {
    const char *trunc = "the file ends inside a FASTQ record: it is truncated";
    for (;;) { /* sequence lines up to the '+' line */
        int ret = read_line(r, err);
        if (ret < 0) return -1;
        if (ret == 0) return fail(r, err, r->lineno, "re-create the file", trunc);
        if (r->line.l && r->line.s[0] == '+') break;
        if (r->line.l && r->line.s[0] == '@')
            return fail(r, err, r->lineno, "every FASTQ record needs '+' and quality lines",
                        "a new '@' header comes before this record's '+' line");
        if (kputsn(r->line.s, r->line.l, &r->seq) < 0) return oom(r, err);
    }
    if (r->line.l > 1 && strcmp(r->line.s + 1, r->name.s) != 0 &&
        !(strncmp(r->line.s + 1, r->name.s, r->name.l) == 0 &&
          (r->line.s[1 + r->name.l] == ' ' || r->line.s[1 + r->name.l] == '\t')))
        return fail(r, err, r->lineno, "the '+' line must be empty or repeat the '@' name",
                    "the '+' line names a different record");
    int64_t plus_line = r->lineno;
    while (r->qual.l < r->seq.l) {
        int ret = read_line(r, err);
        if (ret < 0) return -1;
        if (ret == 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s (%zu of %zu quality characters)", trunc, r->qual.l,
                     r->seq.l);
            return fail(r, err, plus_line, "re-create the file", msg);
        }
        if (kputsn(r->line.s, r->line.l, &r->qual) < 0) return oom(r, err);
    }
    if (r->qual.l != r->seq.l) {
        char msg[160];
        snprintf(msg, sizeof msg, "%zu quality characters for %zu bases", r->qual.l, r->seq.l);
        return fail(r, err, header_line, "each base needs exactly one quality character", msg);
    }
    for (size_t i = 0; i < r->qual.l; i++) {
        unsigned char q = (unsigned char)r->qual.s[i];
        if (q < 33 || q > 126) {
            char msg[160];
            snprintf(msg, sizeof msg, "quality byte 0x%02x at position %zu is outside '!'..'~'", q,
                     i + 1);
            return fail(r, err, r->lineno, "qualities are phred+33 printable characters", msg);
        }
    }
    return 0;
}

/* Fills the fields of rec that FASTA and FASTQ share (seq and len are set); returns 1. */
static int record_done(const moe_seq_reader *r, moe_seq_record *rec, int64_t header_line) {
    rec->name = r->name.s;
    rec->comment = r->comment.s;
    rec->src_start = 0;
    rec->src_end = rec->len;
    rec->strand = '+';
    rec->record_no = r->record_no;
    rec->ordinal = r->n_kept;
    rec->line = header_line;
    return 1;
}

/* ---- FASTA, in blocks ---- */

/* Fills read 64 KB first, then twice as much after each fill the input filled, up to 1 MB:
 * a small file costs no megabyte of buffer, a genome is read in 1 MB blocks. */
#define FASTA_FIRST_BLOCK ((size_t)1 << 16)
#define FASTA_BLOCK ((size_t)1 << 20)
/* With opts.keep_text the text read past the last record handed out is copied at each
 * moe_seqio_take_text, half a fill on average: fills of one BGZF block keep that copy small
 * (3% of a 1 MB batch). */
#define FASTA_KEEP_BLOCK ((size_t)1 << 16)

/* 1 when r keeps the text of the records it returned (see moe_seqio_take_text). */
static int keeps_text(const moe_seq_reader *r) {
    return r->bgzf && r->fmt == MOE_SEQ_FASTA && r->opts.raw && r->opts.keep_text;
}

/* ---- FASTA parts: the BGZF block each byte of the text came from ---- */

/* A FASTA record of a part run belongs to the part whose share holds the compressed position
 * of the block its header starts in. Text is read in fills that span blocks, so the reader
 * notes, for each run of the text, the block it came from (r->seg_off, r->seg_key). */

/* Forgets the blocks of the text before `drop` and numbers the rest from 0 (the text from
 * drop on was moved to the start of a buffer). */
static void seg_drop(moe_seq_reader *r, size_t drop) {
    if (r->n_seg == 0) return; /* no parts: nothing noted */
    size_t i = 0;
    while (i + 1 < r->n_seg && r->seg_off[i + 1] <= drop)
        i++;
    r->n_seg -= i;
    memmove(r->seg_off, r->seg_off + i, r->n_seg * sizeof *r->seg_off);
    memmove(r->seg_key, r->seg_key + i, r->n_seg * sizeof *r->seg_key);
    for (size_t k = 0; k < r->n_seg; k++)
        r->seg_off[k] = r->seg_off[k] > drop ? r->seg_off[k] - drop : 0;
}

/* Notes that the text from offset off on comes from the block at key. -1: out of memory. */
static int seg_push(moe_seq_reader *r, size_t off, int64_t key) {
    if (r->n_seg && r->seg_key[r->n_seg - 1] == key) return 0;
    if (r->n_seg == r->cap_seg) {
        size_t nc = r->cap_seg ? 2 * r->cap_seg : 64;
        size_t *no = realloc(r->seg_off, nc * sizeof *no);
        if (no) r->seg_off = no;
        int64_t *nk = no ? realloc(r->seg_key, nc * sizeof *nk) : NULL;
        if (!nk) return -1;
        r->seg_key = nk;
        r->cap_seg = nc;
    }
    r->seg_off[r->n_seg] = off;
    r->seg_key[r->n_seg++] = key;
    return 0;
}

/* The compressed position of the block the text byte at pos came from (pos at the end of
 * the text: of the block the next byte will come from). */
static int64_t seg_key_at(const moe_seq_reader *r, size_t pos) {
    if (pos >= r->blk.l || r->n_seg == 0) return r->bgzf->block_address;
    size_t lo = 0, hi = r->n_seg; /* the last segment starting at or before pos */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->seg_off[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return r->seg_key[lo];
}

/* Reads up to want bytes into dst (at text offset off) one block's bytes at a time, noting
 * each block. The number read; -1 on a read error, -2 out of memory. */
static ssize_t read_noting_blocks(moe_seq_reader *r, char *dst, size_t off, size_t want) {
    BGZF *fp = r->bgzf;
    size_t got = 0;
    while (got < want) {
        /* at a block's end bgzf_read has moved block_address on to the next block */
        int avail = fp->block_length - fp->block_offset;
        size_t n = avail > 0 ? (size_t)avail : 1; /* 1: load the next block, then its rest */
        if (n > want - got) n = want - got;
        if (seg_push(r, off + got, fp->block_address) < 0) return -2;
        ssize_t k = bgzf_read(fp, dst + got, n);
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Moves the unread text to the start of r->blk (unless records returned since the last
 * moe_seqio_take_text still lie before it) and appends up to a fill's worth of bytes:
 * FASTA_KEEP_BLOCK with keep_text, else r->blk_next (doubled, up to FASTA_BLOCK, when they
 * all came). Returns the number of bytes added, 0 at the end of input, -1 on error. */
static int64_t blk_fill(moe_seq_reader *r, moe_err *err) {
    int keep = keeps_text(r);
    if (r->blk_pos > 0 && !(keep && r->blk_handed)) {
        memmove(r->blk.s, r->blk.s + r->blk_pos, r->blk.l - r->blk_pos);
        r->blk.l -= r->blk_pos;
        seg_drop(r, r->blk_pos);
        r->blk_pos = 0;
    }
    size_t want = keep ? FASTA_KEEP_BLOCK : r->blk_next ? r->blk_next : FASTA_FIRST_BLOCK;
    if (ks_resize(&r->blk, r->blk.l + want + 1) < 0) return oom(r, err);
    ssize_t n = r->part_by_pos ? read_noting_blocks(r, r->blk.s + r->blk.l, r->blk.l, want)
                               : bgzf_read(r->bgzf, r->blk.s + r->blk.l, want);
    if (n == -2) return oom(r, err);
    if (!keep) r->blk_next = (size_t)n == want && 2 * want <= FASTA_BLOCK ? 2 * want : want;
    if (n < 0) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "cannot read or decompress the input after line %lld", (long long)r->lineno);
        moe_err_hint(err, "the file is truncated or corrupt (test it with `gzip -t`)");
        return -1;
    }
    r->blk.l += (size_t)n;
    r->blk.s[r->blk.l] = '\0';
    return n;
}

/* Reads the header line at r->blk_pos into r->line. 1: a line, 0: end of input, -1: error. */
static int fasta_header(moe_seq_reader *r, moe_err *err) {
    size_t searched = 0; /* bytes after blk_pos known to hold no '\n' */
    for (;;) {
        /* no pointer into the block before it exists: it is allocated by the first fill */
        size_t left = r->blk.l - r->blk_pos - searched;
        char *nl = left ? memchr(r->blk.s + r->blk_pos + searched, '\n', left) : NULL;
        if (nl || r->blk_eof) {
            char *line = r->blk.s + r->blk_pos;
            size_t n = nl ? (size_t)(nl - line) : r->blk.l - r->blk_pos;
            if (n == 0 && !nl) return 0;
            r->line.l = 0;
            if (kputsn(line, n, &r->line) < 0) return oom(r, err);
            if (r->line.l && r->line.s[r->line.l - 1] == '\r') r->line.s[--r->line.l] = '\0';
            r->blk_pos += n + (nl != NULL);
            r->lineno++;
            return 1;
        }
        searched = r->blk.l - r->blk_pos;
        int64_t got = blk_fill(r, err);
        if (got < 0) return -1;
        r->blk_eof = got == 0;
    }
}

/* The body after a header: up to the next '>' at a line start, or the end of input. Sets
 * *len; the body starts at r->blk.s + r->blk_pos. -1 on error. */
static int fasta_body(moe_seq_reader *r, size_t *len, moe_err *err) {
    size_t searched = 0; /* bytes after blk_pos known to hold no header */
    for (;;) {
        const char *body = r->blk.s + r->blk_pos, *end = r->blk.s + r->blk.l;
        const char *q = body + searched;
        /* a '>' right at the start follows the header's line break */
        while (q < end && (q = memchr(q, '>', (size_t)(end - q))) && q > body && q[-1] != '\n')
            q++;
        if (q == end) q = NULL; /* nothing left to search (also: an empty, unallocated block) */
        if (q || r->blk_eof) {
            *len = (size_t)((q ? q : end) - body);
            return 0;
        }
        searched = r->blk.l - r->blk_pos;
        int64_t got = blk_fill(r, err);
        if (got < 0) return -1;
        r->blk_eof = got == 0;
    }
}

/* The line breaks in s [n]: counted in runs of 255 bytes into a byte-wide sum, which the
 * compiler vectorises (the reader thread does this for every byte of a FASTA file). */
static int64_t count_lines(const char *s, size_t n) {
    int64_t total = 0;
    while (n) {
        size_t m = n < 255 ? n : 255;
        uint8_t c = 0;
        for (size_t i = 0; i < m; i++)
            c += s[i] == '\n';
        total += c;
        s += m;
        n -= m;
    }
    return total;
}

/* 1 when moe_seqio_clean would keep a byte of raw[0, n). */
static int has_bases(const char *raw, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = raw[i];
        if (c == '\n' || c == ' ' || c == '\t') continue;
        if (c == '\r' && (i + 1 == n || raw[i + 1] == '\n')) continue;
        return 1;
    }
    return 0;
}

int64_t moe_seqio_clean(const char *raw, int64_t n, char *out) {
    int64_t o = 0;
    size_t len = (size_t)n;
    if (!memchr(raw, ' ', len) && !memchr(raw, '\t', len) && !memchr(raw, '\r', len)) {
        /* the usual text: only line breaks to drop, a line at a time */
        for (const char *p = raw, *end = raw + n; p < end;) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t l = (size_t)((nl ? nl : end) - p);
            memmove(out + o, p, l);
            o += (int64_t)l;
            p += l + 1;
        }
        return o;
    }
    static const uint8_t drop[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1};
    char prev = 0; /* raw[i - 1], kept aside: out may be raw itself */
    for (int64_t i = 0; i < n; i++) {
        char c = raw[i];
        out[o] = c;
        o += 1 - drop[(unsigned char)c];
        /* CR before LF (Windows line ends) goes; a CR elsewhere is a character */
        if (c == '\n' && prev == '\r') o--;
        prev = c;
    }
    if (prev == '\r') o--;
    return o;
}

static int fasta_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    /* the block exists before any pointer into it is formed (a header read while detecting
     * the format arrives with the block still unallocated) */
    if (!r->blk.s) {
        if (ks_resize(&r->blk, FASTA_FIRST_BLOCK + 1) < 0) return oom(r, err);
        r->blk.s[r->blk.l] = '\0';
    }
    for (;;) {
        /* the record's position, for parts: the block its header starts in (the first
           header was read while detecting the format: the first part's) */
        int64_t key = r->have_line || !r->part_by_pos ? 0 : seg_key_at(r, r->blk_pos);
        if (r->have_line)
            r->have_line = 0;
        else {
            int ret;
            /* blank lines before a header (only possible at the start) */
            while ((ret = fasta_header(r, err)) == 1 && r->line.l == 0)
                ;
            if (ret <= 0) return ret;
        }
        int where = moe_seqio_part_where(r, key);
        if (where > 0) return 0;
        int64_t header_line = r->lineno;
        r->record_no++;
        if (parse_header(r, err) < 0) return -1;
        size_t len;
        if (fasta_body(r, &len, err) < 0) return -1;
        const char *body = r->blk.s + r->blk_pos;
        r->lineno += count_lines(body, len);
        r->blk_pos += len;
        int bases = has_bases(body, len);
        r->n_kept += bases;
        if (where < 0) continue; /* another part's */
        r->n_read++;
        if (!bases) {
            moe_seqio_note_empty(r, r->name.s);
            continue;
        }
        if (r->opts.raw) { /* the text itself, read in place: the caller cleans it */
            rec->seq = body;
            rec->len = (int64_t)len;
        } else { /* cleaned in place: a chromosome needs no second buffer of its size */
            char *text = r->blk.s + (body - r->blk.s);
            rec->len = moe_seqio_clean(body, (int64_t)len, text);
            text[rec->len] = 0; /* on a line break, or on the NUL after the text at its end */
            rec->seq = text;
        }
        rec->raw = r->opts.raw ? MOE_SEQ_RAW_TEXT : 0;
        r->blk_handed = 1;
        return record_done(r, rec, header_line);
    }
}

int64_t moe_seqio_text_offset(const moe_seq_reader *r, const moe_seq_record *rec) {
    return keeps_text(r) && rec->raw == MOE_SEQ_RAW_TEXT ? rec->seq - r->blk.s : -1;
}

int moe_seqio_take_text(moe_seq_reader *r, char *spare, size_t spare_cap, char **text, size_t *cap,
                        moe_err *err) {
    *text = NULL;
    *cap = 0;
    if (!keeps_text(r)) return 0;
    /* the unread text goes on in spare; with none and nothing unread, fasta_next allocates */
    kstring_t next = {0, spare_cap, spare};
    size_t tail = r->blk.l - r->blk_pos;
    if (tail || spare) {
        if (ks_resize(&next, tail + 1) < 0) return oom(r, err);
        memcpy(next.s, r->blk.s + r->blk_pos, tail);
        next.l = tail;
        next.s[tail] = '\0';
    }
    *text = r->blk.s;
    *cap = r->blk.m;
    seg_drop(r, r->blk_pos);
    r->blk = next;
    r->blk_pos = 0;
    r->blk_handed = 0;
    return 1;
}

int moe_seqio_fastx_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    if (r->fmt == MOE_SEQ_FASTA) return fasta_next(r, rec, err);
    for (;;) {
        int ret = next_header(r, err);
        if (ret <= 0) return ret;
        int where = moe_seqio_part_where(r, r->line_key);
        if (where > 0) return 0;
        int64_t header_line = r->lineno;
        r->record_no++;
        if (r->line.s[0] != '@') {
            r->name.l = 0;
            if (r->name.s) r->name.s[0] = '\0';
            char msg[160];
            snprintf(msg, sizeof msg, "expected a header line starting with '@', found '%c'",
                     r->line.s[0]);
            return fail(r, err, header_line, "FASTQ records are '@name', bases, '+', qualities",
                        msg);
        }
        if (parse_header(r, err) < 0) return -1;
        r->seq.l = r->qual.l = 0;
        if (ks_resize(&r->seq, 64) < 0 || ks_resize(&r->qual, 64) < 0) return oom(r, err);
        ret = read_fastq(r, header_line, err);
        if (ret < 0) return -1;
        r->seq.s[r->seq.l] = '\0';
        r->qual.s[r->qual.l] = '\0';
        r->n_kept += r->seq.l > 0;
        if (where < 0) continue; /* another part's */
        r->n_read++;
        if (r->seq.l == 0) {
            moe_seqio_note_empty(r, r->name.s);
            continue;
        }
        rec->seq = r->seq.s;
        rec->len = (int64_t)r->seq.l;
        rec->qual = r->qual.s;
        return record_done(r, rec, header_line);
    }
}
