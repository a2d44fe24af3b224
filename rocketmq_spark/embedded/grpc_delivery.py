"""Delivery for the embedded proxy's SimpleConsumer calls: ReceiveMessage, AckMessage,
ChangeInvisibleDuration. A simple invisible-duration scheme, not the broker's POP machinery.

Per (group, topic, broker) every queue has a *next* offset (never delivered at or after it) and
the offsets delivered but not yet acknowledged, each invisible until a deadline. A receive
hands out, queue by queue, first the messages whose deadline passed (again, with
``delivery_attempt`` + 1), then new ones; an ack forgets one, and the group's committed offset
(what remoting consumers and GET_CONSUME_STATS see) moves to the lowest offset still unacked.
A new group starts at its committed offset, else at the queue's min offset. Delivery of a
message group (FIFO) is not serialized: every message is handed out as soon as it is visible.

A receipt handle names broker, queue, offset and a token that changes with every delivery and
every ChangeInvisibleDuration, so an outdated handle is refused. Runs on the cluster's loop.
"""
from __future__ import annotations

import secrets
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..client.grpc import definition_pb2 as definition
from ..client.protocol.properties import (
    DELAY, SHARDING_KEY, java_string_hash, split_tags_expression,
)
from ..client.protocol.message import MessageExt, decode_message
from .store import BrokerStore

HANDLE_PREFIX = "rmqe1"

# Stored properties that are the system's, not the user's (Apache's MessageConst set): the
# proxy leaves them out of ``user_properties``.
SYSTEM_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
    "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
    "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
    "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME",
    "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP",
})
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TRACE_CONTEXT = "TRACE_CONTEXT"


class InvalidHandle(ValueError):
    """A receipt handle that is malformed, unknown or outdated."""


@dataclass
class _Lease:
    token: str
    deadline: float
    attempt: int


@dataclass
class _QueueState:
    next_offset: int
    leases: Dict[int, _Lease] = field(default_factory=dict)


def encode_handle(broker: str, queue_id: int, offset: int, token: str) -> str:
    return f"{HANDLE_PREFIX}:{broker}:{queue_id}:{offset}:{token}"


def decode_handle(handle: str) -> Tuple[str, int, int, str]:
    parts = (handle or "").split(":")
    if len(parts) != 5 or parts[0] != HANDLE_PREFIX:
        raise InvalidHandle("not a receipt handle of this proxy")
    try:
        return parts[1], int(parts[2]), int(parts[3]), parts[4]
    except ValueError:
        raise InvalidHandle("not a receipt handle of this proxy") from None


class GroupDelivery:
    """Delivery state of one consumer group on one topic of one broker."""

    def __init__(self, group: str, topic: str, broker: str, store: BrokerStore):
        self.group, self.topic, self.broker, self.store = group, topic, broker, store
        self._queues: Dict[int, _QueueState] = {}
        self._rr = 0

    def _state(self, queue_id: int) -> _QueueState:
        state = self._queues.get(queue_id)
        if state is None:
            committed = self.store.query_offset(self.group, self.topic, queue_id)
            queue = self.store.existing_queue(self.topic, queue_id)
            start = committed if committed >= 0 else (queue.min_offset if queue else 0)
            state = self._queues[queue_id] = _QueueState(start)
        return state

    def receive(self, max_count: int, invisible: float,
                tag_codes: Optional[frozenset]) -> List[Tuple[MessageExt, str, int]]:
        """Up to ``max_count`` (message, receipt handle, delivery attempt) triples."""
        config = self.store.topics.get(self.topic)
        if config is None:
            return []
        now = time.monotonic()
        n = config.read_queue_nums
        out: List[Tuple[MessageExt, str, int]] = []
        for k in range(n):
            if len(out) >= max_count:
                break
            queue_id = (self._rr + k) % n
            queue = self.store.existing_queue(self.topic, queue_id)
            if queue is None:
                continue
            state = self._state(queue_id)
            if state.next_offset < queue.min_offset:
                state.next_offset = queue.min_offset  # retention dropped the head
            due = sorted(o for o, lease in state.leases.items() if lease.deadline <= now)
            fresh = range(state.next_offset, queue.max_offset)
            for offset in [*due, *fresh]:
                if len(out) >= max_count:
                    break
                if offset < queue.min_offset:
                    state.leases.pop(offset, None)
                    continue
                record = queue.record(offset)
                message, _ = decode_message(record, 0, len(record), verify_crc=False)
                if offset >= state.next_offset:
                    state.next_offset = offset + 1
                    if tag_codes is not None and _tag_code(message) not in tag_codes:
                        continue  # filtered out: never delivered to this group
                    attempt = message.reconsume_times + 1
                else:
                    attempt = state.leases[offset].attempt + 1
                token = secrets.token_hex(6)
                state.leases[offset] = _Lease(token, now + invisible, attempt)
                out.append((message, encode_handle(self.broker, queue_id, offset, token),
                            attempt))
            self._commit(queue_id, state)
        self._rr = (self._rr + 1) % max(n, 1)
        return out

    def _lease(self, handle: str) -> Tuple[int, int, _Lease, _QueueState]:
        broker, queue_id, offset, token = decode_handle(handle)
        if broker != self.broker:
            raise InvalidHandle("the receipt handle is for another broker")
        state = self._queues.get(queue_id)
        lease = state.leases.get(offset) if state else None
        if lease is None or lease.token != token:
            raise InvalidHandle("the receipt handle is outdated (acknowledged, or delivered "
                                "again after its invisible duration)")
        return queue_id, offset, lease, state

    def ack(self, handle: str) -> None:
        queue_id, offset, _lease, state = self._lease(handle)
        del state.leases[offset]
        self._commit(queue_id, state)

    def change_invisible(self, handle: str, invisible: float) -> str:
        queue_id, offset, lease, _state = self._lease(handle)
        lease.token = secrets.token_hex(6)
        lease.deadline = time.monotonic() + invisible
        return encode_handle(self.broker, queue_id, offset, lease.token)

    def _commit(self, queue_id: int, state: _QueueState) -> None:
        committed = min(state.leases, default=state.next_offset)
        if committed != self.store.query_offset(self.group, self.topic, queue_id):
            self.store.commit_offset(self.group, self.topic, queue_id, committed)


def _tag_code(message: MessageExt) -> int:
    tags = message.tags
    return java_string_hash(tags) if tags else 0


def tag_filter(expression: definition.FilterExpression) -> Optional[frozenset]:
    """Tag hash codes a TAG expression selects; None selects everything. SQL is refused."""
    if expression.type == definition.SQL:
        raise ValueError("SQL92 filtering is not supported by the embedded proxy")
    tags = split_tags_expression(expression.expression)
    return frozenset(java_string_hash(t) for t in tags) if tags else None


def message_type(props: Dict[str, str]) -> int:
    if props.get("TRAN_MSG") == "true":
        return definition.TRANSACTION
    if props.get(SHARDING_KEY):
        return definition.FIFO
    if any(k in props for k in (DELAY, TIMER_DELIVER_MS, "TIMER_DELAY_SEC",
                                "__STARTDELIVERTIME")):
        return definition.DELAY
    return definition.NORMAL


def to_proto(message: MessageExt, handle: str, attempt: int,
             invisible: float) -> definition.Message:
    """A stored message as the proxy hands it to a consumer."""
    props = message.properties
    body = message.body  # decompressed: handed out with IDENTITY encoding
    system = definition.SystemProperties(
        message_id=message.msg_id,
        body_digest=definition.Digest(type=definition.CRC32,
                                      checksum=f"{zlib.crc32(body) & 0xFFFFFFFF:08X}"),
        body_encoding=definition.IDENTITY, message_type=message_type(props),
        born_host=message.born_host, store_host=message.store_host, receipt_handle=handle,
        queue_id=message.queue_id, queue_offset=message.queue_offset,
        delivery_attempt=attempt)
    system.born_timestamp.FromMilliseconds(message.born_timestamp)
    system.store_timestamp.FromMilliseconds(message.store_timestamp)
    system.invisible_duration.FromMilliseconds(int(invisible * 1000))
    if message.tags:
        system.tag = message.tags
    if message.keys:
        system.keys.extend(k for k in message.keys.split(" ") if k)
    if props.get(TIMER_DELIVER_MS, "").isdigit():
        system.delivery_timestamp.FromMilliseconds(int(props[TIMER_DELIVER_MS]))
    if props.get(SHARDING_KEY):
        system.message_group = props[SHARDING_KEY]
    if props.get(TRACE_CONTEXT):
        system.trace_context = props[TRACE_CONTEXT]
    out = definition.Message(topic=definition.Resource(name=message.topic),
                             system_properties=system, body=body)
    out.user_properties.update({k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES})
    return out
