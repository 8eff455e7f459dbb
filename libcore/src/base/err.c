/* err: see moe/err.h. */
#include "moe/err.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

void moe_err_clear(moe_err *err) {
    if (err) memset(err, 0, sizeof *err);
}

moe_status moe_err_set(moe_err *err, moe_status status, const char *file, const char *fmt, ...) {
    if (!err || err->status != MOE_OK) return status;
    moe_err_clear(err);
    err->status = status;
    if (file) snprintf(err->file, sizeof err->file, "%s", file);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return status;
}

void moe_err_at_line(moe_err *err, int64_t line, int64_t col) {
    if (!err) return;
    err->line = line;
    err->col = col;
}

void moe_err_at_record(moe_err *err, int64_t record) {
    if (err) err->record = record;
}

void moe_err_hint(moe_err *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->hint, sizeof err->hint, fmt, ap);
    va_end(ap);
}

void moe_err_prefix(moe_err *err, const char *fmt, ...) {
    if (!err || err->status == MOE_OK) return;
    char pre[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(pre);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, pre, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3;
    size_t m = strnlen(old, rest);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
}

moe_status moe_err_errno(moe_err *err, const char *file, const char *what) {
    int e = errno;
    return moe_err_set(err, MOE_ERR_RUNTIME, file, "%s: %s", what, strerror(e));
}

void moe_err_print(const moe_err *err, const char *prog, FILE *fp) {
    if (!err || err->status == MOE_OK) return;
    fprintf(fp, "%s: error: ", prog);
    if (err->file[0]) {
        fputs(err->file, fp);
        if (err->line > 0) {
            fprintf(fp, ":%lld", (long long)err->line);
            if (err->col > 0) fprintf(fp, ":%lld", (long long)err->col);
        }
        fputs(": ", fp);
    }
    if (err->record > 0) fprintf(fp, "record %lld: ", (long long)err->record);
    fprintf(fp, "%s\n", err->msg);
    if (err->hint[0]) fprintf(fp, "hint: %s\n", err->hint);
}

int moe_err_exit_code(const moe_err *err) {
    if (!err || err->status == MOE_OK) return 0;
    return err->status == MOE_ERR_INPUT ? 2 : 1;
}
