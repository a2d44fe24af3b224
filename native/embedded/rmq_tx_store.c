/*
 * The exactly-once C path's writes and reads of the embedded broker's store (see
 * rmq_tx_store.h), through the store's fast-path interface only: BrokerStore.now, .queue,
 * .topics, .queues and .commit_log (size, append), a queue's max_offset, append,
 * extend_timed and buffer_view (rmq_store.h), and the long-poll service's
 * notify_arrival_soon, as the Python path calls them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "rmq_bytes.h"
#include "rmq_store.h"
#include "rmq_tx_store.h"

#define PERM_WRITE 2

static PyObject *S_now, *S_queue, *S_append, *S_size, *S_notify,
                *S_perm, *S_rq, *S_wq, *S_filter, *S_max_offset;

int tx_store_names(void) {
#define I(var, text) if (!var && !(var = PyUnicode_InternFromString(text))) return -1
    I(S_now, "now"); I(S_queue, "queue"); I(S_append, "append");
    I(S_size, "size");
    I(S_notify, "notify_arrival_soon"); I(S_perm, "perm"); I(S_rq, "read_queue_nums");
    I(S_wq, "write_queue_nums"); I(S_filter, "topic_filter_type");
    I(S_max_offset, "max_offset");
#undef I
    return 0;
}

static int attr_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Whether store.now is embedded/store.py's BrokerStore.now bound to the store (not a
 * subclass's, not a clock a test put on the instance): 1, 0, or -1 with an error. */
static PyObject *broker_now, *S_last_store_timestamp;

int tx_own_clock(PyObject *store) {
    if (!S_last_store_timestamp &&
        !(S_last_store_timestamp = PyUnicode_InternFromString("last_store_timestamp")))
        return -1;
    if (!broker_now) {
        PyObject *mod = PyImport_ImportModule("rocketmq_spark.embedded.store");
        PyObject *cls = mod ? PyObject_GetAttrString(mod, "BrokerStore") : NULL;
        broker_now = cls ? PyObject_GetAttrString(cls, "now") : NULL;
        Py_XDECREF(mod);
        Py_XDECREF(cls);
        if (!broker_now) { PyErr_Clear(); return 0; }
    }
    PyObject *m = PyObject_GetAttr(store, S_now);
    if (!m) return -1;
    int mine = PyMethod_Check(m) && PyMethod_GET_FUNCTION(m) == broker_now &&
               PyMethod_GET_SELF(m) == store;
    Py_DECREF(m);
    return mine;
}

/* store.now() (a new reference). BrokerStore.now itself is done here, as it reads:
 * max(int(time.time() * 1000), self.last_store_timestamp), stored back there (the store's
 * fast-path interface allows it); time.time()'s double as CPython makes it from
 * CLOCK_REALTIME (_PyTime_AsSecondsDouble). Any other clock is called. */
static PyObject *store_now(const ctx_t *c) {
    if (!c->own_clock) return PyObject_CallMethodObjArgs(c->store, S_now, NULL);
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    double secs = ns % 1000000000 == 0 ? (double)(ns / 1000000000) : (double)ns / 1e9;
    long long ms = (long long)(secs * 1000.0), last;
    if (attr_ll(c->store, S_last_store_timestamp, &last) < 0) return NULL;
    if (last > ms) ms = last;
    PyObject *o = PyLong_FromLongLong(ms);
    if (o && PyObject_SetAttr(c->store, S_last_store_timestamp, o) < 0) Py_CLEAR(o);
    return o;
}

/* The topic's config in store.topics, borrowed; NULL (no error) when there is none. */
PyObject *tx_topic_config(const ctx_t *c, const uint8_t *t, Py_ssize_t n) {
    PyObject *name = PyUnicode_DecodeASCII((const char *)t, n, NULL);
    if (!name) return NULL;
    PyObject *cfg = PyDict_GetItemWithError(c->topics, name);
    Py_DECREF(name);
    return cfg;
}

/* store.queue(topic, queue_id) (a new reference): found in store.queues, else made by the
 * store's own method. */
PyObject *tx_get_queue(const ctx_t *c, PyObject *topic, PyObject *qid) {
    PyObject *key = PyTuple_Pack(2, topic, qid);
    if (!key) return NULL;
    PyObject *queue = PyDict_GetItemWithError(c->queues, key);
    Py_DECREF(key);
    if (queue) { Py_INCREF(queue); return queue; }
    if (PyErr_Occurred()) return NULL;
    return PyObject_CallMethodObjArgs(c->store, S_queue, topic, qid, NULL);
}

/* ConsumeQueue.max_offset. */
static int queue_max_offset(PyObject *queue, long long *out) {
    return attr_ll(queue, S_max_offset, out);
}


static int store_batched(const ctx_t *c, const char *topic, int64_t queue_id, int32_t code,
                         build_fn build, const void *arg, long long at[2]);

int tx_store_record(const ctx_t *c, const char *topic, int64_t queue_id, int32_t code,
                        build_fn build, const void *arg, long long at[2]) {
    if (c->b) return store_batched(c, topic, queue_id, code, build, arg, at);
    int rc = -1;
    PyObject *topic_o = NULL, *qid = NULL, *queue = NULL, *now_o = NULL, *record = NULL,
             *res = NULL, *code_o = NULL, *codes = NULL, *max_o = NULL;
    long long offset, phys, now;
    if (!(topic_o = PyUnicode_FromString(topic)) || !(qid = PyLong_FromLongLong(queue_id)))
        goto done;
    if (!(queue = tx_get_queue(c, topic_o, qid))) goto done;
    if (!(now_o = store_now(c))) goto done;
    now = PyLong_AsLongLong(now_o);
    if (now == -1 && PyErr_Occurred()) goto done;
    if (queue_max_offset(queue, &offset) < 0 || attr_ll(c->commit_log, S_size, &phys) < 0)
        goto done;
    at[0] = offset; at[1] = phys;
    if (!(record = build(arg, offset, phys, now))) goto done;
    if (!(res = PyObject_CallMethodObjArgs(c->commit_log, S_append, record, NULL))) goto done;
    Py_CLEAR(res);
    if (!(code_o = PyLong_FromLong(code))) goto done;
    if (!(res = PyObject_CallMethodObjArgs(queue, S_append, record, code_o, now_o, NULL)))
        goto done;
    Py_CLEAR(res);
    if (!(codes = PyList_New(1))) goto done;
    Py_INCREF(code_o);
    PyList_SET_ITEM(codes, 0, code_o);
    if (!(max_o = PyLong_FromLongLong(offset + 1))) goto done;
    if (!(res = PyObject_CallMethodObjArgs(c->long_poll, S_notify, topic_o, qid, max_o, codes,
                                           NULL)))
        goto done;
    rc = 0;
done:
    Py_XDECREF(topic_o); Py_XDECREF(qid); Py_XDECREF(queue); Py_XDECREF(now_o);
    Py_XDECREF(record); Py_XDECREF(res); Py_XDECREF(code_o); Py_XDECREF(codes);
    Py_XDECREF(max_o);
    return rc;
}

static void pq_clear(pq_t *q) {
    Py_CLEAR(q->queue); Py_CLEAR(q->topic_o); Py_CLEAR(q->qid_o);
    Py_CLEAR(q->records); Py_CLEAR(q->codes); Py_CLEAR(q->times);
    q->n = 0;
}

/* Forget the pending records (stored or dropped). */
void tx_batch_clear(batch_t *b) {
    for (int i = 0; i < b->nq; i++) pq_clear(&b->q[i]);
    b->nq = 0;
    Py_CLEAR(b->all);
    b->bytes = 0;
    b->have_base = 0;
}

/* The pending queue (topic, queue_id), NULL when the run has not stored in it. */
static pq_t *pq_find(batch_t *b, const char *topic, int64_t queue_id) {
    for (int i = 0; i < b->nq; i++)
        if (b->q[i].qid == queue_id && strcmp(b->q[i].topic, topic) == 0) return &b->q[i];
    return NULL;
}

/* tx_store_record in batch mode: the same Python calls up to the record (store.queue for a queue
 * the run meets first, store.now for every record, in the Python path's order, so a clock
 * gives the same store times), the record kept for tx_flush_batch. */
static int store_batched(const ctx_t *c, const char *topic, int64_t queue_id, int32_t code,
                         build_fn build, const void *arg, long long at[2]) {
    batch_t *b = c->b;
    pq_t *q = pq_find(b, topic, queue_id);
    if (!q) {
        size_t tl = strlen(topic);
        if (b->nq == MAX_PQ || tl >= sizeof(q->topic)) {
            PyErr_SetString(PyExc_SystemError, "serve_tx: too many queues in one run");
            return -1;
        }
        pq_t *n = &b->q[b->nq];
        memset(n, 0, sizeof(*n));
        memcpy(n->topic, topic, tl + 1);
        n->qid = queue_id;
        if (!(n->topic_o = PyUnicode_FromString(topic)) ||
            !(n->qid_o = PyLong_FromLongLong(queue_id)) ||
            !(n->queue = tx_get_queue(c, n->topic_o, n->qid_o)) ||
            queue_max_offset(n->queue, &n->base) < 0 || !(n->records = PyList_New(0)) ||
            !(n->codes = PyList_New(0)) || !(n->times = PyList_New(0))) {
            pq_clear(n);
            return -1;
        }
        q = n;
        b->nq++;
    }
    if (!b->all && !(b->all = PyList_New(0))) return -1;
    if (!b->have_base) {
        if (attr_ll(c->commit_log, S_size, &b->log_base) < 0) return -1;
        b->have_base = 1;
    }
    PyObject *now_o = store_now(c);
    if (!now_o) return -1;
    long long now = PyLong_AsLongLong(now_o);
    if (now == -1 && PyErr_Occurred()) { Py_DECREF(now_o); return -1; }
    at[0] = q->base + q->n;
    at[1] = b->log_base + b->bytes;
    PyObject *record = build(arg, at[0], at[1], now), *code_o = NULL;
    int rc = -1;
    if (record && (code_o = PyLong_FromLong(code)) && PyList_Append(q->times, now_o) == 0 &&
        PyList_Append(q->codes, code_o) == 0 && PyList_Append(q->records, record) == 0 &&
        PyList_Append(b->all, record) == 0) {
        q->n++;
        b->bytes += PyBytes_GET_SIZE(record);
        rc = 0;
    }
    Py_DECREF(now_o);
    Py_XDECREF(record);
    Py_XDECREF(code_o);
    return rc;
}

/* Hand the pending records to the store: commit_log.append of them all (physical offsets from
 * its size), then each queue's extend_timed (ConsumeQueue.append of each record in turn),
 * then one long_poll.notify_arrival_soon per queue with the queue's new max offset and the
 * tag codes stored (what the per-record calls would have woken: a pull parks at the queue's
 * max offset, so every record of the run is at or after it). Returns 0, or -1 with an error
 * set: -1 when the commit log's append raised (nothing was stored), -2 when a later call did
 * (the records are in the log: not to be stored again). The pending records are forgotten
 * either way. */
static PyObject *S_extend_timed, *S_join;

int tx_flush_batch(const ctx_t *c) {
    batch_t *b = c->b;
    int rc = -1;
    PyObject *empty = NULL, *data = NULL, *res = NULL;
    if (!b->all || PyList_GET_SIZE(b->all) == 0) { rc = 0; goto done; }
    if (!S_extend_timed && !(S_extend_timed = PyUnicode_InternFromString("extend_timed")))
        goto done;
    if (!S_join && !(S_join = PyUnicode_InternFromString("join"))) goto done;
    if (PyList_GET_SIZE(b->all) == 1) {
        data = PyList_GET_ITEM(b->all, 0);
        Py_INCREF(data);
    } else {
        if (!(empty = PyBytes_FromStringAndSize(NULL, 0))) goto done;
        if (!(data = PyObject_CallMethodObjArgs(empty, S_join, b->all, NULL))) goto done;
    }
    if (!(res = PyObject_CallMethodObjArgs(c->commit_log, S_append, data, NULL))) goto done;
    Py_CLEAR(res);
    rc = -2;
    for (int i = 0; i < b->nq; i++) {
        pq_t *q = &b->q[i];
        if (!q->n) continue;
        if (!(res = PyObject_CallMethodObjArgs(q->queue, S_extend_timed, q->records, q->codes,
                                               q->times, NULL)))
            goto done;
        Py_CLEAR(res);
    }
    for (int i = 0; i < b->nq; i++) {
        pq_t *q = &b->q[i];
        if (!q->n) continue;
        PyObject *max_o = PyLong_FromLongLong(q->base + q->n);
        if (!max_o) goto done;
        res = PyObject_CallMethodObjArgs(c->long_poll, S_notify, q->topic_o, q->qid_o, max_o,
                                         q->codes, NULL);
        Py_DECREF(max_o);
        if (!res) goto done;
        Py_CLEAR(res);
    }
    rc = 0;
done:
    Py_XDECREF(empty); Py_XDECREF(data); Py_XDECREF(res);
    tx_batch_clear(b);
    return rc;
}

/* 1: the topic exists, is writable, SINGLE_TAG and has queue qid; 0: not so; -1: error. */
int tx_topic_takes(const ctx_t *c, const uint8_t *topic, Py_ssize_t n, int64_t qid) {
    PyObject *cfg = tx_topic_config(c, topic, n);
    if (!cfg) return PyErr_Occurred() ? -1 : 0;
    long long perm, rq, wq;
    if (attr_ll(cfg, S_perm, &perm) < 0 || attr_ll(cfg, S_rq, &rq) < 0 ||
        attr_ll(cfg, S_wq, &wq) < 0)
        return -1;
    PyObject *filter = PyObject_GetAttr(cfg, S_filter);
    if (!filter) return -1;
    int single = PyUnicode_Check(filter) &&
                 PyUnicode_CompareWithASCIIString(filter, "SINGLE_TAG") == 0;
    Py_DECREF(filter);
    return single && (perm & PERM_WRITE) && qid >= 0 && qid < (wq > rq ? wq : rq);
}

/* The half record stored at commit-log offset phys (transactions.py _half_at: a binary
 * search of the half queue), copied; NULL without an error when there is none. The record at
 * queue offset ``hint`` (the request's tranStateTableOffset) is looked at first: commit-log
 * offsets are unique, so when it matches it is the one the search finds. */
/* tx_find_half among the half records this run has not yet stored (batch mode): a half sent
 * earlier in the same chunk; a new reference, NULL without an error when there is none. */
static PyObject *find_pending_half(batch_t *b, int64_t phys, int64_t hint,
                                   int64_t *queue_offset) {
    pq_t *q = pq_find(b, HALF_TOPIC, 0);
    if (!q || !q->n) return NULL;
    Py_ssize_t lo = 0, hi = q->n, probe = -1;
    if (hint >= q->base && hint - q->base < hi) probe = (Py_ssize_t)(hint - q->base);
    while (lo < hi) {
        Py_ssize_t mid = probe >= 0 ? probe : (lo + hi) / 2;
        probe = -1;
        PyObject *rec = PyList_GET_ITEM(q->records, mid);
        const uint8_t *r = (const uint8_t *)PyBytes_AS_STRING(rec);
        if (PyBytes_GET_SIZE(rec) < 36) return NULL;
        int64_t at = ((int64_t)(uint32_t)rd32(r + 28) << 32) | (uint32_t)rd32(r + 32);
        if (at == phys) {
            *queue_offset = q->base + mid;
            Py_INCREF(rec);
            return rec;
        }
        if (at < phys) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

PyObject *tx_find_half(const ctx_t *c, int64_t phys, int64_t hint, int64_t *queue_offset) {
    PyObject *key = Py_BuildValue("(si)", HALF_TOPIC, 0);  /* store.existing_queue */
    if (!key) return NULL;
    PyObject *queue = PyDict_GetItemWithError(c->queues, key);
    Py_DECREF(key);
    if (!queue) return NULL;
    Py_INCREF(queue);
    PyObject *out = NULL;
    queue_view_t q;
    if (queue_view_open(queue, &q) != 0) goto done;
    Py_ssize_t lo = 0, hi = q.count, probe = -1;
    if (hint >= q.first && hint - q.first < hi) probe = (Py_ssize_t)(hint - q.first);
    while (lo < hi) {
        Py_ssize_t mid = probe >= 0 ? probe : (lo + hi) / 2;
        probe = -1;
        int64_t start = queue_view_start(&q, mid) - q.base, stop = q.ends[mid] - q.base;
        if (start < 0 || stop > q.len || stop - start < 36) goto done;
        int64_t at = ((int64_t)(uint32_t)rd32(q.buf + start + 28) << 32) |
                     (uint32_t)rd32(q.buf + start + 32);
        if (at == phys) {
            *queue_offset = q.first + mid;
            out = PyBytes_FromStringAndSize((const char *)q.buf + start, stop - start);
            break;
        }
        if (at < phys) lo = mid + 1; else hi = mid;
    }
done:
    queue_view_close(&q);
    Py_DECREF(queue);
    if (!out && !PyErr_Occurred() && c->b)
        out = find_pending_half(c->b, phys, hint, queue_offset);
    return out;
}
