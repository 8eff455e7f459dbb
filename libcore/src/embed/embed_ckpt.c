/* embed_ckpt: a training checkpoint opened for inference (moe/embed.h, moe_infer_ckpt).
 *
 * Reads what inference needs from ckpt-<step>/ - config.yaml, tokenizer.json and the fp32
 * weights (moe/ckpt_tensors.h: model.safetensors, or the expert-parallel shards) - after
 * verifying MANIFEST; the optimizer state is never read. The one thing to know: the
 * tokenizer must fit the model (vocabulary size at most model.vocab_size); anything else is
 * refused here, before a model is built, so that every later token id is a valid embedding
 * row. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moe/checkpoint.h"
#include "moe/ckpt_tensors.h"
#include "moe/embed.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/safetensors.h"

moe_status moe_infer_ckpt_open(moe_infer_ckpt *c, const char *dir, moe_err *err) {
    memset(c, 0, sizeof *c);
    moe_status st = moe_ckpt_resolve(dir, c->dir, sizeof c->dir, err);
    if (st != MOE_OK) return st;
    if (strcmp(c->dir, dir) != 0)
        moe_log_info("using the latest checkpoint of %s: %s", dir, c->dir);
    st = moe_ckpt_verify_except(c->dir, "optimizer-", err); /* never read here */
    if (st != MOE_OK) return st;

    char path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", c->dir);
    st = moe_config_load(&c->cfg, path, 0, NULL, err);
    if (st != MOE_OK) return st;
    snprintf(path, sizeof path, "%s/tokenizer.json", c->dir);
    size_t len;
    st = moe_read_file(path, &c->tokenizer_json, &len, err);
    if (st == MOE_OK) st = moe_tokenizer_from_json(&c->tok, c->tokenizer_json, path, err);
    if (st == MOE_OK && c->tok->vocab_size > c->cfg.model.vocab_size) {
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "tokenizer '%s' has %" PRId64 " tokens but the model's vocab_size is %" PRId64,
                    c->tok->name, c->tok->vocab_size, c->cfg.model.vocab_size);
        moe_err_hint(err, "the checkpoint's tokenizer.json does not belong to its model");
        st = MOE_ERR_INPUT;
    }
    if (st != MOE_OK) moe_infer_ckpt_close(c);
    return st;
}

moe_status moe_infer_ckpt_load_model(moe_infer_ckpt *c, moe_device_kind device, int threads,
                                     int bf16, int max_batch, int max_seq, moe_err *err) {
    /* the device rule is moe-train's (moe_backend_open); bf16 -1: the backend's fast recipe */
    c->be = moe_backend_open(moe_device_name(device), bf16 > 0 ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32,
                             threads, err);
    if (!c->be) return MOE_ERR_INPUT;
    moe_recipe recipe = (bf16 < 0 ? c->be->bf16_native : bf16) ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
    moe_status st = moe_model_create_forward_only(&c->model, &c->cfg.model, recipe, c->be,
                                                  max_batch, max_seq, err);
    if (st != MOE_OK) {
        moe_model_free(&c->model);
        return st;
    }
    c->has_model = 1;
    moe_ckpt_tensors ct;
    st = moe_ckpt_tensors_open(&ct, c->dir, &c->cfg, 0, err);
    if (st != MOE_OK) return st;
    float *host = malloc((size_t)(c->model.n_elems ? c->model.n_elems : 1) * sizeof(float));
    if (!host) st = moe_err_set(err, MOE_ERR_RUNTIME, c->dir, "out of memory");
    for (int i = 0; st == MOE_OK && i < c->model.n_params; i++) {
        const moe_param *p = &c->model.params[i];
        st = moe_ckpt_tensors_read(&ct, p->name, MOE_CKPT_WEIGHT, p->ndim, p->shape,
                                   host + p->offset, err);
    }
    if (st == MOE_OK) moe_model_copy_params_from_host(&c->model, host);
    free(host);
    moe_ckpt_tensors_close(&ct);
    return st;
}

void moe_infer_ckpt_close(moe_infer_ckpt *c) {
    if (c->has_model) moe_model_free(&c->model);
    c->has_model = 0;
    if (c->be) c->be->destroy(c->be);
    c->be = NULL;
    moe_tokenizer_free(c->tok);
    c->tok = NULL;
    free(c->tokenizer_json);
    c->tokenizer_json = NULL;
}
