/* seqio: opening sequence files - format detection, dispatch to the FASTA/FASTQ parser
 * (seqio_fastx.c) or htslib (seqio_hts.c) - plus BED regions and reverse complement.
 *
 * The one thing to know: the format is detected from the content (htslib's detector for
 * SAM/BAM/CRAM, the first non-blank character for FASTA '>' / FASTQ '@'), never from the
 * file name, so "-" and misnamed files work. */
#include "moe/seqio.h"

#include <ctype.h>
#include <errno.h>
#include <htslib/hfile.h>
#include <htslib/hts.h>
#include <htslib/kstring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/log.h"
#include "seqio/seqio_impl.h"

void moe_seqio_opts_defaults(moe_seqio_opts *o) {
    moe_seqio_no_network_refs();
    memset(o, 0, sizeof *o);
    o->exclude_flags = MOE_SEQIO_DEFAULT_EXCLUDE;
}

const char *moe_seqio_format_name(moe_seq_format f) {
    switch (f) {
    case MOE_SEQ_FASTA:
        return "FASTA";
    case MOE_SEQ_FASTQ:
        return "FASTQ";
    case MOE_SEQ_SAM:
        return "SAM";
    case MOE_SEQ_BAM:
        return "BAM";
    case MOE_SEQ_CRAM:
        return "CRAM";
    default:
        return "unknown";
    }
}

void moe_seqio_close(moe_seq_reader *r) {
    if (!r) return;
    if (r->bgzf) bgzf_close(r->bgzf);
    if (r->itr) hts_itr_destroy(r->itr);
    if (r->idx) hts_idx_destroy(r->idx);
    if (r->b) bam_destroy1(r->b);
    if (r->hdr) sam_hdr_destroy(r->hdr);
    if (r->hts) hts_close(r->hts);
    if (r->fai) fai_destroy(r->fai);
    free(r->fai_seq);
    for (int i = 0; i < r->n_regions; i++)
        free(r->regions[i]);
    free(r->regions);
    free(r->line.s);
    free(r->blk.s);
    free(r->tid_owner);
    free(r->seg_off);
    free(r->seg_key);
    free(r->name.s);
    free(r->comment.s);
    free(r->seq.s);
    free(r->qual.s);
    free(r->path);
    free(r);
}

void moe_seqio_note_empty(moe_seq_reader *r, const char *name) {
    r->n_empty++;
    if (r->n_empty <= 3)
        moe_log_warn("%s: record %lld (%s) has no bases; skipped", r->path, (long long)r->record_no,
                     name);
    if (r->n_empty == 3) moe_log_warn("%s: further empty records are not reported", r->path);
}

/* Reads lines until a non-blank one; decides FASTA/FASTQ by its first character. */
static moe_status sniff_fastx(moe_seq_reader *r, moe_err *err) {
    for (;;) {
        int ret = bgzf_getline(r->bgzf, '\n', &r->line);
        if (ret == -1) {
            r->fmt = MOE_SEQ_FASTA; /* empty input: no records */
            moe_log_warn("%s: input is empty", r->path);
            return MOE_OK;
        }
        if (ret < -1) {
            moe_err_set(err, MOE_ERR_INPUT, r->path, "cannot read or decompress the input");
            moe_err_hint(err, "the file may be truncated or not a sequence file");
            return MOE_ERR_INPUT;
        }
        r->lineno++;
        if (r->line.l && r->line.s[r->line.l - 1] == '\r') r->line.s[--r->line.l] = '\0';
        if (r->line.l == 0) continue;
        char c = r->line.s[0];
        if (c == '>' || c == '@') {
            r->fmt = c == '>' ? MOE_SEQ_FASTA : MOE_SEQ_FASTQ;
            r->have_line = 1;
            return MOE_OK;
        }
        char shown[24];
        size_t n = r->line.l < 20 ? r->line.l : 20;
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)r->line.s[i];
            shown[i] = ch >= 32 && ch < 127 ? (char)ch : '.';
        }
        shown[n] = '\0';
        size_t letters = 0;
        while (letters < r->line.l && isalpha((unsigned char)r->line.s[letters]))
            letters++;
        if (letters == r->line.l)
            moe_err_set(err, MOE_ERR_INPUT, r->path,
                        "missing header: the input starts with sequence \"%s\" but no '>' or "
                        "'@' header line",
                        shown);
        else
            moe_err_set(err, MOE_ERR_INPUT, r->path,
                        "unknown file format: expected FASTA ('>'), FASTQ ('@'), SAM, BAM or "
                        "CRAM, found \"%s\"",
                        shown);
        moe_err_at_line(err, r->lineno, 1);
        moe_err_hint(err, "FASTA/FASTQ may be plain, gzip or bgzip; a FASTA file must start "
                          "with a '>' header line");
        return MOE_ERR_INPUT;
    }
}

int moe_seqio_part_where(const moe_seq_reader *r, int64_t key) {
    if (!r->part_by_pos) return 0;
    return key < r->part_lo ? -1 : key >= r->part_hi ? 1 : 0;
}

/* floor(size * i / n) without overflow. */
static int64_t share_start(int64_t size, int64_t i, int64_t n) {
    return size / n * i + size % n * i / n;
}

/* Checks the part options and sets the position range of r's part. */
static moe_status part_setup(moe_seq_reader *r, const moe_seqio_opts *o, moe_err *err) {
    if (o->n_parts <= 1) return MOE_OK;
    const char *why = strcmp(r->path, "-") == 0 ? "stdin" : o->n_regions > 0 ? "--region" : NULL;
    struct stat st;
    if (!why && stat(r->path, &st) != 0) return moe_err_errno(err, r->path, "cannot stat");
    if (o->part < 0 || o->part >= o->n_parts) why = "a part number outside 1..N";
    if (why) {
        moe_err_set(err, MOE_ERR_INPUT, r->path, "--part cannot be used with %s", why);
        moe_err_hint(err, "--part I/N (1 <= I <= N) splits one input file; select regions "
                          "with one run per region list instead");
        return MOE_ERR_INPUT;
    }
    r->part_lo = share_start((int64_t)st.st_size, o->part, o->n_parts);
    r->part_hi = o->part == o->n_parts - 1
                     ? INT64_MAX
                     : share_start((int64_t)st.st_size, o->part + 1, o->n_parts);
    r->part_by_pos = 1;
    return MOE_OK;
}

int moe_seqio_read_ahead(const moe_seq_reader *r) {
    /* a CRAM job is a whole container (megabytes): those keep htslib's usual depth */
    int deep = r->opts.read_ahead > 0 && r->fmt != MOE_SEQ_CRAM;
    return deep ? r->opts.read_ahead : 2 * r->opts.threads;
}

/* Compressed files smaller than this are decompressed without htslib's threads: starting
 * them for a file and waiting for its first block costs more than decoding a few blocks. */
#define MOE_SEQIO_THREADS_MIN_BYTES ((off_t)256 << 10)

/* 1 when path is a regular file smaller than MOE_SEQIO_THREADS_MIN_BYTES. */
static int small_file(const char *path) {
    struct stat st;
    return strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           st.st_size < MOE_SEQIO_THREADS_MIN_BYTES;
}

moe_status moe_seqio_open(moe_seq_reader **out, const char *path, const moe_seqio_opts *o,
                          moe_err *err) {
    *out = NULL;
    moe_seq_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    r->opts = *o;
    r->opts.regions = NULL;
    if (r->opts.threads > 0 && small_file(path)) r->opts.threads = 0;
    if (o->n_regions > 0) {
        r->regions = calloc((size_t)o->n_regions, sizeof *r->regions);
        if (!r->regions) goto oom;
        for (; r->n_regions < o->n_regions; r->n_regions++)
            if (!(r->regions[r->n_regions] = strdup(o->regions[r->n_regions]))) goto oom;
    }
    if (part_setup(r, o, err) != MOE_OK) {
        moe_seqio_close(r);
        return err->status;
    }
    hFILE *hf = hopen(path, "r");
    if (!hf) {
        moe_err_set(err, MOE_ERR_INPUT, path, "cannot open: %s", strerror(errno));
        moe_seqio_close(r);
        return MOE_ERR_INPUT;
    }
    htsFormat fmt;
    if (hts_detect_format2(hf, path, &fmt) < 0) {
        hclose_abruptly(hf);
        moe_err_set(err, MOE_ERR_INPUT, path, "cannot read the start of the file: %s",
                    strerror(errno));
        moe_seqio_close(r);
        return MOE_ERR_INPUT;
    }
    moe_status st = MOE_OK;
    if (fmt.format == sam || fmt.format == bam || fmt.format == cram) {
        r->fmt = fmt.format == sam ? MOE_SEQ_SAM : fmt.format == bam ? MOE_SEQ_BAM : MOE_SEQ_CRAM;
        st = moe_seqio_sam_open(r, hf, err); /* takes hf */
    } else {
        r->bgzf = bgzf_hopen(hf, "r");
        if (!r->bgzf) {
            hclose_abruptly(hf);
            moe_err_set(err, MOE_ERR_INPUT, path, "cannot open as plain, gzip or bgzip text");
            moe_seqio_close(r);
            return MOE_ERR_INPUT;
        }
        if (fmt.compression == bgzf && strcmp(path, "-") != 0 && bgzf_check_EOF(r->bgzf) == 0) {
            moe_err_set(err, MOE_ERR_INPUT, path,
                        "BGZF end-of-file marker missing: the file is "
                        "truncated");
            moe_err_hint(err, "re-create or re-download the file");
            st = MOE_ERR_INPUT;
        }
        if (st == MOE_OK && fmt.compression == bgzf && r->opts.threads > 0) {
            if (r->opts.pool)
                bgzf_thread_pool(r->bgzf, r->opts.pool, moe_seqio_read_ahead(r));
            else
                bgzf_mt(r->bgzf, r->opts.threads, 64);
        }
        if (st == MOE_OK) st = sniff_fastx(r, err);
        if (st == MOE_OK && r->part_by_pos &&
            moe_seqio_part_seek(r, fmt.compression == bgzf, err) < 0)
            st = err->status;
        if (st == MOE_OK && r->n_regions > 0) {
            bgzf_close(r->bgzf);
            r->bgzf = NULL;
            r->have_line = 0;
            if (r->fmt != MOE_SEQ_FASTA || strcmp(path, "-") == 0) {
                moe_err_set(err, MOE_ERR_INPUT, path,
                            "--region needs an indexed FASTA file (not %s, not stdin)",
                            strcmp(path, "-") == 0 ? "a pipe" : moe_seqio_format_name(r->fmt));
                moe_err_hint(err, "regions work on FASTA (plain or bgzip, faidx) and on indexed "
                                  "BAM/CRAM");
                st = MOE_ERR_INPUT;
            } else
                st = moe_seqio_fai_open(r, err);
        }
    }
    if (st != MOE_OK) {
        moe_seqio_close(r);
        return st;
    }
    *out = r;
    return MOE_OK;
oom:
    moe_seqio_close(r);
    return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
}

int moe_seqio_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    memset(rec, 0, sizeof *rec);
    if (r->fai) return moe_seqio_fai_next(r, rec, err);
    if (r->hts) return moe_seqio_sam_next(r, rec, err);
    return moe_seqio_fastx_next(r, rec, err);
}

moe_seq_format moe_seqio_format(const moe_seq_reader *r) {
    return r->fmt;
}
int64_t moe_seqio_n_read(const moe_seq_reader *r) {
    return r->n_read;
}
int64_t moe_seqio_n_filtered(const moe_seq_reader *r) {
    return r->n_filtered;
}
int64_t moe_seqio_n_kept(const moe_seq_reader *r) {
    return r->n_kept;
}
int64_t moe_seqio_n_empty(const moe_seq_reader *r) {
    return r->n_empty;
}

void moe_seqio_free_regions(char **regions, int n) {
    for (int i = 0; regions && i < n; i++)
        free(regions[i]);
    free(regions);
}

moe_status moe_seqio_read_bed(const char *path, char ***regions, int *n, moe_err *err) {
    *regions = NULL;
    *n = 0;
    /* through htslib, so a bgzipped (or gzipped) BED reads as the plain text */
    htsFile *fp = access(path, R_OK) == 0 ? hts_open(path, "r") : NULL; /* no htslib noise */
    if (!fp) {
        moe_err_set(err, MOE_ERR_INPUT, path, "cannot open BED file: %s", strerror(errno));
        return MOE_ERR_INPUT;
    }
    kstring_t ks = {0, 0, NULL};
    char **list = NULL, *line;
    int count = 0, alloc = 0, got;
    int64_t lineno = 0;
    moe_status st = MOE_OK;
    while (st == MOE_OK && (got = hts_getline(fp, '\n', &ks)) >= 0) {
        lineno++;
        line = ks.s;
        char chrom[1024];
        long long beg, end;
        if (line[0] == '#' || line[0] == '\0' || line[0] == '\r' ||
            strncmp(line, "track", 5) == 0 || strncmp(line, "browser", 7) == 0)
            continue;
        if (sscanf(line, "%1023s %lld %lld", chrom, &beg, &end) != 3 || beg < 0 || end <= beg) {
            moe_err_set(err, MOE_ERR_INPUT, path,
                        "expected \"chrom<TAB>start<TAB>end\" with 0 <= start < end");
            moe_err_at_line(err, lineno, 0);
            moe_err_hint(err, "BED coordinates are 0-based, end exclusive");
            st = MOE_ERR_INPUT;
            break;
        }
        if (count == alloc) {
            alloc = alloc ? 2 * alloc : 16;
            char **nl = realloc(list, (size_t)alloc * sizeof *nl);
            if (!nl) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
                break;
            }
            list = nl;
        }
        size_t need = strlen(chrom) + 48;
        if (!(list[count] = malloc(need))) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
            break;
        }
        /* {chrom} braces keep names containing ':' unambiguous for htslib */
        snprintf(list[count++], need, "{%s}:%lld-%lld", chrom, beg + 1, end);
    }
    if (st == MOE_OK && got < -1) {
        moe_err_set(err, MOE_ERR_INPUT, path, "cannot read the BED file (damaged compression?)");
        moe_err_at_line(err, lineno + 1, 0);
        st = MOE_ERR_INPUT;
    }
    free(ks.s);
    hts_close(fp);
    if (st != MOE_OK) {
        moe_seqio_free_regions(list, count);
        return st;
    }
    *regions = list;
    *n = count;
    return MOE_OK;
}

int64_t moe_seqio_plain_gzip_size(const char *path) {
    struct stat st;
    if (strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    hFILE *hf = hopen(path, "r");
    htsFormat fmt;
    int gz = hf && hts_detect_format2(hf, path, &fmt) == 0 && fmt.compression == gzip;
    if (hf) hclose_abruptly(hf);
    return gz ? (int64_t)st.st_size : 0;
}

int64_t moe_seqio_seq_bytes(const moe_seq_record *rec) {
    return rec->raw == MOE_SEQ_RAW_NT16 ? (rec->len + 1) / 2 : rec->len;
}

int64_t moe_seqio_decode(const moe_seq_record *rec, char *out) {
    int64_t n = rec->len;
    if (rec->raw == MOE_SEQ_RAW_TEXT)
        n = moe_seqio_clean(rec->seq, rec->len, out);
    else if (rec->raw == MOE_SEQ_RAW_NT16)
        moe_seqio_unpack_nt16((const uint8_t *)rec->seq, n, rec->strand == '-', out);
    else
        memcpy(out, rec->seq, (size_t)n);
    out[n] = '\0';
    return n;
}

/* The complement of each IUPAC code, both cases (0: the byte is left as it is). A constant
 * table: the 256-entry one built per call cost more than a short window's bases. */
static const char COMPLEMENT[256] = {
    ['A'] = 'T', ['C'] = 'G', ['G'] = 'C', ['T'] = 'A', ['U'] = 'A', ['R'] = 'Y', ['Y'] = 'R',
    ['S'] = 'S', ['W'] = 'W', ['K'] = 'M', ['M'] = 'K', ['B'] = 'V', ['D'] = 'H', ['H'] = 'D',
    ['V'] = 'B', ['N'] = 'N', ['a'] = 't', ['c'] = 'g', ['g'] = 'c', ['t'] = 'a', ['u'] = 'a',
    ['r'] = 'y', ['y'] = 'r', ['s'] = 's', ['w'] = 'w', ['k'] = 'm', ['m'] = 'k', ['b'] = 'v',
    ['d'] = 'h', ['h'] = 'd', ['v'] = 'b', ['n'] = 'n',
};

/* The complement of base c (c itself when it has none). */
static char complement(char c) {
    char k = COMPLEMENT[(unsigned char)c];
    return k ? k : c;
}

void moe_seqio_revcomp(char *seq, int64_t n) {
    for (int64_t i = 0, j = n - 1; i <= j; i++, j--) {
        char a = complement(seq[i]), b = complement(seq[j]);
        seq[i] = b;
        seq[j] = a;
    }
}
