/* seqio_fastx: FASTA and FASTQ records from a BGZF stream (plain, gzip or bgzip), with
 * line numbers for every error.
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

/* Splits the header in r->line into name and comment. */
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
    return 0;
}

/* Appends a FASTA sequence line without spaces or tabs. */
static int append_fasta_line(moe_seq_reader *r, moe_err *err) {
    const char *s = r->line.s;
    size_t l = r->line.l;
    if (!memchr(s, ' ', l) && !memchr(s, '\t', l))
        return kputsn(s, l, &r->seq) < 0 ? oom(r, err) : 0;
    if (ks_resize(&r->seq, r->seq.l + l + 1) < 0) return oom(r, err);
    for (size_t i = 0; i < l; i++)
        if (s[i] != ' ' && s[i] != '\t') r->seq.s[r->seq.l++] = s[i];
    r->seq.s[r->seq.l] = '\0';
    return 0;
}

static int next_header(moe_seq_reader *r, moe_err *err) {
    if (r->have_line) {
        r->have_line = 0;
        return 1;
    }
    for (;;) {
        int ret = read_line(r, err);
        if (ret <= 0) return ret;
        if (r->line.l) return 1;
    }
}

static int read_fasta(moe_seq_reader *r, moe_err *err) {
    for (;;) {
        int ret = read_line(r, err);
        if (ret < 0) return -1;
        if (ret == 0) return 0;
        if (r->line.l == 0) continue;
        if (r->line.s[0] == '>') {
            r->have_line = 1;
            return 0;
        }
        if (append_fasta_line(r, err) < 0) return -1;
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

int moe_seqio_fastx_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    for (;;) {
        int ret = next_header(r, err);
        if (ret <= 0) return ret;
        int64_t header_line = r->lineno;
        r->record_no++;
        char want = r->fmt == MOE_SEQ_FASTA ? '>' : '@';
        if (r->line.s[0] != want) {
            r->name.l = 0;
            if (r->name.s) r->name.s[0] = '\0';
            char msg[160];
            snprintf(msg, sizeof msg, "expected a header line starting with '%c', found '%c'", want,
                     r->line.s[0]);
            return fail(r, err, header_line,
                        r->fmt == MOE_SEQ_FASTA
                            ? "FASTA records start with '>name'"
                            : "FASTQ records are '@name', bases, '+', qualities",
                        msg);
        }
        if (parse_header(r, err) < 0) return -1;
        r->seq.l = r->qual.l = 0;
        if (ks_resize(&r->seq, 64) < 0 || ks_resize(&r->qual, 64) < 0) return oom(r, err);
        ret = r->fmt == MOE_SEQ_FASTA ? read_fasta(r, err) : read_fastq(r, header_line, err);
        if (ret < 0) return -1;
        r->seq.s[r->seq.l] = '\0';
        r->qual.s[r->qual.l] = '\0';
        r->n_read++;
        if (r->seq.l == 0) {
            moe_seqio_note_empty(r, r->name.s);
            continue;
        }
        rec->name = r->name.s;
        rec->comment = r->comment.s;
        rec->seq = r->seq.s;
        rec->len = (int64_t)r->seq.l;
        rec->qual = r->fmt == MOE_SEQ_FASTQ ? r->qual.s : NULL;
        rec->src_start = 0;
        rec->src_end = rec->len;
        rec->strand = '+';
        rec->record_no = r->record_no;
        rec->line = header_line;
        return 1;
    }
}
