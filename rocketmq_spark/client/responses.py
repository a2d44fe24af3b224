"""A broker's answer as the client acts on it: the typed error of a refusal (an access key
quoted in its remark redacted), and whether asking again later may succeed.

Every room of the client (reading, sending, transactions, groups, the gRPC transport) and the
name server and broker clients under them use these; they sit below all of them.
"""
from __future__ import annotations

import re

from .errors import (
    AuthError, FilterNotSupportedError, ProxyError, RemotingConnectionError, RequestTimeout,
    ResponseError,
)
from .protocol.codes import ResponseCode
from .protocol.frame import RemotingCommand

# What a broker without enablePropertyFilter=true answers (SYSTEM_ERROR) to a pull whose
# subscription is not a TAG expression (4.9.8 PullMessageProcessor).
_FILTER_REFUSED = "The broker does not support consumer to filter message by"

# Answers worth retrying after a pause: the broker is busy, shutting down or hit a passing fault.
TRANSIENT_CODES = frozenset({
    ResponseCode.SYSTEM_BUSY, ResponseCode.FLOW_CONTROL, ResponseCode.GO_AWAY,
    ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
})


# Genuine ACL refusals quote the access key: 4.x ACL 1.0 says "Check signature failed for
# accessKey=AK" and "No acl config for AK", 5.x ACL 2.0 "User:AK is not found". It is a
# credential: errors and logs show it redacted.
_ACCESS_KEY_IN_REMARK = re.compile(
    r"(accessKey\s*[=:]\s*|No acl config for\s+|User\s*:\s*)[^\s,;:()\[\]]+", re.IGNORECASE)


def redact_remark(remark: str) -> str:
    """``remark`` with any access key a broker quoted in it replaced by ``<redacted>``."""
    return _ACCESS_KEY_IN_REMARK.sub(r"\1<redacted>", remark)


# What brokers put in the remark of an ACL refusal, which they answer with SYSTEM_ERROR: 4.x
# ACL 1.0 raises AclException ("No accessKey is configured", "No acl config for AK", "Check
# signature failed ..."), 5.x ACL 2.0 AuthenticationException / AuthorizationException.
_ACL_REMARK = re.compile(r"AclException|AuthenticationException|AuthorizationException|"
                         r"No acl config for|signature|accessKey", re.IGNORECASE)


def response_error(response: RemotingCommand, request: str, address: str) -> ResponseError:
    """The typed error for a failed response (ACL refusals become :class:`AuthError`, which is
    never retried); an access key quoted in the broker's remark is redacted."""
    remark = redact_remark(response.remark or "")
    if response.code == ResponseCode.NO_PERMISSION or (
            response.code == ResponseCode.SYSTEM_ERROR and _ACL_REMARK.search(remark)):
        return AuthError(response.code, remark, request, address)
    if response.code == ResponseCode.SYSTEM_ERROR and remark.startswith(_FILTER_REFUSED):
        return FilterNotSupportedError(response.code, remark, request, address)
    return ResponseError(response.code, remark, request, address)


def is_transient(error: BaseException) -> bool:
    """Whether retrying later may succeed (as opposed to a request that can never work)."""
    if isinstance(error, (RemotingConnectionError, RequestTimeout)):
        return True
    if isinstance(error, ProxyError):  # the 5.x proxy (gRPC) says itself
        return error.transient
    return (isinstance(error, ResponseError)
            and not isinstance(error, (AuthError, FilterNotSupportedError))
            and error.code in TRANSIENT_CODES)
