"""The client's optional C accelerator (``native/client/``), imported once for every user.

The C module (``rocketmq_spark.client._native``: the pull body decoder, the pull loop, the
binary header codec, the ACL signer's HMAC) is built by ``pip install`` when a C compiler is
there; without it every caller takes its pure-Python twin. ``ROCKETMQ_SPARK_PURE_PYTHON=1``
switches the C paths off on purpose (the client's and the embedded broker's): this is the one
place that reads it, once, at import.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

PURE_PYTHON_VARIABLE = "ROCKETMQ_SPARK_PURE_PYTHON"

# Whether the user asked for the pure-Python paths everywhere (read once, at import).
FORCE_PURE_PYTHON: bool = os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0")

try:
    from . import _native as _built
except ImportError:  # pragma: no cover - depends on the build
    _built = None


def built_module() -> Optional[ModuleType]:
    """The C module when it is built, whatever :data:`FORCE_PURE_PYTHON` says: callers read the
    switch here, except the body decoder (:mod:`.protocol.pull_decode`), which keeps a copy that
    tests flip to hold its C and Python paths together."""
    return _built
