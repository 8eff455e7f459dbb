/* test_train_ckpt: a training checkpoint round-trips bit for bit (weights, both Adam moments,
 * trainer state with the loop's health watch; an older state without one loads as zero), and
 * loading refuses what does not fit: another model shape (naming the key), another tokenizer,
 * a damaged file (naming it), a tensor of the wrong dtype. */
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"
#include "moe/config.h"
#include "moe/fileio.h"
#include "moe/model.h"
#include "moe/safetensors.h"
#include "moe/tokenizer.h"
#include "moe/train.h"
#include "testlib.h"

static const char *k_yaml =
    "model:\n  vocab_size: 256\n  hidden_size: 32\n  intermediate_size: 64\n"
    "  num_hidden_layers: 2\n  num_attention_heads: 4\n"
    "  num_key_value_heads: 2\n  num_local_experts: 4\n"
    "  num_experts_per_tok: 2\n  max_position_embeddings: 64\n"
    "train:\n  steps: 10\n  seq_len: 16\n  global_batch_tokens: 32\n"
    "optim:\n  warmup_steps: 2\n";

int main(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree("run", &err);
    moe_config cfg;
    if (moe_config_load_string(&cfg, k_yaml, "test.yaml", &err) != MOE_OK) {
        CHECK_MSG(0, "config: %s", err.msg);
        return test_summary("train_ckpt");
    }
    const moe_backend *be = moe_backend_cpu();
    moe_model a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (moe_model_create(&a, &cfg.model, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, be, 2, 16, &err) !=
            MOE_OK ||
        moe_model_create(&b, &cfg.model, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, be, 2, 16, &err) !=
            MOE_OK) {
        CHECK_MSG(0, "model: %s", err.msg);
        moe_model_free(&a);
        moe_model_free(&b);
        return test_summary("train_ckpt");
    }
    moe_model_init_weights(&a, 7);
    moe_model_init_weights(&b, 8);
    int64_t n = a.table.n_elems;
    size_t bytes = (size_t)n * sizeof(float);
    float *m = be->alloc(be, bytes), *v = be->alloc(be, bytes);
    float *m2 = be->alloc(be, bytes), *v2 = be->alloc(be, bytes);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hm = malloc(bytes), *hv = malloc(bytes);
    for (int64_t i = 0; i < n; i++) {
        hm[i] = (float)i * 1e-3f - 0.5f;
        hv[i] = 1.0f / (float)(i + 3);
    }
    be->memcpy_h2d(be, m, hm, bytes);
    be->memcpy_h2d(be, v, hv, bytes);

    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    moe_tokenizer *tok = NULL, *tok512 = NULL;
    CHECK(moe_tokenizer_create(&tok, &o, &err) == MOE_OK);
    o.vocab_size = 512;
    CHECK(moe_tokenizer_create(&tok512, &o, &err) == MOE_OK);
    if (!tok || !tok512) return test_summary("train_ckpt");

    moe_trainer_state ts;
    memset(&ts, 0, sizeof ts);
    ts.step = 5;
    ts.tokens_seen = 160;
    ts.data_epoch = 2;
    ts.data_index = 3;
    ts.seed = 1234;
    ts.data_shuffle = 1;
    ts.data_samples = 77;
    ts.data_stream_tokens = 1233;
    ts.last_metrics = strdup("{\"step\":5,\"loss\":3.25}");
    ts.health.bad_in_row = 2; /* two non-finite steps just skipped */
    ts.health.good = 3;
    ts.health.loss_mean = 0.1 + 1.0 / 3; /* not a short decimal: must round-trip exactly */
    ts.health.rising = 1;
    CHECK_MSG(moe_train_save_checkpoint("run", 2, &cfg, moe_tokenizer_spec_json(tok), &a, m, v, &ts,
                                        &err) == MOE_OK,
              "save: %s", err.msg);

    moe_trainer_state back;
    CHECK_MSG(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, tok->vocab_hash, &b, m2, v2,
                                        &back, &err) == MOE_OK,
              "load: %s", err.msg);
    moe_model_copy_params_to_host(&a, ha);
    moe_model_copy_params_to_host(&b, hb);
    CHECK(memcmp(ha, hb, bytes) == 0);
    be->memcpy_d2h(be, hb, m2, bytes);
    CHECK(memcmp(hm, hb, bytes) == 0);
    be->memcpy_d2h(be, hb, v2, bytes);
    CHECK(memcmp(hv, hb, bytes) == 0);
    CHECK(back.step == 5 && back.tokens_seen == 160 && back.data_epoch == 2 &&
          back.data_index == 3 && back.seed == 1234 && back.data_shuffle == 1 &&
          back.data_samples == 77 && back.data_stream_tokens == 1233);
    CHECK(back.last_metrics && strstr(back.last_metrics, "\"loss\":3.25"));
    free(back.last_metrics);
    CHECK_INT_EQ(back.health.bad_in_row, 2);
    CHECK_INT_EQ(back.health.good, 3);
    CHECK(back.health.loss_mean == 0.1 + 1.0 / 3);
    CHECK(back.health.rising == 1 && back.health.spiking == 0);

    /* trainer_state.json of an older moe-train (no "health"): loads with a zero watch; a
     * malformed "health" is refused by name. */
    const char *old_state = "{\"format\": \"moe-genomics trainer state\", \"version\": 1, "
                            "\"step\": 7, \"tokens_seen\": 14, \"data\": {\"epoch\": 0, "
                            "\"index\": 1, \"shuffle\": true, \"samples_per_epoch\": 9, "
                            "\"stream_tokens\": 99}, \"rng\": {\"seed\": 5}%s}";
    char text[1024];
    snprintf(text, sizeof text, old_state, "");
    memset(&back, 0xff, sizeof back);
    CHECK_MSG(moe_ckpt_state_parse(text, "old.json", &back, &err) == MOE_OK, "%s", err.msg);
    CHECK(back.step == 7 && back.health.bad_in_row == 0 && back.health.good == 0 &&
          back.health.loss_mean == 0 && !back.health.spiking && !back.health.rising);
    free(back.last_metrics);
    snprintf(text, sizeof text, old_state, ", \"health\": {\"bad_steps_in_row\": -1}");
    moe_err_clear(&err);
    CHECK(moe_ckpt_state_parse(text, "bad.json", &back, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "health") && strcmp(err.file, "bad.json") == 0, "%s", err.msg);
    moe_err_clear(&err); /* the checks below read err.status */

    /* The weights file is a plain safetensors file with HF names and format=pt. */
    moe_st_file f;
    CHECK(moe_st_open(&f, "run/ckpt-00000005/model.safetensors", &err) == MOE_OK);
    if (err.status == MOE_OK) {
        CHECK_INT_EQ(f.n_tensors, a.table.n_params);
        CHECK(moe_st_find(&f, "model.embed_tokens.weight") != NULL);
        CHECK(moe_st_find(&f, "model.layers.1.block_sparse_moe.experts.3.w2.weight") != NULL);
        CHECK(moe_st_meta(&f, "format") && strcmp(moe_st_meta(&f, "format"), "pt") == 0);
        moe_st_close(&f);
    }
    CHECK(moe_st_open(&f, "run/ckpt-00000005/optimizer-rank0.safetensors", &err) == MOE_OK);
    if (err.status == MOE_OK) {
        CHECK_INT_EQ(f.n_tensors, 2 * a.table.n_params);
        CHECK(moe_st_find(&f, "model.norm.weight.exp_avg_sq") != NULL);
        moe_st_close(&f);
    }

    /* Another model shape: refused, naming the key. */
    moe_config other = cfg;
    other.model.intermediate_size = 32;
    moe_err_clear(&err);
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &other, 0, &b, m2, v2, &back, &err) ==
          MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "model.intermediate_size") != NULL, "%s", err.msg);
    /* Another tokenizer. */
    moe_err_clear(&err);
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, tok512->vocab_hash, &b, m2, v2,
                                    &back, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "tokenizer.json") != NULL);

    /* A second checkpoint, then damage trainer_state.json of the first: refused by name. */
    ts.step = 6;
    CHECK(moe_train_save_checkpoint("run", 2, &cfg, moe_tokenizer_spec_json(tok), &a, m, v, &ts,
                                    &err) == MOE_OK);
    FILE *fp = fopen("run/ckpt-00000005/trainer_state.json", "r+b");
    if (fp) {
        fseek(fp, 10, SEEK_SET);
        fputc('#', fp);
        fclose(fp);
    }
    moe_err_clear(&err);
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, 0, &b, m2, v2, &back, &err) ==
          MOE_ERR_INPUT);
    CHECK(strstr(err.file, "ckpt-00000005/trainer_state.json") != NULL);
    char latest[4096];
    int found;
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_OK);
    CHECK(found && strcmp(latest, "run/ckpt-00000006") == 0);

    free(ts.last_metrics);
    moe_tokenizer_free(tok);
    moe_tokenizer_free(tok512);
    be->free(be, m);
    be->free(be, v);
    be->free(be, m2);
    be->free(be, v2);
    free(ha);
    free(hb);
    free(hm);
    free(hv);
    moe_model_free(&a);
    moe_model_free(&b);
    moe_err_clear(&err);
    moe_remove_tree("run", &err);
    return test_summary("train_ckpt");
}
