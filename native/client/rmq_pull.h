/*
 * The pull loop's parts (rmq_pull.c: the Puller object and its methods; rmq_pull_run.c: the
 * requests in flight, the output and the steps of one run; rmq_pull_answer.c: reading an
 * answer's header; rmq_pull_io.c: planning, signing and sending requests, receiving bytes),
 * private to them.
 */
#ifndef RMQ_PULL_H
#define RMQ_PULL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#include "rmq_bytes.h"
#include "rmq_hmac.h"

#define MAX_FRAME (16 * 1024 * 1024)
#define MAX_DEPTH 64
#define DROPPED_RING 128
#define RECV_CHUNK (256 * 1024)
#define MIN_RECORD_WALK 28

/* run() results */
enum { R_BATCH = 0, R_END = 1, R_RESPONSE = 2, R_FOREIGN = 3, R_TIMEOUT = 4, R_CLOSED = 5,
       R_ERROR = 6, R_PROTOCOL = 7 };

/* What the loop needs of one answer's header. */
typedef struct {
    int32_t code, flag, opaque;
    int64_t next_begin, suggest, delta, min_offset, max_offset;
    int has_next, parsed; /* parsed: the fields above are trustworthy */
} head_t;

typedef struct {
    int64_t offset;
    int32_t nums;
    int32_t opaque;
    int arrived;      /* 1 = answer kept in frame/frame_len */
    char *frame;      /* the whole payload after the length prefix (header + body) */
    Py_ssize_t frame_len;
    head_t head;
    Py_ssize_t body_at; /* body start within frame */
} flight_t;

typedef struct {
    PyObject_HEAD
    PyObject *weakrefs;
    int fd;
    PyObject *sock, *send_lock, *opaques;
    char *tmpl;                 /* request frame without maxMsgNums and queueOffset */
    Py_ssize_t tmpl_len;
    int32_t tmpl_ext_len;
    int64_t end;
    int32_t max_nums, step, depth, full_streak;
    int32_t window;             /* requests allowed in flight now: depth, or less after a
                                 * busy answer (doubling back per answer consumed) */
    int64_t reached;            /* the offset the last run() stopped at */
    int64_t broker_id;
    int filtered;               /* tag filter: one pull at a time, counts are not steps */
    flight_t flights[MAX_DEPTH];
    int nflights;
    int32_t dropped[DROPPED_RING];
    int ndropped, dropped_at;
    char *rbuf;                 /* received bytes not yet framed: rbuf[rpos:rlen] */
    Py_ssize_t rcap, rlen, rpos;
    char *out;                  /* bodies of FOUND answers, back to back */
    Py_ssize_t ocap, olen;
    int64_t *pieces;            /* (start in out, first offset) per appended body */
    Py_ssize_t npieces, pcap;
    int64_t out_msgs;
    int exports;
    int64_t pulls, requests, gap_requests;
    int64_t consumed;           /* bytes framed since the last rest() */
    char *sbuf;                 /* requests being built */
    Py_ssize_t scap, slen;
    PyObject *transport;        /* TLS: recv_into(view, timeout) / send(data); NULL: the fd */
    int sign;                   /* requests carry a Signature */
    rmq_hmac_t key;             /* the secret's padded states (never the secret itself) */
    rmq_sha1_t signed_head;     /* key.inner with the signed content before the 1st value */
    char *sign_mid, *sign_tail; /* signed content between the values, and after them */
    Py_ssize_t sign_mid_len, sign_tail_len;
    int offset_first;           /* queueOffset sorts before maxMsgNums (it never does) */
} Puller;

static inline int64_t rd64(const uint8_t *p) {
    return (int64_t)((uint64_t)(uint32_t)rd32(p) << 32 | (uint32_t)rd32(p + 4));
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int grow(char **buf, Py_ssize_t *cap, Py_ssize_t need) {
    if (need <= *cap) return 0;
    Py_ssize_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    char *p = PyMem_Realloc(*buf, n);
    if (!p) { PyErr_NoMemory(); return -1; }
    *buf = p;
    *cap = n;
    return 0;
}

/* rmq_pull_answer.c: parse an answer frame (after its length prefix) into *h: 0 when the
 * fields the loop reads are trustworthy, 1 when the framing is readable but only Python can
 * judge the header, -1 when the framing is wrong (Python reports it); *body_at is the body's
 * start within the frame. */
int pull_parse_frame(const uint8_t *f, Py_ssize_t n, head_t *h, Py_ssize_t *body_at);

/* rmq_pull_run.c: free a flight's kept answer; forget flight i (dropped: its answer, when it
 * comes, is dropped as stale); append a body to the output; keep an answer received outside
 * run() (1 if ours, 0 if not, -1 with an error); run() once its arguments are parsed. */
void pull_flight_free(flight_t *fl);
void pull_remove_flight(Puller *self, int i, int dropped);
int pull_append_body(Puller *self, const char *body, Py_ssize_t n, int64_t first);
int pull_keep_answer(Puller *self, const uint8_t *payload, Py_ssize_t length);
PyObject *pull_run(Puller *self, Py_buffer *pending, int64_t offset, double timeout,
                   long long max_msgs, long long max_bytes);

/* rmq_pull_io.c */
void pull_signature(Puller *self, const char digits[2][24], const int dl[2], char out[28]);
int pull_append_request(Puller *self, int64_t offset, int32_t nums, int32_t opaque);
int pull_recv_some(Puller *self, int *closed);
int pull_transport_recv(Puller *self, double left, int *closed);
int pull_flush_requests(Puller *self, double deadline, int *closed);
int pull_plan(Puller *self, int64_t offset);

#endif /* RMQ_PULL_H */
