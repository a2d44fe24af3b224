/*
 * The embedded broker's store as its C fast paths see it: a consume queue's records through
 * the store's fast-path interface (rocketmq_spark/embedded/queue.py ConsumeQueue.buffer_view
 * and QueueBuffer), shared by the pull server (rmq_serve.c) and the transactional one
 * (rmq_serve_tx.c). Nothing here reads a private attribute of the store.
 */
#ifndef RMQ_STORE_H
#define RMQ_STORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* One queue's records while a fast path reads them (QueueBuffer): record i is
 * buf[start(i) - base, ends[i] - base), start(i) = ends[i - 1], or base for i == 0. */
typedef struct {
    long long first;         /* queue offset of record 0 (first_offset) */
    long long base;          /* absolute position of the buffer's first byte (buffer_start) */
    const int64_t *ends;     /* absolute end of each record (record_ends) */
    Py_ssize_t count;        /* records held */
    const uint8_t *buf;      /* the records back to back (buffer) */
    Py_ssize_t len;          /* bytes held */
    Py_buffer ends_view, buf_view;
    int held;                /* which views to release */
} queue_view_t;

/* Start reading ``queue``: 0, 1 when the view is not one this C reads (not int64 ends: the
 * Python path then answers), or -1 with an error set. queue_view_close() releases it in every
 * case. The view is valid until the queue is next written (the caller holds the GIL). */
static inline int queue_view_open(PyObject *queue, queue_view_t *v) {
    static PyObject *name;
    memset(v, 0, sizeof(*v));
    if (!name && !(name = PyUnicode_InternFromString("buffer_view"))) return -1;
    PyObject *view = PyObject_CallMethodNoArgs(queue, name);
    if (!view) return -1;
    int rc = -1;
    if (!PyTuple_Check(view) || PyTuple_GET_SIZE(view) != 4) {
        PyErr_SetString(PyExc_TypeError, "buffer_view() must return a QueueBuffer");
        goto done;
    }
    v->first = PyLong_AsLongLong(PyTuple_GET_ITEM(view, 0));
    if (v->first == -1 && PyErr_Occurred()) goto done;
    v->base = PyLong_AsLongLong(PyTuple_GET_ITEM(view, 1));
    if (v->base == -1 && PyErr_Occurred()) goto done;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(view, 2), &v->ends_view, PyBUF_FORMAT) < 0) goto done;
    v->held |= 1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(view, 3), &v->buf_view, PyBUF_SIMPLE) < 0) goto done;
    v->held |= 2;
    rc = 1;
    if (v->ends_view.itemsize != 8 || !v->ends_view.format ||
        strcmp(v->ends_view.format, "q") != 0)
        goto done;
    v->ends = v->ends_view.buf;
    v->count = v->ends_view.len / 8;
    v->buf = v->buf_view.buf;
    v->len = v->buf_view.len;
    rc = 0;
done:
    Py_DECREF(view);
    return rc;
}

static inline void queue_view_close(queue_view_t *v) {
    if (v->held & 2) PyBuffer_Release(&v->buf_view);
    if (v->held & 1) PyBuffer_Release(&v->ends_view);
    v->held = 0;
}

/* Absolute start of record i (0 <= i < count). */
static inline int64_t queue_view_start(const queue_view_t *v, Py_ssize_t i) {
    return i ? v->ends[i - 1] : v->base;
}

#endif /* RMQ_STORE_H */
