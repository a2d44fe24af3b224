/*
 * One run() of the pull loop (rmq_pull.c holds the Puller object and its methods): the
 * bookkeeping of the requests in flight, the output the FOUND bodies are appended to, and the
 * steps of a run: consume what arrived, plan and send requests (rmq_pull_io.c), frame what
 * was received (headers read by rmq_pull_answer.c), wait for more.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "rmq_pull.h"

/* ------------------------------------------------------------------ the requests in flight */

void pull_flight_free(flight_t *fl) {
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

void pull_remove_flight(Puller *self, int i, int dropped) {
    if (dropped && !self->flights[i].arrived) drop_opaque(self, self->flights[i].opaque);
    pull_flight_free(&self->flights[i]);
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
        if (self->flights[i].offset < offset) pull_remove_flight(self, i, 1);
}

/* ------------------------------------------------------------------ output */

int pull_append_body(Puller *self, const char *body, Py_ssize_t n, int64_t first) {
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
    if (pull_append_body(self, (const char *)body, blen, fl->offset) < 0) return -1;
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
    pull_remove_flight(self, i, 0);
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
    pull_remove_flight(self, i, 0);
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

/* Keep an answer that arrived outside run() (another thread held the socket); 1 if it is ours. */
int pull_keep_answer(Puller *self, const uint8_t *payload, Py_ssize_t length) {
    head_t h;
    Py_ssize_t body_at = 0;
    int parsed = pull_parse_frame(payload, length, &h, &body_at);
    if (parsed != 0 || !(h.flag & 1)) return 0;
    int k = flight_answered(self, parsed, &h);
    if (k >= 0) return keep_for_later(self, k, payload, length, &h, body_at) < 0 ? -1 : 1;
    return is_dropped(self, h.opaque) ? 1 : 0;
}

/* The body of run() (see Puller_run in rmq_pull.c), its arguments parsed: takes ``pending``
 * into the receive buffer (releasing it), runs the steps and records ``reached``. */
PyObject *pull_run(Puller *self, Py_buffer *pending, int64_t offset, double timeout,
                   long long max_msgs, long long max_bytes) {
    if (take_pending(self, pending) < 0) return NULL;
    run_t run = {.offset = offset, .timeout = timeout, .max_msgs = max_msgs,
                 .max_bytes = max_bytes, .closed = 0};
    drop_stale(self, run.offset);
    run.deadline = now_s() + timeout;
    PyObject *out = run_steps(self, &run);
    self->reached = run.offset;  /* the output holds the range up to here, whatever ended it */
    return out;
}
