/* The parts of rocketmq_spark.client._native defined outside rmq_native.c (the decoder and
 * the module's init), registered by that init: the pull loop (rmq_pull.c), the binary header
 * codec (rmq_header.c), the ACL signer's SHA-1 / HMAC / base64 (rmq_hmac.c) and the
 * decoder's CRC-32 (rmq_crc32.c). */
#ifndef RMQ_CLIENT_H
#define RMQ_CLIENT_H
#include <Python.h>
#include <stdint.h>

int rmq_pull_register(PyObject *module);
int rmq_header_register(PyObject *module);
int rmq_hmac_register(PyObject *module);
int rmq_crc32_register(PyObject *module);

/* zlib's CRC-32 of n bytes, as RocketMQ stores it (before its 0x7FFFFFFF mask). */
uint32_t rmq_crc32(const uint8_t *p, Py_ssize_t n);

#endif
