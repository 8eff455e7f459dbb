/* train_dryrun: moe-train --dry-run (moe/train.h) - the resolved config, then parameter
 * counts, training FLOPs and the memory estimate of one rank at the configured parallel.dp
 * and parallel.ep (moe_model_memory_estimate, with the trainer's ZeRO-1 share of the AdamW
 * state), without touching data or a run directory. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/model.h"
#include "moe/train.h"

/* b bytes as "12.3 GiB" into buf [n]. */
static void human_bytes(char *buf, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4)
        b /= 1024, i++;
    snprintf(buf, n, "%.1f %s", b, u[i]);
}

moe_status moe_train_dry_run(const moe_config *cfg, FILE *out, moe_err *err) {
    moe_status st = moe_config_validate(cfg, err);
    if (st != MOE_OK) return st;
    st = moe_config_write_yaml(cfg, out, err);
    if (st != MOE_OK) return st;
    const moe_train_config *tc = &cfg->train;
    int64_t total, active, micro_seqs, n_micro;
    moe_config_micro_batch(cfg, &micro_seqs, &n_micro);
    moe_model_count_params(&cfg->model, &total, &active);
    double fpt = moe_model_flops_per_token(&cfg->model, tc->seq_len);
    uint8_t *skip = NULL; /* precision.skip_layers: those layers have no fp8 copies */
    if (cfg->precision.skip_layers[0]) {
        skip = malloc((size_t)cfg->model.num_hidden_layers);
        if (!skip) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of host memory");
        if ((st = moe_config_skip_layers(cfg, skip, err)) != MOE_OK) {
            free(skip);
            return st;
        }
    }
    moe_model_memory mem;
    moe_model_memory_estimate(&cfg->model, moe_config_recipe(cfg), tc->recompute, micro_seqs,
                              tc->seq_len, (int)cfg->parallel.ep, skip, cfg->optim.moments,
                              cfg->optim.expert_grads, cfg->optim.master, &mem);
    free(skip);
    /* ZeRO-1: the dense part's AdamW state is sharded over all ranks, the experts' over the
     * dp replicas of the shard (m and v of each expert parameter, optim.moments' bytes each) */
    int64_t world = cfg->parallel.dp * cfg->parallel.ep;
    int64_t xopt = 2 * mem.expert_elems * (int64_t)moe_dtype_size(cfg->optim.moments);
    int64_t opt = (mem.optimizer - xopt) / world + xopt / cfg->parallel.dp;
    int64_t total_mem = mem.total - mem.optimizer + opt;
    char w[160], w16[64] = "", g[48], a[32], o[32], sum[32], gs[32], gt[32];
    human_bytes(w, sizeof w, (double)mem.params);
    if (cfg->optim.master == MOE_MASTER_SPLIT) /* say what the masters hold */
        snprintf(w + strlen(w), sizeof w - strlen(w),
                 " (optim.master split: fp32 masters of the norms, embeddings and router gates, "
                 "the low 16 bits of the others, whose high 16 are their bf16 copies)");
    human_bytes(g, sizeof g, (double)mem.grads);
    if (cfg->optim.expert_grads != MOE_DTYPE_F32) /* say which part is bf16 */
        snprintf(g + strlen(g), sizeof g - strlen(g), " (experts' %s)",
                 moe_moments_name(cfg->optim.expert_grads));
    if (mem.weight_copies > 0) {
        char c[32];
        human_bytes(c, sizeof c, (double)mem.weight_copies);
        snprintf(w16, sizeof w16, " + bf16 weight copies %s", c);
    }
    if (mem.fp8_copies > 0) {
        char c[32];
        human_bytes(c, sizeof c, (double)mem.fp8_copies);
        snprintf(w16, sizeof w16, " + fp8-block weight copies %s", c);
    }
    human_bytes(o, sizeof o, (double)opt);
    human_bytes(a, sizeof a, (double)mem.activations);
    human_bytes(sum, sizeof sum, (double)total_mem);
    human_bytes(gs, sizeof gs, (double)mem.gpu_scratch); /* the peak on a CUDA device */
    human_bytes(gt, sizeof gt, (double)(total_mem + mem.gpu_scratch));
    fprintf(out, "\n# --dry-run summary\n");
    fprintf(out, "# parameters: %" PRId64 " total, %" PRId64 " active per token\n", total, active);
    fprintf(out,
            "# training FLOPs: %.4g per token (seq_len %" PRId64 "), %.4g per step of %" PRId64
            " tokens, %.4g for %" PRId64 " steps\n",
            fpt, tc->seq_len, fpt * (double)tc->global_batch_tokens, tc->global_batch_tokens,
            fpt * (double)tc->global_batch_tokens * (double)tc->steps, tc->steps);
    fprintf(out,
            "# batch: %" PRId64 " micro-step(s) of %" PRId64 " sequences x %" PRId64
            " tokens, shared by %" PRId64 " rank(s); memory below is per rank\n",
            n_micro, micro_seqs, tc->seq_len, cfg->parallel.dp * cfg->parallel.ep);
    fprintf(out,
            "# memory estimate: weights %s%s + gradients %s + AdamW moments %s (%s, ZeRO-1 "
            "share) + activations %s (train.recompute %s) = %s per rank; on a CUDA device + %s "
            "backend scratch = %s peak\n",
            w, w16, g, o, moe_moments_name(cfg->optim.moments), a,
            moe_recompute_name(tc->recompute), sum, gs, gt);
    if (mem.gpu_scratch_other != mem.gpu_scratch) { /* fp8-block: the expert operands' place */
        human_bytes(gs, sizeof gs, (double)mem.gpu_scratch_other);
        human_bytes(gt, sizeof gt, (double)(total_mem + mem.gpu_scratch_other));
        fprintf(out,
                "# the CUDA figure is a compute capability 9.0 device's (H100, H200), whose "
                "expert products read fp8-block activation pairs; on later GPUs + %s backend "
                "scratch = %s peak\n",
                gs, gt);
    }
    return fflush(out) == 0 ? MOE_OK : moe_err_errno(err, "(stdout)", "write failed");
}
