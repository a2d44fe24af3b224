/*
 * The pull loop's traffic: planning the pipeline of PULL_MESSAGE requests, encoding and
 * signing each, sending them (on the socket or through the TLS transport) and receiving
 * bytes into the receive buffer, with the GIL released around every system call.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "rmq_pull.h"

/* The request's Signature (28 base64 characters) over the signed content with its values. */
void pull_signature(Puller *self, const char digits[2][24], const int dl[2], char out[28]) {
    int first = self->offset_first ? 1 : 0;
    rmq_sha1_t inner = self->signed_head;
    rmq_sha1_update(&inner, digits[first], dl[first]);
    rmq_sha1_update(&inner, self->sign_mid, self->sign_mid_len);
    rmq_sha1_update(&inner, digits[1 - first], dl[1 - first]);
    rmq_sha1_update(&inner, self->sign_tail, self->sign_tail_len);
    uint8_t mac[20];
    rmq_hmac_finish(&self->key, &inner, mac);
    rmq_base64(mac, 20, out);
}

int pull_append_request(Puller *self, int64_t offset, int32_t nums, int32_t opaque) {
    char digits[2][24];
    int dl[2];
    dl[0] = snprintf(digits[0], sizeof(digits[0]), "%d", (int)nums);
    dl[1] = snprintf(digits[1], sizeof(digits[1]), "%lld", (long long)offset);
    Py_ssize_t extra = (2 + 10 + 4 + dl[0]) + (2 + 11 + 4 + dl[1]);
    if (self->sign) extra += 2 + 9 + 4 + 28;
    Py_ssize_t len = self->tmpl_len + extra;
    if (grow(&self->sbuf, &self->scap, self->slen + len) < 0) return -1;
    uint8_t *p = (uint8_t *)self->sbuf + self->slen;
    memcpy(p, self->tmpl, self->tmpl_len);
    wr32(p, (uint32_t)(len - 4));
    wr32(p + 4, (1u << 24) | (uint32_t)(len - 8));
    wr32(p + 13, (uint32_t)opaque);
    wr32(p + 25, (uint32_t)(self->tmpl_ext_len + extra));
    uint8_t *q = p + self->tmpl_len;
    static const char *keys[2] = {"maxMsgNums", "queueOffset"};
    for (int i = 0; i < 2; i++) {
        int kl = (int)strlen(keys[i]);
        q[0] = 0; q[1] = (uint8_t)kl;
        memcpy(q + 2, keys[i], kl);
        wr32(q + 2 + kl, (uint32_t)dl[i]);
        memcpy(q + 6 + kl, digits[i], dl[i]);
        q += 6 + kl + dl[i];
    }
    if (self->sign) {
        q[0] = 0; q[1] = 9;
        memcpy(q + 2, "Signature", 9);
        wr32(q + 11, 28);
        pull_signature(self, (const char (*)[24])digits, dl, (char *)q + 15);
    }
    self->slen += len;
    return 0;
}

/* At least RECV_CHUNK free bytes at the end of rbuf: reset when all is consumed, else
 * compact, then grow; -1 with a Python error. */
static int make_room(Puller *self) {
    if (self->rpos > 0 && self->rpos == self->rlen) self->rpos = self->rlen = 0;
    if (self->rcap - self->rlen < RECV_CHUNK) {
        if (self->rpos > 0) {  /* compact */
            memmove(self->rbuf, self->rbuf + self->rpos, self->rlen - self->rpos);
            self->rlen -= self->rpos;
            self->rpos = 0;
        }
        if (grow(&self->rbuf, &self->rcap, self->rlen + RECV_CHUNK) < 0) return -1;
    }
    return 0;
}

/* Pull whatever has arrived into rbuf without blocking; -1 with errno, 0 closed, else 1. */
int pull_recv_some(Puller *self, int *closed) {
    if (make_room(self) < 0) return -2;
    ssize_t got;
    Py_BEGIN_ALLOW_THREADS
    got = recv(self->fd, self->rbuf + self->rlen, self->rcap - self->rlen, MSG_DONTWAIT);
    Py_END_ALLOW_THREADS
    if (got < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 1 : -1;
    if (got == 0) { *closed = 1; return 0; }
    self->rlen += got;
    return 1;
}

/* Take decrypted bytes from the TLS transport into rbuf, waiting at most ``left`` seconds:
 * transport.recv_into(view of rbuf's free space, left) -> count, 0 closed, None timed out.
 * -2 with a Python error (the connection's code turns OSError and SSLError into a lost
 * connection), else 1 (nothing new when nothing came in time, *closed when the peer closed). */
int pull_transport_recv(Puller *self, double left, int *closed) {
    if (make_room(self) < 0) return -2;
    PyObject *view = PyMemoryView_FromMemory(self->rbuf + self->rlen, self->rcap - self->rlen,
                                             PyBUF_WRITE);
    if (!view) return -2;
    PyObject *got = PyObject_CallMethod(self->transport, "recv_into", "Od", view,
                                        left > 0 ? left : 0.0);
    /* the view must not outlive this call (rbuf may move), whatever recv_into did */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    Py_DECREF(view);
    if (!got) {
        Py_XDECREF(released);
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -2;
    }
    if (!released) { Py_DECREF(got); return -2; }
    Py_DECREF(released);
    if (got == Py_None) { Py_DECREF(got); return 1; }
    Py_ssize_t n = PyLong_AsSsize_t(got);
    Py_DECREF(got);
    if (n == -1 && PyErr_Occurred()) return -2;
    if (n < 0 || n > self->rcap - self->rlen) {
        PyErr_SetString(PyExc_ValueError, "transport.recv_into returned a bad count");
        return -2;
    }
    if (n == 0) *closed = 1;
    self->rlen += n;
    return 1;
}

/* The TLS path of flush_requests: the burst goes to transport.send as one call, under the
 * connection's send lock (as its other senders do). -2 with a Python error, else 0. */
static int transport_send(Puller *self) {
    PyObject *r = PyObject_CallMethod(self->send_lock, "acquire", NULL);
    if (!r) return -2;
    Py_DECREF(r);
    PyObject *view = PyMemoryView_FromMemory(self->sbuf, self->slen, PyBUF_READ);
    PyObject *sent = view ? PyObject_CallMethod(self->transport, "send", "O", view) : NULL;
    Py_XDECREF(view);
    Py_XDECREF(sent);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);  /* release the lock whatever happened */
    r = PyObject_CallMethod(self->send_lock, "release", NULL);
    Py_XDECREF(r);
    if (!r) {
        Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
        self->slen = 0;
        return -2;
    }
    PyErr_Restore(type, value, tb);
    self->slen = 0;
    return sent ? 0 : -2;
}

/* Send sbuf[0:slen] whole, under the connection's send lock; reads meanwhile if the socket
 * is full (so neither side can block on a full buffer). -1 with errno set, -2 Python error,
 * -3 timed out, 0 ok. */
int pull_flush_requests(Puller *self, double deadline, int *closed) {
    if (!self->slen) return 0;
    if (self->transport) return transport_send(self);
    PyObject *r = PyObject_CallMethod(self->send_lock, "acquire", NULL);
    if (!r) return -2;
    Py_DECREF(r);
    int rc = 0;
    Py_ssize_t sent = 0;
    while (sent < self->slen) {
        ssize_t n;
        Py_BEGIN_ALLOW_THREADS
        n = send(self->fd, self->sbuf + sent, self->slen - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        Py_END_ALLOW_THREADS
        if (n > 0) { sent += n; continue; }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) { rc = -1; break; }
        double left = deadline - now_s();
        if (left <= 0) { rc = -3; break; }
        struct pollfd pfd = {self->fd, POLLOUT | POLLIN, 0};
        int pr;
        Py_BEGIN_ALLOW_THREADS
        pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        Py_END_ALLOW_THREADS
        if (pr > 0 && (pfd.revents & POLLIN)) {
            int got = pull_recv_some(self, closed);
            if (got == -2) { rc = -2; break; }
            if (got < 0) { rc = -1; break; }
            if (*closed) { rc = -1; errno = ECONNRESET; break; }
        }
    }
    int saved = errno;
    r = PyObject_CallMethod(self->send_lock, "release", NULL);
    if (!r) return -2;
    Py_DECREF(r);
    errno = saved;
    self->slen = 0;
    return rc;
}

static int next_opaque(Puller *self, int32_t *opaque) {
    PyObject *o = PyIter_Next(self->opaques);
    if (!o) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "opaque counter ended");
        return -1;
    }
    long long v = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *opaque = (int32_t)(v & 0x7FFFFFFF);
    return 0;
}

/* Queue a request for [offset, offset+nums); -1 on a Python error. */
static int want(Puller *self, int64_t offset, int32_t nums) {
    int32_t opaque;
    if (next_opaque(self, &opaque) < 0) return -1;
    if (pull_append_request(self, offset, nums, opaque) < 0) return -1;
    flight_t *fl = &self->flights[self->nflights++];
    memset(fl, 0, sizeof(*fl));
    fl->offset = offset;
    fl->nums = nums;
    fl->opaque = opaque;
    self->requests++;
    return 0;
}

/* Requests for the current offset (if none is in flight) and, once half the window has
 * drained, for the offsets after the last one requested (the window is the depth, except
 * after a busy answer, see rmq_pull_run.c's consume_frame). */
int pull_plan(Puller *self, int64_t offset) {
    int64_t covered = offset, next_start = INT64_MAX;
    int here = 0;
    for (int i = 0; i < self->nflights; i++) {
        flight_t *fl = &self->flights[i];
        if (fl->offset == offset) here = 1;
        if (fl->offset > offset && fl->offset < next_start) next_start = fl->offset;
        if (fl->offset + fl->nums > covered) covered = fl->offset + fl->nums;
    }
    if (!here) {
        int64_t limit = next_start < self->end ? next_start : self->end;
        int64_t nums = limit - offset;
        if (nums > self->step) nums = self->step;
        if (self->filtered || nums < 1) nums = self->max_nums;
        if (want(self, offset, (int32_t)nums) < 0) return -1;
        if (next_start != INT64_MAX) self->gap_requests++;
        if (offset + nums > covered) covered = offset + nums;
    }
    if (self->filtered) return 0;
    if (self->nflights > self->window / 2) return 0;
    while (self->nflights < self->window && covered < self->end) {
        int64_t nums = self->end - covered;
        if (nums > self->step) nums = self->step;
        if (want(self, covered, (int32_t)nums) < 0) return -1;
        covered += nums;
    }
    return 0;
}
