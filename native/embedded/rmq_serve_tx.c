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
 *
 * This file runs the frames (rmq_serve_tx.h lists the other parts).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_embedded.h"
#include "rmq_reqhdr.h"
#include "rmq_serve_tx.h"

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
    if (ser == 1) { if (tx_read_binary(f + 4, hl, &r) < 0) return NULL; }
    else if (ser == 0) {
        if (!(r.arena = PyMem_Malloc(hl + 1))) return PyErr_NoMemory();
        if (tx_read_json(f + 4, hl, &r) < 0) goto done;
    }
    else return NULL;
    if (!r.have_code || (r.flag & FLAG_RESPONSE)) goto done;
    if (r.code == 310) {
        *kind = 0;
        out = tx_half_send(c, &r, (int)ser, f + 4 + hl, n - 4 - hl);
    } else if (r.code == 37 && n == 4 + (Py_ssize_t)hl) {
        *kind = 1;
        out = tx_end_transaction(c, &r, (int)ser);
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
