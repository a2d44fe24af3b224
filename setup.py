"""Build hook for the optional C accelerator; all metadata lives in setup.cfg.

``optional=True``: without a C compiler or Python headers the build skips the extension and the
package falls back to its pure-Python decoder.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("rocketmq_spark._native",
                             ["native/rmq_native.c", "native/rmq_pull.c", "native/rmq_header.c",
                              "native/rmq_serve.c", "native/rmq_serve_tx.c", "native/rmq_hmac.c"],
                             include_dirs=["native"],
                             depends=["native/rmq_pull.h", "native/rmq_hmac.h", "native/rmq_json.h", "native/rmq_bytes.h",
                                      "native/rmq_reqhdr.h"],
                             extra_compile_args=["-O3"], optional=True)])
