/* ckpt_state: trainer_state.json, the part of a checkpoint that is neither tensors nor
 * config (moe/ckpt.h, moe_trainer_state): step, tokens seen, data position, seed, the last
 * step's metrics, the training loop's health watch (non-finite steps in a row, the loss mean)
 * and, for a run started by --init, the checkpoint it started from. Written by
 * moe-train's checkpoints and parsed by moe_ckpt_open, so the format lives in this one file. All
 * randomness is counter-based (Philox keyed by the seed), so the seed is the whole RNG state. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/ckpt.h"

#define STATE_FORMAT "moe-genomics trainer state"
#define STATE_VERSION 1

char *moe_ckpt_state_json(const moe_trainer_state *ts) {
    json_t *o = json_object(), *data = json_object(), *rng = json_object();
    json_object_set_new(o, "format", json_string(STATE_FORMAT));
    json_object_set_new(o, "version", json_integer(STATE_VERSION));
    json_object_set_new(o, "step", json_integer(ts->step));
    json_object_set_new(o, "tokens_seen", json_integer(ts->tokens_seen));
    json_object_set_new(data, "epoch", json_integer(ts->data_epoch));
    json_object_set_new(data, "index", json_integer(ts->data_index));
    json_object_set_new(data, "shuffle", json_boolean(ts->data_shuffle));
    json_object_set_new(data, "samples_per_epoch", json_integer(ts->data_samples));
    json_object_set_new(data, "stream_tokens", json_integer(ts->data_stream_tokens));
    json_object_set_new(o, "data", data);
    /* All randomness is counter-based (Philox keyed by the seed): the seed is the state. */
    json_object_set_new(rng, "algorithm", json_string("philox4x32-10"));
    json_object_set_new(rng, "seed", json_integer((json_int_t)ts->seed));
    json_object_set_new(o, "rng", rng);
    json_t *met = ts->last_metrics ? json_loads(ts->last_metrics, 0, NULL) : NULL;
    json_object_set_new(o, "last_metrics", met ? met : json_null());
    if (ts->init_from[0]) json_object_set_new(o, "init_from", json_string(ts->init_from));
    json_t *h = json_object();
    json_object_set_new(h, "bad_steps_in_row", json_integer(ts->health.bad_in_row));
    json_object_set_new(h, "good_steps", json_integer(ts->health.good));
    /* JSON has no NaN: a mean that is not finite (it never should be) restarts from zero */
    json_object_set_new(h, "loss_mean",
                        json_real(isfinite(ts->health.loss_mean) ? ts->health.loss_mean : 0.0));
    json_object_set_new(h, "loss_spiking", json_boolean(ts->health.spiking));
    json_object_set_new(h, "loss_rising", json_boolean(ts->health.rising));
    json_object_set_new(o, "health", h);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

static moe_status bad_state(moe_err *err, const char *path, const char *what) {
    moe_err_set(err, MOE_ERR_INPUT, path, "invalid trainer state: %s", what);
    moe_err_hint(err, "the checkpoint is damaged; resume from an older checkpoint");
    return MOE_ERR_INPUT;
}

static int get_i64(json_t *o, const char *key, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return 0;
    *out = json_integer_value(v);
    return 1;
}

/* The optional "health" object (absent in files of older moe-trains: all zero); 0 when it is
 * there but malformed. */
static int get_health(json_t *o, moe_trainer_state *ts) {
    json_t *h = json_object_get(o, "health");
    if (!h) return 1;
    json_t *mean = json_object_get(h, "loss_mean"), *spiking = json_object_get(h, "loss_spiking"),
           *rising = json_object_get(h, "loss_rising");
    if (!json_is_object(h) || !get_i64(h, "bad_steps_in_row", &ts->health.bad_in_row) ||
        !get_i64(h, "good_steps", &ts->health.good) || ts->health.bad_in_row < 0 ||
        ts->health.good < 0 || !json_is_number(mean) || !json_is_boolean(spiking) ||
        !json_is_boolean(rising))
        return 0;
    ts->health.loss_mean = json_number_value(mean);
    ts->health.spiking = json_is_true(spiking);
    ts->health.rising = json_is_true(rising);
    return 1;
}

moe_status moe_ckpt_state_parse(const char *text, const char *path, moe_trainer_state *ts,
                                moe_err *err) {
    memset(ts, 0, sizeof *ts);
    json_error_t jerr;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        char what[256];
        snprintf(what, sizeof what, "%s (line %d)", jerr.text, jerr.line);
        return bad_state(err, path, what);
    }
    moe_status st = MOE_OK;
    json_t *fmt = json_object_get(o, "format"), *data = json_object_get(o, "data"),
           *rng = json_object_get(o, "rng");
    int64_t version = 0, seed = 0;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), STATE_FORMAT) != 0 ||
        !get_i64(o, "version", &version))
        st = bad_state(err, path, "not a moe-genomics trainer_state.json");
    else if (version != STATE_VERSION)
        st = bad_state(err, path, "unsupported version (written by another moe-train)");
    else if (!get_i64(o, "step", &ts->step) || !get_i64(o, "tokens_seen", &ts->tokens_seen) ||
             !json_is_object(data) || !get_i64(data, "epoch", &ts->data_epoch) ||
             !get_i64(data, "index", &ts->data_index) ||
             !get_i64(data, "samples_per_epoch", &ts->data_samples) ||
             !get_i64(data, "stream_tokens", &ts->data_stream_tokens) ||
             !json_is_boolean(json_object_get(data, "shuffle")) || !json_is_object(rng) ||
             !get_i64(rng, "seed", &seed) || ts->step < 0 || ts->data_epoch < 0 ||
             ts->data_index < 0)
        st = bad_state(err, path, "missing or invalid step, tokens_seen, data or rng fields");
    else if (!get_health(o, ts))
        st = bad_state(err, path, "invalid health fields (bad_steps_in_row, good_steps, loss_*)");
    if (st == MOE_OK) {
        ts->seed = (uint64_t)seed;
        ts->data_shuffle = json_is_true(json_object_get(data, "shuffle"));
        json_t *met = json_object_get(o, "last_metrics");
        ts->last_metrics =
            json_is_object(met) ? json_dumps(met, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_t *init = json_object_get(o, "init_from"); /* optional: runs started by --init */
        if (json_is_string(init))
            snprintf(ts->init_from, sizeof ts->init_from, "%s", json_string_value(init));
    }
    json_decref(o);
    return st;
}
