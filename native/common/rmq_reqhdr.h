/*
 * The request-header walkers of the embedded broker's C paths, shared by the pull server
 * (rmq_serve.c) and the transactional one (rmq_serve_tx.c).
 *
 * Both take plain ASCII headers only (anything else goes to the Python path, frame.py, which
 * names a fault or decodes the text); they walk the header and hand each field to the file's
 * own callback, which keeps what it reads and may refuse the frame (a non-zero return). Every
 * function returns 0, or -1 when the frame is for the Python path.
 */
#ifndef RMQ_REQHDR_H
#define RMQ_REQHDR_H

#include <stdint.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_json.h"

static inline int hdr_ascii(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] >= 0x80) return 0;
    return 1;
}

/* A JSON integer that fits 32 bits (frame.py _json_int): optional '-', 1 to 10 digits. */
static inline int hdr_json_int32(const uint8_t *v, Py_ssize_t l, int32_t *out) {
    int64_t x;
    if (rmq_dec(v, l, RMQ_DEC_MINUS, 10, INT32_MIN, INT32_MAX, &x) < 0) return -1;
    *out = (int32_t)x;
    return 0;
}

/* An extFields entry: key [k, k + kl) (kesc: it has escapes), value [v, v + vl): a string's raw
 * contents (vstr 1, vesc: escapes), or any other JSON value's text (vstr 0; for the binary
 * header always a string without escapes). */
typedef int (*hdr_ext_fn)(void *ctx, const uint8_t *k, Py_ssize_t kl, int kesc,
                          const uint8_t *v, Py_ssize_t vl, int vstr, int vesc);
/* A top-level JSON property other than extFields: key (no escapes) and the value's text. */
typedef int (*hdr_top_fn)(void *ctx, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                          Py_ssize_t vl);

/* The ROCKETMQ binary header (frame.py decode_binary_header), ASCII text only. */
static inline int hdr_read_binary(const uint8_t *h, Py_ssize_t n, int32_t *code,
                                  int32_t *opaque, int32_t *flag, hdr_ext_fn ext, void *ctx) {
    if (n < 21) return -1;
    *code = rd16(h);
    *opaque = rd32(h + 5);
    *flag = rd32(h + 9);
    Py_ssize_t pos = 13;
    int32_t rl = rd32(h + pos);
    pos += 4;
    if (rl < 0 || pos + rl + 4 > n || !hdr_ascii(h + pos, rl)) return -1;
    pos += rl;
    int32_t el = rd32(h + pos);
    pos += 4;
    if (el < 0 || pos + el != n) return -1;
    while (pos < n) {
        if (pos + 2 > n) return -1;
        int16_t kl = rd16(h + pos);
        if (kl < 0 || pos + 2 + kl + 4 > n) return -1;
        const uint8_t *k = h + pos + 2;
        pos += 2 + kl;
        int32_t vl = rd32(h + pos);
        if (vl < 0 || pos + 4 + vl > n || !hdr_ascii(k, kl) || !hdr_ascii(h + pos + 4, vl))
            return -1;
        if (ext(ctx, k, kl, 0, h + pos + 4, vl, 1, 0)) return -1;
        pos += 4 + vl;
    }
    return 0;
}

/* fastjson's flat JSON header (frame.py decode_json_header), ASCII text only: an object whose
 * keys have no escapes, one extFields object at most, nothing after it. */
static inline int hdr_read_json(const uint8_t *p, Py_ssize_t n, hdr_top_fn top, hdr_ext_fn ext,
                                void *ctx) {
    const uint8_t *e = p + n;
    int ext_seen = 0;
    if (!hdr_ascii(p, n)) return -1;
    p = ws(p, e);
    if (p >= e || *p != '{') return -1;
    p = ws(p + 1, e);
    if (p < e && *p == '}') return -1;
    for (;;) {
        const uint8_t *k; Py_ssize_t kl; int esc;
        if (!(p = jstring(ws(p, e), e, &k, &kl, &esc)) || esc) return -1;
        p = ws(p, e);
        if (p >= e || *p != ':') return -1;
        p = ws(p + 1, e);
        const uint8_t *v = p;
        if (kl == 9 && memcmp(k, "extFields", 9) == 0) {
            if (p >= e || *p != '{' || ext_seen++) return -1;
            p = ws(p + 1, e);
            if (p < e && *p == '}') p++;
            else for (;;) {
                const uint8_t *fk, *fv; Py_ssize_t fkl, fvl; int fesc, vesc = 0, vstr = 1;
                if (!(p = jstring(ws(p, e), e, &fk, &fkl, &fesc))) return -1;
                p = ws(p, e);
                if (p >= e || *p != ':') return -1;
                p = ws(p + 1, e);
                if (p < e && *p == '"') {
                    if (!(p = jstring(p, e, &fv, &fvl, &vesc))) return -1;
                } else {
                    fv = p;
                    if (!(p = jskip(p, e, 1))) return -1;
                    fvl = p - fv;
                    vstr = 0;
                }
                if (ext(ctx, fk, fkl, fesc, fv, fvl, vstr, vesc)) return -1;
                p = ws(p, e);
                if (p < e && *p == ',') { p++; continue; }
                if (p < e && *p == '}') { p++; break; }
                return -1;
            }
        } else {
            if (!(p = jskip(p, e, 1))) return -1;
            if (top(ctx, k, kl, v, p - v)) return -1;
        }
        p = ws(p, e);
        if (p < e && *p == ',') { p++; continue; }
        if (p < e && *p == '}') { p++; break; }
        return -1;
    }
    if (ws(p, e) != e) return -1;
    return 0;
}

#endif /* RMQ_REQHDR_H */
