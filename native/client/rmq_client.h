/* The parts of rocketmq_spark.client._native defined outside rmq_native.c (the decoder and
 * the module's init), registered by that init: the pull loop (rmq_pull.c), the binary header
 * codec (rmq_header.c) and the ACL signer's SHA-1 / HMAC / base64 (rmq_hmac.c). */
#ifndef RMQ_CLIENT_H
#define RMQ_CLIENT_H
#include <Python.h>

int rmq_pull_register(PyObject *module);
int rmq_header_register(PyObject *module);
int rmq_hmac_register(PyObject *module);

#endif
