/* embed_ckpt: a training checkpoint opened for inference (moe/embed.h, moe_infer_ckpt).
 *
 * Opens ckpt-<step>/ through moe_ckpt_open (moe/ckpt.h: config.yaml, tokenizer.json and the
 * fp32 weights of either layout, after verifying MANIFEST; the optimizer state is never
 * read), then builds the model on a backend and loads the weights. The one thing to know:
 * the checkpoint module refuses a tokenizer that does not fit the model (vocabulary size at
 * most model.vocab_size) before a model is built, so every later token id is a valid
 * embedding row. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"
#include "moe/embed.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/safetensors.h"

moe_status moe_infer_ckpt_open(moe_infer_ckpt *c, const char *dir, moe_err *err) {
    memset(c, 0, sizeof *c);
    return moe_ckpt_open(&c->ckpt, dir, MOE_CKPT_SKIP_OPTIMIZER_CRC, err);
}

moe_status moe_infer_ckpt_load_model(moe_infer_ckpt *c, moe_device_kind device, int threads,
                                     int bf16, int max_batch, int max_seq, moe_err *err) {
    /* the device rule is moe-train's (moe_backend_open); bf16 -1: the backend's fast recipe */
    c->be = moe_backend_open(moe_device_name(device), bf16 > 0 ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32,
                             threads, err);
    if (!c->be) return MOE_ERR_INPUT;
    moe_recipe recipe = (bf16 < 0 ? c->be->bf16_native : bf16) ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
    moe_status st = moe_model_create_forward_only(&c->model, &c->ckpt.cfg.model, recipe, c->be,
                                                  max_batch, max_seq, err);
    if (st != MOE_OK) {
        moe_model_free(&c->model);
        return st;
    }
    c->has_model = 1;
    const moe_param_table *t = &c->model.table;
    float *host = malloc((size_t)(t->n_elems ? t->n_elems : 1) * sizeof(float));
    if (!host) st = moe_err_set(err, MOE_ERR_RUNTIME, c->ckpt.dir, "out of memory");
    for (int i = 0; st == MOE_OK && i < t->n_params; i++) {
        const moe_param *p = &t->params[i];
        st = moe_ckpt_read_tensor(&c->ckpt, p->name, MOE_CKPT_WEIGHT, p->ndim, p->shape,
                                  host + p->offset, err);
    }
    if (st == MOE_OK) moe_model_copy_params_from_host(&c->model, host);
    free(host);
    return st;
}

void moe_infer_ckpt_close(moe_infer_ckpt *c) {
    if (c->has_model) moe_model_free(&c->model);
    c->has_model = 0;
    if (c->be) c->be->destroy(c->be);
    c->be = NULL;
    moe_ckpt_close(&c->ckpt);
}
