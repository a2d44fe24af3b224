"""CONSUMER_SEND_MSG_BACK (36): a consumer hands back a message it could not process, as 4.9.8.

What a 4.9.8 broker does (SendMessageProcessor.asyncConsumerSendMsgBack), checked against the
capture ``rocketmq-4.9.8-retry-dlq`` where it shows it:

* The group's subscription config is looked up (created with the defaults unless the broker
  does not auto-create groups: then SUBSCRIPTION_GROUP_NOT_EXIST). A group with no retry
  queues (``retryQueueNums`` 0) gets SUCCESS and the message is dropped.
* ``%RETRY%<group>`` is created if missing: ``retryQueueNums`` queues (1), perm 6 (read and
  write), topic sys flag 2 in unit mode; an existing retry topic that is not writable refuses
  (NO_PERMISSION).
* The message is found by its commit-log ``offset`` (else SYSTEM_ERROR "look message by
  offset failed"). A copy is stored with RECONSUMETIMES + 1, the original's body (as stored),
  flag, sys flag, born time and hosts, and its properties plus ``RETRY_TOPIC`` (the original
  topic, kept when already set), ``WAIT=false``, ``DELAY`` and ``ORIGIN_MESSAGE_ID`` (the
  original's offset message id, kept when already set); UNIQ_KEY is unchanged.
* Where: when the message has already been consumed ``maxReconsumeTimes`` times (the header's,
  for clients of version 3.4.9 (ordinal 121) and later, else the group's ``retryMaxTimes``)
  or ``delayLevel`` is negative, ``%DLQ%<group>`` queue 0 (created with 1 queue, perm 6, as
  the capture shows) with ``DELAY=0``; otherwise the retry topic through the schedule: delay
  level ``delayLevel``, or 3 + reconsume times when it is 0 (lowered to the table's last
  level), with ``REAL_TOPIC``/``REAL_QID`` added (:mod:`.schedule`).
* The answer is SUCCESS without ext fields or remark.

The name server routes a created topic at once (brokers register in-process, see
:mod:`.nameserver`); a genuine broker sends a oneway REGISTER_BROKER for it.
"""
from __future__ import annotations

import random
from typing import NamedTuple, Optional, Tuple, Union

from ..client.protocol.codes import PERM_READ, PERM_WRITE, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import decode_message, encode_stored_message
from ..client.protocol.properties import DELAY, WAIT, decode_properties, hashmap_properties
from .context import BrokerContext
from .headers import java_bool, opt_int, req_int, req_long, req_str
from .nameserver import FAQ_SUFFIX
from .records import properties_text, tag_code
from .schedule import schedule_target
from .store import BrokerStore, TopicConfig

CONSUMER_SEND_MSG_BACK = 36  # RequestCode.CONSUMER_SEND_MSG_BACK
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
DLQ_QUEUE_NUMS = 1  # DLQ_NUMS_PER_GROUP
UNIT_SUB_SYS_FLAG = 2  # TopicSysFlag.buildSysFlag(false, true)
VERSION_V3_4_9 = 121  # MQVersion.Version.V3_4_9.ordinal(): the header's maxReconsumeTimes counts
RETRY_PERM = PERM_READ | PERM_WRITE
MAX_PROPERTIES_BYTES = 32767


def subscription_group_missing(group: str) -> str:
    """The genuine remark for a group the broker does not know (note the space)."""
    return f"subscription group not exist, {group} {FAQ_SUFFIX}"


def create_send_back_topic(store: BrokerStore, topic: str, queue_nums: int,
                           sys_flag: int = 0) -> TopicConfig:
    """TopicConfigManager.createTopicInSendMessageBackMethod: the topic's config, created
    with ``queue_nums`` read and write queues and perm 6 when missing."""
    config = store.topics.get(topic)
    if config is None:
        config = TopicConfig(topic, queue_nums, queue_nums, RETRY_PERM, topic_sys_flag=sys_flag)
        store.put_topic(config)
    return config


def find_record(store: BrokerStore, physical_offset: int) -> Optional[bytes]:
    """MessageStore.lookMessageByOffset: the stored record starting at that commit-log
    offset, in whichever queue holds it (each queue's records lie in commit-log order)."""
    for queue in list(store.queues.values()):
        lo, hi = queue.min_offset, queue.max_offset
        if lo >= hi or not (queue.record_long(lo, 28) <= physical_offset
                            <= queue.record_long(hi - 1, 28)):
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if queue.record_long(mid, 28) < physical_offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < queue.max_offset and queue.record_long(lo, 28) == physical_offset:
            return queue.record(lo)
    return None


def max_reconsume_times(cmd: RemotingCommand, group_default: int) -> int:
    """The header's maxReconsumeTimes for clients of 3.4.9 and later, else the group's."""
    header = opt_int(cmd.fields, "maxReconsumeTimes")
    if cmd.version >= VERSION_V3_4_9 and header is not None:
        return header
    return group_default


def handle_send_back(context: BrokerContext, conn, cmd: RemotingCommand) -> RemotingCommand:
    """Store a consumer's failed message for redelivery (or as dead) and answer as 4.9.8."""
    fields, opts = cmd.fields, context.options
    offset = req_long(fields, "offset")
    group = req_str(fields, "group")
    delay_level = req_int(fields, "delayLevel")
    unit_mode = java_bool(fields.get("unitMode"))

    def answer(code: int, remark: Optional[str] = None) -> RemotingCommand:
        return cmd.make_response(code, None, remark, version=opts.version)

    sub = context.clients.subscription_groups.find(
        group, opts.auto_create_subscription_group, opts.retry_max_times)
    if sub is None:
        return answer(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                      subscription_group_missing(group))
    if sub.retry_queue_nums <= 0:
        return answer(ResponseCode.SUCCESS)  # the group keeps no retries: dropped
    store = context.store
    topic = RETRY_PREFIX + group
    queue_id = random.randrange(99999999) % sub.retry_queue_nums
    config = create_send_back_topic(store, topic, sub.retry_queue_nums,
                                    UNIT_SUB_SYS_FLAG if unit_mode else 0)
    if not config.writable:
        return answer(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is "
                      "forbidden")
    record = find_record(store, offset)
    if record is None:
        return answer(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
    msg, _ = decode_message(record, verify_crc=False, decompress=False)
    props = decode_properties(properties_text(record))
    props.setdefault(RETRY_TOPIC, msg.topic)
    props[WAIT] = "false"
    if (msg.reconsume_times >= max_reconsume_times(cmd, sub.retry_max_times)
            or delay_level < 0):
        topic = DLQ_PREFIX + group
        queue_id = random.randrange(99999999) % DLQ_QUEUE_NUMS
        create_send_back_topic(store, topic, DLQ_QUEUE_NUMS)
        props[DELAY] = "0"
    else:
        props[DELAY] = str(delay_level or 3 + msg.reconsume_times)
    if not props.get(ORIGIN_MESSAGE_ID, "").strip():
        props[ORIGIN_MESSAGE_ID] = msg.offset_msg_id
    if context.is_slave:  # a slave's message store refuses every put
        return answer(ResponseCode.SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")
    if not _store_copy(context, msg, topic, queue_id, hashmap_properties(props)):
        return answer(ResponseCode.SYSTEM_ERROR, "MESSAGE_ILLEGAL")  # properties too long
    return answer(ResponseCode.SUCCESS)


def _store_target(context: BrokerContext, topic: str, queue_id: int,
                  text: str) -> Tuple[str, int, str]:
    """Where the copy goes: the schedule topic when it has a delay (CommitLog.putMessage)."""
    delayed = schedule_target(text, topic, queue_id, None, len(context.options.delay_levels))
    return delayed if delayed is not None else (topic, queue_id, text)


def _store_copy(context: BrokerContext, msg, topic: str, queue_id: int, text: str) -> bool:
    """Store the copy; False when its properties no longer fit a record."""
    store_topic, store_qid, text = _store_target(context, topic, queue_id, text)
    if len(text.encode("utf-8")) > MAX_PROPERTIES_BYTES:
        return False
    context.records.append(
        store_topic, store_qid, lambda _, queue_offset, physical_offset, now:
        encode_stored_message(
            topic=store_topic, queue_id=store_qid, queue_offset=queue_offset,
            physical_offset=physical_offset, body=msg.stored_body, properties=text,
            flag=msg.flag, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
            born_host=msg.born_host, store_timestamp=now, store_host=msg.store_host,
            reconsume_times=msg.reconsume_times + 1),
        codes=[tag_code(text)])
    return True


class Refusal(NamedTuple):
    """A refused request's answer: code and remark."""

    code: int
    remark: str


def retry_send_target(context: BrokerContext, version: int, topic: str, reconsume_times: int,
                      max_reconsume_header: Optional[int]
                      ) -> Union[None, Refusal, Tuple[str, int]]:
    """SendMessageProcessor.handleRetryAndDLQ, for a send to ``%RETRY%<group>`` (what the
    Java consumer does when its send-back fails): None to store it where it was sent,
    ``(%DLQ%<group>, 0)`` once ``reconsume_times`` reaches the max (the header's
    maxReconsumeTimes from clients of 3.4.9 on, else the group's retryMaxTimes), or the
    refusal for an unknown group. The message keeps its own properties (a DELAY among them
    still delays it, then into the DLQ)."""
    if not topic.startswith(RETRY_PREFIX):
        return None
    group = topic[len(RETRY_PREFIX):]
    opts = context.options
    sub = context.clients.subscription_groups.find(
        group, opts.auto_create_subscription_group, opts.retry_max_times)
    if sub is None:
        return Refusal(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                       subscription_group_missing(group))
    limit = sub.retry_max_times
    if version >= VERSION_V3_4_9 and max_reconsume_header is not None:
        limit = max_reconsume_header
    if reconsume_times < limit:
        return None
    dlq = DLQ_PREFIX + group
    create_send_back_topic(context.store, dlq, DLQ_QUEUE_NUMS)
    return dlq, random.randrange(99999999) % DLQ_QUEUE_NUMS


def create_retry_topic_on_heartbeat(context: BrokerContext, group: str, unit_mode: bool) -> None:
    """ClientManageProcessor.heartBeat: a consumer group's heartbeat finds (or auto-creates)
    its subscription group and creates ``%RETRY%<group>`` with its retryQueueNums queues;
    a group the broker does not know and will not create gets no retry topic."""
    opts = context.options
    sub = context.clients.subscription_groups.find(
        group, opts.auto_create_subscription_group, opts.retry_max_times)
    if sub is not None:
        create_send_back_topic(context.store, RETRY_PREFIX + group, sub.retry_queue_nums,
                               UNIT_SUB_SYS_FLAG if unit_mode else 0)
