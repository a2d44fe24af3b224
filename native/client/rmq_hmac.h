/* SHA-1 and HMAC-SHA1 for the native pull loop's ACL signatures (rmq_hmac.c). */
#ifndef RMQ_HMAC_H
#define RMQ_HMAC_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[5];
    uint64_t total;   /* bytes hashed so far */
    uint8_t buf[64];  /* a block not yet full */
    size_t used;
} rmq_sha1_t;

/* The hash states after the key's inner and outer pads: copy one, hash on. */
typedef struct {
    rmq_sha1_t inner, outer;
} rmq_hmac_t;

void rmq_sha1_init(rmq_sha1_t *s);
void rmq_sha1_update(rmq_sha1_t *s, const void *data, size_t n);
void rmq_sha1_final(rmq_sha1_t *s, uint8_t out[20]);
/* Key ``m`` with ``key``; the key itself is not kept. */
void rmq_hmac_key(rmq_hmac_t *m, const uint8_t *key, size_t n);
/* ``inner``: a copy of m->inner with the message hashed into it; wiped afterwards. */
void rmq_hmac_finish(const rmq_hmac_t *m, rmq_sha1_t *inner, uint8_t out[20]);
/* Standard base64 with padding; returns the length written (4 * ceil(n / 3)). */
size_t rmq_base64(const uint8_t *in, size_t n, char *out);
/* Zero memory in a way the compiler keeps. */
void rmq_wipe(void *p, size_t n);

#endif
