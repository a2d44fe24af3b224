"""``spark.readStream.format("rocketmq")``: planning micro-batches on the driver.

Spark runs every method here but ``read`` on one long-lived instance in its streaming-source
runner process; ``read`` runs in executors on a freshly unpickled copy. So what the runner
keeps (:class:`_RunnerState`: clients, caches) is made lazily and left out of the pickle.

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

With ``membership=group`` the query is one member of its consumer group
(:mod:`..client.group.membership`): an offset then holds only the queues this member reads, a queue
that leaves drops out of the next offset, and one that joins enters it with an empty range at the
group's committed offset. :meth:`partitions` needs no change: it reads each queue of ``end``
from its position in ``start``, and a queue new to ``end`` has nothing to read yet.

Spark 4.0 and 4.1 lack admission control: Spark calls ``latestOffset()`` without a start or a
limit, and runs Trigger.AvailableNow as a single micro-batch. :class:`LegacyStreamReader` then
keeps the start itself (the end of the last batch Spark planned, which ``partitions`` sees,
restarts included: Spark announces a checkpoint's last offset as ``partitions(end, end)``),
applies ``maxMessagesPerTrigger`` itself, and reads a queue in the batch it enters, batch 0
included, from the position recorded in that batch's end offset (``entering``, :mod:`.offsets`),
so that a single-batch AvailableNow run reads what was there when it started.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .. import spark_compat
from ..client.broker import Subscription
from ..client.errors import RocketMQError
from ..client.protocol.route import MessageQueue
from .connect import client_config, shared_admin
from .filter_check import check_brokers_filter
from ..client.group.membership import GroupMember, member_client_id
from .offset_reader import OffsetReader
from .offsets import UNRESOLVED, entries_of, from_offset, is_unresolved, to_offset
from .options import Bound, SourceOptions
from .partitions import RocketMQPartition, to_partitions
from .planning import next_end, pack, ranges

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0


class _RunnerState:
    """What Spark's streaming-source runner process keeps between calls: clients, caches, the
    AvailableNow target and what was last committed to the broker; with ``membership=group``,
    the group member."""

    def __init__(self, options: SourceOptions):
        self.member: Optional[GroupMember] = None
        if options.group_member:
            # The member's own client: its id names this run in the group.
            config = dataclasses.replace(client_config(options),
                                         client_id=member_client_id(options.member_name))
            self.member = GroupMember(
                list(options.name_servers), config, options.consumer_group,
                lambda: self.offsets.topics(), self.joining_start_positions,
                strategy=options.allocate_strategy,
                virtual_nodes=options.consistent_hash_virtual_nodes,
                rooms=options.machine_rooms, lock_queues=options.lock_queues,
                expression=options.filter, interval=options.rebalance_interval_ms / 1000.0,
                expression_type=options.filter_type, sub_version=options.filter_version)
            self.admin = self.member.admin
            self.offsets = OffsetReader(options, self.admin)
        else:
            self.admin = shared_admin(options)
            self.offsets = OffsetReader(options, self.admin)
        self.options = options
        self.target: Optional[Dict[MessageQueue, int]] = None
        self.allowed: Optional[set] = None  # AvailableNow: the queues allocated at its start
        self.committed: Optional[Dict[str, int]] = None
        self.heartbeat_at = 0.0
        self.last_start: Optional[dict] = None
        # Spark without admission control: the end of the last batch planned, and whether a
        # latestOffset() was answered before that was known (see LegacyStreamReader).
        self.planned_end: Optional[dict] = None
        self.answered_blind = False
        self.others_warned: frozenset = frozenset()  # membership=none: other members seen

    def joining_start_positions(self, queues: List[MessageQueue], first: bool
                                ) -> Dict[MessageQueue, int]:
        """Where queues that join with no offset in the group start: ``startingOffsets`` in
        the query's first batch (a per-queue JSON start gives the queues it names), else at
        their first message, as queues new to a stream do (a queue added to the topic is
        allocated at the next rebalance, seconds after its first messages)."""
        bound = self.options.starting if first else Bound("earliest")
        if bound.kind in ("offsets", "timestamps"):
            named = [mq for mq in queues if mq in bound.per_queue]
            out = self.offsets.resolve(Bound(bound.kind, {mq: bound.per_queue[mq]
                                                          for mq in named}), named)
            rest = [mq for mq in queues if mq not in bound.per_queue]
            out.update(self.offsets.resolve(Bound("earliest"), rest))
            return out
        return self.offsets.resolve(bound, queues)


class _StreamReader(DataSourceStreamReader):
    """What every Spark version shares; the subclasses answer ``latestOffset``."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._runner: Optional[_RunnerState] = None

    def __getstate__(self):
        return {"options": self.options, "_runner": None}

    @property
    def runner(self) -> _RunnerState:
        if self._runner is None:
            self._runner = _RunnerState(self.options)
        return self._runner

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        return dict(UNRESOLVED)

    def reportLatestOffset(self) -> Optional[dict]:
        cached = self.runner.offsets.cached_max_offsets()
        member = self.runner.member
        if member is not None:
            cached = {mq: v for mq, v in cached.items() if mq in member.held}
        return to_offset(cached) if cached else None

    def _plan(self, start: dict, max_rows: Optional[int], read_entering: bool) -> dict:
        """The end of the batch that starts at ``start``. ``read_entering``: queues that enter
        (all of them in batch 0) are read from their entry position in this batch, recorded
        in the end offset; otherwise they enter with an empty range."""
        runner = self.runner
        if runner.member is not None:
            return self._member_latest(runner, start, max_rows, read_entering)
        offsets = runner.offsets
        discovery = offsets.discover()
        if is_unresolved(start):
            entering = offsets.resolve(self.options.starting, discovery.queues)
            if not read_entering:
                return to_offset(entering)
            current: Dict[MessageQueue, int] = {}
        else:
            current = from_offset(start)
            self._commit_to_group(start, current)
            new_queues = [mq for mq in discovery.queues if mq not in current]
            entering = offsets.min_offsets(new_queues) if new_queues else {}
        # A new start means a batch just ended: what arrived meanwhile is due now, so the
        # cached max offsets (good for the idle polls that follow) are refreshed.
        fresh = start != runner.last_start
        runner.last_start = start
        latest = offsets.max_offsets(discovery.queues, fresh=fresh)
        if not read_entering:
            return to_offset(next_end(current, discovery.queues, discovery.why_missing, latest,
                                      entering, self.options.fail_on_data_loss, max_rows,
                                      runner.target))
        return _end_reading_entering(current, entering, discovery.queues, discovery.why_missing,
                                     latest, self.options.fail_on_data_loss, max_rows)

    # ------------------------------------------------------------------ batches

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        runner = self.runner
        if start == end and runner.answered_blind and not is_unresolved(start):
            raise RuntimeError(
                f"Spark {spark_compat.SPARK_VERSION} asked the rocketmq source for its latest "
                "offset before telling it where the checkpoint stands, as its Trigger."
                "AvailableNow wrapper does (spark.sql.streaming.triggerAvailableNowWrapper."
                "enabled=true). The answer could go back before the checkpoint, so the query "
                "stops here, before reading. Leave that setting off: on this Spark, "
                "Trigger.AvailableNow then runs one micro-batch that reads everything "
                "available when it starts.")
        runner.planned_end = end
        entering = entries_of(end)
        if is_unresolved(start) and not entering:
            return []  # batch 0 only pins the starting position
        begin, finish = from_offset(start), from_offset(end)
        for mq, offset in entering.items():
            begin.setdefault(mq, offset)
        for mq, offset in begin.items():
            if mq in finish and finish[mq] < offset:
                log.warning("queue %s restarts at %d below %d; the messages in between were "
                            "lost", mq.key, finish[mq], offset)
        groups = pack(ranges(begin, finish), self.options.min_partitions)
        addresses = runner.offsets.discover().addresses
        check_brokers_filter(self.options, runner.admin, groups, addresses)
        return to_partitions(groups, addresses)

    def read(self, partition: RocketMQPartition) -> Iterator["pa.RecordBatch"]:
        from .partition_reader import read_partition  # executors only: pyarrow, numpy, C

        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        if is_unresolved(end):
            return
        if self.runner.member is not None:
            self.runner.member.commit(from_offset(end))
            return
        self._commit_to_group(end, from_offset(end))

    def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None and runner.member is not None:
            runner.member.leave("the query stopped")
            return
        if runner is not None and self.options.commits_to_group:
            for address in set(runner.offsets.discover().addresses.values()):
                try:
                    runner.admin.brokers.unregister_client(
                        address, consumer_group=self.options.consumer_group)
                except RocketMQError as exc:
                    log.info("unregister from %s failed: %s", address, exc)

    # ------------------------------------------------------------------ group membership

    def _member_latest(self, runner: _RunnerState, start: dict, max_rows: Optional[int],
                       read_entering: bool) -> dict:
        """The next end for a group member: the queues it holds after the latest rebalance
        (see :meth:`GroupMember.apply_allocation`), moved on as :func:`next_end` moves any
        queue."""
        member = runner.member
        member.start()
        if member.left:
            return start  # an AvailableNow run that finished: nothing more to plan
        current = from_offset(start)
        share = member.apply_allocation(current, runner.allowed, first=is_unresolved(start))
        owned = set(share.kept) | set(share.entering)
        discovery = runner.offsets.discover()
        routed = [mq for mq in discovery.queues if mq in owned]
        fresh = start != runner.last_start
        runner.last_start = start
        latest = runner.offsets.max_offsets(routed, fresh=fresh) if routed else {}
        if read_entering:
            entering = {mq: v for mq, v in share.entering.items() if mq in set(routed)}
            end = _end_reading_entering(share.kept, entering, routed, discovery.why_missing,
                                        latest, self.options.fail_on_data_loss, max_rows)
            unplanned = set(share.entering) - set(entering)
        else:
            end = to_offset(next_end(share.kept, routed, discovery.why_missing, latest,
                                     share.entering, self.options.fail_on_data_loss, max_rows,
                                     runner.target))
            unplanned = set(share.entering) - set(from_offset(end))
        if unplanned:  # no route to it yet: it joins later
            member.drop(unplanned)
        if runner.target is not None and from_offset(end) == share.kept \
                and not share.entering:
            # AvailableNow drained what it was given: hand the queues back now (the batch
            # that ended at ``start`` is complete and committed).
            member.leave("Trigger.AvailableNow drained its queues", close=False)
        return end

    @staticmethod
    def _join_for_available_now(runner: _RunnerState) -> set:
        """Join, and wait a little for the locks of the queues allocated to us (a member that
        is handing them over releases them after its running batch); returns the queues this
        run drains."""
        member = runner.member
        member.start()
        allowed, missing = member.share(wait=min(30.0, 2 * member.interval))
        for mq in sorted(missing)[:5]:
            log.warning("AvailableNow: %s stays locked by another member of %s; this run "
                        "does not read it", mq.key, member.group)
        return allowed

    # ------------------------------------------------------------------ group offsets

    def _commit_to_group(self, offset: dict, positions: Dict[MessageQueue, int]) -> None:
        """Store a completed batch's end as the group's offsets, so RocketMQ's own tools show
        the query's lag. Best effort: Spark's checkpoint stays the source of truth."""
        if not self.options.commits_to_group or not positions:
            return
        runner = self.runner
        if runner.committed == offset:
            return
        failed = runner.admin.commit_offsets(self.options.consumer_group, positions)
        for mq, error in sorted(failed.items())[:3]:
            log.warning("could not commit the offset of %s for group %s: %s", mq.key,
                        self.options.consumer_group, error)
        if not failed:
            runner.committed = dict(offset)
        now = time.monotonic()
        if now - runner.heartbeat_at >= HEARTBEAT_SECONDS:
            runner.heartbeat_at = now
            subscriptions = [Subscription(t, self.options.filter, self.options.filter_type,
                                          self.options.filter_version)
                             for t in sorted({mq.topic for mq in positions})]
            addresses = sorted(set(runner.offsets.discover().addresses.values()))
            for address in addresses:
                try:
                    runner.admin.brokers.heart_beat(address, self.options.consumer_group,
                                                    subscriptions)
                except RocketMQError as exc:
                    log.info("heartbeat to %s failed: %s", address, exc)
            if addresses:
                self._warn_if_group_is_shared(runner, addresses[0])

    def _warn_if_group_is_shared(self, runner: _RunnerState, address: str) -> None:
        """With ``membership=none`` the query reads every queue, yet its heartbeat makes it a
        member in the eyes of the group's other consumers: they leave it a share of the queues,
        which they then never read. Say so (once per set of other members)."""
        try:
            members = runner.admin.brokers.get_consumer_list_by_group(
                address, self.options.consumer_group)
        except RocketMQError as exc:
            log.info("cannot list the members of %s: %s", self.options.consumer_group, exc)
            return
        others = frozenset(members) - {runner.admin.remoting.config.client_id}
        if others and others != runner.others_warned:
            log.warning(
                "consumer group %s has %d other member(s) (%s). This query reads every queue "
                "of its subscription (membership=none) and only commits its offsets to the "
                "group, but the other members count it when they share the queues, so the "
                "share they leave to it goes unread by them. Use membership=group to share "
                "the group's queues with them, or give this query a consumer group of its own.",
                self.options.consumer_group, len(others), ", ".join(sorted(others)[:5]))
        runner.others_warned = others


def _end_reading_entering(kept: Dict[MessageQueue, int], entering: Dict[MessageQueue, int],
                          routed: List[MessageQueue], why_missing,
                          latest: Dict[MessageQueue, int], fail_on_data_loss: bool,
                          max_rows: Optional[int]) -> dict:
    """The next end when entering queues are read at once: they plan like the others from
    their entry position (a cached max offset below it is stale, not a reset), and the end
    offset records those positions."""
    latest = dict(latest)
    for mq, offset in entering.items():
        if mq in latest:
            latest[mq] = max(latest[mq], offset)
    end = next_end({**kept, **entering}, routed, why_missing, latest, {}, fail_on_data_loss,
                   max_rows)
    return to_offset(end, entering)


def _unless_unchanged(start: dict, end: dict) -> dict:
    """``start`` itself when ``end`` moves no queue: the very text Spark holds, so no empty
    batch, also when ``start`` is in an earlier release's offset shape."""
    if not is_unresolved(start) and from_offset(end) == from_offset(start) \
            and not entries_of(end):
        return start
    return end


class LegacyStreamReader(_StreamReader):
    """The reader for Spark without admission control (4.0, 4.1): ``latestOffset()`` gets
    neither a start nor a limit (see the module doc)."""

    def latestOffset(self) -> dict:
        runner = self.runner
        start = runner.planned_end
        if start is None:  # a first start, or Spark's AvailableNow wrapper (see partitions)
            runner.answered_blind = True
            start = dict(UNRESOLVED)
        end = self._plan(start, self.options.max_messages_per_trigger, read_entering=True)
        return _unless_unchanged(start, end)


if spark_compat.ADMISSION_CONTROL and spark_compat.TRIGGER_AVAILABLE_NOW:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
    )

    class AdmissionControlStreamReader(_StreamReader, SupportsTriggerAvailableNow):
        """The reader for Spark 4.2+: ``latestOffset(start, limit)`` with admission control
        (``maxMessagesPerTrigger`` is the default read limit) and Trigger.AvailableNow."""

        def getDefaultReadLimit(self) -> ReadLimit:
            n = self.options.max_messages_per_trigger
            return ReadMaxRows(n) if n else ReadAllAvailable()

        def prepareForTriggerAvailableNow(self) -> None:
            runner = self.runner
            offsets = runner.offsets
            if runner.member is not None:
                runner.allowed = self._join_for_available_now(runner)
                queues = sorted(runner.allowed)
                runner.target = offsets.max_offsets(queues, fresh=True) if queues else {}
                log.info("AvailableNow: member %s reads up to %d messages in %d queue(s)",
                         runner.member.client_id, sum(runner.target.values()), len(queues))
                return
            queues = offsets.discover(force=True).queues
            runner.target = offsets.max_offsets(queues, fresh=True)
            log.info("AvailableNow: reading up to %d messages in %d queues",
                     sum(runner.target.values()), len(queues))

        def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            return _unless_unchanged(start, self._plan(start, max_rows, read_entering=False))

    RocketMQStreamReader: type = AdmissionControlStreamReader
else:
    RocketMQStreamReader = LegacyStreamReader
