/*
 * serve_tx(): the embedded broker's answer to the frames of an exactly-once write, in C.
 *
 * Why: an exactly-once write (the sink's exactly_once mode) sends every row as a half message
 * (SEND_MESSAGE_V2 with TRAN_MSG=true) and then ends it with END_TRANSACTION COMMIT. Answering
 * those in Python cost the embedded broker about 0.3 ms of CPU per row, on the two cores it
 * shares with the writer; this does the same work for the common frames.
 *
 * What: a leading run of frames that are plain half sends (not batch, existing writable
 * SINGLE_TAG topic, valid queue, the half topic already exists) or END_TRANSACTION COMMIT /
 * ROLLBACK of a half message that is found and whose producer group and queue offset match
 * (the op topic already exists). The records go to the store exactly as embedded/send.py
 * (handle_send) and embedded/transactions.py (end_transaction) write them, through the store's
 * fast-path interface only (embedded/store.py: now, queue, commit_log.size and .append, a
 * queue's max_offset, append, extend_timed and buffer_view) so the clock, the persistence and
 * the queues stay in one place, and long polls are told as the Python path tells them.
 * Anything unusual (an error to answer, a field that is not plain ASCII, an unknown key
 * spelling, a response frame) stops the run: that frame and the rest go to the Python path,
 * which stays the reference (tests/test_embedded_tx_fast.py holds the two byte-identical,
 * stores and answers). ACL and fault injection are checked by the caller (embedded/server.py)
 * before it calls this.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "rmq_bytes.h"
#include "rmq_embedded.h"
#include "rmq_reqhdr.h"
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


/* ---------------------------------------------------------------- request header fields */

/* The keys read. A send's short keys mean the long V1 names (handle_send maps them), so a
 * send carrying a long name as well is left to Python (which of the two wins is its rule). */
enum {
    S_A, S_B, S_C, S_D, S_E, S_F, S_G, S_H, S_I, S_J, S_K, S_L, S_M, S_N,
    L_GROUP, L_TOPIC, L_DEFTOPIC, L_DEFNUMS, L_QID, L_SYSFLAG, L_BORN, L_FLAG, L_PROPS,
    L_RECONSUME, L_UNIT, L_MAXRECONSUME, L_BATCH, L_BNAME,
    E_TABLE, E_PHYS, E_KIND, E_FROMCHECK, E_MSGID, NKEYS
};
#define E_GROUP L_GROUP  /* END_TRANSACTION's producerGroup */
static const char *KEYS[NKEYS] = {
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n",
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch", "bname",
    "tranStateTableOffset", "commitLogOffset", "commitOrRollback", "fromTransactionCheck",
    "msgId"};

typedef struct { const uint8_t *p; Py_ssize_t n; int set; } span_t;

typedef struct {
    int32_t code, flag, opaque;
    int have_code;
    span_t v[NKEYS];
    uint8_t *arena;          /* JSON values with escapes, unescaped (as long as the header) */
    Py_ssize_t arena_used;
} req_t;

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
static int read_binary(const uint8_t *h, Py_ssize_t n, req_t *r) {
    if (hdr_read_binary(h, n, &r->code, &r->opaque, &r->flag, keep_ext, r) < 0) return -1;
    r->have_code = 1;
    return 0;
}

static int read_json(const uint8_t *p, Py_ssize_t n, req_t *r) {
    r->flag = 0; r->opaque = 0;
    return hdr_read_json(p, n, keep_top, keep_ext, r);
}

/* Java's parseInt / parseLong as headers.py reads them: optional sign, ASCII digits, in
 * range. Longer numbers than these are left to Python. */
static int parse_num(const span_t *s, int bits, int64_t *out) {
    if (!s->set) return -1;
    if (bits == 32) return rmq_dec(s->p, s->n, RMQ_DEC_PLUS_MINUS, 10, INT32_MIN, INT32_MAX, out);
    return rmq_dec(s->p, s->n, RMQ_DEC_PLUS_MINUS, 18, INT64_MIN, INT64_MAX, out);
}

static int span_is(const span_t *s, const char *t) {
    Py_ssize_t n = (Py_ssize_t)strlen(t);
    return s->n == n && memcmp(s->p, t, n) == 0;
}

/* Boolean.parseBoolean: "true" in any case. */
static int java_true(const uint8_t *p, Py_ssize_t n) {
    static const char t[] = "true";
    if (n != 4) return 0;
    for (int i = 0; i < 4; i++)
        if ((p[i] | 0x20) != t[i]) return 0;
    return 1;
}

/* ---------------------------------------------------------------- message properties */

/* Properties as decode_properties leaves them: insertion order of first appearance, a later
 * duplicate's value wins, empty names or values dropped. */
typedef struct {
    int n;
    span_t name[MAX_PROPS], value[MAX_PROPS];
} props_t;

static int props_find(const props_t *m, const char *name) {
    Py_ssize_t l = (Py_ssize_t)strlen(name);
    for (int i = 0; i < m->n; i++)
        if (m->name[i].n == l && memcmp(m->name[i].p, name, l) == 0) return i;
    return -1;
}

static int props_put(props_t *m, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                     Py_ssize_t vl) {
    for (int i = 0; i < m->n; i++) {
        if (m->name[i].n == kl && memcmp(m->name[i].p, k, kl) == 0) {
            m->value[i].p = v; m->value[i].n = vl;
            return 0;
        }
    }
    if (m->n == MAX_PROPS) return -1;
    m->name[m->n].p = k; m->name[m->n].n = kl;
    m->value[m->n].p = v; m->value[m->n].n = vl;
    m->n++;
    return 0;
}

/* Java's split on \x02, the first \x01 splitting name and value. A value holding another
 * \x01 cannot be written back (encode_properties refuses it): left to Python. */
static int props_parse(const uint8_t *p, Py_ssize_t n, props_t *m) {
    m->n = 0;
    Py_ssize_t i = 0;
    while (i <= n) {
        Py_ssize_t j = i;
        while (j < n && p[j] != 0x02) j++;
        if (j - i >= 3) {
            Py_ssize_t s = i;
            while (s < j && p[s] != 0x01) s++;
            if (s < j && s > i && j > s + 1) {
                for (Py_ssize_t c = s + 1; c < j; c++)
                    if (p[c] == 0x01) return -1;
                if (props_put(m, p + i, s - i, p + s + 1, j - s - 1) < 0) return -1;
            }
        }
        i = j + 1;
    }
    return 0;
}

/* String.hashCode() of ASCII text. */
static int32_t java_hash(const uint8_t *p, Py_ssize_t n) {
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++) h = 31 * h + p[i];
    return (int32_t)h;
}

/* The properties text of a HashMap holding m (java_hashmap_order, then name\x01value joined
 * by \x02, no trailing separator), written to out (MAX_PROPS_BYTES + 1 bytes); its length, or
 * -1 when it does not fit a record. */
static Py_ssize_t props_write(const props_t *m, uint8_t *out) {
    int capacity = 16;
    while (m->n * 4 > capacity * 3)  /* len(keys) > capacity * 0.75 */
        capacity *= 2;
    int order[MAX_PROPS], bucket[MAX_PROPS];
    for (int i = 0; i < m->n; i++) {
        uint32_t h = (uint32_t)java_hash(m->name[i].p, m->name[i].n);
        bucket[i] = (int)((h ^ (h >> 16)) & (uint32_t)(capacity - 1));
        /* stable insertion sort by bucket: insertion order within a bucket */
        int j = i;
        while (j > 0 && bucket[order[j - 1]] > bucket[i]) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    Py_ssize_t pos = 0;
    for (int x = 0; x < m->n; x++) {
        int i = order[x];
        Py_ssize_t need = m->name[i].n + 1 + m->value[i].n + (x ? 1 : 0);
        if (pos + need > MAX_PROPS_BYTES) return -1;
        if (x) out[pos++] = 0x02;
        memcpy(out + pos, m->name[i].p, m->name[i].n);
        pos += m->name[i].n;
        out[pos++] = 0x01;
        memcpy(out + pos, m->value[i].p, m->value[i].n);
        pos += m->value[i].n;
    }
    return pos;
}

/* The TAGS tag code of a property map (0 without tags). */
static int32_t props_tag_code(const props_t *m) {
    int t = props_find(m, "TAGS");
    return t < 0 ? 0 : java_hash(m->value[t].p, m->value[t].n);
}

static uint8_t *put32(uint8_t *o, int32_t v) { wr32(o, (uint32_t)v); return o + 4; }
static uint8_t *put64(uint8_t *o, int64_t v) {
    wr32(o, (uint32_t)((uint64_t)v >> 32)); wr32(o + 4, (uint32_t)v); return o + 8;
}
static uint8_t *put(uint8_t *o, const void *p, Py_ssize_t n) { memcpy(o, p, n); return o + n; }

/* ---------------------------------------------------------------- answers */

/* The frame of cmd.make_response(SUCCESS, ext, None, version=...) in the request's
 * serialization (frame.py encode_json_header / encode_binary_header); ext: n name/value
 * pairs, values plain ASCII needing no JSON escapes. */
static PyObject *success_frame(int ser, int32_t opaque, int version, int n,
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

/* ---------------------------------------------------------------- half sends */

typedef struct {
    const ctx_t *c;
    const uint8_t *body; Py_ssize_t body_len;
    const uint8_t *props; Py_ssize_t props_len;
    int32_t flag, sys_flag, reconsume, crc;
    int64_t born_ts;
} half_t;

/* encode_stored_message of the half message (topic RMQ_SYS_TRANS_HALF_TOPIC, queue 0). */
static PyObject *build_half(const void *arg, int64_t offset, int64_t phys, int64_t now) {
    const half_t *m = arg;
    const ctx_t *c = m->c;
    Py_ssize_t tl = (Py_ssize_t)strlen(HALF_TOPIC);
    Py_ssize_t total = 48 + c->born_host_len + 8 + c->store_host_len + 12 + 4 + m->body_len +
                       1 + tl + 2 + m->props_len;
    int32_t sys_flag = (m->sys_flag & ~SYSFLAG_HOST_V6) | (c->born_host_len == 20 ? 0x10 : 0) |
                       (c->store_host_len == 20 ? 0x20 : 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    o = put32(o, (int32_t)total); o = put32(o, MAGIC_V1); o = put32(o, m->crc);
    o = put32(o, 0); o = put32(o, m->flag); o = put64(o, offset); o = put64(o, phys);
    o = put32(o, sys_flag); o = put64(o, m->born_ts);
    o = put(o, c->born_host, c->born_host_len); o = put64(o, now);
    o = put(o, c->store_host, c->store_host_len);
    o = put32(o, m->reconsume); o = put64(o, 0);
    o = put32(o, (int32_t)m->body_len); o = put(o, m->body, m->body_len);
    *o++ = (uint8_t)tl; o = put(o, HALF_TOPIC, tl);
    o[0] = (uint8_t)(m->props_len >> 8); o[1] = (uint8_t)m->props_len; o += 2;
    put(o, m->props, m->props_len);
    return out;
}

/* The topic rule of send.py validate_topic and NOT_ALLOWED_SEND_TOPICS (names that fail it
 * are left to Python, which answers the error). */
static int plain_topic(const span_t *t) {
    if (t->n < 1 || t->n > 127) return 0;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        uint8_t ch = t->p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '%' || ch == '|' || ch == '_' || ch == '-'))
            return 0;
    }
    static const char *forbidden[] = {"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                                      "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                      "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
                                      "OFFSET_MOVED_EVENT"};
    for (size_t i = 0; i < sizeof(forbidden) / sizeof(*forbidden); i++)
        if (span_is(t, forbidden[i])) return 0;
    return 1;
}

/* A half send (handle_send's is_half branch): its answer, NULL without an error when Python
 * must answer it, NULL with an error. */
static PyObject *half_send(const ctx_t *c, const req_t *r, int ser, const uint8_t *body,
                           Py_ssize_t body_len) {
    /* bname beside n is what a client sends for a 5.1+ proxy's sake; the broker reads
     * neither, so it does not make the send Python's */
    for (int k = L_GROUP; k < L_BNAME; k++)
        if (r->v[k].set) return NULL;
    int64_t x, qid, sys_flag, born_ts, flag, reconsume = 0;
    if (!r->v[S_A].set || !r->v[S_B].set || !r->v[S_C].set || !r->v[S_I].set) return NULL;
    if (parse_num(&r->v[S_D], 32, &x) < 0 || parse_num(&r->v[S_E], 32, &qid) < 0 ||
        parse_num(&r->v[S_F], 32, &sys_flag) < 0 || parse_num(&r->v[S_G], 64, &born_ts) < 0 ||
        parse_num(&r->v[S_H], 32, &flag) < 0)
        return NULL;
    if (r->v[S_J].set && parse_num(&r->v[S_J], 32, &reconsume) < 0) return NULL;
    if (r->v[S_M].set && java_true(r->v[S_M].p, r->v[S_M].n)) return NULL;  /* a batch */
    if (!plain_topic(&r->v[S_B]) || body_len > c->max_message_size) return NULL;
    props_t m;
    if (props_parse(r->v[S_I].p, r->v[S_I].n, &m) < 0) return NULL;
    int t = props_find(&m, "TRAN_MSG");
    if (t < 0 || !java_true(m.value[t].p, m.value[t].n)) return NULL;
    int ok = tx_topic_takes(c, r->v[S_B].p, r->v[S_B].n, qid);
    if (ok <= 0) return NULL;
    PyObject *half_cfg = tx_topic_config(c, (const uint8_t *)HALF_TOPIC, strlen(HALF_TOPIC));
    if (!half_cfg) return NULL;  /* the first half send creates it, in Python */

    /* half_properties: CLUSTER, REAL_TOPIC, REAL_QID set, in HashMap order */
    char qid_text[24];
    snprintf(qid_text, sizeof(qid_text), "%lld", (long long)qid);
    if (props_put(&m, (const uint8_t *)"CLUSTER", 7, (const uint8_t *)c->cluster,
                  (Py_ssize_t)strlen(c->cluster)) < 0 ||
        props_put(&m, (const uint8_t *)"REAL_TOPIC", 10, r->v[S_B].p, r->v[S_B].n) < 0 ||
        props_put(&m, (const uint8_t *)"REAL_QID", 8, (const uint8_t *)qid_text,
                  (Py_ssize_t)strlen(qid_text)) < 0)
        return NULL;
    uint8_t text[MAX_PROPS_BYTES + 1];  /* not static: tx_store_record runs Python code, and
                                         * another broker's thread may come in meanwhile */
    Py_ssize_t text_len = props_write(&m, text);
    if (text_len < 0) return NULL;

    PyObject *crc = PyObject_CallFunction(c->crc32, "y#", body, body_len);
    if (!crc) return NULL;
    unsigned long crc_v = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (crc_v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    half_t h = {c, body, body_len, text, text_len, (int32_t)flag,
                (int32_t)sys_flag & ~SYSFLAG_TX_MASK, (int32_t)reconsume,
                (int32_t)(crc_v & 0x7FFFFFFF), born_ts};
    /* handle_send takes the real queue before it knows the message is a half one: it exists
     * from then on (empty) */
    PyObject *topic_o = PyUnicode_DecodeASCII((const char *)r->v[S_B].p, r->v[S_B].n, NULL);
    PyObject *qid_o = topic_o ? PyLong_FromLongLong(qid) : NULL;
    PyObject *queue = qid_o ? tx_get_queue(c, topic_o, qid_o) : NULL;
    Py_XDECREF(topic_o);
    Py_XDECREF(qid_o);
    if (!queue) return NULL;
    Py_DECREF(queue);
    long long at[2];  /* the half's queue offset and commit-log offset */
    if (tx_store_record(c, HALF_TOPIC, 0, props_tag_code(&m), build_half, &h, at) < 0) return NULL;

    char msg_id[2 * (20 + 8) + 1], offset_text[24];
    static const char hex[] = "0123456789ABCDEF";
    uint8_t raw[28];
    memcpy(raw, c->store_host, c->store_host_len);
    put64(raw + c->store_host_len, at[1]);
    Py_ssize_t raw_len = c->store_host_len + 8;
    for (Py_ssize_t i = 0; i < raw_len; i++) {
        msg_id[2 * i] = hex[raw[i] >> 4]; msg_id[2 * i + 1] = hex[raw[i] & 15];
    }
    msg_id[2 * raw_len] = 0;
    snprintf(offset_text, sizeof(offset_text), "%lld", at[0]);
    const char *names[5] = {"queueId", "TRACE_ON", "MSG_REGION", "msgId", "queueOffset"};
    const char *values[5] = {qid_text, c->trace_on, c->region, msg_id, offset_text};
    if (r->flag & FLAG_ONEWAY) Py_RETURN_NONE;
    PyObject *a = success_frame(ser, r->opaque, c->version, 5, names, values);
    if (!a && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "send answer too long");
    return a;
}

/* ---------------------------------------------------------------- END_TRANSACTION */

/* A stored record's parts (message.py record_layout); -1 when it is not a plain V1 record. */
typedef struct {
    int32_t sys_flag;
    Py_ssize_t born_len, store_len, body_pos, body_len, props_pos, props_len;
} layout_t;

static int layout_of(const uint8_t *r, Py_ssize_t n, layout_t *l) {
    if (n < 91 || rd32(r) != n || rd32(r + 4) != MAGIC_V1) return -1;
    l->sys_flag = rd32(r + 36);
    l->born_len = l->sys_flag & 0x10 ? 20 : 8;
    l->store_len = l->sys_flag & 0x20 ? 20 : 8;
    Py_ssize_t p = 48 + l->born_len + 8 + l->store_len + 12;
    if (p + 4 > n) return -1;
    l->body_len = rd32(r + p);
    l->body_pos = p + 4;
    if (l->body_len < 0 || l->body_pos + l->body_len + 1 > n) return -1;
    p = l->body_pos + l->body_len;
    int8_t tl = (int8_t)r[p];
    if (tl < 0 || p + 1 + tl + 2 > n) return -1;
    p += 1 + tl;
    l->props_len = rd16(r + p);
    l->props_pos = p + 2;
    if (l->props_len < 0 || l->props_pos + l->props_len != n) return -1;
    return 0;
}

typedef struct {
    const uint8_t *half; const layout_t *l;
    const span_t *topic; int64_t qid, prepared;
    const uint8_t *props; Py_ssize_t props_len;
} commit_t;

/* transactions.py committed_record: the half's record as its real topic and queue, sysFlag
 * COMMIT, the half's offset as preparedTransactionOffset. */
static PyObject *build_commit(const void *arg, int64_t offset, int64_t phys, int64_t now) {
    const commit_t *m = arg;
    const layout_t *l = m->l;
    const uint8_t *h = m->half;
    Py_ssize_t store_at = 56 + l->born_len;
    Py_ssize_t total = store_at + l->store_len + 12 + 4 + l->body_len + 1 + m->topic->n + 2 +
                       m->props_len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    o = put32(o, (int32_t)total); o = put32(o, MAGIC_V1);
    o = put(o, h + 8, 4);                                     /* body CRC */
    o = put32(o, (int32_t)m->qid);
    o = put(o, h + 16, 4);                                    /* flag */
    o = put64(o, offset); o = put64(o, phys);
    o = put32(o, (l->sys_flag & ~SYSFLAG_TX_MASK) | TX_COMMIT);
    o = put(o, h + 40, 8 + l->born_len);                      /* born time and host */
    o = put64(o, now);
    o = put(o, h + store_at, l->store_len + 4);               /* store host, reconsume times */
    o = put64(o, m->prepared);
    o = put(o, h + l->body_pos - 4, 4 + l->body_len);
    *o++ = (uint8_t)m->topic->n; o = put(o, m->topic->p, m->topic->n);
    o[0] = (uint8_t)(m->props_len >> 8); o[1] = (uint8_t)m->props_len; o += 2;
    put(o, m->props, m->props_len);
    return out;
}

typedef struct { const ctx_t *c; int64_t half_offset; } op_t;

/* transactions.py op_record: tag "d", the half queue offset as body, the broker as host. */
static PyObject *build_op(const void *arg, int64_t offset, int64_t phys, int64_t now) {
    const op_t *m = arg;
    const ctx_t *c = m->c;
    props_t pm;  /* OP_PROPERTIES: {TAGS: d, WAIT: true} in HashMap order */
    pm.n = 0;
    props_put(&pm, (const uint8_t *)"TAGS", 4, (const uint8_t *)"d", 1);
    props_put(&pm, (const uint8_t *)"WAIT", 4, (const uint8_t *)"true", 4);
    uint8_t props[64];
    Py_ssize_t pl = props_write(&pm, props);
    char body[24];
    int bl = snprintf(body, sizeof(body), "%lld", (long long)m->half_offset);
    PyObject *crc = PyObject_CallFunction(c->crc32, "y#", body, (Py_ssize_t)bl);
    if (!crc) return NULL;
    unsigned long crc_v = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (crc_v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t hl = c->store_host_len, tl = (Py_ssize_t)strlen(OP_TOPIC);
    Py_ssize_t total = 56 + 2 * hl + 12 + 4 + bl + 1 + tl + 2 + pl;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    o = put32(o, (int32_t)total); o = put32(o, MAGIC_V1);
    o = put32(o, (int32_t)(crc_v & 0x7FFFFFFF)); o = put32(o, 0); o = put32(o, 0);
    o = put64(o, offset); o = put64(o, phys); o = put32(o, hl == 20 ? 0x30 : 0);
    o = put64(o, now); o = put(o, c->store_host, hl); o = put64(o, now);
    o = put(o, c->store_host, hl); o = put32(o, 0); o = put64(o, 0);
    o = put32(o, bl); o = put(o, body, bl);
    *o++ = (uint8_t)tl; o = put(o, OP_TOPIC, tl);
    o[0] = 0; o[1] = (uint8_t)pl; o += 2;
    put(o, props, pl);
    return out;
}

/* END_TRANSACTION COMMIT / ROLLBACK whose checks pass (transactions.py end_transaction). */
static PyObject *end_transaction(const ctx_t *c, const req_t *r, int ser) {
    int64_t table, phys, kind, queue_offset = -1;
    if (!r->v[E_GROUP].set || !r->v[E_MSGID].set) return NULL;
    if (parse_num(&r->v[E_TABLE], 64, &table) < 0 || parse_num(&r->v[E_PHYS], 64, &phys) < 0 ||
        parse_num(&r->v[E_KIND], 32, &kind) < 0)
        return NULL;
    if (kind != TX_COMMIT && kind != TX_ROLLBACK) return NULL;
    PyObject *op_cfg = tx_topic_config(c, (const uint8_t *)OP_TOPIC, strlen(OP_TOPIC));
    if (!op_cfg) return NULL;
    PyObject *half = tx_find_half(c, phys, table, &queue_offset);
    if (!half) return NULL;
    PyObject *out = NULL;
    const uint8_t *h = (const uint8_t *)PyBytes_AS_STRING(half);
    layout_t l;
    props_t m;
    long long at[2];
    if (layout_of(h, PyBytes_GET_SIZE(half), &l) < 0 ||
        !hdr_ascii(h + l.props_pos, l.props_len) ||
        props_parse(h + l.props_pos, l.props_len, &m) < 0)
        goto done;
    int g = props_find(&m, "PGROUP");
    if (g < 0 || m.value[g].n != r->v[E_GROUP].n ||
        memcmp(m.value[g].p, r->v[E_GROUP].p, m.value[g].n) != 0 || queue_offset != table)
        goto done;  /* Python answers the error */
    if (kind == TX_COMMIT) {
        int t = props_find(&m, "REAL_TOPIC"), q = props_find(&m, "REAL_QID");
        int64_t qid;
        if (t < 0 || q < 0 || m.value[t].n > 127) goto done;
        span_t qs = {m.value[q].p, m.value[q].n, 1};
        if (qs.n < 1 || qs.p[0] < '0' || qs.p[0] > '9' || parse_num(&qs, 32, &qid) < 0)
            goto done;
        uint8_t text[MAX_PROPS_BYTES + 1];
        Py_ssize_t text_len = props_write(&m, text);
        if (text_len < 0) goto done;
        commit_t cm = {h, &l, &m.value[t], qid, phys, text, text_len};
        char topic[128];
        memcpy(topic, m.value[t].p, m.value[t].n);
        topic[m.value[t].n] = 0;
        if (tx_store_record(c, topic, qid, props_tag_code(&m), build_commit, &cm, at) < 0)
            goto done;
    }
    op_t op = {c, queue_offset};
    if (tx_store_record(c, OP_TOPIC, 0, java_hash((const uint8_t *)"d", 1), build_op, &op, at) < 0)
        goto done;
    if (r->flag & FLAG_ONEWAY) { Py_INCREF(Py_None); out = Py_None; }
    else if (!(out = success_frame(ser, r->opaque, c->version, 0, NULL, NULL)))
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "end answer too long");
done:
    Py_DECREF(half);
    return out;
}

/* ---------------------------------------------------------------- the run of frames */

/* One frame (after its length prefix): its answer (None for a oneway one), NULL without an
 * error when Python must answer it, NULL with an error. *kind says which it was. */
static PyObject *answer(const ctx_t *c, const uint8_t *f, Py_ssize_t n, int *kind) {
    if (n < 4) return NULL;
    uint32_t word = (uint32_t)rd32(f);
    uint32_t ser = word >> 24, hl = word & 0xFFFFFF;
    if (4 + (Py_ssize_t)hl > n) return NULL;
    req_t r;
    memset(&r, 0, sizeof(r));
    PyObject *out = NULL;
    if (ser == 1) { if (read_binary(f + 4, hl, &r) < 0) return NULL; }
    else if (ser == 0) {
        if (!(r.arena = PyMem_Malloc(hl + 1))) return PyErr_NoMemory();
        if (read_json(f + 4, hl, &r) < 0) goto done;
    }
    else return NULL;
    if (!r.have_code || (r.flag & FLAG_RESPONSE)) goto done;
    if (r.code == 310) {
        *kind = 0;
        out = half_send(c, &r, (int)ser, f + 4 + hl, n - 4 - hl);
    } else if (r.code == 37 && n == 4 + (Py_ssize_t)hl) {
        *kind = 1;
        out = end_transaction(c, &r, (int)ser);
    }
done:
    PyMem_Free(r.arena);
    return out;
}

/* Header values are written into JSON answers as they are: plain printable ASCII only. */
static int json_safe(const char *s) {
    for (; *s; s++)
        if ((uint8_t)*s < 0x20 || (uint8_t)*s >= 0x7F || *s == '"' || *s == '\\') return 0;
    return 1;
}

/* Set when a batch's store raised, cleared by a call that stores a record at a time without
 * an error: while the store keeps failing (a full disk), a call does not try the batch first
 * and then again record by record (each call takes the rest of a chunk after a failed frame,
 * so that would be quadratic in its frames). Either way stores the same. */
static int unbatched_next;

/* serve_tx(data, store, long_poll, crc32, store_host, born_host, cluster, trace_on, region,
 *          max_message_size, version) -> (answers, consumed, sends, ends)
 * Answers the whole frames at the start of ``data`` while each is one this path takes;
 * ``consumed`` bytes of ``data`` were handled (oneway ones have no answer), the rest is for
 * the Python path. */
/* One pass over the whole frames at the start of d[0, len): their answers appended to
 * ``answers``, *used the bytes taken, counts[] the sends and ends, *failed (exception, frame
 * size) for a frame whose Python call raised. In batch mode (c->b) the records are stored at
 * the end (tx_flush_batch), or before the failing frame's exception is handed back. Returns 0;
 * 1 when the batch's store raised (nothing of the pass was stored: the caller runs the
 * frames again a record at a time, where the failure falls on the record whose append
 * raises, as in the Python path); -1 on an error that ends the call (the server then closes
 * the connection), as when a queue's extend or the notify raises after the log took the
 * records. */
static int run(const ctx_t *c, const uint8_t *d, Py_ssize_t len, PyObject *answers,
               Py_ssize_t *used, Py_ssize_t counts[2], PyObject **failed) {
    Py_ssize_t pos = 0;
    while (len - pos >= 4) {
        int32_t length = rd32(d + pos);
        if (length < 4 || (int64_t)length + 4 > MAX_FRAME || len - pos - 4 < length) break;
        if (c->b && c->b->nq > MAX_PQ - 2) break;  /* a frame meets at most two new queues */
        int kind = -1;
        PyObject *a = answer(c, d + pos + 4, length, &kind);
        if (!a) {
            /* A Python error in the middle of a run (the store's append raising, say): the
             * frames before it stand (stored, answered); this one goes back to the caller with
             * the exception, to be answered SYSTEM_ERROR as the Python path's dispatch does. */
            if (!PyErr_Occurred()) break;
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb && value) PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            if (!value) return -1;
            int flushed = c->b ? tx_flush_batch(c) : 0;  /* what the frames before it (and
                                                        * its own records before it) built */
            if (flushed < 0) {
                Py_DECREF(value);
                if (flushed == -2 || !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
                PyErr_Clear();
                return 1;
            }
            if (!(*failed = Py_BuildValue("(Nn)", value, (Py_ssize_t)length + 4))) return -1;
            *used = pos;
            return 0;
        }
        int rc = a == Py_None ? 0 : PyList_Append(answers, a);
        Py_DECREF(a);
        if (rc < 0) return -1;
        counts[kind]++;
        pos += 4 + length;
    }
    *used = pos;
    int flushed = c->b ? tx_flush_batch(c) : 0;
    if (flushed < 0) {
        if (flushed == -2 || !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* serve_tx(data, store, long_poll, crc32, store_host, born_host, cluster, trace_on, region,
 *          max_message_size, version) -> (answers, consumed, sends, ends, failed)
 * Answers the whole frames at the start of ``data`` while each is one this path takes;
 * ``consumed`` bytes of ``data`` were handled (oneway ones have no answer), the rest is for
 * the Python path. */
static PyObject *serve_tx(PyObject *self, PyObject *args) {
    Py_buffer data;
    ctx_t c;
    batch_t batch;
    memset(&c, 0, sizeof(c));
    memset(&batch, 0, sizeof(batch));
    if (!PyArg_ParseTuple(args, "y*OOOy#y#sssLi", &data, &c.store, &c.long_poll, &c.crc32,
                          &c.store_host, &c.store_host_len, &c.born_host, &c.born_host_len,
                          &c.cluster, &c.trace_on, &c.region, &c.max_message_size, &c.version))
        return NULL;
    PyObject *answers = PyList_New(0), *failed = NULL;
    Py_ssize_t pos = 0, counts[2] = {0, 0};
    if (!answers || tx_store_names() < 0) goto fail;
    int usable = (c.store_host_len == 8 || c.store_host_len == 20) &&
                 (c.born_host_len == 8 || c.born_host_len == 20) && json_safe(c.trace_on) &&
                 json_safe(c.region) && strlen(c.cluster) > 0 &&
                 !strpbrk(c.cluster, "\001\002") && hdr_ascii((const uint8_t *)c.cluster,
                                                          (Py_ssize_t)strlen(c.cluster));
    if (usable) {
        if (!(c.topics = PyObject_GetAttrString(c.store, "topics"))) goto fail;
        if (!(c.commit_log = PyObject_GetAttrString(c.store, "commit_log"))) goto fail;
        if (!(c.queues = PyObject_GetAttrString(c.store, "queues"))) goto fail;
        if (!PyDict_Check(c.topics) || !PyDict_Check(c.queues)) usable = 0;
        if ((c.own_clock = tx_own_clock(c.store)) < 0) goto fail;
    }
    if (usable) {
        c.b = unbatched_next ? NULL : &batch;
        int rc = run(&c, data.buf, data.len, answers, &pos, counts, &failed);
        if (rc == 1) {  /* the batch was not stored: again, a record at a time */
            unbatched_next = 1;
            Py_DECREF(answers);
            if (!(answers = PyList_New(0))) goto fail;
            counts[0] = counts[1] = 0;
            pos = 0;
            c.b = NULL;
            rc = run(&c, data.buf, data.len, answers, &pos, counts, &failed);
        }
        if (rc < 0) goto fail;
        if (!c.b && !failed) unbatched_next = 0;
    }
    Py_XDECREF(c.topics);
    Py_XDECREF(c.commit_log);
    Py_XDECREF(c.queues);
    PyBuffer_Release(&data);
    if (!failed) {
        failed = Py_None;
        Py_INCREF(failed);
    }
    return Py_BuildValue("(NnnnN)", answers, pos, counts[0], counts[1], failed);
fail:
    tx_batch_clear(&batch);
    Py_XDECREF(answers);
    Py_XDECREF(failed);
    Py_XDECREF(c.topics);
    Py_XDECREF(c.commit_log);
    Py_XDECREF(c.queues);
    PyBuffer_Release(&data);
    return NULL;
}

static PyMethodDef serve_tx_functions[] = {
    {"serve_tx", serve_tx, METH_VARARGS,
     "Answer the half sends and END_TRANSACTIONs at the start of a received chunk "
     "(embedded broker): (answers, bytes used, sends, ends, failure), failure None or "
     "(exception, frame size) for a frame whose Python call raised at byte ``used``."},
    {NULL, NULL, 0, NULL},
};

int rmq_serve_tx_register(PyObject *module) {
    return PyModule_AddFunctions(module, serve_tx_functions);
}
