"""The one place that turns a proxy's answer into an outcome: OK, or a typed error.

The proxy reports most failures in-band (``Status.code``, an ``apache.rocketmq.v2.Code``) and
some as a failed gRPC call. Either becomes a :class:`~rocketmq_spark.client.errors.ProxyError`
that says whether a retry may help, :class:`ProxyAuthError` for credentials, or
:class:`RequestTimeout` for a deadline. Quoted access keys are redacted.
"""
from __future__ import annotations

import grpc

from ..errors import ProxyAuthError, ProxyError, RequestTimeout, RocketMQError
from ..responses import redact_remark
from . import definition_pb2 as definition

OK_CODES = frozenset({definition.OK, definition.MULTIPLE_RESULTS})

# In-band codes worth retrying after a pause: the proxy or a broker behind it is busy, timed
# out or briefly unable to store.
TRANSIENT_CODES = frozenset({
    definition.TOO_MANY_REQUESTS, definition.REQUEST_TIMEOUT, definition.INTERNAL_ERROR,
    definition.INTERNAL_SERVER_ERROR, definition.HA_NOT_AVAILABLE, definition.PROXY_TIMEOUT,
    definition.MASTER_PERSISTENCE_TIMEOUT, definition.SLAVE_PERSISTENCE_TIMEOUT,
})
AUTH_CODES = frozenset({definition.UNAUTHORIZED, definition.FORBIDDEN})

TRANSIENT_GRPC = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL})
AUTH_GRPC = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def code_name(code: int) -> str:
    try:
        return definition.Code.Name(code)
    except ValueError:
        return str(code)


def status_error(status: definition.Status, request: str, address: str) -> RocketMQError:
    """The error for a status that is not OK."""
    remark = redact_remark(status.message or "")
    cls = ProxyAuthError if status.code in AUTH_CODES else ProxyError
    return cls(status.code, code_name(status.code), remark, request, address,
               transient=status.code in TRANSIENT_CODES)


def check(status: definition.Status, request: str, address: str) -> None:
    """Raise unless ``status`` is OK."""
    if status.code not in OK_CODES:
        raise status_error(status, request, address)


def rpc_error(error: grpc.RpcError, request: str, address: str,
              timeout: float) -> RocketMQError:
    """The error for a gRPC call that failed as a call."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeout(address, request, timeout)
    remark = redact_remark(details or "")
    if code is grpc.StatusCode.UNAVAILABLE:
        remark = f"cannot reach the proxy ({remark})" if remark else "cannot reach the proxy"
    elif code is grpc.StatusCode.UNIMPLEMENTED:
        remark = f"the endpoint does not serve the 5.x MessagingService ({remark})"
    transient = code in TRANSIENT_GRPC
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in remark:
        transient = False  # a message over gRPC's size limit, not a busy proxy
    cls = ProxyAuthError if code in AUTH_GRPC else ProxyError
    return cls(0, code.name, remark, request, address, transient=transient)
