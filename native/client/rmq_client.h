/* Parts of the _native module defined outside rmq_native.c, registered by its init:
 * the pull loop (rmq_pull.c), the binary header codec (rmq_header.c), the embedded
 * broker's answer to plain pulls (rmq_serve.c) and the ACL signer's HMAC (rmq_hmac.c). */
#ifndef RMQ_PULL_H
#define RMQ_PULL_H
#include <Python.h>

int rmq_pull_register(PyObject *module);
int rmq_header_register(PyObject *module);
int rmq_serve_register(PyObject *module);
int rmq_hmac_register(PyObject *module);

#endif
