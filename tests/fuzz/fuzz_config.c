/* fuzz_config: libFuzzer harness for the YAML config loader with overrides. The first line of
 * the input is a "key.path=value" override applied after the YAML of the remaining lines,
 * then the result is validated and dumped back as YAML (as --dry-run does). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
        FILE *null = fopen("/dev/null", "w");
        if (null) {
            moe_err_clear(&err);
            (void)moe_config_write_yaml(&c, null, &err);
            fclose(null);
        }
    }
    free(text);
    return 0;
}
