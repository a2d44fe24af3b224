/*
 * rocketmq_spark.client._native.Puller: the pull loop of one queue range, in C.
 *
 * At a genuine broker's default caps (32 messages / 256 KiB a pull) a pull answer carries a
 * few kilobytes, so what each pull costs in Python (encoding a request, a system call or two,
 * decoding a header, the objects made per answer) decides the read rate, not the decoding of
 * the messages. This loop keeps a pipeline of PULL_MESSAGE requests in flight on one socket,
 * encodes each request by patching a template (the ROCKETMQ binary header built once in
 * Python), reads and frames the answers, parses their headers (binary or JSON) and appends the
 * bodies of FOUND answers to one buffer, with the GIL released around every system call.
 * Python sees one call per batch of thousands of messages, plus one for each answer that is
 * not a plain FOUND (every other pull status, a header it cannot parse, a frame for someone
 * else), which the Python reader handles exactly as its pure-Python twin does
 * (rocketmq_spark/client/read/python_pull_engine.py is the reference for the semantics).
 *
 * Pipeline: requests ask for ``step`` messages each at contiguous offsets (offset, offset+step,
 * ...), ``depth`` at most in flight, topped up in one write once half have been answered
 * (after a busy answer Python narrows this ``window`` to 1; each answer consumed doubles it back
 * to ``depth``, so a broker in flow control gets one pull, not a burst, per backoff). The
 * step is learned from the broker: an answer capped below what was asked sets it, so a broker
 * serving 32 (or 8) messages a pull is asked for exactly that. An answer that stops short
 * leaves a gap before the next request in flight, which is requested at once for exactly the
 * missing count, so variable message sizes (a byte cap) do not break the pipeline. Answers may
 * arrive in any order; those ahead of the current offset are kept until it reaches them.
 *
 * ACL: with a signer, every request carries a Signature (rmq_pull_io.c, rmq_hmac.c) over the
 * template's signed values with the request's own maxMsgNums and queueOffset put in their
 * sorted places; Python cuts the signed content around those two values once per loop
 * (client/acl.py, signed_parts). The opaque is a header field, not an ext field: unsigned.
 *
 * TLS: with a transport (client/transport.py's TlsTransport, which owns the TLS record layer
 * over memory BIOs), the loop does not touch the socket: it has decrypted bytes put in its
 * receive buffer by transport.recv_into(view, timeout), a chunk at a time, and hands each
 * burst of requests to transport.send(data). Framing, parsing, planning and signing stay in
 * C; Python is called once per chunk received and once per burst sent, not once per pull.
 *
 * This file holds the Puller object and its methods; one run() is in rmq_pull_run.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_client.h"
#include "rmq_pull.h"

static void Puller_dealloc(Puller *self) {
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    for (int i = 0; i < self->nflights; i++) pull_flight_free(&self->flights[i]);
    PyMem_Free(self->tmpl);
    PyMem_Free(self->rbuf);
    PyMem_Free(self->out);
    PyMem_Free(self->pieces);
    PyMem_Free(self->sbuf);
    PyMem_Free(self->sign_mid);
    PyMem_Free(self->sign_tail);
    rmq_wipe(&self->key, sizeof(self->key));
    rmq_wipe(&self->signed_head, sizeof(self->signed_head));
    Py_XDECREF(self->transport);
    Py_XDECREF(self->sock);
    Py_XDECREF(self->send_lock);
    Py_XDECREF(self->opaques);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The signer: (secret key, signed content before the first patched value, between the two,
 * after the second, whether queueOffset comes first). Errors never show the values. */
static int set_signer(Puller *self, PyObject *signer) {
    Py_buffer key = {0}, head = {0}, mid = {0}, tail = {0};
    int offset_first = 0;
    if (!PyTuple_Check(signer) ||
        !PyArg_ParseTuple(signer, "y*y*y*y*p", &key, &head, &mid, &tail, &offset_first)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "signer must be (key, head, mid, tail, offset_first) "
                                         "with bytes and a bool");
        return -1;
    }
    int rc = -1;
    char *m = PyMem_Malloc(mid.len ? mid.len : 1), *t = PyMem_Malloc(tail.len ? tail.len : 1);
    if (!m || !t) {
        PyMem_Free(m);
        PyMem_Free(t);
        PyErr_NoMemory();
        goto done;
    }
    memcpy(m, mid.buf, mid.len);
    memcpy(t, tail.buf, tail.len);
    PyMem_Free(self->sign_mid);
    PyMem_Free(self->sign_tail);
    self->sign_mid = m; self->sign_mid_len = mid.len;
    self->sign_tail = t; self->sign_tail_len = tail.len;
    rmq_hmac_key(&self->key, key.buf, key.len);
    self->signed_head = self->key.inner;
    rmq_sha1_update(&self->signed_head, head.buf, head.len);
    self->offset_first = offset_first;
    self->sign = 1;
    rc = 0;
done:
    PyBuffer_Release(&key);
    PyBuffer_Release(&head);
    PyBuffer_Release(&mid);
    PyBuffer_Release(&tail);
    return rc;
}

/* Puller(sock, send_lock, opaques, template, end, max_nums, depth, filtered=False,
 *        transport=None, signer=None) */
static int Puller_init(Puller *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"sock", "send_lock", "opaques", "template", "end", "max_nums",
                            "depth", "filtered", "transport", "signer", NULL};
    PyObject *sock, *lock, *opaques, *transport = Py_None, *signer = Py_None;
    Py_buffer tmpl;
    long long end;
    int max_nums, depth, filtered = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOy*Lii|pOO", names, &sock, &lock, &opaques,
                                     &tmpl, &end, &max_nums, &depth, &filtered, &transport,
                                     &signer))
        return -1;
    if (signer != Py_None && set_signer(self, signer) < 0) {
        PyBuffer_Release(&tmpl);
        return -1;
    }
    if (transport != Py_None) {
        Py_INCREF(transport);
        Py_XSETREF(self->transport, transport);
    }
    const uint8_t *t = tmpl.buf;
    if (tmpl.len < 29 || t[4] != 1 || rd32(t + 21) != 0 ||
        rd32(t) != tmpl.len - 4 || (rd32(t + 4) & 0xFFFFFF) != tmpl.len - 8 ||
        rd32(t + 25) != tmpl.len - 29) {
        PyBuffer_Release(&tmpl);
        PyErr_SetString(PyExc_ValueError, "template is not a ROCKETMQ-header request frame "
                                          "without remark");
        return -1;
    }
    PyObject *fd_obj = PyObject_CallMethod(sock, "fileno", NULL);
    if (!fd_obj) { PyBuffer_Release(&tmpl); return -1; }
    self->fd = (int)PyLong_AsLong(fd_obj);
    Py_DECREF(fd_obj);
    if (self->fd < 0) {
        PyBuffer_Release(&tmpl);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "socket is closed");
        return -1;
    }
    PyMem_Free(self->tmpl);
    self->tmpl = PyMem_Malloc(tmpl.len);
    if (!self->tmpl) { PyBuffer_Release(&tmpl); PyErr_NoMemory(); return -1; }
    memcpy(self->tmpl, tmpl.buf, tmpl.len);
    self->tmpl_len = tmpl.len;
    self->tmpl_ext_len = (int32_t)(tmpl.len - 29);
    PyBuffer_Release(&tmpl);
    Py_INCREF(sock); Py_XSETREF(self->sock, sock);
    Py_INCREF(lock); Py_XSETREF(self->send_lock, lock);
    Py_INCREF(opaques); Py_XSETREF(self->opaques, opaques);
    self->end = end;
    self->max_nums = max_nums < 1 ? 1 : max_nums;
    self->step = self->max_nums;
    self->depth = depth < 1 ? 1 : (depth > MAX_DEPTH ? MAX_DEPTH : depth);
    self->filtered = filtered;
    if (filtered) self->depth = 1;
    self->window = self->depth;
    return 0;
}

/* run(offset, timeout, max_msgs, max_bytes, pending=b"") -> (reason, offset, extra)
 *
 * Pulls from ``offset`` until the output holds ``max_msgs`` messages or ``max_bytes`` bytes,
 * the range's end is reached, or something needs Python. ``extra`` by reason:
 *   BATCH, END: None;  RESPONSE: the answer's frame (after the length prefix) for ``offset``;
 *   FOREIGN: list of frames that are not ours (peer requests, other answers);
 *   TIMEOUT: None;  CLOSED: None;  ERROR: errno;  PROTOCOL: None.
 * On every return (an error raised included) the unframed received bytes are handed back by
 * rest(), and ``reached`` is the offset the output covers up to (rmq_pull_run.c runs it). */
static PyObject *Puller_run(Puller *self, PyObject *args) {
    long long offset_arg, max_msgs, max_bytes;
    double timeout;
    Py_buffer pending = {0};
    if (!PyArg_ParseTuple(args, "LdLL|y*", &offset_arg, &timeout, &max_msgs, &max_bytes,
                          &pending))
        return NULL;
    if (self->exports) {
        PyBuffer_Release(&pending);
        PyErr_SetString(PyExc_BufferError, "the output is still exported; release it first");
        return NULL;
    }
    return pull_run(self, &pending, offset_arg, timeout, max_msgs, max_bytes);
}


/* rest() -> (bytes, consumed): received bytes not framed yet (a partial frame, or what failed
 * framing), which the caller gives back to its frame decoder, and how many bytes were framed
 * here since the last call (the decoder counts them for its error positions). */
static PyObject *Puller_rest(Puller *self, PyObject *noargs) {
    PyObject *r = Py_BuildValue("(y#L)", self->rbuf ? self->rbuf + self->rpos : "",
                                self->rlen - self->rpos, (long long)self->consumed);
    if (!r) return NULL;
    self->rpos = self->rlen = 0;
    self->consumed = 0;
    return r;
}

/* offer(payload) -> bool: an answer another reader of the connection received; True if it
 * was one of this loop's (kept for run(), or dropped as stale). */
static PyObject *Puller_offer(Puller *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    int rc = pull_keep_answer(self, b.buf, b.len);
    PyBuffer_Release(&b);
    if (rc < 0) return NULL;  /* out of memory */
    return PyBool_FromLong(rc);
}

/* claim(opaque) -> offset or None: take a request out of the pipeline (its answer came in a
 * frame only Python could read); run() asks again for that offset when it gets there. */
static PyObject *Puller_claim(Puller *self, PyObject *args) {
    int opaque;
    if (!PyArg_ParseTuple(args, "i", &opaque)) return NULL;
    for (int j = 0; j < self->nflights; j++) {
        if (self->flights[j].opaque == opaque && !self->flights[j].arrived) {
            long long offset = self->flights[j].offset;
            pull_remove_flight(self, j, 0);
            return PyLong_FromLongLong(offset);
        }
    }
    Py_RETURN_NONE;
}

/* request(offset, nums, opaque) -> bytes: the frame this loop would send for that pull,
 * signature included (tests hold it against the Python encoder and signer). */
static PyObject *Puller_request(Puller *self, PyObject *args) {
    long long offset;
    int nums, opaque;
    if (!PyArg_ParseTuple(args, "Lii", &offset, &nums, &opaque)) return NULL;
    Py_ssize_t kept = self->slen;
    if (pull_append_request(self, offset, nums, opaque) < 0) return NULL;
    PyObject *frame = PyBytes_FromStringAndSize(self->sbuf + kept, self->slen - kept);
    self->slen = kept;
    return frame;
}

/* abandon(): forget every request in flight; their answers are dropped when they come. */
static PyObject *Puller_abandon(Puller *self, PyObject *noargs) {
    while (self->nflights) pull_remove_flight(self, self->nflights - 1, 1);
    Py_RETURN_NONE;
}

/* append(body, first_offset): add a body the Python side took (e.g. a FOUND answer it had to
 * decode itself) to the output. */
static PyObject *Puller_append(Puller *self, PyObject *args) {
    Py_buffer b;
    long long first, msgs;
    if (!PyArg_ParseTuple(args, "y*LL", &b, &first, &msgs)) return NULL;
    if (self->exports) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_BufferError, "the output is still exported; release it first");
        return NULL;
    }
    int rc = pull_append_body(self, b.buf, b.len, first);
    PyBuffer_Release(&b);
    if (rc < 0) return NULL;
    self->out_msgs += msgs;
    Py_RETURN_NONE;
}

/* clear(): empty the output (after it was decoded). */
static PyObject *Puller_clear(Puller *self, PyObject *noargs) {
    if (self->exports) {
        PyErr_SetString(PyExc_BufferError, "the output is still exported; release it first");
        return NULL;
    }
    self->olen = 0;
    self->npieces = 0;
    self->out_msgs = 0;
    Py_RETURN_NONE;
}

/* pieces() -> [(start, first_offset)]: where each appended body starts in the output. */
static PyObject *Puller_pieces(Puller *self, PyObject *noargs) {
    PyObject *list = PyList_New(self->npieces);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < self->npieces; i++) {
        PyObject *t = Py_BuildValue("(LL)", (long long)self->pieces[2 * i],
                                    (long long)self->pieces[2 * i + 1]);
        if (!t) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

static int Puller_getbuffer(Puller *self, Py_buffer *view, int flags) {
    static char empty[1];
    int rc = PyBuffer_FillInfo(view, (PyObject *)self, self->out ? self->out : empty,
                               self->olen, 1, flags);
    if (rc == 0) self->exports++;
    return rc;
}

static void Puller_releasebuffer(Puller *self, Py_buffer *view) { self->exports--; }

static PyBufferProcs Puller_as_buffer = {(getbufferproc)Puller_getbuffer,
                                         (releasebufferproc)Puller_releasebuffer};

static PyObject *Puller_get(Puller *self, void *which) {
    switch ((intptr_t)which) {
    case 0: return PyLong_FromSsize_t(self->olen);
    case 1: return PyLong_FromLongLong(self->out_msgs);
    case 2: return PyLong_FromLongLong(self->pulls);
    case 3: return PyLong_FromLong(self->step);
    case 4: return PyLong_FromLong(self->nflights);
    case 5: return PyLong_FromLongLong(self->requests);
    case 6: return PyLong_FromLongLong(self->gap_requests);
    case 8: return PyBool_FromLong(self->sign);
    case 9: return PyBool_FromLong(self->transport != NULL);
    case 10: return PyLong_FromLong(self->window);
    case 11: return PyLong_FromLongLong(self->reached);
    default: return PyLong_FromLongLong(self->broker_id);
    }
}

static int Puller_set_broker_id(Puller *self, PyObject *value, void *unused) {
    if (!value) { PyErr_SetString(PyExc_TypeError, "cannot delete broker_id"); return -1; }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    self->broker_id = v;
    return 0;
}

static int Puller_set_window(Puller *self, PyObject *value, void *unused) {
    if (!value) { PyErr_SetString(PyExc_TypeError, "cannot delete window"); return -1; }
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    self->window = v < 1 ? 1 : (v > self->depth ? self->depth : (int32_t)v);
    return 0;
}

static PyGetSetDef Puller_getset[] = {
    {"nbytes", (getter)Puller_get, NULL, "bytes in the output", (void *)0},
    {"messages", (getter)Puller_get, NULL, "messages in the output (offsets covered)", (void *)1},
    {"pulls", (getter)Puller_get, NULL, "FOUND answers consumed", (void *)2},
    {"step", (getter)Puller_get, NULL, "messages asked for per request (learned)", (void *)3},
    {"in_flight", (getter)Puller_get, NULL, "requests in flight", (void *)4},
    {"requests", (getter)Puller_get, NULL, "requests sent", (void *)5},
    {"gap_requests", (getter)Puller_get, NULL, "requests that filled a short answer's gap", (void *)6},
    {"signed", (getter)Puller_get, NULL, "whether requests carry a Signature", (void *)8},
    {"tls", (getter)Puller_get, NULL, "whether bytes go through the TLS transport", (void *)9},
    {"window", (getter)Puller_get, (setter)Puller_set_window,
     "requests allowed in flight now (1 to depth)", (void *)10},
    {"reached", (getter)Puller_get, NULL, "the offset the last run stopped at", (void *)11},
    {"broker_id", (getter)Puller_get, (setter)Puller_set_broker_id,
     "the suggestWhichBrokerId answers are expected to carry", (void *)7},
    {NULL},
};

static PyMethodDef Puller_methods[] = {
    {"run", (PyCFunction)Puller_run, METH_VARARGS, "Pull until a batch is full or Python is needed."},
    {"rest", (PyCFunction)Puller_rest, METH_NOARGS, "Received bytes not framed yet."},
    {"abandon", (PyCFunction)Puller_abandon, METH_NOARGS, "Forget the requests in flight."},
    {"request", (PyCFunction)Puller_request, METH_VARARGS, "The frame sent for one pull."},
    {"offer", (PyCFunction)Puller_offer, METH_VARARGS, "Keep an answer read by someone else."},
    {"claim", (PyCFunction)Puller_claim, METH_VARARGS, "Take a request out of the pipeline."},
    {"append", (PyCFunction)Puller_append, METH_VARARGS, "Add a body to the output."},
    {"clear", (PyCFunction)Puller_clear, METH_NOARGS, "Empty the output."},
    {"pieces", (PyCFunction)Puller_pieces, METH_NOARGS, "(start, first offset) per body."},
    {NULL},
};

static PyTypeObject PullerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rocketmq_spark.client._native.Puller",
    .tp_basicsize = sizeof(Puller),
    .tp_dealloc = (destructor)Puller_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_weaklistoffset = offsetof(Puller, weakrefs),
    .tp_doc = "The pull loop of one queue range (see native/client/rmq_pull.c).",
    .tp_methods = Puller_methods,
    .tp_getset = Puller_getset,
    .tp_init = (initproc)Puller_init,
    .tp_new = PyType_GenericNew,
    .tp_as_buffer = &Puller_as_buffer,
};

/* ------------------------------------------------------------------ header codec for Python */

/* parse_header(payload) -> (code, flag, opaque, next_begin, suggest, delta, has_next, parsed)
 * or None: the C reading of a frame (after its length prefix), exposed so tests can hold it
 * against the Python decoder. */
static PyObject *parse_header_py(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    head_t h;
    Py_ssize_t body_at;
    int rc = pull_parse_frame(b.buf, b.len, &h, &body_at);
    PyBuffer_Release(&b);
    if (rc != 0) Py_RETURN_NONE;
    return Py_BuildValue("(iiiLLLii)", h.code, h.flag, h.opaque, (long long)h.next_begin,
                         (long long)h.suggest, (long long)h.delta, h.has_next, h.parsed);
}

static PyMethodDef pull_functions[] = {
    {"parse_header", parse_header_py, METH_VARARGS, "The pull loop's reading of a frame header."},
    {NULL, NULL, 0, NULL},
};

int rmq_pull_register(PyObject *module) {
    if (PyType_Ready(&PullerType) < 0) return -1;
    Py_INCREF(&PullerType);
    if (PyModule_AddObject(module, "Puller", (PyObject *)&PullerType) < 0) {
        Py_DECREF(&PullerType);
        return -1;
    }
    if (PyModule_AddFunctions(module, pull_functions) < 0) return -1;
    return 0;
}
