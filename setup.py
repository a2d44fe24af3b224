"""Build hook for the optional C accelerators; all metadata lives in setup.cfg.

Two extensions, by who they serve:

* ``rocketmq_spark.client._native`` (native/client/): the connector's own C, the pull body
  decoder, the pull loop, the binary header codec and the ACL signer's HMAC;
* ``rocketmq_spark.embedded._native`` (native/embedded/): the embedded test broker's fast
  paths for plain pulls and exactly-once writes; nothing the connector ships calls it.

Both share the frame readers of native/common/. ``optional=True``: without a C compiler or
Python headers the build skips them and the package falls back to its pure-Python code. On CI
(``CI=true``) with a compiler and headers, tests/test_accelerator_built.py fails if they did
not build.
"""
from glob import glob

from setuptools import Extension, setup

COMMON_HEADERS = sorted(glob("native/common/*.h"))


def extension(package: str, folder: str, sources: list) -> Extension:
    """``package``'s ``_native`` built from ``sources`` of native/``folder``."""
    return Extension(f"rocketmq_spark.{package}._native",
                     [f"native/{folder}/{source}" for source in sources],
                     include_dirs=[f"native/{folder}", "native/common"],
                     depends=COMMON_HEADERS + sorted(glob(f"native/{folder}/*.h")),
                     extra_compile_args=["-O3"], optional=True)


setup(ext_modules=[
    extension("client", "client", ["rmq_native.c", "rmq_crc32.c", "rmq_pull.c",
                                  "rmq_pull_run.c", "rmq_pull_answer.c", "rmq_pull_io.c",
                                  "rmq_header.c", "rmq_hmac.c"]),
    extension("embedded", "embedded",
              ["rmq_embedded.c", "rmq_serve.c", "rmq_serve_tx.c", "rmq_tx_header.c",
               "rmq_tx_props.c", "rmq_tx_half.c", "rmq_tx_end.c", "rmq_tx_store.c"]),
])
