/* err: the status type and error record every libcore function reports through.
 *
 * A function that can fail takes `moe_err *err` last and returns a moe_status; on failure
 * it fills *err with a message, the place in the input that caused it (file, line/column
 * or record number) and, where we can tell the user what to do, a hint. Tools print it with
 * moe_err_print() and exit with moe_err_exit_code(): 2 for usage/input errors, 1 for runtime
 * failures. The first error set wins: callers higher up add context with moe_err_prefix(). */
#ifndef MOE_ERR_H
#define MOE_ERR_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moe_status {
    MOE_OK = 0,
    MOE_ERR_RUNTIME = 1, /* out of memory, I/O failure, CUDA error: not the user's input */
    MOE_ERR_INPUT = 2,   /* bad input file, bad option, bad config: the user can fix it */
} moe_status;

typedef struct moe_err {
    moe_status status;
    char msg[1024];
    char file[512]; /* input file the problem is in, "" if none */
    int64_t line;   /* 1-based line in file, 0 if not known */
    int64_t col;    /* 1-based column, 0 if not known */
    int64_t record; /* 1-based record number (FASTA/FASTQ/BAM record, shard document), 0 if none */
    char hint[512]; /* what the user can do about it, "" if nothing useful */
} moe_err;

void moe_err_clear(moe_err *err);

/* Sets status and message (printf-style); file may be NULL. Returns status so that
 * `return moe_err_set(...)` propagates. Does nothing (but still returns status) when err is
 * NULL or already holds an error. */
moe_status moe_err_set(moe_err *err, moe_status status, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Location details for the error just set. */
void moe_err_at_line(moe_err *err, int64_t line, int64_t col);
void moe_err_at_record(moe_err *err, int64_t record);
void moe_err_hint(moe_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "context: " to the message, e.g. moe_err_prefix(err, "reading %s", path). */
void moe_err_prefix(moe_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets a runtime error from errno: "<what>: <strerror(errno)>". */
moe_status moe_err_errno(moe_err *err, const char *file, const char *what);

/* Writes "prog: error: FILE:LINE:COL: message" (or "FILE: record N: message") and
 * "hint: ..." lines to fp. */
void moe_err_print(const moe_err *err, const char *prog, FILE *fp);
int moe_err_exit_code(const moe_err *err);

#ifdef __cplusplus
}
#endif

#endif
