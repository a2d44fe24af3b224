"""Read one queue's offset range [start, end) as Arrow batches: the executor's pull loop.

Every pull status is handled here and nowhere else:

* FOUND: keep the messages below ``end`` (and, with a tag filter, those whose TAGS string
  matches: brokers filter by hash code, so collisions get through; a SQL92 filter is the
  broker's alone, as in Java's clients), continue at nextBeginOffset. A filtered answer skips
  the offsets that did not match: a filter gap, never data loss.
* NO_MATCHED_MSG: a filtered window had no match; continue at nextBeginOffset at once.
* OFFSET_ILLEGAL: the offset is outside [min, max]. Below min, retention deleted messages: data
  loss. Above max, the queue was truncated or recreated: the rest of the range is gone.
* NO_NEW_MSG before ``end``: the broker has less than it reported when the range was planned.
  A master (a restart without its data): asked again for ``pull_timeout``, then data loss for
  what it no longer has. A slave (its master down, replication behind): its master holds the
  rest, so the reader waits for the master up to ``retry_deadline`` and then fails, skipping
  nothing. One that moves nextBeginOffset forward (4.9.8's
  OFFSET_FOUND_NULL: no consume-queue entries there) moves on at once and counts the skipped
  offsets as lost.

Data loss raises :class:`DataLossError` unless the caller allowed it; then the skipped ranges are
logged and counted in :attr:`QueueRangeReader.lost_ranges`. Transient faults (connection loss,
timeouts, a broker shutting down) are retried with exponential backoff until ``retry_deadline``
passes. A busy answer (flow control) is back-pressure, not a fault: the broker's pulls back off
(:mod:`.busy_brokers`, shared by the readers of the process, exponential with jitter), the
pipeline restarts with one pull in flight, and the reader gives up only when the broker has
answered nothing but busy for ``busy_timeout``. Either way the pull is retried at the offset
the batch has reached: nothing is skipped or read twice.

A broker that refuses a SQL92 filter (``enablePropertyFilter`` is off) fails the read at once
(:class:`~..errors.FilterNotSupportedError`), it is never retried.

Pulls are pipelined: without a filter, up to ``pipeline_depth`` requests for the offsets ahead
are in flight. Each asks for the broker's cap per pull, learned from its answers (a default
broker serves 32 messages a pull from memory, 8 from disk, whatever ``max_msg_nums`` asks), and
an answer that stops short is followed at once by a request for exactly the gap. The loop runs
in C (:mod:`.native_pull_engine`) where it can: there only the answers that are not a plain
FOUND come back to Python; it signs requests (ACL) and runs over TLS too. The pure-Python
engine (:mod:`.python_pull_engine`) is its twin and the fallback (no accelerator, or
``ROCKETMQ_SPARK_PURE_PYTHON=1``). Both meet the reader through :class:`~.pull_engine.PullEngine`.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc

from . import native_pull
from ..busy import busy_remark, is_busy
from ..broker import BrokerClient
from .busy_brokers import BUSY_BROKERS, BrokerBusyError, BusyBrokers, busy_target
from ..errors import (
    BrokerUnavailable, DataLossError, MessageDecodeError, ResponseError, RocketMQError,
    RouteNotFound,
)
from ..protocol.codes import ResponseCode
from ..protocol.pull_decode import decode_columns
from ..protocol.message import MIN_RECORD_SIZE
from ..protocol.properties import split_tags_expression
from ..protocol.route import MessageQueue
from .native_pull_engine import NativePullEngine
from ..pull import PullRequest, PullResult, PullStatus, TAG_TYPE
from ..responses import is_transient
from .pull_engine import PullEngine
from .python_pull_engine import PythonPullEngine
from .settings import ReadSettings

log = logging.getLogger(__name__)
_SAID_WHY = False

# (queue, suggested broker id, refresh) -> broker address
AddressResolver = Callable[[MessageQueue, int, bool], str]
# whether an address is the master of the queue's broker in the current route
MasterCheck = Callable[[MessageQueue, str], bool]


# The source option that sets ``busy_timeout`` (named in the error when it runs out).
BUSY_TIMEOUT_OPTION = "brokerBusyTimeoutMs"
# A broker's remark when the topic's perm forbids reads (PullMessageProcessor), as opposed to
# an ACL refusal of the client's credentials, which is worded otherwise.
_PULL_FORBIDDEN = "pulling message is forbidden"


class TopicNotReadable(RocketMQError):
    """A topic whose perm forbids reads on some broker (perm 2, write only), e.g. the
    dead-letter topic an older broker creates (4.9.8 and 5.x create it readable, perm 6):
    says how to grant reads."""

    @classmethod
    def for_topic(cls, topic: str, brokers: List[str], perm: int, cluster: str = "<cluster>",
                  name_servers: str = "<nameserver>") -> "TopicNotReadable":
        dead = topic.startswith("%DLQ%")
        return cls(
            f"topic {topic} cannot be read: its perm on {', '.join(brokers)} is {perm} "
            "(no read permission"
            + ("; older brokers create dead-letter topics write-only" if dead
               else "")
            + f"). Grant reads, then run the query again: mqadmin updateTopicPerm -n "
            f"{name_servers} -c {cluster} -t {topic} -p 6")


def _refused_read(exc: RocketMQError, queue: MessageQueue) -> Optional[TopicNotReadable]:
    """The broker's refusal of a pull because the topic is not readable, told as such."""
    if isinstance(exc, ResponseError) and exc.code == ResponseCode.NO_PERMISSION \
            and _PULL_FORBIDDEN in exc.remark:
        return TopicNotReadable.for_topic(queue.topic, [queue.broker_name], 2)
    return None


class QueueRangeReader:
    """Iterate Arrow batches (schema :data:`~..protocol.pull_decode.SCHEMA`) of ``[start, end)``."""

    def __init__(self, brokers: BrokerClient, resolve: AddressResolver, queue: MessageQueue,
                 start: int, end: int, settings: ReadSettings,
                 busy_brokers: BusyBrokers = BUSY_BROKERS,
                 is_master: Optional[MasterCheck] = None):
        self.brokers = brokers
        self.is_master = is_master
        self.busy_brokers = busy_brokers
        self.resolve = resolve
        self.queue = queue
        self.start = start
        self.end = end
        self.settings = settings
        tag_filter = settings.expression_type.upper() == TAG_TYPE
        self.tags = split_tags_expression(settings.subscription) if tag_filter else []
        # the broker filters (tags or SQL92): answers skip offsets, so one pull at a time
        self.filtered = bool(self.tags) or not tag_filter
        self.lost_ranges: List[Tuple[int, int]] = []
        self.filtered_out = 0     # rows the client-side tag check dropped
        self.rows_received = 0    # messages of the range the broker sent
        self.reached = start      # the read covers [start, reached)
        self.pulls = 0
        self.retries = 0      # retries after a fault (not after a busy answer)
        self.busy_answers = 0  # busy answers acted on
        self.busy_wait = 0.0   # seconds spent waiting for busy brokers
        self._busy_at: Optional[str] = None  # the broker whose busy answer this reader saw
        self.path = ""  # "native" or "python": which pull loop ran
        self._broker_id = 0
        self._address: Optional[str] = None
        self._short_at = -1        # the offset a broker last answered NO_NEW_MSG short of end
        self._short_since = 0.0    # since when it has

    @property
    def lost_messages(self) -> int:
        return sum(b - a for a, b in self.lost_ranges)

    @property
    def filter_skipped(self) -> int:
        """Offsets of the range read so far that the broker's filter skipped (filter gaps:
        not data loss, not in :attr:`lost_ranges`); exact once the batches are taken."""
        covered = min(self.reached, self.end) - self.start
        return max(0, covered - self.lost_messages - self.rows_received)

    @property
    def broker_id(self) -> int:
        """The broker id the last answer suggested (0: the master)."""
        return self._broker_id

    # ------------------------------------------------------------------ for the pull engines

    def pull_request(self, offset: int, nums: Optional[int] = None) -> PullRequest:
        """The pull of this range's queue at ``offset`` (``nums`` messages, by default the
        settings' ``max_msg_nums``)."""
        return PullRequest(consumer_group=self.settings.consumer_group, topic=self.queue.topic,
                           queue_id=self.queue.queue_id, queue_offset=offset,
                           broker_name=self.queue.broker_name,
                           max_msg_nums=nums or self.settings.max_msg_nums,
                           subscription=self.settings.subscription,
                           expression_type=self.settings.expression_type,
                           sub_version=self.settings.sub_version)

    def broker_address(self) -> str:
        """The address to pull from (resolved again after a failure or a suggestion)."""
        if self._address is None:
            self._address = self.resolve(self.queue, self._broker_id, False)
        return self._address

    def _lose(self, start: int, end: int, reason: str) -> None:
        if end <= start:
            return
        if self.settings.fail_on_data_loss:
            raise DataLossError(self.queue, start, end, reason)
        log.warning("skipping lost messages on %s: offsets [%d, %d) (%d messages): %s",
                    self.queue.key, start, end, end - start, reason)
        self.lost_ranges.append((start, end))

    # ------------------------------------------------------------------ main loop

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        s = self.settings
        offset = self.start
        pulls: PullEngine = (NativePullEngine(self) if self._native_wanted()
                             else PythonPullEngine(self))
        self.path = pulls.name
        self._failures_since = None
        self._backoff = s.retry_backoff
        try:
            while offset < self.end:
                try:
                    if self.busy_brokers.active:  # some broker is in flow control
                        self._hold()
                    before = offset
                    offset, result = pulls.advance(offset)
                except RocketMQError as exc:
                    offset = pulls.resume_offset(offset)
                    if is_busy(exc):
                        self._busy(exc, pulls)
                        continue
                    # The driver saw this queue when it planned the range: a route that lost
                    # it means its broker is down for now, which is worth waiting for.
                    if not (is_transient(exc) or isinstance(exc, RouteNotFound)):
                        refused = _refused_read(exc, self.queue)
                        if refused is not None:
                            raise refused from None
                        raise
                    self._retry(exc, offset, pulls)
                    continue
                if self._busy_at is not None and (result is not None or offset != before):
                    self.busy_brokers.end_episode(self._busy_at)  # the broker answered
                    self._busy_at = None
                self._failures_since, self._backoff = None, s.retry_backoff
                if result is not None:
                    offset = self._apply(result, offset, pulls)
                self.reached = offset
                if pulls.full() or (offset >= self.end and pulls.buffered()):
                    batch = pulls.decode()
                    if batch.num_rows:
                        yield batch
            if pulls.buffered():  # a retry resumed at the end, past what the loop took
                batch = pulls.decode()
                if batch.num_rows:
                    yield batch
        finally:
            pulls.close()
            self.pulls = pulls.count()

    def _retry(self, exc: RocketMQError, offset: int, pulls: PullEngine) -> None:
        """A transient fault: pause (until ``retry_deadline``), then resolve the broker again."""
        s = self.settings
        pulls.abandon()
        self._failures_since = self._failures_since or time.monotonic()
        if time.monotonic() - self._failures_since > s.retry_deadline:
            raise exc
        self.retries += 1
        log.info("pull of %s at %d failed (%s); retrying in %.2fs",
                 self.queue.key, offset, exc, self._backoff)
        self._pause()
        self._address = None
        try:
            self._address = self.resolve(self.queue, 0, True)
        except RocketMQError as resolve_error:
            log.info("cannot resolve %s yet: %s", self.queue.key, resolve_error)

    def _busy(self, exc: RocketMQError, pulls: PullEngine) -> None:
        """A busy answer: the broker backs off (the wait happens in :meth:`_hold`), the
        pipeline restarts narrow; past the budget, :class:`BrokerBusyError`."""
        s = self.settings
        pulls.abandon()
        pulls.narrow()
        address = getattr(exc, "address", "") or self.broker_address()
        target = busy_target(address, self.queue.broker_name)
        self.busy_answers += 1
        self._busy_at = target
        self.busy_brokers.busy(target, busy_remark(exc), s.retry_backoff,
                               s.busy_backoff_max)
        seconds, answers, remark = self.busy_brokers.episode(target)
        if seconds > s.busy_timeout:
            self.busy_brokers.end_episode(target)  # a retried task gets a budget of its own
            self._busy_at = None
            raise BrokerBusyError(self.queue.broker_name, address, seconds, answers, remark,
                                  BUSY_TIMEOUT_OPTION, round(s.busy_timeout * 1000)) from None

    def _hold(self) -> None:
        """Wait while this reader's broker is backed off (other brokers' readers go on)."""
        wait = self.busy_brokers.wait(busy_target(self.broker_address(),
                                                  self.queue.broker_name))
        if wait > 0:
            self.busy_wait += wait
            time.sleep(wait)

    def _native_wanted(self) -> bool:
        if not self.settings.native:
            return False
        why = native_pull.why_python_pulls()
        if why is not None:
            global _SAID_WHY
            if not _SAID_WHY:  # once per process: it explains a slower read
                _SAID_WHY = True
                log.info("pulls take the pure-Python loop: %s", why)
            return False
        return True

    def _pause(self) -> None:
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, self.settings.retry_backoff_max)

    def _apply(self, result: PullResult, offset: int, pulls: PullEngine) -> int:
        """Act on the answer to the pull at ``offset``; returns where to continue."""
        s = self.settings
        pulls.acted_on_answer()
        if result.suggest_which_broker_id != self._broker_id:
            self._broker_id = result.suggest_which_broker_id
            self._address = None
            pulls.moved()
        nxt = result.next_begin_offset
        status = result.status
        if status is PullStatus.FOUND:
            if nxt <= offset:
                raise RocketMQError(f"broker answered FOUND for {self.queue.key} at {offset} "
                                    f"with nextBeginOffset {nxt}; refusing to loop")
            body = self._trim(result.body) if nxt > self.end else result.body
            pulls.add(body, offset, min(nxt, self.end) - offset)
            return nxt
        if status is PullStatus.NO_MATCHED_MSG:
            if nxt > offset:
                return nxt
            pulls.abandon()  # a slave that suppresses corrections answers so: pause, ask again
            self._pause()
            return offset
        if status is PullStatus.OFFSET_ILLEGAL:
            pulls.abandon()
            if nxt > offset:  # below min: retention deleted [offset, min)
                lost_end = min(nxt, self.end)
                self._lose(offset, lost_end, f"retention moved the queue's min offset to "
                                             f"{result.min_offset}")
                return lost_end
            # above max, or the queue is empty: nothing left of [offset, end)
            self._lose(offset, self.end, f"the queue's max offset is now {result.max_offset}")
            return self.end
        # NO_NEW_MSG before the planned end
        pulls.abandon()
        if nxt > offset:  # no consume-queue entries from offset on: skip them, don't wait
            lost_end = min(nxt, self.end)
            self._lose(offset, lost_end, f"the broker found no entries before {nxt}")
            return lost_end
        if self._short_at != offset:  # answers in between reset _failures_since: time it here
            self._short_at, self._short_since = offset, time.monotonic()
        waited = time.monotonic() - self._short_since
        if self._on_slave():
            # a slave short of the planned end: its master has the rest (replication is
            # asynchronous), so wait for the master to return; never skip what it holds
            if waited > s.retry_deadline:
                raise BrokerUnavailable(self.queue.broker_name, (
                    f"{self.queue.key}: its slave has messages only up to "
                    f"{result.max_offset} and [{offset}, {self.end}) is on its master, which "
                    f"did not come back within {s.retry_deadline:.0f} s; nothing was skipped"))
        elif waited > min(s.retry_deadline, s.pull_timeout):
            self._lose(offset, self.end, f"the broker has messages only up to "
                                         f"{result.max_offset}")
            return self.end
        self._pause()
        self._address = None
        return offset

    def _on_slave(self) -> bool:
        """Whether the last answer came from a slave: one the master suggested, or the node
        the route offered while its master is down."""
        if self._broker_id != 0:
            return True
        if self.is_master is None or self._address is None:
            return False
        try:
            return not self.is_master(self.queue, self._address)
        except RocketMQError:  # no route to tell: a slave's shortfall must not become loss
            return True

    def _corrupt(self, bodies: List[bytes], firsts: List[int], exc: MessageDecodeError
                 ) -> MessageDecodeError:
        """The decoder's error, told in the queue's terms: which queue, which offset, and
        where in the broker's answer (a bad record is never skipped, whatever
        failOnDataLoss says: it is not lost, it is wrong)."""
        position, pull_start, pull_body = exc.position or 0, firsts[0], bodies[0]
        for first, body in zip(firsts, bodies):
            pull_start, pull_body = first, body
            if position < len(body):
                break
            position -= len(body)
        offset = exc.queue_offset
        if offset is None and exc.position is not None:
            offset = self._offset_at(pull_body, position, pull_start)
        where = f"offset {offset}" if offset is not None else f"the pull from offset {pull_start}"
        error = MessageDecodeError(f"corrupt message in queue {self.queue.key} at {where} "
                                   f"(byte {position} of the broker's answer): {exc.args[0]}")
        error.queue, error.queue_offset, error.position = self.queue, offset, position
        return error

    def _trim(self, body):
        """The records of a pull's body below the range's end. A pull may run past the end
        (the broker answers up to maxMsgNums messages): a damaged message there is not part of
        this range and must not fail it. Only the records' size and offset fields are read;
        one that cannot be walked is left for the decoder to report."""
        pos, n = 0, len(body)
        while pos + 28 <= n:
            if int.from_bytes(body[pos + 20:pos + 28], "big", signed=True) >= self.end:
                return body[:pos]
            total = int.from_bytes(body[pos:pos + 4], "big", signed=True)
            if total < MIN_RECORD_SIZE:
                break
            pos += total
        return body

    def _offset_at(self, body, position: int, pull_start: int) -> Optional[int]:
        """The queue offset of the record holding byte ``position`` of one pull's body, for a
        fault the decoder found before it could read the offset (bad size or magic). The
        records before it are valid: an unfiltered pull holds consecutive offsets, so it is
        the one after the last valid record; a filtered pull skips offsets, so there only the
        damaged record's own offset field is taken, and only if it lies after that record."""
        start, previous = 0, pull_start - 1
        while start + 28 <= len(body):
            total = int.from_bytes(body[start:start + 4], "big", signed=True)
            if total <= 0 or start + total > position:
                break
            previous = int.from_bytes(body[start + 20:start + 28], "big", signed=True)
            start += total
        if not self.filtered:
            return previous + 1
        if start + 28 <= len(body):
            claimed = int.from_bytes(body[start + 20:start + 28], "big", signed=True)
            if previous < claimed < self.end:
                return claimed
        return None

    def decode_batch(self, data, pieces: Callable[[], Tuple[List, List[int]]]
                     ) -> pa.RecordBatch:
        """The records of ``data`` in this range (and, with a tag filter, matching it) as
        one batch. ``data``: the bodies of a batch back to back; ``pieces()`` gives each
        pull's body and the offset it started at, asked for only to report a corrupt record."""
        s = self.settings
        try:
            batch = decode_columns(data, verify_crc=s.verify_crc,
                                   properties=s.properties, offset_ids=s.offset_ids)
        except MessageDecodeError as exc:
            raise self._corrupt(*pieces(), exc) from None
        offsets = batch.column("queue_offset")
        if batch.num_rows and offsets[-1].as_py() >= self.end:
            batch = batch.filter(pc.less(offsets, self.end))
        self.rows_received += batch.num_rows
        if self.tags and batch.num_rows:
            keep = pc.is_in(batch.column("tags"), value_set=pa.array(self.tags, pa.string()))
            keep = pc.fill_null(keep, False)
            before = batch.num_rows
            batch = batch.filter(keep)
            self.filtered_out += before - batch.num_rows
        return batch
