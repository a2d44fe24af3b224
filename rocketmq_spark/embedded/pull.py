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

PULL_NOT_FOUND (19) parks the request when sysFlag has SUSPEND and this is its first run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from ..client.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode,
    SerializeType,
)
from ..client.protocol.frame import RemotingCommand
from . import accelerator
from .consumers import build_subscription
from .headers import req_int, req_long, req_str
from .nameserver import FAQ_SUFFIX

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker

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


def native_server_function(broker, name: str):
    """The accelerator's function ``name`` for a C path of ``broker``'s server, or None when
    the accelerator lacks it, ``ROCKETMQ_SPARK_PURE_PYTHON`` is set or ``broker`` has no store
    or options (a stand-in broker: the Python path only)."""
    function = accelerator.native_function(name)
    if function is None or getattr(broker, "store", None) is None or \
            getattr(broker, "options", None) is None:
        return None
    return function


def native_answers(broker) -> Optional[Callable[[bytes], Tuple[List[bytes], int]]]:
    """The C answer to plain FOUND pulls (``native/embedded/rmq_serve.c``, byte for byte what
    :func:`handle_pull` answers; a test holds them together) for ``broker``, or ``None`` when
    the accelerator is not built or ``ROCKETMQ_SPARK_PURE_PYTHON`` is set. The function takes
    a received chunk and returns the answers to the pulls at its start and the bytes they
    used; everything from the first request it does not take on goes the Python way."""
    serve = native_server_function(broker, "serve_pulls")
    if serve is None:
        return None
    store = broker.store
    topics, queues = store.topics, store.queues

    def answer(data) -> Tuple[List[bytes], int]:
        o = broker.options
        return serve(data, topics, queues, o.max_transfer_count, o.max_transfer_bytes,
                     o.suggest_broker_id, o.version)
    return answer


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


def handle_pull(broker: "Broker", conn, cmd: RemotingCommand,
                allow_suspend: bool = True) -> Optional[RemotingCommand]:
    """Answer a pull, or park it (returns None) for long polling."""
    fields = cmd.fields
    group = req_str(fields, "consumerGroup")
    topic = req_str(fields, "topic")
    queue_id = _number(fields, "queueId", req_int)
    offset = _number(fields, "queueOffset", req_long)
    max_nums = _number(fields, "maxMsgNums", req_int)
    sys_flag = _number(fields, "sysFlag", req_int)
    commit_offset = _number(fields, "commitOffset", req_long)
    suspend_millis = _number(fields, "suspendTimeoutMillis", req_long)
    sub_version = _number(fields, "subVersion", req_long)
    version = broker.options.version

    def error(code: int, remark: str) -> RemotingCommand:
        return cmd.make_response(code, {}, remark, version=version)

    config = broker.store.topics.get(topic)
    if config is None:
        return error(ResponseCode.TOPIC_NOT_EXIST,
                     f"topic[{topic}] not exist, apply first please! {FAQ_SUFFIX}")
    if not config.readable:
        return error(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
    if queue_id < 0 or queue_id >= config.read_queue_nums:
        return error(ResponseCode.SYSTEM_ERROR,
                     f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                     f"[{config.read_queue_nums}] consumer:[/{conn.peer}]")

    if sys_flag & PULL_FLAG_SUBSCRIPTION:
        sub = _subscription(topic, fields.get("subscription"), fields.get("expressionType"),
                            sub_version)
    else:
        info = broker.clients.consumers.get(group)
        if info is None:
            return error(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                         f"the consumer's group info not exist{FAQ_SUFFIX}")
        sub = info.subscriptions.get(topic)
        if sub is None:
            return error(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                         f"the consumer's subscription not exist{FAQ_SUFFIX}")
        if sub.sub_version < sub_version:
            return error(ResponseCode.SUBSCRIPTION_NOT_LATEST,
                         "the consumer's subscription not latest")
    if sub.expression_type.upper() != "TAG":
        return error(ResponseCode.SYSTEM_ERROR,
                     f"The broker does not support consumer to filter message by "
                     f"{sub.expression_type}")

    queue = broker.store.queue(topic, queue_id)
    min_offset, max_offset = queue.min_offset, queue.max_offset
    body = b""
    if max_offset == 0:
        status, next_begin = NO_MESSAGE_IN_QUEUE, 0
        code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
    elif offset < min_offset:
        status, next_begin, code = OFFSET_TOO_SMALL, min_offset, ResponseCode.PULL_OFFSET_MOVED
    elif offset == max_offset:
        status, next_begin, code = OFFSET_OVERFLOW_ONE, offset, ResponseCode.PULL_NOT_FOUND
    elif offset > max_offset:
        status, next_begin, code = OFFSET_OVERFLOW_BADLY, max_offset, ResponseCode.PULL_OFFSET_MOVED
    else:
        opts = broker.options
        if sub.match_all:
            body, examined, found = queue.read(offset, max_nums, opts.max_transfer_count,
                                               opts.max_transfer_bytes)
        else:
            body, examined, found = queue.read_filtered(offset, sub.codes, max_nums,
                                                        opts.max_transfer_count,
                                                        opts.max_transfer_bytes)
        next_begin = offset + examined
        if found:
            status, code = FOUND, ResponseCode.SUCCESS
        else:
            status, code = NO_MATCHED_MESSAGE, ResponseCode.PULL_RETRY_IMMEDIATELY

    response: Optional[RemotingCommand] = cmd.make_response(
        code, {"suggestWhichBrokerId": str(broker.options.suggest_broker_id),
               "nextBeginOffset": str(next_begin),
               "maxOffset": str(max_offset), "minOffset": str(min_offset)},
        status, body=body, version=version)
    if not allow_suspend:
        # A parked pull's answer: the 4.9.8 broker writes it from the long-poll service
        # without copying the request's serialization, so it goes out in the server's own
        # (JSON), whatever the request used.
        response.serialize_type = SerializeType.JSON
    if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
        broker.long_poll.park(conn, cmd, topic, queue_id, offset,
                              None if sub.match_all else sub.codes, suspend_millis / 1000.0)
        response = None
    if allow_suspend and sys_flag & PULL_FLAG_COMMIT_OFFSET:
        broker.store.commit_offset(group, topic, queue_id, commit_offset)
    return response
