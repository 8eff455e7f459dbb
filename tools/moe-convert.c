/* moe-convert: checkpoints <-> Hugging Face Mixtral directories, expert-parallel
 * resharding (`reshard --ep N`, `consolidate`) and `inspect`.
 *
 * Argument parsing only: the work is moe_convert_to_hf / moe_convert_from_hf /
 * moe_convert_reshard / moe_convert_inspect (libcore/src/convert*.c). Exit status: 0 done,
 * 1 runtime failure, 2 usage or input error. */
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
    "       moe-convert reshard --ep N CKPT OUT_DIR [KEY=VALUE...]  expert-parallel layout\n"
    "       moe-convert consolidate CKPT OUT_DIR         single-file layout (ep 1)\n"
    "       moe-convert inspect CKPT|DIR|FILE            config, tokenizer, layout, tensors,\n"
    "                                                    MANIFEST\n"
    "\n"
    "CKPT: a checkpoint directory (RUN/ckpt-00000100) or, as input, a run directory (its\n"
    "latest checkpoint), in either layout. to-hf writes config.json, generation_config.json,\n"
    "safetensors weights (+ index when sharded), tokenizer files for AutoTokenizer,\n"
    "moe_tokenizer.json, moe_config.yaml and a README.md model card; from-hf writes a\n"
    "checkpoint at step 0 (fp32 weights only: Adam moments start at zero when training\n"
    "continues from it). See docs/interop.md. reshard writes a new checkpoint whose experts\n"
    "are split over N EP ranks (model.safetensors.index.json, model-ep<R>-of-<N>.safetensors\n"
    "and optimizer-rank<R>.safetensors per rank; N divides num_local_experts), config.yaml\n"
    "with parallel.ep = N (KEY=VALUE overrides fix a config that N would make invalid);\n"
    "consolidate is reshard --ep 1. Tensor bytes are copied, never converted. See\n"
    "docs/formats.md (Checkpoints).\n"
    "\n"
    "Options:\n"
    "      --dtype T            to-hf: f32 | bf16 [f32]\n"
    "      --max-shard-size S   to-hf: largest safetensors file, e.g. 5GB, 500MB [5GB]\n"
    "      --ep N               reshard: expert-parallel ranks (divides num_local_experts)\n"
    "      --tokenizer T        from-hf: moe tokenizer when HF_DIR has no moe_tokenizer.json:\n"
    "                           a spec file (a checkpoint's tokenizer.json) or byte|nuc|kmer\n"
    "  -@, --threads N          accepted for symmetry with the other tools (single-threaded)\n"
    "  -q, --quiet / -v, --verbose / -h, --help / -V, --version\n"
    "\n"
    "Example:\n"
    "  moe-convert to-hf run/ckpt-00000240 hf/ --dtype bf16\n"
    "  python3 -c 'from transformers import AutoModelForCausalLM as M; M.from_pretrained(\"hf\")'\n"
    "  moe-convert from-hf hf/ imported/ && moe-embed -m imported/ genes.fa -o genes.npy\n"
    "  moe-convert reshard --ep 4 run/ckpt-00000240 ckpt-ep4/ && moe-convert inspect ckpt-ep4/\n";

enum { OPT_DTYPE = 256, OPT_SHARD, OPT_TOKENIZER, OPT_EP };

static const struct option LONG[] = {
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"max-shard-size", required_argument, 0, OPT_SHARD},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"ep", required_argument, 0, OPT_EP},
    MOE_CLI_COMMON_LONGOPTS,
    {0, 0, 0, 0},
};

int main(int argc, char **argv) {
    moe_convert_opts o;
    moe_convert_opts_defaults(&o);
    char line[2048];
    moe_cli_command_line(argc, argv, line, sizeof line); /* before getopt permutes argv */
    o.command = line;
    moe_log_level level = MOE_LOG_INFO;
    int opt, ep = 0;
    opterr = 0; /* one message of ours (moe_cli_option_error), not getopt's too */
    while ((opt = getopt_long(argc, argv, ":" MOE_CLI_COMMON_SHORTOPTS, LONG, NULL)) != -1) {
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
        case OPT_EP: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > 65536)
                return moe_cli_usage_error("moe-convert",
                                           "--ep expects a number of ranks >= 1, not '%s'", optarg);
            ep = (int)v;
            break;
        }
        case '@':
            if (atoi(optarg) < 1)
                return moe_cli_usage_error("moe-convert",
                                           "-@/--threads expects a number >= 1, not '%s'", optarg);
            break;
        default: {
            if (opt == '?' || opt == ':') return moe_cli_option_error("moe-convert", opt, argv);
            int rc = moe_cli_common_option("moe-convert", USAGE, opt, &level);
            if (rc != MOE_CLI_CONTINUE) return rc;
            break;
        }
        }
    }
    moe_log_init("moe-convert", level);
    if (optind >= argc)
        return moe_cli_usage_error("moe-convert", "%s",
                                   "a command is required: to-hf, from-hf, reshard, "
                                   "consolidate or inspect");
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
    } else if (strcmp(cmd, "reshard") == 0) {
        if (ep < 1)
            return moe_cli_usage_error("moe-convert", "%s",
                                       "reshard needs --ep N (1 is the same as consolidate)");
        if (nargs < 2)
            return moe_cli_usage_error("moe-convert", "%s",
                                       "reshard takes --ep N CKPT OUT_DIR [KEY=VALUE...]");
        st = moe_convert_reshard(args[0], args[1], ep, nargs - 2, args + 2, &err);
    } else if (strcmp(cmd, "consolidate") == 0) {
        if (nargs != 2)
            return moe_cli_usage_error("moe-convert", "%s", "consolidate takes CKPT OUT_DIR");
        st = moe_convert_reshard(args[0], args[1], 1, 0, NULL, &err);
    } else if (strcmp(cmd, "inspect") == 0) {
        if (nargs != 1)
            return moe_cli_usage_error("moe-convert", "%s",
                                       "inspect takes one checkpoint, directory or file");
        st = moe_convert_inspect(args[0], &o, stdout, &err);
    } else {
        return moe_cli_usage_error(
            "moe-convert", "unknown command '%s' (to-hf, from-hf, reshard, consolidate, inspect)",
            cmd);
    }
    if (st != MOE_OK) {
        moe_err_print(&err, "moe-convert", stderr);
        return moe_err_exit_code(&err);
    }
    return 0;
}
