"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320), as a 4.9.8 broker.

* V2 and batch requests use one-letter header keys; they mean the V1 fields.
* Whether a request is a batch is decided by the ``batch`` header parsed like Java's
  ``Boolean.parseBoolean``, not by the request code: the C++ client's ``"batch":"1"`` on code 10
  is a single message whose body is the whole batch encoding (what the genuine broker stored).
* Single messages are stored with properties re-serialized from a Java HashMap: the producer's
  properties minus ``WAIT``, plus ``CLUSTER``, in HashMap iteration order, no trailing separator.
* Batch messages keep each message's own property bytes and get the batch-level header
  properties (plus ``CLUSTER``) appended, with a ``\\x02`` in between when needed.
* A single message whose ``TRAN_MSG`` property is true is a half message, stored in
  ``RMQ_SYS_TRANS_HALF_TOPIC`` until END_TRANSACTION (:mod:`.transactions`); a batch with
  transaction bits in its sysFlag is refused, as ``CommitLog.putMessages`` does.
* A send to an unknown topic creates it from ``defaultTopic`` (TBW102) when that topic has the
  inherit permission: min(defaultTopicQueueNums, its write queues) queues, its perm minus inherit.
"""
from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Dict, List, Optional

from ..client.errors import MessageDecodeError
from ..client.protocol.codes import DEFAULT_TOPIC, SEND_V2_KEYS, PERM_INHERIT, PERM_READ, PERM_WRITE, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import (
    SYSFLAG_MULTI_TAGS, SYSFLAG_TRANSACTION_MASK, decode_batch, encode_stored_message,
    offset_msg_id, pack_host,
)
from ..client.protocol.properties import (
    CLUSTER, TAGS, WAIT, decode_properties, hashmap_properties, java_string_hash,
    property_value,
)
from .headers import java_bool, opt_int, req_int, req_long, req_str
from .nameserver import FAQ_SUFFIX
from .schedule import delay_level, schedule_target
from .store import TopicConfig
from .transactions import (
    HALF_TOPIC, TRANSACTION_NOT_TYPE, half_properties, is_half, with_transaction_type,
)

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker

V2_KEYS = {short: name for name, short in SEND_V2_KEYS.items()}  # short key -> V1 name
RETRY_PREFIX = "%RETRY%"
VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")
VALID_TOPIC_TEXT = "^[%|a-zA-Z0-9_-]+$"
TOPIC_MAX_LENGTH = 127
SYSTEM_TOPICS = frozenset({
    DEFAULT_TOPIC, "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
NOT_ALLOWED_SEND_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
MESSAGE_ILLEGAL_REMARK = ("the message is illegal, maybe msg body or properties length not "
                          "matched. msg body length limit 128k, msg properties length limit 32k.")
MAX_PROPERTIES_BYTES = 32767


def validate_topic(topic: str) -> Optional[str]:
    """TopicValidator.validateTopic: None when fine, else the genuine remark."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if not VALID_TOPIC.match(topic):
        return f"The specified topic contains illegal characters, allowing only {VALID_TOPIC_TEXT}"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    return None


def stored_properties(properties: Optional[str], cluster: str) -> str:
    """What a 4.9.8 broker writes for a single message's properties."""
    props = decode_properties(properties or "")
    props[CLUSTER] = cluster
    return hashmap_properties(props, drop=WAIT)  # WAIT still counts for the map's layout


def batch_properties(properties: Optional[str], cluster: str) -> str:
    """The batch-level properties appended to every message of a batch (WAIT is kept)."""
    props = decode_properties(properties or "")
    props[CLUSTER] = cluster
    return hashmap_properties(props)


def tag_code(properties_text: str) -> int:
    """The consume-queue tag code: Java hashCode of the TAGS property, 0 without tags."""
    tags = property_value(properties_text, TAGS)
    return java_string_hash(tags) if tags else 0


def handle_send(broker: "Broker", conn, cmd: RemotingCommand) -> RemotingCommand:
    fields = cmd.fields
    if cmd.code != 10:  # V2 and batch requests use the short keys
        fields = {V2_KEYS.get(k, k): v for k, v in fields.items()}
    req_str(fields, "producerGroup")
    topic = req_str(fields, "topic")
    default_topic = req_str(fields, "defaultTopic")
    default_queue_nums = req_int(fields, "defaultTopicQueueNums")
    queue_id = req_int(fields, "queueId")
    sys_flag = req_int(fields, "sysFlag")
    born_ts = req_long(fields, "bornTimestamp")
    flag = req_int(fields, "flag")
    properties = fields.get("properties")
    reconsume_times = opt_int(fields, "reconsumeTimes", 0) or 0
    batch = java_bool(fields.get("batch"))
    opts = broker.options
    version = opts.version
    ext: Dict[str, str] = {"TRACE_ON": "true" if opts.trace_on else "false",
                           "MSG_REGION": opts.region}

    def error(code: int, remark: str) -> RemotingCommand:
        return cmd.make_response(code, dict(ext), remark, version=version)

    # msgCheck
    bad = validate_topic(topic)
    if bad:
        return error(ResponseCode.SYSTEM_ERROR, bad)
    if topic in NOT_ALLOWED_SEND_TOPICS:
        return error(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
    config = broker.store.topics.get(topic)
    if config is None:
        config = create_topic_for_send(broker, topic, default_topic, default_queue_nums)
        if config is None and topic.startswith(RETRY_PREFIX):
            config = TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE)
            broker.store.put_topic(config)
        if config is None:
            return error(ResponseCode.TOPIC_NOT_EXIST,
                         f"topic[{topic}] not exist, apply first please!{FAQ_SUFFIX}")
    if queue_id >= max(config.write_queue_nums, config.read_queue_nums):
        return error(ResponseCode.SYSTEM_ERROR,
                     f"request queueId[{queue_id}] is illegal, {config.describe()} "
                     f"Producer: {conn.peer}")
    if not config.writable:
        return error(ResponseCode.NO_PERMISSION,
                     f"the topic[{topic}] sending message is forbidden")
    if queue_id < 0:
        queue_id = random.randrange(max(config.write_queue_nums, 1))
    if config.topic_filter_type == "MULTI_TAG":
        sys_flag |= SYSFLAG_MULTI_TAGS

    store = broker.store
    queue = store.queue(topic, queue_id)
    store_host = broker.addr
    host_bytes = pack_host(store_host)[0]
    now = store.now()
    phys = store.commit_log.size
    first_offset = queue.max_offset
    records: List[bytes] = []
    codes: List[int] = []
    if batch:
        if topic.startswith(RETRY_PREFIX):
            return error(ResponseCode.MESSAGE_ILLEGAL,
                         f"batch request does not support retry group {topic}")
        try:
            entries = decode_batch(cmd.body)
        except MessageDecodeError as exc:
            return error(ResponseCode.SYSTEM_ERROR, f"java.nio.BufferUnderflowException: {exc}")
        if (not entries or delay_level(properties) > 0  # brokers never delay a batch
                or sys_flag & SYSFLAG_TRANSACTION_MASK):  # nor take one as a transaction
            return error(ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
        tail = batch_properties(properties, opts.cluster_name)
        for i, entry in enumerate(entries):
            own = entry.properties
            sep = "\x02" if own and tail and not own.endswith("\x02") else ""
            props = own + sep + tail
            if (len(entry.body) > opts.max_message_size
                    or len(props.encode()) > MAX_PROPERTIES_BYTES):
                return error(ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
            records.append(encode_stored_message(
                topic=topic, queue_id=queue_id, queue_offset=first_offset + i,
                physical_offset=phys, body=entry.body, properties=props, flag=entry.flag,
                sys_flag=sys_flag, born_timestamp=born_ts, born_host=conn.peer,
                store_timestamp=now, store_host=store_host, reconsume_times=reconsume_times))
            codes.append(tag_code(props))
            phys += len(records[-1])
    else:
        store_topic, store_qid = topic, queue_id
        if is_half(properties):  # kept in the half topic until ended (transactions.py)
            broker.transactions.ensure_topic(HALF_TOPIC)
            store_topic, store_qid = HALF_TOPIC, 0
            props = half_properties(properties, topic, queue_id, opts.cluster_name)
            sys_flag = with_transaction_type(sys_flag, TRANSACTION_NOT_TYPE)
            queue = store.queue(store_topic, store_qid)
            first_offset = queue.max_offset
        else:
            props = stored_properties(properties, opts.cluster_name)
            delayed = schedule_target(properties, topic, queue_id, opts.cluster_name,
                                      broker.schedule.max_level)
            if delayed is not None:  # kept in SCHEDULE_TOPIC_XXXX until due (schedule.py)
                store_topic, store_qid, props = delayed
                queue = store.queue(store_topic, store_qid)
                first_offset = queue.max_offset
        if len(cmd.body) > opts.max_message_size or len(props.encode()) > MAX_PROPERTIES_BYTES:
            return error(ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
        records.append(encode_stored_message(
            topic=store_topic, queue_id=store_qid, queue_offset=first_offset,
            physical_offset=phys,
            body=cmd.body, properties=props, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_ts, born_host=conn.peer, store_timestamp=now,
            store_host=store_host, reconsume_times=reconsume_times))
        codes.append(tag_code(props))
    base = store.commit_log.size
    store.append(queue, records, codes, now)
    ids, pos = [], base
    for rec in records:
        ids.append(offset_msg_id(host_bytes, pos))
        pos += len(rec)
    broker.long_poll.notify_arrival_soon(queue.topic, queue.queue_id, queue.max_offset, codes)
    return cmd.make_response(ResponseCode.SUCCESS, {
        "queueId": str(queue_id), "TRACE_ON": ext["TRACE_ON"], "MSG_REGION": ext["MSG_REGION"],
        "msgId": ",".join(ids), "queueOffset": str(first_offset)}, None, version=version)


def create_topic_for_send(broker: "Broker", topic: str, default_topic: str,
                          default_queue_nums: int) -> Optional[TopicConfig]:
    """TopicConfigManager.createTopicInSendMessageMethod: inherit from the default topic."""
    template = broker.store.topics.get(default_topic)
    if template is None or not template.perm & PERM_INHERIT:
        return None
    nums = max(min(default_queue_nums, template.write_queue_nums), 0)
    config = TopicConfig(topic, nums, nums, template.perm & ~PERM_INHERIT,
                         template.topic_filter_type, 0)
    broker.store.put_topic(config)
    return config
