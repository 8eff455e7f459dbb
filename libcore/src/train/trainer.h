/* trainer: the state of one moe-train invocation, shared by the loop (train.c) and its
 * setup and teardown (train_setup.c). Internal to libcore/src/train. */
#ifndef MOE_TRAIN_TRAINER_H
#define MOE_TRAIN_TRAINER_H

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/dataloader.h"
#include "moe/fileio.h"
#include "moe/metrics.h"
#include "moe/model.h"
#include "moe/shard.h"
#include "moe/train.h"
#include "train/train_health.h"

typedef struct trainer {
    moe_config cfg; /* resolved: data.path is the data actually used */
    const char *run_dir;
    moe_comm *comm;    /* the run's processes (opts->comm, or `single`), grouped dp x ep */
    moe_comm single;   /* one process */
    int rank, world;   /* this process; dp x ep of them */
    int ep, evaluator; /* parallel.ep; 1 on the ranks that run the evaluation */
    moe_shardset *data, *val;
    moe_dataloader dl, vdl;
    int has_val;
    const moe_backend *be;
    char device[32]; /* what be was opened as (choose_device) */
    int resumed;     /* --resume found and loaded a checkpoint */
    moe_model model;
    /* ZeRO-1: the dense part [0, dense_elems) of the flat array is sliced over all ranks
     * (dslice [world + 1], absolute), this rank's experts [dense_elems, n_elems) over the dp
     * replicas of the shard (xslice [dp + 1], relative to dense_elems); this rank's AdamW
     * state covers its dense slice [dlo, dhi) and then its expert slice [xlo, xhi) */
    moe_buf m, v; /* [(dhi - dlo) + (xhi - xlo)] dev, Adam moments of optim.moments' type */
    int64_t dlo, dhi, xlo, xhi, *dslice, *xslice;
    int32_t *tokens, *targets; /* [B_micro, T] host */
    float *weights;            /* [B_micro, T] host, NULL when no lower-case weighting */
    int64_t T, B_micro, accum, end_step;
    double bases_per_token;
    moe_outfile metrics, json; /* appended in place; json.fp NULL without --log-json */
    moe_dirlock lock;          /* RUN/.lock, held by rank 0 for the run's life */
    moe_train_health health;   /* non-finite steps and loss spikes (train_health.h) */
    char metrics_path[MOE_CKPT_PATH_MAX];
    double t_start; /* moe_time_now() when this invocation began: metrics' elapsed_s */
    moe_metrics_history hist;
    moe_trainer_state ts;
} trainer;

/* Setup and teardown, in the order moe_train_run calls them (train_setup.c; each function's
 * contract is above its definition there). */
moe_status trainer_choose_device(trainer *t, moe_err *err);
moe_status trainer_open_backend(trainer *t, int threads, moe_err *err);
moe_status trainer_open_data(trainer *t, moe_err *err);
moe_status trainer_open_outputs(trainer *t, const char *log_json, moe_err *err);
moe_status trainer_resume(trainer *t, const char *spec, moe_err *err);
moe_status trainer_init_weights(trainer *t, const char *spec, moe_err *err);
moe_status trainer_check_parallel(const trainer *t, int world, moe_err *err);
moe_status trainer_apply_skip_layers(trainer *t, moe_err *err);
moe_status trainer_ep_alltoallv(void *ctx, const void *send, const int64_t *send_rows, void *recv,
                                const int64_t *recv_rows, size_t row_bytes, moe_err *err);
moe_status trainer_alloc_state(trainer *t, moe_err *err);
void trainer_free(trainer *t, int failed);

#endif
