/* test_train_ckpt: a training checkpoint round-trips bit for bit (weights, both Adam moments,
 * trainer state with the loop's health watch; an older state without one loads as zero), and
 * loading refuses what does not fit: another model shape (naming the key), another tokenizer,
 * a damaged file (naming it), a tensor of the wrong dtype. bf16 moments (optim.moments) are
 * written as their fp32 widening and come back as the same codes; loaded as fp32 they are
 * those widenings, and an fp32 checkpoint loaded as bf16 is rounded to nearest even. */
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

/* optim.moments bf16: m and v as bf16 codes of hm, hv [n] into a checkpoint of run16/ and
 * back; the fp32 checkpoint run/ckpt-00000006 (moments hm, hv) loaded as bf16. m2, v2: fp32
 * backend scratch [n]. */
static void test_bf16_moments(const moe_config *cfg, const moe_tokenizer *tok, moe_model *a,
                              moe_model *b, const float *hm, const float *hv, float *m2,
                              float *v2) {
    const moe_backend *be = a->be;
    int64_t n = a->table.n_elems;
    size_t b16 = (size_t)n * sizeof(uint16_t);
    uint16_t *c[2] = {malloc(b16), malloc(b16)}, *d[2] = {be->alloc(be, b16), be->alloc(be, b16)};
    uint16_t *back16 = malloc(b16);
    float *back32 = malloc((size_t)n * sizeof(float));
    const float *h[2] = {hm, hv};
    float *d32[2] = {m2, v2};
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < n; i++)
            c[k][i] = moe_f32_to_bf16(h[k][i]);
    be->memcpy_h2d(be, d[0], c[0], b16);
    be->memcpy_h2d(be, d[1], c[1], b16);
    moe_config cfg16 = *cfg;
    cfg16.optim.moments = MOE_DTYPE_BF16;
    moe_trainer_state ts, back;
    memset(&ts, 0, sizeof ts);
    ts.step = 9;
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree("run16", &err);
    CHECK_MSG(moe_train_save_checkpoint("run16", 1, &cfg16, moe_tokenizer_spec_json(tok), a,
                                        moe_cbuf_of(d[0], MOE_DTYPE_BF16),
                                        moe_cbuf_of(d[1], MOE_DTYPE_BF16), &ts, &err) == MOE_OK,
              "save bf16 moments: %s", err.msg);
    /* the file: F32 tensors holding the codes widened */
    moe_st_file f;
    if (moe_st_open(&f, "run16/ckpt-00000009/optimizer-rank0.safetensors", &err) == MOE_OK) {
        const moe_st_tensor *t = moe_st_find(&f, "model.norm.weight.exp_avg");
        int pi = moe_param_table_find(&a->table, "model.norm.weight");
        const moe_param *p = pi >= 0 ? &a->table.params[pi] : NULL;
        CHECK(t && p && t->dtype == MOE_ST_F32);
        if (t && p && moe_st_read_f32(&f, t, back32, &err) == MOE_OK)
            for (int64_t i = 0; i < p->numel; i++)
                CHECK_MSG(moe_f32_bits(back32[i]) == (uint32_t)c[0][p->offset + i] << 16,
                          "exp_avg[%lld] %a is not the bf16 code %04x widened", (long long)i,
                          back32[i], c[0][p->offset + i]);
        moe_st_close(&f);
    }
    CHECK_MSG(err.status == MOE_OK, "%s", err.msg);
    for (int k = 0; k < 2; k++) /* loaded as bf16 again: the same codes */
        be->memset(be, d[k], 0xff, b16);
    CHECK_MSG(moe_train_load_checkpoint("run16/ckpt-00000009", &cfg16, tok->vocab_hash, b,
                                        moe_buf_of(d[0], MOE_DTYPE_BF16),
                                        moe_buf_of(d[1], MOE_DTYPE_BF16), &back, &err) == MOE_OK,
              "load bf16 moments: %s", err.msg);
    free(back.last_metrics);
    for (int k = 0; k < 2; k++) {
        be->memcpy_d2h(be, back16, d[k], b16);
        CHECK_MSG(memcmp(back16, c[k], b16) == 0, "bf16 moment %d: codes differ after a round trip",
                  k);
    }
    /* loaded into an fp32 run: the widened values, exactly */
    CHECK(moe_train_load_checkpoint("run16/ckpt-00000009", cfg, tok->vocab_hash, b, moe_buf_f32(m2),
                                    moe_buf_f32(v2), &back, &err) == MOE_OK);
    free(back.last_metrics);
    for (int k = 0; k < 2; k++) {
        be->memcpy_d2h(be, back32, d32[k], (size_t)n * sizeof(float));
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += moe_f32_bits(back32[i]) != (uint32_t)c[k][i] << 16;
        CHECK_MSG(bad == 0, "fp32 load of bf16 moment %d: %lld values differ", k, (long long)bad);
    }
    /* the fp32 checkpoint of the test above loaded as bf16: each moment rounded once */
    CHECK(moe_train_load_checkpoint("run/ckpt-00000006", &cfg16, 0, b,
                                    moe_buf_of(d[0], MOE_DTYPE_BF16),
                                    moe_buf_of(d[1], MOE_DTYPE_BF16), &back, &err) == MOE_OK);
    free(back.last_metrics);
    int64_t inexact = 0;
    for (int k = 0; k < 2; k++) {
        be->memcpy_d2h(be, back16, d[k], b16);
        CHECK_MSG(memcmp(back16, c[k], b16) == 0, "fp32 moment %d: not rounded to nearest even", k);
        for (int64_t i = 0; i < n; i++)
            inexact += moe_bf16_to_f32(c[k][i]) != h[k][i];
    }
    CHECK(inexact > n); /* the test values are mostly not bf16 values: a real rounding */
    moe_remove_tree("run16", &err);
    free(c[0]), free(c[1]), free(back16), free(back32);
    be->free(be, d[0]);
    be->free(be, d[1]);
}

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
    CHECK_MSG(moe_train_save_checkpoint("run", 2, &cfg, moe_tokenizer_spec_json(tok), &a,
                                        moe_cbuf_f32(m), moe_cbuf_f32(v), &ts, &err) == MOE_OK,
              "save: %s", err.msg);

    moe_trainer_state back;
    CHECK_MSG(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, tok->vocab_hash, &b,
                                        moe_buf_f32(m2), moe_buf_f32(v2), &back, &err) == MOE_OK,
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
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &other, 0, &b, moe_buf_f32(m2),
                                    moe_buf_f32(v2), &back, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "model.intermediate_size") != NULL, "%s", err.msg);
    /* Another tokenizer. */
    moe_err_clear(&err);
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, tok512->vocab_hash, &b,
                                    moe_buf_f32(m2), moe_buf_f32(v2), &back,
                                    &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "tokenizer.json") != NULL);

    /* A second checkpoint, then damage trainer_state.json of the first: refused by name. */
    ts.step = 6;
    CHECK(moe_train_save_checkpoint("run", 2, &cfg, moe_tokenizer_spec_json(tok), &a,
                                    moe_cbuf_f32(m), moe_cbuf_f32(v), &ts, &err) == MOE_OK);
    FILE *fp = fopen("run/ckpt-00000005/trainer_state.json", "r+b");
    if (fp) {
        fseek(fp, 10, SEEK_SET);
        fputc('#', fp);
        fclose(fp);
    }
    moe_err_clear(&err);
    CHECK(moe_train_load_checkpoint("run/ckpt-00000005", &cfg, 0, &b, moe_buf_f32(m2),
                                    moe_buf_f32(v2), &back, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "ckpt-00000005/trainer_state.json") != NULL);
    char latest[4096];
    int found;
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_OK);
    CHECK(found && strcmp(latest, "run/ckpt-00000006") == 0);

    test_bf16_moments(&cfg, tok, &a, &b, hm, hv, m2, v2);

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
