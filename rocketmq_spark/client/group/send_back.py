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
"""
from __future__ import annotations

from typing import Optional

from ..broker import command
from ..protocol.codes import ResponseCode
from ..protocol.frame import RemotingCommand
from ..read.pull import response_error
from ..remoting import RemotingClient

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
    response = remoting.invoke(address, cmd, timeout)
    if response.code != ResponseCode.SUCCESS:
        raise response_error(response, "CONSUMER_SEND_MSG_BACK", address)
