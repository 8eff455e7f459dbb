/* train_ckpt: what goes into a training checkpoint and how it comes back (moe/train.h).
 *
 *   config.yaml                  resolved config (moe_config_write_yaml)
 *   tokenizer.json               the data's tokenizer spec
 *   model.safetensors            fp32 master weights, Hugging Face names, metadata format=pt
 *   optimizer-rank0.safetensors  <param>.exp_avg and <param>.exp_avg_sq (fp32)
 *   trainer_state.json           step, tokens, data position, seed, last metrics
 *
 * Training writes this single-file layout (ep = 1); loading goes through moe/ckpt_tensors.h
 * and so also takes an expert-parallel checkpoint (moe-convert reshard --ep N): the run's
 * config wins, the checkpoint's parallel.ep only says how its tensors are stored.
 * Loading refuses anything that does not fit the current run: a MANIFEST mismatch, another
 * model shape, another tokenizer, a missing or misshapen tensor - each naming the file. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moe/checkpoint.h"
#include "moe/ckpt_tensors.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/safetensors.h"
#include "moe/tokenizer.h"
#include "moe/train.h"

#define STATE_FORMAT "moe-genomics trainer state"
#define STATE_VERSION 1

/* Writes the tensors of the parameter table with data from host ([n_elems]), each name
 * followed by suffix ("" for weights). */
static moe_status write_params(const char *path, const moe_model *model, const float *host,
                               const char *suffix, const char *suffix2, const float *host2,
                               int64_t step, moe_err *err) {
    moe_st_writer w;
    moe_st_writer_init(&w);
    moe_status st = moe_st_writer_meta(&w, "format", "pt", err);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64, step);
    if (st == MOE_OK) st = moe_st_writer_meta(&w, "step", buf, err);
    for (int i = 0; st == MOE_OK && i < model->n_params; i++) {
        const moe_param *p = &model->params[i];
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

static char *state_json(const moe_trainer_state *ts) {
    json_t *o = json_object(), *data = json_object(), *rng = json_object();
    json_object_set_new(o, "format", json_string(STATE_FORMAT));
    json_object_set_new(o, "version", json_integer(STATE_VERSION));
    json_object_set_new(o, "step", json_integer(ts->step));
    json_object_set_new(o, "tokens_seen", json_integer(ts->tokens_seen));
    json_object_set_new(data, "epoch", json_integer(ts->data_epoch));
    json_object_set_new(data, "index", json_integer(ts->data_index));
    json_object_set_new(data, "shuffle", json_boolean(ts->data_shuffle));
    json_object_set_new(data, "samples_per_epoch", json_integer(ts->data_samples));
    json_object_set_new(data, "stream_tokens", json_integer(ts->data_stream_tokens));
    json_object_set_new(o, "data", data);
    /* All randomness is counter-based (Philox keyed by the seed): the seed is the state. */
    json_object_set_new(rng, "algorithm", json_string("philox4x32-10"));
    json_object_set_new(rng, "seed", json_integer((json_int_t)ts->seed));
    json_object_set_new(o, "rng", rng);
    json_t *met = ts->last_metrics ? json_loads(ts->last_metrics, 0, NULL) : NULL;
    json_object_set_new(o, "last_metrics", met ? met : json_null());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

moe_status moe_train_save_checkpoint(const char *run_dir, int64_t keep, const moe_config *cfg,
                                     const char *tokenizer_json, const moe_model *model,
                                     const float *m, const float *v, const moe_trainer_state *ts,
                                     moe_err *err) {
    moe_ckpt_writer w;
    moe_status st = moe_ckpt_begin(&w, run_dir, ts->step, err);
    if (st != MOE_OK) return st;
    const moe_backend *be = model->be;
    size_t bytes = (size_t)model->n_elems * sizeof(float);
    float *host = malloc(bytes ? bytes : 1), *host2 = malloc(bytes ? bytes : 1);
    char path[MOE_CKPT_PATH_MAX], *text = NULL;
    if (!host || !host2) st = moe_err_set(err, MOE_ERR_RUNTIME, run_dir, "out of memory");

    if (st == MOE_OK) {
        moe_outfile out;
        st = moe_outfile_open(&out, moe_ckpt_path(&w, "config.yaml", path, sizeof path), err);
        if (st == MOE_OK) {
            st = moe_config_write_yaml(cfg, out.fp, err);
            if (st == MOE_OK)
                st = moe_outfile_commit(&out, err);
            else
                moe_outfile_abort(&out);
        }
    }
    if (st == MOE_OK)
        st = moe_write_text_file(moe_ckpt_path(&w, "tokenizer.json", path, sizeof path),
                                 tokenizer_json, NULL, err);
    if (st == MOE_OK) {
        moe_model_copy_params_to_host(model, host);
        st = write_params(moe_ckpt_path(&w, "model.safetensors", path, sizeof path), model, host,
                          "", NULL, NULL, ts->step, err);
    }
    if (st == MOE_OK) {
        be->memcpy_d2h(be, host, m, bytes);
        be->memcpy_d2h(be, host2, v, bytes);
        st = write_params(moe_ckpt_path(&w, "optimizer-rank0.safetensors", path, sizeof path),
                          model, host, ".exp_avg", ".exp_avg_sq", host2, ts->step, err);
    }
    if (st == MOE_OK) {
        text = state_json(ts);
        if (!text) st = moe_err_set(err, MOE_ERR_RUNTIME, run_dir, "cannot encode trainer state");
    }
    if (st == MOE_OK)
        st = moe_write_text_file(moe_ckpt_path(&w, "trainer_state.json", path, sizeof path), text,
                                 NULL, err);
    free(text);
    free(host);
    free(host2);
    if (st != MOE_OK) {
        moe_ckpt_abort(&w);
        return st;
    }
    return moe_ckpt_commit(&w, keep, err);
}

/* ---- loading ---- */

static int join_path(char *out, size_t n, const char *dir, const char *name) {
    return snprintf(out, n, "%s/%s", dir, name) < (int)n;
}

/* The checkpoint's model config must equal the run's: names the first differing key. */
static moe_status check_model_config(const char *path, const moe_model_config *a,
                                     const moe_model_config *b, moe_err *err) {
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
    moe_err_hint(err, "resume with the config the checkpoint was trained with (its "
                      "config.yaml), or start a new run directory");
    return MOE_ERR_INPUT;
}

/* Reads one slot (weights or a moment) of every parameter into host [n_elems]. */
static moe_status read_params(const moe_ckpt_tensors *ct, const moe_model *model,
                              moe_ckpt_slot slot, float *host, moe_err *err) {
    for (int i = 0; i < model->n_params; i++) {
        const moe_param *p = &model->params[i];
        moe_status st =
            moe_ckpt_tensors_read(ct, p->name, slot, p->ndim, p->shape, host + p->offset, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static moe_status bad_state(moe_err *err, const char *path, const char *what) {
    moe_err_set(err, MOE_ERR_INPUT, path, "invalid trainer state: %s", what);
    moe_err_hint(err, "the checkpoint is damaged; resume from an older checkpoint");
    return MOE_ERR_INPUT;
}

static int get_i64(json_t *o, const char *key, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return 0;
    *out = json_integer_value(v);
    return 1;
}

static moe_status load_state(const char *path, moe_trainer_state *ts, moe_err *err) {
    json_error_t jerr;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        char what[256];
        snprintf(what, sizeof what, "%s (line %d)", jerr.text, jerr.line);
        return bad_state(err, path, what);
    }
    moe_status st = MOE_OK;
    json_t *fmt = json_object_get(o, "format"), *data = json_object_get(o, "data"),
           *rng = json_object_get(o, "rng");
    int64_t version = 0, seed = 0;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), STATE_FORMAT) != 0 ||
        !get_i64(o, "version", &version))
        st = bad_state(err, path, "not a moe-genomics trainer_state.json");
    else if (version != STATE_VERSION)
        st = bad_state(err, path, "unsupported version (written by another moe-train)");
    else if (!get_i64(o, "step", &ts->step) || !get_i64(o, "tokens_seen", &ts->tokens_seen) ||
             !json_is_object(data) || !get_i64(data, "epoch", &ts->data_epoch) ||
             !get_i64(data, "index", &ts->data_index) ||
             !get_i64(data, "samples_per_epoch", &ts->data_samples) ||
             !get_i64(data, "stream_tokens", &ts->data_stream_tokens) ||
             !json_is_boolean(json_object_get(data, "shuffle")) || !json_is_object(rng) ||
             !get_i64(rng, "seed", &seed) || ts->step < 0 || ts->data_epoch < 0 ||
             ts->data_index < 0)
        st = bad_state(err, path, "missing or invalid step, tokens_seen, data or rng fields");
    if (st == MOE_OK) {
        ts->seed = (uint64_t)seed;
        ts->data_shuffle = json_is_true(json_object_get(data, "shuffle"));
        json_t *met = json_object_get(o, "last_metrics");
        ts->last_metrics =
            json_is_object(met) ? json_dumps(met, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    }
    json_decref(o);
    return st;
}

moe_status moe_train_load_checkpoint(const char *ckpt_dir, const moe_config *cfg,
                                     uint64_t vocab_hash, moe_model *model, float *m, float *v,
                                     moe_trainer_state *ts, moe_err *err) {
    memset(ts, 0, sizeof *ts);
    moe_status st = moe_ckpt_verify(ckpt_dir, err);
    if (st != MOE_OK) return st;
    char path[MOE_CKPT_PATH_MAX];

    moe_config ck;
    if (!join_path(path, sizeof path, ckpt_dir, "config.yaml"))
        return moe_err_set(err, MOE_ERR_INPUT, ckpt_dir, "path too long");
    st = moe_config_load(&ck, path, 0, NULL, err);
    if (st == MOE_OK) st = check_model_config(path, &ck.model, &cfg->model, err);
    if (st != MOE_OK) return st;

    if (vocab_hash) {
        join_path(path, sizeof path, ckpt_dir, "tokenizer.json");
        char *json;
        size_t len;
        st = moe_read_file(path, &json, &len, err);
        if (st != MOE_OK) return st;
        moe_tokenizer *tok = NULL;
        st = moe_tokenizer_from_json(&tok, json, path, err);
        free(json);
        if (st == MOE_OK && tok->vocab_hash != vocab_hash) {
            moe_err_set(err, MOE_ERR_INPUT, path,
                        "the checkpoint was trained with another tokenizer (%s, vocabulary hash "
                        "%016" PRIx64 ") than the data's (hash %016" PRIx64 ")",
                        tok->name, tok->vocab_hash, vocab_hash);
            moe_err_hint(err, "tokenize the data with the checkpoint's tokenizer.json spec");
            st = MOE_ERR_INPUT;
        }
        moe_tokenizer_free(tok);
        if (st != MOE_OK) return st;
    }

    const moe_backend *be = model->be;
    size_t bytes = (size_t)model->n_elems * sizeof(float);
    float *host = malloc(bytes ? bytes : 1);
    if (!host) return moe_err_set(err, MOE_ERR_RUNTIME, ckpt_dir, "out of memory");
    /* Whatever the layout (single file or expert-parallel shards): the run's config wins,
     * the checkpoint's parallel.ep only says how its tensors are stored. */
    moe_ckpt_tensors ct;
    st = moe_ckpt_tensors_open(&ct, ckpt_dir, &ck, 1, err);
    if (st == MOE_OK && ct.weights_only)
        moe_log_info("%s holds weights only (an import): AdamW moments start at zero", ckpt_dir);
    if (st == MOE_OK) {
        st = read_params(&ct, model, MOE_CKPT_WEIGHT, host, err);
        if (st == MOE_OK) moe_model_copy_params_from_host(model, host);
        if (st == MOE_OK) st = read_params(&ct, model, MOE_CKPT_EXP_AVG, host, err);
        if (st == MOE_OK) be->memcpy_h2d(be, m, host, bytes);
        if (st == MOE_OK) st = read_params(&ct, model, MOE_CKPT_EXP_AVG_SQ, host, err);
        if (st == MOE_OK) be->memcpy_h2d(be, v, host, bytes);
        moe_ckpt_tensors_close(&ct);
    }
    free(host);
    if (st != MOE_OK) return st;
    join_path(path, sizeof path, ckpt_dir, "trainer_state.json");
    return load_state(path, ts, err);
}
