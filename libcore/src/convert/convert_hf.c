/* convert_hf: moe-convert from-hf - a Hugging Face Mixtral directory as a checkpoint.
 *
 * Reads config.json (must be Mixtral: model_type "mixtral" or a Mixtral architecture;
 * SiLU experts; head_dim = hidden_size / num_attention_heads), the weights from
 * model.safetensors or the shards named by model.safetensors.index.json (each file fully
 * validated by the strict reader before use), in either expert layout:
 *   per expert   model.layers.{l}.block_sparse_moe.experts.{j}.w1|w2|w3.weight
 *   fused        model.layers.{l}.block_sparse_moe.experts.gate_up_proj  [E, 2F, C]
 *                (rows [0, F) of expert j are w1 = gate, rows [F, 2F) are w3 = up, as
 *                transformers' MixtralExperts chunks them) and experts.down_proj [E, C, F]
 *                (= w2); `mlp.` is accepted in place of `block_sparse_moe.`.
 * Writes CKPT_DIR as a checkpoint (moe/ckpt.h mechanics: temporary directory, MANIFEST,
 * rename) at step 0 with fp32 weights of every tensor of the parameter table
 * (moe/model_params.h) and no optimizer file (weights only: the Adam moments start at
 * zero). The one thing to
 * know: the moe tokenizer comes from HF_DIR/moe_tokenizer.json (written by to-hf) or
 * --tokenizer, and must have exactly model.vocab_size tokens, so that moe-train and
 * moe-embed accept the result. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/ckpt.h"
#include "moe/convert.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/tokenizer.h"

typedef struct hf_src {
    int n_files;
    moe_st_file *files;
} hf_src;

static int file_exists(const char *dir, const char *name, char *path, size_t n) {
    struct stat sb;
    snprintf(path, n, "%s/%s", dir, name);
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- config.json ---- */

static moe_status cfg_int(json_t *o, const char *path, const char *key, int64_t dflt, int64_t *out,
                          moe_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0) {
            moe_err_set(err, MOE_ERR_INPUT, path, "config.json lacks \"%s\"", key);
            moe_err_hint(err, "a Mixtral config.json written by transformers has every key");
            return MOE_ERR_INPUT;
        }
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return moe_err_set(err, MOE_ERR_INPUT, path, "\"%s\" must be a non-negative integer", key);
    *out = json_integer_value(v);
    return MOE_OK;
}

static moe_status cfg_real(json_t *o, const char *path, const char *key, double dflt, double *out,
                           moe_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_number(v))
        return moe_err_set(err, MOE_ERR_INPUT, path, "\"%s\" must be a number", key);
    *out = json_number_value(v);
    return MOE_OK;
}

static moe_status read_hf_config(const char *hf_dir, moe_config *cfg, moe_err *err) {
    char path[4400], ypath[4400];
    if (!file_exists(hf_dir, "config.json", path, sizeof path)) {
        moe_err_set(err, MOE_ERR_INPUT, path, "no config.json: not a Hugging Face model directory");
        return MOE_ERR_INPUT;
    }
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        moe_err_set(err, MOE_ERR_INPUT, path, "invalid JSON: %s", o ? "not an object" : je.text);
        if (!o) moe_err_at_line(err, je.line, je.column);
        json_decref(o);
        return MOE_ERR_INPUT;
    }
    moe_status st = MOE_OK;
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    int mixtral = mt && strcmp(mt, "mixtral") == 0;
    json_t *arch = json_object_get(o, "architectures"); /* asked only without a model_type */
    for (size_t i = 0; !mt && json_is_array(arch) && i < json_array_size(arch) && !mixtral; i++) {
        const char *a = json_string_value(json_array_get(arch, i));
        mixtral = a && strncmp(a, "Mixtral", 7) == 0;
    }
    if (!mixtral) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "config.json describes a '%s' model, not Mixtral (model_type \"mixtral\")",
                    mt ? mt : "unknown");
        moe_err_hint(err, "moe-convert from-hf imports MixtralForCausalLM checkpoints only");
        json_decref(o);
        return MOE_ERR_INPUT;
    }
    const char *act = json_string_value(json_object_get(o, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) {
        moe_err_set(err, MOE_ERR_INPUT, path, "hidden_act is \"%s\"; moe models use silu", act);
        json_decref(o);
        return MOE_ERR_INPUT;
    }
    if (file_exists(hf_dir, "moe_config.yaml", ypath, sizeof ypath))
        st = moe_config_load(cfg, ypath, 0, NULL, err);
    else
        moe_config_defaults(cfg);
    cfg->parallel.ep = 1; /* from-hf writes the single-file layout (moe/ckpt.h) */
    moe_model_config *m = &cfg->model;
    int64_t tie = 0, hd = 0;
    if (st == MOE_OK) st = cfg_int(o, path, "vocab_size", -1, &m->vocab_size, err);
    if (st == MOE_OK) st = cfg_int(o, path, "hidden_size", -1, &m->hidden_size, err);
    if (st == MOE_OK) st = cfg_int(o, path, "intermediate_size", -1, &m->intermediate_size, err);
    if (st == MOE_OK) st = cfg_int(o, path, "num_hidden_layers", -1, &m->num_hidden_layers, err);
    if (st == MOE_OK)
        st = cfg_int(o, path, "num_attention_heads", -1, &m->num_attention_heads, err);
    if (st == MOE_OK)
        st = cfg_int(o, path, "num_key_value_heads", m->num_attention_heads,
                     &m->num_key_value_heads, err);
    if (st == MOE_OK) st = cfg_int(o, path, "num_local_experts", -1, &m->num_local_experts, err);
    if (st == MOE_OK)
        st = cfg_int(o, path, "num_experts_per_tok", -1, &m->num_experts_per_tok, err);
    if (st == MOE_OK)
        st = cfg_int(o, path, "max_position_embeddings", 131072, &m->max_position_embeddings, err);
    if (st == MOE_OK) st = cfg_real(o, path, "rope_theta", 1e6, &m->rope_theta, err);
    if (st == MOE_OK) st = cfg_real(o, path, "rms_norm_eps", 1e-5, &m->rms_norm_eps, err);
    if (st == MOE_OK)
        st = cfg_real(o, path, "router_aux_loss_coef", 0.001, &m->router_aux_loss_coef, err);
    if (st == MOE_OK) st = cfg_real(o, path, "initializer_range", 0.02, &m->initializer_range, err);
    json_t *tw = json_object_get(o, "tie_word_embeddings");
    if (json_is_boolean(tw)) tie = json_is_true(tw);
    m->tie_word_embeddings = tie != 0;
    if (st == MOE_OK) st = cfg_int(o, path, "head_dim", 0, &hd, err);
    if (st == MOE_OK && m->num_attention_heads > 0 && hd &&
        hd * m->num_attention_heads != m->hidden_size) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "head_dim %" PRId64 " x num_attention_heads %" PRId64
                    " != hidden_size %" PRId64,
                    hd, m->num_attention_heads, m->hidden_size);
        moe_err_hint(err, "moe models use head_dim = hidden_size / num_attention_heads");
        st = MOE_ERR_INPUT;
    }
    json_t *sw = json_object_get(o, "sliding_window");
    if (st == MOE_OK && json_is_integer(sw) && json_integer_value(sw) < m->max_position_embeddings)
        moe_log_warn("%s: sliding_window %" JSON_INTEGER_FORMAT " is ignored: moe attends to the "
                     "whole context (results differ beyond that many tokens)",
                     path, json_integer_value(sw));
    json_decref(o);
    if (st == MOE_OK && cfg->train.seq_len > m->max_position_embeddings)
        cfg->train.seq_len = m->max_position_embeddings;
    if (st == MOE_OK) st = moe_config_validate(cfg, err);
    if (st != MOE_OK && !err->file[0]) snprintf(err->file, sizeof err->file, "%.500s", path);
    return st;
}

/* ---- tokenizer ---- */

static moe_status read_tokenizer(const char *hf_dir, const moe_convert_opts *o, int64_t vocab,
                                 moe_tokenizer **tok, moe_err *err) {
    char path[4400];
    const char *src = NULL;
    moe_status st;
    int kind = o->tokenizer ? moe_tokenizer_kind_parse(o->tokenizer) : -1;
    if (file_exists(hf_dir, "moe_tokenizer.json", path, sizeof path) && !o->tokenizer) {
        src = path;
    } else if (kind > 0) {
        moe_tokenizer_opts to;
        moe_tokenizer_opts_defaults(&to, (moe_tokenizer_kind)kind);
        st = moe_tokenizer_create(tok, &to, err);
        if (st != MOE_OK) return st;
        src = o->tokenizer;
    } else if (o->tokenizer) {
        src = o->tokenizer;
    } else {
        moe_err_set(err, MOE_ERR_INPUT, hf_dir, "no moe_tokenizer.json and no --tokenizer");
        moe_err_hint(err, "pass --tokenizer byte|nuc|kmer or the tokenizer.json of a moe "
                          "checkpoint or shard spec");
        return MOE_ERR_INPUT;
    }
    if (!*tok) {
        char *json;
        size_t len;
        st = moe_read_file(src, &json, &len, err);
        if (st != MOE_OK) return st;
        st = moe_tokenizer_from_json(tok, json, src, err);
        free(json);
        if (st != MOE_OK) return st;
    }
    if ((*tok)->vocab_size != vocab) {
        moe_err_set(err, MOE_ERR_INPUT, src,
                    "tokenizer '%s' has %" PRId64 " tokens but the model's vocab_size is %" PRId64,
                    (*tok)->name, (*tok)->vocab_size, vocab);
        moe_err_hint(err, "this model was trained with another tokenizer: pass the matching "
                          "spec with --tokenizer");
        moe_tokenizer_free(*tok);
        *tok = NULL;
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

/* ---- weights ---- */

static void src_close(hf_src *s) {
    for (int i = 0; i < s->n_files; i++)
        moe_st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

static moe_status src_open(hf_src *s, const char *hf_dir, moe_err *err) {
    memset(s, 0, sizeof *s);
    char path[4400];
    const char *names[1];
    char **list = NULL;
    int n = 0;
    moe_status st = MOE_OK;
    json_t *idx = NULL;
    if (file_exists(hf_dir, "model.safetensors.index.json", path, sizeof path)) {
        json_error_t je;
        idx = json_load_file(path, 0, &je);
        json_t *map = idx ? json_object_get(idx, "weight_map") : NULL;
        if (!json_is_object(map)) {
            moe_err_set(err, MOE_ERR_INPUT, path, "not a safetensors index (no weight_map object)");
            json_decref(idx);
            return MOE_ERR_INPUT;
        }
        list = calloc(json_object_size(map) + 1, sizeof *list);
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            const char *f = json_string_value(v);
            if (!f || strchr(f, '/')) {
                moe_err_set(err, MOE_ERR_INPUT, path, "weight_map entry of '%s' is not a file name",
                            key);
                st = MOE_ERR_INPUT;
                break;
            }
            int seen = 0;
            for (int i = 0; i < n && !seen; i++)
                seen = strcmp(list[i], f) == 0;
            if (!seen) list[n++] = (char *)f;
        }
    } else if (file_exists(hf_dir, "model.safetensors", path, sizeof path)) {
        names[0] = "model.safetensors";
        list = (char **)names;
        n = 1;
    } else {
        moe_err_set(err, MOE_ERR_INPUT, hf_dir,
                    "no model.safetensors or model.safetensors.index.json");
        moe_err_hint(err, "PyTorch .bin checkpoints are not read: re-save with "
                          "save_pretrained(..., safe_serialization=True)");
        return MOE_ERR_INPUT;
    }
    s->files = calloc((size_t)(n ? n : 1), sizeof *s->files);
    if (!s->files) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int i = 0; st == MOE_OK && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", hf_dir, list[i]);
        st = moe_st_open(&s->files[i], path, err);
        if (st == MOE_OK) s->n_files++;
    }
    if (idx) free(list);
    json_decref(idx);
    if (st != MOE_OK) src_close(s);
    return st;
}

/* The tensor `name` in any file (also under `mlp.` for `block_sparse_moe.`). */
static const moe_st_tensor *src_find(const hf_src *s, const char *name, const moe_st_file **file) {
    char alt[160];
    const char *p = strstr(name, "block_sparse_moe.");
    if (p) snprintf(alt, sizeof alt, "%.*smlp.%s", (int)(p - name), name, p + 17);
    for (int k = 0; k < (p ? 2 : 1); k++)
        for (int i = 0; i < s->n_files; i++) {
            const moe_st_tensor *t = moe_st_find(&s->files[i], k ? alt : name);
            if (t) {
                *file = &s->files[i];
                return t;
            }
        }
    return NULL;
}

typedef struct fused_cache {
    char name[160];
    float *data; /* [E, rows, cols] */
} fused_cache;

static moe_status bad_shape(moe_err *err, const moe_st_file *f, const moe_st_tensor *t,
                            const char *want) {
    moe_err_set(err, MOE_ERR_INPUT, f->path,
                "tensor '%s' has %d dims [%" PRId64 ", ...], "
                "expected %s",
                t->name, t->ndim, t->shape[0], want);
    return MOE_ERR_INPUT;
}

/* Expert tensor ct from a fused layer tensor (cached: one gate_up and one down at a time). */
static moe_status read_fused(const hf_src *s, const moe_model_config *c, const moe_param *ct,
                             fused_cache *cache, float *out, moe_err *err) {
    int64_t E = c->num_local_experts, F = c->intermediate_size, C = c->hidden_size;
    int down = ct->kind == MOE_PARAM_W2;
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%s", ct->layer,
             down ? "down_proj" : "gate_up_proj");
    fused_cache *fc = &cache[down];
    if (strcmp(fc->name, name) != 0) {
        const moe_st_file *f;
        const moe_st_tensor *t = src_find(s, name, &f);
        if (!t) {
            moe_err_set(err, MOE_ERR_INPUT, s->files[0].path,
                        "missing tensor '%s' (neither the per-expert nor the fused layout)",
                        ct->name);
            moe_err_hint(err, "the checkpoint is incomplete or not a Mixtral model");
            return MOE_ERR_INPUT;
        }
        int64_t r = down ? C : 2 * F, q = down ? F : C;
        if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != r || t->shape[2] != q) {
            char want[96];
            snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 ", %" PRId64 "]", E, r, q);
            return bad_shape(err, f, t, want);
        }
        float *d = realloc(fc->data, (size_t)t->numel * sizeof(float));
        if (!d) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        fc->data = d;
        fc->name[0] = 0;
        moe_status st = moe_st_read_f32(f, t, d, err);
        if (st != MOE_OK) return st;
        snprintf(fc->name, sizeof fc->name, "%s", name);
    }
    int64_t n = ct->shape[0] * ct->shape[1];
    const float *base = fc->data + (int64_t)ct->expert * (down ? C * F : 2 * F * C);
    if (ct->kind == MOE_PARAM_W3) base += F * C;
    memcpy(out, base, (size_t)n * sizeof(float));
    return MOE_OK;
}

static moe_status read_weights(const hf_src *s, const moe_model_config *c, const moe_param *tab,
                               int n, float **bufs, moe_err *err) {
    fused_cache cache[2];
    memset(cache, 0, sizeof cache);
    moe_status st = MOE_OK;
    for (int i = 0; st == MOE_OK && i < n; i++) {
        const moe_param *ct = &tab[i];
        bufs[i] = malloc((size_t)ct->numel * sizeof(float));
        if (!bufs[i]) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
            break;
        }
        const moe_st_file *f;
        const moe_st_tensor *t = src_find(s, ct->name, &f);
        if (!t && ct->kind != MOE_PARAM_DENSE) {
            st = read_fused(s, c, ct, cache, bufs[i], err);
            continue;
        }
        if (!t) {
            moe_err_set(err, MOE_ERR_INPUT, s->files[0].path, "missing tensor '%s'", ct->name);
            moe_err_hint(err, "the checkpoint is incomplete, or its config.json does not "
                              "describe it (num_hidden_layers, tie_word_embeddings)");
            st = MOE_ERR_INPUT;
            break;
        }
        const moe_st_tensor *chk;
        st = moe_st_expect(f, t->name, ct->ndim, ct->shape, &chk, err);
        if (st == MOE_OK) st = moe_st_read_f32(f, t, bufs[i], err);
    }
    free(cache[0].data);
    free(cache[1].data);
    return st;
}

/* ---- the checkpoint ---- */

static const char STATE_JSON[] =
    "{\n  \"format\": \"moe-genomics trainer state\",\n  \"version\": 1,\n  \"step\": 0,\n"
    "  \"tokens_seen\": 0,\n  \"data\": {\"epoch\": 0, \"index\": 0, \"shuffle\": %s, "
    "\"samples_per_epoch\": 0, \"stream_tokens\": 0},\n  \"rng\": {\"algorithm\": "
    "\"philox4x32-10\", \"seed\": %" PRId64 "},\n  \"last_metrics\": null,\n"
    "  \"imported_from\": \"Hugging Face (moe-convert from-hf)\"\n}\n";

static moe_status write_ckpt(const char *run, const moe_config *cfg, const moe_tokenizer *tok,
                             const moe_param *tab, int n, float **bufs, moe_err *err) {
    moe_ckpt_writer w;
    moe_status st = moe_ckpt_begin(&w, run, 0, err);
    if (st != MOE_OK) return st;
    char path[MOE_CKPT_PATH_MAX];
    moe_outfile cf;
    memset(&cf, 0, sizeof cf);
    st = moe_outfile_open(&cf, moe_ckpt_path(&w, "config.yaml", path, sizeof path), err);
    if (st == MOE_OK) st = moe_config_write_yaml(cfg, cf.fp, err);
    if (st == MOE_OK)
        st = moe_outfile_commit(&cf, err);
    else if (cf.fp)
        moe_outfile_abort(&cf);
    if (st == MOE_OK)
        st = moe_write_text_file(moe_ckpt_path(&w, "tokenizer.json", path, sizeof path),
                                 moe_tokenizer_spec_json(tok), NULL, err);
    /* Weights only: no optimizer file; readers start the Adam moments at zero
     * (moe/ckpt.h), which is what a file of zeros twice the weights' size would say. */
    if (st == MOE_OK) {
        moe_st_writer sw;
        moe_st_writer_init(&sw);
        st = moe_st_writer_meta(&sw, "format", "pt", err);
        if (st == MOE_OK) st = moe_st_writer_meta(&sw, "step", "0", err);
        for (int i = 0; st == MOE_OK && i < n; i++)
            st = moe_st_writer_add(&sw, tab[i].name, MOE_ST_F32, tab[i].ndim, tab[i].shape, bufs[i],
                                   err);
        if (st == MOE_OK)
            st = moe_st_writer_write(&sw, moe_ckpt_path(&w, "model.safetensors", path, sizeof path),
                                     err);
        moe_st_writer_free(&sw);
    }
    if (st == MOE_OK) {
        char state[1024];
        snprintf(state, sizeof state, STATE_JSON, cfg->data.shuffle ? "true" : "false",
                 cfg->train.seed);
        st = moe_write_text_file(moe_ckpt_path(&w, "trainer_state.json", path, sizeof path), state,
                                 NULL, err);
    }
    if (st != MOE_OK) {
        moe_ckpt_abort(&w);
        return st;
    }
    return moe_ckpt_commit(&w, 0, err);
}

moe_status moe_convert_from_hf(const char *hf_dir, const char *ckpt_arg, const moe_convert_opts *o,
                               moe_err *err) {
    char ckpt_dir[MOE_CKPT_PATH_MAX - 64];
    if (moe_convert_out_dir(ckpt_arg, ckpt_dir, sizeof ckpt_dir, err) != MOE_OK)
        return MOE_ERR_INPUT;
    struct stat sb;
    if (stat(ckpt_dir, &sb) == 0) {
        moe_err_set(err, MOE_ERR_INPUT, ckpt_dir, "the output already exists");
        moe_err_hint(err, "choose a new checkpoint directory (nothing is overwritten)");
        return MOE_ERR_INPUT;
    }
    moe_config cfg;
    moe_status st = read_hf_config(hf_dir, &cfg, err);
    if (st != MOE_OK) return st;
    moe_tokenizer *tok = NULL;
    st = read_tokenizer(hf_dir, o, cfg.model.vocab_size, &tok, err);
    if (st != MOE_OK) return st;
    hf_src src;
    st = src_open(&src, hf_dir, err);
    moe_param_table table;
    memset(&table, 0, sizeof table);
    float **bufs = NULL;
    int n = 0;
    if (st == MOE_OK) {
        st = moe_param_table_build(&table, &cfg.model, 0, cfg.model.num_local_experts, err);
        n = table.n_params;
        bufs = st == MOE_OK ? calloc((size_t)n, sizeof *bufs) : NULL;
        if (st == MOE_OK && !bufs) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        if (st == MOE_OK) st = read_weights(&src, &cfg.model, table.params, n, bufs, err);
        src_close(&src);
    }
    char run[MOE_CKPT_PATH_MAX];
    snprintf(run, sizeof run, "%s.tmp.%d", ckpt_dir, (int)getpid());
    if (st == MOE_OK) st = write_ckpt(run, &cfg, tok, table.params, n, bufs, err);
    if (st == MOE_OK) {
        char made[MOE_CKPT_PATH_MAX + 32];
        snprintf(made, sizeof made, "%s/ckpt-00000000", run);
        if (rename(made, ckpt_dir) != 0)
            st = moe_err_errno(err, ckpt_dir, "cannot move the checkpoint into place");
    }
    if (stat(run, &sb) == 0) moe_remove_tree(run, NULL);
    if (st == MOE_OK)
        moe_log_info("wrote checkpoint %s: %d tensors, tokenizer %s, step 0 (weights only)",
                     ckpt_dir, n, tok->name);
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    moe_param_table_free(&table);
    moe_tokenizer_free(tok);
    return st;
}
