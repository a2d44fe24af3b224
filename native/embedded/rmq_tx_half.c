/*
 * serve_tx()'s half sends (rmq_serve_tx.h): SEND_MESSAGE_V2 with TRAN_MSG=true, stored as
 * embedded/send.py handle_send stores them (the half message in RMQ_SYS_TRANS_HALF_TOPIC).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_reqhdr.h"
#include "rmq_serve_tx.h"

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

static int span_is(const span_t *s, const char *t) {
    Py_ssize_t n = (Py_ssize_t)strlen(t);
    return s->n == n && memcmp(s->p, t, n) == 0;
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
PyObject *tx_half_send(const ctx_t *c, const req_t *r, int ser, const uint8_t *body,
                       Py_ssize_t body_len) {
    /* bname beside n is what a client sends for a 5.1+ proxy's sake; the broker reads
     * neither, so it does not make the send Python's */
    for (int k = L_GROUP; k < L_BNAME; k++)
        if (r->v[k].set) return NULL;
    int64_t x, qid, sys_flag, born_ts, flag, reconsume = 0;
    if (!r->v[S_A].set || !r->v[S_B].set || !r->v[S_C].set || !r->v[S_I].set) return NULL;
    if (tx_parse_num(&r->v[S_D], 32, &x) < 0 || tx_parse_num(&r->v[S_E], 32, &qid) < 0 ||
        tx_parse_num(&r->v[S_F], 32, &sys_flag) < 0 || tx_parse_num(&r->v[S_G], 64, &born_ts) < 0 ||
        tx_parse_num(&r->v[S_H], 32, &flag) < 0)
        return NULL;
    if (r->v[S_J].set && tx_parse_num(&r->v[S_J], 32, &reconsume) < 0) return NULL;
    if (r->v[S_M].set && tx_java_true(r->v[S_M].p, r->v[S_M].n)) return NULL;  /* a batch */
    if (!plain_topic(&r->v[S_B]) || body_len > c->max_message_size) return NULL;
    props_t m;
    if (tx_props_parse(r->v[S_I].p, r->v[S_I].n, &m) < 0) return NULL;
    int t = tx_props_find(&m, "TRAN_MSG");
    if (t < 0 || !tx_java_true(m.value[t].p, m.value[t].n)) return NULL;
    int ok = tx_topic_takes(c, r->v[S_B].p, r->v[S_B].n, qid);
    if (ok <= 0) return NULL;
    PyObject *half_cfg = tx_topic_config(c, (const uint8_t *)HALF_TOPIC, strlen(HALF_TOPIC));
    if (!half_cfg) return NULL;  /* the first half send creates it, in Python */

    /* half_properties: CLUSTER, REAL_TOPIC, REAL_QID set, in HashMap order */
    char qid_text[24];
    snprintf(qid_text, sizeof(qid_text), "%lld", (long long)qid);
    if (tx_props_put(&m, (const uint8_t *)"CLUSTER", 7, (const uint8_t *)c->cluster,
                     (Py_ssize_t)strlen(c->cluster)) < 0 ||
        tx_props_put(&m, (const uint8_t *)"REAL_TOPIC", 10, r->v[S_B].p, r->v[S_B].n) < 0 ||
        tx_props_put(&m, (const uint8_t *)"REAL_QID", 8, (const uint8_t *)qid_text,
                     (Py_ssize_t)strlen(qid_text)) < 0)
        return NULL;
    uint8_t text[MAX_PROPS_BYTES + 1];  /* not static: tx_store_record runs Python code, and
                                         * another broker's thread may come in meanwhile */
    Py_ssize_t text_len = tx_props_write(&m, text);
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
    if (tx_store_record(c, HALF_TOPIC, 0, tx_props_tag_code(&m), build_half, &h, at) < 0)
        return NULL;

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
    PyObject *a = tx_success_frame(ser, r->opaque, c->version, 5, names, values);
    if (!a && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "send answer too long");
    return a;
}
