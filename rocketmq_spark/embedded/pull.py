"""PULL_MESSAGE, as the 4.9.8 PullMessageProcessor and DefaultMessageStore.getMessage answer it.

Statuses (remark = store status, code = what the client sees), for requested offset ``off`` and
the queue's ``min``/``max``:

==============================  ==========================  ============================
situation                       remark / code               nextBeginOffset
==============================  ==========================  ============================
messages returned               FOUND / 0                   after the last entry examined
none matched the filter         NO_MATCHED_MESSAGE / 20     after the examined window
max == 0, off == 0 (or != 0)    NO_MESSAGE_IN_QUEUE / 19    0 (21 when off != 0)
off < min                       OFFSET_TOO_SMALL / 21       min
off == max                      OFFSET_OVERFLOW_ONE / 19    off
off > max                       OFFSET_OVERFLOW_BADLY / 21  max
==============================  ==========================  ============================

PULL_NOT_FOUND (19) parks the request when sysFlag has SUSPEND and this is its first run. On a
slave (brokerId > 0) a PULL_OFFSET_MOVED answer becomes PULL_RETRY_IMMEDIATELY suggesting the
master, and the pull's commit offset is not stored (:mod:`.slave_role` has the suggestion).
Tag filters compare tag hash codes; SQL92 filters (enable_property_filter) evaluate each
message's properties (:mod:`.property_filter`). Pulls of either kind scan the same window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from ..client.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode,
    SerializeType,
)
from ..client.protocol.frame import RemotingCommand
from ..client.filter import Expression
from .consumers import Subscription, build_subscription
from .context import BrokerContext
from .headers import req_int, req_long, req_str
from .nameserver import FAQ_SUFFIX
from .property_filter import compile_filter, is_tag_type, read_matching
from .slave_role import suggested_broker

FOUND = "FOUND"
NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"


def _number(fields, key: str, parse) -> int:
    """A numeric header field: plain short digits at once, anything else as Java parses it."""
    text = fields.get(key)
    if text is not None and len(text) < 10 and text.isdigit() and text.isascii():
        return int(text)
    return parse(fields, key)


_SUBSCRIPTIONS: dict = {}


def _subscription(topic: str, expression, expression_type, sub_version: int):
    """build_subscription, remembered: every pull of a reader carries the same expression."""
    key = (topic, expression, expression_type, sub_version)
    sub = _SUBSCRIPTIONS.get(key)
    if sub is None:
        if len(_SUBSCRIPTIONS) > 4096:
            _SUBSCRIPTIONS.clear()
        sub = _SUBSCRIPTIONS[key] = build_subscription(topic, expression, expression_type,
                                                       sub_version)
    return sub


@dataclass(slots=True)
class _PullRequest:
    """The header fields of one PULL_MESSAGE, parsed as the 4.9.8 header class does."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    sys_flag: int
    commit_offset: int
    suspend_millis: int
    sub_version: int

    @classmethod
    def parse(cls, fields) -> "_PullRequest":
        return cls(req_str(fields, "consumerGroup"), req_str(fields, "topic"),
                   _number(fields, "queueId", req_int), _number(fields, "queueOffset", req_long),
                   _number(fields, "maxMsgNums", req_int), _number(fields, "sysFlag", req_int),
                   _number(fields, "commitOffset", req_long),
                   _number(fields, "suspendTimeoutMillis", req_long),
                   _number(fields, "subVersion", req_long))


@dataclass(slots=True)
class _Filter:
    """What a pull filters with: the subscription (tags) and, for a non-tag expression type,
    the compiled SQL92 expression (None: it did not compile, every message passes)."""

    sub: Subscription
    property_filter: bool = False
    expression: Optional[Expression] = None


def _subscription_in_request(topic: str, fields, sub_version: int):
    """The subscription a pull carries (sysFlag's subscription bit): FilterAPI.build and, for
    a non-tag type, ConsumerFilterManager.build; (code, remark) when the first throws."""
    expression, expression_type = fields.get("subscription"), fields.get("expressionType")
    if expression_type is None or expression_type == "TAG":
        return _Filter(_subscription(topic, expression, expression_type, sub_version))
    if not expression:
        return (ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                "parse the consumer's subscription failed")
    sub = Subscription(topic, expression, frozenset(), sub_version, expression_type)
    if is_tag_type(expression_type):  # "": tags never parsed, so only "*" passes anything
        return _Filter(sub)
    return _Filter(sub, True, compile_filter(expression_type, expression))


def _refusal(context: BrokerContext, conn, request: _PullRequest,
             fields) -> Union[Tuple[int, str], _Filter]:
    """The filter a pull reads with, or (code, remark) when the broker refuses it (unknown
    topic, no permission, bad queue, unknown or stale subscription or filter data, a property
    filter on a broker without enablePropertyFilter)."""
    topic, queue_id = request.topic, request.queue_id
    config = context.store.topics.get(topic)
    if config is None:
        return (ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please! {FAQ_SUFFIX}")
    if not config.readable:
        return ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
    if queue_id < 0 or queue_id >= config.read_queue_nums:
        return (ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{config.read_queue_nums}] consumer:[/{conn.peer}]")
    if request.sys_flag & PULL_FLAG_SUBSCRIPTION:
        plan = _subscription_in_request(topic, fields, request.sub_version)
        if isinstance(plan, tuple):
            return plan
    else:
        clients = context.clients
        info = clients.consumers.get(request.group)
        if info is None:
            return (ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's group info not exist{FAQ_SUFFIX}")
        sub = info.subscriptions.get(topic)
        if sub is None:
            return (ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist{FAQ_SUFFIX}")
        if sub.sub_version < request.sub_version:
            return ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest"
        plan = _Filter(sub)
        if not is_tag_type(sub.expression_type):
            data = clients.filters.get(topic, request.group)
            if data is None:
                return (ResponseCode.FILTER_DATA_NOT_EXIST,
                        "The broker's consumer filter data is not exist!Your expression may be "
                        "wrong!")
            if data.client_version < request.sub_version:
                return (ResponseCode.FILTER_DATA_NOT_LATEST,
                        "the consumer's consumer filter data not latest")
            plan = _Filter(sub, True, data.compiled)
    if plan.property_filter and not context.options.enable_property_filter:
        return (ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by "
                f"{plan.sub.expression_type}")
    return plan


def _read(context: BrokerContext, queue, request: _PullRequest, plan: _Filter):
    """(status, code, nextBeginOffset, body) of a pull from ``queue`` (the module's table)."""
    offset, min_offset, max_offset = request.offset, queue.min_offset, queue.max_offset
    if max_offset == 0:
        code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        return NO_MESSAGE_IN_QUEUE, code, 0, b""
    if offset < min_offset:
        return OFFSET_TOO_SMALL, ResponseCode.PULL_OFFSET_MOVED, min_offset, b""
    if offset == max_offset:
        return OFFSET_OVERFLOW_ONE, ResponseCode.PULL_NOT_FOUND, offset, b""
    if offset > max_offset:
        return OFFSET_OVERFLOW_BADLY, ResponseCode.PULL_OFFSET_MOVED, max_offset, b""
    opts = context.options
    sub = plan.sub
    if plan.property_filter:
        body, examined, found = read_matching(queue, offset, plan.expression, request.max_nums,
                                              opts.max_transfer_count, opts.max_transfer_bytes)
    elif sub.match_all:
        body, examined, found = queue.read(offset, request.max_nums, opts.max_transfer_count,
                                           opts.max_transfer_bytes)
    else:
        body, examined, found = queue.read_filtered(offset, sub.codes, request.max_nums,
                                                    opts.max_transfer_count,
                                                    opts.max_transfer_bytes)
    if found:
        return FOUND, ResponseCode.SUCCESS, offset + examined, body
    return NO_MATCHED_MESSAGE, ResponseCode.PULL_RETRY_IMMEDIATELY, offset + examined, body


def handle_pull(context: BrokerContext, conn, cmd: RemotingCommand,
                allow_suspend: bool = True) -> Optional[RemotingCommand]:
    """Answer a pull, or park it (returns None) for long polling."""
    fields = cmd.fields
    request = _PullRequest.parse(fields)
    version = context.options.version
    plan = _refusal(context, conn, request, fields)
    if isinstance(plan, tuple):
        return cmd.make_response(plan[0], {}, plan[1], version=version)
    queue = context.store.queue(request.topic, request.queue_id)
    min_offset, max_offset = queue.min_offset, queue.max_offset
    status, code, next_begin, body = _read(context, queue, request, plan)
    suggest = suggested_broker(context, queue, status in (FOUND, NO_MATCHED_MESSAGE),
                               next_begin)
    if code == ResponseCode.PULL_OFFSET_MOVED and context.is_slave:
        # a slave does not correct offsets (offsetCheckInSlave off): retry, at the master
        code, suggest = ResponseCode.PULL_RETRY_IMMEDIATELY, 0
    response: Optional[RemotingCommand] = cmd.make_response(
        code, {"suggestWhichBrokerId": str(suggest),
               "nextBeginOffset": str(next_begin),
               "maxOffset": str(max_offset), "minOffset": str(min_offset)},
        status, body=body, version=version)
    if not allow_suspend:
        # A parked pull's answer: the 4.9.8 broker writes it from the long-poll service
        # without copying the request's serialization, so it goes out in the server's own
        # (JSON), whatever the request used.
        response.serialize_type = SerializeType.JSON
    if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and \
            request.sys_flag & PULL_FLAG_SUSPEND:
        # a property filter's pull wakes on any arrival (the genuine broker evaluates the
        # arriving message first, or wakes it by its 5 s check): it then answers what it finds
        codes = None if plan.property_filter or plan.sub.match_all else plan.sub.codes
        context.long_poll.park(conn, cmd, request.topic, request.queue_id, request.offset,
                               codes, request.suspend_millis / 1000.0)
        response = None
    if allow_suspend and request.sys_flag & PULL_FLAG_COMMIT_OFFSET and not context.is_slave:
        context.store.commit_offset(request.group, request.topic, request.queue_id,
                                    request.commit_offset)
    return response
