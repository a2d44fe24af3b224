/*
 * rocketmq_spark.client._native: decode a PULL_MESSAGE body into Arrow-ready column buffers.
 *
 * Optional accelerator for rocketmq_spark/client/protocol/pull_decode.py, which holds the
 * pure-Python (numpy) twin of this code and the reference for its output.
 *
 * Two calls, so the caller allocates the outputs (from Arrow's memory pool): scan() validates
 * the records and sizes each column, fill() writes the columns. On a bad record scan() raises
 * ValueError(kind, record_start) with kind "layout", "crc" or "utf8"; the caller re-decodes that
 * record to name the exact fault. Host strings are formatted here only for IPv4.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_client.h"

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MIN_RECORD 91
#define BORN_V6 0x10
#define STORE_V6 0x20

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)((uint16_t)p[0] << 8 | p[1]); }
static inline int64_t be64(const uint8_t *p) {
    return (int64_t)((uint64_t)(uint32_t)be32(p) << 32 | (uint32_t)be32(p + 4));
}

/* Whether p[0:n] is valid UTF-8 (the strictness Arrow's string type needs); 8 ASCII bytes a step. */
static int utf8_ok(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((w & 0x8080808080808080ull) == 0) { i += 8; continue; }
        }
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        Py_ssize_t len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (Py_ssize_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* Where one record's fields are; filled by locate(). */
typedef struct {
    Py_ssize_t start, total;
    int32_t sys_flag;
    Py_ssize_t store_ts, store_host, store_len, reconsume, body, body_len;
    Py_ssize_t topic, topic_len, props, props_len;
    Py_ssize_t tags, tags_len, keys, keys_len, uniq, uniq_len; /* -1 when absent */
} rec_t;

/* Validate the record at r->start; 0 on success, -1 on a layout fault. */
static int locate(const uint8_t *b, Py_ssize_t end, rec_t *r) {
    Py_ssize_t s = r->start;
    if (end - s < MIN_RECORD) return -1;
    int32_t total = be32(b + s);
    int32_t magic = be32(b + s + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2) return -1;
    if (total < MIN_RECORD || total > end - s) return -1;
    Py_ssize_t rec_end = s + total;
    r->total = total;
    r->sys_flag = be32(b + s + 36);
    Py_ssize_t born_len = (r->sys_flag & BORN_V6) ? 20 : 8;
    r->store_len = (r->sys_flag & STORE_V6) ? 20 : 8;
    r->store_ts = s + 48 + born_len;
    r->store_host = r->store_ts + 8;
    r->reconsume = r->store_host + r->store_len;
    Py_ssize_t p = r->reconsume + 12;
    if (p + 4 > rec_end) return -1;
    int32_t body_len = be32(b + p);
    r->body = p + 4;
    r->body_len = body_len;
    if (body_len < 0 || r->body + body_len > rec_end) return -1;
    p = r->body + body_len;
    Py_ssize_t tl;
    if (magic == MAGIC_V2) {
        if (p + 2 > rec_end) return -1;
        tl = be16(b + p);
        r->topic = p + 2;
    } else {
        if (p + 1 > rec_end) return -1;
        tl = (int8_t)b[p];
        r->topic = p + 1;
    }
    if (tl < 0 || r->topic + tl + 2 > rec_end) return -1;
    r->topic_len = tl;
    p = r->topic + tl;
    int16_t pl = be16(b + p);
    r->props = p + 2;
    r->props_len = pl;
    if (pl < 0 || r->props + pl != rec_end) return -1;
    /* Properties: name \x01 value \x02 ...; the last non-empty value of a name wins (Java). */
    r->tags = r->keys = r->uniq = -1;
    r->tags_len = r->keys_len = r->uniq_len = 0;
    Py_ssize_t i = r->props, e = rec_end;
    while (i < e) {  /* memchr: glibc scans many bytes per step */
        const uint8_t *sep = memchr(b + i, 0x02, e - i);
        Py_ssize_t j = sep ? sep - b : e;
        const uint8_t *eq = memchr(b + i, 0x01, j - i);
        Py_ssize_t k = eq ? eq - b : j;
        if (j - i >= 3 && k < j && k > i && j - k - 1 > 0) {
            Py_ssize_t nl = k - i, v = k + 1, vl = j - k - 1;
            if (nl == 4 && memcmp(b + i, "TAGS", 4) == 0) { r->tags = v; r->tags_len = vl; }
            else if (nl == 4 && memcmp(b + i, "KEYS", 4) == 0) { r->keys = v; r->keys_len = vl; }
            else if (nl == 8 && memcmp(b + i, "UNIQ_KEY", 8) == 0) { r->uniq = v; r->uniq_len = vl; }
        }
        i = j + 1;
    }
    return 0;
}

/* "a.b.c.d:port" for an IPv4 host; hosts repeat, so the last text per cache slot is reused. */
typedef struct { uint8_t raw[8]; char text[32]; int len; int valid; } host_cache_t;

static int format_v4(char *out, const uint8_t *h, host_cache_t *cache) {
    if (!cache->valid || memcmp(cache->raw, h, 8) != 0) {
        cache->len = snprintf(cache->text, sizeof(cache->text), "%u.%u.%u.%u:%d",
                              h[0], h[1], h[2], h[3], (int)be32(h + 4));
        memcpy(cache->raw, h, 8);
        cache->valid = 1;
    }
    memcpy(out, cache->text, cache->len);
    return cache->len;
}

static const char HEX[] = "0123456789ABCDEF";

/* One output column: int32 offsets and the bytes, both in caller-provided buffers. */
typedef struct { int32_t *off; char *dat; Py_ssize_t pos; } col_t;

static inline void col_put(col_t *c, Py_ssize_t i, const uint8_t *src, Py_ssize_t len) {
    if (len > 0) memcpy(c->dat + c->pos, src, len);
    c->pos += len;
    c->off[i + 1] = (int32_t)c->pos;
}

static void put_hex(col_t *c, const uint8_t *src, Py_ssize_t len) {
    for (Py_ssize_t q = 0; q < len; q++) {
        c->dat[c->pos++] = HEX[src[q] >> 4];
        c->dat[c->pos++] = HEX[src[q] & 15];
    }
}

#define WANT_PROPERTIES 1
#define WANT_OFFSET_ID 2
enum { C_BODY, C_TOPIC, C_PROPS, C_TAGS, C_KEYS, C_MSGID, C_OFFID, C_BORN, C_STORE, NCOLS };

/* The result of scan(): the validated records of one body, kept until fill() runs. */
typedef struct {
    Py_buffer view;
    rec_t *recs;
    Py_ssize_t n;
    Py_ssize_t sz[NCOLS];
    int any_v6;
} scan_t;

static void scan_free(PyObject *capsule) {
    scan_t *sc = PyCapsule_GetPointer(capsule, "rmq_scan");
    if (sc == NULL) return;
    PyBuffer_Release(&sc->view);
    PyMem_Free(sc->recs);
    PyMem_Free(sc);
}

/* scan(body, verify_crc) -> (state, n, sizes of the 9 variable columns, any IPv6 host)
 * Validates every record and sizes the outputs, so the caller can allocate them exactly
 * (from Arrow's memory pool, which reuses memory instead of faulting in fresh pages). */
static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *body;
    int verify_crc = 1;
    if (!PyArg_ParseTuple(args, "O|p", &body, &verify_crc)) return NULL;
    scan_t *sc = PyMem_Calloc(1, sizeof(scan_t));
    if (!sc) return PyErr_NoMemory();
    if (PyObject_GetBuffer(body, &sc->view, PyBUF_SIMPLE) < 0) { PyMem_Free(sc); return NULL; }
    PyObject *capsule = PyCapsule_New(sc, "rmq_scan", scan_free);
    if (!capsule) { PyBuffer_Release(&sc->view); PyMem_Free(sc); return NULL; }
    const uint8_t *b = (const uint8_t *)sc->view.buf;
    Py_ssize_t end = sc->view.len, pos = 0, cap = 64;
    sc->recs = PyMem_Malloc(cap * sizeof(rec_t));
    if (!sc->recs) { Py_DECREF(capsule); return PyErr_NoMemory(); }
    while (pos < end) {
        if (sc->n == cap) {
            cap *= 2;
            rec_t *grown = PyMem_Realloc(sc->recs, cap * sizeof(rec_t));
            if (!grown) { Py_DECREF(capsule); return PyErr_NoMemory(); }
            sc->recs = grown;
        }
        rec_t *r = &sc->recs[sc->n];
        r->start = pos;
        if (locate(b, end, r) < 0) {
            PyErr_SetObject(PyExc_ValueError, Py_BuildValue("(sn)", "layout", pos));
            Py_DECREF(capsule);
            return NULL;
        }
        if (verify_crc) {
            uint32_t crc = rmq_crc32(b + r->body, r->body_len) & 0x7FFFFFFFu;
            if ((int32_t)crc != be32(b + pos + 8)) {
                PyErr_SetObject(PyExc_ValueError, Py_BuildValue("(sn)", "crc", pos));
                Py_DECREF(capsule);
                return NULL;
            }
        }
        /* Topic and properties become Arrow strings (tags, keys and UNIQ_KEY are pieces of
         * the properties cut at ASCII separators, so they are valid when these are). */
        if (!utf8_ok(b + r->topic, r->topic_len) || !utf8_ok(b + r->props, r->props_len)) {
            PyErr_SetObject(PyExc_ValueError, Py_BuildValue("(sn)", "utf8", pos));
            Py_DECREF(capsule);
            return NULL;
        }
        if (r->sys_flag & (BORN_V6 | STORE_V6)) sc->any_v6 = 1;
        Py_ssize_t id_len = 2 * (r->store_len + 8);
        sc->sz[C_BODY] += r->body_len;
        sc->sz[C_TOPIC] += r->topic_len;
        sc->sz[C_PROPS] += r->props_len;
        sc->sz[C_TAGS] += r->tags_len;
        sc->sz[C_KEYS] += r->keys_len;
        sc->sz[C_MSGID] += r->uniq >= 0 ? r->uniq_len : id_len;
        sc->sz[C_OFFID] += id_len;
        pos += r->total;
        sc->n++;
    }
    if (!sc->any_v6) {  /* hosts are sized exactly */
        host_cache_t born = {{0}, {0}, 0, 0}, store = {{0}, {0}, 0, 0};
        char tmp[32];
        for (Py_ssize_t i = 0; i < sc->n; i++) {
            sc->sz[C_BORN] += format_v4(tmp, b + sc->recs[i].start + 48, &born);
            sc->sz[C_STORE] += format_v4(tmp, b + sc->recs[i].store_host, &store);
        }
    }
    PyObject *sizes = PyTuple_New(NCOLS);
    if (!sizes) { Py_DECREF(capsule); return NULL; }
    for (int c = 0; c < NCOLS; c++) PyTuple_SET_ITEM(sizes, c, PyLong_FromSsize_t(sc->sz[c]));
    return Py_BuildValue("(NnNO)", capsule, sc->n, sizes, sc->any_v6 ? Py_True : Py_False);
}

/* Get a writable buffer of at least ``need`` bytes; NULL (with an error) otherwise. */
static void *writable(PyObject *obj, Py_ssize_t need, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0) return NULL;
    if (view->len < need) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "output buffer of %zd bytes, need %zd", view->len, need);
        return NULL;
    }
    return view->buf;
}

/* Where fill() writes: the caller's buffers. */
typedef struct {
    int32_t *i32;               /* queue_id, flag, sys_flag, reconsume_times: n values each */
    int64_t *i64;               /* queue_offset, physical_offset, born and store timestamps */
    col_t cols[NCOLS];          /* the variable-width columns (unwanted ones stay empty) */
    uint8_t *valid[2];          /* validity bitmaps of tags and keys */
    int wanted[NCOLS];
} columns_t;

/* The output buffers of one fill() call, held until it returns. */
typedef struct {
    columns_t to;
    Py_buffer views[2 + 2 * NCOLS + 2];
    int held;                   /* views to release */
} outputs_t;

/* Take the caller's buffers as writable outputs sized for ``sc``: 0, or -1 with an error
 * (release_outputs() frees what was taken either way). */
static int take_outputs(const scan_t *sc, int want, PyObject *ints_obj, PyObject *longs_obj,
                        PyObject *offs, PyObject *datas, PyObject *valids, outputs_t *o) {
    Py_ssize_t n = sc->n;
    int wanted[NCOLS] = {1, 1, want & WANT_PROPERTIES, 1, 1, 1, want & WANT_OFFSET_ID,
                         !sc->any_v6, !sc->any_v6};
    memcpy(o->to.wanted, wanted, sizeof(wanted));
    if (!(o->to.i32 = writable(ints_obj, 16 * n, &o->views[o->held]))) return -1;
    o->held++;
    if (!(o->to.i64 = writable(longs_obj, 32 * n, &o->views[o->held]))) return -1;
    o->held++;
    for (int c = 0; c < NCOLS; c++) {
        if (!wanted[c]) continue;
        o->to.cols[c].off = writable(PyList_GET_ITEM(offs, c), 4 * (n + 1), &o->views[o->held]);
        if (!o->to.cols[c].off) return -1;
        o->held++;
        o->to.cols[c].dat = writable(PyList_GET_ITEM(datas, c), sc->sz[c], &o->views[o->held]);
        if (!o->to.cols[c].dat) return -1;
        o->held++;
        o->to.cols[c].off[0] = 0;
    }
    for (int v = 0; v < 2; v++) {
        o->to.valid[v] = writable(PyList_GET_ITEM(valids, v), (n + 7) / 8, &o->views[o->held]);
        if (!o->to.valid[v]) return -1;
        o->held++;
        memset(o->to.valid[v], 0, (n + 7) / 8);
    }
    return 0;
}

static void release_outputs(outputs_t *o) {
    for (int h = 0; h < o->held; h++) PyBuffer_Release(&o->views[h]);
    o->held = 0;
}

/* The broker's offset id of a record (store host + physical offset, in hex) as value i of
 * ``col``. */
static inline void put_offset_id(col_t *col, Py_ssize_t i, const uint8_t *b, const rec_t *r) {
    put_hex(col, b + r->store_host, r->store_len);
    put_hex(col, b + r->start + 28, 8);
    col->off[i + 1] = (int32_t)col->pos;
}

/* Write record i of the scanned body ``b`` into every wanted column. */
static inline void fill_record(columns_t *o, const uint8_t *b, const rec_t *r, Py_ssize_t i,
                               Py_ssize_t n, host_cache_t *born, host_cache_t *store) {
    const uint8_t *s = b + r->start;
    col_t *cols = o->cols;
    o->i32[i] = be32(s + 12);
    o->i32[n + i] = be32(s + 16);
    o->i32[2 * n + i] = r->sys_flag;
    o->i32[3 * n + i] = be32(b + r->reconsume);
    o->i64[i] = be64(s + 20);
    o->i64[n + i] = be64(s + 28);
    o->i64[2 * n + i] = be64(s + 40);
    o->i64[3 * n + i] = be64(b + r->store_ts);
    col_put(&cols[C_BODY], i, b + r->body, r->body_len);
    col_put(&cols[C_TOPIC], i, b + r->topic, r->topic_len);
    if (o->wanted[C_PROPS]) col_put(&cols[C_PROPS], i, b + r->props, r->props_len);
    if (r->tags >= 0) o->valid[0][i >> 3] |= (uint8_t)(1u << (i & 7));
    col_put(&cols[C_TAGS], i, r->tags >= 0 ? b + r->tags : NULL, r->tags_len);
    if (r->keys >= 0) o->valid[1][i >> 3] |= (uint8_t)(1u << (i & 7));
    col_put(&cols[C_KEYS], i, r->keys >= 0 ? b + r->keys : NULL, r->keys_len);
    /* msgId: the producer's UNIQ_KEY, else the broker's offset id (store host + offset) */
    if (r->uniq >= 0) col_put(&cols[C_MSGID], i, b + r->uniq, r->uniq_len);
    else put_offset_id(&cols[C_MSGID], i, b, r);
    if (o->wanted[C_OFFID]) put_offset_id(&cols[C_OFFID], i, b, r);
    if (o->wanted[C_BORN]) {
        cols[C_BORN].pos += format_v4(cols[C_BORN].dat + cols[C_BORN].pos, s + 48, born);
        cols[C_BORN].off[i + 1] = (int32_t)cols[C_BORN].pos;
        cols[C_STORE].pos += format_v4(cols[C_STORE].dat + cols[C_STORE].pos,
                                       b + r->store_host, store);
        cols[C_STORE].off[i + 1] = (int32_t)cols[C_STORE].pos;
    }
}

/* fill(state, want, ints, longs, offsets[9], data[9], valid[2]) -> None
 * ``want``: 1 = properties, 2 = offset_msg_id; unwanted columns (and the host columns when a
 * host is IPv6) may be None in the lists. Column order as in the enum above; ints holds
 * queue_id, flag, sys_flag, reconsume_times and longs queue_offset, physical_offset,
 * born_timestamp, store_timestamp, n values each. */
static PyObject *fill(PyObject *self, PyObject *args) {
    PyObject *capsule, *ints_obj, *longs_obj, *offs, *datas, *valids;
    int want;
    if (!PyArg_ParseTuple(args, "OiOOO!O!O!", &capsule, &want, &ints_obj, &longs_obj,
                          &PyList_Type, &offs, &PyList_Type, &datas, &PyList_Type, &valids))
        return NULL;
    scan_t *sc = PyCapsule_GetPointer(capsule, "rmq_scan");
    if (!sc) return NULL;
    if (PyList_GET_SIZE(offs) != NCOLS || PyList_GET_SIZE(datas) != NCOLS ||
        PyList_GET_SIZE(valids) != 2) {
        PyErr_SetString(PyExc_ValueError, "fill needs 9 offsets, 9 data and 2 validity buffers");
        return NULL;
    }
    outputs_t o;
    memset(&o, 0, sizeof(o));
    if (take_outputs(sc, want, ints_obj, longs_obj, offs, datas, valids, &o) < 0) {
        release_outputs(&o);
        return NULL;
    }
    const uint8_t *b = (const uint8_t *)sc->view.buf;
    host_cache_t born_cache = {{0}, {0}, 0, 0}, store_cache = {{0}, {0}, 0, 0};
    columns_t to = o.to;  /* a copy no other code can reach: the compiler keeps it in registers */
    for (Py_ssize_t i = 0; i < sc->n; i++)
        fill_record(&to, b, &sc->recs[i], i, sc->n, &born_cache, &store_cache);
    release_outputs(&o);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Validate a pull body's records and size its columns."},
    {"fill", fill, METH_VARARGS, "Write the columns of a scanned body into given buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rocketmq_spark.client._native",
                                     NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (rmq_pull_register(m) < 0 || rmq_header_register(m) < 0 ||
              rmq_hmac_register(m) < 0 || rmq_crc32_register(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
