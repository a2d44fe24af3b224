"""CONSUMER_SEND_MSG_BACK (36): hand a message the consumer could not process back to its broker.

The broker then redelivers it through the group's retry topic ``%RETRY%<group>`` after a delay
(delay level ``3 + reconsume times`` when ``delay_level`` is 0), or, once it has been consumed
``max_reconsume_times`` times (or for a negative ``delay_level``), stores it in the group's
dead-letter topic ``%DLQ%<group>``. The request is built as Java's
``MQClientAPIImpl.consumerSendMessageBack`` builds it: the message's commit-log offset, the
group, the delay level, its message id and topic, ``unitMode`` false and the group's
``maxReconsumeTimes`` (a 4.9.8 broker heeds that field from clients of version 3.4.9 on; ours
sends 4.9.8's). ``bname`` is added only when given (a 5.x proxy routes by it; 4.9.8's header
has no such field and a 4.9.8 broker ignores it).

When a broker refuses it, Java's consumer sends a copy of the message to the retry topic as a
message of its own (``sendMessageBackAsNormalMessage``): the copy's request, the answer that
means stored and the master it goes to are here too; which copy and where is the caller's.
"""
from __future__ import annotations

import time
from typing import Optional

from ..broker import SEND_STATUS_OF_CODE, command, send_command
from ..errors import ResponseError
from ..masters import master_address, routes_of
from ..nameserver import NameServerClient
from ..protocol.codes import DEFAULT_TOPIC, SEND_V2_KEYS, ResponseCode
from ..protocol.frame import RemotingCommand
from ..protocol.route import MessageQueue
from ..remoting import RemotingClient
from ..responses import response_error

CONSUMER_SEND_MSG_BACK = 36  # RequestCode.CONSUMER_SEND_MSG_BACK
DEFAULT_MAX_RECONSUME_TIMES = 16  # DefaultMQPushConsumer.getMaxReconsumeTimes() when unset (-1)


def send_back_command(commit_log_offset: int, group: str, delay_level: int,
                      origin_msg_id: str, origin_topic: str,
                      max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                      unit_mode: bool = False, broker_name: Optional[str] = None
                      ) -> RemotingCommand:
    """The CONSUMER_SEND_MSG_BACK request for one message (ConsumerSendMsgBackRequestHeader,
    fields in the header class's order)."""
    if not group:
        raise ValueError("send-back needs the consumer group")
    if commit_log_offset < 0:
        raise ValueError(f"commit-log offset must not be negative, got {commit_log_offset}")
    return command(CONSUMER_SEND_MSG_BACK, {
        "offset": int(commit_log_offset), "group": group, "delayLevel": int(delay_level),
        "originMsgId": origin_msg_id, "originTopic": origin_topic, "unitMode": bool(unit_mode),
        "maxReconsumeTimes": int(max_reconsume_times), "bname": broker_name})


def send_message_back(remoting: RemotingClient, address: str, commit_log_offset: int,
                      group: str, delay_level: int, origin_msg_id: str, origin_topic: str,
                      max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                      unit_mode: bool = False, broker_name: Optional[str] = None,
                      timeout: Optional[float] = None) -> None:
    """Send one message back to the broker at ``address`` (the broker that stored it: the
    offset is that broker's commit-log offset). Raises the typed
    :class:`~..errors.ResponseError` when the broker refuses (Java's MQBrokerException), e.g.
    SUBSCRIPTION_GROUP_NOT_EXIST, NO_PERMISSION or SYSTEM_ERROR "look message by offset
    failed"; the Java client then sends the message to the retry topic itself."""
    cmd = send_back_command(commit_log_offset, group, delay_level, origin_msg_id,
                            origin_topic, max_reconsume_times, unit_mode, broker_name)
    error = send_back_refusal(remoting.invoke(address, cmd, timeout), address)
    if error is not None:
        raise error


def send_back_refusal(response: RemotingCommand, address: str) -> Optional[ResponseError]:
    """None when the broker took the message back, else its refusal as a typed error."""
    if response.code == ResponseCode.SUCCESS:
        return None
    return response_error(response, "CONSUMER_SEND_MSG_BACK", address)


def retry_copy_command(queue: MessageQueue, producer_group: str, body: bytes, properties: str,
                       sys_flag: int, reconsume_times: int, max_reconsume_times: int,
                       default_topic_queue_nums: int) -> RemotingCommand:
    """SEND_MESSAGE_V2 of a message's copy to the retry topic ``queue.topic``. The send header
    carries the copy's ``reconsume_times`` and the group's ``max_reconsume_times`` (the
    broker puts the copy into the dead-letter topic once it is over), as Java's producer
    moves them there from the properties."""
    request = send_command(queue.broker_name, producer_group, queue.topic, queue.queue_id, body,
                           properties, sys_flag, 0, int(time.time() * 1000),
                           default_topic_queue_nums)
    request.ext_fields[SEND_V2_KEYS["reconsumeTimes"]] = str(reconsume_times)
    request.ext_fields[SEND_V2_KEYS["maxReconsumeTimes"]] = str(max_reconsume_times)
    return request


def retry_copy_refusal(response: RemotingCommand, address: str) -> Optional[ResponseError]:
    """None when the copy was stored (maybe with a flush warning), else the refusal."""
    if response.code in SEND_STATUS_OF_CODE:
        return None
    return response_error(response, "SEND_MESSAGE_V2", address)


def retry_copy_master(names: NameServerClient, queue: MessageQueue, origin: str) -> str:
    """The master address of the queue's broker, from the retry topic's route, TBW102's (its
    queues came from that template) or the original topic's (``origin``)."""
    return master_address(routes_of(names.route, (queue.topic, DEFAULT_TOPIC, origin)),
                          queue.broker_name, f"no master of {queue.broker_name} is in the "
                                             f"route of {queue.topic}")
