/* The parts of rocketmq_spark.embedded._native, registered by its init (rmq_embedded.c): the
 * embedded broker's answer to plain pulls (rmq_serve.c) and to the frames of an exactly-once
 * write (rmq_serve_tx.c, whose parts rmq_serve_tx.h lists). This C serves the test broker
 * only, never the connector. */
#ifndef RMQ_EMBEDDED_H
#define RMQ_EMBEDDED_H
#include <Python.h>

int rmq_serve_register(PyObject *module);
int rmq_serve_tx_register(PyObject *module);

#endif
