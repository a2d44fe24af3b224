/*
 * The bytes of remoting frames, shared by every C file: big-endian integers (the pull loop
 * rmq_pull.c, the binary header codec rmq_header.c, the embedded broker's rmq_serve*.c) and
 * decimal header values (rmq_dec, the one decimal parser).
 */
#ifndef RMQ_BYTES_H
#define RMQ_BYTES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static inline int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}
static inline int16_t rd16(const uint8_t *p) { return (int16_t)((uint16_t)p[0] << 8 | p[1]); }
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* The signs rmq_dec accepts before the digits. */
enum { RMQ_DEC_UNSIGNED, RMQ_DEC_MINUS, RMQ_DEC_PLUS_MINUS };

/* Decimal text [s, s + n): a sign as ``signs`` allows, then 1 to ``max_digits`` ASCII digits
 * (at most 18, so the value cannot overflow), in [lo, hi]. 0 with *out set, or -1 when the text
 * is anything else (each caller leaves longer or odder numbers to its Python twin). */
static inline int rmq_dec(const uint8_t *s, Py_ssize_t n, int signs, int max_digits, int64_t lo,
                          int64_t hi, int64_t *out) {
    int neg = 0;
    if (n > 0 && signs != RMQ_DEC_UNSIGNED &&
        (s[0] == '-' || (s[0] == '+' && signs == RMQ_DEC_PLUS_MINUS))) {
        neg = s[0] == '-';
        s++;
        n--;
    }
    if (n < 1 || n > max_digits) return -1;
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (neg) v = -v;
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

#endif /* RMQ_BYTES_H */
