"""The exceptions of the RocketMQ client: one base class, so callers catch what they mean.

Messages never include secrets: credentials are held in
:class:`~rocketmq_spark.client.acl.Credentials`, whose repr hides the secret, and no error formats
a request's signature.
"""
from __future__ import annotations

from typing import Optional


class RocketMQError(Exception):
    """Base class of every error raised by ``rocketmq_spark.client``."""


class ProtocolError(RocketMQError):
    """Bytes that do not follow the remoting protocol.

    ``position`` is the offset of the offending bytes inside ``where`` (a frame, a header or a
    message body), so the fault can be found in a capture.
    """

    def __init__(self, message: str, position: Optional[int] = None, where: str = "frame",
                 data: Optional[bytes] = None, data_offset: int = 0):
        # ``data_offset``: where ``data[0]`` sits in ``where`` (when ``data`` is only a slice).
        self.position = position
        self.where = where
        start = position - data_offset if position is not None else None
        self.excerpt = bytes(data[start:start + 16]).hex(" ") if (
            data is not None and start is not None and start >= 0) else None
        text = message
        if position is not None:
            text = f"{message} (at byte {position} of the {where}"
            text += f"; bytes there: {self.excerpt})" if self.excerpt else ")"
        super().__init__(text)


class MessageDecodeError(ProtocolError):
    """A stored message that cannot be decoded (bad size, magic, CRC, compression, ...)."""

    def __init__(self, message: str, position: Optional[int] = None, data: Optional[bytes] = None,
                 queue_offset: Optional[int] = None):
        self.queue_offset = queue_offset
        if queue_offset is not None:
            message = f"{message} [message at queue offset {queue_offset}]"
        super().__init__(message, position, "pull body", data)


class RemotingConnectionError(RocketMQError):
    """A connection could not be opened, or broke while requests were in flight."""

    def __init__(self, address: str, reason: str):
        self.address = address
        self.reason = reason
        super().__init__(f"connection to {address} failed: {reason}")


class BrokerUnavailable(RemotingConnectionError):
    """A broker cannot be reached (refused, reset, closed, or TLS failure)."""


class NameServerUnavailable(RemotingConnectionError):
    """No name server in the list answered."""


class RequestTimeout(RocketMQError):
    """A request got no response within its timeout."""

    def __init__(self, address: str, request: str, timeout: float):
        self.address = address
        self.request = request
        self.timeout = timeout
        super().__init__(f"{request} to {address} got no response within {timeout:.3g} s")


class ResponseError(RocketMQError):
    """The peer answered with an error response code."""

    def __init__(self, code: int, remark: Optional[str], request: str = "", address: str = ""):
        from .protocol.codes import code_name

        self.code = code
        self.remark = remark or ""
        self.request = request
        self.address = address
        where = f" from {address}" if address else ""
        what = f"{request} failed" if request else "request failed"
        super().__init__(f"{what}{where}: {code_name(code, True)} ({code}) {self.remark}".rstrip())


class RouteNotFound(ResponseError):
    """The name servers know no route for a topic (TOPIC_NOT_EXIST)."""

    def __init__(self, topic: str, remark: Optional[str] = None, address: str = ""):
        from .protocol.codes import ResponseCode

        self.topic = topic
        super().__init__(ResponseCode.TOPIC_NOT_EXIST, remark or f"no route for topic {topic!r}",
                         "GET_ROUTEINFO_BY_TOPIC", address)


class AuthError(ResponseError):
    """The broker refused the request's credentials or permissions. Never retried: the same
    credentials get the same answer."""

    def __init__(self, code: int, remark: Optional[str], request: str = "", address: str = ""):
        super().__init__(code, remark, request, address)
        self.args = (f"{self.args[0]} [the broker refused this client's credentials or their "
                     "permissions: check the access key, the secret key and the broker's ACL]",)


# The broker.conf setting that lets a broker filter pulls by SQL92.
FILTER_SETTING = "enablePropertyFilter"


class FilterNotSupportedError(ResponseError):
    """The broker refuses SQL92 filtering: its ``enablePropertyFilter`` is off. Asking again
    cannot help (the setting is read at the broker's start), so this is never retried."""

    def __init__(self, code: int, remark: str, request: str, address: str):
        super().__init__(code, remark, request, address)
        self.args = (f"the broker at {address or '?'} refuses SQL92 filters ({remark!r}): set "
                     f"{FILTER_SETTING}=true in its broker.conf and restart it, or read with "
                     f"filterType=TAG",)


class ClientClosed(RocketMQError):
    """The client or connection was closed by its owner."""


class DataLossError(RocketMQError):
    """Messages of a planned range no longer exist on the broker."""

    def __init__(self, queue, start: int, end: int, reason: str):
        self.queue, self.start, self.end, self.reason = queue, start, end, reason
        super().__init__(
            f"data loss on queue {queue.key}: offsets [{start}, {end}) cannot be read: {reason}. "
            "Set failOnDataLoss=false to skip lost messages (they are logged and counted).")


class ProxyError(RocketMQError):
    """A 5.x proxy's gRPC endpoint refused or failed a call.

    ``code`` is the proxy's status code (``apache.rocketmq.v2.Code``, e.g. 42900) and ``name``
    its name (``TOO_MANY_REQUESTS``); for a call that failed in gRPC itself, ``code`` is 0 and
    ``name`` the gRPC status (``UNAVAILABLE``). ``transient``: a retry later may succeed.
    """

    def __init__(self, code: int, name: str, remark: str, request: str, address: str,
                 transient: bool = False):
        self.code, self.name, self.remark = code, name, remark
        self.request, self.address, self.transient = request, address, transient
        what = f"{name} ({code})" if code else name
        # Not super(): ProxyAuthError also derives from AuthError, whose __init__ differs.
        RocketMQError.__init__(self, f"{request} to proxy {address} failed: {what} {remark}"
                                     .rstrip())


class ProxyAuthError(ProxyError, AuthError):
    """The proxy refused this client's credentials or their permissions (UNAUTHORIZED,
    FORBIDDEN, or gRPC UNAUTHENTICATED / PERMISSION_DENIED)."""
