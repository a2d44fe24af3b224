"""``spark.readStream.format("rocketmq")``: planning micro-batches on the driver.

Spark runs every method here but ``read`` on one long-lived instance in its streaming-source
runner process; ``read`` runs in executors on a freshly unpickled copy. So the driver state
(clients, caches) is made lazily and left out of the pickle.

Batch 0 and its replay. Spark keeps no start offset for batch 0: a replay of batch 0 asks
:meth:`initialOffset` again. A start resolved from "latest", a timestamp or the group's
offsets would move. So :meth:`initialOffset` returns ``{}`` ("not resolved yet"), and the first
:meth:`latestOffset` resolves the start and returns it as the *end* of batch 0, which Spark
writes to its offset log before anything runs. Batch 0 reads nothing; batch 1 starts at the
pinned position, replays included.

Offsets go back to the broker for the consumer group from :meth:`latestOffset` as well as
:meth:`commit`: Spark calls ``latestOffset(start)`` only once the batch that ended at
``start`` is complete, and calls ``commit`` one batch late (never for the last batch of an
AvailableNow run).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)

from ..client.broker import Subscription
from ..client.errors import RocketMQError
from ..client.protocol.route import MessageQueue
from .connect import shared_admin
from .offset_reader import OffsetReader
from .offsets import UNRESOLVED, from_offset, to_offset
from .options import SourceOptions
from .partitions import RocketMQPartition, to_partitions
from .planning import next_end, pack, ranges

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0


class _Driver:
    """What the runner process keeps between calls: clients, caches, the AvailableNow target
    and what was last committed to the broker."""

    def __init__(self, options: SourceOptions):
        self.admin = shared_admin(options)
        self.offsets = OffsetReader(options, self.admin)
        self.target: Optional[Dict[MessageQueue, int]] = None
        self.committed: Optional[Dict[str, int]] = None
        self.heartbeat_at = 0.0
        self.last_start: Optional[dict] = None


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._driver: Optional[_Driver] = None

    def __getstate__(self):
        return {"options": self.options, "_driver": None}

    @property
    def driver(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.options)
        return self._driver

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        return dict(UNRESOLVED)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        offsets = self.driver.offsets
        queues = offsets.discover(force=True).queues
        self.driver.target = offsets.max_offsets(queues, fresh=True)
        log.info("AvailableNow: reading up to %d messages in %d queues",
                 sum(self.driver.target.values()), len(queues))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        driver = self.driver
        offsets = driver.offsets
        discovery = offsets.discover()
        if start == UNRESOLVED:
            return to_offset(offsets.resolve(self.options.starting, discovery.queues))
        current = from_offset(start)
        self._commit_to_group(start, current)
        new_queues = [mq for mq in discovery.queues if mq not in current]
        new_start = offsets.min_offsets(new_queues) if new_queues else {}
        # A new start means a batch just ended: what arrived meanwhile is due now, so the
        # cached max offsets (good for the idle polls that follow) are refreshed.
        fresh = start != driver.last_start
        driver.last_start = start
        latest = offsets.max_offsets(discovery.queues, fresh=fresh)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = next_end(current, discovery.queues, discovery.why_missing, latest, new_start,
                       self.options.fail_on_data_loss, max_rows, driver.target)
        return to_offset(end)

    def reportLatestOffset(self) -> Optional[dict]:
        cached = self.driver.offsets.cached_max_offsets()
        return to_offset(cached) if cached else None

    # ------------------------------------------------------------------ batches

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        if start == UNRESOLVED:
            return []  # batch 0 only pins the starting position
        begin, finish = from_offset(start), from_offset(end)
        for mq, offset in begin.items():
            if mq in finish and finish[mq] < offset:
                log.warning("queue %s restarts at %d below %d; the messages in between were "
                            "lost", mq.key, finish[mq], offset)
        groups = pack(ranges(begin, finish), self.options.min_partitions)
        return to_partitions(groups, self.driver.offsets.discover().addresses)

    def read(self, partition: RocketMQPartition) -> Iterator["pa.RecordBatch"]:
        from .partition_reader import read_partition  # executors only: pyarrow, numpy, C

        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        if end != UNRESOLVED:
            self._commit_to_group(end, from_offset(end))

    def stop(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None and self.options.commits_to_group:
            for address in set(driver.offsets.discover().addresses.values()):
                try:
                    driver.admin.brokers.unregister_client(
                        address, consumer_group=self.options.consumer_group)
                except RocketMQError as exc:
                    log.info("unregister from %s failed: %s", address, exc)

    # ------------------------------------------------------------------ group offsets

    def _commit_to_group(self, offset: dict, positions: Dict[MessageQueue, int]) -> None:
        """Store a completed batch's end as the group's offsets, so RocketMQ's own tools show
        the query's lag. Best effort: Spark's checkpoint stays the source of truth."""
        if not self.options.commits_to_group or not positions:
            return
        driver = self.driver
        if driver.committed == offset:
            return
        failed = driver.admin.commit_offsets(self.options.consumer_group, positions)
        for mq, error in sorted(failed.items())[:3]:
            log.warning("could not commit the offset of %s for group %s: %s", mq.key,
                        self.options.consumer_group, error)
        if not failed:
            driver.committed = dict(offset)
        now = time.monotonic()
        if now - driver.heartbeat_at >= HEARTBEAT_SECONDS:
            driver.heartbeat_at = now
            subscriptions = [Subscription(t, self.options.filter)
                             for t in sorted({mq.topic for mq in positions})]
            for address in set(driver.offsets.discover().addresses.values()):
                try:
                    driver.admin.brokers.heart_beat(address, self.options.consumer_group,
                                                    subscriptions)
                except RocketMQError as exc:
                    log.info("heartbeat to %s failed: %s", address, exc)
