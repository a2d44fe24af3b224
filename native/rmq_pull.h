/* Parts of the _native module defined outside rmq_native.c, registered by its init:
 * the pull loop (rmq_pull.c) and the binary header codec (rmq_header.c). */
#ifndef RMQ_PULL_H
#define RMQ_PULL_H
#include <Python.h>

int rmq_pull_register(PyObject *module);
int rmq_header_register(PyObject *module);

#endif
