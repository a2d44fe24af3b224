"""The executor side: the queue slices of a partition, read into Spark rows."""
from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa

from ..client.protocol.route import MessageQueue
from ..client.reader import QueueRangeReader, ReadSettings
from .arrow import to_spark_batch
from .connect import shared_admin
from .options import SourceOptions
from .partitions import RocketMQPartition

log = logging.getLogger(__name__)


def read_settings(options: SourceOptions) -> ReadSettings:
    return ReadSettings(
        consumer_group=options.consumer_group, subscription=options.filter,
        max_msg_nums=options.pull_batch_size, pull_timeout=options.pull_timeout_ms / 1000.0,
        fail_on_data_loss=options.fail_on_data_loss, verify_crc=options.verify_crc,
        properties=options.include_properties, offset_ids=False,
        busy_timeout=options.broker_busy_timeout_ms / 1000.0)


def read_partition(options: SourceOptions, partition: RocketMQPartition
                   ) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the Spark schema for one partition (a bounded number of rows each)."""
    admin = shared_admin(options)
    settings = read_settings(options)
    for piece in partition.slices:
        hint = piece.address

        def resolve(mq: MessageQueue, broker_id: int, refresh: bool) -> str:
            if hint and broker_id == 0 and not refresh:
                return hint
            return admin.address(mq, broker_id, refresh)

        reader = QueueRangeReader(admin.brokers, resolve, piece.queue, piece.start, piece.end,
                                  settings)
        for batch in reader:
            yield to_spark_batch(batch, piece.broker_name, options.include_properties)
        if reader.lost_ranges:
            log.warning("skipped %d lost messages of %s in [%d, %d): %s "
                        "(failOnDataLoss=false)", reader.lost_messages, piece.queue.key,
                        piece.start, piece.end, reader.lost_ranges)
