"""What the driver hands to each Spark task: queue slices. Light on imports, because Spark
pickles these in its planning worker before any data is read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

from pyspark.sql.datasource import InputPartition

from ..client.protocol.route import MessageQueue
from .planning import QueueRange


@dataclass(frozen=True)
class QueueSlice:
    """``[start, end)`` of one queue. ``address`` is the master the driver saw when it planned
    the batch, which saves each task a route lookup (a stale one is refreshed)."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    address: Optional[str] = None

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True)
class RocketMQPartition(InputPartition):
    """The slices one Spark task reads, in order (usually one; several small ones are packed
    together because every Python task costs Spark tens of milliseconds)."""

    slices: Tuple[QueueSlice, ...]


def to_partitions(groups: List[List[QueueRange]], addresses: Mapping[str, str]
                  ) -> List[RocketMQPartition]:
    return [RocketMQPartition(tuple(
        QueueSlice(r.queue.topic, r.queue.broker_name, r.queue.queue_id, r.start, r.end,
                   addresses.get(r.queue.broker_name)) for r in group)) for group in groups]
