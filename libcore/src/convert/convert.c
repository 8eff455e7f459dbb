/* convert: moe-convert to-hf - a checkpoint as a Hugging Face Mixtral directory.
 *
 * Output (written into OUT.tmp.<pid>/ and renamed to OUT only when complete):
 *   config.json                      MixtralConfig keys + architectures + dtype/torch_dtype
 *                                    + transformers_version
 *   generation_config.json           BOS/EOS/PAD ids, as save_pretrained writes it
 *   README.md                        a model card: tokenizer, data, steps, loss, commands
 *   model.safetensors                (one shard) or model-0000i-of-0000n.safetensors +
 *   model.safetensors.index.json     {"metadata": {"total_size"}, "weight_map"}
 *   tokenizer.json, tokenizer_config.json, special_tokens_map.json
 *   moe_tokenizer.json, moe_config.yaml  the checkpoint's own, for an exact from-hf
 * Tensors go into shards in Hugging Face state_dict order (embedding, layer 0, ..., norm,
 * lm_head: moe_param_table_hf_order); a shard
 * closes before the tensor that would take it past max_shard_bytes, as transformers'
 * save_pretrained does. The one thing to know: f32 export copies the checkpoint's bytes
 * (the writer reads them straight from the mmap), so native -> HF -> native is exact. */
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
#include "moe/model.h"
#include "moe/version.h"

void moe_convert_opts_defaults(moe_convert_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_shard_bytes = 5000000000LL;
    o->dtype = MOE_ST_F32;
}

int64_t moe_convert_parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double mul = 1;
    if (!strcmp(end, "") || !strcmp(end, "B"))
        mul = 1;
    else if (!strcmp(end, "KB") || !strcmp(end, "kB"))
        mul = 1e3;
    else if (!strcmp(end, "MB"))
        mul = 1e6;
    else if (!strcmp(end, "GB"))
        mul = 1e9;
    else if (!strcmp(end, "KiB"))
        mul = 1024.0;
    else if (!strcmp(end, "MiB"))
        mul = 1024.0 * 1024;
    else if (!strcmp(end, "GiB"))
        mul = 1024.0 * 1024 * 1024;
    else
        return -1;
    double b = v * mul;
    return b >= 1 && b < 9e18 ? (int64_t)b : -1;
}

moe_status moe_convert_out_dir(const char *arg, char *out, size_t n, moe_err *err) {
    size_t len = strlen(arg);
    while (len > 1 && arg[len - 1] == '/')
        len--;
    if (len == 0 || (len == 1 && arg[0] == '/') || len + 32 > n) {
        moe_err_set(err, MOE_ERR_INPUT, arg, "not usable as an output directory");
        moe_err_hint(err, "give the path of a new directory, e.g. out/");
        return MOE_ERR_INPUT;
    }
    memcpy(out, arg, len);
    out[len] = '\0';
    return MOE_OK;
}

/* ---- config.json ---- */

/* The transformers release this export is checked against (tests/interop/hf_parity.py on an
 * H200, docs/interop.md's table): written as transformers_version, as save_pretrained does. */
#define HF_TRANSFORMERS_VERSION "5.17.0"

static json_t *hf_config_json(const moe_config *cfg, const moe_tokenizer *tok, moe_st_dtype dtype) {
    const moe_model_config *m = &cfg->model;
    json_t *o = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("MixtralForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("mixtral"));
    json_object_set_new(o, "vocab_size", json_integer(m->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(m->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(m->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(m->num_hidden_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(m->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(m->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(m->hidden_size / m->num_attention_heads));
    json_object_set_new(o, "num_local_experts", json_integer(m->num_local_experts));
    json_object_set_new(o, "num_experts_per_tok", json_integer(m->num_experts_per_tok));
    json_object_set_new(o, "max_position_embeddings", json_integer(m->max_position_embeddings));
    json_object_set_new(o, "rope_theta", json_real(m->rope_theta));
    json_object_set_new(o, "rms_norm_eps", json_real(m->rms_norm_eps));
    json_object_set_new(o, "router_aux_loss_coef", json_real(m->router_aux_loss_coef));
    json_object_set_new(o, "initializer_range", json_real(m->initializer_range));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(m->tie_word_embeddings));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "sliding_window", json_null());
    json_object_set_new(o, "router_jitter_noise", json_real(0.0));
    json_object_set_new(o, "output_router_logits", json_false());
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "bos_token_id",
                        tok->bos_id >= 0 ? json_integer(tok->bos_id) : json_null());
    json_object_set_new(o, "eos_token_id",
                        tok->eos_id >= 0 ? json_integer(tok->eos_id) : json_null());
    json_object_set_new(o, "pad_token_id",
                        tok->pad_id >= 0 ? json_integer(tok->pad_id) : json_null());
    /* transformers >= 4.56 reads "dtype"; older releases "torch_dtype": both, one value */
    const char *dt = dtype == MOE_ST_BF16 ? "bfloat16" : "float32";
    json_object_set_new(o, "dtype", json_string(dt));
    json_object_set_new(o, "torch_dtype", json_string(dt));
    json_object_set_new(o, "transformers_version", json_string(HF_TRANSFORMERS_VERSION));
    json_object_set_new(o, "moe_genomics_version", json_string(moe_version()));
    return o;
}

/* generation_config.json: the special token ids a generate() call needs (those the
 * tokenizer has), in save_pretrained's layout. */
static json_t *hf_generation_json(const moe_tokenizer *tok) {
    json_t *o = json_object();
    json_object_set_new(o, "_from_model_config", json_true());
    if (tok->bos_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(tok->bos_id));
    if (tok->eos_id >= 0) json_object_set_new(o, "eos_token_id", json_integer(tok->eos_id));
    if (tok->pad_id >= 0) json_object_set_new(o, "pad_token_id", json_integer(tok->pad_id));
    json_object_set_new(o, "transformers_version", json_string(HF_TRANSFORMERS_VERSION));
    return o;
}

static moe_status write_json(json_t *o, const char *path, moe_err *err) {
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (!text) return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot encode JSON");
    moe_status st = moe_write_text_file(path, text, "\n", err);
    free(text);
    return st;
}

/* ---- README.md: the model card ---- */

/* The CL: field of the last @PG line of the run's provenance.txt (the checkpoint's parent
 * directory) into out [n]; "" when there is none. */
static void training_command(const char *ckpt_dir, char *out, size_t n) {
    char path[4200], *text = NULL;
    size_t len;
    out[0] = 0;
    snprintf(path, sizeof path, "%s/../provenance.txt", ckpt_dir);
    if (access(path, R_OK) != 0 || moe_read_file(path, &text, &len, NULL) != MOE_OK) return;
    for (char *p = strstr(text, "\tCL:"); p; p = strstr(p + 1, "\tCL:")) {
        size_t k = strcspn(p + 4, "\t\n");
        snprintf(out, n, "%.*s", (int)k, p + 4);
    }
    free(text);
}

/* Appends "| key | value |" rows of the last step's metrics that exist to the card. */
static void card_metrics(FILE *fp, const char *last_metrics) {
    static const char *keys[][2] = {{"loss", "training loss (cross-entropy + router terms)"},
                                    {"ce_loss", "training cross-entropy (nats per token)"},
                                    {"bits_per_base", "training bits per base"},
                                    {"val_loss", "validation cross-entropy (nats per token)"},
                                    {"val_bits_per_base", "validation bits per base"}};
    json_t *m = last_metrics ? json_loads(last_metrics, 0, NULL) : NULL;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(m, keys[i][0]);
        if (json_is_number(v))
            fprintf(fp, "| %s (`%s`) | %.4f |\n", keys[i][1], keys[i][0], json_number_value(v));
    }
    json_decref(m);
}

/* Writes OUT/README.md: front matter for the Hub, what the model is, how it was made
 * (tokenizer, data, steps, final metrics, the training and export commands) and how to
 * load it. */
static moe_status write_model_card(const char *tmp, const moe_ckpt *ck, const char *command,
                                   int tok_written, moe_st_dtype dtype, moe_err *err) {
    char path[4400], train_cmd[4096];
    snprintf(path, sizeof path, "%s/README.md", tmp);
    training_command(ck->dir, train_cmd, sizeof train_cmd);
    moe_outfile f;
    moe_status st = moe_outfile_open(&f, path, err);
    if (st != MOE_OK) return st;
    const moe_model_config *mc = &ck->cfg.model;
    const moe_tokenizer *tok = ck->tok;
    int64_t total, active;
    moe_model_count_params(mc, &total, &active);
    FILE *fp = f.fp;
    fprintf(fp, "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n"
                "- mixtral\n- mixture-of-experts\n- dna\n- genomics\n- moe-genomics\n---\n\n");
    fprintf(fp, "# DNA language model (Mixtral mixture of experts)\n\n");
    fprintf(fp,
            "A `MixtralForCausalLM` trained with moe-genomics %s (`moe-train`) and exported by "
            "`moe-convert to-hf` as %s.\n\n",
            moe_version(), dtype == MOE_ST_BF16 ? "bfloat16" : "float32");
    fprintf(fp, "| | |\n|---|---|\n");
    fprintf(fp, "| parameters | %" PRId64 " (%" PRId64 " active per token) |\n", total, active);
    fprintf(fp,
            "| layers, hidden size, heads | %" PRId64 ", %" PRId64 ", %" PRId64 " (%" PRId64
            " key/value) |\n",
            mc->num_hidden_layers, mc->hidden_size, mc->num_attention_heads,
            mc->num_key_value_heads);
    fprintf(fp, "| experts | %" PRId64 ", %" PRId64 " per token |\n", mc->num_local_experts,
            mc->num_experts_per_tok);
    fprintf(fp, "| context | %" PRId64 " tokens |\n", mc->max_position_embeddings);
    fprintf(fp, "| tokenizer | `%s`, %" PRId64 " tokens (spec in `moe_tokenizer.json`)%s |\n",
            tok->name, tok->vocab_size,
            tok_written ? "; `tokenizer.json` for `AutoTokenizer`" : "; no `AutoTokenizer` files");
    fprintf(fp, "| training data | `%s` |\n", ck->cfg.data.path[0] ? ck->cfg.data.path : "-");
    fprintf(fp, "| steps | %" PRId64 " (%" PRId64 " tokens) |\n", ck->state.step,
            ck->state.tokens_seen);
    card_metrics(fp, ck->state.last_metrics);
    fprintf(fp, "| checkpoint | ");
    char id[4200];
    moe_ckpt_id(ck, id, sizeof id);
    fprintf(fp, "`%s` |\n\n", id);
    if (train_cmd[0]) fprintf(fp, "Trained with:\n\n```\n%s\n```\n\n", train_cmd);
    if (command) fprintf(fp, "Exported with:\n\n```\n%s\n```\n\n", command);
    fprintf(fp,
            "## Use\n\n```python\nfrom transformers import AutoModelForCausalLM%s\n"
            "model = AutoModelForCausalLM.from_pretrained(\"PATH\")\n",
            tok_written ? ", AutoTokenizer" : "");
    if (tok_written) fprintf(fp, "tok = AutoTokenizer.from_pretrained(\"PATH\")\n");
    fprintf(fp, "```\n\n`moe-convert from-hf PATH CKPT` turns this directory back into a "
                "moe-genomics checkpoint (exactly, for float32).\n");
    if (ferror(fp)) {
        moe_outfile_abort(&f);
        return moe_err_errno(err, path, "cannot write");
    }
    return moe_outfile_commit(&f, err);
}

/* ---- output directory: OUT.tmp.<pid>, renamed at the end ---- */

static moe_status prepare_out(const char *out_dir, char *tmp, size_t n, moe_err *err) {
    struct stat sb;
    if (stat(out_dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode) || rmdir(out_dir) != 0) {
            moe_err_set(err, MOE_ERR_INPUT, out_dir,
                        "the output exists and is not an empty directory");
            moe_err_hint(err, "choose a new output directory (nothing is overwritten)");
            return MOE_ERR_INPUT;
        }
    }
    if (snprintf(tmp, n, "%s.tmp.%d", out_dir, (int)getpid()) >= (int)n)
        return moe_err_set(err, MOE_ERR_INPUT, out_dir, "path too long");
    if (stat(tmp, &sb) == 0) moe_remove_tree(tmp, NULL);
    return moe_mkdirs(tmp, err);
}

static moe_status finish_out(const char *tmp, const char *out_dir, moe_status st, moe_err *err) {
    if (st == MOE_OK && rename(tmp, out_dir) != 0)
        st = moe_err_errno(err, out_dir, "cannot rename the finished output into place");
    if (st != MOE_OK) moe_remove_tree(tmp, NULL);
    return st;
}

/* ---- to-hf ---- */

typedef struct src_tensor {
    const moe_param *p;   /* its table entry */
    const moe_st_file *f; /* the checkpoint file holding t */
    const moe_st_tensor *t;
    int64_t out_bytes;
    int shard;
} src_tensor;

static moe_status add_tensor(moe_st_writer *w, const moe_st_file *f, const moe_param *ct,
                             const moe_st_tensor *t, moe_st_dtype dtype, float **owned,
                             moe_err *err) {
    *owned = NULL;
    int aligned = ((uintptr_t)t->data % sizeof(float)) == 0;
    if (t->dtype == MOE_ST_F32 && dtype == MOE_ST_F32)
        return moe_st_writer_add(w, ct->name, MOE_ST_F32, ct->ndim, ct->shape, t->data, err);
    const float *src = t->data;
    if (t->dtype != MOE_ST_F32 || !aligned) {
        float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
        if (!buf) return moe_err_set(err, MOE_ERR_RUNTIME, f->path, "out of memory");
        moe_status st = moe_st_read_f32(f, t, buf, err);
        if (st != MOE_OK) {
            free(buf);
            return st;
        }
        *owned = buf;
        src = buf;
    }
    return moe_st_writer_add_f32(w, ct->name, dtype, ct->ndim, ct->shape, src, err);
}

static moe_status write_shards(const char *tmp, src_tensor *src, int n, int n_shards,
                               moe_st_dtype dtype, moe_err *err) {
    float **owned = calloc((size_t)n, sizeof *owned);
    if (!owned) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    moe_status st = MOE_OK;
    int first = 0;
    for (int s = 0; st == MOE_OK && s < n_shards; s++) {
        moe_st_writer w;
        moe_st_writer_init(&w);
        st = moe_st_writer_meta(&w, "format", "pt", err);
        int i = first;
        for (; st == MOE_OK && i < n && src[i].shard == s; i++)
            st = add_tensor(&w, src[i].f, src[i].p, src[i].t, dtype, &owned[i], err);
        char path[4400];
        if (n_shards == 1)
            snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        else
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", tmp, s + 1, n_shards);
        if (st == MOE_OK) st = moe_st_writer_write(&w, path, err);
        moe_st_writer_free(&w);
        for (int j = first; j < i; j++) {
            free(owned[j]);
            owned[j] = NULL;
        }
        first = i;
    }
    free(owned);
    return st;
}

static moe_status write_index(const char *tmp, const src_tensor *src, int n, int n_shards,
                              moe_err *err) {
    json_t *o = json_object(), *meta = json_object(), *map = json_object();
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", src[i].shard + 1, n_shards);
        json_object_set_new(map, src[i].p->name, json_string(file));
        total += src[i].out_bytes;
    }
    json_object_set_new(meta, "total_size", json_integer(total));
    json_object_set_new(o, "metadata", meta);
    json_object_set_new(o, "weight_map", map);
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    /* sorted keys as transformers writes them */
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot encode JSON");
    moe_status st = moe_write_text_file(path, text, NULL, err);
    free(text);
    return st;
}

moe_status moe_convert_to_hf(const char *ckpt_dir, const char *out_arg, const moe_convert_opts *o,
                             moe_err *err) {
    if (o->dtype != MOE_ST_F32 && o->dtype != MOE_ST_BF16)
        return moe_err_set(err, MOE_ERR_INPUT, NULL, "--dtype must be f32 or bf16");
    char out_dir[4096];
    if (moe_convert_out_dir(out_arg, out_dir, sizeof out_dir, err) != MOE_OK) return MOE_ERR_INPUT;
    moe_ckpt ck; /* either layout: single file or expert-parallel shards */
    moe_status st =
        moe_ckpt_open(&ck, ckpt_dir, MOE_CKPT_SKIP_OPTIMIZER_CRC | MOE_CKPT_TRAINER_STATE, err);
    if (st != MOE_OK) return st;
    char path[4400], tmp[4200];
    int n = ck.table.n_params, n_shards = 0, have_tmp = 0;
    src_tensor *src = calloc((size_t)n, sizeof *src);
    int *order = calloc((size_t)n, sizeof *order);
    if (!src || !order) st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    if (st == MOE_OK) moe_param_table_hf_order(&ck.table, order);
    /* plan the shards before writing anything (the reader validated every tensor) */
    int64_t in_shard = 0, esize = (int64_t)moe_st_dtype_size(o->dtype);
    for (int i = 0; st == MOE_OK && i < n; i++) {
        const moe_ckpt_tensor *ref = &ck.t[order[i]];
        src[i].p = ref->p;
        src[i].f = ref->file;
        src[i].t = ref->w;
        src[i].out_bytes = src[i].t->numel * esize;
        if (n_shards == 0 || (in_shard > 0 && in_shard + src[i].out_bytes > o->max_shard_bytes)) {
            n_shards++;
            in_shard = 0;
        }
        src[i].shard = n_shards - 1;
        in_shard += src[i].out_bytes;
    }
    if (st == MOE_OK && n_shards > 99999)
        st = moe_err_set(err, MOE_ERR_INPUT, NULL, "%d shards: raise --max-shard-size", n_shards);
    if (st == MOE_OK) {
        st = prepare_out(out_dir, tmp, sizeof tmp, err);
        have_tmp = st == MOE_OK;
    }
    if (st == MOE_OK) st = write_shards(tmp, src, n, n_shards, o->dtype, err);
    if (st == MOE_OK && n_shards > 1) st = write_index(tmp, src, n, n_shards, err);
    if (st == MOE_OK) {
        json_t *cj = hf_config_json(&ck.cfg, ck.tok, o->dtype);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        st = write_json(cj, path, err);
        json_decref(cj);
    }
    if (st == MOE_OK) {
        json_t *gj = hf_generation_json(ck.tok);
        snprintf(path, sizeof path, "%s/generation_config.json", tmp);
        st = write_json(gj, path, err);
        json_decref(gj);
    }
    if (st == MOE_OK) {
        snprintf(path, sizeof path, "%s/moe_tokenizer.json", tmp);
        st = moe_write_text_file(path, ck.tokenizer_json, NULL, err);
    }
    if (st == MOE_OK) {
        moe_outfile cf;
        memset(&cf, 0, sizeof cf);
        snprintf(path, sizeof path, "%s/moe_config.yaml", tmp);
        st = moe_outfile_open(&cf, path, err);
        /* the export is one model, not EP shards: from-hf makes a single-file checkpoint */
        moe_config one = ck.cfg;
        one.parallel.ep = 1;
        if (st == MOE_OK) st = moe_config_write_yaml(&one, cf.fp, err);
        if (st == MOE_OK)
            st = moe_outfile_commit(&cf, err);
        else if (cf.fp)
            moe_outfile_abort(&cf);
    }
    int tok_written = 0;
    if (st == MOE_OK)
        st = moe_convert_write_hf_tokenizer(ck.tokenizer_json, ck.cfg.model.max_position_embeddings,
                                            tmp, &tok_written, err);
    if (st == MOE_OK) st = write_model_card(tmp, &ck, o->command, tok_written, o->dtype, err);
    if (have_tmp) st = finish_out(tmp, out_dir, st, err);
    if (st == MOE_OK) {
        moe_log_info("wrote %s: %d tensors in %d shard(s), %s, tokenizer %s%s", out_dir, n,
                     n_shards, o->dtype == MOE_ST_BF16 ? "bf16" : "f32", ck.tok->name,
                     tok_written ? " (tokenizer.json for AutoTokenizer)"
                                 : " (no AutoTokenizer files: see docs/interop.md)");
    }
    free(src);
    free(order);
    moe_ckpt_close(&ck);
    return st;
}
