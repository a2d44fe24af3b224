"""Read one queue's offset range [start, end) as Arrow batches: the executor's pull loop.

Every pull status is handled here and nowhere else:

* FOUND: keep the messages below ``end`` (and, with a tag filter, those whose TAGS string
  matches: brokers filter by hash code, so collisions get through), continue at nextBeginOffset.
* NO_MATCHED_MSG: a filtered window had no match; continue at nextBeginOffset at once.
* OFFSET_ILLEGAL: the offset is outside [min, max]. Below min, retention deleted messages: data
  loss. Above max, the queue was truncated or recreated: the rest of the range is gone.
* NO_NEW_MSG before ``end``: the broker has less than it reported when the range was planned
  (a failover to a lagging node, a restart without its data). Retried until the deadline, then
  data loss for what the broker no longer has.

Data loss raises :class:`DataLossError` unless the caller allowed it; then the skipped ranges are
logged and counted in :attr:`QueueRangeReader.lost_ranges`. Transient faults (connection loss,
timeouts, busy brokers) are retried with exponential backoff until ``retry_deadline`` passes.

Pulls are pipelined: without a filter, requests for the next offsets on a grid of
``max_msg_nums`` go out before the current answer is decoded.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc

from .broker import BrokerClient
from .errors import DataLossError, MessageDecodeError, RocketMQError, RouteNotFound
from .protocol.columns import decode_columns
from .protocol.message import MIN_RECORD_SIZE
from .protocol.properties import split_tags_expression
from .protocol.route import MessageQueue
from .pull import PullRequest, PullStatus, is_transient

log = logging.getLogger(__name__)

# (queue, suggested broker id, refresh) -> broker address
AddressResolver = Callable[[MessageQueue, int, bool], str]


def join(parts: List[bytes]):
    """Concatenate pull bodies into a buffer from Arrow's memory pool, which is reused from one
    batch to the next (a fresh multi-megabyte bytes object faults in new pages every time)."""
    if len(parts) == 1:
        return parts[0]
    out = pa.allocate_buffer(sum(len(p) for p in parts))
    view = memoryview(out).cast("B")
    pos = 0
    for part in parts:
        view[pos:pos + len(part)] = part
        pos += len(part)
    return out


@dataclass(frozen=True)
class ReadSettings:
    consumer_group: str
    subscription: str = "*"
    max_msg_nums: int = 32
    pull_timeout: float = 10.0
    pipeline_depth: int = 16
    batch_max_messages: int = 32768
    batch_max_bytes: int = 8 * 1024 * 1024
    fail_on_data_loss: bool = True
    verify_crc: bool = True
    properties: bool = True   # decode the raw properties column
    offset_ids: bool = True   # decode the broker's offset message ids
    retry_deadline: float = 60.0
    retry_backoff: float = 0.1
    retry_backoff_max: float = 2.0


class QueueRangeReader:
    """Iterate Arrow batches (schema :data:`~.protocol.columns.SCHEMA`) of ``[start, end)``."""

    def __init__(self, brokers: BrokerClient, resolve: AddressResolver, queue: MessageQueue,
                 start: int, end: int, settings: ReadSettings):
        self.brokers = brokers
        self.resolve = resolve
        self.queue = queue
        self.start = start
        self.end = end
        self.settings = settings
        self.tags = split_tags_expression(settings.subscription)
        self.lost_ranges: List[Tuple[int, int]] = []
        self.filtered_out = 0
        self.pulls = 0
        self.retries = 0
        self._broker_id = 0
        self._address: Optional[str] = None

    @property
    def lost_messages(self) -> int:
        return sum(b - a for a, b in self.lost_ranges)

    # ------------------------------------------------------------------ pulls

    def _request(self, offset: int) -> PullRequest:
        return PullRequest(consumer_group=self.settings.consumer_group, topic=self.queue.topic,
                           queue_id=self.queue.queue_id, queue_offset=offset,
                           broker_name=self.queue.broker_name,
                           max_msg_nums=self.settings.max_msg_nums,
                           subscription=self.settings.subscription)

    def _send(self, offsets: List[int]) -> List[tuple]:
        """Pull requests for ``offsets``, sent in one write; returns (address, pending) pairs."""
        if self._address is None:
            self._address = self.resolve(self.queue, self._broker_id, False)
        address = self._address
        sent = self.brokers.pull_many_async(address, [self._request(o) for o in offsets])
        return [(address, pending) for pending in sent]

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
        depth = 1 if self.tags else max(1, s.pipeline_depth)
        step = max(1, s.max_msg_nums)
        inflight: Dict[int, tuple] = {}
        bodies: List[bytes] = []
        firsts: List[int] = []  # the offset each body's pull started at
        buffered = 0
        buffered_msgs = 0
        failures_since = None
        backoff = s.retry_backoff

        while offset < self.end:
            # Keep the current offset and the next grid points requested.
            try:
                wanted = [] if offset in inflight else [offset]
                grid = self.start + ((offset - self.start) // step + 1) * step
                # Top the pipeline up in bursts (one write each) once half of it has drained.
                refill = len(inflight) + len(wanted) <= depth // 2
                while refill and len(inflight) + len(wanted) < depth and grid < self.end:
                    if grid not in inflight:
                        wanted.append(grid)
                    grid += step
                if wanted:
                    inflight.update(zip(wanted, self._send(wanted)))
                address, pending = inflight.pop(offset)
                result = self.brokers.pull_wait(address, pending, s.pull_timeout)
            except RocketMQError as exc:
                # The driver saw this queue when it planned the range: a route that lost it
                # means its broker is down for now, which is worth waiting for.
                if not (is_transient(exc) or isinstance(exc, RouteNotFound)):
                    raise
                inflight.clear()
                failures_since = failures_since or time.monotonic()
                if time.monotonic() - failures_since > s.retry_deadline:
                    raise
                self.retries += 1
                log.info("pull of %s at %d failed (%s); retrying in %.2fs", self.queue.key,
                         offset, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, s.retry_backoff_max)
                self._address = None
                try:
                    self._address = self.resolve(self.queue, 0, True)
                except RocketMQError as resolve_error:
                    log.info("cannot resolve %s yet: %s", self.queue.key, resolve_error)
                continue
            self.pulls += 1
            failures_since, backoff = None, s.retry_backoff
            if result.suggest_which_broker_id != self._broker_id:
                self._broker_id = result.suggest_which_broker_id
                self._address = None
            nxt = result.next_begin_offset
            status = result.status

            if status is PullStatus.FOUND:
                if nxt <= offset:
                    raise RocketMQError(f"broker answered FOUND for {self.queue.key} at {offset} "
                                        f"with nextBeginOffset {nxt}; refusing to loop")
                body = self._trim(result.body) if nxt > self.end else result.body
                bodies.append(body)
                firsts.append(offset)
                buffered += len(body)
                buffered_msgs += min(nxt, self.end) - offset
                offset = nxt
            elif status is PullStatus.NO_MATCHED_MSG:
                if nxt > offset:
                    offset = nxt
                else:  # a slave that suppresses corrections answers so: pause and ask again
                    inflight.clear()
                    time.sleep(backoff)
                    backoff = min(backoff * 2, s.retry_backoff_max)
            elif status is PullStatus.OFFSET_ILLEGAL:
                inflight.clear()
                if nxt > offset:  # below min: retention deleted [offset, min)
                    lost_end = min(nxt, self.end)
                    self._lose(offset, lost_end, f"retention moved the queue's min offset to "
                                                 f"{result.min_offset}")
                    offset = lost_end
                else:  # above max, or the queue is empty: nothing left of [offset, end)
                    self._lose(offset, self.end, f"the queue's max offset is now "
                                                 f"{result.max_offset}")
                    offset = self.end
            else:  # NO_NEW_MSG before the planned end
                inflight.clear()
                failures_since = failures_since or time.monotonic()
                if time.monotonic() - failures_since > min(s.retry_deadline, s.pull_timeout):
                    self._lose(offset, self.end,
                               f"the broker has messages only up to {result.max_offset}")
                    offset = self.end
                else:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, s.retry_backoff_max)
                    self._address = None

            for stale in [k for k in inflight if k < offset]:
                del inflight[stale]  # answers for skipped offsets are dropped on arrival
            if bodies and (buffered >= s.batch_max_bytes or buffered_msgs >= s.batch_max_messages
                           or offset >= self.end):
                batch = self._decode(bodies, firsts)
                bodies, firsts, buffered, buffered_msgs = [], [], 0, 0
                if batch.num_rows:
                    yield batch

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
        if not self.tags:
            return previous + 1
        if start + 28 <= len(body):
            claimed = int.from_bytes(body[start + 20:start + 28], "big", signed=True)
            if previous < claimed < self.end:
                return claimed
        return None

    def _decode(self, bodies: List[bytes], firsts: List[int]) -> pa.RecordBatch:
        s = self.settings
        try:
            batch = decode_columns(join(bodies), verify_crc=s.verify_crc,
                                   properties=s.properties, offset_ids=s.offset_ids)
        except MessageDecodeError as exc:
            raise self._corrupt(bodies, firsts, exc) from None
        offsets = batch.column("queue_offset")
        if batch.num_rows and offsets[-1].as_py() >= self.end:
            batch = batch.filter(pc.less(offsets, self.end))
        if self.tags and batch.num_rows:
            keep = pc.is_in(batch.column("tags"), value_set=pa.array(self.tags, pa.string()))
            keep = pc.fill_null(keep, False)
            before = batch.num_rows
            batch = batch.filter(keep)
            self.filtered_out += before - batch.num_rows
        return batch
