/*
 * Big-endian reads and writes of remoting frames' integers, shared by the pull loop
 * (rmq_pull.c), the binary header codec (rmq_header.c) and the embedded broker's pull server
 * (rmq_serve.c).
 */
#ifndef RMQ_BYTES_H
#define RMQ_BYTES_H

#include <stdint.h>

static inline int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}
static inline int16_t rd16(const uint8_t *p) { return (int16_t)((uint16_t)p[0] << 8 | p[1]); }
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

#endif /* RMQ_BYTES_H */
