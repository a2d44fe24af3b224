"""``spark.read.format("rocketmq")``: one bounded read of every queue's range, narrowed by the
filters Spark pushes down (Spark 4.1+, ``spark.sql.python.filterPushdown.enabled``)."""
from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, Iterator, List

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .. import spark_compat
from ..client.namespace import unwrap
from ..client.protocol.route import MessageQueue
from .connect import shared_admin
from .filter_check import check_brokers_filter
from .offset_reader import OffsetReader
from .options import Bound, SourceOptions
from .partitions import RocketMQPartition, to_partitions
from .planning import pack, ranges
from .pushdown import ReadPlan, sql92_with_tags, translate

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# The planning worker in which Spark calls pushFilters (4.1+): there the flag is on.
PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


class RocketMQBatchReader(DataSourceReader):
    """Reads what the options give; ``plan`` narrows it (set by :meth:`PushdownBatchReader.
    pushFilters`, nothing pushed otherwise)."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self.plan = ReadPlan()

    def partitions(self) -> List[InputPartition]:
        offsets = OffsetReader(self.options, shared_admin(self.options))
        discovery = offsets.discover(force=True)
        plan = self.plan
        namespace = self.options.namespace
        queues = [mq for mq in discovery.queues if plan.keeps(mq, unwrap(mq.topic, namespace))]
        if plan.reads_nothing or not queues:
            log.info("batch read of nothing: the pushed filters (%s) leave none of %d queues",
                     plan.describe(), len(discovery.queues))
            return []
        start = _resolve(offsets, self.options.starting, discovery.queues, queues, False)
        end = _resolve(offsets, self.options.ending, discovery.queues, queues, True)
        start, end = plan.cut(start, end)
        if plan.by_time:
            start, end = _cut_by_time(offsets, plan, start, end)
        groups = pack(ranges(start, end), self.options.min_partitions)
        log.info("batch read of %d queues in %d partitions, %d messages (pushed down: %s)",
                 len(queues), len(groups), sum(r.size for g in groups for r in g),
                 plan.describe())
        check_brokers_filter(self.options, offsets.admin, groups, discovery.addresses)
        return to_partitions(groups, discovery.addresses)

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        if not isinstance(partition, RocketMQPartition):
            # Nothing to read (an empty or unknown topic): when partitions() is empty, Spark
            # still runs one task, with a bare InputPartition(None).
            return iter(())
        from .partition_reader import read_partition  # executors only: pyarrow, numpy, C

        return read_partition(self.options, partition)


class PushdownBatchReader(RocketMQBatchReader):
    """The batch reader with ``pushFilters``: handed out only where Spark calls it, because
    Spark 4.1-4.3 refuse a reader that has it while the flag is off
    (DATA_SOURCE_PUSHDOWN_DISABLED), though Spark filtering what it reads is right for us."""

    def pushFilters(self, filters: List) -> List:
        sql92 = self.options.filter_type == "SQL92"
        plan, keep = translate(filters, tag_filter_exact=not sql92)
        if not sql92:
            plan = plan.with_tags(self.options.tags)
        self.plan = plan
        if plan.tags and not plan.reads_nothing:
            self.options = replace(self.options, filter=(
                sql92_with_tags(self.options.filter, plan.tags) if sql92
                else " || ".join(sorted(plan.tags))))
        log.info("pushed down: %s; left to Spark: %d of %d filters", plan.describe(),
                 len(keep), len(filters))
        return keep


def batch_reader(options: SourceOptions) -> RocketMQBatchReader:
    """The reader for ``spark.read``: with ``pushFilters`` where Spark is about to call it."""
    if spark_compat.FILTER_PUSHDOWN and in_pushdown_worker():
        return PushdownBatchReader(options)
    return RocketMQBatchReader(options)


def in_pushdown_worker() -> bool:
    """Whether this process is Spark's filter-pushdown planning worker (forked from its
    daemon, which imported the module, or run as ``python -m``). Spark starts that worker only
    when ``spark.sql.python.filterPushdown.enabled`` is on and a filter can be pushed; every
    other read is planned in ``plan_data_source_read``, which never calls pushFilters."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return PUSHDOWN_WORKER in sys.modules or getattr(spec, "name", None) == PUSHDOWN_WORKER


def _resolve(offsets: OffsetReader, bound: Bound, routed: List[MessageQueue],
             kept: List[MessageQueue], is_end: bool) -> Dict[MessageQueue, int]:
    """A bound's offsets for the kept queues. A per-queue bound is checked against every
    routed queue first (it must name them all, pruned or not)."""
    if bound.kind in ("offsets", "timestamps") and len(kept) < len(routed):
        every = offsets.resolve(bound, routed, is_end=is_end)
        return {mq: every[mq] for mq in kept}
    return offsets.resolve(bound, kept, is_end=is_end)


def _cut_by_time(offsets: OffsetReader, plan: ReadPlan, start: Dict[MessageQueue, int],
                 end: Dict[MessageQueue, int]):
    """Each non-empty range narrowed to the offsets of the store-time window (a search by
    time per queue and bound, as startingTimestamp and endingTimestamp resolve)."""
    for mq in sorted(start):
        if start[mq] >= end.get(mq, start[mq]):
            continue
        if plan.since_ms is not None:
            start[mq] = max(start[mq], offsets.offset_for_time(mq, max(plan.since_ms, 0)))
        if plan.until_ms is not None and start[mq] < end[mq]:
            end[mq] = min(end[mq], offsets.offset_for_time(mq, max(plan.until_ms, 0)))
    return start, end
