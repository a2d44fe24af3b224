"""Set up the native pull loop (``native/rmq_pull.c``) for one queue range.

The loop encodes each PULL_MESSAGE request by patching a template: this module builds that
template (a ROCKETMQ binary-header request without ``maxMsgNums`` and ``queueOffset``, which
the loop appends per request) and says when the loop may be used at all: the accelerator is
built, ``ROCKETMQ_SPARK_PURE_PYTHON`` is not set, and the connection is plain TCP without ACL
signing (TLS records and signatures are made in Python, so those reads take the Python path).
"""
from __future__ import annotations

import os
from typing import Optional

from .connection import Connection
from .protocol.codes import CLIENT_VERSION, RequestCode, SerializeType
from .protocol.frame import RemotingCommand, encode_frame
from .pull import PullRequest

try:  # the optional C accelerator
    from .. import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None

# The same switch as the decoder's (protocol/columns.py): the pure-Python path everywhere.
FORCE_PURE_PYTHON = os.environ.get("ROCKETMQ_SPARK_PURE_PYTHON", "") not in ("", "0")

# Keys the loop writes itself, after the template's.
_PATCHED = ("maxMsgNums", "queueOffset")


def available() -> bool:
    """Whether this build has the native pull loop and it is not switched off."""
    return _native is not None and hasattr(_native, "Puller") and not FORCE_PURE_PYTHON


def pull_template(request: PullRequest, version: int = CLIENT_VERSION) -> bytes:
    """The request frame of ``request`` without the keys the loop patches per request."""
    fields = {k: v for k, v in request.ext_fields().items() if k not in _PATCHED}
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=fields, version=version)
    return encode_frame(cmd, SerializeType.ROCKETMQ)


def make_puller(conn: Connection, request: PullRequest, end: int, depth: int,
                filtered: bool, broker_id: int, version: int = CLIENT_VERSION):
    """A ``_native.Puller`` for ``request``'s queue up to ``end`` on ``conn``, or ``None`` when
    the connection needs the Python path."""
    if not (available() and conn.native_ok):
        return None
    sock, send_lock, opaques = conn.native_parts
    puller = _native.Puller(sock, send_lock, opaques, pull_template(request, version), end,
                            request.max_msg_nums, depth, filtered)
    puller.broker_id = broker_id
    return puller


def native_pull_loop() -> Optional[str]:
    """Why reads take the Python path, or ``None`` when the native loop is used (for logs)."""
    if _native is None:
        return "the C accelerator is not built"
    if not hasattr(_native, "Puller"):
        return "the C accelerator predates the pull loop (rebuild it)"
    if FORCE_PURE_PYTHON:
        return "ROCKETMQ_SPARK_PURE_PYTHON is set"
    return None
