/*
 * What the parts of serve_tx() share (the embedded broker's C answer to an exactly-once
 * write's frames): rmq_serve_tx.c runs the frames and calls rmq_tx_header.c (reading a
 * request's header, writing a success answer), rmq_tx_half.c (half sends) and rmq_tx_end.c
 * (END_TRANSACTION), which read and write message properties with rmq_tx_props.c and store
 * records through rmq_tx_store.c.
 */
#ifndef RMQ_SERVE_TX_H
#define RMQ_SERVE_TX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_tx_store.h"

#define MAX_FRAME (16 * 1024 * 1024)
#define FLAG_RESPONSE 1
#define FLAG_ONEWAY 2
#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define SYSFLAG_MULTI_TAGS 0x2
#define SYSFLAG_TX_MASK 0xC
#define SYSFLAG_HOST_V6 0x30
#define TX_COMMIT 0x8
#define TX_ROLLBACK 0xC
#define MAX_PROPS 128
#define MAX_PROPS_BYTES 32767

/* ---------------------------------------------------------------- a request's header */

/* The keys read. A send's short keys mean the long V1 names (handle_send maps them), so a
 * send carrying a long name as well is left to Python (which of the two wins is its rule). */
enum {
    S_A, S_B, S_C, S_D, S_E, S_F, S_G, S_H, S_I, S_J, S_K, S_L, S_M, S_N,
    L_GROUP, L_TOPIC, L_DEFTOPIC, L_DEFNUMS, L_QID, L_SYSFLAG, L_BORN, L_FLAG, L_PROPS,
    L_RECONSUME, L_UNIT, L_MAXRECONSUME, L_BATCH, L_BNAME,
    E_TABLE, E_PHYS, E_KIND, E_FROMCHECK, E_MSGID, NKEYS
};
#define E_GROUP L_GROUP  /* END_TRANSACTION's producerGroup */

typedef struct { const uint8_t *p; Py_ssize_t n; int set; } span_t;

typedef struct {
    int32_t code, flag, opaque;
    int have_code;
    span_t v[NKEYS];
    uint8_t *arena;          /* JSON values with escapes, unescaped (as long as the header) */
    Py_ssize_t arena_used;
} req_t;

/* Read a ROCKETMQ binary header / a JSON header of h[0, n) into r: 0, or -1 when Python must
 * read it. A JSON header's escaped values are unescaped into r->arena (n + 1 bytes). */
int tx_read_binary(const uint8_t *h, Py_ssize_t n, req_t *r);
int tx_read_json(const uint8_t *p, Py_ssize_t n, req_t *r);
/* A header value as Java's parseInt (bits 32) or parseLong (bits 64): 0, or -1. */
int tx_parse_num(const span_t *s, int bits, int64_t *out);
/* Boolean.parseBoolean of p[0, n). */
int tx_java_true(const uint8_t *p, Py_ssize_t n);
/* The SUCCESS answer to a request (opaque) in its serialization ser, with n ext fields; NULL
 * (no error) when it does not fit. */
PyObject *tx_success_frame(int ser, int32_t opaque, int version, int n,
                           const char *const *names, const char *const *values);

/* ---------------------------------------------------------------- message properties */

/* Properties as decode_properties leaves them: insertion order of first appearance, a later
 * duplicate's value wins, empty names or values dropped. */
typedef struct {
    int n;
    span_t name[MAX_PROPS], value[MAX_PROPS];
} props_t;

/* The index of the property named name, or -1. */
int tx_props_find(const props_t *m, const char *name);
/* Set a property (a new one goes last): 0, or -1 when m is full. */
int tx_props_put(props_t *m, const uint8_t *k, Py_ssize_t kl, const uint8_t *v, Py_ssize_t vl);
/* Read a properties text into m: 0, or -1 when Python must read it. */
int tx_props_parse(const uint8_t *p, Py_ssize_t n, props_t *m);
/* String.hashCode() of ASCII text. */
int32_t tx_java_hash(const uint8_t *p, Py_ssize_t n);
/* m as Java writes it (MAX_PROPS_BYTES + 1 bytes at out): its length, or -1. */
Py_ssize_t tx_props_write(const props_t *m, uint8_t *out);
/* The TAGS tag code of m (0 without tags). */
int32_t tx_props_tag_code(const props_t *m);

/* ---------------------------------------------------------------- the frames answered */

/* A half send / an END_TRANSACTION (rmq_tx_half.c, rmq_tx_end.c): its answer (None for a
 * oneway one), NULL without an error when Python must answer it, NULL with an error. */
PyObject *tx_half_send(const ctx_t *c, const req_t *r, int ser, const uint8_t *body,
                       Py_ssize_t body_len);
PyObject *tx_end_transaction(const ctx_t *c, const req_t *r, int ser);

/* Big-endian writers of records and answers: each returns the position after what it wrote. */
static inline uint8_t *put32(uint8_t *o, int32_t v) { wr32(o, (uint32_t)v); return o + 4; }
static inline uint8_t *put64(uint8_t *o, int64_t v) {
    wr32(o, (uint32_t)((uint64_t)v >> 32)); wr32(o + 4, (uint32_t)v); return o + 8;
}
static inline uint8_t *put(uint8_t *o, const void *p, Py_ssize_t n) {
    memcpy(o, p, n); return o + n;
}

#endif /* RMQ_SERVE_TX_H */
