/*
 * rocketmq_spark._native: decode a PULL_MESSAGE body into Arrow-ready column buffers.
 *
 * Optional accelerator for rocketmq_spark/client/protocol/columns.py, which holds the
 * pure-Python (numpy) twin of this code and the reference for its output. One call walks the
 * stored records once to validate them and size the outputs, and once more to fill them.
 *
 * decode(body, verify_crc) -> tuple of bytes objects, in this order:
 *   n (int),
 *   int32 columns (n each):   queue_id, flag, sys_flag, reconsume_times
 *   int64 columns (n each):   queue_offset, physical_offset, born_timestamp, store_timestamp
 *   variable columns, each (offsets int32[n+1], data) and, for the three properties, a
 *   validity bitmap: body, topic, properties, tags(+valid), keys(+valid), uniq_key(+valid),
 *   offset_msg_id, born_host, store_host
 * Host strings are formatted here only for IPv4; when any host is IPv6 the two host entries are
 * None and the caller formats them. On a bad record it raises ValueError(kind, record_start)
 * with kind "layout" or "crc"; the caller re-decodes that record to name the exact fault.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MIN_RECORD 91
#define BORN_V6 0x10
#define STORE_V6 0x20

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_bytes(const uint8_t *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)((uint16_t)p[0] << 8 | p[1]); }
static inline int64_t be64(const uint8_t *p) {
    return (int64_t)((uint64_t)(uint32_t)be32(p) << 32 | (uint32_t)be32(p + 4));
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
    while (i < e) {
        Py_ssize_t j = i;
        while (j < e && b[j] != 0x02) j++;
        Py_ssize_t k = i;
        while (k < j && b[k] != 0x01) k++;
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

/* A growable-free pair of output buffers: int32 offsets and the data. */
typedef struct { PyObject *offsets, *data; int32_t *off; char *dat; Py_ssize_t pos; } col_t;

static int col_new(col_t *c, Py_ssize_t n, Py_ssize_t size) {
    c->offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    c->data = PyBytes_FromStringAndSize(NULL, size);
    if (!c->offsets || !c->data) return -1;
    c->off = (int32_t *)PyBytes_AS_STRING(c->offsets);
    c->dat = PyBytes_AS_STRING(c->data);
    c->pos = 0;
    c->off[0] = 0;
    return 0;
}

static inline void col_put(col_t *c, Py_ssize_t i, const uint8_t *src, Py_ssize_t len) {
    if (len > 0) memcpy(c->dat + c->pos, src, len);
    c->pos += len;
    c->off[i + 1] = (int32_t)c->pos;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    int verify_crc = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &verify_crc)) return NULL;
    const uint8_t *b = (const uint8_t *)view.buf;
    Py_ssize_t end = view.len;
    PyObject *result = NULL;
    rec_t *recs = NULL;
    PyObject *ints = NULL, *longs = NULL, *valid[3] = {NULL, NULL, NULL};
    col_t cols[9];
    memset(cols, 0, sizeof(cols));

    /* Pass 1: count, validate, size. */
    Py_ssize_t n = 0, cap = 64;
    recs = PyMem_Malloc(cap * sizeof(rec_t));
    if (!recs) { PyErr_NoMemory(); goto done; }
    Py_ssize_t sz[9] = {0};
    int any_v6 = 0;
    Py_ssize_t pos = 0;
    while (pos < end) {
        if (n == cap) {
            cap *= 2;
            rec_t *grown = PyMem_Realloc(recs, cap * sizeof(rec_t));
            if (!grown) { PyErr_NoMemory(); goto done; }
            recs = grown;
        }
        rec_t *r = &recs[n];
        r->start = pos;
        if (locate(b, end, r) < 0) {
            PyErr_SetObject(PyExc_ValueError, Py_BuildValue("(sn)", "layout", pos));
            goto done;
        }
        if (verify_crc) {
            uint32_t crc = crc32_bytes(b + r->body, r->body_len) & 0x7FFFFFFFu;
            if ((int32_t)crc != be32(b + pos + 8)) {
                PyErr_SetObject(PyExc_ValueError, Py_BuildValue("(sn)", "crc", pos));
                goto done;
            }
        }
        if (r->sys_flag & (BORN_V6 | STORE_V6)) any_v6 = 1;
        sz[0] += r->body_len;
        sz[1] += r->topic_len;
        sz[2] += r->props_len;
        sz[3] += r->tags_len;
        sz[4] += r->keys_len;
        sz[5] += r->uniq_len;
        sz[6] += 2 * (r->store_len + 8);
        pos += r->total;
        n++;
    }
    host_cache_t born_cache = {{0}, {0}, 0, 0}, store_cache = {{0}, {0}, 0, 0};
    sz[7] = sz[8] = 0;  /* hosts are sized exactly here */
    for (Py_ssize_t i = 0; i < n && !any_v6; i++) {
        char tmp[32];
        sz[7] += format_v4(tmp, b + recs[i].start + 48, &born_cache);
        sz[8] += format_v4(tmp, b + recs[i].store_host, &store_cache);
    }

    ints = PyBytes_FromStringAndSize(NULL, 4 * 4 * n);
    longs = PyBytes_FromStringAndSize(NULL, 4 * 8 * n);
    if (!ints || !longs) goto done;
    for (int c = 0; c < 9; c++)
        if (col_new(&cols[c], n, sz[c]) < 0) goto done;
    Py_ssize_t vbytes = (n + 7) / 8;
    for (int v = 0; v < 3; v++) {
        valid[v] = PyBytes_FromStringAndSize(NULL, vbytes > 0 ? vbytes : 1);
        if (!valid[v]) goto done;
        memset(PyBytes_AS_STRING(valid[v]), 0, vbytes > 0 ? vbytes : 1);
    }

    /* Pass 2: fill. */
    int32_t *i32 = (int32_t *)PyBytes_AS_STRING(ints);
    int64_t *i64 = (int64_t *)PyBytes_AS_STRING(longs);
    uint8_t *vb[3];
    for (int v = 0; v < 3; v++) vb[v] = (uint8_t *)PyBytes_AS_STRING(valid[v]);
    for (Py_ssize_t i = 0; i < n; i++) {
        rec_t *r = &recs[i];
        const uint8_t *s = b + r->start;
        i32[i] = be32(s + 12);
        i32[n + i] = be32(s + 16);
        i32[2 * n + i] = r->sys_flag;
        i32[3 * n + i] = be32(b + r->reconsume);
        i64[i] = be64(s + 20);
        i64[n + i] = be64(s + 28);
        i64[2 * n + i] = be64(s + 40);
        i64[3 * n + i] = be64(b + r->store_ts);
        col_put(&cols[0], i, b + r->body, r->body_len);
        col_put(&cols[1], i, b + r->topic, r->topic_len);
        col_put(&cols[2], i, b + r->props, r->props_len);
        Py_ssize_t span[3][2] = {{r->tags, r->tags_len}, {r->keys, r->keys_len},
                                 {r->uniq, r->uniq_len}};
        for (int v = 0; v < 3; v++) {
            if (span[v][0] >= 0) {
                vb[v][i >> 3] |= (uint8_t)(1u << (i & 7));
                col_put(&cols[3 + v], i, b + span[v][0], span[v][1]);
            } else {
                col_put(&cols[3 + v], i, NULL, 0);
            }
        }
        /* offsetMsgId: hex of the store host bytes and the commit-log offset */
        col_t *id = &cols[6];
        const uint8_t *parts[2] = {b + r->store_host, s + 28};
        Py_ssize_t lens[2] = {r->store_len, 8};
        for (int k = 0; k < 2; k++)
            for (Py_ssize_t q = 0; q < lens[k]; q++) {
                id->dat[id->pos++] = HEX[parts[k][q] >> 4];
                id->dat[id->pos++] = HEX[parts[k][q] & 15];
            }
        id->off[i + 1] = (int32_t)id->pos;
        if (!any_v6) {
            cols[7].pos += format_v4(cols[7].dat + cols[7].pos, s + 48, &born_cache);
            cols[7].off[i + 1] = (int32_t)cols[7].pos;
            cols[8].pos += format_v4(cols[8].dat + cols[8].pos, b + r->store_host,
                                     &store_cache);
            cols[8].off[i + 1] = (int32_t)cols[8].pos;
        }
    }

    result = PyTuple_New(1 + 2 + 9 * 2 + 3);
    if (!result) goto done;
    PyTuple_SET_ITEM(result, 0, PyLong_FromSsize_t(n));
    PyTuple_SET_ITEM(result, 1, ints); ints = NULL;
    PyTuple_SET_ITEM(result, 2, longs); longs = NULL;
    for (int c = 0; c < 9; c++) {
        if (any_v6 && c >= 7) {
            Py_INCREF(Py_None); PyTuple_SET_ITEM(result, 3 + 2 * c, Py_None);
            Py_INCREF(Py_None); PyTuple_SET_ITEM(result, 4 + 2 * c, Py_None);
            Py_CLEAR(cols[c].offsets); Py_CLEAR(cols[c].data);
        } else {
            PyTuple_SET_ITEM(result, 3 + 2 * c, cols[c].offsets); cols[c].offsets = NULL;
            PyTuple_SET_ITEM(result, 4 + 2 * c, cols[c].data); cols[c].data = NULL;
        }
    }
    for (int v = 0; v < 3; v++) { PyTuple_SET_ITEM(result, 21 + v, valid[v]); valid[v] = NULL; }

done:
    PyBuffer_Release(&view);
    PyMem_Free(recs);
    Py_XDECREF(ints);
    Py_XDECREF(longs);
    for (int c = 0; c < 9; c++) { Py_XDECREF(cols[c].offsets); Py_XDECREF(cols[c].data); }
    for (int v = 0; v < 3; v++) Py_XDECREF(valid[v]);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a pull body into column buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    return PyModule_Create(&module);
}
