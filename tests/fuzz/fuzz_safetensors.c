/* fuzz_safetensors: libFuzzer harness for the safetensors reader: header validation (JSON via
 * jansson, dtypes, shapes, offsets) and, for an accepted file, every tensor converted to f32. */
#include <stdint.h>
#include <stdlib.h>

#include "moe/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* data [size] bytes: one .safetensors image. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_err err;
    moe_err_clear(&err);
    moe_st_file f;
    if (moe_st_open_memory(&f, data, size, "fuzz.safetensors", &err) != MOE_OK) return 0;
    for (int i = 0; i < f.n_tensors; i++) {
        float *out = malloc((size_t)(f.tensors[i].numel ? f.tensors[i].numel : 1) * sizeof *out);
        if (!out) abort();
        moe_st_read_f32(&f, &f.tensors[i], out, &err);
        free(out);
    }
    (void)moe_st_meta(&f, "format");
    moe_st_close(&f);
    return 0;
}
