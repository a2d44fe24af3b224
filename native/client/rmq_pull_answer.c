/*
 * The pull loop's reading of an answer's header (binary or JSON, through the shared walkers of
 * rmq_reqhdr.h): the fields its handling reads, as Python's pull_result reads them.
 */
#include "rmq_pull.h"
#include "rmq_reqhdr.h"

/* The ext fields a pull answer's handling reads (Python's pull_result parses these five, and
 * rejects the answer if one is not a number); 1 if the key is one of them. */
static int take_field(head_t *h, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                      Py_ssize_t vl, int *bad) {
    int64_t *dst = NULL;
    if (kl == 15 && memcmp(k, "nextBeginOffset", 15) == 0) { dst = &h->next_begin; h->has_next = 1; }
    else if (kl == 20 && memcmp(k, "suggestWhichBrokerId", 20) == 0) dst = &h->suggest;
    else if (kl == 11 && memcmp(k, "offsetDelta", 11) == 0) dst = &h->delta;
    else if (kl == 9 && memcmp(k, "minOffset", 9) == 0) dst = &h->min_offset;  /* checked */
    else if (kl == 9 && memcmp(k, "maxOffset", 9) == 0) dst = &h->max_offset;  /* as Python */
    else return 0;
    if (vl == 0) { *dst = 0; return 1; }  /* Python reads "" as the default, 0 */
    /* optional '-', 1 to 18 digits: longer numbers are refused as bad */
    if (rmq_dec(v, vl, RMQ_DEC_MINUS, 18, INT64_MIN, INT64_MAX, dst) < 0) *bad = 1;
    return 1;
}

/* ROCKETMQ binary header (see rocketmq_spark/client/protocol/frame.py), walked by the shared
 * reader of rmq_reqhdr.h. 0 ok, -1 not for this loop (malformed, or text that is not ASCII:
 * the Python decoder judges it). */
typedef struct { head_t *head; int bad, have; } take_ctx_t;

static int take_ext(void *ctx, const uint8_t *k, Py_ssize_t kl, int kesc, const uint8_t *v,
                    Py_ssize_t vl, int vstr, int vesc) {
    take_ctx_t *c = ctx;
    (void)kesc; (void)vstr; (void)vesc;  /* a binary header has no escapes */
    take_field(c->head, k, kl, v, vl, &c->bad);
    return 0;
}

static int parse_binary(const uint8_t *h, Py_ssize_t n, head_t *out) {
    take_ctx_t c = {out, 0, 0};
    if (hdr_read_binary(h, n, &out->code, &out->opaque, &out->flag, take_ext, &c) < 0)
        return -1;
    out->parsed = !c.bad;
    return 0;
}

/* fastjson's header: code, flag, opaque and the wanted extFields, walked by the shared reader
 * of rmq_reqhdr.h. -1 if it cannot be read here (Python's json module then decides);
 * parsed=0 if a wanted field is odd. */
static int take_top(void *ctx, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                    Py_ssize_t vl) {
    take_ctx_t *c = ctx;
    int32_t x, *dst;
    int bit;
    if (kl == 4 && memcmp(k, "code", 4) == 0) { dst = &c->head->code; bit = 1; }
    else if (kl == 4 && memcmp(k, "flag", 4) == 0) { dst = &c->head->flag; bit = 2; }
    else if (kl == 6 && memcmp(k, "opaque", 6) == 0) { dst = &c->head->opaque; bit = 4; }
    else return 0;
    if (hdr_json_int32(v, vl, &x) < 0) return -1;
    *dst = x;
    c->have |= bit;
    return 0;
}

static int take_json_ext(void *ctx, const uint8_t *k, Py_ssize_t kl, int kesc,
                         const uint8_t *v, Py_ssize_t vl, int vstr, int vesc) {
    take_ctx_t *c = ctx;
    (void)vstr;
    if (kesc) return 0;  /* not a name this loop wants */
    head_t tmp = *c->head;
    int odd = 0;
    if (take_field(&tmp, k, kl, v, vl, &odd)) {
        if (vesc || odd) c->bad = 1;
        else *c->head = tmp;
    }
    return 0;
}

static int parse_json(const uint8_t *p, Py_ssize_t n, head_t *out) {
    take_ctx_t c = {out, 0, 0};
    if (hdr_read_json(p, n, take_top, take_json_ext, &c) < 0 || !(c.have & 1)) return -1;
    out->parsed = !c.bad;
    return 0;
}

/* Header of one frame payload (after the length prefix). -1: framing is wrong (Python
 * reports it); 1: readable framing but a header only Python can judge. */
int pull_parse_frame(const uint8_t *f, Py_ssize_t n, head_t *h, Py_ssize_t *body_at) {
    memset(h, 0, sizeof(*h));
    if (n < 4) return -1;
    uint32_t word = (uint32_t)rd32(f);
    uint32_t ser = word >> 24, hl = word & 0xFFFFFF;
    if (4 + (Py_ssize_t)hl > n) return -1;
    *body_at = 4 + hl;
    if (ser == 1) return parse_binary(f + 4, hl, h) < 0 ? 1 : 0;
    if (ser == 0) return parse_json(f + 4, hl, h) < 0 ? 1 : 0;
    return 1;
}
