/*
 * serve_tx()'s requests and answers (rmq_serve_tx.h): the fields of a request header, read
 * from either serialization with the walkers of rmq_reqhdr.h, Java's readings of their
 * values, and the SUCCESS answer frame written back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_reqhdr.h"
#include "rmq_serve_tx.h"

static const char *KEYS[NKEYS] = {
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n",
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch", "bname",
    "tranStateTableOffset", "commitLogOffset", "commitOrRollback", "fromTransactionCheck",
    "msgId"};

static Py_ssize_t KEY_LEN[NKEYS];

static void keep(req_t *r, const uint8_t *k, Py_ssize_t kl, const uint8_t *v, Py_ssize_t vl) {
    if (!KEY_LEN[0])
        for (int i = 0; i < NKEYS; i++) KEY_LEN[i] = (Py_ssize_t)strlen(KEYS[i]);
    for (int i = 0; i < NKEYS; i++) {
        if (KEY_LEN[i] == kl && memcmp(KEYS[i], k, kl) == 0) {
            r->v[i].p = v; r->v[i].n = vl; r->v[i].set = 1;
            return;
        }
    }
}

static int hex4(const uint8_t *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= ch - '0';
        else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f') v |= (ch | 0x20) - 'a' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

/* A JSON string's raw contents [p, p + n) with escapes, unescaped into the request's arena
 * (json.loads' reading); ASCII results only. */
static int unescape(req_t *r, const uint8_t *p, Py_ssize_t n, const uint8_t **out,
                    Py_ssize_t *out_len) {
    uint8_t *o = r->arena + r->arena_used, *start = o;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] != '\\') { *o++ = p[i]; continue; }
        if (++i >= n) return -1;
        switch (p[i]) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned v;
            if (i + 4 >= n || hex4(p + i + 1, &v) < 0 || v >= 0x80) return -1;
            *o++ = (uint8_t)v;
            i += 4;
            break;
        }
        default: return -1;
        }
    }
    *out = start;
    *out_len = o - start;
    r->arena_used += o - start;
    return 0;
}

/* The header walkers (rmq_reqhdr.h). fastjson's flat header (frame.py decode_json_header):
 * extFields values must be strings (escapes of ASCII characters allowed); code/flag/opaque/
 * version 32-bit integers; remark a string or null. */
static int keep_ext(void *ctx, const uint8_t *k, Py_ssize_t kl, int kesc, const uint8_t *v,
                    Py_ssize_t vl, int vstr, int vesc) {
    req_t *r = ctx;
    if (kesc || !vstr) return -1;
    if (vesc && unescape(r, v, vl, &v, &vl) < 0) return -1;
    keep(r, k, kl, v, vl);
    return 0;
}

static int keep_top(void *ctx, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                    Py_ssize_t vl) {
    req_t *r = ctx;
    int32_t x;
    int is = hdr_json_int32(v, vl, &x) == 0;
    if (kl == 4 && memcmp(k, "code", 4) == 0) {
        if (!is) return -1;
        r->code = x; r->have_code = 1;
    } else if (kl == 4 && memcmp(k, "flag", 4) == 0) {
        if (!is) return -1;
        r->flag = x;
    } else if (kl == 6 && memcmp(k, "opaque", 6) == 0) {
        if (!is) return -1;
        r->opaque = x;
    } else if (kl == 7 && memcmp(k, "version", 7) == 0) {
        if (!is) return -1;
    } else if (kl == 6 && memcmp(k, "remark", 6) == 0) {
        if (*v != '"' && !(vl == 4 && memcmp(v, "null", 4) == 0)) return -1;
    }
    return 0;
}

/* The ROCKETMQ binary header (frame.py decode_binary_header); ASCII text only. */
int tx_read_binary(const uint8_t *h, Py_ssize_t n, req_t *r) {
    if (hdr_read_binary(h, n, &r->code, &r->opaque, &r->flag, keep_ext, r) < 0) return -1;
    r->have_code = 1;
    return 0;
}

int tx_read_json(const uint8_t *p, Py_ssize_t n, req_t *r) {
    r->flag = 0; r->opaque = 0;
    return hdr_read_json(p, n, keep_top, keep_ext, r);
}

/* Java's parseInt / parseLong as headers.py reads them: optional sign, ASCII digits, in
 * range. Longer numbers than these are left to Python. */
int tx_parse_num(const span_t *s, int bits, int64_t *out) {
    if (!s->set) return -1;
    if (bits == 32) return rmq_dec(s->p, s->n, RMQ_DEC_PLUS_MINUS, 10, INT32_MIN, INT32_MAX, out);
    return rmq_dec(s->p, s->n, RMQ_DEC_PLUS_MINUS, 18, INT64_MIN, INT64_MAX, out);
}

/* Boolean.parseBoolean: "true" in any case. */
int tx_java_true(const uint8_t *p, Py_ssize_t n) {
    static const char t[] = "true";
    if (n != 4) return 0;
    for (int i = 0; i < 4; i++)
        if ((p[i] | 0x20) != t[i]) return 0;
    return 1;
}

/* ---------------------------------------------------------------- answers */

/* The frame of cmd.make_response(SUCCESS, ext, None, version=...) in the request's
 * serialization (frame.py encode_json_header / encode_binary_header); ext: n name/value
 * pairs, values plain ASCII needing no JSON escapes. */
PyObject *tx_success_frame(int ser, int32_t opaque, int version, int n,
                           const char *const *names, const char *const *values) {
    char head[1024];
    Py_ssize_t hl = 0;
    if (ser == 1) {
        uint8_t *h = (uint8_t *)head, *q = h;
        *q++ = 0; *q++ = 0; *q++ = 0;  /* code SUCCESS, language JAVA */
        *q++ = (uint8_t)(version >> 8); *q++ = (uint8_t)version;
        q = put32(q, opaque);
        q = put32(q, FLAG_RESPONSE);
        q = put32(q, 0);  /* no remark */
        uint8_t *ext_len = q;
        q += 4;
        for (int j = 0; j < n; j++) {
            Py_ssize_t kl = (Py_ssize_t)strlen(names[j]), vl = (Py_ssize_t)strlen(values[j]);
            if (q - h + 6 + kl + vl > (Py_ssize_t)sizeof(head)) return NULL;
            *q++ = 0; *q++ = (uint8_t)kl;
            q = put(q, names[j], kl);
            q = put32(q, (int32_t)vl);
            q = put(q, values[j], vl);
        }
        wr32(ext_len, (uint32_t)(q - ext_len - 4));
        hl = q - h;
    } else {
        hl = snprintf(head, sizeof(head), "{\"code\":0");
        if (n) {
            hl += snprintf(head + hl, sizeof(head) - hl, ",\"extFields\":{");
            for (int j = 0; j < n; j++)
                hl += snprintf(head + hl, sizeof(head) - hl, "%s\"%s\":\"%s\"", j ? "," : "",
                               names[j], values[j]);
            hl += snprintf(head + hl, sizeof(head) - hl, "}");
        }
        hl += snprintf(head + hl, sizeof(head) - hl,
                       ",\"flag\":1,\"language\":\"JAVA\",\"opaque\":%d,"
                       "\"serializeTypeCurrentRPC\":\"JSON\",\"version\":%d}",
                       (int)opaque, version);
        if (hl >= (Py_ssize_t)sizeof(head)) return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 + hl);
    if (!out) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    wr32(o, (uint32_t)(4 + hl));
    wr32(o + 4, ((uint32_t)ser << 24) | (uint32_t)hl);
    memcpy(o + 8, head, hl);
    return out;
}
