/*
 * The ROCKETMQ binary command header in C, for rocketmq_spark/client/protocol/frame.py.
 *
 * frame.py holds the pure-Python codec and the reference for the layout:
 *   code(2) language(1) version(2) opaque(4) flag(4) remarkLen(4) remark extLen(4)
 *   then per ext entry keyLen(2) key valueLen(4) value, all big-endian, strings UTF-8.
 * decode_binary_header() returns None for anything it does not accept (lengths that do not
 * add up, invalid UTF-8), and the Python decoder then reports the exact fault, so both give the
 * same answer for every input (tests hold them against each other).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_pull.h"

static PyObject *utf8(const uint8_t *p, Py_ssize_t n) {
    return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
}

/* decode_binary_header(header) -> (code, language, version, opaque, flag, remark, ext) | None */
static PyObject *decode_binary_header(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const uint8_t *h = b.buf;
    Py_ssize_t n = b.len, pos = 13;
    PyObject *remark = NULL, *ext = NULL, *out = NULL;
    if (n < 21) goto reject;
    int32_t rl = rd32(h + pos);
    pos += 4;
    if (rl < 0 || pos + rl > n) goto reject;
    if (rl) {
        if (!(remark = utf8(h + pos, rl))) goto reject;
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
        PyObject *key = utf8(h + pos + 2, kl);
        if (!key) goto reject;
        pos += 2 + kl;
        int32_t vl = rd32(h + pos);
        if (vl < 0 || pos + 4 + vl > n) { Py_DECREF(key); goto reject; }
        PyObject *value = utf8(h + pos + 4, vl);
        if (!value) { Py_DECREF(key); goto reject; }
        int rc = PyDict_SetItem(ext, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) goto fail;
        pos += 4 + vl;
    }
    out = Py_BuildValue("(iiiiiNN)", (int)rd16(h), (int)h[2], (int)rd16(h + 3), (int)rd32(h + 5),
                        (int)rd32(h + 9), remark, ext);
    PyBuffer_Release(&b);
    return out;
reject:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto fail;
    PyErr_Clear();
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
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
    {NULL, NULL, 0, NULL},
};

int rmq_header_register(PyObject *module) {
    return PyModule_AddFunctions(module, header_functions);
}
