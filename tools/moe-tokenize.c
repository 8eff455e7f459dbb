/* moe-tokenize: FASTA/FASTQ/SAM/BAM/CRAM -> token shards; `stats` and `decode` subcommands.
 *
 * Argument parsing only: the work is moe_tokenize_run / moe_tokenize_stats /
 * moe_tokenize_decode (libcore/src/tokenize*.c). The one thing to know: tokenizer options
 * the user did not give take the chosen tokenizer's defaults (kmer: case upper, iupac to-n),
 * so options are collected first and applied after --tokenizer is known. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/cli.h"
#include "moe/err.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/seqio.h"
#include "moe/tokenize.h"

static const char USAGE[] =
    "Usage: moe-tokenize [options] INPUT...      sequences -> token shards\n"
    "       moe-tokenize stats [--json] SHARDS... counts, frequencies, lengths, spec\n"
    "       moe-tokenize decode [-w N] SHARDS    documents back to FASTA\n"
    "       moe-tokenize merge -o OUT PARTS...   --part outputs -> one run's output\n"
    "\n"
    "INPUT: FASTA/FASTQ (plain, gzip, bgzip), SAM, BAM, CRAM; - for stdin.\n"
    "SHARDS: a .mtok file, a directory of them, a manifest.json, or - for stdin.\n"
    "\n"
    "Output:\n"
    "  -o, --output PATH       FILE.mtok, DIR/ (shards + manifest.json) or - [stdout]\n"
    "      --shard-tokens N    DIR/ output: new shard after N tokens [0 = one shard]\n"
    "      --val-fraction F    records whose name hash is below F go to *.val.mtok [0]\n"
    "      --part I/N          only the I-th of N parts of the one INPUT (merge joins them)\n"
    "Tokenizer:\n"
    "  -t, --tokenizer NAME    byte | nuc | kmer [byte]\n"
    "  -k, --k K               kmer size 1..8 [6]\n"
    "      --vocab-size N      byte: 256 or 512 [256]\n"
    "      --case P            keep | upper | upper+mask [keep; kmer: upper]\n"
    "      --iupac P           keep | to-n | drop [keep; kmer: to-n]\n"
    "      --n-runs P          keep | collapse | split [keep]\n"
    "      --revcomp P         none | add | random [none]\n"
    "      --seed N            seed for --revcomp random [0]\n"
    "      --window W          cut records into documents of W tokens [0 = whole]\n"
    "      --stride S          start a window every S tokens [W]\n"
    "      --min-length L      drop documents shorter than L tokens [1]\n"
    "      --bos / --no-bos    start documents with BOS [no]\n"
    "      --eos / --no-eos    end documents with EOS [yes]\n"
    "Input:\n" MOE_CLI_INPUT_HELP "General:\n"
    "  -@, --threads N         threads [1]\n"
    "  -w, --width N           decode: FASTA line width [60; 0 = one line]\n"
    "      --json              stats: JSON output\n"
    "  -q, --quiet / -v, --verbose / -h, --help / -V, --version\n";

enum {
    OPT_VOCAB = 256,
    OPT_CASE,
    OPT_IUPAC,
    OPT_NRUNS,
    OPT_REVCOMP,
    OPT_SEED,
    OPT_WINDOW,
    OPT_STRIDE,
    OPT_MINLEN,
    OPT_BOS,
    OPT_NOBOS,
    OPT_EOS,
    OPT_NOEOS,
    OPT_SHARD_TOKENS,
    OPT_VAL,
    OPT_JSON,
    OPT_PART,
};

static const char SHORT[] = ":o:t:k:w:" MOE_CLI_INPUT_SHORTOPTS MOE_CLI_COMMON_SHORTOPTS;

static const struct option LONG[] = {
    {"output", required_argument, 0, 'o'},
    {"tokenizer", required_argument, 0, 't'},
    {"k", required_argument, 0, 'k'},
    {"vocab-size", required_argument, 0, OPT_VOCAB},
    {"case", required_argument, 0, OPT_CASE},
    {"iupac", required_argument, 0, OPT_IUPAC},
    {"n-runs", required_argument, 0, OPT_NRUNS},
    {"revcomp", required_argument, 0, OPT_REVCOMP},
    {"seed", required_argument, 0, OPT_SEED},
    {"window", required_argument, 0, OPT_WINDOW},
    {"stride", required_argument, 0, OPT_STRIDE},
    {"min-length", required_argument, 0, OPT_MINLEN},
    {"bos", no_argument, 0, OPT_BOS},
    {"no-bos", no_argument, 0, OPT_NOBOS},
    {"eos", no_argument, 0, OPT_EOS},
    {"no-eos", no_argument, 0, OPT_NOEOS},
    {"shard-tokens", required_argument, 0, OPT_SHARD_TOKENS},
    {"val-fraction", required_argument, 0, OPT_VAL},
    {"part", required_argument, 0, OPT_PART},
    MOE_CLI_INPUT_LONGOPTS,
    {"width", required_argument, 0, 'w'},
    {"json", no_argument, 0, OPT_JSON},
    MOE_CLI_COMMON_LONGOPTS,
    {0, 0, 0, 0},
};

/* Parses a non-negative integer (decimal or 0x hex); -1 on error. */
static long long parse_count(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 0);
    return (*s && !*end && v >= 0) ? v : -1;
}

typedef struct cli {
    moe_tokenize_opts o;
    int kind, k, case_p, iupac, nruns, revcomp, bos, eos, json, width;
    long long vocab, seed, window, stride, minlen;
    moe_cli_input in;
} cli;

/* Returns -1 to go on, else the exit code. */
static int parse(cli *c, int argc, char **argv) {
    int opt;
    moe_log_level level = MOE_LOG_INFO;
    opterr = 0; /* one message of ours (moe_cli_option_error), not getopt's too */
    while ((opt = getopt_long(argc, argv, SHORT, LONG, NULL)) != -1) {
        long long v = 0;
        int rc = moe_cli_input_option("moe-tokenize", &c->in, &c->o.io, opt, optarg);
        if (rc != MOE_CLI_NOT_MINE) {
            if (rc != MOE_CLI_CONTINUE) return rc;
            continue;
        }
        switch (opt) {
        case 'o':
            c->o.output = optarg;
            break;
        case 't':
            if ((c->kind = moe_tokenizer_kind_parse(optarg)) < 0)
                return moe_cli_usage_error(
                    "moe-tokenize", "--tokenizer must be byte, nuc or kmer, not '%s'", optarg);
            break;
        case 'k':
            if ((c->k = (int)parse_count(optarg)) < 1 || c->k > 8)
                return moe_cli_usage_error("moe-tokenize", "--k must be 1..8, not '%s'", optarg);
            break;
        case OPT_VOCAB:
            if ((c->vocab = parse_count(optarg)) < 0)
                return moe_cli_usage_error("moe-tokenize",
                                           "--vocab-size must be a number, not '%s'", optarg);
            break;
        case OPT_CASE:
            if ((c->case_p = moe_case_policy_parse(optarg)) < 0)
                return moe_cli_usage_error(
                    "moe-tokenize", "--case must be keep, upper or upper+mask, not '%s'", optarg);
            break;
        case OPT_IUPAC:
            if ((c->iupac = moe_iupac_policy_parse(optarg)) < 0)
                return moe_cli_usage_error("moe-tokenize",
                                           "--iupac must be keep, to-n or drop, not '%s'", optarg);
            break;
        case OPT_NRUNS:
            if ((c->nruns = moe_nrun_policy_parse(optarg)) < 0)
                return moe_cli_usage_error(
                    "moe-tokenize", "--n-runs must be keep, collapse or split, not '%s'", optarg);
            break;
        case OPT_REVCOMP:
            if ((c->revcomp = moe_revcomp_policy_parse(optarg)) < 0)
                return moe_cli_usage_error(
                    "moe-tokenize", "--revcomp must be none, add or random, not '%s'", optarg);
            break;
        case OPT_SEED:
        case OPT_WINDOW:
        case OPT_STRIDE:
        case OPT_MINLEN:
        case OPT_SHARD_TOKENS:
        case '@':
        case 'w':
            if ((v = parse_count(optarg)) < 0) {
                const char *name = "";
                for (const struct option *l = LONG; l->name; l++) /* the option, for messages */
                    if (l->val == opt) name = l->name;
                return moe_cli_usage_error(
                    "moe-tokenize", "--%s expects a non-negative number, not '%s'", name, optarg);
            }
            if (opt == OPT_SEED)
                c->seed = v;
            else if (opt == OPT_WINDOW)
                c->window = v;
            else if (opt == OPT_STRIDE)
                c->stride = v;
            else if (opt == OPT_MINLEN)
                c->minlen = v;
            else if (opt == OPT_SHARD_TOKENS)
                c->o.shard_tokens = v;
            else if (opt == '@')
                c->o.threads = v < 1 ? 1 : (int)v;
            else
                c->width = (int)v;
            break;
        case OPT_VAL: {
            char *end;
            c->o.val_fraction = strtod(optarg, &end);
            if (*end || c->o.val_fraction < 0 || c->o.val_fraction > 1)
                return moe_cli_usage_error(
                    "moe-tokenize", "--val-fraction must be a number in [0, 1], not '%s'", optarg);
            break;
        }
        case OPT_PART: {
            int i, n, len = 0;
            if (sscanf(optarg, "%d/%d%n", &i, &n, &len) != 2 || optarg[len] || n < 1 || i < 1 ||
                i > n)
                return moe_cli_usage_error("moe-tokenize",
                                           "--part must be I/N with 1 <= I <= N, not '%s'", optarg);
            c->o.io.part = i - 1;
            c->o.io.n_parts = n;
            break;
        }
        case OPT_BOS:
            c->bos = 1;
            break;
        case OPT_NOBOS:
            c->bos = 0;
            break;
        case OPT_EOS:
            c->eos = 1;
            break;
        case OPT_NOEOS:
            c->eos = 0;
            break;
        case OPT_JSON:
            c->json = 1;
            break;
        default:
            if (opt == '?' || opt == ':') return moe_cli_option_error("moe-tokenize", opt, argv);
            rc = moe_cli_common_option("moe-tokenize", USAGE, opt, &level);
            if (rc != MOE_CLI_CONTINUE) return rc;
            break;
        }
    }
    moe_log_init("moe-tokenize", level);
    return -1;
}

static int finish(moe_err *err, int rc) {
    if (err->status != MOE_OK) {
        moe_err_print(err, "moe-tokenize", stderr);
        return moe_err_exit_code(err);
    }
    return rc;
}

static int run_tokenize(cli *c, int argc, char **argv) {
    moe_err err;
    moe_err_clear(&err);
    moe_outfile_cleanup_on_signals(NULL); /* a killed run leaves no temporary file */
    moe_tokenizer_opts *t = &c->o.tok;
    moe_tokenizer_opts_defaults(t, (moe_tokenizer_kind)c->kind);
    if (c->k >= 0) t->k = c->k;
    if (c->vocab >= 0) t->vocab_size = c->vocab;
    if (c->case_p >= 0) t->case_policy = (moe_case_policy)c->case_p;
    if (c->iupac >= 0) t->iupac = (moe_iupac_policy)c->iupac;
    if (c->nruns >= 0) t->nrun = (moe_nrun_policy)c->nruns;
    if (c->revcomp >= 0) t->revcomp = (moe_revcomp_policy)c->revcomp;
    if (c->bos >= 0) t->add_bos = c->bos;
    if (c->eos >= 0) t->add_eos = c->eos;
    if (c->seed >= 0) t->seed = (uint64_t)c->seed;
    if (c->window >= 0) t->window = c->window;
    if (c->stride >= 0) t->stride = c->stride;
    if (c->minlen >= 0) t->min_length = c->minlen;
    if (t->window > 0 && t->stride == 0) t->stride = t->window;
    if (moe_cli_input_finish(&c->in, &c->o.io, &err) != MOE_OK) return finish(&err, 2);
    c->o.inputs = (const char *const *)(argv + optind);
    c->o.n_inputs = argc - optind;
    if (c->o.n_inputs < 1)
        return moe_cli_usage_error("moe-tokenize", "%s", "no input files (use - for stdin)");
    if (c->o.io.n_parts > 1 && c->o.n_inputs != 1)
        return moe_cli_usage_error("moe-tokenize", "%s",
                                   "--part splits one input file: run one split per input");
    if ((!c->o.output || strcmp(c->o.output, "-") == 0) && isatty(STDOUT_FILENO))
        return moe_cli_usage_error(
            "moe-tokenize", "%s",
            "refusing to write a binary shard to a terminal: give -o FILE.mtok "
            "or pipe the output");
    moe_tokenize_summary sum;
    moe_tokenize_run(&c->o, &sum, &err);
    if (err.status == MOE_OK)
        moe_log_info("%lld records (%lld filtered out, %lld empty), %lld bases -> %lld documents, "
                     "%lld tokens (%lld/%lld in validation), %lld shard file(s)",
                     (long long)sum.records, (long long)sum.filtered, (long long)sum.empty,
                     (long long)sum.bases, (long long)sum.docs, (long long)sum.tokens,
                     (long long)sum.val_docs, (long long)sum.val_tokens, (long long)sum.shards);
    return finish(&err, 0);
}

static int run_merge(cli *c, int n, char **parts) {
    moe_err err;
    moe_err_clear(&err);
    if (!c->o.output)
        return moe_cli_usage_error("moe-tokenize", "%s",
                                   "merge needs -o FILE.mtok, -o DIR/ or -o - for its output");
    if (strcmp(c->o.output, "-") == 0 && isatty(STDOUT_FILENO))
        return moe_cli_usage_error("moe-tokenize", "%s",
                                   "refusing to write a binary shard to a terminal");
    moe_tokenize_summary sum;
    moe_tokenize_merge((const char *const *)parts, n, c->o.output, c->o.shard_tokens, &sum, &err);
    if (err.status == MOE_OK)
        moe_log_info("%d parts -> %lld documents, %lld tokens (%lld/%lld in validation), %lld "
                     "shard file(s)",
                     n, (long long)sum.docs, (long long)sum.tokens, (long long)sum.val_docs,
                     (long long)sum.val_tokens, (long long)sum.shards);
    return finish(&err, 0);
}

int main(int argc, char **argv) {
    cli c;
    memset(&c, 0, sizeof c);
    moe_tokenize_opts_defaults(&c.o);
    c.kind = MOE_TOKENIZER_BYTE;
    c.k = c.case_p = c.iupac = c.nruns = c.revcomp = c.bos = c.eos = -1;
    c.vocab = c.seed = c.window = c.stride = c.minlen = -1;
    c.width = 60;
    const char *sub = argc > 1 && argv[1][0] != '-' &&
                              (strcmp(argv[1], "stats") == 0 || strcmp(argv[1], "decode") == 0 ||
                               strcmp(argv[1], "merge") == 0)
                          ? argv[1]
                          : NULL;
    int rc = sub ? parse(&c, argc - 1, argv + 1) : parse(&c, argc, argv);
    if (rc < 0) {
        moe_err err;
        moe_err_clear(&err);
        if (!sub)
            rc = run_tokenize(&c, argc, argv);
        else if (optind >= argc - 1)
            rc = moe_cli_usage_error(
                "moe-tokenize", "%s needs at least one shard file, directory or manifest", sub);
        else if (strcmp(sub, "merge") == 0)
            rc = run_merge(&c, argc - 1 - optind, argv + 1 + optind);
        else if (strcmp(sub, "stats") == 0)
            rc = finish(&err, moe_tokenize_stats((const char *const *)(argv + 1 + optind),
                                                 argc - 1 - optind, c.json, stdout, &err));
        else if (argc - 1 - optind != 1)
            rc = moe_cli_usage_error("moe-tokenize", "%s",
                                     "decode takes exactly one shard file, directory or manifest");
        else
            rc = finish(&err, moe_tokenize_decode(argv[1 + optind], c.width, stdout, &err));
    }
    moe_cli_input_free(&c.in);
    return rc;
}
