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

from typing import TYPE_CHECKING, Optional

from ..client.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode,
)
from ..client.protocol.frame import RemotingCommand
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


def handle_pull(broker: "Broker", conn, cmd: RemotingCommand,
                allow_suspend: bool = True) -> Optional[RemotingCommand]:
    """Answer a pull, or park it (returns None) for long polling."""
    fields = cmd.fields
    group = req_str(fields, "consumerGroup")
    topic = req_str(fields, "topic")
    queue_id = req_int(fields, "queueId")
    offset = req_long(fields, "queueOffset")
    max_nums = req_int(fields, "maxMsgNums")
    sys_flag = req_int(fields, "sysFlag")
    commit_offset = req_long(fields, "commitOffset")
    suspend_millis = req_long(fields, "suspendTimeoutMillis")
    sub_version = req_long(fields, "subVersion")
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
        sub = build_subscription(topic, fields.get("subscription"), fields.get("expressionType"),
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
    if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
        broker.long_poll.park(conn, cmd, topic, queue_id, offset,
                              None if sub.match_all else sub.codes, suspend_millis / 1000.0)
        response = None
    if allow_suspend and sys_flag & PULL_FLAG_COMMIT_OFFSET:
        broker.store.commit_offset(group, topic, queue_id, commit_offset)
    return response
