/* train: the training loop (moe/train.h). Setup (data, model, run directory, resume:
 * train_setup.c), then per step: micro-steps of forward/backward, gradient norm, clipping,
 * AdamW, metrics, evaluation, checkpoint. Everything the loop reads between steps lives in
 * `trainer` (trainer.h). */
#include "moe/train.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/ckpt.h"
#include "moe/comm.h"
#include "moe/dataloader.h"
#include "moe/fileio.h"
#include "moe/log.h"
#include "moe/metrics.h"
#include "moe/schedule.h"
#include "moe/shard.h"
#include "train/train_health.h"
#include "train/train_signal.h"
#include "train/trainer.h"

/* ---- one step ---- */

typedef struct step_metrics {
    double loss, ce, aux, z, entropy, grad_norm, lr, seconds, val_loss;
    double *load;        /* [layers] max/mean tokens per expert */
    int bad;             /* non-finite loss or gradient norm: the update was skipped */
    moe_comm_stats comm; /* this rank's collectives during the step */
} step_metrics;

static moe_status evaluate(trainer *t, double *val_loss, moe_err *err) {
    int64_t n = t->vdl.n_samples;
    if (t->cfg.train.eval_tokens > 0) {
        int64_t want = (t->cfg.train.eval_tokens + t->T - 1) / t->T;
        if (want < n) n = want;
    }
    double ce = 0, w = 0;
    for (int64_t i = 0; i < n; i += t->B_micro) {
        int64_t b = n - i < t->B_micro ? n - i : t->B_micro;
        for (int64_t j = 0; j < b; j++)
            moe_dataloader_get(&t->vdl, i + j, t->tokens + j * t->T, t->targets + j * t->T, NULL);
        moe_step_stats st;
        moe_status s =
            moe_model_forward(&t->model, t->tokens, t->targets, NULL, (int)b, (int)t->T, &st, err);
        if (s != MOE_OK) return s;
        ce += st.ce_sum;
        w += st.weight_sum;
    }
    *val_loss = w > 0 ? ce / w : NAN;
    return MOE_OK;
}

/* Every rank's new masters of its slices to every rank of group g: slice r is the table
 * elements [first + slices[r], first + slices[r + 1]) (slices [gsize + 1]: dslice from 0,
 * xslice from dense_elems). The fp32 masters move as fp32: the slices of param_mem, or where
 * it packs the tensors that stay fp32 (optim.master split), each slice's part of them; a
 * split master's high halves move at the slices of param16_mem, its low halves at each
 * slice's part of param_lo_mem (moe_model_f32_masters_before counts the parts). */
static moe_status gather_masters(trainer *t, moe_comm_group g, int64_t first, const int64_t *slices,
                                 moe_err *err) {
    moe_model *mo = &t->model;
    int n = t->comm->gsize[g];
    int64_t *f = malloc((size_t)(2 * (n + 1)) * sizeof *f), *l = f ? f + n + 1 : NULL;
    if (!f) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    int64_t f0 = moe_model_f32_masters_before(mo, first), l0 = first - f0;
    for (int r = 0; r <= n; r++) { /* each slice's part of param_mem and of param_lo_mem */
        int64_t x = first + slices[r], fx = moe_model_f32_masters_before(mo, x);
        f[r] = fx - f0, l[r] = x - fx - l0;
    }
    /* the same on every rank: a part no rank holds any of (f[n] or l[n] 0) is not exchanged */
    moe_status st = MOE_OK;
    if (f[n] > 0) st = moe_comm_allgather(t->comm, g, mo->param_mem + f0, f, MOE_COMM_F32, err);
    if (st == MOE_OK && mo->param_lo_mem && l[n] > 0)
        st = moe_comm_allgather(t->comm, g, mo->param16_mem + first, slices, MOE_COMM_U16, err);
    if (st == MOE_OK && mo->param_lo_mem && l[n] > 0)
        st = moe_comm_allgather(t->comm, g, mo->param_lo_mem + l0, l, MOE_COMM_U16, err);
    free(f);
    return st;
}

static moe_status train_step(trainer *t, int64_t step, step_metrics *sm, moe_err *err) {
    const moe_config *c = &t->cfg;
    const moe_model_config *mc = &c->model;
    double t0 = moe_time_now();
    int64_t L = mc->num_hidden_layers, E = mc->num_local_experts;
    moe_model_zero_grad(&t->model);
    double ce_sum = 0, w_sum = 0, aux = 0, z = 0, ent = 0;
    int64_t *load = calloc((size_t)(L * E), sizeof *load);
    if (!load) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    (void)moe_comm_stats_take(t->comm); /* the step's own collectives from here */
    moe_status st = MOE_OK;
    for (int64_t k = 0; k < t->accum && st == MOE_OK; k++) {
        if (k % t->world != t->rank) { /* another rank's micro-batch: not read here */
            moe_dataloader_skip(&t->dl, t->B_micro);
            continue;
        }
        moe_dataloader_next(&t->dl, t->B_micro, t->tokens, t->targets, t->weights);
        moe_step_stats ss;
        st = moe_model_forward(&t->model, t->tokens, t->targets, t->weights, (int)t->B_micro,
                               (int)t->T, &ss, err);
        if (st == MOE_OK) st = moe_model_backward(&t->model, 1.0f / (float)t->accum, err);
        if (st != MOE_OK) break;
        ce_sum += ss.ce_sum;
        w_sum += ss.weight_sum;
        aux += ss.aux_loss / (double)t->accum;
        z += ss.z_loss / (double)t->accum;
        ent += ss.router_entropy / (double)t->accum;
        for (int64_t i = 0; i < L * E; i++)
            load[i] += ss.expert_tokens[i];
    }
    if (st == MOE_OK) st = t->be->synchronize(t->be, err);
    /* the global batch's gradient, each rank summing its ZeRO-1 slices: the dense part over
     * every rank, the experts over the dp replicas of this shard */
    moe_model *mo = &t->model; /* its gradients: zero on a rank that ran no micro-batch */
    int64_t dense = mo->table.dense_elems, dn = t->dhi - t->dlo;
    moe_buf xgrad = moe_model_grads_at(mo, dense);
    if (st == MOE_OK)
        st = moe_comm_reduce_scatter(t->comm, MOE_COMM_WORLD, moe_model_grads_at(mo, 0).p,
                                     t->dslice, MOE_COMM_F32, err);
    if (st == MOE_OK) /* bf16 expert gradients: summed in bf16, as NCCL and Megatron do */
        st =
            moe_comm_reduce_scatter(t->comm, MOE_COMM_DP, xgrad.p, t->xslice,
                                    xgrad.dt == MOE_DTYPE_BF16 ? MOE_COMM_BF16 : MOE_COMM_F32, err);
    /* the statistics: the slices' squares give the global norm (each element owned once) */
    double sums[6] = {ce_sum, w_sum, aux, z, ent, 0};
    if (t->dhi == t->xlo) /* one range (one process) */
        sums[5] = moe_model_grad_sum_squares(mo, t->dlo, t->xhi);
    else
        sums[5] = moe_model_grad_sum_squares(mo, t->dlo, t->dhi) +
                  moe_model_grad_sum_squares(mo, t->xlo, t->xhi);
    if (st == MOE_OK) st = moe_comm_allreduce(t->comm, MOE_COMM_WORLD, sums, 6, MOE_COMM_F64, err);
    if (st == MOE_OK)
        st = moe_comm_allreduce(t->comm, MOE_COMM_WORLD, load, L * E, MOE_COMM_I64, err);
    ce_sum = sums[0], w_sum = sums[1], aux = sums[2], z = sums[3], ent = sums[4];
    if (st != MOE_OK) {
        free(load);
        return st;
    }
    t->ts.tokens_seen += t->accum * t->B_micro * t->T;
    double norm = sqrt(sums[5]);
    double lr = moe_schedule_lr(&c->optim, step, c->train.steps);
    float scale = 1.0f;
    if (c->optim.grad_clip > 0 && norm > c->optim.grad_clip)
        scale = (float)(c->optim.grad_clip / norm);
    double ce = w_sum > 0 ? ce_sum / w_sum : NAN;
    sm->bad = !isfinite(moe_model_loss(mc, ce, aux, z)) ||
              !isfinite(norm); /* the same on every rank: the sums are global */
    /* With several ranks every weight copy is rewritten from the all-gathered masters before
     * the next forward (other ranks' slices arrive there): marked stale now, so that AdamW
     * writes no copies of this rank's slices that the refresh would only write again. */
    if (t->world > 1) moe_model_params_written(&t->model);
    if (!sm->bad) { /* this rank's slices */
        moe_model_adamw(&t->model, t->dlo, t->dhi, t->m, t->v, &c->optim, lr, step, scale);
        moe_model_adamw(&t->model, t->xlo, t->xhi, moe_buf_at(t->m, dn), moe_buf_at(t->v, dn),
                        &c->optim, lr, step, scale);
    }
    st = t->be->synchronize(t->be, err);
    if (st == MOE_OK && !sm->bad) /* every rank gets the new weights of its tensors */
        st = gather_masters(t, MOE_COMM_WORLD, 0, t->dslice, err);
    if (st == MOE_OK && !sm->bad) st = gather_masters(t, MOE_COMM_DP, dense, t->xslice, err);
    sm->ce = ce;
    sm->aux = aux;
    sm->z = z;
    sm->loss = moe_model_loss(mc, sm->ce, aux, z);
    sm->entropy = ent;
    sm->grad_norm = norm;
    sm->lr = lr;
    for (int64_t l = 0; l < L; l++) {
        int64_t mx = 0, sum = 0;
        for (int64_t e = 0; e < E; e++) {
            sum += load[l * E + e];
            if (load[l * E + e] > mx) mx = load[l * E + e];
        }
        sm->load[l] = sum > 0 ? (double)mx / ((double)sum / (double)E) : 0;
    }
    free(load);
    sm->seconds = moe_time_now() - t0;
    sm->comm = moe_comm_stats_take(t->comm);
    return st;
}

/* One JSON line of metrics; returns the compact text (malloc'ed) or NULL. */
static char *metrics_line(const trainer *t, int64_t step, const step_metrics *sm) {
    json_t *o = json_object(), *load = json_array();
    const double ln2 = 0.69314718055994530942;
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "loss", json_real(sm->loss));
    json_object_set_new(o, "ce_loss", json_real(sm->ce));
    json_object_set_new(o, "ppl", json_real(exp(sm->ce)));
    json_object_set_new(o, "bits_per_base", json_real(sm->ce / ln2 / t->bases_per_token));
    json_object_set_new(o, "aux_loss", json_real(sm->aux));
    json_object_set_new(o, "z_loss", json_real(sm->z));
    json_object_set_new(o, "router_entropy", json_real(sm->entropy));
    for (int64_t l = 0; l < t->cfg.model.num_hidden_layers; l++)
        json_array_append_new(load, json_real(sm->load[l]));
    json_object_set_new(o, "expert_load_max_over_mean", load);
    json_object_set_new(o, "grad_norm", json_real(sm->grad_norm));
    json_object_set_new(o, "lr", json_real(sm->lr));
    json_object_set_new(o, "tokens", json_integer(t->ts.tokens_seen));
    double tps = sm->seconds > 0 ? (double)(t->accum * t->B_micro * t->T) / sm->seconds : 0;
    json_object_set_new(o, "tokens_per_s", json_real(tps));
    json_object_set_new(o, "step_time_s", json_real(sm->seconds));
    if (t->world > 1) { /* rank 0's collectives: all of them, then the expert all-to-alls */
        double comm = 0.0;
        for (int g = 0; g < MOE_COMM_N_GROUPS; g++)
            comm += sm->comm.seconds[g];
        json_object_set_new(o, "comm_s", json_real(comm));
        json_object_set_new(o, "alltoall_s", json_real(sm->comm.a2a_seconds));
        json_object_set_new(o, "alltoall_GBps",
                            json_real(sm->comm.a2a_seconds > 0
                                          ? (double)sm->comm.a2a_bytes / sm->comm.a2a_seconds / 1e9
                                          : 0.0));
    }
    char now[32];
    moe_time_iso8601(now, sizeof now);
    json_object_set_new(o, "time", json_string(now));
    json_object_set_new(o, "elapsed_s", json_real(moe_time_now() - t->t_start));
    if (isfinite(sm->val_loss)) {
        json_object_set_new(o, "val_loss", json_real(sm->val_loss));
        json_object_set_new(o, "val_ppl", json_real(exp(sm->val_loss)));
        json_object_set_new(o, "val_bits_per_base",
                            json_real(sm->val_loss / ln2 / t->bases_per_token));
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

static moe_status emit_metrics(trainer *t, int64_t step, const step_metrics *sm, moe_err *err) {
    char *line = metrics_line(t, step, sm);
    if (!line) return moe_err_set(err, MOE_ERR_RUNTIME, t->metrics_path, "cannot encode metrics");
    free(t->ts.last_metrics);
    t->ts.last_metrics = line;
    moe_outfile *outs[2] = {&t->metrics, &t->json}; /* each error names its own file */
    for (int i = 0; i < 2; i++) {
        if (!outs[i]->fp) continue;
        if (moe_outfile_write(outs[i], line, strlen(line), err) != MOE_OK ||
            moe_outfile_write(outs[i], "\n", 1, err) != MOE_OK ||
            moe_outfile_flush(outs[i], err) != MOE_OK)
            return err->status;
    }
    const double bits = 0.69314718055994530942 * t->bases_per_token; /* nats per bit/base */
    return moe_metrics_history_add(&t->hist, step, sm->ce / bits, sm->val_loss / bits, err);
}

/* Writes a checkpoint; every rank calls it. The layout is parallel.ep's (moe/ckpt.h): the
 * ep ranks of expert group 0 each write their shard, the moments gathered from the slices
 * (dense ones over every rank to rank 0, each shard's over its dp replicas); rank 0 begins
 * the checkpoint (its temporary directory goes to the others), writes the rest once all
 * shards are there, and commits. */
static moe_status save(trainer *t, moe_err *err) {
    moe_dataloader_position(&t->dl, &t->ts.data_epoch, &t->ts.data_index);
    moe_train_health_save(&t->health, &t->ts);
    double t0 = moe_time_now();
    const moe_comm *c = t->comm;
    int64_t dense = t->model.table.dense_elems, dn = t->dhi - t->dlo;
    moe_dtype mdt = t->m.dt; /* the moments move in their own type: bf16 ones as 2-byte units */
    moe_comm_dtype cdt = mdt == MOE_DTYPE_BF16 ? MOE_COMM_U16 : MOE_COMM_F32;
    size_t bytes = (size_t)t->model.table.n_elems * moe_dtype_size(mdt);
    int writer = c->grank[MOE_COMM_DP] == 0, whole = t->world == 1;
    moe_buf m = whole ? t->m : moe_buf_of(writer ? t->be->alloc(t->be, bytes) : NULL, mdt);
    moe_buf v = whole ? t->v : moe_buf_of(writer ? t->be->alloc(t->be, bytes) : NULL, mdt);
    moe_status st = MOE_OK;
    if (writer && (!m.p || !v.p))
        st = moe_err_set(err, MOE_ERR_RUNTIME, t->run_dir, "out of memory");
    for (int i = 0; i < 2 && st == MOE_OK && !whole; i++) {
        moe_buf full = i ? v : m, own = i ? t->v : t->m;
        st = moe_comm_gather(c, MOE_COMM_WORLD, full.p, own.p, t->dslice, 0, cdt, err);
        if (st == MOE_OK)
            st = moe_comm_gather(c, MOE_COMM_DP, full.p ? moe_buf_at(full, dense).p : NULL,
                                 moe_buf_at(own, dn).p, t->xslice, 0, cdt, err);
    }
    moe_ckpt_writer w;
    memset(&w, 0, sizeof w);
    moe_status begun = MOE_ERR_RUNTIME; /* rank 0: whether w holds a temporary directory */
    if (st == MOE_OK && t->rank == 0) st = begun = moe_ckpt_begin(&w, t->run_dir, t->ts.step, err);
    if (st == MOE_OK) /* the temporary directory's name to the other writers */
        st = moe_comm_broadcast(c, MOE_COMM_WORLD, w.tmp_dir, sizeof w.tmp_dir, MOE_COMM_BYTE, 0,
                                err);
    if (st == MOE_OK && writer)
        st = moe_train_write_shard(w.tmp_dir, c->grank[MOE_COMM_EP], t->ep, &t->model,
                                   moe_cbuf_from(m), moe_cbuf_from(v), t->ts.step, err);
    if (st == MOE_OK) st = moe_comm_barrier(c, MOE_COMM_WORLD, err); /* every shard written */
    if (st == MOE_OK && t->rank == 0)
        st = moe_train_finish_checkpoint(&w, t->cfg.checkpoint.keep, &t->cfg,
                                         moe_shardset_spec_json(t->data), &t->ts, err);
    else if (st != MOE_OK && begun == MOE_OK)
        moe_ckpt_abort(&w);
    if (st == MOE_OK && t->rank == 0)
        moe_log_debug("checkpoint of step %lld written in %.2f s", (long long)t->ts.step,
                      moe_time_now() - t0);
    if (!whole) {
        t->be->free(t->be, m.p);
        t->be->free(t->be, v.p);
    }
    return st;
}

/* Whether step (the run's last when `last`) ends with an evaluation. */
static int eval_due(const trainer *t, int64_t step, int last) {
    const moe_config *c = &t->cfg;
    return t->has_val && ((c->train.eval_every > 0 && step % c->train.eval_every == 0) || last);
}

/* Rank 0's part of a step: metrics, the log line, loss.svg (after an evaluation when
 * do_eval: sm->val_loss is set). */
static moe_status report(trainer *t, int64_t step, int last, int do_eval, step_metrics *sm,
                         const moe_progress *prog, const char *title, moe_err *err) {
    const moe_config *c = &t->cfg;
    moe_status st = emit_metrics(t, step, sm, err);
    if (st != MOE_OK) return st;
    int log_line = step % c->log.every == 0 || last;
    if (prog->tty && (log_line || do_eval)) fputs("\r\033[K", stderr); /* clear the bar */
    if (log_line)
        moe_log_info("step %lld/%lld loss %.4f (ce %.4f, %.3f bits/base) lr %.3g gnorm %.3f "
                     "%.0f tok/s",
                     (long long)step, (long long)c->train.steps, sm->loss, sm->ce,
                     sm->ce / 0.69314718055994530942 / t->bases_per_token, sm->lr, sm->grad_norm,
                     (double)(t->accum * t->B_micro * t->T) / (sm->seconds > 0 ? sm->seconds : 1));
    if (!do_eval) return MOE_OK;
    moe_log_info("step %lld: val_loss %.4f (%.3f bits/base)", (long long)step, sm->val_loss,
                 sm->val_loss / 0.69314718055994530942 / t->bases_per_token);
    return moe_metrics_write_charts(&t->hist, t->run_dir, title, err);
}

/* After step `step`: when a stop signal reached any rank (all ranks agree through one sum),
 * writes a checkpoint unless this step already did, logs why and sets *stopped. */
static moe_status stop_if_signalled(trainer *t, int64_t step, const moe_progress *prog,
                                    int *stopped, moe_err *err) {
    int64_t sig[2] = {moe_train_signal_pending(), 0};
    sig[1] = sig[0] != 0; /* how many ranks were signalled */
    moe_status st = moe_comm_allreduce(t->comm, MOE_COMM_WORLD, sig, 2, MOE_COMM_I64, err);
    if (st != MOE_OK || sig[1] == 0) return st;
    *stopped = 1;
    int every = (int)t->cfg.checkpoint.every;
    if (!(every > 0 && step % every == 0)) st = save(t, err);
    if (st != MOE_OK || t->rank != 0) return st;
    int mine = moe_train_signal_pending();
    if (prog->tty) fputs("\r\033[K", stderr);
    moe_log_info("%s: stopped after step %lld of %lld with a checkpoint in %s; continue with "
                 "--resume auto",
                 mine ? strsignal(mine) : "stop signal on another rank", (long long)step,
                 (long long)t->cfg.train.steps, t->run_dir);
    return MOE_OK;
}

static moe_status loop(trainer *t, moe_err *err) {
    const moe_config *c = &t->cfg;
    int64_t start = t->ts.step, L = c->model.num_hidden_layers;
    double *load = calloc((size_t)L, sizeof *load);
    if (!load) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    moe_progress prog;
    moe_progress_start(&prog, "train", "steps", t->end_step - start);
    if (t->rank != 0) prog.enabled = prog.tty = 0; /* rank 0 speaks for the run */
    char title[1100];
    snprintf(title, sizeof title, "moe-train: %.1000s", c->data.path);
    moe_status st = MOE_OK;
    int stopped = 0;
    for (int64_t step = start + 1; step <= t->end_step && st == MOE_OK; step++) {
        step_metrics sm = {.load = load, .val_loss = NAN};
        st = train_step(t, step, &sm, err);
        if (st != MOE_OK) break;
        t->ts.step = step;
        int last = step == t->end_step;
        if (sm.bad) { /* weights unchanged: a checkpoint below still holds good ones */
            char ck[MOE_CKPT_PATH_MAX] = "";
            int found = 0;
            moe_err sub;
            moe_err_clear(&sub);
            if (t->health.bad_in_row >= t->health.max_bad &&
                (moe_ckpt_latest(t->run_dir, ck, sizeof ck, &found, &sub) != MOE_OK || !found))
                ck[0] = '\0';
            st = moe_train_health_bad(&t->health, step, sm.loss, sm.grad_norm, ck, err);
        } else {
            t->health.bad_in_row = 0; /* every rank: they must agree on when to stop */
            int do_eval = eval_due(t, step, last);
            if (do_eval && t->evaluator) st = evaluate(t, &sm.val_loss, err);
            if (st == MOE_OK && t->rank == 0) moe_train_health_good(&t->health, step, sm.loss);
            if (st == MOE_OK && t->rank == 0)
                st = report(t, step, last, do_eval, &sm, &prog, title, err);
        }
        if (st == MOE_OK && ((c->checkpoint.every > 0 && step % c->checkpoint.every == 0) || last))
            st = save(t, err); /* every rank: the AdamW state is gathered */
        char extra[96];
        snprintf(extra, sizeof extra, "loss %.4f lr %.2e", sm.loss, sm.lr);
        moe_progress_update(&prog, step - start, extra);
        if (st == MOE_OK && !last) st = stop_if_signalled(t, step, &prog, &stopped, err);
        if (stopped) break;
    }
    if (st == MOE_OK && t->rank == 0) {
        moe_progress_finish(&prog, NULL);
        st = moe_metrics_write_charts(&t->hist, t->run_dir, title, err);
    }
    free(load);
    return st;
}

/* Releases what t holds; `failed`: the run ends in an error (NCCL communicators aborted). */
moe_status moe_train_run(const moe_config *cfg, const moe_train_opts *opts, moe_err *err) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.lock.fd = -1;
    t.t_start = moe_time_now();
    t.cfg = *cfg;
    t.run_dir = opts->run_dir && opts->run_dir[0] ? opts->run_dir : "run";
    if (opts->data_path && opts->data_path[0])
        snprintf(t.cfg.data.path, sizeof t.cfg.data.path, "%s", opts->data_path);
    moe_status st = moe_config_validate(&t.cfg, err);
    if (st != MOE_OK) return st;
    if (!t.cfg.data.path[0]) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "no training data given");
        moe_err_hint(err, "pass --data SHARDS (a .mtok file, a directory of them, a "
                          "manifest, or - for stdin) or set data.path in the config");
        return MOE_ERR_INPUT;
    }
    moe_comm_single(&t.single);
    t.comm = opts->comm ? opts->comm : &t.single;
    t.rank = t.comm->rank;
    t.world = t.comm->world;
    t.ep = (int)t.cfg.parallel.ep;
    t.T = t.cfg.train.seq_len;
    moe_config_micro_batch(&t.cfg, &t.B_micro, &t.accum);
    st = trainer_choose_device(&t, err);
    if (st == MOE_OK) st = trainer_check_parallel(&t, t.world, err);
    if (st == MOE_OK) st = moe_comm_split(t.comm, t.ep, t.cfg.parallel.timeout_s, err);
    if (st != MOE_OK) return st;
    /* ep > 1: every rank of expert group 0 runs the evaluation (its forward needs the whole
     * group), on the same samples; rank 0 reports */
    t.evaluator = t.ep > 1 ? t.comm->grank[MOE_COMM_DP] == 0 : t.rank == 0;
    t.end_step =
        opts->stop_at > 0 && opts->stop_at < t.cfg.train.steps ? opts->stop_at : t.cfg.train.steps;
    t.ts.seed = (uint64_t)t.cfg.train.seed;
    moe_train_health_init(&t.health, t.cfg.train.max_bad_steps, t.cfg.model.vocab_size);
    t.ts.data_shuffle = t.cfg.data.shuffle;

    st = trainer_open_backend(&t, opts->threads, err);
    if (st == MOE_OK) st = trainer_open_data(&t, err);
    if (st == MOE_OK) {
        t.ts.data_samples = t.dl.n_samples;
        t.ts.data_stream_tokens = t.dl.stream_tokens;
    }
    struct stat rd; /* an existing run directory is locked before its checkpoints are read */
    if (st == MOE_OK && t.rank == 0 && stat(t.run_dir, &rd) == 0 && S_ISDIR(rd.st_mode))
        st = moe_dirlock_take(&t.lock, t.run_dir, "moe-train", err);
    if (st == MOE_OK && !opts->resume) {
        int64_t *steps;
        int n;
        st = moe_ckpt_list(t.run_dir, &steps, &n, err);
        free(steps);
        if (st == MOE_OK && n > 0) {
            moe_err_set(err, MOE_ERR_INPUT, t.run_dir,
                        "the run directory already holds %d checkpoint(s)", n);
            moe_err_hint(err, "continue it with --resume auto, or choose a new directory with -o");
            st = MOE_ERR_INPUT;
        }
    }
    moe_model_ep mep = {.rank = t.comm->grank[MOE_COMM_EP],
                        .size = t.ep,
                        .alltoallv = trainer_ep_alltoallv,
                        .ctx = t.comm};
    if (st == MOE_OK)
        st = moe_model_create_ep(&t.model, &t.cfg.model, moe_config_recipe(&t.cfg),
                                 t.cfg.train.recompute, t.be, (int)t.B_micro, (int)t.T, &mep, err);
    if (st == MOE_OK) st = trainer_apply_skip_layers(&t, err);
    if (st == MOE_OK) st = moe_model_set_expert_grads(&t.model, t.cfg.optim.expert_grads, err);
    if (st == MOE_OK) st = moe_model_set_master(&t.model, t.cfg.optim.master, err);
    if (st == MOE_OK) st = moe_model_set_document_separator(&t.model, t.dl.doc_sep, err);
    if (st == MOE_OK) st = trainer_alloc_state(&t, err);
    if (st == MOE_OK) {
        moe_model_init_weights(&t.model, (uint64_t)t.cfg.train.seed);
        if (opts->resume) st = trainer_resume(&t, opts->resume, err);
        /* --init starts a run; a run that --resume found goes on from its own checkpoint */
        if (st == MOE_OK && opts->init && !t.resumed)
            st = trainer_init_weights(&t, opts->init, err);
    }
    if (st == MOE_OK && t.rank == 0) { /* rank 0 writes the run directory */
        st = moe_mkdirs(t.run_dir, err);
        if (st != MOE_OK) moe_err_hint(err, "choose a writable run directory with -o");
        if (st == MOE_OK && t.lock.fd < 0) /* a new one: locked when made */
            st = moe_dirlock_take(&t.lock, t.run_dir, "moe-train", err);
        if (st == MOE_OK)
            st = trainer_open_outputs(&t, opts->log_json ? opts->log_json : t.cfg.log.json, err);
        if (st == MOE_OK) st = moe_train_write_provenance(t.run_dir, opts->command, t.ts.step, err);
    }
    if (st == MOE_OK) {
        int64_t total, active;
        moe_model_count_params(&t.cfg.model, &total, &active);
        moe_log_info("model: %.3g M parameters (%.3g M active per token), %s backend, recipe %s; "
                     "data: %lld tokens, %lld samples of %lld per epoch; %lld x %lld tokens per "
                     "step",
                     total / 1e6, active / 1e6, t.be->name, moe_recipe_name(t.cfg.precision.recipe),
                     (long long)t.dl.stream_tokens, (long long)t.dl.n_samples, (long long)(t.T + 1),
                     (long long)t.accum, (long long)(t.B_micro * t.T));
        if (moe_recipe_format(t.cfg.precision.recipe) == MOE_RECIPE_MXFP8)
            moe_log_info("precision: mxfp8 runs its products on E4M3 values with an E8M0 scale per "
                         "32 (%s); the layers not in precision.skip_layers store ln1 and the "
                         "expert activations in MXFP8 and keep a bf16 residual stream "
                         "(docs/dtypes.md)",
                         t.be->mx_native     ? "on the GPU's MXFP8 tensor cores, bar products with "
                                               "a dimension not a multiple of 128, which run as "
                                               "bf16 products of their decoded values"
                         : t.be->bf16_native ? "as bf16 products of their decoded values: the GPU "
                                               "has no MXFP8 product before sm_100"
                                             : "emulated by the cpu backend");
        if (t.cfg.precision.recipe == MOE_RECIPE_FP8_BLOCK &&
            t.cfg.precision.fp8_wgrad == MOE_FP8_WGRAD_X_TILES)
            moe_log_info("precision: fp8-block takes the weight gradients' activations in 128 x "
                         "128 tiles, one scale a tile (precision.fp8_wgrad x-tiles; "
                         "docs/dtypes.md)");
        if (t.ts.step >= t.end_step)
            moe_log_info("nothing to do: the run is at step %lld of %lld", (long long)t.ts.step,
                         (long long)t.end_step);
        else if (!opts->stop_on_signals)
            st = loop(&t, err);
        else {
            moe_train_signals sigs;
            st = moe_train_signals_install(&sigs, t.cfg.train.stop_signal, err);
            if (st == MOE_OK) st = loop(&t, err);
            moe_train_signals_restore(&sigs);
        }
    }
    trainer_free(&t, st != MOE_OK);
    return st;
}
