/* fuzz_config: libFuzzer harness for the YAML config loader with overrides. The first line of
 * the input is a "key.path=value" override applied after the YAML of the remaining lines,
 * then the result is validated and dumped back as YAML (as --dry-run does) to /dev/null.
 *
 * The one thing to know: /dev/null is opened once per process (libFuzzer gives the callback
 * no context), so its stream lives in a file-scope variable. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *g_null; /* /dev/null, for the YAML dumps (set once, by the initializer) */

/* Opens g_null. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!(g_null = fopen("/dev/null", "w"))) abort();
    return 0;
}

/* data [size] bytes: "override\nyaml...". Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    char *nl = strchr(text, '\n');
    const char *yaml = nl ? nl + 1 : "";
    if (nl) *nl = '\0';
    moe_err err;
    moe_err_clear(&err);
    moe_config c;
    if (moe_config_load_string(&c, yaml, "fuzz.yaml", &err) == MOE_OK) {
        char *eq = strchr(text, '=');
        if (eq) {
            *eq = '\0';
            moe_err_clear(&err);
            if (moe_config_set(&c, text, eq + 1, &err) == MOE_OK) {
                moe_err_clear(&err);
                (void)moe_config_validate(&c, &err);
            }
        }
        moe_err_clear(&err);
        (void)moe_config_write_yaml(&c, g_null, &err);
    }
    free(text);
    return 0;
}
