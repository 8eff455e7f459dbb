/* cli: what the four tools share on the command line, so they behave alike - the
 * -q/-v/-h/-V options and the usage-error format ("prog: error: ..." + "hint: see prog
 * --help", exit 2). A tool's getopt loop hands every option it does not handle itself to
 * moe_cli_common_option(). */
#ifndef MOE_CLI_H
#define MOE_CLI_H

#include "moe/log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_cli_common_option's "not finished: keep parsing" result. */
#define MOE_CLI_CONTINUE (-1)

/* Handles -q, -v, -h (prints `usage` to stdout), -V (prints the version banner) and
 * anything else (getopt's '?'/':': an unknown option or a missing argument).
 * Returns MOE_CLI_CONTINUE after -q/-v (with *level set), else the exit code main should
 * return: 0 after --help/--version, 2 for anything else. */
int moe_cli_common_option(const char *prog, const char *usage, int opt, moe_log_level *level);

/* Prints "prog: error: <message>" and "hint: see prog --help" to stderr; returns 2. */
int moe_cli_usage_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
