"""The executor side: the queue slices of a partition, read into Spark rows."""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..client.namespace import unwrap
from ..client.protocol.route import MessageQueue
from ..client.read.reader import QueueRangeReader, ReadSettings
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
        retried = options.reads_retry_topic and piece.queue.topic == options.retry_topic
        queue_topic = unwrap(piece.queue.topic, options.namespace)  # as `topic` is named

        def resolve(mq: MessageQueue, broker_id: int, refresh: bool) -> str:
            if hint and broker_id == 0 and not refresh:
                return hint
            return admin.address(mq, broker_id, refresh)

        reader = QueueRangeReader(admin.brokers, resolve, piece.queue, piece.start, piece.end,
                                  retry_settings(settings) if retried else settings,
                                  is_master=admin.is_master)
        for batch in reader:
            if retried:
                batch = with_original_topics(batch)
            out = to_spark_batch(batch, piece.broker_name, options.include_properties,
                                 queue_topic)
            yield topics_without_namespace(out, options.namespace) if options.namespace else out
        if reader.lost_ranges:
            log.warning("skipped %d lost messages of %s in [%d, %d): %s "
                        "(failOnDataLoss=false)", reader.lost_messages, piece.queue.key,
                        piece.start, piece.end, reader.lost_ranges)


def retry_settings(settings: ReadSettings) -> ReadSettings:
    """How a member reads the group's retry queues: every message (Java's push consumer
    subscribes to its retry topic with ``*``, whatever its filter: what is there passed the
    group's filter when first delivered), with the properties that name the original topic."""
    return dataclasses.replace(settings, subscription="*", expression_type="TAG",
                               sub_version=0, properties=True)


# The value of the last non-empty RETRY_TOPIC property (Java's rule: a later duplicate wins,
# an empty value is no value); values run to the next \x02 and may hold \x01.
_RETRY_TOPIC = r"(?s)^(?:.*\x02)?RETRY_TOPIC\x01(?P<topic>[^\x02]+)"


def with_original_topics(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decoded rows of the group's retry topic under the topic they were first sent to, as
    Java's push consumer hands them over (``resetRetryAndNamespace``): the broker that took
    a message back kept that topic in its RETRY_TOPIC property. Rows without it keep the
    retry topic."""
    if not batch.num_rows:
        return batch
    index = batch.schema.get_field_index("topic")
    found = pc.struct_field(pc.extract_regex(batch.column("properties"), _RETRY_TOPIC), [0])
    topics = pc.if_else(pc.is_valid(found), found, batch.column(index))
    return batch.set_column(index, batch.schema.field(index), topics)


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
