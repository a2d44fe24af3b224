"""PULL_MESSAGE: the request header and the one place that maps a response to a pull status.

The broker client sends these (:meth:`~.broker.BrokerClient.pull`); the reader (``read/``),
the admin's lookups, the op topic's reader and the source's offset reader use them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Optional

from .errors import ProtocolError, RouteNotFound
from .protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode,
)
from .protocol.frame import RemotingCommand
from .responses import response_error

TAG_TYPE = "TAG"


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
        raise ProtocolError(f"pull response from {address} has a non-numeric offset field: "
                            f"{exc}", None, "header") from None
