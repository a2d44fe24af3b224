"""PULL_MESSAGE: the request header and the one place that maps a response to a pull status."""
from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Set, Tuple

from ..errors import AuthError, ResponseError, RocketMQError, RouteNotFound
from ..protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode,
)
from ..protocol.frame import RemotingCommand
from ..protocol.route import MessageQueue

_log = logging.getLogger(__name__)


TAG_TYPE = "TAG"

# What a broker without enablePropertyFilter=true answers (SYSTEM_ERROR) to a pull whose
# subscription is not a TAG expression (4.9.8 PullMessageProcessor).
_FILTER_REFUSED = "The broker does not support consumer to filter message by"
FILTER_SETTING = "enablePropertyFilter"


class FilterNotSupportedError(ResponseError):
    """The broker refuses SQL92 filtering: its ``enablePropertyFilter`` is off. Asking again
    cannot help (the setting is read at the broker's start), so this is never retried."""

    def __init__(self, code: int, remark: str, request: str, address: str):
        super().__init__(code, remark, request, address)
        self.args = (f"the broker at {address or '?'} refuses SQL92 filters ({remark!r}): set "
                     f"{FILTER_SETTING}=true in its broker.conf and restart it, or read with "
                     f"filterType=TAG",)


class PullStatus(enum.Enum):
    FOUND = "FOUND"                    # messages in the body
    NO_NEW_MSG = "NO_NEW_MSG"          # nothing at the offset (after the long poll, if asked)
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # a filtered window had no match: continue at once
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # offset outside [min, max]: data loss or a reset queue


_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}

# Answers worth retrying after a pause: the broker is busy, shutting down or hit a passing fault.
TRANSIENT_CODES = frozenset({
    ResponseCode.SYSTEM_BUSY, ResponseCode.FLOW_CONTROL, ResponseCode.GO_AWAY,
    ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
})


@dataclass
class PullResult:
    """One pull's outcome; ``body`` holds the stored messages when ``status`` is FOUND."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0
    body: bytes = b""
    remark: str = ""
    offset_delta: int = 0


@dataclass(frozen=True)
class PullRequest:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    broker_name: str = ""
    max_msg_nums: int = 32
    subscription: str = "*"
    expression_type: str = "TAG"  # or "SQL92": the broker filters by user properties
    sub_version: int = 0          # Java's pull consumer sends when it built the subscription
    suspend_timeout_ms: int = 0
    commit_offset: Optional[int] = None

    @property
    def sys_flag(self) -> int:
        flag = PULL_FLAG_SUBSCRIPTION
        if self.suspend_timeout_ms > 0:
            flag |= PULL_FLAG_SUSPEND
        if self.commit_offset is not None:
            flag |= PULL_FLAG_COMMIT_OFFSET
        return flag

    def ext_fields(self) -> Dict[str, str]:
        """The header fields, maxMsgNums and queueOffset last: the native loop appends those
        two to a template of the others, so both paths send the same bytes."""
        fields = {
            "consumerGroup": self.consumer_group,
            "topic": self.topic,
            "queueId": str(self.queue_id),
            "sysFlag": str(self.sys_flag),
            "commitOffset": str(self.commit_offset or 0),
            "suspendTimeoutMillis": str(self.suspend_timeout_ms),
            "subscription": self.subscription or "*",
            "subVersion": str(self.sub_version),
            "expressionType": self.expression_type,
        }
        if self.broker_name:
            fields["bname"] = self.broker_name
        fields["maxMsgNums"] = str(self.max_msg_nums)
        fields["queueOffset"] = str(self.queue_offset)
        return fields


def _long(fields: Dict[str, str], key: str, default: int = 0) -> int:
    value = fields.get(key)
    return int(value) if value not in (None, "") else default


# A 5.x proxy resolves a request's broker through the route of the topic named after it; a
# broker that left the name server is that topic's TOPIC_NOT_EXIST (MQClientException's text)
_PROXY_NO_ROUTE = "DESC: No topic route info in name server for the topic: "


def pull_result(response: RemotingCommand, request: str = "PULL_MESSAGE",
                address: str = "") -> PullResult:
    """Map a PULL_MESSAGE response to a :class:`PullResult`; other codes raise ResponseError
    (RouteNotFound when a 5.x proxy no longer finds the queue's broker in its routes)."""
    status = _STATUS_BY_CODE.get(response.code)
    if status is None:
        if response.code == ResponseCode.TOPIC_NOT_EXIST and _PROXY_NO_ROUTE in (
                response.remark or ""):
            broker = response.remark.split(_PROXY_NO_ROUTE, 1)[1].split("\n", 1)[0]
            raise RouteNotFound(broker, response.remark, address)
        raise response_error(response, request, address)
    fields = response.fields
    try:
        return PullResult(
            status=status,
            next_begin_offset=_long(fields, "nextBeginOffset"),
            min_offset=_long(fields, "minOffset"),
            max_offset=_long(fields, "maxOffset"),
            suggest_which_broker_id=_long(fields, "suggestWhichBrokerId"),
            body=response.body if status is PullStatus.FOUND else b"",
            remark=response.remark or "",
            offset_delta=_long(fields, "offsetDelta"))
    except ValueError as exc:
        from ..errors import ProtocolError

        raise ProtocolError(f"pull response from {address} has a non-numeric offset field: "
                            f"{exc}", None, "header") from None


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
    from ..errors import ProxyError, RemotingConnectionError, RequestTimeout

    if isinstance(error, (RemotingConnectionError, RequestTimeout)):
        return True
    if isinstance(error, ProxyError):  # the 5.x proxy (gRPC) says itself
        return error.transient
    return (isinstance(error, ResponseError)
            and not isinstance(error, (AuthError, FilterNotSupportedError))
            and error.code in TRANSIENT_CODES)


# (broker address, expression type) pairs a broker has accepted in this process.
_FILTER_ACCEPTED: Set[Tuple[str, str]] = set()


def check_filter_support(brokers, queues: Mapping[str, MessageQueue], consumer_group: str,
                         subscription: str, expression_type: str, sub_version: int = 0,
                         timeout: float = 10.0) -> None:
    """Before a filtered read is planned: one pull (of at most one message) at each broker
    (``queues``: address -> one of its queues) with the read's subscription, so a broker that
    refuses SQL92 fails the query on the driver, not in its tasks. Raises
    :class:`~.pull.FilterNotSupportedError`; any other fault is left for the reads to meet.
    A broker that accepted is not asked again in this process. ``brokers``: a
    :class:`~..broker.BrokerClient`."""
    if expression_type.upper() == TAG_TYPE:
        return
    for address, mq in sorted(queues.items()):
        key = (address, expression_type)
        if key in _FILTER_ACCEPTED:
            continue
        request = PullRequest(
            consumer_group=consumer_group, topic=mq.topic, queue_id=mq.queue_id,
            queue_offset=0, broker_name=mq.broker_name, max_msg_nums=1,
            subscription=subscription, expression_type=expression_type,
            sub_version=sub_version)
        try:
            brokers.pull(address, request, timeout)
        except FilterNotSupportedError:
            raise
        except RocketMQError as exc:
            _log.info("could not check %s's filter support: %s", address, exc)
            continue
        _FILTER_ACCEPTED.add(key)
