/* cli: see moe/cli.h. */
#include "moe/cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void moe_cli_command_line(int argc, char **argv, char *out, size_t n) {
    size_t k = 0;
    for (int i = 0; i < argc && k + 8 < n; i++) {
        const char *a = argv[i];
        int quote = !*a || strpbrk(a, " \t\n'\"\\$*?;&|<>()") != NULL;
        if (i) out[k++] = ' ';
        if (quote) out[k++] = '\'';
        for (; *a && k + 8 < n; a++) {
            if (*a == '\'' && quote) {
                memcpy(out + k, "'\\''", 4);
                k += 4;
            } else {
                out[k++] = *a == '\t' || *a == '\n' || *a == '\r' ? ' ' : *a;
            }
        }
        if (quote) out[k++] = '\'';
    }
    if (n < 8)
        k = 0;
    else if (k + 8 >= n)
        memcpy(out + (k = n - 4), "...", 3), k += 3;
    if (n) out[k] = 0;
}

int moe_cli_option_error(const char *prog, int opt, char **argv) {
    /* a short option is named by optopt (it may sit in a cluster like -qZ); a long one only
     * by its argument, the one getopt has just passed */
    const char *arg = optind > 0 ? argv[optind - 1] : "";
    int is_long = optopt == 0 || strncmp(arg, "--", 2) == 0;
    if (opt == ':' && is_long)
        return moe_cli_usage_error(prog, "option '%s' needs an argument", arg);
    if (opt == ':') return moe_cli_usage_error(prog, "option '-%c' needs an argument", optopt);
    if (is_long)
        return moe_cli_usage_error(prog, "unknown option '%.*s' (or an ambiguous abbreviation)",
                                   (int)strcspn(arg, "="), arg);
    return moe_cli_usage_error(prog, "unknown option '-%c'", optopt);
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

/* Takes ownership of r (freed on failure). 0 when out of memory. */
static int add_region(moe_cli_input *in, char *r) {
    char **nr = r ? realloc(in->regions, (size_t)(in->n_regions + 1) * sizeof *nr) : NULL;
    if (!nr) {
        free(r);
        return 0;
    }
    in->regions = nr;
    nr[in->n_regions++] = r;
    return 1;
}

int moe_cli_input_option(const char *prog, moe_cli_input *in, moe_seqio_opts *io, int opt,
                         const char *arg) {
    char *end;
    long long v;
    switch (opt) {
    case 'r':
        return add_region(in, strdup(arg)) ? MOE_CLI_CONTINUE : 1;
    case MOE_CLI_OPT_REGIONS_FILE:
        in->regions_file = arg;
        return MOE_CLI_CONTINUE;
    case 'T':
        io->reference = arg;
        return MOE_CLI_CONTINUE;
    case MOE_CLI_OPT_AS_STORED:
        io->as_stored = 1;
        return MOE_CLI_CONTINUE;
    case MOE_CLI_OPT_MIN_MAPQ:
    case 'f':
    case 'F':
        v = strtoll(arg, &end, 0); /* flags may be written in hex: -F 0x904 */
        if (!*arg || *end || v < 0 || v > (opt == MOE_CLI_OPT_MIN_MAPQ ? 255 : 0xffff))
            return moe_cli_usage_error(
                prog, "expected %s, not '%s'",
                opt == MOE_CLI_OPT_MIN_MAPQ ? "a MAPQ 0..255" : "SAM flags 0..0xffff", arg);
        if (opt == MOE_CLI_OPT_MIN_MAPQ)
            io->min_mapq = (int)v;
        else if (opt == 'f')
            io->require_flags = (uint32_t)v;
        else
            io->exclude_flags = (uint32_t)v;
        return MOE_CLI_CONTINUE;
    default:
        return MOE_CLI_NOT_MINE;
    }
}

moe_status moe_cli_input_finish(moe_cli_input *in, moe_seqio_opts *io, moe_err *err) {
    if (in->regions_file) {
        char **bed = NULL;
        int n_bed = 0;
        if (moe_seqio_read_bed(in->regions_file, &bed, &n_bed, err) != MOE_OK) return err->status;
        for (int i = 0; i < n_bed; i++) {
            if (!add_region(in, bed[i])) {
                for (int j = i + 1; j < n_bed; j++)
                    free(bed[j]);
                free(bed);
                return moe_err_set(err, MOE_ERR_RUNTIME, in->regions_file, "out of memory");
            }
        }
        free(bed);
    }
    io->regions = (const char *const *)in->regions;
    io->n_regions = in->n_regions;
    return MOE_OK;
}

void moe_cli_input_free(moe_cli_input *in) {
    for (int i = 0; i < in->n_regions; i++)
        free(in->regions[i]);
    free(in->regions);
    memset(in, 0, sizeof *in);
}

int moe_cli_model_option(const char *prog, int opt, const char *arg, moe_device_kind *device,
                         int *bf16) {
    if (opt == MOE_CLI_OPT_DEVICE) {
        if (strcmp(arg, "cpu") == 0)
            *device = MOE_DEVICE_CPU;
        else if (strcmp(arg, "auto") == 0)
            *device = MOE_DEVICE_AUTO;
        else if (strcmp(arg, "cuda") == 0)
            *device = MOE_DEVICE_CUDA;
        else
            return moe_cli_usage_error(prog, "--device must be cpu, auto or cuda, not '%s'", arg);
        return MOE_CLI_CONTINUE;
    }
    if (opt != MOE_CLI_OPT_PRECISION) return MOE_CLI_NOT_MINE;
    if (strcmp(arg, "fp32") == 0)
        *bf16 = 0;
    else if (strcmp(arg, "bf16") == 0)
        *bf16 = 1;
    else
        return moe_cli_usage_error(prog, "--precision must be fp32 or bf16, not '%s'", arg);
    return MOE_CLI_CONTINUE;
}
