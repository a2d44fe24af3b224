"""The executor side: one partition is one queue's offset range, read into Spark rows."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ..client.protocol.route import MessageQueue
from ..client.reader import QueueRangeReader, ReadSettings
from .arrow import to_spark_batch
from .connect import shared_admin
from .options import SourceOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RocketMQPartition(InputPartition):
    """Read ``[start, end)`` of one queue. ``address`` is the master the driver saw when it
    planned the batch, which saves each task a route lookup (a stale one is refreshed)."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    address: Optional[str] = None

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


def read_settings(options: SourceOptions) -> ReadSettings:
    return ReadSettings(
        consumer_group=options.consumer_group, subscription=options.filter,
        max_msg_nums=options.pull_batch_size, pull_timeout=options.pull_timeout_ms / 1000.0,
        fail_on_data_loss=options.fail_on_data_loss, verify_crc=options.verify_crc)


def read_partition(options: SourceOptions, partition: RocketMQPartition
                   ) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the Spark schema for one partition (a bounded number of rows each)."""
    admin = shared_admin(options)
    hint = partition.address

    def resolve(mq: MessageQueue, broker_id: int, refresh: bool) -> str:
        if hint and broker_id == 0 and not refresh:
            return hint
        return admin.address(mq, broker_id, refresh)

    reader = QueueRangeReader(admin.brokers, resolve, partition.queue, partition.start,
                              partition.end, read_settings(options))
    for batch in reader:
        yield to_spark_batch(batch, partition.broker_name, options.include_properties)
    if reader.lost_ranges:
        log.warning("skipped %d lost messages of %s in [%d, %d): %s (failOnDataLoss=false)",
                    reader.lost_messages, partition.queue.key, partition.start, partition.end,
                    reader.lost_ranges)
