/* cli: what the tools share on the command line, so they behave alike - the -q/-v/-h/-V
 * options, the usage-error format ("prog: error: ..." + "hint: see prog --help", exit 2),
 * the input-selection options of the tools that read sequences (moe-tokenize, moe-embed,
 * moe-score seq) and the model options of the inference tools (moe-embed, moe-score). A
 * tool's getopt loop offers each option first to moe_cli_input_option() (when it reads
 * sequences) and moe_cli_model_option() (when it runs a model), then handles its own, and
 * hands the rest to moe_cli_common_option(). */
#ifndef MOE_CLI_H
#define MOE_CLI_H

#include "moe/config.h"
#include "moe/log.h"
#include "moe/seqio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The getopt entries of the options every tool takes (docs/cli.md's preamble): -@/--threads,
 * which each tool applies itself, and -q, -v, -h, -V, which moe_cli_common_option handles.
 * They end a tool's option string and table. */
/* clang-format off */
#define MOE_CLI_COMMON_SHORTOPTS "@:qvhV"

#define MOE_CLI_COMMON_LONGOPTS                                         \
    {"threads", required_argument, 0, '@'},                             \
    {"quiet", no_argument, 0, 'q'},                                     \
    {"verbose", no_argument, 0, 'v'},                                   \
    {"help", no_argument, 0, 'h'},                                      \
    {"version", no_argument, 0, 'V'}
/* clang-format on */

/* moe_cli_common_option's "not finished: keep parsing" result. */
#define MOE_CLI_CONTINUE (-1)

/* Handles -q, -v, -h (prints `usage` to stdout), -V (prints the version banner) and
 * anything else (getopt's '?'/':': an unknown option or a missing argument).
 * Returns MOE_CLI_CONTINUE after -q/-v (with *level set), else the exit code main should
 * return: 0 after --help/--version, 2 for anything else. */
int moe_cli_common_option(const char *prog, const char *usage, int opt, moe_log_level *level);

/* The command line argv[0 .. argc) as one line for provenance records into out [n]
 * (call it before getopt permutes argv): arguments joined by spaces, any with white space or
 * shell characters in single quotes, tabs and newlines written as spaces so the line fits a
 * TSV field; a line that does not fit ends in "...". */
void moe_cli_command_line(int argc, char **argv, char *out, size_t n);

/* The one message for getopt's ':' (a missing argument: option strings start with ':') or
 * '?' (an unknown or ambiguous option), with getopt's own message off (opterr = 0):
 * "prog: error: unknown option '--bogus'" naming it from argv, optind and optopt, and the
 * --help hint. Returns 2. */
int moe_cli_option_error(const char *prog, int opt, char **argv);

/* Prints "prog: error: <message>" and "hint: see prog --help" to stderr; returns 2. */
int moe_cli_usage_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- input selection: -r/--region, --regions-file, -T/--reference, --min-mapq,
 * -f/--require-flags, -F/--exclude-flags, --as-stored. As samtools' sam_opts.h does for its
 * global options, this block is the one place they are listed: a tool puts
 * MOE_CLI_INPUT_SHORTOPTS into its getopt string, MOE_CLI_INPUT_LONGOPTS into its option
 * table and MOE_CLI_INPUT_HELP into its --help text, and moe_cli_input_option parses them.
 * An input option is added here (all four) and in docs/cli.md's moe-tokenize section. ---- */
enum {
    MOE_CLI_OPT_REGIONS_FILE = 0x1000,
    MOE_CLI_OPT_MIN_MAPQ,
    MOE_CLI_OPT_AS_STORED,
};

/* clang-format off */
#define MOE_CLI_INPUT_SHORTOPTS "r:T:f:F:"

#define MOE_CLI_INPUT_LONGOPTS                                          \
    {"region", required_argument, 0, 'r'},                              \
    {"regions-file", required_argument, 0, MOE_CLI_OPT_REGIONS_FILE},   \
    {"reference", required_argument, 0, 'T'},                           \
    {"min-mapq", required_argument, 0, MOE_CLI_OPT_MIN_MAPQ},           \
    {"require-flags", required_argument, 0, 'f'},                       \
    {"exclude-flags", required_argument, 0, 'F'},                       \
    {"as-stored", no_argument, 0, MOE_CLI_OPT_AS_STORED}

#define MOE_CLI_INPUT_HELP                                                                        \
    "  -r, --region R          chr, chr:beg-end (1-based); repeatable; indexed FASTA/BAM/CRAM\n" \
    "      --regions-file BED  regions from a BED file (plain or bgzip)\n"                       \
    "  -T, --reference FA      reference FASTA for CRAM (never fetched from the network)\n"      \
    "      --min-mapq Q        drop alignments with MAPQ < Q [0]\n"                              \
    "  -f, --require-flags N   keep only records with all flags N\n"                             \
    "  -F, --exclude-flags N   drop records with any flag in N [0xF00]\n"                        \
    "      --as-stored         keep reverse-strand reads as stored (no reverse complement)\n"
/* clang-format on */
/* moe_cli_input_option's "not an input option" result. */
#define MOE_CLI_NOT_MINE (-2)

typedef struct moe_cli_input {
    char **regions; /* -r values, then the regions file's (owned) */
    int n_regions;
    const char *regions_file; /* --regions-file, read by moe_cli_input_finish */
} moe_cli_input;

/* Applies an input-selection option to io/in. Returns MOE_CLI_NOT_MINE for any other
 * option, MOE_CLI_CONTINUE when applied, 1 when out of memory, 2 for a bad value (the
 * message is printed). */
int moe_cli_input_option(const char *prog, moe_cli_input *in, moe_seqio_opts *io, int opt,
                         const char *arg);
/* After parsing: appends the regions of --regions-file and points io at the region list
 * (which stays owned by in). */
moe_status moe_cli_input_finish(moe_cli_input *in, moe_seqio_opts *io, moe_err *err);
void moe_cli_input_free(moe_cli_input *in);

/* ---- the model options of the inference tools (moe-embed, moe-score): --device D
 * (cpu | auto | cuda) and --precision P (fp32 | bf16) ---- */
enum {
    MOE_CLI_OPT_DEVICE = 0x1100,
    MOE_CLI_OPT_PRECISION,
};
/* Applies --device / --precision to *device / *bf16 (1 bf16, 0 fp32; leave it -1 for the
 * default). Returns MOE_CLI_NOT_MINE for any other option, MOE_CLI_CONTINUE when applied,
 * 2 for a bad value (the message is printed). */
int moe_cli_model_option(const char *prog, int opt, const char *arg, moe_device_kind *device,
                         int *bf16);

#ifdef __cplusplus
}
#endif
#endif
