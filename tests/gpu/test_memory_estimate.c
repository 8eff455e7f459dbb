/* test_memory_estimate: the --dry-run memory estimate against the measured peak on a GPU.
 *
 * For configs/L0_sanity.yaml (one micro-batch = train.global_batch_tokens, 64 x 256 tokens),
 * under the fp32 recipe (fp32 AdamW moments), the bf16 one and mxfp8 (bf16 moments, optim.moments
 * bf16), and bf16 with the experts' gradients in bf16 and the masters split (optim.expert_grads
 * bf16, optim.master split), and every train.recompute mode, a fresh CUDA backend
 * builds the model, runs one forward + backward + AdamW step, and its peak device memory
 * (be->memory: be->alloc buffers, scratch and the cuBLASLt workspace) must be
 * within 10% of moe_model_memory_estimate's total + gpu_scratch, the figure --dry-run prints
 * as the peak on a CUDA device. The part allocated through be->alloc (total) is exact (the
 * CPU test unit.recompute checks it byte for byte); gpu_scratch is an upper bound on the
 * backend's grow-only scratch. Also: the peaks of the four modes must shrink in the order
 * none > attn, moe > full, as the plans do, and every mode's gradients must be bit-identical
 * to recompute none's on the GPU too (its kernels are deterministic). Exits 77 without a
 * CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/config.h"
#include "moe/model.h"
#include "testlib.h"

/* A setting the estimate is checked under: the recipe, optim.moments, optim.expert_grads and
 * optim.master. */
typedef struct {
    moe_recipe recipe;
    moe_dtype moments, expert_grads;
    moe_master master;
} setting;

/* One training step on a fresh backend; returns the peak device bytes (0 on failure) and
 * the gradients of the step (before AdamW) in *grads (malloc'ed, n_elems floats). */
static size_t step_peak(const moe_config *cfg, const setting *z, moe_recompute rc, float **grads,
                        int64_t *n) {
    const moe_recipe recipe = z->recipe;
    const moe_dtype mdt = z->moments;
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *be = moe_backend_cuda(&err);
    if (!be) {
        CHECK_MSG(0, "CUDA backend: %s", err.msg);
        return 0;
    }
    int T = (int)cfg->train.seq_len, B = (int)(cfg->train.global_batch_tokens / T);
    moe_model m;
    size_t peak = 0;
    void *am = NULL, *av = NULL;
    int32_t *tok = malloc((size_t)B * T * sizeof(int32_t)),
            *tgt = malloc((size_t)B * T * sizeof(int32_t));
    if (moe_model_create(&m, &cfg->model, recipe, rc, be, B, T, &err) != MOE_OK) {
        CHECK_MSG(0, "create: %s", err.msg);
        goto done;
    }
    if (moe_model_set_expert_grads(&m, z->expert_grads, &err) != MOE_OK ||
        moe_model_set_master(&m, z->master, &err) != MOE_OK) {
        CHECK_MSG(0, "layout: %s", err.msg);
        goto done;
    }
    moe_model_init_weights(&m, 5);
    size_t pb = (size_t)m.table.n_elems * sizeof(float);
    am = be->alloc(be, (size_t)m.table.n_elems * moe_dtype_size(mdt));
    av = be->alloc(be, (size_t)m.table.n_elems * moe_dtype_size(mdt));
    CHECK(am && av);
    if (!am || !av) goto done;
    uint64_t s = 1;
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)cfg->model.vocab_size);
        tgt[i] = (int32_t)((s >> 17) % (uint64_t)cfg->model.vocab_size);
    }
    moe_step_stats st;
    moe_model_zero_grad(&m);
    CHECK(moe_model_forward(&m, tok, tgt, NULL, B, T, &st, &err) == MOE_OK);
    CHECK(moe_model_backward(&m, 1.0f, &err) == MOE_OK);
    *n = m.table.n_elems;
    *grads = malloc(pb);
    if (*grads) moe_model_copy_grads_to_host(&m, *grads);
    moe_optim_config opt = test_optim(0.1);
    opt.moments = mdt;
    moe_model_adamw(&m, 0, m.table.n_elems, moe_buf_of(am, mdt), moe_buf_of(av, mdt), &opt, 1e-3, 1,
                    1.0f);
    (void)moe_model_grad_sum_squares(&m, 0, m.table.n_elems); /* gradient clipping's norm */
    CHECK_MSG(be->synchronize(be, &err) == MOE_OK, "step: %s", err.msg);
    CHECK_MSG(isfinite(st.loss), "loss %g", st.loss);
    be->memory(be, NULL, &peak);
done:
    be->free(be, am);
    be->free(be, av);
    moe_model_free(&m);
    be->destroy(be);
    free(tok);
    free(tgt);
    return peak;
}

int main(void) {
    const moe_backend *probe = test_cuda_backend("test_memory_estimate");
    if (!probe) return 77;
    moe_err err;
    moe_err_clear(&err);
    probe->destroy(probe);
    moe_config cfg;
    if (moe_config_load(&cfg, test_src_path("configs/L0_sanity.yaml"), 0, NULL, &err) != MOE_OK) {
        CHECK_MSG(0, "config: %s", err.msg);
        return test_summary("test_memory_estimate");
    }
    const setting settings[] = {
        {MOE_RECIPE_FP32, MOE_DTYPE_F32, MOE_DTYPE_F32, MOE_MASTER_FP32},
        {MOE_RECIPE_BF16, MOE_DTYPE_BF16, MOE_DTYPE_F32, MOE_MASTER_FP32},
        {MOE_RECIPE_MXFP8, MOE_DTYPE_BF16, MOE_DTYPE_F32, MOE_MASTER_FP32},
        /* the benchmark's setting against HF, and the masters split */
        {MOE_RECIPE_BF16, MOE_DTYPE_BF16, MOE_DTYPE_BF16, MOE_MASTER_SPLIT},
    };
    for (size_t r = 0; r < sizeof settings / sizeof settings[0]; r++) {
        const setting *z = &settings[r];
        char name[128];
        snprintf(name, sizeof name, "%s (moments %s, expert grads %s, master %s)",
                 moe_recipe_name(z->recipe), moe_dtype_name(z->moments),
                 moe_dtype_name(z->expert_grads), moe_master_name(z->master));
        size_t peaks[4] = {0, 0, 0, 0};
        float *ref = NULL;
        int64_t nref = 0;
        for (int rc = 0; rc < 4; rc++) {
            moe_model_memory est;
            moe_model_memory_estimate(&cfg.model, z->recipe, (moe_recompute)rc,
                                      cfg.train.global_batch_tokens / cfg.train.seq_len,
                                      cfg.train.seq_len, 1, NULL, z->moments, z->expert_grads,
                                      z->master, &est);
            float *g = NULL;
            int64_t n = 0;
            peaks[rc] = step_peak(&cfg, z, (moe_recompute)rc, &g, &n);
            if (rc == MOE_RECOMPUTE_NONE) {
                ref = g, nref = n;
            } else if (g && ref) {
                CHECK_MSG(n == nref && memcmp(g, ref, (size_t)n * sizeof(float)) == 0,
                          "%s recompute %s: gradients differ from recompute none on the GPU", name,
                          moe_recompute_name((moe_recompute)rc));
            }
            if (g != ref) free(g);
            double want = (double)(est.total + est.gpu_scratch), got = (double)peaks[rc];
            printf("%s recompute %-4s: estimate %8.1f MiB (be->alloc %8.1f + scratch %6.1f), "
                   "measured peak %8.1f MiB, %+.1f%%\n",
                   name, moe_recompute_name((moe_recompute)rc), want / 1048576.0,
                   (double)est.total / 1048576.0, (double)est.gpu_scratch / 1048576.0,
                   got / 1048576.0, got > 0 ? 100.0 * (want - got) / got : 0.0);
            CHECK_MSG(got > 0 && fabs(want - got) <= 0.10 * got,
                      "%s recompute %s: estimate %.0f bytes is not within 10%% of the peak %.0f",
                      name, moe_recompute_name((moe_recompute)rc), want, got);
        }
        free(ref);
        CHECK(peaks[MOE_RECOMPUTE_ATTN] < peaks[MOE_RECOMPUTE_NONE]);
        CHECK(peaks[MOE_RECOMPUTE_MOE] < peaks[MOE_RECOMPUTE_NONE]);
        CHECK(peaks[MOE_RECOMPUTE_FULL] < peaks[MOE_RECOMPUTE_ATTN]);
        CHECK(peaks[MOE_RECOMPUTE_FULL] < peaks[MOE_RECOMPUTE_MOE]);
    }
    return test_summary("test_memory_estimate");
}
