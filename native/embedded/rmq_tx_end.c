/*
 * serve_tx()'s END_TRANSACTION (rmq_serve_tx.h): COMMIT stores the half message as its real
 * topic and queue, COMMIT and ROLLBACK both store an op record, as embedded/transactions.py
 * end_transaction does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_reqhdr.h"
#include "rmq_serve_tx.h"

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
    tx_props_put(&pm, (const uint8_t *)"TAGS", 4, (const uint8_t *)"d", 1);
    tx_props_put(&pm, (const uint8_t *)"WAIT", 4, (const uint8_t *)"true", 4);
    uint8_t props[64];
    Py_ssize_t pl = tx_props_write(&pm, props);
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
PyObject *tx_end_transaction(const ctx_t *c, const req_t *r, int ser) {
    int64_t table, phys, kind, queue_offset = -1;
    if (!r->v[E_GROUP].set || !r->v[E_MSGID].set) return NULL;
    if (tx_parse_num(&r->v[E_TABLE], 64, &table) < 0 ||
        tx_parse_num(&r->v[E_PHYS], 64, &phys) < 0 || tx_parse_num(&r->v[E_KIND], 32, &kind) < 0)
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
        tx_props_parse(h + l.props_pos, l.props_len, &m) < 0)
        goto done;
    int g = tx_props_find(&m, "PGROUP");
    if (g < 0 || m.value[g].n != r->v[E_GROUP].n ||
        memcmp(m.value[g].p, r->v[E_GROUP].p, m.value[g].n) != 0 || queue_offset != table)
        goto done;  /* Python answers the error */
    if (kind == TX_COMMIT) {
        int t = tx_props_find(&m, "REAL_TOPIC"), q = tx_props_find(&m, "REAL_QID");
        int64_t qid;
        if (t < 0 || q < 0 || m.value[t].n > 127) goto done;
        span_t qs = {m.value[q].p, m.value[q].n, 1};
        if (qs.n < 1 || qs.p[0] < '0' || qs.p[0] > '9' || tx_parse_num(&qs, 32, &qid) < 0)
            goto done;
        uint8_t text[MAX_PROPS_BYTES + 1];
        Py_ssize_t text_len = tx_props_write(&m, text);
        if (text_len < 0) goto done;
        commit_t cm = {h, &l, &m.value[t], qid, phys, text, text_len};
        char topic[128];
        memcpy(topic, m.value[t].p, m.value[t].n);
        topic[m.value[t].n] = 0;
        if (tx_store_record(c, topic, qid, tx_props_tag_code(&m), build_commit, &cm, at) < 0)
            goto done;
    }
    op_t op = {c, queue_offset};
    int32_t op_tag = tx_java_hash((const uint8_t *)"d", 1);
    if (tx_store_record(c, OP_TOPIC, 0, op_tag, build_op, &op, at) < 0)
        goto done;
    if (r->flag & FLAG_ONEWAY) { Py_INCREF(Py_None); out = Py_None; }
    else if (!(out = tx_success_frame(ser, r->opaque, c->version, 0, NULL, NULL)))
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "end answer too long");
done:
    Py_DECREF(half);
    return out;
}
