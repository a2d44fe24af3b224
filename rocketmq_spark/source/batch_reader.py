"""``spark.read.format("rocketmq")``: one bounded read of every queue's range."""
from __future__ import annotations

import logging
from typing import Iterator, List

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .connect import shared_admin
from .offset_reader import OffsetReader
from .options import SourceOptions
from .partition_reader import RocketMQPartition, read_partition
from .planning import ranges, split

log = logging.getLogger(__name__)


class RocketMQBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self) -> List[InputPartition]:
        offsets = OffsetReader(self.options, shared_admin(self.options))
        discovery = offsets.discover(force=True)
        queues = discovery.queues
        start = offsets.resolve(self.options.starting, queues)
        end = offsets.resolve(self.options.ending, queues, is_end=True)
        planned = split(ranges(start, end), self.options.min_partitions)
        log.info("batch read of %d queues in %d partitions, %d messages", len(queues),
                 len(planned), sum(r.size for r in planned))
        return [RocketMQPartition(r.queue.topic, r.queue.broker_name, r.queue.queue_id,
                                  r.start, r.end, discovery.addresses.get(r.queue.broker_name))
                for r in planned]

    def read(self, partition: RocketMQPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)
