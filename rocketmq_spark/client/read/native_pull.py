"""Set up the native pull loop (``native/client/rmq_pull.c``) for one queue range.

The loop encodes each PULL_MESSAGE request by patching a template: this module builds that
template (a ROCKETMQ binary-header request without ``maxMsgNums`` and ``queueOffset``, which
the loop appends per request) and says when the loop may be used at all: the accelerator is
built and ``ROCKETMQ_SPARK_PURE_PYTHON`` is not set.

On an ACL-signed connection the template carries AccessKey (and SecurityToken) and the loop
appends a Signature per request, computed in C from the signed content Python cuts around the
two patched values (:func:`..acl.signed_parts`). On a TLS connection the loop reads and writes
through the connection's TLS record layer (Python's ``ssl`` over memory BIOs), one call per
chunk received and per burst of requests sent.
"""
from __future__ import annotations

from typing import Optional

from .. import accelerator
from ..acl import Credentials
from ..connection import Connection
from ..protocol.codes import CLIENT_VERSION, RequestCode, SerializeType
from ..protocol.frame import RemotingCommand, encode_frame
from ..pull import PullRequest

_native = accelerator.built_module()  # the optional C accelerator, None when not built

# Keys the loop writes itself, after the template's (in this order).
_PATCHED = ("maxMsgNums", "queueOffset")


def pull_template(request: PullRequest, version: int = CLIENT_VERSION,
                  credentials: Optional[Credentials] = None) -> bytes:
    """The request frame of ``request`` without the keys the loop patches per request; with
    ``credentials``, with AccessKey (and SecurityToken) but no Signature."""
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=_template_fields(
        request, credentials), version=version)
    return encode_frame(cmd, SerializeType.ROCKETMQ)


def _template_fields(request: PullRequest, credentials: Optional[Credentials]):
    fields = {k: v for k, v in request.ext_fields().items() if k not in _PATCHED}
    return fields if credentials is None else credentials.identify(fields)


def make_puller(conn: Connection, request: PullRequest, end: int, depth: int,
                filtered: bool, broker_id: int, version: int = CLIENT_VERSION):
    """A ``_native.Puller`` for ``request``'s queue up to ``end`` on ``conn``, or ``None`` when
    the C loop is not built or is switched off (:func:`why_python_pulls`)."""
    if why_python_pulls() is not None:
        return None
    transport = conn.native_transport
    sock, send_lock, opaques = conn.native_parts
    puller = build_puller(sock, send_lock, opaques, request, end, depth, filtered,
                          transport=transport, credentials=conn.credentials, version=version)
    puller.broker_id = broker_id
    return puller


def build_puller(sock, send_lock, opaques, request: PullRequest, end: int, depth: int,
                 filtered: bool, *, transport=None, credentials: Optional[Credentials] = None,
                 version: int = CLIENT_VERSION):
    """The ``_native.Puller`` itself, from a connection's parts (see :func:`make_puller`):
    ``transport`` is its TLS record layer or ``None``, ``credentials`` sign each request."""
    signer = None if credentials is None else credentials.template_signer(
        _template_fields(request, credentials), *_PATCHED)  # holds the secret: to C only
    try:
        return _native.Puller(sock, send_lock, opaques,
                              pull_template(request, version, credentials), end,
                              request.max_msg_nums, depth, filtered, transport=transport,
                              signer=signer)
    finally:
        del signer  # the loop keeps only the HMAC's padded-key states


def why_python_pulls() -> Optional[str]:
    """Why reads take the Python path, or ``None`` when the native loop is used (for logs:
    the loop runs over TLS and signs ACL requests too)."""
    if _native is None:
        return "the C accelerator is not built"
    if accelerator.FORCE_PURE_PYTHON:
        return f"{accelerator.PURE_PYTHON_VARIABLE} is set"
    return None
