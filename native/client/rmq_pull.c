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
 * (rocketmq_spark/client/python_pull_engine.py is the reference for the semantics).
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
 */#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "rmq_client.h"
#include "rmq_pull.h"

/* ------------------------------------------------------------------ the object */

static void flight_free(flight_t *fl) {
    PyMem_Free(fl->frame);
    fl->frame = NULL;
    fl->arrived = 0;
}

static void drop_opaque(Puller *self, int32_t opaque) {
    self->dropped[self->dropped_at] = opaque;
    self->dropped_at = (self->dropped_at + 1) % DROPPED_RING;
    if (self->ndropped < DROPPED_RING) self->ndropped++;
}

static int is_dropped(Puller *self, int32_t opaque) {
    for (int i = 0; i < self->ndropped; i++)
        if (self->dropped[i] == opaque) return 1;
    return 0;
}

static void remove_flight(Puller *self, int i, int dropped) {
    if (dropped && !self->flights[i].arrived) drop_opaque(self, self->flights[i].opaque);
    flight_free(&self->flights[i]);
    self->flights[i] = self->flights[--self->nflights];
    memset(&self->flights[self->nflights], 0, sizeof(flight_t));
}

static int find_flight(Puller *self, int64_t offset) {
    for (int i = 0; i < self->nflights; i++)
        if (self->flights[i].offset == offset) return i;
    return -1;
}

static void drop_stale(Puller *self, int64_t offset) {
    for (int i = self->nflights - 1; i >= 0; i--)
        if (self->flights[i].offset < offset) remove_flight(self, i, 1);
}

static void Puller_dealloc(Puller *self) {
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    for (int i = 0; i < self->nflights; i++) flight_free(&self->flights[i]);
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

/* ------------------------------------------------------------------ output */

static int append_body(Puller *self, const char *body, Py_ssize_t n, int64_t first) {
    if (grow(&self->out, &self->ocap, self->olen + n) < 0) return -1;
    Py_ssize_t need = (self->npieces + 1) * 2;
    if (need > self->pcap) {
        Py_ssize_t cap = self->pcap ? self->pcap * 2 : 256;
        while (cap < need) cap *= 2;
        int64_t *p = PyMem_Realloc(self->pieces, cap * sizeof(int64_t));
        if (!p) { PyErr_NoMemory(); return -1; }
        self->pieces = p;
        self->pcap = cap;
    }
    self->pieces[2 * self->npieces] = self->olen;
    self->pieces[2 * self->npieces + 1] = first;
    self->npieces++;
    if (n) memcpy(self->out + self->olen, body, n);
    self->olen += n;
    return 0;
}

/* The records of a body below ``end`` (only sizes and offsets are read; a record that cannot
 * be walked is left for the decoder to report), as the Python reader's _trim. */
static Py_ssize_t trim_len(const uint8_t *b, Py_ssize_t n, int64_t end) {
    Py_ssize_t pos = 0;
    while (pos + MIN_RECORD_WALK <= n) {
        if (rd64(b + pos + 20) >= end) return pos;
        int32_t total = rd32(b + pos);
        if (total < 91) break;
        pos += total;
    }
    return n;
}

/* ------------------------------------------------------------------ the loop */

static int consume_frame(Puller *self, int i, const uint8_t *frame, Py_ssize_t frame_len,
                         int64_t *offset);

/* A kept answer that is ours: can it be consumed here? */
static int plain_found(Puller *self, flight_t *fl) {
    head_t *h = &fl->head;
    return h->parsed && h->code == 0 && h->has_next && h->next_begin > fl->offset &&
           h->suggest == self->broker_id && h->delta == 0;
}

/* Consume the answer for the current offset; returns the new offset. */
static int consume(Puller *self, int i, int64_t *offset) {
    flight_t *fl = &self->flights[i];
    return consume_frame(self, i, (const uint8_t *)fl->frame, fl->frame_len, offset);
}

/* The same, for the answer's frame where it lies (kept, or still in the receive buffer). */
static int consume_frame(Puller *self, int i, const uint8_t *frame, Py_ssize_t frame_len,
                         int64_t *offset) {
    flight_t *fl = &self->flights[i];
    int64_t next = fl->head.next_begin;
    const uint8_t *body = frame + fl->body_at;
    Py_ssize_t blen = frame_len - fl->body_at;
    if (next > self->end) blen = trim_len(body, blen, self->end);
    if (append_body(self, (const char *)body, blen, fl->offset) < 0) return -1;
    int64_t got = (next < self->end ? next : self->end) - fl->offset;
    self->out_msgs += got;
    self->pulls++;
    if (self->window < self->depth)  /* after a busy answer: back to depth, doubling */
        self->window = self->window * 2 < self->depth ? self->window * 2 : self->depth;
    if (!self->filtered && next < self->end) {
        /* learn the broker's cap: an answer below what was asked is capped */
        if (got < fl->nums) { self->step = (int32_t)got; self->full_streak = 0; }
        else if (got == fl->nums && fl->nums == self->step && ++self->full_streak >= 64) {
            self->full_streak = 0;  /* now and then, ask whether the cap has grown */
            int64_t s = (int64_t)self->step * 2;
            self->step = (int32_t)(s > self->max_nums ? self->max_nums : s);
        }
    }
    remove_flight(self, i, 0);
    *offset = next;
    drop_stale(self, next);
    return 0;
}

static PyObject *result(int reason, int64_t offset, PyObject *extra) {
    if (!extra) { extra = Py_None; Py_INCREF(extra); }
    return Py_BuildValue("(iLN)", reason, (long long)offset, extra);
}

/* One run() call's state, handed between its steps. */
typedef struct {
    int64_t offset;           /* the next offset to deliver */
    double timeout, deadline; /* the deadline moves on whenever a message is consumed */
    long long max_msgs, max_bytes;
    int closed;               /* the peer closed the connection */
} run_t;

/* Append the bytes Python read before this run (run's ``pending``) to the receive buffer;
 * releases ``pending``. 0, or -1 with an error. */
static int take_pending(Puller *self, Py_buffer *pending) {
    int rc = 0;
    if (pending->buf && pending->len) {
        if (grow(&self->rbuf, &self->rcap, self->rlen + pending->len) < 0) {
            rc = -1;
        } else {
            memcpy(self->rbuf + self->rlen, pending->buf, pending->len);
            self->rlen += pending->len;
        }
    }
    PyBuffer_Release(pending);
    return rc;
}

enum { TAKEN_NOTHING, TAKEN_CONSUMED, TAKEN_DONE };

/* The answer for the current offset when it arrived earlier: a plain FOUND is consumed
 * (TAKEN_CONSUMED), anything else ends the run as RESPONSE (TAKEN_DONE, *out the result or
 * NULL with an error). TAKEN_NOTHING when it has not arrived. */
static int take_arrived(Puller *self, run_t *run, PyObject **out) {
    int i = find_flight(self, run->offset);
    if (i < 0 || !self->flights[i].arrived) return TAKEN_NOTHING;
    if (plain_found(self, &self->flights[i])) {
        if (consume(self, i, &run->offset) < 0) { *out = NULL; return TAKEN_DONE; }
        run->deadline = now_s() + run->timeout;
        return TAKEN_CONSUMED;
    }
    flight_t *fl = &self->flights[i];
    PyObject *frame = PyBytes_FromStringAndSize(fl->frame, fl->frame_len);
    if (!frame) { *out = NULL; return TAKEN_DONE; }
    remove_flight(self, i, 0);
    *out = result(R_RESPONSE, run->offset, frame);
    return TAKEN_DONE;
}

/* Plan the requests the window allows and send what is queued. 0 to go on, or 1 when the run
 * ends (*out: TIMEOUT, CLOSED or ERROR, or NULL with an error). */
static int send_planned(Puller *self, run_t *run, PyObject **out) {
    if (pull_plan(self, run->offset) < 0) { *out = NULL; return 1; }
    if (run->closed && self->transport) self->slen = 0;  /* nobody to send to: report CLOSED */
    int rc = pull_flush_requests(self, run->deadline, &run->closed);
    if (rc == -2) { *out = NULL; return 1; }
    if (rc == -3) { *out = result(R_TIMEOUT, run->offset, NULL); return 1; }
    if (rc == -1) {
        *out = result(run->closed ? R_CLOSED : R_ERROR, run->offset, PyLong_FromLong(errno));
        return 1;
    }
    return 0;
}

/* The pull in flight that a parsed frame answers (by opaque), or -1. */
static int flight_answered(const Puller *self, int parsed, const head_t *h) {
    if (parsed != 0 || !(h->flag & 1)) return -1;
    for (int j = 0; j < self->nflights; j++)
        if (self->flights[j].opaque == h->opaque && !self->flights[j].arrived) return j;
    return -1;
}

/* Keep flight k's answer for later (it answers a later offset, or is not a plain FOUND).
 * 0, or -1 with an error. */
static int keep_for_later(Puller *self, int k, const uint8_t *payload, Py_ssize_t length,
                       const head_t *h, Py_ssize_t body_at) {
    flight_t *fl = &self->flights[k];
    fl->frame = PyMem_Malloc(length ? length : 1);
    if (!fl->frame) { PyErr_NoMemory(); return -1; }
    memcpy(fl->frame, payload, length);
    fl->frame_len = length;
    fl->body_at = body_at;
    fl->head = *h;
    fl->arrived = 1;
    return 0;
}

/* Add a frame that answers no pull in flight to *foreign (made on first use) for Python,
 * unless it answers a pull dropped earlier. 0, or -1 with an error. */
static int keep_foreign(Puller *self, PyObject **foreign, int parsed, const head_t *h,
                        const uint8_t *payload, int32_t length) {
    if (parsed == 0 && (h->flag & 1) && is_dropped(self, h->opaque)) return 0;
    if (!*foreign && !(*foreign = PyList_New(0))) return -1;
    PyObject *frame = PyBytes_FromStringAndSize((const char *)payload, length);
    int rc = frame ? PyList_Append(*foreign, frame) : -1;
    Py_XDECREF(frame);
    return rc;
}

enum { FRAMED_FAILED = -1, FRAMED_BROKEN = -2 };

/* Frame what has arrived in the receive buffer: the answer for the current offset is consumed
 * at once (no copy before the output), other answers of ours kept for later, anything else
 * collected in *foreign. Returns 1 when something progressed, 0 when nothing did (only whole
 * frames are taken), FRAMED_FAILED with an error, FRAMED_BROKEN on a frame that breaks the
 * protocol. */
static int frame_received(Puller *self, run_t *run, PyObject **foreign) {
    int progressed = 0;
    for (;;) {
        Py_ssize_t avail = self->rlen - self->rpos;
        if (avail < 4) break;
        const uint8_t *f = (const uint8_t *)self->rbuf + self->rpos;
        int32_t length = rd32(f);
        if (length < 4 || (int64_t)length + 4 > MAX_FRAME) return FRAMED_BROKEN;
        if (avail - 4 < length) break;
        const uint8_t *payload = f + 4;
        head_t h;
        Py_ssize_t body_at = 0;
        int parsed = pull_parse_frame(payload, length, &h, &body_at);
        if (parsed < 0) return FRAMED_BROKEN;
        int k = flight_answered(self, parsed, &h);
        if (k >= 0 && self->flights[k].offset == run->offset &&
            self->out_msgs < run->max_msgs && self->olen < run->max_bytes) {
            flight_t *fl = &self->flights[k];
            fl->head = h;
            fl->body_at = body_at;
            if (plain_found(self, fl)) {
                self->rpos += 4 + length;
                self->consumed += 4 + length;
                if (consume_frame(self, k, payload, length, &run->offset) < 0)
                    return FRAMED_FAILED;
                progressed = 1;
                run->deadline = now_s() + run->timeout;
                continue;
            }
        }
        if (k >= 0) {
            if (keep_for_later(self, k, payload, length, &h, body_at) < 0) return FRAMED_FAILED;
            progressed = 1;
        } else if (keep_foreign(self, foreign, parsed, &h, payload, length) < 0) {
            return FRAMED_FAILED;
        }
        self->rpos += 4 + length;
        self->consumed += 4 + length;
    }
    return progressed;
}

/* Wait for bytes until the deadline and read them. 0 to go on (whatever was read), or 1 when
 * the run ends (*out: TIMEOUT or ERROR, or NULL with an error, e.g. Ctrl-C during the wait). */
static int wait_and_receive(Puller *self, run_t *run, PyObject **out) {
    double left = run->deadline - now_s();
    if (left <= 0) { *out = result(R_TIMEOUT, run->offset, NULL); return 1; }
    if (self->transport) {
        if (pull_transport_recv(self, left, &run->closed) < 0) { *out = NULL; return 1; }
        return 0;
    }
    struct pollfd pfd = {self->fd, POLLIN, 0};
    int ready;
    Py_BEGIN_ALLOW_THREADS
    ready = poll(&pfd, 1, (int)(left * 1000) + 1);
    Py_END_ALLOW_THREADS
    if (ready < 0 && errno != EINTR) {
        *out = result(R_ERROR, run->offset, PyLong_FromLong(errno));
        return 1;
    }
    if (ready < 0 && PyErr_CheckSignals() < 0) { *out = NULL; return 1; }  /* raise it now */
    if (ready > 0) {
        int got = pull_recv_some(self, &run->closed);
        if (got == -2) { *out = NULL; return 1; }
        if (got == -1) { *out = result(R_ERROR, run->offset, PyLong_FromLong(errno)); return 1; }
    }
    return 0;
}

/* The steps of one run() until it returns (see run below). */
static PyObject *run_steps(Puller *self, run_t *run) {
    PyObject *out = NULL;
    for (;;) {
        if (run->offset >= self->end) return result(R_END, run->offset, NULL);
        if (self->out_msgs >= run->max_msgs || self->olen >= run->max_bytes)
            return result(R_BATCH, run->offset, NULL);
        int taken = take_arrived(self, run, &out);
        if (taken == TAKEN_DONE) return out;
        if (taken == TAKEN_CONSUMED) continue;
        if (send_planned(self, run, &out)) return out;
        PyObject *foreign = NULL;  /* frames that answer no pull in flight, for Python */
        int framed = frame_received(self, run, &foreign);
        if (framed < 0) {
            Py_XDECREF(foreign);
            return framed == FRAMED_BROKEN ? result(R_PROTOCOL, run->offset, NULL) : NULL;
        }
        if (foreign) return result(R_FOREIGN, run->offset, foreign);
        if (framed) continue;
        if (run->closed) return result(R_CLOSED, run->offset, NULL);
        if (wait_and_receive(self, run, &out)) return out;
    }
}

/* run(offset, timeout, max_msgs, max_bytes, pending=b"") -> (reason, offset, extra)
 *
 * Pulls from ``offset`` until the output holds ``max_msgs`` messages or ``max_bytes`` bytes,
 * the range's end is reached, or something needs Python. ``extra`` by reason:
 *   BATCH, END: None;  RESPONSE: the answer's frame (after the length prefix) for ``offset``;
 *   FOREIGN: list of frames that are not ours (peer requests, other answers);
 *   TIMEOUT: None;  CLOSED: None;  ERROR: errno;  PROTOCOL: None.
 * On every return (an error raised included) the unframed received bytes are handed back by
 * rest(), and ``reached`` is the offset the output covers up to. */
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
    if (take_pending(self, &pending) < 0) return NULL;
    run_t run = {.offset = offset_arg, .timeout = timeout, .max_msgs = max_msgs,
                 .max_bytes = max_bytes, .closed = 0};
    drop_stale(self, run.offset);
    run.deadline = now_s() + timeout;
    PyObject *out = run_steps(self, &run);
    self->reached = run.offset;  /* the output holds the range up to here, whatever ended it */
    return out;
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

/* Keep an answer that arrived outside run() (another thread held the socket); 1 if it is ours. */
static int keep_answer(Puller *self, const uint8_t *payload, Py_ssize_t length) {
    head_t h;
    Py_ssize_t body_at = 0;
    int parsed = pull_parse_frame(payload, length, &h, &body_at);
    if (parsed != 0 || !(h.flag & 1)) return 0;
    int k = flight_answered(self, parsed, &h);
    if (k >= 0) return keep_for_later(self, k, payload, length, &h, body_at) < 0 ? -1 : 1;
    return is_dropped(self, h.opaque) ? 1 : 0;
}

/* offer(payload) -> bool: an answer another reader of the connection received; True if it
 * was one of this loop's (kept for run(), or dropped as stale). */
static PyObject *Puller_offer(Puller *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    int rc = keep_answer(self, b.buf, b.len);
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
            remove_flight(self, j, 0);
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
    while (self->nflights) remove_flight(self, self->nflights - 1, 1);
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
    int rc = append_body(self, b.buf, b.len, first);
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
