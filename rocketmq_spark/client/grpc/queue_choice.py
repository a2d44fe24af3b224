"""Which queue the 5.x proxy stores a SendMessage call in (the client does not choose).

A call with exactly one message that has a message group goes to
``writable[consistent_hash(String.hashCode(group), len(writable))]`` (Guava's jump hash), so a
group keeps its queue while the queue count stays the same; any other call (several messages,
or none with a group) goes to the next queue round robin, all its messages together in order.
``writable`` is the topic's writable queues on master brokers, sorted as
:class:`~rocketmq_spark.client.protocol.route.MessageQueue` sorts.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

from ..protocol.properties import java_string_hash

_MASK64 = (1 << 64) - 1
_LCG_MULTIPLIER = 2862933555777941757

QueueT = TypeVar("QueueT")


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: a bucket in [0, buckets) that changes for
    only ~1/n of keys when ``buckets`` grows to n."""
    if buckets <= 0:
        raise ValueError(f"buckets must be positive, got {buckets}")
    state = key & _MASK64  # the key as Java's two's-complement long
    candidate = 0
    while True:
        state = (_LCG_MULTIPLIER * state + 1) & _MASK64
        # ((int) (state >>> 33) + 1) / 2^31, in double precision
        fraction = (_to_int32(state >> 33) + 1) / 2147483648.0
        jump = (candidate + 1) / fraction
        # Java's (int) cast of a double: truncation, clamped to the int range
        nxt = int(jump) if jump < 2147483647.0 else 2147483647
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


def queue_for_group(writable: Sequence[QueueT], group: str) -> QueueT:
    """The queue the proxy picks for a one-message call whose message group is ``group``."""
    if not writable:
        raise ValueError("the topic has no writable queue")
    return writable[consistent_hash(java_string_hash(group), len(writable))]
