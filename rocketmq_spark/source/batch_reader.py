"""``spark.read.format("rocketmq")``: one bounded read of every queue's range."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator, List

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .connect import shared_admin
from .offset_reader import OffsetReader
from .options import SourceOptions
from .partitions import RocketMQPartition, to_partitions
from .planning import pack, ranges

if TYPE_CHECKING:
    import pyarrow as pa

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
        groups = pack(ranges(start, end), self.options.min_partitions)
        log.info("batch read of %d queues in %d partitions, %d messages", len(queues),
                 len(groups), sum(r.size for g in groups for r in g))
        return to_partitions(groups, discovery.addresses)

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        if not isinstance(partition, RocketMQPartition):
            # Nothing to read (an empty or unknown topic): when partitions() is empty, Spark
            # still runs one task, with a bare InputPartition(None).
            return iter(())
        from .partition_reader import read_partition  # executors only: pyarrow, numpy, C

        return read_partition(self.options, partition)
