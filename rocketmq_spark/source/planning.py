"""Micro-batch planning as pure functions: the next end offsets, fair admission limits, and
how offset ranges become Spark partitions. No network here, so every rule is unit-tested."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from ..client.protocol.route import MessageQueue
from ..client.errors import DataLossError

log = logging.getLogger(__name__)

Positions = Dict[MessageQueue, int]


@dataclass(frozen=True)
class QueueRange:
    queue: MessageQueue
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def next_end(start: Mapping[MessageQueue, int], routed: List[MessageQueue],
             why_missing, latest: Mapping[MessageQueue, int],
             new_queue_start: Mapping[MessageQueue, int], fail_on_data_loss: bool,
             max_rows: Optional[int] = None,
             target: Optional[Mapping[MessageQueue, int]] = None) -> Positions:
    """The end offsets of the next batch, from the ``start`` of it.

    * A routed queue moves to its ``latest`` offset; one whose broker did not answer keeps
      its offset (planned without it, not data loss).
    * A queue in ``start`` that is no longer routed keeps its offset when its broker is
      unreachable (``why_missing(mq) == "unreachable"``); when it vanished it is data loss.
    * A queue routed for the first time enters at ``new_queue_start`` with an empty range, so
      the next batch reads it from there (deterministic when a batch is replayed).
    * A latest offset below the start means the queue was reset: data loss.
    * ``max_rows`` is shared fairly between queues; ``target`` caps every queue
      (Trigger.AvailableNow).
    """
    routed_set = set(routed)
    end: Positions = {}
    for mq, offset in start.items():
        if mq not in routed_set:
            if why_missing(mq) == "vanished":
                _lose(fail_on_data_loss, mq, offset, None,
                      "the queue is gone from the topic's route while its broker is up")
                continue
            end[mq] = offset
            continue
        high = latest.get(mq)
        if high is None:
            end[mq] = offset  # broker unreachable now: no progress, no loss
        elif high < offset:
            _lose(fail_on_data_loss, mq, high, offset,
                  f"its max offset went back from at least {offset} to {high} (the queue was "
                  "recreated or truncated)")
            end[mq] = high
        else:
            end[mq] = high
    for mq in routed:
        if mq not in start and mq in new_queue_start:
            end[mq] = new_queue_start[mq]
    if target is not None:
        for mq in end:
            if mq in target and mq in start:
                end[mq] = max(start[mq], min(end[mq], target[mq]))
    if max_rows is not None:
        available = {mq: end[mq] - start[mq] for mq in end
                     if mq in start and end[mq] > start[mq]}
        caps = fair_caps(available, max_rows)
        for mq, cap in caps.items():
            end[mq] = start[mq] + cap
    return end


def _lose(fail: bool, mq: MessageQueue, start: int, end: Optional[int], reason: str) -> None:
    if fail:
        raise DataLossError(mq, start, end if end is not None else start, reason)
    log.warning("data loss on %s: %s; continuing because failOnDataLoss=false", mq.key, reason)


def fair_caps(available: Mapping[MessageQueue, int], limit: int) -> Dict[MessageQueue, int]:
    """Split ``limit`` messages over queues with that many ``available``: equal shares (within
    one message), and a queue that needs less than its share leaves the rest to the others.
    The split depends only on its inputs, so a replayed plan is the same plan."""
    caps: Dict[MessageQueue, int] = {}
    remaining = limit
    order = sorted(available, key=lambda mq: (available[mq], mq))  # smallest demand first
    for i, mq in enumerate(order):
        take = min(available[mq], remaining // (len(order) - i))
        caps[mq] = take
        remaining -= take
    for mq in sorted(order):  # whole shares leave a few messages over: one each, in order
        if remaining == 0:
            break
        if caps[mq] < available[mq]:
            caps[mq] += 1
            remaining -= 1
    return caps


def ranges(start: Mapping[MessageQueue, int], end: Mapping[MessageQueue, int]
           ) -> List[QueueRange]:
    """Non-empty ranges of a batch, in queue order."""
    out = []
    for mq in sorted(end):
        s = start.get(mq, end[mq])
        if end[mq] > s:
            out.append(QueueRange(mq, s, end[mq]))
    return out


def split(queue_ranges: List[QueueRange], min_partitions: Optional[int]) -> List[QueueRange]:
    """At least ``min_partitions`` ranges when there are that many messages: each range is cut
    into pieces in proportion to its size (largest remainders get the spare pieces), like
    Spark's Kafka source does with ``minPartitions``."""
    if not min_partitions or len(queue_ranges) >= min_partitions:
        return queue_ranges
    total = sum(r.size for r in queue_ranges)
    if total == 0:
        return queue_ranges
    quotas = [r.size * min_partitions / total for r in queue_ranges]
    pieces = [max(1, min(r.size, int(q))) for r, q in zip(queue_ranges, quotas)]
    spare = min_partitions - sum(pieces)
    by_remainder = sorted(range(len(queue_ranges)), key=lambda i: (pieces[i] - quotas[i], i))
    for i in by_remainder:
        if spare <= 0:
            break
        if pieces[i] < queue_ranges[i].size:
            pieces[i] += 1
            spare -= 1
    out = []
    for r, parts in zip(queue_ranges, pieces):
        step, extra = divmod(r.size, parts)
        offset = r.start
        for i in range(parts):
            size = step + (1 if i < extra else 0)
            out.append(QueueRange(r.queue, offset, offset + size))
            offset += size
    return out


PACK_MESSAGES = 4096


def pack(queue_ranges: List[QueueRange], min_partitions: Optional[int] = None,
         min_messages: int = PACK_MESSAGES) -> List[List[QueueRange]]:
    """Group ranges into partitions: each range alone once it holds ``min_messages`` or more,
    small ones together until a group does. A Python task costs Spark tens of milliseconds
    whatever it reads, so a trickle spread over many queues is read by one task instead of
    one per queue. With ``min_partitions`` the user asked for parallelism: ranges are split
    (see :func:`split`) and never packed."""
    if min_partitions:
        return [[r] for r in split(queue_ranges, min_partitions)]
    groups: List[List[QueueRange]] = []
    current: List[QueueRange] = []
    size = 0
    for r in queue_ranges:
        if r.size >= min_messages:
            groups.append([r])
            continue
        current.append(r)
        size += r.size
        if size >= min_messages:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups
