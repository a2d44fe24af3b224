/*
 * The ROCKETMQ binary command header in C, for rocketmq_spark/client/protocol/frame.py.
 *
 * frame.py holds the pure-Python codec and the reference for the layout:
 *   code(2) language(1) version(2) opaque(4) flag(4) remarkLen(4) remark extLen(4)
 *   then per ext entry keyLen(2) key valueLen(4) value, all big-endian, strings UTF-8.
 * decode_binary_header() returns None for anything it does not accept (lengths that do not
 * add up, invalid UTF-8), and the Python decoder then reports the exact fault, so both give the
 * same answer for every input (tests hold them against each other).
 * split_frames() does the same for whole frames of a stream, for FrameDecoder.feed: it builds
 * the commands of the leading well-formed ROCKETMQ frames and stops at anything else (a JSON
 * header, an incomplete or malformed frame), which the Python path then decodes or rejects
 * (tests/test_frame_split_native.py feeds the same streams to both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_client.h"

static PyObject *utf8(const uint8_t *p, Py_ssize_t n) {
    return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
}

/* Short ASCII strings seen before, reused: a stream's headers repeat the same keys (and many
 * values) in every frame; a reused str also keeps its hash for the dict. Direct-mapped; a
 * miss decodes and takes the slot. */
#define TEXT_CACHE 512
#define TEXT_CACHE_MAX 32
static struct { PyObject *s; Py_ssize_t n; } text_cache[TEXT_CACHE];

static PyObject *text(const uint8_t *p, Py_ssize_t n) {
    if (n > TEXT_CACHE_MAX) return utf8(p, n);
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= 0x80) return utf8(p, n);
        h = (h ^ p[i]) * 16777619u;
    }
    h ^= (uint32_t)n;
    h ^= h >> 15;
    PyObject **slot = &text_cache[h & (TEXT_CACHE - 1)].s;
    Py_ssize_t *len = &text_cache[h & (TEXT_CACHE - 1)].n;
    if (*slot && *len == n && memcmp(PyUnicode_DATA(*slot), p, n) == 0) {
        Py_INCREF(*slot);
        return *slot;
    }
    PyObject *s = PyUnicode_DecodeASCII((const char *)p, n, NULL);
    if (!s) return NULL;
    Py_INCREF(s);
    Py_XSETREF(*slot, s);
    *len = n;
    return s;
}

/* The remark and ext of a binary header: 0 when it is well formed, 1 when it is not (lengths
 * that do not add up, invalid UTF-8: the Python decoder names the fault), -1 on a Python error. */
static int header_fields(const uint8_t *h, Py_ssize_t n, PyObject **remark_out,
                         PyObject **ext_out) {
    Py_ssize_t pos = 13;
    PyObject *remark = NULL, *ext = NULL;
    if (n < 21) goto reject;
    int32_t rl = rd32(h + pos);
    pos += 4;
    if (rl < 0 || pos + rl > n) goto reject;
    if (rl) {
        if (!(remark = text(h + pos, rl))) goto reject;
    } else {
        remark = Py_None;
        Py_INCREF(remark);
    }
    pos += rl;
    if (pos + 4 > n) goto reject;
    int32_t el = rd32(h + pos);
    pos += 4;
    if (el < 0 || pos + el != n) goto reject;
    if (!(ext = PyDict_New())) goto fail;
    while (pos < n) {
        if (pos + 2 > n) goto reject;
        int16_t kl = rd16(h + pos);
        if (kl < 0 || pos + 2 + kl + 4 > n) goto reject;
        PyObject *key = text(h + pos + 2, kl);
        if (!key) goto reject;
        pos += 2 + kl;
        int32_t vl = rd32(h + pos);
        if (vl < 0 || pos + 4 + vl > n) { Py_DECREF(key); goto reject; }
        PyObject *value = text(h + pos + 4, vl);
        if (!value) { Py_DECREF(key); goto reject; }
        int rc = PyDict_SetItem(ext, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) goto fail;
        pos += 4 + vl;
    }
    *remark_out = remark;
    *ext_out = ext;
    return 0;
reject:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto fail;
    PyErr_Clear();
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return 1;
fail:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return -1;
}

/* decode_binary_header(header) -> (code, language, version, opaque, flag, remark, ext) | None */
static PyObject *decode_binary_header(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const uint8_t *h = b.buf;
    PyObject *remark, *ext, *out = NULL;
    int rc = header_fields(h, b.len, &remark, &ext);
    if (rc == 0)
        out = Py_BuildValue("(iiiiiNN)", (int)rd16(h), (int)h[2], (int)rd16(h + 3),
                            (int)rd32(h + 5), (int)rd32(h + 9), remark, ext);
    else if (rc == 1) {
        out = Py_None;
        Py_INCREF(out);
    }
    PyBuffer_Release(&b);
    return out;
}

/* ---- whole frames, for FrameDecoder.feed (frame.py) */

/* set by frame_setup(): the command class, the language names, SerializeType.ROCKETMQ */
static PyObject *F_cls, *F_langs, *F_ser, *F_other, *F_empty;
enum { A_CODE, A_EXT, A_BODY, A_FLAG, A_OPAQUE, A_LANGUAGE, A_VERSION, A_REMARK, A_SER, NATTR };
static const char *ATTR_NAMES[NATTR] = {"code", "ext_fields", "body", "flag", "opaque",
                                        "language", "version", "remark", "serialize_type"};
static PyObject *F_attr[NATTR];

/* frame_setup(command_class, languages, rocketmq_serialize_type) */
static PyObject *frame_setup(PyObject *self, PyObject *args) {
    PyObject *cls, *langs, *ser;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyType_Type, &cls, &PyTuple_Type, &langs, &ser))
        return NULL;
    if (!F_empty) {
        if (!(F_empty = PyTuple_New(0)) || !(F_other = PyUnicode_InternFromString("OTHER")))
            return NULL;
        for (int i = 0; i < NATTR; i++)
            if (!(F_attr[i] = PyUnicode_InternFromString(ATTR_NAMES[i]))) return NULL;
    }
    Py_INCREF(cls); Py_XSETREF(F_cls, cls);
    Py_INCREF(langs); Py_XSETREF(F_langs, langs);
    Py_INCREF(ser); Py_XSETREF(F_ser, ser);
    Py_RETURN_NONE;
}

/* A command object with its fields set in the order of the dataclass's __init__ (no Python
 * code runs: the class has neither __post_init__ nor __setattr__). Steals remark, ext, body. */
static PyObject *make_command(const uint8_t *h, PyObject *remark, PyObject *ext, PyObject *body) {
    PyTypeObject *t = (PyTypeObject *)F_cls;
    PyObject *v[NATTR] = {NULL};
    PyObject *cmd = NULL;
    int lang = h[2];
    v[A_CODE] = PyLong_FromLong(rd16(h));
    v[A_EXT] = ext;
    v[A_BODY] = body;
    v[A_FLAG] = PyLong_FromLong(rd32(h + 9));
    v[A_OPAQUE] = PyLong_FromLong(rd32(h + 5));
    v[A_LANGUAGE] = lang < PyTuple_GET_SIZE(F_langs) ? PyTuple_GET_ITEM(F_langs, lang) : F_other;
    Py_INCREF(v[A_LANGUAGE]);
    v[A_VERSION] = PyLong_FromLong(rd16(h + 3));
    v[A_REMARK] = remark;
    v[A_SER] = F_ser;
    Py_INCREF(F_ser);
    for (int i = 0; i < NATTR; i++)
        if (!v[i]) goto done;
    if (!(cmd = t->tp_new(t, F_empty, NULL))) goto done;
    for (int i = 0; i < NATTR; i++) {
        if (PyObject_SetAttr(cmd, F_attr[i], v[i]) < 0) {
            Py_CLEAR(cmd);
            break;
        }
    }
done:
    for (int i = 0; i < NATTR; i++) Py_XDECREF(v[i]);
    return cmd;
}

/* split_frames(buffer, start, max_frame) -> (commands, bytes consumed)
 * The leading complete frames of buffer[start:] with well-formed ROCKETMQ headers. It stops at
 * anything else (a JSON header, an incomplete frame, any fault): FrameDecoder's Python path
 * takes it from there and decodes it or raises its ProtocolError. */
static PyObject *split_frames(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t start, max_frame;
    if (!PyArg_ParseTuple(args, "y*nn", &b, &start, &max_frame)) return NULL;
    if (!F_cls) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_RuntimeError, "frame_setup() has not been called");
        return NULL;
    }
    const uint8_t *d = b.buf;
    Py_ssize_t end = b.len, pos = start < 0 ? end : start;
    PyObject *out = PyList_New(0);
    if (!out) goto fail;
    while (end - pos >= 4) {
        int64_t length = (uint32_t)rd32(d + pos);
        if (length + 4 > (int64_t)max_frame || length < 4 || end - pos - 4 < length) break;
        uint32_t word = (uint32_t)rd32(d + pos + 4);
        int64_t hlen = word & 0xFFFFFF;
        if ((word >> 24) != 1 || 4 + hlen > length) break;
        const uint8_t *h = d + pos + 8;
        PyObject *remark, *ext;
        int rc = header_fields(h, (Py_ssize_t)hlen, &remark, &ext);
        if (rc < 0) goto fail;
        if (rc) break;
        PyObject *body = PyBytes_FromStringAndSize((const char *)h + hlen,
                                                   (Py_ssize_t)(length - 4 - hlen));
        if (!body) {
            Py_DECREF(remark);
            Py_DECREF(ext);
            goto fail;
        }
        PyObject *cmd = make_command(h, remark, ext, body);
        if (!cmd) goto fail;
        rc = PyList_Append(out, cmd);
        Py_DECREF(cmd);
        if (rc < 0) goto fail;
        pos += 4 + (Py_ssize_t)length;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(Nn)", out, start < 0 ? 0 : pos - start);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&b);
    return NULL;
}

/* encode_binary_header(code, language, version, opaque, flag, remark, ext) -> bytes
 * ``remark`` None or str (empty = none); ``ext`` a dict of str to str (None keys or values are
 * left out) or None. code and version must fit 16 bits (checked by the caller). */
static PyObject *encode_binary_header(PyObject *self, PyObject *args) {
    int code, language, version, opaque, flag;
    PyObject *remark, *ext;
    if (!PyArg_ParseTuple(args, "iiiiiOO", &code, &language, &version, &opaque, &flag, &remark,
                          &ext))
        return NULL;
    const char *rs = NULL;
    Py_ssize_t rlen = 0;
    if (remark != Py_None) {
        if (!(rs = PyUnicode_AsUTF8AndSize(remark, &rlen))) return NULL;
    }
    Py_ssize_t total = 21 + rlen, ext_len = 0, pos = 0;
    PyObject *k, *v;
    if (ext != Py_None) {
        if (!PyDict_Check(ext)) {
            PyErr_SetString(PyExc_TypeError, "ext must be a dict or None");
            return NULL;
        }
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if (k == Py_None || v == Py_None) continue;
            Py_ssize_t kl, vl;
            if (!PyUnicode_AsUTF8AndSize(k, &kl) || !PyUnicode_AsUTF8AndSize(v, &vl)) return NULL;
            if (kl > 0x7FFF) {
                PyErr_Format(PyExc_ValueError, "header key of %zd bytes does not fit the "
                             "ROCKETMQ header's 16-bit length", kl);
                return NULL;
            }
            ext_len += 6 + kl + vl;
        }
    }
    total += ext_len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    p[0] = (uint8_t)(code >> 8); p[1] = (uint8_t)code;
    p[2] = (uint8_t)language;
    p[3] = (uint8_t)(version >> 8); p[4] = (uint8_t)version;
    wr32(p + 5, (uint32_t)opaque);
    wr32(p + 9, (uint32_t)flag);
    wr32(p + 13, (uint32_t)rlen);
    if (rlen) memcpy(p + 17, rs, rlen);
    uint8_t *q = p + 17 + rlen;
    wr32(q, (uint32_t)ext_len);
    q += 4;
    if (ext != Py_None) {
        pos = 0;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if (k == Py_None || v == Py_None) continue;
            Py_ssize_t kl, vl;
            const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
            const char *vs = PyUnicode_AsUTF8AndSize(v, &vl);
            q[0] = (uint8_t)(kl >> 8); q[1] = (uint8_t)kl;
            memcpy(q + 2, ks, kl);
            wr32(q + 2 + kl, (uint32_t)vl);
            memcpy(q + 6 + kl, vs, vl);
            q += 6 + kl + vl;
        }
    }
    return out;
}

static PyMethodDef header_functions[] = {
    {"decode_binary_header", decode_binary_header, METH_VARARGS,
     "A ROCKETMQ binary header as (code, language, version, opaque, flag, remark, ext), or "
     "None if it is malformed."},
    {"encode_binary_header", encode_binary_header, METH_VARARGS,
     "Encode a ROCKETMQ binary header."},
    {"frame_setup", frame_setup, METH_VARARGS,
     "frame_setup(command_class, languages, rocketmq_serialize_type): what split_frames builds."},
    {"split_frames", split_frames, METH_VARARGS,
     "split_frames(buffer, start, max_frame) -> (commands, consumed): the leading complete "
     "frames with well-formed ROCKETMQ headers; stops at anything else."},
    {NULL, NULL, 0, NULL},
};

int rmq_header_register(PyObject *module) {
    return PyModule_AddFunctions(module, header_functions);
}
