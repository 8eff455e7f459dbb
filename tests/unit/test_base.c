/* test_base: the base layer the integrator wrote (err.h, log.h, fileio.h).
 *
 * Error records and how they print (file:line:col, record, hint, prefix, exit codes, first
 * error wins), log levels and the non-TTY progress line (stderr is captured into a file,
 * which is not a terminal), atomic output files (commit renames, abort and failures leave
 * nothing), mkdirs, remove_tree (never follows symlinks), read_file and CRC-32. Runs in the
 * ctest scratch directory; everything it creates lives under ./base_tmp. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/err.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "testlib.h"

#define TMP "base_tmp"

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Prints err into a string (static storage). */
static const char *printed(const moe_err *err, const char *prog) {
    static char buf[4096];
    FILE *fp = fmemopen(buf, sizeof buf, "w");
    moe_err_print(err, prog, fp);
    fclose(fp);
    return buf;
}

static void test_err(void) {
    moe_err err;
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_err_exit_code(&err), 0);
    CHECK(strcmp(printed(&err, "moe-x"), "") == 0);
    CHECK_INT_EQ(moe_err_set(&err, MOE_ERR_INPUT, "cfg.yaml", "unknown key '%s'", "stpes"),
                 MOE_ERR_INPUT);
    moe_err_at_line(&err, 3, 7);
    moe_err_hint(&err, "did you mean '%s'?", "steps");
    CHECK(strcmp(printed(&err, "moe-train"), "moe-train: error: cfg.yaml:3:7: unknown key 'stpes'\n"
                                             "hint: did you mean 'steps'?\n") == 0);
    CHECK_INT_EQ(moe_err_exit_code(&err), 2);
    /* the first error wins; a later set still returns its own status */
    CHECK_INT_EQ(moe_err_set(&err, MOE_ERR_RUNTIME, "other", "second"), MOE_ERR_RUNTIME);
    CHECK(strcmp(err.msg, "unknown key 'stpes'") == 0 && err.status == MOE_ERR_INPUT);
    moe_err_prefix(&err, "loading %s", "run.yaml");
    CHECK(strcmp(err.msg, "loading run.yaml: unknown key 'stpes'") == 0);

    moe_err_clear(&err);
    moe_err_set(&err, MOE_ERR_INPUT, "reads.fq", "quality string shorter than sequence");
    moe_err_at_record(&err, 12);
    CHECK(strcmp(printed(&err, "moe-tokenize"),
                 "moe-tokenize: error: reads.fq: record 12: quality string shorter than "
                 "sequence\n") == 0);
    moe_err_clear(&err);
    moe_err_set(&err, MOE_ERR_INPUT, "a.txt", "bad");
    moe_err_at_line(&err, 9, 0); /* line without column */
    CHECK(strcmp(printed(&err, "p"), "p: error: a.txt:9: bad\n") == 0);
    moe_err_clear(&err);
    moe_err_set(&err, MOE_ERR_RUNTIME, NULL, "out of memory");
    CHECK(strcmp(printed(&err, "p"), "p: error: out of memory\n") == 0);
    CHECK_INT_EQ(moe_err_exit_code(&err), 1);
    CHECK_INT_EQ(moe_err_exit_code(NULL), 0);

    /* errno text, NULL err tolerated, very long prefix and message stay terminated */
    moe_err_clear(&err);
    errno = ENOENT;
    CHECK_INT_EQ(moe_err_errno(&err, "x.bin", "cannot open"), MOE_ERR_RUNTIME);
    CHECK(strcmp(err.msg, "cannot open: No such file or directory") == 0);
    CHECK_INT_EQ(moe_err_set(NULL, MOE_ERR_INPUT, NULL, "ignored"), MOE_ERR_INPUT);
    moe_err_hint(NULL, "x");
    moe_err_prefix(NULL, "x");
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    moe_err_clear(&err);
    moe_err_set(&err, MOE_ERR_INPUT, big, "%s", big);
    moe_err_prefix(&err, "%s", big);
    CHECK(strlen(err.msg) == sizeof err.msg - 1 && strlen(err.file) == sizeof err.file - 1);
    /* prefix on a cleared error does nothing */
    moe_err_clear(&err);
    moe_err_prefix(&err, "ctx");
    CHECK(err.msg[0] == '\0');
}

/* Runs fn with stderr redirected into a file; returns the captured text (static storage). */
static const char *capture_stderr(void (*fn)(void)) {
    static char buf[8192];
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *tmp = fopen(TMP "/stderr.txt", "w+");
    dup2(fileno(tmp), STDERR_FILENO);
    fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
    return buf;
}

static void log_some(void) {
    moe_log_init("moe-test", MOE_LOG_WARN);
    moe_log_info("hidden %d", 1);
    moe_log_debug("hidden %d", 2);
    moe_log_warn("shown %d", 3);
    moe_log(MOE_LOG_ERROR, "shown %d", 4);
    moe_log_init("moe-test", MOE_LOG_INFO);
}

static void progress_some(void) {
    moe_progress p;
    moe_progress_start(&p, "tokenize", "bases", 1000);
    p.interval = 0.0; /* a plain line on every update */
    moe_progress_update(&p, 500, "shard 1");
    moe_progress_finish(&p, NULL);
    moe_progress_start(&p, "scan", "reads", 0); /* unknown total */
    p.interval = 0.0;
    moe_progress_update(&p, 1234567, NULL);
}

static void test_log(void) {
    const char *out = capture_stderr(log_some);
    CHECK(strstr(out, "hidden") == NULL);
    CHECK(strstr(out, "moe-test: warning: shown 3\n") != NULL);
    CHECK(strstr(out, "moe-test: error: shown 4\n") != NULL);
    CHECK(out[0] == '[' && out[9] == ']'); /* [HH:MM:SS] */
    CHECK_INT_EQ(moe_log_get_level(), MOE_LOG_INFO);
    out = capture_stderr(progress_some);
    CHECK_MSG(strstr(out, "tokenize: 500/1.00k bases (50%), ") != NULL, "progress: %s", out);
    CHECK(strstr(out, ", shard 1\n") != NULL);
    /* two tokenize lines: the update and the final one */
    const char *second = strstr(out, "tokenize: ");
    CHECK(second && strstr(second + 1, "tokenize: 500/1.00k bases (50%), ") != NULL);
    CHECK(strstr(out, "scan: 1.23M reads") != NULL);
    /* plain lines start with a UTC date; the update (not the final line) has an ETA */
    CHECK_MSG(strncmp(out, "[20", 3) == 0 && out[11] == 'T' && out[20] == 'Z' && out[21] == ']',
              "progress date: %s", out);
    const char *upd = strstr(out, "tokenize: ");
    const char *fin = upd ? strstr(upd + 1, "tokenize: ") : NULL;
    const char *eta = upd ? strstr(upd, ", ETA ") : NULL;
    CHECK_MSG(eta && fin && eta < fin && strstr(fin, "ETA") == NULL, "progress ETA: %s", out);
    CHECK(strchr(out, '\r') == NULL && strstr(out, "\033[") == NULL); /* no TTY drawing */
    double t0 = moe_time_now(), t1 = moe_time_now();
    CHECK(t1 >= t0 && t0 > 0);
}

static void test_outfile(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_outfile f;
    char tmpname[256];
    snprintf(tmpname, sizeof tmpname, TMP "/.out.bin.tmp.%ld", (long)getpid());
    CHECK_INT_EQ(moe_outfile_open(&f, TMP "/out.bin", &err), MOE_OK);
    CHECK(exists(tmpname) && !exists(TMP "/out.bin"));
    CHECK_INT_EQ(moe_outfile_write(&f, "hello ", 6, &err), MOE_OK);
    CHECK_INT_EQ(moe_outfile_write(&f, "world", 5, &err), MOE_OK);
    CHECK_INT_EQ(moe_outfile_commit(&f, &err), MOE_OK);
    CHECK(!exists(tmpname));
    char *data = NULL;
    size_t len = 0;
    CHECK_INT_EQ(moe_read_file(TMP "/out.bin", &data, &len, &err), MOE_OK);
    CHECK(len == 11 && data && strcmp(data, "hello world") == 0);
    free(data);

    /* abort: nothing under either name; an existing final file is untouched */
    CHECK_INT_EQ(moe_outfile_open(&f, TMP "/out.bin", &err), MOE_OK);
    moe_outfile_write(&f, "partial", 7, &err);
    moe_outfile_abort(&f);
    CHECK(!exists(tmpname));
    CHECK_INT_EQ(moe_read_file(TMP "/out.bin", &data, &len, &err), MOE_OK);
    CHECK(len == 11);
    free(data);
    CHECK_INT_EQ(moe_outfile_open(&f, TMP "/new.bin", &err), MOE_OK);
    moe_outfile_abort(&f);
    CHECK(!exists(TMP "/new.bin"));

    /* a directory that does not exist: an input error naming the file, with a hint */
    CHECK_INT_EQ(moe_outfile_open(&f, TMP "/no/such/dir/x.bin", &err), MOE_ERR_INPUT);
    CHECK_INT_EQ(moe_err_exit_code(&err), 2);
    CHECK(strcmp(err.file, TMP "/no/such/dir/x.bin") == 0 && err.hint[0] != '\0');
    CHECK(strstr(err.msg, "No such file or directory") != NULL);
    CHECK(f.fp == NULL && f.path == NULL && f.tmp == NULL);
    moe_err_clear(&err);
    /* stdout: commit flushes */
    CHECK_INT_EQ(moe_outfile_open(&f, "-", &err), MOE_OK);
    CHECK(f.fp == stdout && f.tmp == NULL);
    CHECK_INT_EQ(moe_outfile_commit(&f, &err), MOE_OK);
}

static void test_dirs(void) {
    moe_err err;
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/c", &err), MOE_OK);
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/c/", &err), MOE_OK); /* exists, trailing slash */
    CHECK_INT_EQ(moe_fsync_dir(TMP "/a/b", &err), MOE_OK);
    FILE *fp = fopen(TMP "/a/b/file", "w");
    fputs("x", fp);
    fclose(fp);
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/file", &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "not a directory") != NULL);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/file/sub", &err), MOE_ERR_INPUT);
    CHECK_INT_EQ(moe_err_exit_code(&err), 2);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/file/sub", NULL), MOE_ERR_INPUT); /* NULL err is allowed */
    CHECK_INT_EQ(moe_fsync_dir(TMP "/nope", &err), MOE_ERR_RUNTIME);
    /* a second failure keeps the first error, status included */
    CHECK_INT_EQ(moe_mkdirs(TMP "/a/b/file/sub", &err), MOE_ERR_INPUT);
    CHECK_INT_EQ(err.status, MOE_ERR_RUNTIME);
    CHECK(strstr(err.file, "nope") != NULL);
    moe_err_clear(&err);

    /* remove_tree: removes files and nested dirs, never follows symlinks */
    CHECK_INT_EQ(moe_mkdirs(TMP "/keep", &err), MOE_OK);
    fp = fopen(TMP "/keep/precious", "w");
    fclose(fp);
    CHECK(symlink("../../keep", TMP "/a/b/link") == 0);
    CHECK(symlink("keep", TMP "/toplink") == 0);
    CHECK_INT_EQ(moe_remove_tree(TMP "/a", &err), MOE_OK);
    CHECK(!exists(TMP "/a"));
    CHECK(exists(TMP "/keep/precious"));
    CHECK_INT_EQ(moe_remove_tree(TMP "/toplink", &err), MOE_OK); /* the link, not its target */
    CHECK(!exists(TMP "/toplink") && exists(TMP "/keep/precious"));
    CHECK_INT_EQ(moe_remove_tree(TMP "/does-not-exist", &err), MOE_OK);
    CHECK_INT_EQ(moe_remove_tree("", &err), MOE_ERR_RUNTIME);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_remove_tree("/", &err), MOE_ERR_RUNTIME);
    moe_err_clear(&err);
}

static void test_read_crc(void) {
    moe_err err;
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_crc32(0, "123456789", 9), 0xCBF43926u); /* the CRC-32 check value */
    CHECK_INT_EQ(moe_crc32(moe_crc32(0, "1234", 4), "56789", 5), 0xCBF43926u);
    CHECK_INT_EQ(moe_crc32(0, "", 0), 0);
    /* a file bigger than read_file's first buffer (64 KiB) */
    enum { N = 200003 };
    char *big = malloc(N);
    for (int i = 0; i < N; i++)
        big[i] = (char)('a' + i % 26);
    FILE *fp = fopen(TMP "/big.txt", "wb");
    fwrite(big, 1, N, fp);
    fclose(fp);
    char *data = NULL;
    size_t len = 0;
    CHECK_INT_EQ(moe_read_file(TMP "/big.txt", &data, &len, &err), MOE_OK);
    CHECK(len == N && data && memcmp(data, big, N) == 0 && data[N] == '\0');
    uint32_t crc = 0;
    uint64_t size = 0;
    CHECK_INT_EQ(moe_crc32_file(TMP "/big.txt", &crc, &size, &err), MOE_OK);
    CHECK(size == N && crc == moe_crc32(0, big, N));
    free(data);
    free(big);
    /* several 32 MiB segments, summed in parallel: the same CRC as one pass */
    size_t huge_n = (size_t)72 << 20 | 5;
    unsigned char *huge = malloc(huge_n);
    for (size_t i = 0; i < huge_n; i++)
        huge[i] = (unsigned char)(i * 2654435761u >> 13);
    fp = fopen(TMP "/huge.bin", "wb");
    fwrite(huge, 1, huge_n, fp);
    fclose(fp);
    CHECK_INT_EQ(moe_crc32_file(TMP "/huge.bin", &crc, &size, &err), MOE_OK);
    CHECK(size == huge_n && crc == moe_crc32(0, huge, huge_n));
    remove(TMP "/huge.bin");
    free(huge);
    CHECK_INT_EQ(moe_read_file(TMP "/missing.txt", &data, &len, &err), MOE_ERR_INPUT);
    CHECK(data == NULL && strcmp(err.file, TMP "/missing.txt") == 0);
    CHECK_INT_EQ(moe_err_exit_code(&err), 2);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_read_file(TMP "/missing.txt", &data, &len, NULL), MOE_ERR_INPUT);
    CHECK_INT_EQ(moe_crc32_file(TMP "/missing.txt", &crc, &size, &err), MOE_ERR_RUNTIME);
}

int main(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree(TMP, &err);
    if (moe_mkdirs(TMP, &err) != MOE_OK) {
        moe_err_print(&err, "test_base", stderr);
        return 1;
    }
    test_err();
    test_log();
    test_outfile();
    test_dirs();
    test_read_crc();
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_remove_tree(TMP, &err), MOE_OK);
    return test_summary("test_base");
}
