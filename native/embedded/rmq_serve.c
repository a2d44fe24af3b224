/*
 * serve_pulls(): the embedded broker's answer to plain FOUND pulls, in C.
 *
 * The embedded broker (rocketmq_spark/embedded) shares the machine's cores with every client
 * it serves in our benchmarks; at a genuine broker's default caps a reader sends one pull per
 * 32 messages, and answering each in Python cost more than reading it. This answers the
 * common case byte for byte as rocketmq_spark/embedded/pull.py does (that module is the
 * reference, and a test holds the two against each other): an unfiltered subscription pull
 * (sysFlag has SUBSCRIPTION, not COMMIT_OFFSET; subscription "*" or empty; expression type TAG
 * or absent) of a readable topic's valid queue at an offset within [min, max). Anything else,
 * and any field that is not plain, stops it: that frame and the rest go to the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_embedded.h"
#include "rmq_reqhdr.h"
#include "rmq_store.h"

#define PERM_READ 4
#define FLAG_SUSPEND 0x2
#define FLAG_COMMIT 0x1
#define FLAG_SUBSCRIPTION 0x4
#define MAX_FRAME (16 * 1024 * 1024)

enum { K_GROUP, K_TOPIC, K_QID, K_OFFSET, K_NUMS, K_SYSFLAG, K_COMMIT, K_SUSPEND, K_SUB,
       K_SUBVER, K_EXPR, NKEYS };
static const char *KEYS[NKEYS] = {"consumerGroup", "topic", "queueId", "queueOffset",
                                  "maxMsgNums", "sysFlag", "commitOffset",
                                  "suspendTimeoutMillis", "subscription", "subVersion",
                                  "expressionType"};

typedef struct { const uint8_t *p; Py_ssize_t n; int set, plain; } span_t;

typedef struct {
    int32_t code, flag, opaque;
    int have_code, have_flag, have_opaque;
    span_t v[NKEYS];
} req_t;


static void keep(req_t *r, const uint8_t *k, Py_ssize_t kl, const uint8_t *v, Py_ssize_t vl,
                 int plain) {
    for (int i = 0; i < NKEYS; i++) {
        if ((Py_ssize_t)strlen(KEYS[i]) == kl && memcmp(KEYS[i], k, kl) == 0) {
            r->v[i].p = v; r->v[i].n = vl; r->v[i].set = 1; r->v[i].plain = plain;
            return;
        }
    }
}

/* ---- the header walkers (rmq_reqhdr.h), keeping request fields */

static int keep_ext(void *ctx, const uint8_t *k, Py_ssize_t kl, int kesc, const uint8_t *v,
                    Py_ssize_t vl, int vstr, int vesc) {
    /* a JSON number is its text to Python; true/false/null/objects are not what this path
     * takes; an escaped key is not one of ours */
    int plain = vstr ? !vesc : vl > 0 && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9'));
    if (!kesc) keep((req_t *)ctx, k, kl, v, vl, plain);
    return 0;
}

static int read_binary(const uint8_t *h, Py_ssize_t n, req_t *r) {
    if (hdr_read_binary(h, n, &r->code, &r->opaque, &r->flag, keep_ext, r) < 0) return -1;
    r->have_code = r->have_opaque = r->have_flag = 1;
    return 0;
}

/* ---- fastjson-shaped JSON (rmq_json.h), keeping request fields */

static int keep_top(void *ctx, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                    Py_ssize_t vl) {
    req_t *r = ctx;
    int64_t x;  /* code and flag: optional '-', 1 to 9 digits */
    int is = rmq_dec(v, vl, RMQ_DEC_MINUS, 9, INT32_MIN, INT32_MAX, &x) == 0;
    if (kl == 4 && memcmp(k, "code", 4) == 0) {
        if (!is) return -1;
        r->code = (int32_t)x; r->have_code = 1;
    } else if (kl == 4 && memcmp(k, "flag", 4) == 0) {
        if (!is) return -1;
        r->flag = (int32_t)x; r->have_flag = 1;
    } else if (kl == 6 && memcmp(k, "opaque", 6) == 0) {
        /* opaques go up to 2^31 - 1: ten digits */
        if (hdr_json_int32(v, vl, &r->opaque) < 0) return -1;
        r->have_opaque = 1;
    }
    return 0;
}

static int read_json(const uint8_t *p, Py_ssize_t n, req_t *r) {
    return hdr_read_json(p, n, keep_top, keep_ext, r);
}

/* A header number as Java's parser and ours both read it: plain digits only here. */
static int num(const span_t *s, int digits, int64_t *out) {
    if (!s->set || !s->plain) return -1;
    return rmq_dec(s->p, s->n, RMQ_DEC_UNSIGNED, digits, 0, INT64_MAX, out);
}

static int is_text(const span_t *s, const char *t) {
    Py_ssize_t n = (Py_ssize_t)strlen(t);
    return s->set && s->plain && s->n == n && memcmp(s->p, t, n) == 0;
}

static long long attr_ll(PyObject *o, const char *name, int *err) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) { *err = 1; return 0; }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *err = 1;
    return x;
}

/* The fields of a pull this path answers. */
typedef struct {
    int ser;
    int32_t opaque;
    int64_t qid, offset, nums;
    const span_t *topic;
} pull_t;

/* Read a request frame (after its length prefix) into *p: 0, or -1 when it is not a pull this
 * path takes (a response, a body, a field that is not plain, another subscription...). */
static int read_pull(const uint8_t *f, Py_ssize_t n, req_t *r, pull_t *p) {
    if (n < 4) return -1;
    uint32_t word = (uint32_t)rd32(f);
    uint32_t ser = word >> 24, hl = word & 0xFFFFFF;
    if (4 + (Py_ssize_t)hl > n || n != 4 + (Py_ssize_t)hl) return -1;  /* pulls have no body */
    memset(r, 0, sizeof(*r));
    if (ser == 1) { if (read_binary(f + 4, hl, r) < 0) return -1; }
    else if (ser == 0) {
        for (Py_ssize_t c = 4; c < n; c++)
            if (f[c] >= 0x80) return -1;  /* plain ASCII only: Python checks the UTF-8 */
        if (read_json(f + 4, hl, r) < 0) return -1;
    } else return -1;
    if (!r->have_code || r->code != 11 || (r->have_flag && (r->flag & 3))) return -1;
    int64_t sysflag, x;
    if (!r->v[K_GROUP].set || !r->v[K_TOPIC].set || !r->v[K_TOPIC].plain) return -1;
    if (num(&r->v[K_QID], 9, &p->qid) < 0 || num(&r->v[K_OFFSET], 18, &p->offset) < 0 ||
        num(&r->v[K_NUMS], 9, &p->nums) < 0 || num(&r->v[K_SYSFLAG], 9, &sysflag) < 0 ||
        num(&r->v[K_COMMIT], 18, &x) < 0 || num(&r->v[K_SUSPEND], 18, &x) < 0 ||
        num(&r->v[K_SUBVER], 18, &x) < 0)
        return -1;
    if (!(sysflag & FLAG_SUBSCRIPTION) || (sysflag & FLAG_COMMIT)) return -1;
    if (r->v[K_SUB].set && !(is_text(&r->v[K_SUB], "*") || is_text(&r->v[K_SUB], "")))
        return -1;
    if (r->v[K_EXPR].set && !is_text(&r->v[K_EXPR], "TAG")) return -1;
    p->ser = (int)ser;
    p->opaque = r->opaque;
    p->topic = &r->v[K_TOPIC];
    return 0;
}

/* The pulled queue of a readable topic's valid queue id (borrowed), or NULL: with an error
 * set when a Python call failed, without one when the Python path answers. */
static PyObject *find_queue(const pull_t *p, PyObject *topics, PyObject *queues) {
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)p->topic->p, p->topic->n, NULL);
    if (!topic) { PyErr_Clear(); return NULL; }
    PyObject *config = PyDict_GetItemWithError(topics, topic);
    int err = 0;
    if (!config) { Py_DECREF(topic); return NULL; }
    long long perm = attr_ll(config, "perm", &err);
    long long readable_queues = attr_ll(config, "read_queue_nums", &err);
    if (err || !(perm & PERM_READ) || p->qid >= readable_queues) {
        Py_DECREF(topic);
        return NULL;
    }
    PyObject *key = Py_BuildValue("(OL)", topic, (long long)p->qid);
    Py_DECREF(topic);
    if (!key) return NULL;
    PyObject *queue = PyDict_GetItemWithError(queues, key);
    Py_DECREF(key);
    return queue;
}

/* What a FOUND pull of *p takes from the queue (ConsumeQueue.read): bytes [b0, b1) of the
 * view's buffer, the next offset and the queue's bounds. -1 when the offset is not in
 * [min, max) (another status: the Python path answers). */
typedef struct { Py_ssize_t b0, b1; int64_t next, min_off, max_off; } found_t;

static int found_range(const queue_view_t *q, const pull_t *p, long long max_count,
                       long long max_bytes, found_t *out) {
    int64_t min_off = q->first, max_off = q->first + q->count, offset = p->offset;
    if (max_off == 0 || offset < min_off || offset >= max_off) return -1;
    Py_ssize_t i = (Py_ssize_t)(offset - q->first);
    int64_t window = (p->nums * 20 > 16000 ? p->nums * 20 : 16000) / 20;
    int64_t take = p->nums > 1 ? p->nums : 1;
    if ((max_count > 1 ? max_count : 1) < take) take = max_count > 1 ? max_count : 1;
    if (q->count - i < take) take = q->count - i;
    if (window < take) take = window;
    int64_t start = queue_view_start(q, i);
    /* bisect_right(ends, start + max_bytes, i, i + take) */
    Py_ssize_t lo = i, hi = i + (Py_ssize_t)take;
    int64_t limit = start + max_bytes;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (limit < q->ends[mid]) hi = mid; else lo = mid + 1;
    }
    Py_ssize_t k = lo - i > 1 ? lo - i : 1;
    out->b0 = (Py_ssize_t)(start - q->base);
    out->b1 = (Py_ssize_t)(q->ends[i + k - 1] - q->base);
    if (out->b0 < 0 || out->b1 > q->len || out->b1 < out->b0) return -1;
    out->next = offset + k;
    out->min_off = min_off;
    out->max_off = max_off;
    return 0;
}

/* The header of make_response(SUCCESS, {suggestWhichBrokerId, nextBeginOffset, maxOffset,
 * minOffset}, "FOUND", body, language JAVA) in the request's serialization; its length. */
static Py_ssize_t found_header(char head[512], const pull_t *p, const found_t *f,
                               long long suggest, int version) {
    char vals[4][24];
    int vl[4];
    vl[0] = snprintf(vals[0], 24, "%lld", suggest);
    vl[1] = snprintf(vals[1], 24, "%lld", (long long)f->next);
    vl[2] = snprintf(vals[2], 24, "%lld", (long long)f->max_off);
    vl[3] = snprintf(vals[3], 24, "%lld", (long long)f->min_off);
    static const char *names[4] = {"suggestWhichBrokerId", "nextBeginOffset", "maxOffset",
                                   "minOffset"};
    if (p->ser != 1)
        return snprintf(head, 512,
                        "{\"code\":0,\"extFields\":{\"suggestWhichBrokerId\":\"%s\","
                        "\"nextBeginOffset\":\"%s\",\"maxOffset\":\"%s\",\"minOffset\":\"%s\"},"
                        "\"flag\":1,\"language\":\"JAVA\",\"opaque\":%d,\"remark\":\"FOUND\","
                        "\"serializeTypeCurrentRPC\":\"JSON\",\"version\":%d}",
                        vals[0], vals[1], vals[2], vals[3], (int)p->opaque, version);
    uint8_t *h = (uint8_t *)head;
    h[0] = 0; h[1] = 0; h[2] = 0;           /* code SUCCESS, language JAVA */
    h[3] = (uint8_t)(version >> 8); h[4] = (uint8_t)version;
    wr32(h + 5, (uint32_t)p->opaque);
    wr32(h + 9, 1);
    wr32(h + 13, 5);
    memcpy(h + 17, "FOUND", 5);
    uint8_t *q = h + 26;
    for (int j = 0; j < 4; j++) {
        int kl = (int)strlen(names[j]);
        q[0] = 0; q[1] = (uint8_t)kl;
        memcpy(q + 2, names[j], kl);
        wr32(q + 2 + kl, (uint32_t)vl[j]);
        memcpy(q + 6 + kl, vals[j], vl[j]);
        q += 6 + kl + vl[j];
    }
    wr32(h + 22, (uint32_t)(q - (h + 26)));
    return q - h;
}

/* One request frame (after its length prefix): its answer, or NULL with no error set when the
 * Python path must answer it, or NULL with an error. */
static PyObject *answer(const uint8_t *f, Py_ssize_t n, PyObject *topics, PyObject *queues,
                        long long max_count, long long max_bytes, long long suggest,
                        int version) {
    req_t r;
    pull_t p;
    if (read_pull(f, n, &r, &p) < 0) return NULL;
    PyObject *queue = find_queue(&p, topics, queues);
    if (!queue) return NULL;
    queue_view_t q;
    found_t found;
    PyObject *out = NULL;
    int rc = queue_view_open(queue, &q);
    if (rc != 0 || found_range(&q, &p, max_count, max_bytes, &found) < 0) goto done;
    char head[512];
    Py_ssize_t hlen = found_header(head, &p, &found, suggest, version);
    Py_ssize_t body = found.b1 - found.b0, total = 8 + hlen + body;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    wr32(o, (uint32_t)(total - 4));
    wr32(o + 4, ((uint32_t)p.ser << 24) | (uint32_t)hlen);
    memcpy(o + 8, head, hlen);
    memcpy(o + 8 + hlen, q.buf + found.b0, body);
done:
    queue_view_close(&q);
    return out;
}

/* serve_pulls(data, topics, queues, max_count, max_bytes, suggest, version)
 *   -> (answers, consumed)
 * Answers the whole frames at the start of ``data`` while each is a pull this path takes;
 * ``consumed`` bytes of ``data`` were answered, the rest is for the Python path. */
static PyObject *serve_pulls(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *topics, *queues;
    long long max_count, max_bytes, suggest;
    int version;
    if (!PyArg_ParseTuple(args, "y*O!O!LLLi", &data, &PyDict_Type, &topics, &PyDict_Type,
                          &queues, &max_count, &max_bytes, &suggest, &version))
        return NULL;
    PyObject *answers = PyList_New(0);
    if (!answers) { PyBuffer_Release(&data); return NULL; }
    const uint8_t *d = data.buf;
    Py_ssize_t pos = 0;
    while (data.len - pos >= 4) {
        int32_t length = rd32(d + pos);
        if (length < 4 || (int64_t)length + 4 > MAX_FRAME || data.len - pos - 4 < length) break;
        PyObject *a = answer(d + pos + 4, length, topics, queues, max_count, max_bytes, suggest,
                             version);
        if (!a) {
            if (PyErr_Occurred()) { Py_DECREF(answers); PyBuffer_Release(&data); return NULL; }
            break;
        }
        int rc = PyList_Append(answers, a);
        Py_DECREF(a);
        if (rc < 0) { Py_DECREF(answers); PyBuffer_Release(&data); return NULL; }
        pos += 4 + length;
    }
    PyBuffer_Release(&data);
    return Py_BuildValue("(Nn)", answers, pos);
}

/* more_frames_than(data, limit) -> bool
 * Whether ``data`` holds more than ``limit`` whole frames, by their length words alone: how
 * the broker's request queues (embedded/flow_control.py) see that a read cannot overflow a
 * queue without indexing it (a Python loop costs 5-8% of answering a large read). */
static PyObject *more_frames_than(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*n", &data, &limit)) return NULL;
    const uint8_t *d = data.buf;
    Py_ssize_t pos = 0, n = 0;
    int more = 0;
    while (data.len - pos >= 4) {
        uint64_t size = 4 + (uint64_t)(uint32_t)rd32(d + pos);
        if (size > (uint64_t)(data.len - pos)) break;
        pos += (Py_ssize_t)size;
        if (++n > limit) { more = 1; break; }
    }
    PyBuffer_Release(&data);
    return PyBool_FromLong(more);
}

static PyMethodDef serve_functions[] = {
    {"serve_pulls", serve_pulls, METH_VARARGS,
     "Answer the plain FOUND pulls at the start of a received chunk (embedded broker)."},
    {"more_frames_than", more_frames_than, METH_VARARGS,
     "Whether a received chunk holds more than a number of whole frames."},
    {NULL, NULL, 0, NULL},
};

int rmq_serve_register(PyObject *module) {
    return PyModule_AddFunctions(module, serve_functions);
}
