/* moe-convert: checkpoints <-> Hugging Face Mixtral directories, and `inspect`.
 *
 * Argument parsing only: the work is moe_convert_to_hf / moe_convert_from_hf /
 * moe_convert_inspect (libcore/src/convert*.c). Exit status: 0 done, 1 runtime failure,
 * 2 usage or input error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/cli.h"
#include "moe/convert.h"
#include "moe/err.h"
#include "moe/log.h"

static const char USAGE[] =
    "Usage: moe-convert to-hf [options] CKPT OUT_DIR     checkpoint -> Hugging Face Mixtral\n"
    "       moe-convert from-hf [options] HF_DIR CKPT    Hugging Face Mixtral -> checkpoint\n"
    "       moe-convert inspect CKPT|DIR|FILE            config, tokenizer, tensors, MANIFEST\n"
    "\n"
    "CKPT: a checkpoint directory (RUN/ckpt-00000100) or, as input, a run directory (its\n"
    "latest checkpoint). to-hf writes config.json, safetensors weights (+ index when\n"
    "sharded), tokenizer files for AutoTokenizer, moe_tokenizer.json and moe_config.yaml;\n"
    "from-hf writes a checkpoint at step 0 (fp32, zero Adam moments). See docs/interop.md.\n"
    "\n"
    "Options:\n"
    "      --dtype T            to-hf: f32 | bf16 [f32]\n"
    "      --max-shard-size S   to-hf: largest safetensors file, e.g. 5GB, 500MB [5GB]\n"
    "      --tokenizer T        from-hf: moe tokenizer when HF_DIR has no moe_tokenizer.json:\n"
    "                           a spec file (a checkpoint's tokenizer.json) or byte|nuc|kmer\n"
    "  -@, --threads N          accepted for symmetry with the other tools (single-threaded)\n"
    "  -q, --quiet / -v, --verbose / -h, --help / -V, --version\n"
    "\n"
    "Example:\n"
    "  moe-convert to-hf run/ckpt-00000240 hf/ --dtype bf16\n"
    "  python3 -c 'from transformers import AutoModelForCausalLM as M; M.from_pretrained(\"hf\")'\n"
    "  moe-convert from-hf hf/ imported/ && moe-embed -m imported/ genes.fa -o genes.npy\n";

enum { OPT_DTYPE = 256, OPT_SHARD, OPT_TOKENIZER };

static const struct option LONG[] = {
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"max-shard-size", required_argument, 0, OPT_SHARD},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"threads", required_argument, 0, '@'},
    {"quiet", no_argument, 0, 'q'},
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {0, 0, 0, 0},
};

int main(int argc, char **argv) {
    moe_convert_opts o;
    moe_convert_opts_defaults(&o);
    moe_log_level level = MOE_LOG_INFO;
    int opt;
    while ((opt = getopt_long(argc, argv, "@:qvhV", LONG, NULL)) != -1) {
        switch (opt) {
        case OPT_DTYPE:
            if (strcmp(optarg, "f32") == 0)
                o.dtype = MOE_ST_F32;
            else if (strcmp(optarg, "bf16") == 0)
                o.dtype = MOE_ST_BF16;
            else
                return moe_cli_usage_error("moe-convert", "--dtype must be f32 or bf16, not '%s'",
                                           optarg);
            break;
        case OPT_SHARD:
            if ((o.max_shard_bytes = moe_convert_parse_size(optarg)) < 1)
                return moe_cli_usage_error(
                    "moe-convert", "--max-shard-size expects a size like 5GB or 200MB, not '%s'",
                    optarg);
            break;
        case OPT_TOKENIZER:
            o.tokenizer = optarg;
            break;
        case '@':
            if (atoi(optarg) < 1)
                return moe_cli_usage_error("moe-convert",
                                           "-@/--threads expects a number >= 1, not '%s'", optarg);
            break;
        default: {
            int rc = moe_cli_common_option("moe-convert", USAGE, opt, &level);
            if (rc != MOE_CLI_CONTINUE) return rc;
            break;
        }
        }
    }
    moe_log_init("moe-convert", level);
    if (optind >= argc)
        return moe_cli_usage_error("moe-convert", "%s",
                                   "a command is required: to-hf, from-hf or inspect");
    const char *cmd = argv[optind];
    int nargs = argc - optind - 1;
    char **args = argv + optind + 1;
    moe_err err;
    moe_err_clear(&err);
    moe_status st;
    if (strcmp(cmd, "to-hf") == 0) {
        if (nargs != 2) return moe_cli_usage_error("moe-convert", "%s", "to-hf takes CKPT OUT_DIR");
        st = moe_convert_to_hf(args[0], args[1], &o, &err);
    } else if (strcmp(cmd, "from-hf") == 0) {
        if (nargs != 2)
            return moe_cli_usage_error("moe-convert", "%s", "from-hf takes HF_DIR CKPT");
        st = moe_convert_from_hf(args[0], args[1], &o, &err);
    } else if (strcmp(cmd, "inspect") == 0) {
        if (nargs != 1)
            return moe_cli_usage_error("moe-convert", "%s",
                                       "inspect takes one checkpoint, directory or file");
        st = moe_convert_inspect(args[0], &o, stdout, &err);
    } else {
        return moe_cli_usage_error("moe-convert", "unknown command '%s' (to-hf, from-hf, inspect)",
                                   cmd);
    }
    if (st != MOE_OK) {
        moe_err_print(&err, "moe-convert", stderr);
        return moe_err_exit_code(&err);
    }
    return 0;
}
