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
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from ..client.errors import MessageDecodeError
from ..client.protocol.codes import (
    DEFAULT_TOPIC, PERM_INHERIT, PERM_READ, PERM_WRITE, SEND_V2_KEYS, RequestCode, ResponseCode,
)
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import (
    SYSFLAG_MULTI_TAGS, SYSFLAG_TRANSACTION_MASK, decode_batch, encode_stored_message,
    offset_msg_id, pack_host,
)
from ..client.protocol.properties import (
    CLUSTER, WAIT, decode_properties, hashmap_properties,
)
from .context import BrokerContext
from .headers import java_bool, opt_int, req_int, req_long, req_str
from .nameserver import FAQ_SUFFIX
from .records import ensure_system_topic, tag_code
from .schedule import delay_level, schedule_target
from .send_back import RETRY_PREFIX, Refusal, retry_send_target
from .slave_role import store_refusal
from .store import TopicConfig
from .transactions import (
    HALF_TOPIC, TRANSACTION_NOT_TYPE, half_properties, is_half, with_transaction_type,
)

V2_KEYS = {short: name for name, short in SEND_V2_KEYS.items()}  # short key -> V1 name
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


@dataclass(slots=True)
class _SendRequest:
    """The header fields of one send (V1 names), parsed as the 4.9.8 header class does."""

    topic: str
    default_topic: str
    default_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: Optional[str]
    reconsume_times: int
    batch: bool
    max_reconsume_times: Optional[int]

    @classmethod
    def parse(cls, cmd: RemotingCommand) -> "_SendRequest":
        fields = cmd.fields
        if cmd.code != RequestCode.SEND_MESSAGE:  # V2 and batch requests use the short keys
            fields = {V2_KEYS.get(k, k): v for k, v in fields.items()}
        req_str(fields, "producerGroup")
        return cls(req_str(fields, "topic"), req_str(fields, "defaultTopic"),
                   req_int(fields, "defaultTopicQueueNums"), req_int(fields, "queueId"),
                   req_int(fields, "sysFlag"), req_long(fields, "bornTimestamp"),
                   req_int(fields, "flag"), fields.get("properties"),
                   opt_int(fields, "reconsumeTimes", 0) or 0, java_bool(fields.get("batch")),
                   opt_int(fields, "maxReconsumeTimes"))


@dataclass(slots=True)
class _Run:
    """What a send stores: the queue, and per record its properties, body and flag."""

    topic: str
    queue_id: int
    properties: List[str]
    bodies: List[bytes]
    flags: List[int]
    sys_flag: int


_Refusal = Tuple[int, str]


def handle_send(context: BrokerContext, conn, cmd: RemotingCommand) -> RemotingCommand:
    """Store a send's message(s) and answer as a 4.9.8 broker does."""
    request = _SendRequest.parse(cmd)
    opts = context.options
    ext: Dict[str, str] = {"TRACE_ON": "true" if opts.trace_on else "false",
                           "MSG_REGION": opts.region}
    checked = _writable_queue(context, conn, request)
    if isinstance(checked, tuple):
        return cmd.make_response(checked[0], dict(ext), checked[1], version=opts.version)
    queue_id = checked
    # the requested queue exists from here on, even when the message goes to the half or
    # schedule topic (whose queues appear only when a record is stored) or is refused below
    # (the C path does the same; a test compares stores)
    context.store.queue(request.topic, queue_id)
    if request.batch:
        run = _batch_run(context, request, queue_id, cmd.body)
    else:
        target = retry_send_target(context, cmd.version, request.topic,
                                   request.reconsume_times, request.max_reconsume_times)
        if isinstance(target, Refusal):
            return cmd.make_response(target.code, dict(ext), target.remark,
                                     version=opts.version)
        run = _single_run(context, request, queue_id, cmd.body, target)
    if context.is_slave and (not isinstance(run, tuple) or run[1] == MESSAGE_ILLEGAL_REMARK):
        # a slave's store refuses every put, before its own checks of the message's size
        return store_refusal(context, cmd, ext)
    if isinstance(run, tuple):
        return cmd.make_response(run[0], dict(ext), run[1], version=opts.version)
    store_host, born_host = context.addr, conn.peer
    reconsume_times, born_ts = request.reconsume_times, request.born_timestamp

    def encode(index: int, queue_offset: int, physical_offset: int, now: int) -> bytes:
        return encode_stored_message(
            topic=run.topic, queue_id=run.queue_id, queue_offset=queue_offset,
            physical_offset=physical_offset, body=run.bodies[index],
            properties=run.properties[index], flag=run.flags[index], sys_flag=run.sys_flag,
            born_timestamp=born_ts, born_host=born_host, store_timestamp=now,
            store_host=store_host, reconsume_times=reconsume_times)
    stored = context.records.append(run.topic, run.queue_id, encode, len(run.bodies),
                                    [tag_code(props) for props in run.properties])
    host_bytes = pack_host(store_host)[0]
    ids, pos = [], stored.physical_offset
    for record in stored.records:
        ids.append(offset_msg_id(host_bytes, pos))
        pos += len(record)
    return cmd.make_response(ResponseCode.SUCCESS, {
        "queueId": str(queue_id), "TRACE_ON": ext["TRACE_ON"], "MSG_REGION": ext["MSG_REGION"],
        "msgId": ",".join(ids), "queueOffset": str(stored.queue_offset)}, None,
        version=opts.version)


def _writable_queue(context: BrokerContext, conn,
                    request: _SendRequest) -> Union[int, _Refusal]:
    """msgCheck: the queue id the send goes to (a random writable one for a negative id),
    creating the topic if the broker would; or (code, remark) when it refuses."""
    topic, queue_id = request.topic, request.queue_id
    bad = validate_topic(topic)
    if bad:
        return ResponseCode.SYSTEM_ERROR, bad
    if topic in NOT_ALLOWED_SEND_TOPICS:
        return ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
    store = context.store
    config = store.topics.get(topic)
    if config is None:
        config = create_topic_for_send(context, topic, request.default_topic,
                                       request.default_queue_nums)
        if config is None and topic.startswith(RETRY_PREFIX):
            config = TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE)
            store.put_topic(config)
        if config is None:
            return (ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{topic}] not exist, apply first please!{FAQ_SUFFIX}")
    if queue_id >= max(config.write_queue_nums, config.read_queue_nums):
        return (ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, {config.describe()} "
                f"Producer: {conn.peer}")
    if not config.writable:
        return ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
    if queue_id < 0:
        queue_id = random.randrange(max(config.write_queue_nums, 1))
    if config.topic_filter_type == "MULTI_TAG":
        request.sys_flag |= SYSFLAG_MULTI_TAGS
    return queue_id


def _batch_run(context: BrokerContext, request: _SendRequest, queue_id: int,
               body: bytes) -> Union[_Run, _Refusal]:
    """A batch's messages, each with its own properties and the batch's appended; or the
    refusal (retry topics, delays, transactions, sizes) of the whole batch."""
    topic, opts = request.topic, context.options
    if topic.startswith(RETRY_PREFIX):
        return ResponseCode.MESSAGE_ILLEGAL, f"batch request does not support retry group {topic}"
    try:
        entries = decode_batch(body)
    except MessageDecodeError as exc:
        return ResponseCode.SYSTEM_ERROR, f"java.nio.BufferUnderflowException: {exc}"
    if (not entries or delay_level(request.properties) > 0  # brokers never delay a batch
            or request.sys_flag & SYSFLAG_TRANSACTION_MASK):  # nor take one as a transaction
        return ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK
    tail = batch_properties(request.properties, opts.cluster_name)
    properties = []
    for entry in entries:
        own = entry.properties
        sep = "\x02" if own and tail and not own.endswith("\x02") else ""
        props = own + sep + tail
        if (len(entry.body) > opts.max_message_size
                or len(props.encode()) > MAX_PROPERTIES_BYTES):
            return ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK
        properties.append(props)
    return _Run(topic, queue_id, properties, [e.body for e in entries],
                [e.flag for e in entries], request.sys_flag)


def _single_run(context: BrokerContext, request: _SendRequest, queue_id: int,
                body: bytes, dead_letter: Optional[Tuple[str, int]] = None
                ) -> Union[_Run, _Refusal]:
    """One message, where it is kept: its queue (or ``dead_letter``'s, a retry topic's
    send past its max reconsume times, :mod:`.send_back`), the half topic until
    END_TRANSACTION (:mod:`.transactions`) or SCHEDULE_TOPIC_XXXX until due
    (:mod:`.schedule`)."""
    opts, properties = context.options, request.properties
    topic, queue_id = dead_letter or (request.topic, queue_id)
    store_topic, store_qid, sys_flag = topic, queue_id, request.sys_flag
    if is_half(properties):
        ensure_system_topic(context.store, HALF_TOPIC)
        store_topic, store_qid = HALF_TOPIC, 0
        props = half_properties(properties, topic, queue_id, opts.cluster_name)
        sys_flag = with_transaction_type(sys_flag, TRANSACTION_NOT_TYPE)
    else:
        props = stored_properties(properties, opts.cluster_name)
        delayed = schedule_target(properties, topic, queue_id, opts.cluster_name,
                                  len(opts.delay_levels))
        if delayed is not None:
            store_topic, store_qid, props = delayed
    if len(body) > opts.max_message_size or len(props.encode()) > MAX_PROPERTIES_BYTES:
        return ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK
    return _Run(store_topic, store_qid, [props], [body], [request.flag], sys_flag)


def create_topic_for_send(context: BrokerContext, topic: str, default_topic: str,
                          default_queue_nums: int) -> Optional[TopicConfig]:
    """TopicConfigManager.createTopicInSendMessageMethod: inherit from the default topic."""
    template = context.store.topics.get(default_topic)
    if template is None or not template.perm & PERM_INHERIT:
        return None
    nums = max(min(default_queue_nums, template.write_queue_nums), 0)
    config = TopicConfig(topic, nums, nums, template.perm & ~PERM_INHERIT,
                         template.topic_filter_type, 0)
    context.store.put_topic(config)
    return config
