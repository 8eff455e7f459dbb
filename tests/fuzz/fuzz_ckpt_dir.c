/* fuzz_ckpt_dir: libFuzzer harness for opening a checkpoint directory (moe_ckpt_open: the
 * MANIFEST's files verified, the parts in order, the tensor layout from the files listed),
 * end to end through files; fuzz_ckpt runs the two parsers alone, from memory, much faster,
 * on the same inputs (seeds: corpus/ckpt). The input is two files: a 2-byte
 * little-endian length N, then N bytes of MANIFEST, then trainer_state.json (the rest). Both
 * are written into a checkpoint directory that also holds a fixed config.yaml and
 * tokenizer.json, which is then opened as moe-convert inspect opens it (every part, whatever
 * fails) and as --resume does (strict, with the trainer state).
 *
 * The one thing to know: the fixture directory is made once per process (libFuzzer gives the
 * callback no context), so its path lives in one file-scope buffer, and it is removed at
 * exit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_fixture.h"
#include "moe/ckpt.h"
#include "moe/fileio.h"
#include "moe/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_root[64]; /* the fixture: g_root/ckpt-00000001 (set once, by the initializer) */

/* Writes len bytes of text to dir/name; aborts on failure (the fixture must exist). */
static void put_file(const char *dir, const char *name, const void *text, size_t len) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || (len && fwrite(text, 1, len, fp) != len) || fclose(fp) != 0) abort();
}

static void remove_fixture(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree(g_root, &err);
}

/* Makes the fixture checkpoint directory: config.yaml and the byte tokenizer's spec. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_root, sizeof g_root, "%s/moe-fuzz-ckpt.%ld", fuzz_tmpdir(), (long)getpid());
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ckpt-00000001", g_root);
    moe_err err;
    moe_err_clear(&err);
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    moe_tokenizer *tok = NULL;
    if (moe_mkdirs(dir, &err) != MOE_OK || moe_tokenizer_create(&tok, &o, &err) != MOE_OK) abort();
    put_file(dir, "config.yaml", FUZZ_FIXTURE_CONFIG, strlen(FUZZ_FIXTURE_CONFIG));
    const char *spec = moe_tokenizer_spec_json(tok);
    put_file(dir, "tokenizer.json", spec, strlen(spec));
    moe_tokenizer_free(tok);
    atexit(remove_fixture);
    return 0;
}

/* data [size] bytes: u16 LE N, MANIFEST [N], trainer_state.json [rest]. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
    const uint8_t *body = size >= 2 ? data + 2 : data;
    size_t rest = size >= 2 ? size - 2 : size;
    if (n > rest) n = rest;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ckpt-00000001", g_root);
    put_file(dir, "MANIFEST", body, n);
    put_file(dir, "trainer_state.json", body + n, rest - n);
    moe_err err;
    moe_err_clear(&err);
    moe_ckpt ck;
    if (moe_ckpt_open(&ck, dir, MOE_CKPT_OPTIMIZER | MOE_CKPT_TRAINER_STATE | MOE_CKPT_REPORT,
                      &err) == MOE_OK)
        moe_ckpt_close(&ck);
    moe_err_clear(&err);
    if (moe_ckpt_open(&ck, dir, MOE_CKPT_OPTIMIZER | MOE_CKPT_TRAINER_STATE, &err) == MOE_OK)
        moe_ckpt_close(&ck);
    return 0;
}
