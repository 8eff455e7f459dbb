/* train_ckpt: what goes into a training checkpoint and how it comes back (moe/train.h).
 *
 *   config.yaml                  resolved config (moe_config_write_yaml)
 *   tokenizer.json               the data's tokenizer spec
 *   model.safetensors            fp32 master weights, Hugging Face names, metadata format=pt
 *   optimizer-rank0.safetensors  <param>.exp_avg and <param>.exp_avg_sq (fp32; a run with
 *                                optim.moments bf16 writes its bf16 values widened exactly)
 *   trainer_state.json           step, tokens, data position, seed, last metrics
 *
 * Training with parallel.ep = 1 writes this single-file layout, with ep = N the
 * expert-parallel layout of moe/ckpt.h (each of the N ranks of expert group 0 writes its
 * model and optimizer shard, moe_train_write_shard; rank 0 the rest, moe_train_finish_
 * checkpoint); tensors in the order of the parameter table (the safetensors writer sorts them
 * by name). Loading goes through moe_ckpt_open (moe/ckpt.h) and so takes either layout at any
 * ep: each rank reads its own experts by name; the run's config wins, the checkpoint's
 * parallel.ep only says how its tensors are stored. Loading
 * refuses anything that does not fit the current run: a MANIFEST mismatch, another model shape,
 * another tokenizer, a missing or misshapen tensor - each naming the file. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/safetensors.h"
#include "moe/tokenizer.h"
#include "moe/train.h"
#include "moe/version.h"

/* Writes the tensors of the parameter table with data from host ([n_elems]), each name
 * followed by suffix ("" for weights) - and, with host2, suffix2 from host2; the dense
 * tensors only when `dense` (expert-parallel rank 0 holds them). */
static moe_status write_params(const char *path, const moe_model *model, int dense,
                               const float *host, const char *suffix, const char *suffix2,
                               const float *host2, int64_t step, moe_err *err) {
    moe_st_writer w;
    moe_st_writer_init(&w);
    moe_status st = moe_st_writer_meta(&w, "format", "pt", err);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64, step);
    if (st == MOE_OK) st = moe_st_writer_meta(&w, "step", buf, err);
    for (int i = 0; st == MOE_OK && i < model->table.n_params; i++) {
        const moe_param *p = &model->table.params[i];
        if (p->expert < 0 && !dense) continue;
        char name[160];
        snprintf(name, sizeof name, "%s%s", p->name, suffix);
        st = moe_st_writer_add(&w, name, MOE_ST_F32, p->ndim, p->shape, host + p->offset, err);
        if (st == MOE_OK && host2) {
            snprintf(name, sizeof name, "%s%s", p->name, suffix2);
            st = moe_st_writer_add(&w, name, MOE_ST_F32, p->ndim, p->shape, host2 + p->offset, err);
        }
    }
    if (st == MOE_OK) st = moe_st_writer_write(&w, path, err);
    moe_st_writer_free(&w);
    return st;
}

/* The moments m [n] (backend memory) as fp32 into host [n]: the checkpoint format is fp32
 * whatever a run stores, so BF16 moments are widened (exactly) through stage [n] (host
 * scratch, BF16 only). */
static moe_status moments_to_host(const moe_backend *be, float *host, moe_cbuf m, int64_t n,
                                  uint16_t *stage, moe_err *err) {
    if (m.dt != MOE_DTYPE_BF16) {
        be->memcpy_d2h(be, host, m.p, (size_t)n * sizeof(float));
        return MOE_OK;
    }
    be->memcpy_d2h(be, stage, m.p, (size_t)n * sizeof(uint16_t));
    return moe_convert(host, MOE_DTYPE_F32, stage, MOE_DTYPE_BF16, n, err);
}

/* The fp32 moments host [n] of a checkpoint into m [n] (backend memory): BF16 moments are
 * rounded to nearest even through stage [n] (host scratch, BF16 only), which gives back
 * exactly the values of a run that stored bf16 (it wrote them widened) and rounds the
 * moments of an fp32 run once. */
static moe_status moments_from_host(const moe_backend *be, moe_buf m, const float *host, int64_t n,
                                    uint16_t *stage, moe_err *err) {
    if (m.dt != MOE_DTYPE_BF16) {
        be->memcpy_h2d(be, m.p, host, (size_t)n * sizeof(float));
        return MOE_OK;
    }
    moe_status st = moe_convert(stage, MOE_DTYPE_BF16, host, MOE_DTYPE_F32, n, err);
    if (st == MOE_OK) be->memcpy_h2d(be, m.p, stage, (size_t)n * sizeof(uint16_t));
    return st;
}

/* Host scratch for moments_to_host/moments_from_host: n codes when m or v (types dm, dv) is
 * BF16, else none (*stage NULL). */
static moe_status moments_stage(moe_dtype dm, moe_dtype dv, int64_t n, uint16_t **stage,
                                const char *dir, moe_err *err) {
    *stage = NULL;
    if (dm != MOE_DTYPE_BF16 && dv != MOE_DTYPE_BF16) return MOE_OK;
    *stage = malloc(n ? (size_t)n * sizeof(uint16_t) : 1);
    return *stage ? MOE_OK : moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
}

moe_status moe_train_write_shard(const char *dir, int ep_rank, int ep, const moe_model *model,
                                 moe_cbuf m, moe_cbuf v, int64_t step, moe_err *err) {
    const moe_backend *be = model->be;
    int64_t n = model->table.n_elems;
    size_t bytes = (size_t)n * sizeof(float);
    float *host = malloc(bytes ? bytes : 1), *host2 = malloc(bytes ? bytes : 1);
    uint16_t *stage = NULL;
    char name[64], path[MOE_CKPT_PATH_MAX + 64];
    moe_status st = MOE_OK;
    if (!host || !host2) st = moe_err_set(err, MOE_ERR_RUNTIME, dir, "out of memory");
    if (st == MOE_OK) st = moments_stage(m.dt, v.dt, n, &stage, dir, err);
    if (st == MOE_OK) {
        moe_model_copy_params_to_host(model, host);
        moe_ckpt_model_file(ep_rank, ep, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st = write_params(path, model, ep_rank == 0, host, "", NULL, NULL, step, err);
    }
    if (st == MOE_OK) st = moments_to_host(be, host, m, n, stage, err);
    if (st == MOE_OK) st = moments_to_host(be, host2, v, n, stage, err);
    if (st == MOE_OK) {
        moe_ckpt_optim_file(ep_rank, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st = write_params(path, model, ep_rank == 0, host, ".exp_avg", ".exp_avg_sq", host2, step,
                          err);
    }
    free(host);
    free(host2);
    free(stage);
    return st;
}

moe_status moe_train_finish_checkpoint(moe_ckpt_writer *w, int64_t keep, const moe_config *cfg,
                                       const char *tokenizer_json, const moe_trainer_state *ts,
                                       moe_err *err) {
    char path[MOE_CKPT_PATH_MAX], *text = NULL;
    moe_status st = MOE_OK;
    moe_outfile out;
    st = moe_outfile_open(&out, moe_ckpt_path(w, "config.yaml", path, sizeof path), err);
    if (st == MOE_OK) {
        st = moe_config_write_yaml(cfg, out.fp, err);
        if (st == MOE_OK)
            st = moe_outfile_commit(&out, err);
        else
            moe_outfile_abort(&out);
    }
    if (st == MOE_OK)
        st = moe_write_text_file(moe_ckpt_path(w, "tokenizer.json", path, sizeof path),
                                 tokenizer_json, NULL, err);
    if (st == MOE_OK && cfg->parallel.ep > 1) {
        moe_param_table full; /* the index names every expert of every rank */
        st = moe_param_table_build(&full, &cfg->model, 0, cfg->model.num_local_experts, err);
        if (st == MOE_OK) st = moe_ckpt_write_index(w->tmp_dir, &full, (int)cfg->parallel.ep, err);
        moe_param_table_free(&full);
    }
    if (st == MOE_OK) {
        text = moe_ckpt_state_json(ts);
        if (!text)
            st = moe_err_set(err, MOE_ERR_RUNTIME, w->run_dir, "cannot encode trainer state");
    }
    if (st == MOE_OK)
        st = moe_write_text_file(moe_ckpt_path(w, "trainer_state.json", path, sizeof path), text,
                                 NULL, err);
    free(text);
    if (st != MOE_OK) {
        moe_ckpt_abort(w);
        return st;
    }
    return moe_ckpt_commit(w, keep, err);
}

moe_status moe_train_save_checkpoint(const char *run_dir, int64_t keep, const moe_config *cfg,
                                     const char *tokenizer_json, const moe_model *model, moe_cbuf m,
                                     moe_cbuf v, const moe_trainer_state *ts, moe_err *err) {
    moe_ckpt_writer w;
    moe_status st = moe_ckpt_begin(&w, run_dir, ts->step, err);
    if (st != MOE_OK) return st;
    moe_config one = *cfg; /* one process holds every expert: the single-file layout */
    one.parallel.ep = 1;
    st = moe_train_write_shard(w.tmp_dir, 0, 1, model, m, v, ts->step, err);
    if (st != MOE_OK) {
        moe_ckpt_abort(&w);
        return st;
    }
    return moe_train_finish_checkpoint(&w, keep, &one, tokenizer_json, ts, err);
}

/* ---- loading ---- */

/* The checkpoint's model config must equal the run's: names the first differing key (with
 * hint, or the resume hint when NULL). */
static moe_status check_model_config(const char *path, const moe_model_config *a,
                                     const moe_model_config *b, const char *hint, moe_err *err) {
#define INT_KEY(k)                                                                                 \
    if (a->k != b->k) {                                                                            \
        moe_err_set(err, MOE_ERR_INPUT, path,                                                      \
                    "checkpoint has model." #k "=%lld but the config says %lld", (long long)a->k,  \
                    (long long)b->k);                                                              \
        goto mismatch;                                                                             \
    }
#define DBL_KEY(k)                                                                                 \
    if (a->k != b->k) {                                                                            \
        moe_err_set(err, MOE_ERR_INPUT, path,                                                      \
                    "checkpoint has model." #k "=%.17g but the config says %.17g", a->k, b->k);    \
        goto mismatch;                                                                             \
    }
    /* clang-format off: one key per line reads best */
    INT_KEY(vocab_size)
    INT_KEY(hidden_size)
    INT_KEY(intermediate_size)
    INT_KEY(num_hidden_layers)
    INT_KEY(num_attention_heads)
    INT_KEY(num_key_value_heads)
    INT_KEY(num_local_experts)
    INT_KEY(num_experts_per_tok)
    INT_KEY(max_position_embeddings)
    INT_KEY(tie_word_embeddings)
    DBL_KEY(rope_theta)
    DBL_KEY(rms_norm_eps)
    DBL_KEY(router_aux_loss_coef)
    DBL_KEY(router_z_loss_coef)
    /* clang-format on */
    return MOE_OK;
#undef INT_KEY
#undef DBL_KEY
mismatch:
    moe_err_hint(err, "%s",
                 hint ? hint
                      : "resume with the config the checkpoint was trained with (its "
                        "config.yaml), or start a new run directory");
    return MOE_ERR_INPUT;
}

/* Reads one slot (weights or a moment) of every parameter into host [n_elems]. */
static moe_status read_params(const moe_ckpt *ck, const moe_model *model, moe_ckpt_slot slot,
                              float *host, moe_err *err) {
    for (int i = 0; i < model->table.n_params; i++) {
        const moe_param *p = &model->table.params[i];
        moe_status st =
            moe_ckpt_read_tensor(ck, p->name, slot, p->ndim, p->shape, host + p->offset, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* Opens ckpt_dir with flags and checks it against the run: model config, tokenizer. */
static moe_status open_checked(moe_ckpt *ck, const char *ckpt_dir, unsigned flags,
                               const moe_config *cfg, uint64_t vocab_hash, moe_err *err) {
    moe_status st = moe_ckpt_open(ck, ckpt_dir, flags, err);
    if (st != MOE_OK) return st;
    char path[MOE_CKPT_PATH_MAX + 24];
    snprintf(path, sizeof path, "%s/config.yaml", ck->dir);
    st = check_model_config(path, &ck->cfg.model, &cfg->model, NULL, err);
    if (st == MOE_OK && vocab_hash && ck->tok->vocab_hash != vocab_hash) {
        snprintf(path, sizeof path, "%s/tokenizer.json", ck->dir);
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "the checkpoint was trained with another tokenizer (%s, vocabulary hash "
                    "%016" PRIx64 ") than the data's (hash %016" PRIx64 ")",
                    ck->tok->name, ck->tok->vocab_hash, vocab_hash);
        moe_err_hint(err, "tokenize the data with the checkpoint's tokenizer.json spec");
        st = MOE_ERR_INPUT;
    }
    if (st != MOE_OK) moe_ckpt_close(ck);
    return st;
}

moe_status moe_train_load_checkpoint(const char *ckpt_dir, const moe_config *cfg,
                                     uint64_t vocab_hash, moe_model *model, moe_buf m, moe_buf v,
                                     moe_trainer_state *ts, moe_err *err) {
    memset(ts, 0, sizeof *ts);
    /* Whatever the layout (single file or expert-parallel shards): the run's config wins,
     * the checkpoint's parallel.ep only says how its tensors are stored. */
    moe_ckpt ck;
    moe_status st = open_checked(&ck, ckpt_dir, MOE_CKPT_OPTIMIZER | MOE_CKPT_TRAINER_STATE, cfg,
                                 vocab_hash, err);
    if (st != MOE_OK) return st;
    const moe_backend *be = model->be;
    int64_t n = model->table.n_elems;
    float *host = malloc(n ? (size_t)n * sizeof(float) : 1);
    uint16_t *stage = NULL;
    if (!host) st = moe_err_set(err, MOE_ERR_RUNTIME, ckpt_dir, "out of memory");
    if (st == MOE_OK) st = moments_stage(m.dt, v.dt, n, &stage, ckpt_dir, err);
    if (st == MOE_OK && ck.weights_only)
        moe_log_info("%s holds weights only (an import): AdamW moments start at zero", ckpt_dir);
    else if (st == MOE_OK && ck.cfg.optim.moments != m.dt) /* the config it was trained with */
        moe_log_info("%s: AdamW moments were kept in %s there, in %s here (optim.moments): %s",
                     ckpt_dir, moe_moments_name(ck.cfg.optim.moments), moe_moments_name(m.dt),
                     m.dt == MOE_DTYPE_BF16 ? "rounded to bf16 once" : "widened exactly");
    if (st == MOE_OK) st = read_params(&ck, model, MOE_CKPT_WEIGHT, host, err);
    if (st == MOE_OK) moe_model_copy_params_from_host(model, host);
    if (st == MOE_OK) st = read_params(&ck, model, MOE_CKPT_EXP_AVG, host, err);
    if (st == MOE_OK) st = moments_from_host(be, m, host, n, stage, err);
    if (st == MOE_OK) st = read_params(&ck, model, MOE_CKPT_EXP_AVG_SQ, host, err);
    if (st == MOE_OK) st = moments_from_host(be, v, host, n, stage, err);
    free(host);
    free(stage);
    if (st == MOE_OK) { /* the state's metrics text moves to *ts */
        *ts = ck.state;
        ck.state.last_metrics = NULL;
    }
    moe_ckpt_close(&ck);
    return st;
}

moe_status moe_train_load_weights(const char *ckpt_dir, const moe_config *cfg, uint64_t vocab_hash,
                                  moe_model *model, char *used, size_t n, moe_err *err) {
    moe_ckpt ck;
    moe_status st = open_checked(&ck, ckpt_dir, MOE_CKPT_SKIP_OPTIMIZER_CRC, cfg, vocab_hash, err);
    if (st != MOE_OK) return st;
    float *host = malloc((size_t)(model->table.n_elems ? model->table.n_elems : 1) * sizeof(float));
    if (!host) st = moe_err_set(err, MOE_ERR_RUNTIME, ckpt_dir, "out of memory");
    if (st == MOE_OK) st = read_params(&ck, model, MOE_CKPT_WEIGHT, host, err);
    if (st == MOE_OK) moe_model_copy_params_from_host(model, host);
    if (st == MOE_OK) snprintf(used, n, "%s", ck.dir);
    free(host);
    moe_ckpt_close(&ck);
    return st;
}

moe_status moe_train_init_config(moe_config *cfg, const char *init, int n_overrides,
                                 char *const *overrides, moe_err *err) {
    moe_ckpt ck;
    moe_status st = moe_ckpt_open(&ck, init, MOE_CKPT_SKIP_OPTIMIZER_CRC, err);
    if (st != MOE_OK) return st;
    char path[MOE_CKPT_PATH_MAX + 24], key[256];
    snprintf(path, sizeof path, "%s/config.yaml", ck.dir);
    for (int i = 0; st == MOE_OK && i < n_overrides; i++) {
        const char *eq = strchr(overrides[i], '=');
        if (strncmp(overrides[i], "model.", 6) != 0 || !eq || eq - overrides[i] >= (int)sizeof key)
            continue;
        snprintf(key, sizeof key, "%.*s", (int)(eq - overrides[i]), overrides[i]);
        moe_config probe = ck.cfg; /* the checkpoint's model with the override applied */
        st = moe_config_set(&probe, key, eq + 1, err);
        if (st == MOE_OK)
            st = check_model_config(path, &ck.cfg.model, &probe.model,
                                    "--init takes model.* from the checkpoint: drop the "
                                    "override (or train a new model without --init)",
                                    err);
    }
    if (st == MOE_OK) {
        cfg->model = ck.cfg.model;
        st = moe_config_validate(cfg, err);
        if (st != MOE_OK) moe_err_prefix(err, "with the model of %s", ck.dir);
    }
    moe_ckpt_close(&ck);
    return st;
}

moe_status moe_train_write_provenance(const char *run_dir, const char *command, int64_t step,
                                      moe_err *err) {
    char path[MOE_CKPT_PATH_MAX + 32], now[32], from[64] = "";
    snprintf(path, sizeof path, "%s/provenance.txt", run_dir);
    moe_time_iso8601(now, sizeof now);
    if (step > 0) {
        char name[32];
        moe_ckpt_dir_name(step, name, sizeof name);
        snprintf(from, sizeof from, " resuming %s", name);
    }
    FILE *fp = fopen(path, "a");
    if (!fp) return moe_err_errno(err, path, "cannot write in the run directory");
    int bad =
        fprintf(fp, "@PG\tID:moe-train\tPN:moe-train\tVN:%s%s%s\tDS:%s start step %" PRId64 "%s\n",
                moe_version(), command ? "\tCL:" : "", command ? command : "", now, step, from) < 0;
    if (fclose(fp) != 0 || bad) return moe_err_errno(err, path, "cannot write");
    return MOE_OK;
}
