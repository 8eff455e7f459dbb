/* fuzz_ckpt: libFuzzer harness for the checkpoint's two text parsers, from memory:
 * moe_ckpt_manifest_parse (MANIFEST: the version-2 first line, the file lines, the files
 * every checkpoint lists) and moe_ckpt_state_parse (trainer_state.json). The input is a
 * 2-byte little-endian length N, N bytes of MANIFEST, then trainer_state.json (the rest): the
 * format of fuzz_ckpt_dir, which opens the same inputs as a checkpoint directory. A state
 * that parses is written back (moe_ckpt_state_json) and parsed again: it must parse, to the
 * same values (a difference aborts: a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* bytes [n] as a malloc'ed C string (the parsers take NUL-terminated text); aborts when out
 * of memory. */
static char *text_of(const uint8_t *bytes, size_t n) {
    char *t = malloc(n + 1);
    if (!t) abort();
    memcpy(t, bytes, n);
    t[n] = '\0';
    return t;
}

/* Whether two parsed states hold the same values (last_metrics compared as text). */
static int same_state(const moe_trainer_state *a, const moe_trainer_state *b) {
    return a->step == b->step && a->tokens_seen == b->tokens_seen &&
           a->data_epoch == b->data_epoch && a->data_index == b->data_index &&
           a->data_samples == b->data_samples && a->data_stream_tokens == b->data_stream_tokens &&
           a->data_shuffle == b->data_shuffle && a->seed == b->seed &&
           strcmp(a->init_from, b->init_from) == 0 && !a->last_metrics == !b->last_metrics &&
           (!a->last_metrics || strcmp(a->last_metrics, b->last_metrics) == 0) &&
           a->health.bad_in_row == b->health.bad_in_row && a->health.good == b->health.good &&
           a->health.loss_mean == b->health.loss_mean && a->health.spiking == b->health.spiking &&
           a->health.rising == b->health.rising;
}

/* data [size] bytes: u16 LE N, MANIFEST [N], trainer_state.json [rest]. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
    const uint8_t *body = size >= 2 ? data + 2 : data;
    size_t rest = size >= 2 ? size - 2 : size;
    if (n > rest) n = rest;
    moe_err err;
    moe_err_clear(&err);
    char *man = text_of(body, n);
    moe_ckpt ck;
    memset(&ck, 0, sizeof ck);
    (void)moe_ckpt_manifest_parse(&ck, man, n, "fuzz/MANIFEST", &err);
    moe_ckpt_close(&ck);
    free(man);
    char *state = text_of(body + n, rest - n);
    moe_trainer_state ts, again;
    moe_err_clear(&err);
    if (moe_ckpt_state_parse(state, "fuzz/trainer_state.json", &ts, &err) == MOE_OK) {
        char *json = moe_ckpt_state_json(&ts);
        if (!json) abort();
        if (moe_ckpt_state_parse(json, "fuzz/rewritten.json", &again, &err) != MOE_OK ||
            !same_state(&ts, &again))
            abort(); /* what moe-train writes must read back as it was */
        free(again.last_metrics);
        free(json);
        free(ts.last_metrics);
    }
    free(state);
    return 0;
}
