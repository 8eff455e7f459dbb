/* moe-score: log-likelihoods of sequences (`seq`) and variant-effect scores of a VCF/BCF
 * (`variants`) from a trained checkpoint.
 *
 * Argument parsing only: the work is moe_score_seq_run / moe_score_vcf_run
 * (libcore/src/score/). Exit status: 0 done, 1 runtime failure, 2 usage or input error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/cli.h"
#include "moe/err.h"
#include "moe/log.h"
#include "moe/ops.h"
#include "moe/score.h"

static const char USAGE[] =
    "Usage: moe-score seq -m CKPT [options] INPUT...\n"
    "       moe-score variants -m CKPT -f REF.fa [options] CALLS.vcf.gz\n"
    "\n"
    "seq: the log-likelihood of every sequence under a checkpoint written by moe-train (or\n"
    "imported by moe-convert from-hf): a TSV row per sequence (name, length, log-likelihood\n"
    "in nats, bits per base, perplexity). INPUT: FASTA/FASTQ (plain, gzip, bgzip), SAM, BAM,\n"
    "CRAM, - for stdin, or token shards that use the checkpoint's tokenizer. Sequences\n"
    "longer than the model's context are scored in windows; each position is scored once.\n"
    "variants: each ALT allele's MOE_LLR = log P(ALT window) - log P(REF window) (nats),\n"
    "added to the VCF/BCF as INFO/MOE_LLR (Number=A). REF.fa needs a .fai (samtools faidx).\n"
    "Every TSV starts with a #@PG line (version, command line, checkpoint id), then a header;\n"
    "the VCF gets a ##moe_score header line. See docs/cli.md.\n"
    "\n"
    "Model (both):\n"
    "  -m, --model CKPT        checkpoint directory, or a run directory (its latest)\n"
    "      --device D          cpu | auto | cuda [auto: a GPU when one is usable]\n"
    "      --precision P       fp32 | bf16 [fp32 on cpu, bf16 on cuda]\n"
    "      --rc-average        average with the reverse complement (byte and nuc tokenizers)\n"
    "      --batch-tokens N    padded tokens per forward pass [8192]\n"
    "seq:\n"
    "  -o, --output FILE       FILE.tsv, or FILE.npy with --per-position [TSV on stdout]\n"
    "      --per-position      FILE.npy: float32 log-probability of every token, plus\n"
    "                          FILE.ids.tsv (first row, log-likelihood per sequence)\n"
    "      --context N         left context (tokens) of every window after the first [half\n"
    "                          the model's context]\n" MOE_CLI_INPUT_HELP "variants:\n"
    "  -f, --fasta-ref FA      reference FASTA (indexed: .fai, and .gzi when bgzip)\n"
    "  -r, --regions R         only records overlapping chr, chr:beg-end; repeatable\n"
    "  -o, --output FILE       output VCF/BCF [stdout]\n"
    "  -O, --output-type T     v VCF | z bgzip VCF | b BCF [v]\n"
    "      --tsv               chrom pos id ref alt llr rows instead of a VCF\n"
    "      --window W          bases per window [8192, or the model's context if smaller]\n"
    "      --window-grid       windows on a grid of W/2, each shared by the variants in its\n"
    "                          middle half (variant >= W/4 from both ends), not centred\n"
    "      --reduce R          sum | mean (per token) [sum]\n"
    "      --check-ref M       error | warn (skip and count records whose REF differs from\n"
    "                          the FASTA) [error]\n"
    "General:\n"
    "  -@, --threads N         threads [all cores]\n"
    "  -q, --quiet / -v, --verbose / -h, --help / -V, --version\n"
    "\n"
    "Example:\n"
    "  moe-score seq -m run/ genes.fa > genes.ll.tsv\n"
    "  moe-score variants -m run/ -f ref.fa calls.vcf.gz -O z -o scored.vcf.gz\n";

enum {
    OPT_RC = 256,
    OPT_BATCH,
    OPT_PER_POSITION,
    OPT_CONTEXT,
    OPT_TSV,
    OPT_WINDOW,
    OPT_WINDOW_GRID,
    OPT_REDUCE,
    OPT_CHECK_REF,
};

/* The options both subcommands take, then the shared -@/-q/-v/-h/-V entries. */
/* clang-format off */
#define SCORE_MODEL_LONGOPTS                                            \
    {"model", required_argument, 0, 'm'},                               \
    {"device", required_argument, 0, MOE_CLI_OPT_DEVICE},               \
    {"precision", required_argument, 0, MOE_CLI_OPT_PRECISION},         \
    {"rc-average", no_argument, 0, OPT_RC},                             \
    {"batch-tokens", required_argument, 0, OPT_BATCH},                  \
    {"output", required_argument, 0, 'o'},                              \
    MOE_CLI_COMMON_LONGOPTS
/* clang-format on */

static const struct option SEQ_LONG[] = {
    SCORE_MODEL_LONGOPTS,
    {"per-position", no_argument, 0, OPT_PER_POSITION},
    {"context", required_argument, 0, OPT_CONTEXT},
    MOE_CLI_INPUT_LONGOPTS,
    {0, 0, 0, 0},
};

static const struct option VCF_LONG[] = {
    SCORE_MODEL_LONGOPTS,
    {"fasta-ref", required_argument, 0, 'f'},
    {"regions", required_argument, 0, 'r'},
    {"output-type", required_argument, 0, 'O'},
    {"tsv", no_argument, 0, OPT_TSV},
    {"window", required_argument, 0, OPT_WINDOW},
    {"window-grid", no_argument, 0, OPT_WINDOW_GRID},
    {"reduce", required_argument, 0, OPT_REDUCE},
    {"check-ref", required_argument, 0, OPT_CHECK_REF},
    {0, 0, 0, 0},
};

typedef struct cli {
    int vcf; /* the subcommand: 0 seq, 1 variants */
    moe_score_seq_opts seq;
    moe_score_vcf_opts var;
    moe_score_model_opts *m; /* the one of the subcommand */
    moe_cli_input in;
    const char **regions; /* variants -r */
    int n_regions, threads;
    char command[4096]; /* for the provenance lines */
} cli;

/* A number >= 1 into *v (decimal or 0x hex); else a usage error (2). */
static int parse_count(const char *s, int64_t *v) {
    char *end;
    long long x = strtoll(s, &end, 0);
    if (!*s || *end || x < 1 || x > (1LL << 40))
        return moe_cli_usage_error("moe-score", "expected a number >= 1, not '%s'", s);
    *v = x;
    return MOE_CLI_CONTINUE;
}

/* The options of `variants` that seq does not have. */
static int vcf_option(cli *c, int opt, const char *arg) {
    moe_score_vcf_opts *o = &c->var;
    int64_t v = 0;
    switch (opt) {
    case 'f':
        o->fasta = arg;
        return MOE_CLI_CONTINUE;
    case 'r': {
        const char **p = realloc(c->regions, (size_t)(c->n_regions + 1) * sizeof *p);
        if (!p) return 1;
        c->regions = p;
        p[c->n_regions++] = arg;
        return MOE_CLI_CONTINUE;
    }
    case 'O':
        if (strlen(arg) != 1 || !strchr("vzb", arg[0]))
            return moe_cli_usage_error("moe-score", "-O must be v, z or b, not '%s'", arg);
        o->format = arg[0];
        return MOE_CLI_CONTINUE;
    case OPT_TSV:
        o->tsv = 1;
        return MOE_CLI_CONTINUE;
    case OPT_WINDOW:
        if (parse_count(arg, &v) != MOE_CLI_CONTINUE) return 2;
        o->window = v;
        return MOE_CLI_CONTINUE;
    case OPT_WINDOW_GRID:
        o->window_grid = 1;
        return MOE_CLI_CONTINUE;
    case OPT_REDUCE:
        if (strcmp(arg, "sum") && strcmp(arg, "mean"))
            return moe_cli_usage_error("moe-score", "--reduce must be sum or mean, not '%s'", arg);
        o->reduce = strcmp(arg, "mean") == 0 ? MOE_SCORE_MEAN : MOE_SCORE_SUM;
        return MOE_CLI_CONTINUE;
    case OPT_CHECK_REF:
        if (strcmp(arg, "error") && strcmp(arg, "warn"))
            return moe_cli_usage_error("moe-score", "--check-ref must be error or warn, not '%s'",
                                       arg);
        o->check_ref_warn = strcmp(arg, "warn") == 0;
        return MOE_CLI_CONTINUE;
    default:
        return MOE_CLI_NOT_MINE;
    }
}

/* The options of `seq` that variants does not have. */
static int seq_option(cli *c, int opt, const char *arg) {
    int rc = moe_cli_input_option("moe-score", &c->in, &c->seq.io, opt, arg);
    if (rc != MOE_CLI_NOT_MINE) return rc;
    if (opt == OPT_PER_POSITION) {
        c->seq.per_position = 1;
        return MOE_CLI_CONTINUE;
    }
    if (opt != OPT_CONTEXT) return MOE_CLI_NOT_MINE;
    char *end;
    long long v = strtoll(arg, &end, 0);
    if (!*arg || *end || v < 0 || v > (1LL << 40))
        return moe_cli_usage_error("moe-score", "--context expects a number >= 0, not '%s'", arg);
    c->seq.context = v;
    return MOE_CLI_CONTINUE;
}

/* Returns -1 to go on, else the exit code. */
static int parse(cli *c, int argc, char **argv) {
    int opt;
    moe_log_level level = MOE_LOG_INFO;
    const struct option *table = c->vcf ? VCF_LONG : SEQ_LONG;
    const char *shorts = c->vcf ? ":m:o:f:r:O:" MOE_CLI_COMMON_SHORTOPTS
                                : ":m:o:" MOE_CLI_INPUT_SHORTOPTS MOE_CLI_COMMON_SHORTOPTS;
    opterr = 0; /* one message of ours (moe_cli_option_error), not getopt's too */
    while ((opt = getopt_long(argc, argv, shorts, table, NULL)) != -1) {
        int64_t v = 0;
        int rc = c->vcf ? vcf_option(c, opt, optarg) : seq_option(c, opt, optarg);
        if (rc == MOE_CLI_NOT_MINE)
            rc = moe_cli_model_option("moe-score", opt, optarg, &c->m->device, &c->m->bf16);
        if (rc == MOE_CLI_NOT_MINE) {
            rc = MOE_CLI_CONTINUE;
            if (opt == 'm')
                c->m->ckpt_dir = optarg;
            else if (opt == 'o')
                *(c->vcf ? &c->var.output : &c->seq.output) = optarg;
            else if (opt == OPT_RC)
                c->m->rc_average = 1;
            else if (opt == OPT_BATCH || opt == '@') {
                rc = parse_count(optarg, &v);
                if (opt == OPT_BATCH)
                    c->m->batch_tokens = v;
                else
                    c->threads = (int)v;
            } else if (opt == '?' || opt == ':')
                rc = moe_cli_option_error("moe-score", opt, argv);
            else
                rc = moe_cli_common_option("moe-score", USAGE, opt, &level);
        }
        if (rc != MOE_CLI_CONTINUE) return rc;
    }
    moe_log_init("moe-score", level);
    c->m->quiet = level < MOE_LOG_INFO;
    return -1;
}

static int fail(const moe_err *err) {
    moe_err_print(err, "moe-score", stderr);
    return moe_err_exit_code(err);
}

static int run(cli *c, int argc, char **argv) {
    moe_err err;
    moe_err_clear(&err);
    if (!c->m->ckpt_dir)
        return moe_cli_usage_error("moe-score", "%s", "a checkpoint is required (-m CKPT_DIR)");
    c->m->threads = c->threads;
    moe_score_summary sum;
    if (!c->vcf) {
        if (optind >= argc)
            return moe_cli_usage_error("moe-score", "%s", "no input files (use - for stdin)");
        if (moe_cli_input_finish(&c->in, &c->seq.io, &err) != MOE_OK) return fail(&err);
        c->seq.io.threads = c->threads > 1 ? 1 : 0;
        c->seq.inputs = (const char *const *)(argv + optind);
        c->seq.n_inputs = argc - optind;
        if (moe_score_seq_run(&c->seq, &sum, &err) != MOE_OK) return fail(&err);
        moe_log_info("%lld sequences (%lld skipped), %lld windows, %lld tokens scored in %.2f s "
                     "after a %.2f s model load",
                     (long long)sum.sequences, (long long)sum.skipped, (long long)sum.windows,
                     (long long)sum.tokens, sum.seconds, sum.load_seconds);
        return 0;
    }
    if (!c->var.fasta)
        return moe_cli_usage_error("moe-score", "%s", "variants needs the reference (-f REF.fa)");
    if (argc - optind != 1)
        return moe_cli_usage_error("moe-score", "%s", "variants takes one VCF/BCF (- for stdin)");
    c->var.vcf = argv[optind];
    c->var.regions = c->regions;
    c->var.n_regions = c->n_regions;
    if (moe_score_vcf_run(&c->var, &sum, &err) != MOE_OK) return fail(&err);
    moe_log_info("%lld records, %lld ALT alleles: %lld scored, skipped %lld symbolic, %lld with "
                 "a window off the contig, %lld REF mismatches; %lld windows in %.2f s after a "
                 "%.2f s model load",
                 (long long)sum.records, (long long)sum.alts, (long long)sum.scored,
                 (long long)sum.skip_symbolic, (long long)sum.skip_edge, (long long)sum.skip_ref,
                 (long long)sum.windows, sum.seconds, sum.load_seconds);
    return 0;
}

int main(int argc, char **argv) {
    moe_backend_cpu_tune_blas(argv);
    static cli c; /* large (the command line); one per process */
    moe_score_seq_opts_defaults(&c.seq);
    moe_score_vcf_opts_defaults(&c.var);
    const char *sub = argc > 1 ? argv[1] : "";
    if (strcmp(sub, "seq") != 0 && strcmp(sub, "variants") != 0) {
        moe_log_level level = MOE_LOG_INFO;
        if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0)
            return moe_cli_common_option("moe-score", USAGE, 'h', &level);
        if (strcmp(sub, "-V") == 0 || strcmp(sub, "--version") == 0)
            return moe_cli_common_option("moe-score", USAGE, 'V', &level);
        fprintf(stderr, "%.*s", (int)(strstr(USAGE, "\n\n") + 1 - USAGE), USAGE); /* synopsis */
        return moe_cli_usage_error("moe-score", "a command is required: seq or variants%s%s%s",
                                   *sub ? " (not '" : "", sub, *sub ? "')" : "");
    }
    c.vcf = strcmp(sub, "variants") == 0;
    c.m = c.vcf ? &c.var.m : &c.seq.m;
    moe_cli_command_line(argc, argv, c.command, sizeof c.command); /* before getopt permutes */
    c.m->command = c.command;
    int rc = parse(&c, argc - 1, argv + 1);
    if (rc < 0) rc = run(&c, argc - 1, argv + 1);
    moe_cli_input_free(&c.in);
    free(c.regions);
    return rc;
}
