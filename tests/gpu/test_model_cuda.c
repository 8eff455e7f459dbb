/* test_model_cuda: the whole MoE model on the CUDA backend against the CPU backend, both
 * under the bf16 recipe (the CPU emulates the GPU's bf16 operand rounding).
 *
 * Same configuration, same initial weights (made once on the CPU and copied), same batch:
 * the losses (total, CE, aux, z) of one forward, every parameter gradient of one backward
 * (normalised mean squared error per tensor and over all), the final hidden states, and the
 * loss curve of 8 AdamW steps run with each backend's own adamw must agree (and, under the
 * fp32 recipe, one step's loss and gradients to fp32 noise; with a document mask, one step
 * under both recipes, the mask changing the loss; under mxfp8, one step: its MXFP8 activations,
 * bf16 residual and quantized products against the CPU emulation, where a value that the two
 * summation orders put on either side of an e4m3 rounding boundary moves by a whole fp8 step:
 * on an H200 (2026-12-05) the loss agreed to 1.3e-4 relative and the gradients to NMSE 4.0e-3
 * at worst (layer 0's q_proj: the product's own quantization noise, as the two sides quantize
 * slightly different dq), 1.5e-3 over all, so its bounds are 1e-3 and 2e-2; op by op
 * gpu.backend_ops holds mxfp8 to 1e-5; under fp8-block, one step in blocks and one with pow2
 * scales and x-tiles on a model with wider experts and every token on every expert, bounds
 * argued from the recipe's own noise (check_step_ref): on an H100 (2026-12-07) loss 2.5e-4 and
 * 4.4e-5 relative, gradients NMSE 1.1e-2 and 1.0e-2 at worst, 4.0e-3 over all, 0.26 and 0.23
 * of the recipe's noise); repeating a
 * step on the GPU must give bit-identical loss and gradients (no float atomics anywhere).
 * Differences come only from summation order and the bf16 rounding-boundary flips it causes, which
 * compound through the layers: measured on an H200 (2026-11-29), the loss agrees to 2e-5 relative,
 * gradients to NMSE 2e-5..7e-5 per tensor, and the 8-step curve (which overfits one batch,
 * 4.55 -> 0.33) to 0.5%. The tolerances sit about 10x above that; an indexing or formula
 * error in any op shows up as NMSE >= 1e-2 in the tensors it touches. Exits 77 without a
 * CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpulib.h"
#include "moe/backend_cuda.h"
#include "moe/model.h"
#include "testlib.h"

enum { B = 2, T = 96, STEPS = 8 };
/* the weights of check_step's steps (and of fp32_grads', which must be the same) */
enum { STEP_SEED = 77 };

static moe_model_config config(void) {
    moe_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 64;
    c.hidden_size = 256;
    c.intermediate_size = 192;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4; /* head dim 64 */
    c.num_key_value_heads = 2;
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = 128;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.02;
    c.router_z_loss_coef = 0.001;
    c.initializer_range = 0.05; /* spreads router logits: no near-ties in top-k */
    c.tie_word_embeddings = 0;
    return c;
}

static double nmse(const float *a, const float *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        if (isnan(a[i])) return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static int close_rel(double a, double b, double tol) {
    return fabs(a - b) <= tol * fmax(fabs(b), 1e-6);
}

/* One forward + backward of m on the batch [B, T] from zeroed gradients: *st its statistics,
 * grads [n_elems] (host) its gradients. */
static void run_step(moe_model *m, const int32_t *tokens, const int32_t *targets,
                     moe_step_stats *st, float *grads) {
    moe_err err;
    moe_err_clear(&err);
    moe_model_zero_grad(m);
    CHECK(moe_model_forward(m, tokens, targets, NULL, B, T, st, &err) == MOE_OK);
    CHECK(moe_model_backward(m, 1.0f, &err) == MOE_OK);
    moe_model_copy_grads_to_host(m, grads);
}

/* One forward + backward of the same weights and batch [B, T] on both backends under recipe
 * rec, with document separator sep (-1: no mask): the losses agree within loss_tol
 * (relative) and every parameter gradient within nmse grad_tol. Under fp32 both compute the
 * same function up to summation order (measured tolerances in the banner). With ref (the
 * CPU's fp32 gradients of the same step, [n_elems]) the gap over all parameters is also at
 * most noise_frac of the recipe's own quantization noise (the CPU's rec gradients against
 * ref): a product on a wrong operand moves the gradients by that noise or more. Returns the
 * CPU's loss. */
static double check_step_ref(const moe_backend *cpu, const moe_backend *gpu,
                             const moe_model_config *cfg, moe_recipe rec, int32_t sep,
                             const int32_t *tokens, const int32_t *targets, double loss_tol,
                             double grad_tol, const float *ref, double noise_frac) {
    moe_err err;
    moe_err_clear(&err);
    moe_model mc, mg;
    memset(&mc, 0, sizeof mc);
    memset(&mg, 0, sizeof mg);
    CHECK(moe_model_create(&mc, cfg, rec, MOE_RECOMPUTE_NONE, cpu, B, T, &err) == MOE_OK);
    CHECK(moe_model_create(&mg, cfg, rec, MOE_RECOMPUTE_NONE, gpu, B, T, &err) == MOE_OK);
    if (err.status == MOE_OK) moe_model_set_document_separator(&mc, sep, &err);
    if (err.status == MOE_OK) moe_model_set_document_separator(&mg, sep, &err);
    if (err.status != MOE_OK) {
        moe_err_print(&err, "test_model_cuda", stderr);
        CHECK(0);
        moe_model_free(&mc);
        moe_model_free(&mg);
        return NAN;
    }
    int64_t n = mc.table.n_elems;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    moe_model_init_weights(&mc, STEP_SEED);
    moe_model_copy_params_to_host(&mc, a);
    moe_model_copy_params_from_host(&mg, a);
    moe_step_stats sc, sg;
    run_step(&mc, tokens, targets, &sc, a);
    run_step(&mg, tokens, targets, &sg, b);
    double worst = 0.0;
    const char *wname = "";
    for (int i = 0; i < mc.table.n_params; i++) {
        double e = nmse(b + mc.table.params[i].offset, a + mc.table.params[i].offset,
                        mc.table.params[i].numel);
        if (e > worst) worst = e, wname = mc.table.params[i].name;
    }
    const char *rname = moe_recipe_name(rec);
    const double all = nmse(b, a, n), noise = ref ? nmse(a, ref, n) : 0.0;
    printf("%s recipe%s: loss cpu %.9f gpu %.9f (rel %.2e); gradients worst nmse %.3e (%s), "
           "all %.3e",
           rname, sep >= 0 ? ", document mask" : "", sc.loss, sg.loss,
           fabs(sg.loss - sc.loss) / sc.loss, worst, wname, all);
    if (ref) printf(" = %.2f of the recipe's own noise (%.3e)", all / noise, noise);
    printf("\n");
    CHECK_MSG(!ref || all <= noise_frac * noise, "%s: gradients' gap %.3e > %.2f x noise %.3e",
              rname, all, noise_frac, noise);
    CHECK_MSG(close_rel(sg.loss, sc.loss, loss_tol), "%s sep %d: loss %.9g vs %.9g", rname, sep,
              sg.loss, sc.loss);
    CHECK_MSG(worst <= grad_tol, "%s sep %d: gradient of %s: nmse %.3e > %.0e", rname, sep, wname,
              worst, grad_tol);
    free(a), free(b);
    moe_model_free(&mc);
    moe_model_free(&mg);
    return sc.loss;
}

/* check_step_ref without the noise bound. */
static double check_step(const moe_backend *cpu, const moe_backend *gpu,
                         const moe_model_config *cfg, moe_recipe rec, int32_t sep,
                         const int32_t *tokens, const int32_t *targets, double loss_tol,
                         double grad_tol) {
    return check_step_ref(cpu, gpu, cfg, rec, sep, tokens, targets, loss_tol, grad_tol, NULL, 0);
}

/* The CPU's gradients [n_elems] (malloc'ed) of check_step's step under the fp32 recipe. */
static float *fp32_grads(const moe_backend *cpu, const moe_model_config *cfg, const int32_t *tokens,
                         const int32_t *targets) {
    moe_err err;
    moe_err_clear(&err);
    moe_model m;
    memset(&m, 0, sizeof m);
    CHECK(moe_model_create(&m, cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, cpu, B, T, &err) ==
          MOE_OK);
    float *g = malloc((size_t)m.table.n_elems * sizeof(float));
    moe_model_init_weights(&m, STEP_SEED);
    moe_step_stats st;
    run_step(&m, tokens, targets, &st, g);
    moe_model_free(&m);
    return g;
}

/* The batch packed with documents: separator sep after the documents [0, 21), [21, 22) (the
 * separator alone), [22, 64) (the next starts on a 64-row tile edge) of row 0 and [0, 31),
 * [31, 71) of row 1, no other sep token; targets the next token, -1 after a separator and at
 * each row's end (what the trainer's loader gives under train.document_mask). */
static void pack_documents(const int32_t *tokens, int32_t sep, int32_t *out, int32_t *targets) {
    static const int at[] = {20, 21, 63, T + 30, T + 70};
    for (int i = 0; i < B * T; i++)
        out[i] = tokens[i] == sep ? sep + 1 : tokens[i];
    for (int j = 0; j < (int)(sizeof at / sizeof at[0]); j++)
        out[at[j]] = sep;
    for (int i = 0; i < B * T; i++)
        targets[i] = (i % T == T - 1 || out[i] == sep) ? -1 : out[i + 1];
}

/* A head dimension the bf16 flash attention has no kernel for is refused by moe_model_create
 * with an input error naming the op and the size, before anything is allocated; under fp32
 * (whose kernel takes it) the same model is created. */
static void refuses_unsupported_shape(const moe_backend *gpu) {
    moe_model_config cfg = config();
    cfg.hidden_size = 160; /* 2 heads of 80 */
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 2;
    size_t before = 0, after = 0;
    gpu->memory(gpu, &before, NULL);
    moe_model m;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, gpu, B, T, &err) ==
          MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "attention") && strstr(err.msg, "D=80"), "message: %s", err.msg);
    gpu->memory(gpu, &after, NULL);
    CHECK_INT_EQ((int64_t)after, (int64_t)before);
    moe_model_free(&m);
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, gpu, B, T, &err) ==
          MOE_OK);
    moe_model_free(&m);
}

int main(void) {
    const moe_backend *gpu = test_cuda_backend("test_model_cuda"), *cpu = moe_backend_cpu();
    if (!gpu) return 77;
    refuses_unsupported_shape(gpu);
    moe_err err;
    moe_err_clear(&err);
    moe_model_config cfg = config();
    moe_model mc, mg;
    memset(&mc, 0, sizeof mc);
    memset(&mg, 0, sizeof mg);
    CHECK(moe_model_create(&mc, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, cpu, B, T, &err) ==
          MOE_OK);
    CHECK(moe_model_create(&mg, &cfg, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, gpu, B, T, &err) ==
          MOE_OK);
    if (err.status != MOE_OK) {
        moe_err_print(&err, "test_model_cuda", stderr);
        return test_summary("test_model_cuda");
    }
    int64_t n = mc.table.n_elems;
    CHECK_INT_EQ(mg.table.n_elems, n);
    moe_model_init_weights(&mc, 2024);
    float *host = malloc((size_t)n * sizeof(float)), *hg = malloc((size_t)n * sizeof(float));
    moe_model_copy_params_to_host(&mc, host);
    moe_model_copy_params_from_host(&mg, host);

    int32_t tokens[B * T], targets[B * T];
    uint64_t s = 12345;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab_size);
    }
    for (int i = 0; i < B * T; i++)
        targets[i] = (i % T == T - 1) ? -1 : tokens[i + 1];

    double plain = check_step(cpu, gpu, &cfg, MOE_RECIPE_FP32, -1, tokens, targets, 1e-5, 1e-8);
    /* document mask: the fp32 and the flash kernels with doc_start, RoPE with positions */
    int32_t dtok[B * T], dtgt[B * T];
    pack_documents(tokens, 1, dtok, dtgt);
    double masked = check_step(cpu, gpu, &cfg, MOE_RECIPE_FP32, 1, dtok, dtgt, 1e-5, 1e-8);
    check_step(cpu, gpu, &cfg, MOE_RECIPE_BF16, 1, dtok, dtgt, 1e-3, 1e-3);
    check_step(cpu, gpu, &cfg, MOE_RECIPE_MXFP8, -1, tokens, targets, 1e-3, 2e-2);
    /* fp8-block with experts wider than the model (ln1, xe, g, dh1 and dh3 all go as fp8-block
     * pairs on sm_90), in blocks and with pow2 scales and x-tiles. Every token goes to every
     * expert (top 4 of 4): with top 2, the two sides' different roundings send tokens to other
     * experts (on an H100, 2026-12-07, 1 to 5 tokens of a layer; on the CPU, 1e-5 relative
     * noise on the weights changes up to 16 of layer 1's 384 top-2 entries), and a rerouted
     * token moves its experts' gradients by NMSE 1e-2 to 1e-1, a gap no bound could tell from
     * an error. */
    moe_model_config wide = cfg;
    wide.intermediate_size = 384;
    wide.num_experts_per_tok = wide.num_local_experts;
    float *ref = fp32_grads(cpu, &wide, tokens, targets);
    check_step_ref(cpu, gpu, &wide, MOE_RECIPE_FP8_BLOCK, -1, tokens, targets, 2e-3, 3e-2, ref,
                   0.5);
    check_step_ref(cpu, gpu, &wide, MOE_RECIPE_FP8_BLOCK_POW2_XT, -1, tokens, targets, 2e-3, 3e-2,
                   ref, 0.5);
    free(ref);
    double unmasked = check_step(cpu, gpu, &cfg, MOE_RECIPE_FP32, -1, dtok, dtgt, 1e-5, 1e-8);
    printf("packed batch: loss %.6f with the mask, %.6f without (plain batch %.6f)\n", masked,
           unmasked, plain);
    CHECK_MSG(!close_rel(masked, unmasked, 1e-4), "the mask left the loss at %.9g", masked);

    /* ---- bf16: one forward + backward ---- */
    moe_step_stats sc, sg;
    moe_model_zero_grad(&mc);
    moe_model_zero_grad(&mg);
    CHECK(moe_model_forward(&mc, tokens, targets, NULL, B, T, &sc, &err) == MOE_OK);
    CHECK(moe_model_forward(&mg, tokens, targets, NULL, B, T, &sg, &err) == MOE_OK);
    printf("loss   cpu %.7f gpu %.7f\nce     cpu %.7f gpu %.7f\naux    cpu %.7f gpu %.7f\n"
           "z      cpu %.7f gpu %.7f\nentropy cpu %.7f gpu %.7f\n",
           sc.loss, sg.loss, sc.ce_loss, sg.ce_loss, sc.aux_loss, sg.aux_loss, sc.z_loss, sg.z_loss,
           sc.router_entropy, sg.router_entropy);
    CHECK_MSG(close_rel(sg.loss, sc.loss, 1e-3), "loss %.9g vs cpu %.9g", sg.loss, sc.loss);
    CHECK_MSG(close_rel(sg.ce_loss, sc.ce_loss, 1e-3), "ce %.9g vs %.9g", sg.ce_loss, sc.ce_loss);
    CHECK_MSG(close_rel(sg.aux_loss, sc.aux_loss, 1e-3), "aux %.9g vs %.9g", sg.aux_loss,
              sc.aux_loss);
    CHECK_MSG(close_rel(sg.z_loss, sc.z_loss, 1e-3), "z %.9g vs %.9g", sg.z_loss, sc.z_loss);
    int64_t nexp = cfg.num_hidden_layers * cfg.num_local_experts, route_diff = 0;
    for (int64_t i = 0; i < nexp; i++)
        route_diff += sc.expert_tokens[i] != sg.expert_tokens[i];
    printf("expert token counts differing: %lld of %lld\n", (long long)route_diff, (long long)nexp);
    CHECK_MSG(route_diff == 0, "routing differs between cpu and gpu");

    CHECK(moe_model_backward(&mc, 1.0f, &err) == MOE_OK);
    CHECK(moe_model_backward(&mg, 1.0f, &err) == MOE_OK);
    moe_model_copy_grads_to_host(&mc, host);
    moe_model_copy_grads_to_host(&mg, hg);
    double worst = 0.0;
    for (int i = 0; i < mc.table.n_params; i++) {
        const moe_param *p = &mc.table.params[i];
        double e = nmse(hg + p->offset, host + p->offset, p->numel);
        if (e > worst) worst = e;
        if (i < 12 || e > 1e-4) printf("  grad %-52s nmse %.3e\n", p->name, e);
        CHECK_MSG(e <= 1e-3, "grad of %s: nmse %.3e > 1e-3", p->name, e);
    }
    double all = nmse(hg, host, n);
    printf("gradients: %d tensors, worst nmse %.3e, all params nmse %.3e\n", mc.table.n_params,
           worst, all);
    CHECK_MSG(all <= 3e-4, "all gradients: nmse %.3e", all);

    /* ---- determinism: the same step again on the GPU gives bit-identical results ---- */
    moe_step_stats sg2;
    moe_model_zero_grad(&mg);
    CHECK(moe_model_forward(&mg, tokens, targets, NULL, B, T, &sg2, &err) == MOE_OK);
    CHECK(moe_model_backward(&mg, 1.0f, &err) == MOE_OK);
    float *hg2 = malloc((size_t)n * sizeof(float));
    moe_model_copy_grads_to_host(&mg, hg2);
    int same = memcmp(&sg2.loss, &sg.loss, sizeof sg.loss) == 0 &&
               memcmp(hg2, hg, (size_t)n * sizeof(float)) == 0;
    printf("repeat of the step on the GPU: %s\n", same ? "bit-identical" : "DIFFERS");
    CHECK_MSG(same, "two identical GPU steps differ (loss %.17g vs %.17g)", sg2.loss, sg.loss);
    free(hg2);

    /* ---- hidden states ---- */
    int64_t nh = (int64_t)B * T * cfg.hidden_size;
    float *hc = malloc((size_t)nh * sizeof(float)), *hgg = malloc((size_t)nh * sizeof(float));
    CHECK(moe_model_hidden(&mc, tokens, B, T, (int)cfg.num_hidden_layers, hc, &err) == MOE_OK);
    CHECK(moe_model_hidden(&mg, tokens, B, T, (int)cfg.num_hidden_layers, hgg, &err) == MOE_OK);
    double eh = nmse(hgg, hc, nh);
    printf("final hidden states nmse %.3e\n", eh);
    CHECK_MSG(eh <= 3e-4, "hidden states nmse %.3e", eh);

    /* ---- a short training run, each backend with its own AdamW ---- */
    float *mcm = cpu->alloc(cpu, (size_t)n * 4), *mcv = cpu->alloc(cpu, (size_t)n * 4);
    float *mgm = gpu->alloc(gpu, (size_t)n * 4), *mgv = gpu->alloc(gpu, (size_t)n * 4);
    double lc[STEPS], lg[STEPS];
    moe_optim_config opt = test_optim(0.1);
    for (int step = 1; step <= STEPS; step++) {
        moe_model_zero_grad(&mc);
        moe_model_zero_grad(&mg);
        CHECK(moe_model_forward(&mc, tokens, targets, NULL, B, T, &sc, &err) == MOE_OK);
        CHECK(moe_model_forward(&mg, tokens, targets, NULL, B, T, &sg, &err) == MOE_OK);
        CHECK(moe_model_backward(&mc, 1.0f, &err) == MOE_OK);
        CHECK(moe_model_backward(&mg, 1.0f, &err) == MOE_OK);
        double gc = cpu->sum_squares(cpu, moe_cbuf_f32(mc.grad_mem), n),
               gg = gpu->sum_squares(gpu, moe_cbuf_f32(mg.grad_mem), n);
        moe_model_adamw(&mc, 0, n, moe_buf_f32(mcm), moe_buf_f32(mcv), &opt, 3e-3, step, 1.0f);
        moe_model_adamw(&mg, 0, n, moe_buf_f32(mgm), moe_buf_f32(mgv), &opt, 3e-3, step, 1.0f);
        lc[step - 1] = sc.loss;
        lg[step - 1] = sg.loss;
        printf("step %d  loss cpu %.6f gpu %.6f  |grad| cpu %.6f gpu %.6f\n", step, sc.loss,
               sg.loss, sqrt(gc), sqrt(gg));
        CHECK_MSG(close_rel(sqrt(gg), sqrt(gc), 1e-1), "step %d grad norm %.6g vs %.6g", step,
                  sqrt(gg), sqrt(gc));
    }
    CHECK(gpu->synchronize(gpu, &err) == MOE_OK);
    for (int i = 0; i < STEPS; i++)
        CHECK_MSG(close_rel(lg[i], lc[i], 5e-2), "step %d loss %.9g vs cpu %.9g", i + 1, lg[i],
                  lc[i]);
    CHECK_MSG(lg[STEPS - 1] < lg[0], "gpu loss did not decrease: %.6g -> %.6g", lg[0],
              lg[STEPS - 1]);
    moe_model_copy_params_to_host(&mc, host);
    moe_model_copy_params_to_host(&mg, hg);
    double ep = nmse(hg, host, n);
    printf("parameters after %d AdamW steps: nmse %.3e\n", STEPS, ep);
    CHECK_MSG(ep <= 1e-3, "parameters after training nmse %.3e", ep);

    if (err.status != MOE_OK) moe_err_print(&err, "test_model_cuda", stderr);
    cpu->free(cpu, mcm), cpu->free(cpu, mcv), gpu->free(gpu, mgm), gpu->free(gpu, mgv);
    free(host), free(hg), free(hc), free(hgg);
    moe_model_free(&mc);
    moe_model_free(&mg);
    gpu->destroy(gpu);
    return test_summary("test_model_cuda");
}
