/* cli: see moe/cli.h. */
#include "moe/cli.h"

#include <stdarg.h>
#include <stdio.h>

#include "moe/version.h"

int moe_cli_common_option(const char *prog, const char *usage, int opt, moe_log_level *level) {
    switch (opt) {
    case 'q':
        *level = MOE_LOG_WARN;
        return MOE_CLI_CONTINUE;
    case 'v':
        *level = MOE_LOG_DEBUG;
        return MOE_CLI_CONTINUE;
    case 'h':
        fputs(usage, stdout);
        return 0;
    case 'V':
        moe_version_print(stdout, prog);
        return 0;
    default: /* getopt has named the option */
        return moe_cli_usage_error(prog, "unknown option or missing argument");
    }
}

int moe_cli_usage_error(const char *prog, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: error: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nhint: see %s --help\n", prog);
    return 2;
}
