/* moe-train: train (or resume training) a Mixtral-style MoE language model on token shards.
 *
 * Argument parsing only: the config is loaded by moe_config_load (file, then key=value
 * overrides, then validation) and the run is moe_train_run (libcore/src/train/train.c). Exit
 * status: 0 done, 1 runtime failure, 2 usage or input error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/cli.h"
#include "moe/comm.h"
#include "moe/config.h"
#include "moe/err.h"
#include "moe/log.h"
#include "moe/ops.h"
#include "moe/train.h"

static const char USAGE[] =
    "Usage: moe-train -c CONFIG.yaml [options] [key.path=value ...]\n"
    "\n"
    "Trains a Mixtral-style mixture-of-experts language model on token shards written\n"
    "by moe-tokenize. The run directory receives checkpoints (ckpt-<step>/), `latest`,\n"
    "metrics.jsonl, metrics.tsv, loss.svg and provenance.txt. See docs/training.md.\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE     YAML config (configs/tiny.yaml, ...); required\n"
    "      --data PATH       training shards: a .mtok file, a directory, a manifest,\n"
    "                        or - (a shard stream on stdin); overrides data.path\n"
    "  -o, --output DIR      run directory (default: run)\n"
    "      --resume WHAT     auto: continue from DIR/latest if there is one;\n"
    "                        or a checkpoint directory (DIR/ckpt-00000100; a run\n"
    "                        directory means its latest checkpoint)\n"
    "      --init CKPT       fine-tune: start this run (step 0, fresh AdamW state, this\n"
    "                        config's data and schedule) from CKPT's weights; model.*\n"
    "                        comes from CKPT (native, or imported by moe-convert from-hf)\n"
    "      --stop-at N       end after step N with a checkpoint (train.steps still\n"
    "                        sets the length of the run and the LR schedule)\n"
    "      --dry-run         print the resolved config, parameter counts, FLOPs per\n"
    "                        token and a memory estimate, then exit\n"
    "      --log-json FILE   also write the metrics JSON lines to FILE (- = stdout)\n"
    "  -@, --threads N       OpenMP threads (default: all cores)\n"
    "  -q, --quiet           errors and warnings only\n"
    "  -v, --verbose         debug messages\n"
    "  -h, --help            this help\n"
    "  -V, --version         version and library versions\n"
    "\n"
    "SIGTERM, SIGINT and SIGUSR1 (train.stop_signal) finish the step, write a checkpoint\n"
    "and exit 0 (continue with --resume auto); a second SIGINT aborts at once.\n"
    "key.path=value overrides any config key, e.g. train.steps=400 optim.lr=1e-3.\n"
    "Data and expert parallelism on the CPU: start parallel.dp x parallel.ep processes\n"
    "with mpirun or srun --mpi=pmix (not torchrun); each runs its share of a step's\n"
    "micro-batches, holds 1/ep of the experts, and rank 0 writes the run directory; a\n"
    "rank that dies or hangs ends the job after parallel.timeout_s (default 600).\n"
    "Data parallelism on GPUs: device=cuda parallel.dp=N with N processes started by\n"
    "mpirun/srun or by torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,\n"
    "MASTER_PORT), one GPU each (by local rank), over NCCL; parallel.ep > 1 needs the CPU.\n"
    "What has run on GPUs so far: docs/scaling.md.\n"
    "\n"
    "Example:\n"
    "  moe-tokenize data/lambda_virus.fa.gz --val-fraction 0.05 -o shards/\n"
    "  moe-train -c configs/tiny.yaml --data shards/ -o run/\n"
    "  moe-train -c configs/tiny.yaml --data shards/ -o run/ --resume auto train.steps=400\n"
    "  mpirun -np 4 moe-train -@ 8 -c configs/L0_sanity.yaml --data shards/ -o run4/ "
    "parallel.dp=2 parallel.ep=2\n"
    "  mpirun -np 8 moe-train -c configs/L0_sanity.yaml --data shards/ -o run8/ device=cuda "
    "parallel.dp=8\n";

enum { OPT_DATA = 256, OPT_RESUME, OPT_INIT, OPT_STOP_AT, OPT_DRY_RUN, OPT_LOG_JSON };

int main(int argc, char **argv) {
    moe_backend_cpu_tune_blas(argv);
    static const struct option longopts[] = {{"config", required_argument, NULL, 'c'},
                                             {"data", required_argument, NULL, OPT_DATA},
                                             {"output", required_argument, NULL, 'o'},
                                             {"resume", required_argument, NULL, OPT_RESUME},
                                             {"init", required_argument, NULL, OPT_INIT},
                                             {"stop-at", required_argument, NULL, OPT_STOP_AT},
                                             {"dry-run", no_argument, NULL, OPT_DRY_RUN},
                                             {"log-json", required_argument, NULL, OPT_LOG_JSON},
                                             MOE_CLI_COMMON_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    const char *config = NULL;
    moe_train_opts opts;
    memset(&opts, 0, sizeof opts);
    char cmd[2048];
    moe_cli_command_line(argc, argv, cmd, sizeof cmd); /* before getopt permutes argv */
    opts.command = cmd;
    int dry_run = 0, threads = 0;
    moe_log_level level = MOE_LOG_INFO;
    int c;
    opterr = 0; /* one message of ours (moe_cli_option_error), not getopt's too */
    while ((c = getopt_long(argc, argv, ":c:o:" MOE_CLI_COMMON_SHORTOPTS, longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case OPT_DATA:
            opts.data_path = optarg;
            break;
        case 'o':
            opts.run_dir = optarg;
            break;
        case OPT_RESUME:
            opts.resume = optarg;
            break;
        case OPT_INIT:
            opts.init = optarg;
            break;
        case OPT_STOP_AT:
            opts.stop_at = strtoll(optarg, &end, 10);
            if (*end || opts.stop_at < 1)
                return moe_cli_usage_error(
                    "moe-train", "--stop-at expects a step number >= 1, got '%s'", optarg);
            break;
        case OPT_DRY_RUN:
            dry_run = 1;
            break;
        case OPT_LOG_JSON:
            opts.log_json = optarg;
            break;
        case '@':
            threads = (int)strtol(optarg, &end, 10);
            if (*end || threads < 1)
                return moe_cli_usage_error("moe-train",
                                           "-@/--threads expects a number >= 1, got '%s'", optarg);
            break;
        default: {
            if (c == '?' || c == ':') return moe_cli_option_error("moe-train", c, argv);
            int rc = moe_cli_common_option("moe-train", USAGE, c, &level);
            if (rc != MOE_CLI_CONTINUE) return rc;
            break;
        }
        }
    }
    if (!config)
        return moe_cli_usage_error("moe-train", "%s", "a config is required (-c CONFIG.yaml)");
    for (int i = optind; i < argc; i++)
        if (!strchr(argv[i], '='))
            return moe_cli_usage_error(
                "moe-train", "unexpected argument '%s' (overrides look like key.path=value)",
                argv[i]);
    opts.threads = threads;

    moe_err err;
    moe_err_clear(&err);
    moe_comm comm;
    if (moe_comm_init(&comm, &argc, &argv, &err) != MOE_OK) {
        moe_err_print(&err, "moe-train", stderr);
        return moe_err_exit_code(&err);
    }
    char prog[48] = "moe-train";
    opts.comm = &comm;
    if (comm.world > 1) {
        if (comm.rank != 0) snprintf(prog, sizeof prog, "moe-train[rank %d]", comm.rank);
        if (comm.rank != 0 && level > MOE_LOG_WARN) level = MOE_LOG_WARN; /* rank 0 reports */
    }
    moe_log_init(prog, level);
    opts.quiet = level < MOE_LOG_INFO;
    opts.stop_on_signals = 1;
    moe_config cfg;
    moe_status st = moe_config_load(&cfg, config, argc - optind, argv + optind, &err);
    if (st == MOE_OK && opts.init)
        st = moe_train_init_config(&cfg, opts.init, argc - optind, argv + optind, &err);
    if (st == MOE_OK && opts.data_path)
        snprintf(cfg.data.path, sizeof cfg.data.path, "%s", opts.data_path);
    if (st == MOE_OK && dry_run) {
        if (comm.rank == 0) st = moe_train_dry_run(&cfg, stdout, &err); /* one report per run */
    } else if (st == MOE_OK) {
        st = moe_train_run(&cfg, &opts, &err);
    }
    if (st != MOE_OK) {
        moe_err_print(&err, prog, stderr);
        moe_comm_abort(&comm, moe_err_exit_code(&err)); /* the other ranks would wait forever */
        moe_comm_finalize(&comm);
        return moe_err_exit_code(&err);
    }
    moe_comm_finalize(&comm);
    return 0;
}
