/*
 * A small JSON scanner for fastjson's flat remoting command headers, shared by the pull loop
 * (rmq_pull.c, reading answers) and the embedded broker's pull server (rmq_serve.c, reading
 * requests). Functions take [p, e) and return the position after what they read, or NULL when
 * the bytes are not JSON.
 */
#ifndef RMQ_JSON_H
#define RMQ_JSON_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline const uint8_t *ws(const uint8_t *p, const uint8_t *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* A string at p ('"'); sets s/len to its raw contents and esc if it has escapes. */
static inline const uint8_t *jstring(const uint8_t *p, const uint8_t *e, const uint8_t **s,
                                     Py_ssize_t *len, int *esc) {
    if (p >= e || *p != '"') return NULL;
    p++;
    *s = p;
    *esc = 0;
    while (p < e && *p != '"') {
        if (*p == '\\') { *esc = 1; p++; if (p >= e) return NULL; }
        else if (*p < 0x20) return NULL;
        p++;
    }
    if (p >= e) return NULL;
    *len = p - *s;
    return p + 1;
}

/* A JSON number (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?) at p; NULL if not. */
static inline const uint8_t *jnumber(const uint8_t *p, const uint8_t *e) {
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < e && *p >= '0' && *p <= '9') p++; }
    else return NULL;
    if (p < e && *p == '.') {
        const uint8_t *d = ++p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        if (p == d) return NULL;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        const uint8_t *d = p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        if (p == d) return NULL;
    }
    return p;
}

/* Any value at p, skipped; NULL if it is not JSON. */
static inline const uint8_t *jskip(const uint8_t *p, const uint8_t *e, int depth) {
    p = ws(p, e);
    if (p >= e || depth > 32) return NULL;
    if (*p == '"') {
        const uint8_t *s; Py_ssize_t l; int esc;
        return jstring(p, e, &s, &l, &esc);
    }
    if (*p == '{' || *p == '[') {
        uint8_t close = *p == '{' ? '}' : ']';
        int obj = *p == '{';
        p = ws(p + 1, e);
        if (p < e && *p == close) return p + 1;
        for (;;) {
            if (obj) {
                const uint8_t *s; Py_ssize_t l; int esc;
                p = jstring(ws(p, e), e, &s, &l, &esc);
                if (!p) return NULL;
                p = ws(p, e);
                if (p >= e || *p != ':') return NULL;
                p++;
            }
            p = jskip(p, e, depth + 1);
            if (!p) return NULL;
            p = ws(p, e);
            if (p >= e) return NULL;
            if (*p == ',') { p++; continue; }
            if (*p == close) return p + 1;
            return NULL;
        }
    }
    if (*p == '-' || (*p >= '0' && *p <= '9')) return jnumber(p, e);
    if (e - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0)) return p + 4;
    if (e - p >= 5 && memcmp(p, "false", 5) == 0) return p + 5;
    return NULL;
}

#endif /* RMQ_JSON_H */
