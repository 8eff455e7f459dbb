/* bytes.h: little-endian fixed-width integers in byte buffers - the one set of helpers for the
 * shard format (shard/shard_format.h) and the rendezvous wire format (dist/comm_tcp.c). */
#ifndef MOE_BASE_BYTES_H
#define MOE_BASE_BYTES_H

#include <stdint.h>

static inline void moe_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void moe_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t moe_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t moe_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#endif
