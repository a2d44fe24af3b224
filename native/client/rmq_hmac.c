/*
 * SHA-1 and HMAC-SHA1 for ACL request signatures, in C (FIPS 180-4 and RFC 2104).
 *
 * RocketMQ's ACL 1.0 signs every request: base64(HMAC-SHA1(secretKey, the values of its ext
 * fields sorted by key, then its body)). The native pull loop sends tens of thousands of
 * requests a second, each with a new queueOffset, so each needs its own signature. Python's
 * hmac module is the reference (rocketmq_spark/client/acl.py, and tests hold this code equal
 * to it for random keys and inputs); this copy exists so the loop can sign without the GIL or
 * a call into Python.
 *
 * Why not OpenSSL's libcrypto: a plain `pip install` cannot count on it. Building the sdist
 * against it needs the headers and the unversioned libcrypto.so link, which come with the
 * development package (libssl-dev), not with Python; a manylinux wheel may not link the
 * system's libcrypto (auditwheel would bundle a second copy); and borrowing the copy Python
 * itself loaded (dlsym through _hashlib) fails where Python links OpenSSL statically without
 * exporting it (python-build-standalone, the Pythons uv installs), so this code would have to
 * stay as a fallback anyway. OpenSSL's HMAC context would also keep a copy of the key, where
 * this keeps only the padded-key states.
 *
 * Keys: the caller hands the secret over once; only the two padded-key states are kept (they
 * are as sensitive as the secret and are wiped when the loop goes away). Nothing here formats
 * a key or a state into text.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "rmq_hmac.h"

static inline uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One 64-byte block into the state: 80 rounds, unrolled, with the message schedule kept as a
 * ring of 16 words (w[t] = rol(w[t-3] ^ w[t-8] ^ w[t-14] ^ w[t-16], 1)). */
#define SCHED(t) (w[(t) & 15] = rol(w[((t) + 13) & 15] ^ w[((t) + 8) & 15] ^ \
                                    w[((t) + 2) & 15] ^ w[(t) & 15], 1))
#define F1(b, c, d) (d ^ (b & (c ^ d)))
#define F2(b, c, d) (b ^ c ^ d)
#define F3(b, c, d) ((b & c) | (d & (b | c)))
#define ROUND(a, b, c, d, e, f, k, x) do { \
        e += rol(a, 5) + f(b, c, d) + k + (x); b = rol(b, 30); } while (0)
#define FIVE(f, k, t, X) do { \
        ROUND(a, b, c, d, e, f, k, X(t));     ROUND(e, a, b, c, d, f, k, X(t + 1)); \
        ROUND(d, e, a, b, c, f, k, X(t + 2)); ROUND(c, d, e, a, b, f, k, X(t + 3)); \
        ROUND(b, c, d, e, a, f, k, X(t + 4)); } while (0)
#define LOAD(t) (w[t] = be32(block + 4 * (t)))

static void sha1_block(uint32_t h[5], const uint8_t *block) {
    uint32_t w[16];
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    FIVE(F1, 0x5A827999, 0, LOAD);  FIVE(F1, 0x5A827999, 5, LOAD);
    FIVE(F1, 0x5A827999, 10, LOAD);
    ROUND(a, b, c, d, e, F1, 0x5A827999, LOAD(15));
    ROUND(e, a, b, c, d, F1, 0x5A827999, SCHED(16));
    ROUND(d, e, a, b, c, F1, 0x5A827999, SCHED(17));
    ROUND(c, d, e, a, b, F1, 0x5A827999, SCHED(18));
    ROUND(b, c, d, e, a, F1, 0x5A827999, SCHED(19));
    FIVE(F2, 0x6ED9EBA1, 20, SCHED); FIVE(F2, 0x6ED9EBA1, 25, SCHED);
    FIVE(F2, 0x6ED9EBA1, 30, SCHED); FIVE(F2, 0x6ED9EBA1, 35, SCHED);
    FIVE(F3, 0x8F1BBCDC, 40, SCHED); FIVE(F3, 0x8F1BBCDC, 45, SCHED);
    FIVE(F3, 0x8F1BBCDC, 50, SCHED); FIVE(F3, 0x8F1BBCDC, 55, SCHED);
    FIVE(F2, 0xCA62C1D6, 60, SCHED); FIVE(F2, 0xCA62C1D6, 65, SCHED);
    FIVE(F2, 0xCA62C1D6, 70, SCHED); FIVE(F2, 0xCA62C1D6, 75, SCHED);
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
}

void rmq_sha1_init(rmq_sha1_t *s) {
    s->h[0] = 0x67452301; s->h[1] = 0xEFCDAB89; s->h[2] = 0x98BADCFE;
    s->h[3] = 0x10325476; s->h[4] = 0xC3D2E1F0;
    s->total = 0;
    s->used = 0;
}

void rmq_sha1_update(rmq_sha1_t *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->total += n;
    if (s->used) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->buf + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used < 64) return;
        sha1_block(s->h, s->buf);
        s->used = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha1_block(s->h, p);
    if (n) {
        memcpy(s->buf, p, n);
        s->used = n;
    }
}

void rmq_sha1_final(rmq_sha1_t *s, uint8_t out[20]) {
    uint64_t bits = s->total * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (s->used < 56 ? 56 : 120) - s->used;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    rmq_sha1_update(s, pad, padlen + 8);
    for (int i = 0; i < 5; i++) {
        out[4 * i] = s->h[i] >> 24; out[4 * i + 1] = s->h[i] >> 16;
        out[4 * i + 2] = s->h[i] >> 8; out[4 * i + 3] = s->h[i];
    }
}

void rmq_wipe(void *p, size_t n) {
    volatile uint8_t *v = p;
    while (n--) *v++ = 0;
}

void rmq_hmac_key(rmq_hmac_t *m, const uint8_t *key, size_t n) {
    uint8_t block[64] = {0}, pad[64];
    if (n > 64) {  /* RFC 2104: a long key is hashed first */
        rmq_sha1_t s;
        rmq_sha1_init(&s);
        rmq_sha1_update(&s, key, n);
        rmq_sha1_final(&s, block);
        rmq_wipe(&s, sizeof(s));
    } else if (n) {
        memcpy(block, key, n);
    }
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
    rmq_sha1_init(&m->inner);
    rmq_sha1_update(&m->inner, pad, 64);
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5C;
    rmq_sha1_init(&m->outer);
    rmq_sha1_update(&m->outer, pad, 64);
    rmq_wipe(block, sizeof(block));
    rmq_wipe(pad, sizeof(pad));
}

void rmq_hmac_finish(const rmq_hmac_t *m, rmq_sha1_t *inner, uint8_t out[20]) {
    uint8_t digest[20];
    rmq_sha1_final(inner, digest);
    rmq_sha1_t outer = m->outer;
    rmq_sha1_update(&outer, digest, 20);
    rmq_sha1_final(&outer, out);
    rmq_wipe(&outer, sizeof(outer));
    rmq_wipe(inner, sizeof(*inner));
}

size_t rmq_base64(const uint8_t *in, size_t n, char *out) {
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = digits[v >> 18 & 63];
        out[o++] = digits[v >> 12 & 63];
        out[o++] = i + 1 < n ? digits[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? digits[v & 63] : '=';
    }
    return o;
}

/* hmac_sha1(key, data) -> bytes: the digest, so tests can hold this code against hmac. */
static PyObject *hmac_sha1_py(PyObject *self, PyObject *args) {
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return NULL;
    rmq_hmac_t m;
    rmq_hmac_key(&m, key.buf, key.len);
    rmq_sha1_t inner = m.inner;
    rmq_sha1_update(&inner, data.buf, data.len);
    uint8_t out[20];
    rmq_hmac_finish(&m, &inner, out);
    rmq_wipe(&m, sizeof(m));
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, 20);
}

/* sha1(data) -> bytes, for the same tests. */
static PyObject *sha1_py(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    rmq_sha1_t s;
    rmq_sha1_init(&s);
    rmq_sha1_update(&s, data.buf, data.len);
    uint8_t out[20];
    rmq_sha1_final(&s, out);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, 20);
}

static PyMethodDef hmac_functions[] = {
    {"hmac_sha1", hmac_sha1_py, METH_VARARGS, "HMAC-SHA1 digest of data under key (the ACL signer's)."},
    {"sha1", sha1_py, METH_VARARGS, "SHA-1 digest of data (the ACL signer's)."},
    {NULL, NULL, 0, NULL},
};

int rmq_hmac_register(PyObject *module) {
    return PyModule_AddFunctions(module, hmac_functions);
}
