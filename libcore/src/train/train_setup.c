/* train_setup: moe-train's setup and teardown (trainer.h): the device and backend, the data,
 * the run directory's outputs, resuming or --init, the parallel layout, skip_layers, the ZeRO-1
 * slices and AdamW state, and trainer_free. The loop itself is train.c. */
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"
#include "moe/log.h"
#include "train/trainer.h"

/* ---- setup ---- */

/* The device this rank opens into t->device: cpu, cuda, or auto = the first GPU when one is
 * usable, else the CPU (moe_backend_open). Several ranks: auto means cpu (data and expert
 * parallelism over MPI); cuda means the rank's GPU by local rank (moe_backend_rank_device),
 * data-parallel over NCCL (open_backend attaches it), expert parallelism refused there; the
 * CPU refuses a torchrun-style launch, which starts no MPI (moe_comm_check_host). */
moe_status trainer_choose_device(trainer *t, moe_err *err) {
    const char *device = moe_device_name(t->cfg.device);
    snprintf(t->device, sizeof t->device, "%s", device);
    if (t->world == 1) return MOE_OK;
    if (t->cfg.device == MOE_DEVICE_AUTO) device = "cpu";
    moe_status st = moe_backend_rank_device(device, t->comm->local_rank, moe_backend_gpu_count(),
                                            t->device, sizeof t->device, err);
    if (st != MOE_OK) return st;
    if (strcmp(t->device, "cpu") == 0) return moe_comm_check_host(t->comm, err);
    if (t->ep == 1) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "parallel.ep=%d with device=cuda (this rank: %s): GPU ranks train data-parallel "
                "over NCCL; expert parallelism runs on the CPU backend over MPI in this version "
                "(the all-to-all of token rows between GPUs is not in yet)",
                t->ep, t->device);
    moe_err_hint(err,
                 "set parallel.ep=1 parallel.dp=%d for data parallelism on %d GPUs, or "
                 "device=cpu with mpirun or srun for expert parallelism",
                 t->world, t->world);
    return MOE_ERR_INPUT;
}

/* The rank's backend; the run's collectives then take its buffers (NCCL for a GPU's, when a
 * launcher started the run: moe_comm_attach_backend). */
moe_status trainer_open_backend(trainer *t, int threads, moe_err *err) {
    t->be = moe_backend_open(t->device, moe_config_recipe(&t->cfg), threads, err);
    return t->be ? moe_comm_attach_backend(t->comm, t->be, err) : MOE_ERR_INPUT;
}

moe_status trainer_open_data(trainer *t, moe_err *err) {
    const char *path = t->cfg.data.path;
    moe_status st = moe_shardset_open(&t->data, path, err);
    if (st != MOE_OK) return st;
    st = moe_dataloader_check_vocab(t->data, path, t->cfg.model.vocab_size, err);
    if (st != MOE_OK) return st;
    st =
        moe_dataloader_init(&t->dl, t->data, t->T, t->cfg.data.shuffle, (uint64_t)t->cfg.train.seed,
                            t->cfg.data.lowercase_weight, "the training data", err);
    if (st != MOE_OK) return st;
    moe_dataloader_set_document_mask(&t->dl, t->cfg.train.document_mask);
    const moe_tokenizer *tok = moe_shardset_tokenizer(t->data);
    t->bases_per_token = moe_tokenizer_max_bases_per_token(tok);

    const char *vpath = t->cfg.data.val_path[0] ? t->cfg.data.val_path : NULL;
    st = vpath ? moe_shardset_open(&t->val, vpath, err) : moe_shardset_open_val(&t->val, path, err);
    if (st != MOE_OK) return st;
    if (!t->val) {
        if (strcmp(path, "-") == 0)
            moe_log_warn("no validation data (a stream on stdin carries one shard; set "
                         "data.val_path): val_loss is not reported");
        else
            moe_log_warn("no validation data (no *.val.mtok next to %s, data.val_path unset): "
                         "val_loss is not reported",
                         path);
        return MOE_OK;
    }
    const moe_tokenizer *vtok = moe_shardset_tokenizer(t->val);
    if (vtok->vocab_hash != tok->vocab_hash) {
        moe_err_set(err, MOE_ERR_INPUT, vpath ? vpath : path,
                    "the validation data uses another tokenizer (%s, %lld tokens) than the "
                    "training data (%s, %lld tokens)",
                    vtok->name, (long long)vtok->vocab_size, tok->name, (long long)tok->vocab_size);
        moe_err_hint(err, "tokenize both with the same moe-tokenize options");
        return MOE_ERR_INPUT;
    }
    moe_err sub;
    moe_err_clear(&sub);
    if (moe_dataloader_init(&t->vdl, t->val, t->T, 0, 0, 1.0, "the validation data", &sub) !=
        MOE_OK) {
        moe_log_warn("%s; validation is disabled", sub.msg);
        return MOE_OK;
    }
    moe_dataloader_set_document_mask(&t->vdl, t->cfg.train.document_mask);
    t->has_val = 1;
    return MOE_OK;
}

/* Opens metrics.jsonl (append) after dropping lines past the resumed step. */
moe_status trainer_open_outputs(trainer *t, const char *log_json, moe_err *err) {
    snprintf(t->metrics_path, sizeof t->metrics_path, "%s/metrics.jsonl", t->run_dir);
    moe_status st = moe_metrics_jsonl_truncate(t->metrics_path, t->ts.step, &t->hist, err);
    if (st != MOE_OK) return st;
    if (moe_outfile_open_append(&t->metrics, t->metrics_path, err) != MOE_OK) {
        moe_err_hint(err, "choose a writable run directory with -o");
        return MOE_ERR_INPUT;
    }
    if (log_json && log_json[0]) return moe_outfile_open_append(&t->json, log_json, err);
    return MOE_OK;
}

moe_status trainer_resume(trainer *t, const char *spec, moe_err *err) {
    char dir[MOE_CKPT_PATH_MAX];
    if (strcmp(spec, "auto") == 0) {
        int found;
        moe_status st = moe_ckpt_latest(t->run_dir, dir, sizeof dir, &found, err);
        if (st != MOE_OK) return st;
        if (!found) {
            moe_log_info("--resume auto: no checkpoint in %s, starting from step 0", t->run_dir);
            return MOE_OK;
        }
    } else { /* a checkpoint, or a run directory meaning its latest (moe_ckpt_open) */
        snprintf(dir, sizeof dir, "%.4000s", spec);
    }
    uint64_t hash = moe_shardset_tokenizer(t->data)->vocab_hash;
    /* the moments of this rank's tensors arrive whole (from either layout, at any ep); this
     * rank keeps its slices */
    moe_dtype mdt = t->m.dt;
    size_t es = moe_dtype_size(mdt), bytes = (size_t)t->model.table.n_elems * es;
    int whole = t->world == 1; /* one process owns every element: loaded in place */
    moe_buf m = whole ? t->m : moe_buf_of(t->be->alloc(t->be, bytes), mdt);
    moe_buf v = whole ? t->v : moe_buf_of(t->be->alloc(t->be, bytes), mdt);
    moe_status st =
        m.p && v.p ? moe_train_load_checkpoint(dir, &t->cfg, hash, &t->model, m, v, &t->ts, err)
                   : moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
    if (st == MOE_OK && !whole) {
        int64_t dn = t->dhi - t->dlo, xn = t->xhi - t->xlo;
        t->be->memcpy_d2d(t->be, t->m.p, moe_buf_at(m, t->dlo).p, (size_t)dn * es);
        t->be->memcpy_d2d(t->be, t->v.p, moe_buf_at(v, t->dlo).p, (size_t)dn * es);
        t->be->memcpy_d2d(t->be, moe_buf_at(t->m, dn).p, moe_buf_at(m, t->xlo).p, (size_t)xn * es);
        t->be->memcpy_d2d(t->be, moe_buf_at(t->v, dn).p, moe_buf_at(v, t->xlo).p, (size_t)xn * es);
    }
    if (!whole) {
        t->be->free(t->be, m.p);
        t->be->free(t->be, v.p);
    }
    if (st != MOE_OK) return st;
    if (t->ts.data_samples != t->dl.n_samples || t->ts.data_stream_tokens != t->dl.stream_tokens ||
        t->ts.seed != (uint64_t)t->cfg.train.seed || t->ts.data_shuffle != t->cfg.data.shuffle) {
        moe_log_warn("the data, seed or shuffle setting differ from the checkpoint's (%lld "
                     "samples of %lld tokens then, %lld now): the data order will not continue "
                     "exactly",
                     (long long)t->ts.data_samples, (long long)t->ts.data_stream_tokens,
                     (long long)t->dl.n_samples);
        if (t->ts.data_index > t->dl.n_samples) t->ts.data_index = t->dl.n_samples;
    }
    t->ts.seed = (uint64_t)t->cfg.train.seed;
    t->ts.data_shuffle = t->cfg.data.shuffle;
    t->ts.data_samples = t->dl.n_samples;
    t->ts.data_stream_tokens = t->dl.stream_tokens;
    st = moe_dataloader_set_position(&t->dl, t->ts.data_epoch, t->ts.data_index, err);
    if (st != MOE_OK) return st;
    moe_train_health_restore(&t->health, &t->ts);
    moe_log_info("resumed from %s at step %lld (%lld tokens seen)", dir, (long long)t->ts.step,
                 (long long)t->ts.tokens_seen);
    t->resumed = 1;
    return MOE_OK;
}

/* --init: the weights of a checkpoint (model config and tokenizer checked); the optimizer
 * stays fresh (zero moments) and the run starts at step 0 with its own data and schedule. */
moe_status trainer_init_weights(trainer *t, const char *spec, moe_err *err) {
    uint64_t hash = moe_shardset_tokenizer(t->data)->vocab_hash;
    moe_status st = moe_train_load_weights(spec, &t->cfg, hash, &t->model, t->ts.init_from,
                                           sizeof t->ts.init_from, err);
    if (st == MOE_OK)
        moe_log_info("--init: weights from %s; step 0, fresh AdamW state", t->ts.init_from);
    return st;
}

/* parallel.dp x parallel.ep ranks, one per process the launcher started, each taking every
 * world-th micro-batch of a step (the config guarantees world divides their number). */
moe_status trainer_check_parallel(const trainer *t, int world, moe_err *err) {
    const moe_config *c = &t->cfg;
    int64_t want = c->parallel.dp * c->parallel.ep;
    if (want != world) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "parallel.dp=%lld x parallel.ep=%lld = %lld ranks but %d process%s started",
                    (long long)c->parallel.dp, (long long)c->parallel.ep, (long long)want, world,
                    world == 1 ? " was" : "es were");
        if (world == 1)
            moe_err_hint(err, "start one process per rank: mpirun -np %lld moe-train ...",
                         (long long)want);
        else if (world % c->parallel.ep == 0)
            moe_err_hint(err, "set parallel.dp=%lld", (long long)(world / c->parallel.ep));
        else
            moe_err_hint(err, "set parallel.dp=%d parallel.ep=1", world);
        return MOE_ERR_INPUT;
    }
    if (world > 1 && strcmp(c->data.path, "-") == 0) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--data - (a stream on stdin) feeds one process, not %d ranks", world);
        moe_err_hint(err, "tokenize into shard files first (moe-tokenize -o shards/)");
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

/* precision.skip_layers on the model, with a log line naming the layers kept in bf16. */
moe_status trainer_apply_skip_layers(trainer *t, moe_err *err) {
    const moe_config *c = &t->cfg;
    if (!c->precision.skip_layers[0]) return MOE_OK;
    int64_t L = c->model.num_hidden_layers;
    uint8_t *skip = malloc((size_t)L);
    if (!skip) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory");
    moe_status st = moe_config_skip_layers(c, skip, err);
    if (st == MOE_OK) st = moe_model_set_skip_layers(&t->model, skip, err);
    int quantized = moe_recipe_is_fp8(c->precision.recipe);
    if (st == MOE_OK && t->rank == 0) {
        char list[256] = "";
        for (int64_t l = 0, at = 0; l < L && at < (int64_t)sizeof list - 8; l++)
            if (skip[l])
                at += snprintf(list + at, sizeof list - (size_t)at, "%s%lld", at ? "," : "",
                               (long long)l);
        if (quantized)
            moe_log_info("precision: layers %s stay bf16 under %s (precision.skip_layers)", list,
                         moe_recipe_name(c->precision.recipe));
        else
            moe_log_info("precision.skip_layers (%s) has no effect under %s", list,
                         moe_recipe_name(c->precision.recipe));
    }
    free(skip);
    return st;
}

/* moe_model_ep's all-to-all: rows of row_bytes over this rank's expert group (ctx: the
 * moe_comm). */
moe_status trainer_ep_alltoallv(void *ctx, const void *send, const int64_t *send_rows, void *recv,
                                const int64_t *recv_rows, size_t row_bytes, moe_err *err) {
    const moe_comm *c = ctx;
    int P = c->gsize[MOE_COMM_EP];
    int64_t *b = malloc((size_t)(2 * P) * sizeof *b);
    if (!b) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int r = 0; r < P; r++)
        b[r] = send_rows[r] * (int64_t)row_bytes, b[P + r] = recv_rows[r] * (int64_t)row_bytes;
    moe_status st = moe_comm_alltoallv(c, MOE_COMM_EP, send, b, recv, b + P, MOE_COMM_BYTE, err);
    free(b);
    return st;
}

/* The ZeRO-1 slices (see trainer), this rank's AdamW state and the host batch buffers. */
moe_status trainer_alloc_state(trainer *t, moe_err *err) {
    const moe_comm *c = t->comm;
    int dp = c->gsize[MOE_COMM_DP], d = c->grank[MOE_COMM_DP];
    int64_t dense = t->model.table.dense_elems, xel = t->model.table.n_elems - dense;
    size_t tok = (size_t)(t->B_micro * t->T);
    t->dslice = malloc((size_t)(t->world + 1) * sizeof *t->dslice);
    t->xslice = malloc((size_t)(dp + 1) * sizeof *t->xslice);
    t->tokens = malloc(tok * sizeof *t->tokens);
    t->targets = malloc(tok * sizeof *t->targets);
    if (t->dl.use_weights) t->weights = malloc(tok * sizeof *t->weights);
    if (!t->dslice || !t->xslice || !t->tokens || !t->targets || (t->dl.use_weights && !t->weights))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int r = 0; r <= t->world; r++)
        t->dslice[r] = dense * r / t->world;
    for (int r = 0; r <= dp; r++)
        t->xslice[r] = xel * r / dp;
    t->dlo = t->dslice[t->rank], t->dhi = t->dslice[t->rank + 1];
    t->xlo = dense + t->xslice[d], t->xhi = dense + t->xslice[d + 1];
    moe_dtype mdt = t->cfg.optim.moments; /* zero is 0 in either type */
    size_t bytes = (size_t)((t->dhi - t->dlo) + (t->xhi - t->xlo)) * moe_dtype_size(mdt);
    t->m = moe_buf_of(t->be->alloc(t->be, bytes ? bytes : sizeof(float)), mdt);
    t->v = moe_buf_of(t->be->alloc(t->be, bytes ? bytes : sizeof(float)), mdt);
    if (!t->m.p || !t->v.p)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory for %lld parameters",
                           (long long)t->model.table.n_elems);
    t->be->memset(t->be, t->m.p, 0, bytes);
    t->be->memset(t->be, t->v.p, 0, bytes);
    return MOE_OK;
}

void trainer_free(trainer *t, int failed) {
    if (t->be) {
        t->be->free(t->be, t->m.p);
        t->be->free(t->be, t->v.p);
    }
    moe_model_free(&t->model);
    moe_comm_detach_backend(t->comm, failed); /* before the backend it lives on */
    if (t->be) t->be->destroy(t->be);
    moe_dataloader_free(&t->dl);
    moe_dataloader_free(&t->vdl);
    moe_shardset_close(t->data);
    moe_shardset_close(t->val);
    free(t->dslice);
    free(t->xslice);
    free(t->tokens);
    free(t->targets);
    free(t->weights);
    if (t->metrics.fp) moe_outfile_abort(&t->metrics); /* appended: closes, removes nothing */
    if (t->json.fp) moe_outfile_abort(&t->json);
    moe_metrics_history_free(&t->hist);
    free(t->ts.last_metrics);
    moe_dirlock_release(&t->lock);
}
