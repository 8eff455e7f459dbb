/* bench_train_gpu: training-step throughput of the MoE model on one GPU through the CUDA
 * backend, for the shapes of ../shared/anchors (Hugging Face Mixtral baselines on an H200),
 * and where the step's time goes by op kind.
 *
 *   bench_train_gpu PRESET [STEPS [PROF_STEPS [forward [TOKENS [SEQ]]]]]
 *       PRESET: mixtral8x7b-2L, og2-8x1b, dna-moe-1b, L0_sanity
 *
 * With `forward`, a step is what moe-embed runs per batch instead: moe_model_hidden on a
 * forward-only model (final norm output, copied to the host), TOKENS padded tokens per pass
 * as TOKENS/SEQ rows of SEQ tokens (defaults: the preset's); FLOPs counted are a third of
 * the training FLOPs (2 x matmul weights touched + 2 x layers x seq x hidden per token).
 *
 * Each step is what moe-train does (zero grads, forward, backward, gradient norm, AdamW on
 * fp32 master weights and fp32 moments, or bf16 ones with the environment variable
 * MOMENTS=bf16 as optim.moments bf16 stores them; the experts' weight gradients in bf16 with
 * EXPERT_GRADS=bf16, as optim.expert_grads bf16; the masters as their bf16 copies and low
 * halves with MASTER=split, as optim.master split) on random tokens, no recomputation, under
 * the bf16 recipe or the one named by the environment variable RECIPE (bf16, fp8-block, mxfp8;
 * WGRAD=x-tiles with fp8-block: precision.fp8_wgrad x-tiles).
 * LR=x sets AdamW's learning rate (default 3e-4, no warm-up: the model drifts from its init
 * while it is timed; a tiny LR keeps it there with the same work, and the recipes' ratio came
 * out the same both ways on an H100, 2026-12-06). ACCUM=n (1 to 64, default
 * 1) makes a step n micro-batches of the preset's tokens (or TOKENS=n's: a micro-batch of n
 * tokens, a multiple of the preset's sequence, for the recipes at larger batches), each
 * forward and backward adding its gradient, then one gradient norm and one AdamW, as
 * train.micro_batch_tokens does in moe-train: the optimizer's share of a larger batch (tokens/s
 * counts all n). Pass 1,
 * unprofiled: one warm-up step, then the median of STEPS timed steps (default 3): tokens/s,
 * model TFLOP/s (6 x matmul weights touched per token + 6 x layers x seq x hidden,
 * moe_model_flops_per_token), MFU against 790 TFLOP/s (the bf16 GEMM rate measured on this
 * GPU) and the peak device memory the backend held, with the RESULT line's act_gib (the
 * activations the model allocated, exact) and scratch_est_gib (--dry-run's bound on the
 * backend's scratch). Pass 2: PROF_STEPS more steps (default 2,
 * 0 = none) through the profiling wrapper (moe/backend_prof.h), which waits for the GPU
 * around every op; its per-kind table gives the split, not the throughput. The one thing to
 * know: no data loading or checkpoint I/O is included, so the figure is the model's compute
 * path alone. The last line of pass 1 starts with "RESULT" (key=value, for scripts). With
 * NCU_STEP=1 the last timed step is a profiler capture range (bench/kernels/step_kernels.sh).
 * Exits 77 without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/backend_cuda.h"
#include "moe/backend_prof.h"
#include "moe/model.h"

typedef struct preset {
    const char *name;
    int64_t hidden, inter, layers, heads, kv, experts, topk, seq, tokens;
    double theta;
} preset;

static const preset k_presets[] = {
    {"mixtral8x7b-2L", 4096, 14336, 2, 32, 8, 8, 2, 4096, 8192, 1e6},
    {"og2-8x1b", 2048, 4096, 16, 16, 8, 8, 2, 8192, 16384, 5e5},
    {"dna-moe-1b", 1024, 2816, 16, 16, 8, 8, 2, 8192, 32768, 5e5},
    {"L0_sanity", 384, 1536, 2, 6, 6, 4, 2, 256, 16384, 1e4},
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The two-valued environment variable `name`: 0 when unset or `off`, 1 when `on`, else -1
 * after saying what was expected. */
static int env_choice(const char *name, const char *off, const char *on) {
    const char *v = getenv(name);
    if (!v || !strcmp(v, off)) return 0;
    if (!strcmp(v, on)) return 1;
    fprintf(stderr, "bench_train_gpu: %s=%s: expected %s or %s\n", name, v, off, on);
    return -1;
}

static int fail(const moe_err *err) {
    moe_err_print(err, "bench_train_gpu", stderr);
    return 1;
}

/* One training step as moe-train runs it; `st` counts from 0 (AdamW's step is st + 1). */
/* One forward pass as moe-embed runs it: hidden states of the final norm to the host. */
static moe_status forward_step(moe_model *m, const int32_t *tok, int B, int T, float *out,
                               moe_err *err) {
    return moe_model_hidden(m, tok, B, T, (int)m->cfg.num_hidden_layers, out, err);
}

static moe_status train_step(moe_model *m, const moe_backend *be, const int32_t *tok,
                             const int32_t *tgt, int B, int T, int accum, float lr, moe_buf am,
                             moe_buf av, int st, double *loss, moe_err *err) {
    moe_step_stats ss;
    moe_model_zero_grad(m);
    for (int k = 0; k < accum; k++)
        if (moe_model_forward(m, tok, tgt, NULL, B, T, &ss, err) != MOE_OK ||
            moe_model_backward(m, 1.0f / (float)accum, err) != MOE_OK)
            return err->status;
    double gn = moe_model_grad_sum_squares(m, 0, m->table.n_elems);
    float scale = gn > 1.0 ? (float)(1.0 / sqrt(gn)) : 1.0f;
    moe_optim_config opt;
    memset(&opt, 0, sizeof opt);
    opt.beta1 = 0.9, opt.beta2 = 0.95, opt.eps = 1e-8, opt.weight_decay = 0.1;
    opt.moments = am.dt;
    moe_model_adamw(m, 0, m->table.n_elems, am, av, &opt, lr, st + 1, scale);
    *loss = ss.loss;
    return be->synchronize(be, err);
}

int main(int argc, char **argv) {
    const preset *p = NULL;
    int steps = argc > 2 ? atoi(argv[2]) : 3;
    int prof_steps = argc > 3 ? atoi(argv[3]) : 2;
    int fwd = argc > 4 && !strcmp(argv[4], "forward");
    for (size_t i = 0; argc > 1 && i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(argv[1], k_presets[i].name)) p = &k_presets[i];
    if (!p || steps < 1 || steps > 100 || prof_steps < 0 || prof_steps > 100 ||
        (argc > 4 && !fwd)) {
        fprintf(stderr, "usage: bench_train_gpu PRESET [STEPS 1..100 [PROF_STEPS 0..100 "
                        "[forward [TOKENS [SEQ]]]]]\n"
                        "presets:");
        for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
            fprintf(stderr, " %s", k_presets[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    moe_recipe recipe = MOE_RECIPE_BF16;
    const char *rname = getenv("RECIPE");
    if (rname) {
        const moe_recipe known[] = {MOE_RECIPE_BF16, MOE_RECIPE_FP8_BLOCK, MOE_RECIPE_MXFP8};
        const size_t nk = sizeof known / sizeof known[0];
        size_t i = 0;
        while (i < nk && strcmp(rname, moe_recipe_name(known[i])) != 0)
            i++;
        if (i == nk) {
            fprintf(stderr, "bench_train_gpu: RECIPE=%s: expected bf16, fp8-block or mxfp8\n",
                    rname);
            return 2;
        }
        recipe = known[i];
    }
    const int mb = env_choice("MOMENTS", "fp32", "bf16"),
              gb = env_choice("EXPERT_GRADS", "fp32", "bf16"),
              sp = env_choice("MASTER", "fp32", "split");
    const int xt = env_choice("WGRAD", "blocks", "x-tiles");
    if (mb < 0 || gb < 0 || sp < 0 || xt < 0) return 2;
    if (xt && recipe != MOE_RECIPE_FP8_BLOCK) {
        fprintf(stderr, "bench_train_gpu: WGRAD=x-tiles is an option of RECIPE=fp8-block\n");
        return 2;
    }
    if (xt) recipe = MOE_RECIPE_FP8_BLOCK_XT;
    const moe_dtype mdt = mb ? MOE_DTYPE_BF16 : MOE_DTYPE_F32,
                    gdt = gb ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    const moe_master master = sp ? MOE_MASTER_SPLIT : MOE_MASTER_FP32;
    const char *aname = getenv("ACCUM");
    char *aend = NULL;
    const long an = aname ? strtol(aname, &aend, 10) : 1;
    if ((aname && (aend == aname || *aend)) || an < 1 || an > 64 || (fwd && an != 1)) {
        fprintf(stderr, "bench_train_gpu: ACCUM=%s: expected 1 to 64 (1 with forward)\n", aname);
        return 2;
    }
    const int accum = (int)an;
    /* TOKENS=n: a training micro-batch of n tokens (whole rows of the preset's sequence) */
    const char *tname = getenv("TOKENS");
    char *tend = NULL;
    const int64_t train_tokens = tname ? strtoll(tname, &tend, 10) : p->tokens;
    if (tname && (fwd || *tend || train_tokens < p->seq || train_tokens % p->seq != 0)) {
        fprintf(stderr,
                "bench_train_gpu: TOKENS=%s: expected a multiple of the preset's sequence %lld "
                "(training only: forward takes TOKENS as an argument)\n",
                tname, (long long)p->seq);
        return 2;
    }
    const char *lname = getenv("LR");
    char *lend = NULL;
    const float lr = lname ? strtof(lname, &lend) : 3e-4f;
    if ((lname && (lend == lname || *lend)) || !(lr >= 0.0f && lr < 1.0f)) {
        fprintf(stderr, "bench_train_gpu: LR=%s: expected a learning rate in [0, 1)\n", lname);
        return 2;
    }
    if (moe_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *be = moe_backend_cuda(&err);
    if (!be) return fail(&err);
    moe_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 256;
    c.hidden_size = p->hidden;
    c.intermediate_size = p->inter;
    c.num_hidden_layers = p->layers;
    c.num_attention_heads = p->heads;
    c.num_key_value_heads = p->kv;
    c.num_local_experts = p->experts;
    c.num_experts_per_tok = p->topk;
    c.max_position_embeddings = p->seq;
    c.rope_theta = p->theta;
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.02;
    c.router_z_loss_coef = 0.001;
    c.initializer_range = 0.02;
    int64_t tokens = fwd && argc > 5 ? atoll(argv[5]) : train_tokens;
    int T = fwd && argc > 6 ? atoi(argv[6]) : (int)p->seq;
    int B = T > 0 && T <= p->seq ? (int)(tokens / T) : 0;
    if (B < 1) {
        fprintf(stderr, "bench_train_gpu: need 1 <= SEQ <= %lld and TOKENS >= SEQ\n",
                (long long)p->seq);
        return 2;
    }
    moe_model m;
    memset(&m, 0, sizeof m);
    double t0 = now_s();
    moe_status cst = fwd ? moe_model_create_forward_only(&m, &c, recipe, be, B, T, &err)
                         : moe_model_create(&m, &c, recipe, MOE_RECOMPUTE_NONE, be, B, T, &err);
    if (cst == MOE_OK && !fwd) cst = moe_model_set_expert_grads(&m, gdt, &err);
    if (cst == MOE_OK && !fwd) cst = moe_model_set_master(&m, master, &err);
    if (cst != MOE_OK) return fail(&err);
    moe_model_init_weights(&m, 1);
    int64_t n = m.table.n_elems;
    size_t mbytes = (size_t)n * moe_dtype_size(mdt);
    moe_buf am = moe_buf_of(fwd ? NULL : be->alloc(be, mbytes), mdt),
            av = moe_buf_of(fwd ? NULL : be->alloc(be, mbytes), mdt);
    float *out = fwd ? malloc((size_t)B * T * (size_t)c.hidden_size * sizeof(float)) : NULL;
    if ((!fwd && (!am.p || !av.p)) || (fwd && !out) || be->synchronize(be, &err) != MOE_OK) {
        if (err.status == MOE_OK)
            moe_err_set(&err, MOE_ERR_RUNTIME, NULL, "no memory for AdamW state");
        return fail(&err);
    }
    double t_init = now_s() - t0;
    int32_t *tok = malloc((size_t)B * T * sizeof(int32_t)),
            *tgt = malloc((size_t)B * T * sizeof(int32_t));
    uint64_t s = 42;
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % 4); /* DNA-like: four letters */
    }
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
    double *times = malloc((size_t)(steps + 1) * sizeof(double)), loss = 0.0;
    /* NCU_STEP=1: the last timed step is the profiler's capture range (ncu --profile-from-start
       off: bench/kernels/step_kernels.sh) */
    const int ncu_step = getenv("NCU_STEP") && strcmp(getenv("NCU_STEP"), "1") == 0;
    for (int st = 0; st <= steps; st++) { /* st 0: warm-up */
        if (ncu_step && st == steps) moe_cuda_profile_range(be, 1);
        double a = now_s();
        if ((fwd ? forward_step(&m, tok, B, T, out, &err)
                 : train_step(&m, be, tok, tgt, B, T, accum, lr, am, av, st, &loss, &err)) !=
            MOE_OK)
            return fail(&err);
        times[st] = now_s() - a;
        if (ncu_step && st == steps) moe_cuda_profile_range(be, 0);
    }
    qsort(times + 1, (size_t)steps, sizeof(double), cmp_double);
    double med = times[1 + steps / 2], tps = (double)accum * B * T / med;
    double tflops = moe_model_flops_per_token(&c, T) * (fwd ? 1.0 / 3.0 : 1.0) * tps * 1e-12;
    size_t cur = 0, peak = 0;
    be->memory(be, &cur, &peak);
    double peak_gib = (double)peak / (1024.0 * 1024.0 * 1024.0);
    printf("| %s %s %s | %lld params | %d x %d x %d tokens | %.1f ms/step | %.0f tokens/s | %.1f "
           "TFLOP/s | MFU %.1f%% | peak %.1f GiB | init %.1f s | loss %.3f |\n",
           p->name, fwd ? "forward" : "train", moe_recipe_name(recipe), (long long)n, accum, B, T,
           med * 1e3, tps, tflops, 100.0 * tflops / 790.0, peak_gib, t_init, loss);
    /* the activations the model allocated (exact) and what the backend held beyond all its
     * be->alloc buffers at the peak: its scratch */
    moe_model_memory mem;
    moe_model_memory_estimate(&c, recipe, MOE_RECOMPUTE_NONE, B, T, 1, NULL, mdt, gdt, master,
                              &mem);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("RESULT preset=%s mode=%s recipe=%s wgrad=%s moments=%s expert_grads=%s master=%s "
           "params=%lld accum=%d lr=%g tokens_per_step=%d step_ms=%.2f tokens_per_s=%.0f "
           "model_tflops=%.2f mfu_pct=%.2f peak_gib=%.2f act_gib=%.2f scratch_est_gib=%.2f "
           "steps=%d loss=%.4f\n",
           p->name, fwd ? "forward" : "train", moe_recipe_name(recipe),
           moe_recipe_wgrad_tiles(recipe) ? "x-tiles" : "blocks", moe_moments_name(mdt),
           moe_moments_name(gdt), moe_master_name(master), (long long)n, accum, lr, accum * B * T,
           med * 1e3, tps, tflops, 100.0 * tflops / 790.0, peak_gib, (double)mem.activations / gib,
           (double)mem.gpu_scratch / gib, steps, loss);
    fflush(stdout);

    if (prof_steps > 0) {
        /* Pass 2: the same model, its ops routed through the profiling wrapper (whose memory
         * functions forward to `be`, so buffers stay valid); m.be is restored before free. */
        const moe_backend *prof = moe_backend_prof_wrap(be, &err);
        if (!prof) return fail(&err);
        m.be = prof;
        double a = now_s();
        for (int st = 0; st < prof_steps; st++)
            if ((fwd ? forward_step(&m, tok, B, T, out, &err)
                     : train_step(&m, prof, tok, tgt, B, T, accum, lr, am, av, steps + 1 + st,
                                  &loss, &err)) != MOE_OK)
                return fail(&err);
        double wall = now_s() - a;
        m.be = be;
        moe_backend_prof_stats ps;
        moe_backend_prof_get(prof, &ps);
        printf("\nTime per op kind, %s, mean of %d profiled steps (the GPU is synchronised "
               "before and after every op, so a profiled step takes %.1f ms against %.1f ms "
               "unprofiled; the split is what these figures are for):\n\n",
               p->name, prof_steps, wall / prof_steps * 1e3, med * 1e3);
        moe_backend_prof_print(&ps, prof_steps, wall, stdout);
        printf("PROF preset=%s profiled_step_ms=%.2f syncs_per_step=%.0f", p->name,
               wall / prof_steps * 1e3, (double)ps.host_syncs / prof_steps);
        for (int k = 0; k < MOE_PROF_KIND_COUNT; k++) {
            double sec = moe_backend_prof_kind_seconds(&ps, (moe_prof_kind)k, NULL);
            printf(" kind%d_ms=%.2f", k, sec / prof_steps * 1e3);
        }
        printf("\n");
        moe_backend_prof_free(prof);
    }
    free(times), free(tok), free(tgt), free(out);
    be->free(be, am.p), be->free(be, av.p);
    moe_model_free(&m);
    be->destroy(be);
    return 0;
}
