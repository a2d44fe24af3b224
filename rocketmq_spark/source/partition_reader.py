"""The executor side: the queue slices of a partition, read into Spark rows."""
from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..client.namespace import unwrap
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
        expression_type=options.filter_type, sub_version=options.filter_version,
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
            out = to_spark_batch(batch, piece.broker_name, options.include_properties)
            yield topics_without_namespace(out, options.namespace) if options.namespace else out
        if reader.lost_ranges:
            log.warning("skipped %d lost messages of %s in [%d, %d): %s "
                        "(failOnDataLoss=false)", reader.lost_messages, piece.queue.key,
                        piece.start, piece.end, reader.lost_ranges)


def topics_without_namespace(batch: pa.RecordBatch, namespace: str) -> pa.RecordBatch:
    """``batch`` with its ``topic`` column out of ``namespace`` (``ns%T`` -> ``T``), as Java's
    consumer hands messages over: each distinct name is unwrapped once, not each row."""
    index = batch.schema.get_field_index("topic")
    topics = batch.column(index)
    encoded = pc.dictionary_encode(topics)
    names = encoded.dictionary.to_pylist()
    plain = [unwrap(t, namespace) if t is not None else None for t in names]
    if plain == names:
        return batch
    column = pa.array(plain, topics.type).take(encoded.indices)
    return batch.set_column(index, batch.schema.field(index), column)
