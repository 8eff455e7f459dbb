/* shard_format: byte offsets and little-endian helpers of the .mtok format, shared by the
 * shard writer and reader (libcore/src/shard_write.c, shard_read.c).
 *
 * The one thing to know: docs/formats.md is the specification; these constants must say the
 * same thing, and every multi-byte field is little-endian whatever the host. */
#ifndef MOE_SHARD_FORMAT_H
#define MOE_SHARD_FORMAT_H

#include <stdint.h>
#include <string.h>

#include "base/bytes.h"

#define MOE_SHARD_HEADER_FIXED 80 /* bytes before the spec JSON */
#define MOE_SHARD_TRAILER 32
#define MOE_SHARD_TRAILER_MAGIC "MOETEND\0"
#define MOE_SHARD_INDEX_FIXED 32 /* n_docs, n_sources, strings_size, crc32 + 4 zero bytes */
#define MOE_SHARD_DOC_ENTRY 48

/* header field offsets */
#define MOE_SHARD_OFF_VERSION 8
#define MOE_SHARD_OFF_HEADER_SIZE 12
#define MOE_SHARD_OFF_TOKENIZER 16
#define MOE_SHARD_OFF_WIDTH 20
#define MOE_SHARD_OFF_VOCAB_SIZE 24
#define MOE_SHARD_OFF_VOCAB_HASH 32
#define MOE_SHARD_OFF_N_TOKENS 40
#define MOE_SHARD_OFF_N_DOCS 48
#define MOE_SHARD_OFF_INDEX 56
#define MOE_SHARD_OFF_FLAGS 64
#define MOE_SHARD_OFF_SPEC_LEN 68

#define MOE_SHARD_FLAG_MASK 1u   /* a lower-case mask follows the tokens */
#define MOE_SHARD_FLAG_COUNTS 2u /* n_tokens/n_docs/index offset in the header are filled */

static inline uint64_t moe_align8(uint64_t x) {
    return (x + 7) & ~(uint64_t)7;
}

/* Token width for a vocabulary: 1 byte up to 256 ids, 2 up to 65536, else 4. */
static inline int moe_shard_width_for_vocab(int64_t vocab_size) {
    return vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 2 : 4;
}

#endif
