/*
 * rocketmq_spark.embedded._native: the embedded broker's C fast paths.
 *
 * The embedded broker (rocketmq_spark/embedded) is the stand-in for a genuine broker in tests
 * and benchmarks; nothing the connector ships calls this module. Its functions answer the
 * common frames byte for byte as the broker's Python does (that Python is the reference and
 * tests hold the two together), reading and writing the store only through its fast-path
 * interface (embedded/store.py, embedded/queue.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "rmq_embedded.h"

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rocketmq_spark.embedded._native",
                                    NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (rmq_serve_register(m) < 0 || rmq_serve_tx_register(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
