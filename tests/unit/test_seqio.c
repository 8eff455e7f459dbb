/* test_seqio: FASTA/FASTQ parsing from plain, gzip and bgzip files (CRLF, blank lines,
 * wrapped and very long lines, case kept), every FASTQ/FASTA error with its line number,
 * BED regions, reverse complement, SAM filtering/orientation on a tiny SAM written here, and
 * undecoded (raw) records decoding to exactly the records of a normal read.
 * Broken inputs are generated in the scratch directory, not stored. */
#include <htslib/bgzf.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "moe/log.h"
#include "moe/seqio.h"
#include "testlib.h"

static void write_file(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    fputs(text, fp);
    fclose(fp);
}

/* Reads every record; concatenates "name:seq;" into out; returns count or -1 on error. */
static int read_all(const char *path, const moe_seqio_opts *o, char *out, size_t cap,
                    moe_err *err) {
    moe_seq_reader *r = NULL;
    moe_err_clear(err);
    out[0] = '\0';
    if (moe_seqio_open(&r, path, o, err) != MOE_OK) return -1;
    moe_seq_record rec;
    int n = 0, ret;
    size_t used = 0;
    while ((ret = moe_seqio_next(r, &rec, err)) == 1) {
        CHECK_INT_EQ((int64_t)strlen(rec.seq), rec.len);
        if (rec.qual) CHECK_INT_EQ((int64_t)strlen(rec.qual), rec.len);
        int w = snprintf(out + used, cap - used, "%s%s:%s", n ? ";" : "", rec.name,
                         rec.len < 40 ? rec.seq : "(long)");
        used += (size_t)w < cap - used ? (size_t)w : 0;
        n++;
    }
    moe_seqio_close(r);
    return ret < 0 ? -1 : n;
}

static void test_fasta_variants(void) {
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    char out[4096];
    const char *text = ">a first record\r\nACGT\r\nacgn\r\n\r\n>b\nRY K\n\n>empty\n>c\nTT";
    write_file("v.fa", text);
    CHECK_INT_EQ(read_all("v.fa", &o, out, sizeof out, &err), 3);
    CHECK_MSG(strcmp(out, "a:ACGTacgn;b:RYK;c:TT") == 0, "got %s", out);
    /* the same bytes gzip- and bgzip-compressed */
    gzFile gz = gzopen("v.fa.gz", "wb");
    gzputs(gz, text);
    gzclose(gz);
    CHECK_INT_EQ(read_all("v.fa.gz", &o, out, sizeof out, &err), 3);
    CHECK(strcmp(out, "a:ACGTacgn;b:RYK;c:TT") == 0);
    BGZF *bg = bgzf_open("v.fa.bgz", "w");
    CHECK(bgzf_write(bg, text, strlen(text)) == (ssize_t)strlen(text));
    bgzf_close(bg);
    CHECK_INT_EQ(read_all("v.fa.bgz", &o, out, sizeof out, &err), 3);
    CHECK(strcmp(out, "a:ACGTacgn;b:RYK;c:TT") == 0);

    /* a 3 MB single-line record */
    FILE *fp = fopen("long.fa", "wb");
    fputs(">long\n", fp);
    for (int i = 0; i < 3 * 1024 * 1024; i++)
        fputc("ACGT"[i % 4], fp);
    fputs("\n>short\nAC\n", fp);
    fclose(fp);
    moe_seq_reader *r = NULL;
    moe_err_clear(&err);
    CHECK(moe_seqio_open(&r, "long.fa", &o, &err) == MOE_OK);
    moe_seq_record rec;
    if (r) {
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK_INT_EQ(rec.len, 3 * 1024 * 1024);
        CHECK(rec.seq[rec.len - 1] == 'T');
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(strcmp(rec.name, "short") == 0 && rec.line == 3);
        CHECK(moe_seqio_next(r, &rec, &err) == 0);
        CHECK_INT_EQ(moe_seqio_format(r), MOE_SEQ_FASTA);
        moe_seqio_close(r);
    }

    /* 3,000 records of 1..997 bases in lines of 60 (1.6 MB): headers and line breaks fall
     * across the growing fills (64 KB, then 128 KB, ... up to 1 MB) */
    fp = fopen("many.fa", "wb");
    for (int k = 0; k < 3000; k++) {
        fprintf(fp, ">r%d some comment\n", k);
        for (int i = 0; i < 1 + k * 331 % 997; i++)
            fputs(i % 60 == 59 ? "C\n" : "A", fp);
        fputc('\n', fp);
    }
    fclose(fp);
    r = NULL;
    CHECK(moe_seqio_open(&r, "many.fa", &o, &err) == MOE_OK);
    int64_t line = 1;
    for (int k = 0; r && k < 3000; k++) {
        int n = 1 + k * 331 % 997;
        char name[16];
        snprintf(name, sizeof name, "r%d", k);
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(strcmp(rec.name, name) == 0 && rec.line == line);
        CHECK_INT_EQ(rec.len, n);
        CHECK(rec.seq[n - 1] == (n % 60 == 0 ? 'C' : 'A'));
        line += 1 + (n + 59) / 60 + (n % 60 != 0 ? 0 : 1);
    }
    if (r) {
        CHECK(moe_seqio_next(r, &rec, &err) == 0);
        moe_seqio_close(r);
    }
}

static void expect_error(const char *name, const char *text, int64_t line, const char *what) {
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    char out[4096];
    write_file(name, text);
    CHECK_MSG(read_all(name, &o, out, sizeof out, &err) == -1, "%s accepted", name);
    CHECK_MSG(err.status == MOE_ERR_INPUT, "%s: status %d", name, err.status);
    CHECK_MSG(strcmp(err.file, name) == 0, "%s: file '%s'", name, err.file);
    CHECK_MSG(err.line == line, "%s: line %lld, want %lld (%s)", name, (long long)err.line,
              (long long)line, err.msg);
    CHECK_MSG(strstr(err.msg, what) != NULL, "%s: message '%s' lacks '%s'", name, err.msg, what);
}

static void test_fastq(void) {
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    char out[4096];
    /* wrapped FASTQ, '@' at the start of a quality line, '+' repeating the name */
    write_file("ok.fq", "@r1 x\nACGT\nAC\n+r1 x\n@@II\nII\n@r2\nacgu\n+\nIIII\n");
    CHECK_INT_EQ(read_all("ok.fq", &o, out, sizeof out, &err), 2);
    CHECK_MSG(strcmp(out, "r1:ACGTAC;r2:acgu") == 0, "got %s", out);
    write_file("crlf.fq", "@r1\r\nACGT\r\n+\r\nIIII\r\n@r2\r\nGG\r\n+r2\r\nII");
    CHECK_INT_EQ(read_all("crlf.fq", &o, out, sizeof out, &err), 2);
    CHECK_MSG(strcmp(out, "r1:ACGT;r2:GG") == 0, "got %s", out);

    expect_error("noheader.fa", "ACGT\n>a\nAC\n", 1, "missing header");
    expect_error("noheader2.fq", "@a\nAC\n+\nII\nAC\n", 5, "expected a header");
    expect_error("trunc.fq", "@a\nACGT\n+\nIIII\n@b\nACGT\n", 6, "truncated");
    expect_error("truncq.fq", "@a\nACGT\n+\nII", 3, "truncated");
    expect_error("longq.fq", "@a\nACGT\n+\nIIIIII\n", 1, "6 quality characters for 4 bases");
    expect_error("diffid.fq", "@a\nACGT\n+b\nIIII\n", 3, "different record");
    expect_error("noplus.fq", "@a\nACGT\n@b\nACGT\n+\nIIII\n", 3, "'+' line");
    expect_error("badq.fq", "@a\nACGT\n+\nII I\n", 4, "outside");
    expect_error("junk.txt", "hello world\n", 1, "unknown file format");
    /* an empty FASTQ record is skipped, not an error */
    write_file("empty.fq", "@e\n\n+\n\n@f\nA\n+\nI\n");
    moe_log_init("test_seqio", MOE_LOG_ERROR);
    CHECK_INT_EQ(read_all("empty.fq", &o, out, sizeof out, &err), 1);
    CHECK(strcmp(out, "f:A") == 0);
    /* gzip truncated in the middle of the stream */
    gzFile gz = gzopen("cut.fa.gz", "wb");
    for (int i = 0; i < 20000; i++)
        gzprintf(gz, ">r%d\nACGTTGCAACGTAGCTAGCTAGGATCGATCG%d\n", i, i);
    gzclose(gz);
    FILE *fp = fopen("cut.fa.gz", "rb");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    fp = fopen("cut2.fa.gz", "wb");
    fwrite(buf, 1, (size_t)n / 2, fp);
    fclose(fp);
    free(buf);
    CHECK(read_all("cut2.fa.gz", &o, out, sizeof out, &err) == -1 && err.status == MOE_ERR_INPUT);
    CHECK(read_all("missing.fa", &o, out, sizeof out, &err) == -1 &&
          strstr(err.msg, "cannot open"));
}

static void test_sam(void) {
    /* flags: 0 kept, 16 reverse (restored), 256 secondary, 2048 supplementary, 1024 dup,
       512 qcfail, 4 unmapped (MAPQ 0) */
    write_file("t.sam", "@HD\tVN:1.6\n@SQ\tSN:c\tLN:100\n"
                        "f\t0\tc\t1\t60\t4M\t*\t0\t0\tACGG\tABCD\n"
                        "r\t16\tc\t1\t60\t4M\t*\t0\t0\tAACC\tABCD\n"
                        "s\t256\tc\t1\t60\t4M\t*\t0\t0\tACGT\t*\n"
                        "p\t2048\tc\t1\t60\t4M\t*\t0\t0\tACGT\t*\n"
                        "d\t1024\tc\t1\t60\t4M\t*\t0\t0\tACGT\t*\n"
                        "q\t512\tc\t1\t60\t4M\t*\t0\t0\tACGT\t*\n"
                        "u\t4\t*\t0\t0\t*\t*\t0\t0\tTTTA\t*\n");
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    char out[4096];
    CHECK_INT_EQ(read_all("t.sam", &o, out, sizeof out, &err), 3);
    CHECK_MSG(strcmp(out, "f:ACGG;r:GGTT;u:TTTA") == 0, "got %s", out);
    o.as_stored = 1;
    CHECK_INT_EQ(read_all("t.sam", &o, out, sizeof out, &err), 3);
    CHECK(strcmp(out, "f:ACGG;r:AACC;u:TTTA") == 0);
    o.min_mapq = 1;
    CHECK_INT_EQ(read_all("t.sam", &o, out, sizeof out, &err), 2);
    o.min_mapq = 0;
    o.exclude_flags = 0;
    CHECK_INT_EQ(read_all("t.sam", &o, out, sizeof out, &err), 7);
    o.require_flags = 16;
    CHECK_INT_EQ(read_all("t.sam", &o, out, sizeof out, &err), 1);
    /* reverse-strand qualities are reversed too */
    moe_seqio_opts_defaults(&o);
    moe_seq_reader *r = NULL;
    moe_err_clear(&err);
    CHECK(moe_seqio_open(&r, "t.sam", &o, &err) == MOE_OK);
    moe_seq_record rec;
    if (r) {
        CHECK(moe_seqio_next(r, &rec, &err) == 1 && rec.strand == '+');
        CHECK(moe_seqio_next(r, &rec, &err) == 1 && rec.strand == '-');
        CHECK(rec.qual && strcmp(rec.qual, "DCBA") == 0);
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(moe_seqio_next(r, &rec, &err) == 0);
        CHECK_INT_EQ(moe_seqio_n_read(r), 7);
        CHECK_INT_EQ(moe_seqio_n_filtered(r), 4);
        moe_seqio_close(r);
    }
    /* regions on SAM are refused with a hint */
    const char *reg[1] = {"c:1-10"};
    o.regions = reg;
    o.n_regions = 1;
    moe_err_clear(&err);
    CHECK(moe_seqio_open(&r, "t.sam", &o, &err) == MOE_ERR_INPUT && !r);
}

static void test_regions_and_helpers(void) {
    write_file("g.fa", ">c1\nACGTACGTAC\nGGGGG\n>c2 x\nttttaaaa\n");
    const char *reg[3] = {"c1:9-12", "c2", "c1:14-100"};
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    o.regions = reg;
    o.n_regions = 3;
    moe_seq_reader *r = NULL;
    moe_err err;
    moe_err_clear(&err);
    CHECK_MSG(moe_seqio_open(&r, "g.fa", &o, &err) == MOE_OK, "%s", err.msg);
    moe_seq_record rec;
    if (r) {
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(strcmp(rec.seq, "ACGG") == 0 && rec.src_start == 8 && rec.src_end == 12);
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(strcmp(rec.seq, "ttttaaaa") == 0 && strcmp(rec.name, "c2") == 0);
        CHECK(moe_seqio_next(r, &rec, &err) == 1);
        CHECK(strcmp(rec.seq, "GG") == 0 && rec.src_start == 13 && rec.src_end == 15);
        CHECK(moe_seqio_next(r, &rec, &err) == 0);
        moe_seqio_close(r);
    }
    const char *bad[1] = {"chrZ:1-5"};
    o.regions = bad;
    o.n_regions = 1;
    moe_err_clear(&err);
    CHECK(moe_seqio_open(&r, "g.fa", &o, &err) == MOE_ERR_INPUT && strstr(err.msg, "chrZ"));

    write_file("r.bed", "# comment\ntrack name=x\nc1\t0\t4\nc2\t2\t3\textra\n");
    char **regions = NULL;
    int n = 0;
    moe_err_clear(&err);
    CHECK(moe_seqio_read_bed("r.bed", &regions, &n, &err) == MOE_OK);
    CHECK_INT_EQ(n, 2);
    if (n == 2) {
        CHECK(strcmp(regions[0], "{c1}:1-4") == 0);
        CHECK(strcmp(regions[1], "{c2}:3-3") == 0);
    }
    moe_seqio_free_regions(regions, n);
    /* a bgzipped BED (r.bed.gz, as bgzip and tabix write it) reads the same */
    const char *bed = "c1\t0\t4\nc2\t2\t3\textra\n";
    BGZF *bz = bgzf_open("r.bed.gz", "w");
    CHECK(bz && bgzf_write(bz, bed, strlen(bed)) == (ssize_t)strlen(bed) && bgzf_close(bz) == 0);
    moe_err_clear(&err);
    CHECK_MSG(moe_seqio_read_bed("r.bed.gz", &regions, &n, &err) == MOE_OK, "bed.gz: %s", err.msg);
    CHECK_INT_EQ(n, 2);
    if (n == 2) CHECK(strcmp(regions[1], "{c2}:3-3") == 0);
    moe_seqio_free_regions(regions, n);
    write_file("bad.bed", "c1\t5\t2\n");
    moe_err_clear(&err);
    CHECK(moe_seqio_read_bed("bad.bed", &regions, &n, &err) == MOE_ERR_INPUT && err.line == 1);

    char s[] = "ACGTNRYacgtnU-";
    moe_seqio_revcomp(s, (int64_t)strlen(s));
    CHECK_MSG(strcmp(s, "-Anacgt"
                        "RYNACGT") == 0,
              "revcomp: %s", s);
}

/* Reads path normally and with opts.raw + moe_seqio_decode; every record must agree (name,
 * bases, line, strand, record number). Returns the number of records. */
static int check_raw_same(const char *path) {
    moe_seqio_opts o, raw;
    moe_seqio_opts_defaults(&o);
    raw = o;
    raw.raw = 1;
    moe_err err;
    moe_err_clear(&err);
    moe_seq_reader *a = NULL, *b = NULL;
    CHECK(moe_seqio_open(&a, path, &o, &err) == MOE_OK);
    CHECK(moe_seqio_open(&b, path, &raw, &err) == MOE_OK);
    int n = 0, ra, rb;
    moe_seq_record x, y;
    char *buf = NULL;
    while (a && b && (ra = moe_seqio_next(a, &x, &err)) == 1) {
        rb = moe_seqio_next(b, &y, &err);
        CHECK_INT_EQ(rb, 1);
        if (rb != 1) break;
        buf = realloc(buf, (size_t)y.len + 1);
        int64_t len = moe_seqio_decode(&y, buf);
        CHECK_MSG(len == x.len && memcmp(buf, x.seq, (size_t)len) == 0 && buf[len] == '\0',
                  "%s: record %d (%s) decodes differently", path, n + 1, x.name);
        CHECK(strcmp(x.name, y.name) == 0 && x.line == y.line && x.strand == y.strand &&
              x.record_no == y.record_no);
        n++;
    }
    if (a && b) CHECK_INT_EQ(moe_seqio_next(b, &y, &err), 0);
    free(buf);
    moe_seqio_close(a);
    moe_seqio_close(b);
    return n;
}

/* Reads path with opts.raw + keep_text, taking the text after every `every` records (and at
 * the end, giving the previous text back as the spare): each record decoded at its offset in
 * the text must be what a plain read gives. Returns the number of records. */
static int check_keep_text(const char *path, int every) {
    moe_seqio_opts o, keep;
    moe_seqio_opts_defaults(&o);
    keep = o;
    keep.raw = keep.keep_text = 1;
    moe_err err;
    moe_err_clear(&err);
    moe_seq_reader *a = NULL, *b = NULL;
    CHECK(moe_seqio_open(&a, path, &o, &err) == MOE_OK);
    CHECK(moe_seqio_open(&b, path, &keep, &err) == MOE_OK);
    enum { MAX_PENDING = 4 };
    char *want[MAX_PENDING] = {0}, *text = NULL, *buf = NULL;
    int64_t off[MAX_PENDING], len[MAX_PENDING];
    size_t cap = 0;
    int n = 0, pending = 0, done = 0;
    while (a && b && !done) {
        moe_seq_record x, y;
        int ra = moe_seqio_next(a, &x, &err), rb = moe_seqio_next(b, &y, &err);
        CHECK_INT_EQ(ra, rb);
        done = ra != 1 || rb != 1;
        if (!done) {
            off[pending] = moe_seqio_text_offset(b, &y);
            CHECK_MSG(off[pending] >= 0, "%s: record %d has no text offset", path, n + 1);
            len[pending] = y.len;
            want[pending++] = strdup(x.seq);
            n++;
        }
        if (pending < every && !done) continue;
        char *got = NULL;
        size_t got_cap = 0;
        CHECK_INT_EQ(moe_seqio_take_text(b, text, cap, &got, &got_cap, &err), 1);
        for (int i = 0; i < pending; i++) {
            moe_seq_record r = {.seq = got + off[i], .len = len[i], .raw = MOE_SEQ_RAW_TEXT};
            buf = realloc(buf, (size_t)len[i] + 1);
            int64_t l = moe_seqio_decode(&r, buf);
            CHECK_MSG(got && l == (int64_t)strlen(want[i]) && memcmp(buf, want[i], (size_t)l) == 0,
                      "%s: kept record %d of %d differs", path, n - pending + i + 1, n);
            free(want[i]);
        }
        pending = 0;
        text = got;
        cap = got_cap;
    }
    free(text);
    free(buf);
    moe_seqio_close(a);
    moe_seqio_close(b);
    return n;
}

static void test_raw(void) {
    /* CRLF, blanks and tabs, a CR inside a line, a '>' inside a line, blank lines, an empty
       record, a CR at the very end without a line break */
    write_file("raw.fa", "\n\n>a x\r\nAC GT\r\n\tac\rgn\r\n\r\n>b\nRY>K\n\n>empty\n\r\n>c\nTT\r");
    CHECK_INT_EQ(check_raw_same("raw.fa"), 3);
    write_file("raw2.fa", ">a\nACGT\nAC\n>b\nGG");
    CHECK_INT_EQ(check_raw_same("raw2.fa"), 2);
    /* a record longer than the 1 MB read block, with line breaks at every position modulo 7 */
    FILE *fp = fopen("raw3.fa", "wb");
    fputs(">long\n", fp);
    for (int i = 0; i < 3 * 1024 * 1024; i++)
        fputc(i % 61 == 60 ? '\n' : "ACGTN"[i % 5], fp);
    fputs("\n>s\nA\n", fp);
    fclose(fp);
    CHECK_INT_EQ(check_raw_same("raw3.fa"), 2);
    CHECK_INT_EQ(check_raw_same("t.sam"), 3); /* BAM codes, a reverse read among them */
    /* kept text: many records per fill, records spanning fills, the text taken mid-record */
    fp = fopen("keep.fa", "wb");
    for (int r = 0; r < 300; r++) {
        fprintf(fp, ">r%d\n", r);
        for (int i = 0; i < (r % 7) * 9000 + 5; i++)
            fputc(i % 70 == 69 ? '\n' : "ACGT"[(i + r) % 4], fp);
        fputs(r % 5 ? "\n" : "\n\n", fp);
    }
    fclose(fp);
    for (int every = 1; every <= 4; every++)
        CHECK_INT_EQ(check_keep_text("keep.fa", every), 300);
    CHECK_INT_EQ(check_keep_text("raw.fa", 2), 3);
    CHECK_INT_EQ(check_keep_text("raw3.fa", 1), 2);
    /* a reader that keeps no text says so and leaves the spare alone */
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    o.raw = o.keep_text = 1;
    moe_err err;
    moe_seq_reader *r = NULL;
    CHECK(moe_seqio_open(&r, "t.sam", &o, &err) == MOE_OK);
    moe_seq_record rec;
    CHECK_INT_EQ(moe_seqio_next(r, &rec, &err), 1);
    CHECK(moe_seqio_text_offset(r, &rec) == -1);
    char spare[8], *text = spare;
    size_t cap = 1;
    CHECK_INT_EQ(moe_seqio_take_text(r, spare, sizeof spare, &text, &cap, &err), 0);
    CHECK(text == NULL && cap == 0);
    moe_seqio_close(r);
}

int main(void) {
    test_fasta_variants();
    test_fastq();
    test_sam();
    test_regions_and_helpers();
    test_raw();
    return test_summary("test_seqio");
}
