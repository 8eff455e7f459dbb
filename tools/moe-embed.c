/* moe-embed: sequences -> embedding vectors from a trained checkpoint.
 *
 * Argument parsing only: the work is moe_embed_run (libcore/src/embed*.c). Output is a
 * NumPy .npy matrix plus FILE.ids.tsv with -o, TSV text on stdout without. Exit status: 0
 * done, 1 runtime failure, 2 usage or input error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/cli.h"
#include "moe/embed.h"
#include "moe/err.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/ops.h"

static const char USAGE[] =
    "Usage: moe-embed -m CKPT [options] INPUT...\n"
    "\n"
    "Embeds DNA/RNA sequences with a checkpoint written by moe-train (or imported by\n"
    "moe-convert from-hf). INPUT: FASTA/FASTQ (plain, gzip, bgzip), SAM, BAM, CRAM, - for\n"
    "stdin, or token shards (.mtok, a directory of them, a manifest.json) that use the\n"
    "checkpoint's tokenizer. Sequences are tokenized with the checkpoint's tokenizer.json.\n"
    "See docs/cli.md and docs/interop.md.\n"
    "\n"
    "Model:\n"
    "  -m, --model CKPT        checkpoint directory, or a run directory (its latest)\n"
    "      --layer L           0 = embeddings .. L = final norm; negative counts from the\n"
    "                          top (-1 = final norm, the default; -2 = last layer's output)\n"
    "      --device D          cpu | auto | cuda [auto: a GPU when one is usable]\n"
    "      --precision P       fp32 | bf16 [fp32 on cpu, bf16 on cuda]\n"
    "Output:\n"
    "  -o, --output FILE.npy   float matrix + FILE.ids.tsv (@PG line, BED intervals per row)\n"
    "                          [default: TSV text on stdout]\n"
    "      --dtype T           f32 | f16 [f32]\n"
    "      --pool P            mean | max | last [mean] (last = final position: the EOS\n"
    "                          when the tokenizer adds one)\n"
    "      --per-token         one row per token ([tokens, hidden]; + FILE.offsets.tsv)\n"
    "      --per-window        one row per window instead of their mean\n"
    "      --rc-average        average with the reverse complement (strand-invariant;\n"
    "                          byte and nuc tokenizers)\n"
    "Windows and batches:\n"
    "      --window W          windows of W tokens [whole sequences; those longer than the\n"
    "                          model's context are cut at the context length]\n"
    "      --stride S          a window every S tokens, S <= W [W]\n"
    "      --batch-tokens N    padded tokens per forward pass [8192]\n"
    "Input (SAM/BAM/CRAM and indexed FASTA):\n" MOE_CLI_INPUT_HELP "General:\n"
    "  -@, --threads N         threads [all cores]\n"
    "  -q, --quiet / -v, --verbose / -h, --help / -V, --version\n"
    "\n"
    "Example:\n"
    "  moe-embed -m run/ genes.fa -o genes.npy     # genes.npy + genes.ids.tsv\n"
    "  python3 -c 'import numpy; print(numpy.load(\"genes.npy\").shape)'\n";

enum {
    OPT_LAYER = 256,
    OPT_DTYPE,
    OPT_POOL,
    OPT_PER_TOKEN,
    OPT_PER_WINDOW,
    OPT_RC,
    OPT_WINDOW,
    OPT_STRIDE,
    OPT_BATCH,
};

static const char SHORT[] = ":m:o:" MOE_CLI_INPUT_SHORTOPTS MOE_CLI_COMMON_SHORTOPTS;

static const struct option LONG[] = {
    {"model", required_argument, 0, 'm'},
    {"layer", required_argument, 0, OPT_LAYER},
    {"device", required_argument, 0, MOE_CLI_OPT_DEVICE},
    {"precision", required_argument, 0, MOE_CLI_OPT_PRECISION},
    {"output", required_argument, 0, 'o'},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"pool", required_argument, 0, OPT_POOL},
    {"per-token", no_argument, 0, OPT_PER_TOKEN},
    {"per-window", no_argument, 0, OPT_PER_WINDOW},
    {"rc-average", no_argument, 0, OPT_RC},
    {"window", required_argument, 0, OPT_WINDOW},
    {"stride", required_argument, 0, OPT_STRIDE},
    {"batch-tokens", required_argument, 0, OPT_BATCH},
    MOE_CLI_INPUT_LONGOPTS,
    MOE_CLI_COMMON_LONGOPTS,
    {0, 0, 0, 0},
};

/* Integer (decimal or 0x hex) into *v; 0 when s is not one. */
static int parse_int(const char *s, long long *v) {
    char *end;
    *v = strtoll(s, &end, 0);
    return *s && !*end;
}

typedef struct cli {
    moe_embed_opts o;
    moe_cli_input in;
    int threads;
} cli;

/* Returns -1 to go on, else the exit code. */
static int parse(cli *c, int argc, char **argv) {
    int opt;
    moe_log_level level = MOE_LOG_INFO;
    moe_embed_opts *o = &c->o;
    opterr = 0; /* one message of ours (moe_cli_option_error), not getopt's too */
    while ((opt = getopt_long(argc, argv, SHORT, LONG, NULL)) != -1) {
        long long v = 0;
        const char *name = "";
        int rc = moe_cli_input_option("moe-embed", &c->in, &o->io, opt, optarg);
        if (rc == MOE_CLI_NOT_MINE)
            rc = moe_cli_model_option("moe-embed", opt, optarg, &o->device, &o->bf16);
        if (rc != MOE_CLI_NOT_MINE) {
            if (rc != MOE_CLI_CONTINUE) return rc;
            continue;
        }
        switch (opt) {
        case 'm':
            o->ckpt_dir = optarg;
            break;
        case 'o':
            o->output = optarg;
            break;
        case OPT_LAYER:
            if (!parse_int(optarg, &v) || v < -100000 || v > 100000)
                return moe_cli_usage_error("moe-embed", "--layer expects an integer, not '%s'",
                                           optarg);
            o->layer = (int)v;
            break;
        case OPT_DTYPE:
            if (strcmp(optarg, "f32") == 0)
                o->dtype = MOE_NPY_F32;
            else if (strcmp(optarg, "f16") == 0)
                o->dtype = MOE_NPY_F16;
            else
                return moe_cli_usage_error("moe-embed", "--dtype must be f32 or f16, not '%s'",
                                           optarg);
            break;
        case OPT_POOL:
            if (strcmp(optarg, "mean") == 0)
                o->pool = MOE_EMBED_POOL_MEAN;
            else if (strcmp(optarg, "max") == 0)
                o->pool = MOE_EMBED_POOL_MAX;
            else if (strcmp(optarg, "last") == 0)
                o->pool = MOE_EMBED_POOL_LAST;
            else
                return moe_cli_usage_error("moe-embed",
                                           "--pool must be mean, max or last, not '%s'", optarg);
            break;
        case OPT_PER_TOKEN:
            o->per_token = 1;
            break;
        case OPT_PER_WINDOW:
            o->per_window = 1;
            break;
        case OPT_RC:
            o->rc_average = 1;
            break;
        case OPT_WINDOW:
        case OPT_STRIDE:
        case OPT_BATCH:
        case '@':
            for (const struct option *l = LONG; l->name; l++) /* the option, for messages */
                if (l->val == opt) name = l->name;
            if (!parse_int(optarg, &v) || v < 1 || v > (1LL << 40))
                return moe_cli_usage_error("moe-embed", "--%s expects a number >= 1, not '%s'",
                                           name, optarg);
            if (opt == OPT_WINDOW)
                o->window = v;
            else if (opt == OPT_STRIDE)
                o->stride = v;
            else if (opt == OPT_BATCH)
                o->batch_tokens = v;
            else
                c->threads = (int)v;
            break;
        default:
            if (opt == '?' || opt == ':') return moe_cli_option_error("moe-embed", opt, argv);
            rc = moe_cli_common_option("moe-embed", USAGE, opt, &level);
            if (rc != MOE_CLI_CONTINUE) return rc;
            break;
        }
    }
    moe_log_init("moe-embed", level);
    o->quiet = level < MOE_LOG_INFO;
    return -1;
}

static int run(cli *c, int argc, char **argv) {
    moe_err err;
    moe_err_clear(&err);
    moe_outfile_cleanup_on_signals(NULL); /* a killed run leaves no temporary file */
    moe_embed_opts *o = &c->o;
    if (!o->ckpt_dir)
        return moe_cli_usage_error("moe-embed", "%s", "a checkpoint is required (-m CKPT_DIR)");
    if (optind >= argc)
        return moe_cli_usage_error("moe-embed", "%s", "no input files (use - for stdin)");
    if (moe_cli_input_finish(&c->in, &o->io, &err) != MOE_OK) {
        moe_err_print(&err, "moe-embed", stderr);
        return moe_err_exit_code(&err);
    }
    o->io.threads = c->threads > 1 ? 1 : 0;
    o->inputs = (const char *const *)(argv + optind);
    o->n_inputs = argc - optind;
    o->threads = c->threads;
    moe_embed_summary sum;
    if (moe_embed_run(o, &sum, &err) != MOE_OK) {
        moe_err_print(&err, "moe-embed", stderr);
        return moe_err_exit_code(&err);
    }
    moe_log_info("%lld sequences (%lld skipped), %lld windows, %lld tokens -> %lld x %lld in "
                 "%.2f s after a %.2f s model load (%.1f sequences/s, %.0f tokens/s)",
                 (long long)sum.sequences, (long long)sum.skipped, (long long)sum.windows,
                 (long long)sum.tokens, (long long)sum.rows, (long long)sum.cols, sum.seconds,
                 sum.load_seconds, sum.seconds > 0 ? (double)sum.sequences / sum.seconds : 0.0,
                 sum.seconds > 0 ? (double)sum.tokens / sum.seconds : 0.0);
    if (sum.device_peak_bytes > 0)
        moe_log_info("peak GPU memory held by the model and its buffers: %.2f GiB",
                     (double)sum.device_peak_bytes / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

int main(int argc, char **argv) {
    moe_backend_cpu_tune_blas(argv);
    cli c;
    memset(&c, 0, sizeof c);
    moe_embed_opts_defaults(&c.o);
    char cmd[2048];
    moe_cli_command_line(argc, argv, cmd, sizeof cmd); /* before getopt permutes argv */
    c.o.command = cmd;
    int rc = parse(&c, argc, argv);
    if (rc < 0) rc = run(&c, argc, argv);
    moe_cli_input_free(&c.in);
    return rc;
}
