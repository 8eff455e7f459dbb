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
#ifdef MOE_HAVE_CUDA
#include "moe/backend_cuda.h"
#include "moe/cuda_dtype.h"
#endif

moe_status moe_infer_ckpt_open(moe_infer_ckpt *c, const char *dir, moe_err *err) {
    memset(c, 0, sizeof *c);
    return moe_ckpt_open(&c->ckpt, dir, MOE_CKPT_SKIP_OPTIMIZER_CRC, err);
}

/* cpu, cuda, or auto = the first GPU when one is usable (as moe-train), else the CPU. */
static moe_status open_backend(moe_infer_ckpt *c, moe_device_kind device, moe_err *err) {
    int want_cuda = device == MOE_DEVICE_CUDA;
#ifdef MOE_HAVE_CUDA
    if (device == MOE_DEVICE_AUTO && moe_cuda_available() > 0) want_cuda = 1;
#endif
    if (!want_cuda) {
        c->be = moe_backend_cpu();
        return MOE_OK;
    }
#ifdef MOE_HAVE_CUDA
    moe_err sub;
    moe_err_clear(&sub);
    c->be = moe_backend_cuda(&sub);
    if (c->be) {
        c->be_is_cuda = 1;
        return MOE_OK;
    }
    if (device == MOE_DEVICE_AUTO) {
        moe_log_warn("--device auto found a GPU but cannot use it (%s); embedding on the CPU",
                     sub.msg);
        c->be = moe_backend_cpu();
        return MOE_OK;
    }
    moe_err_set(err, MOE_ERR_INPUT, NULL, "--device cuda was requested but no GPU is usable: %s",
                sub.msg);
#else
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "--device cuda was requested but this build has no CUDA support");
#endif
    moe_err_hint(err, "use --device cpu (or auto) on a machine without a GPU");
    return MOE_ERR_INPUT;
}

moe_status moe_infer_ckpt_load_model(moe_infer_ckpt *c, moe_device_kind device, int bf16,
                                     int max_batch, int max_seq, moe_err *err) {
    moe_status st = open_backend(c, device, err);
    if (st != MOE_OK) return st;
    moe_recipe recipe = (bf16 < 0 ? c->be_is_cuda : bf16) ? MOE_RECIPE_BF16 : MOE_RECIPE_FP32;
    st = moe_model_create_forward_only(&c->model, &c->ckpt.cfg.model, recipe, c->be, max_batch,
                                       max_seq, err);
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
#ifdef MOE_HAVE_CUDA
    if (c->be_is_cuda) moe_backend_cuda_free(c->be);
#endif
    c->be = NULL;
    c->be_is_cuda = 0;
    moe_ckpt_close(&c->ckpt);
}
