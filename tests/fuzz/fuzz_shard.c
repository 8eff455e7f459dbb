/* fuzz_shard: libFuzzer harness for the token-shard reader: the input is a whole .mtok image
 * validated in memory; when it is accepted, every document is read back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* data [size] bytes: one shard image (copied: the reader may keep it). Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    void *copy = malloc(size ? size : 1);
    if (!copy) abort();
    memcpy(copy, data, size);
    moe_err err;
    moe_err_clear(&err);
    moe_shard *s = NULL;
    if (moe_shard_open_memory(&s, copy, size, 1, "fuzz.mtok", &err) != MOE_OK) return 0;
    int64_t n = moe_shard_n_docs(s);
    for (int64_t i = 0; i < n; i++) {
        moe_shard_doc d;
        moe_shard_get_doc(s, i, &d);
    }
    if (moe_shard_n_tokens(s) > 0) (void)moe_shard_find_doc(s, moe_shard_n_tokens(s) - 1);
    moe_shard_close(s);
    return 0;
}
