"""Pipelined sends: several requests in flight per broker, retries within a deadline, and
back-pressure from busy brokers.

A :class:`SendPipeline` takes ready-made requests (:class:`Outgoing`: a batch of one topic,
already encoded for its transport) and keeps several of them waiting for an answer on each
broker. Requests without a fixed queue go to the topic's queues round robin, as Java's
producer chooses them; a failed one is retried on a queue of another broker. A request with a
fixed queue (messages with a sharding key) is the only one in flight on that queue and is
retried on the same queue, so the queue stores its requests in submission order even when a
send has to be repeated; the messages of a run refused in part are reported in their order all
the same (a gRPC message group's refused calls are sent again before its later ones: the
producer holds those back after a refusal).

A busy answer (:func:`~..busy.is_busy`) is not a failed attempt: the broker's window of
requests in flight is halved, nothing new goes to it for a backoff, and the refused request
(or, when a run of single sends was refused in part, exactly its refused messages) is sent
again, its send deadline untouched by the wait. Only a broker that answers nothing but busy
for ``busy_timeout`` seconds fails the send (:class:`BrokerStayedBusy`).

The pipeline knows no wire format: a :class:`Sender` (the remoting :class:`~.producer.Producer`
or a gRPC producer) starts and finishes the requests.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import (
    Any, Callable, Deque, Dict, FrozenSet, Iterable, List, Optional, Protocol, Sequence, Tuple,
)

from ..busy import DEFAULT_BUSY_TIMEOUT, is_busy
from .backpressure import BusyClock, BusyLog, PartlyRefused, SendWindow
from ..errors import RocketMQError
from ..protocol.route import MessageQueue
from ..responses import is_transient
from .parts import BrokerState, Item, Outgoing, Part

log = logging.getLogger(__name__)

SEND_OK = "SEND_OK"
SEND_STATUSES = ("SEND_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE")
# Below this a finish still reads answers that have already arrived (the deadline may have
# passed while the pipeline was waiting on another broker).
_MIN_WAIT = 0.05


class Sender(Protocol):
    """What a pipeline needs from a transport. A sender whose payloads are runs, a request
    per message, also has ``narrow(payload, positions)``: the payload of just those messages,
    in that order; its :meth:`finish` gives a result per message and may raise
    :class:`~.backpressure.PartlyRefused`. (``narrow`` absent or None: a payload is one
    request, answered as a whole.)"""

    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        """The topic's writable queues."""

    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        """Send ``item`` to ``queue`` without waiting; returns a handle for :meth:`finish`."""

    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        """Wait for the answer; returns the results (objects with ``status``), one per
        request or one per message. Raises :class:`RocketMQError` on failure."""


class SendFailed(RocketMQError):
    """A request could not be acknowledged within its retries and deadline. ``stored``: the
    results of its messages that were stored before it failed (a request refused in part)."""

    def __init__(self, item: Outgoing, attempts: int, elapsed: float, cause: BaseException,
                 brokers: Sequence[str]):
        self.item, self.attempts, self.cause = item, attempts, cause
        self.stored: List[Any] = []
        super().__init__(
            f"sending {item.count} message(s) ({_rows(item)}) to topic {item.topic!r} failed "
            f"after {attempts} attempt(s) in {elapsed * 1000:.0f} ms (brokers tried: "
            f"{', '.join(brokers)}): {cause}")


class BrokerStayedBusy(SendFailed):
    """A broker answered busy to every request for longer than the busy budget."""

    def __init__(self, item: Outgoing, broker: str, clock: BusyClock, busy_for: float,
                 budget: float, budget_name: str, cause: BaseException):
        self.item, self.attempts, self.cause = item, 0, cause
        self.stored = []
        self.broker, self.busy_for, self.answers = broker, busy_for, clock.answers
        where = f" ({clock.address})" if clock.address else ""
        RocketMQError.__init__(
            self, f"sending {item.count} message(s) ({_rows(item)}) to topic {item.topic!r} "
                  f"failed: broker {broker}{where} answered busy for {busy_for:.1f} s without "
                  f"storing anything ({clock.answers} busy answer(s) to this writer; the "
                  f"last: {clock.remark}). Raise {budget_name} (now {budget * 1000:.0f} ms) "
                  "to wait longer for it, or send to it more slowly")


def _rows(item: Outgoing) -> str:
    return (f"the first at row {item.first_row}" if item.count > 1
            else f"row {item.first_row}")


class NotAccepted(RocketMQError):
    """The broker stored the messages but answered with a status the caller did not accept
    (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE)."""

    def __init__(self, status: str, address: str = ""):
        self.status = status
        super().__init__(f"the broker{' ' + address if address else ''} answered {status}, "
                         "which is not an accepted status")


def retryable(error: BaseException) -> bool:
    """Whether a send may succeed when repeated: broker gone, timeout, a passing fault, or a
    status the caller does not accept. Auth errors, unknown topics and illegal messages are
    not. (Busy answers are not retries at all: see :mod:`.backpressure`.)"""
    return isinstance(error, NotAccepted) or is_transient(error)


@dataclass
class PipelineStats:
    """What a pipeline sent: acknowledged messages, requests on the wire and bytes, retries
    (real failures) and busy answers (back-pressure, one per refused request), per broker."""

    messages: int = 0
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    by_broker: Dict[str, int] = field(default_factory=dict)
    busy: int = 0
    busy_by_broker: Dict[str, int] = field(default_factory=dict)


class SendPipeline:
    """Sends :class:`Outgoing` requests through ``sender``; :meth:`flush` waits for them all.

    ``accept``: the statuses that count as acknowledged (SEND_OK, plus any of
    FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE); another status is retried
    like a transient failure. ``on_result(item, queue, results)`` sees every acknowledged
    request once, with its results in order (also when it was sent or answered in parts). A
    request that cannot be acknowledged raises :class:`SendFailed` from :meth:`submit` or
    :meth:`flush`; requests already acknowledged stay sent, and :meth:`unreported` gives the
    results stored of requests not reported to ``on_result``.

    ``max_in_flight_per_broker`` requests may wait for an answer per broker (a run of single
    sends, from a sender with ``narrow``, counts as its messages and is cut to fit when a
    busy broker's window is smaller). ``busy_timeout``: how long a broker may answer nothing
    but busy before the send fails; ``busy_timeout_name`` names it in that error (the
    caller's option). ``busy_log``: where busy answers are counted and logged (default: the
    sender's, so one producer logs once a minute whatever the number of pipelines).
    """

    def __init__(self, sender: Sender, *, max_in_flight_per_broker: int = 4,
                 send_timeout: float = 5.0, retries: int = 2,
                 accept: Iterable[str] = (SEND_OK,),
                 on_result: Optional[Callable[[Outgoing, MessageQueue, Sequence[Any]], None]]
                 = None, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 busy_timeout_name: str = "busy_timeout", busy_log: Optional[BusyLog] = None):
        if max_in_flight_per_broker < 1:
            raise ValueError("max_in_flight_per_broker must be at least 1")
        self.sender = sender
        self.max_in_flight = max_in_flight_per_broker
        self.send_timeout = send_timeout
        self.retries = retries
        self.accept: FrozenSet[str] = frozenset(accept)
        self.on_result = on_result
        self.busy_timeout = busy_timeout
        self.busy_timeout_name = busy_timeout_name
        self.busy_log = busy_log or getattr(sender, "busy_log", None) or BusyLog()
        self.stats = PipelineStats()
        self._narrow = getattr(sender, "narrow", None)  # runs: a request per message
        self._rr = itertools.count(random.randrange(1 << 16))
        self._brokers: Dict[str, BrokerState] = {}
        self._fixed: Dict[MessageQueue, Item] = {}  # fixed queue -> its one item
        self._waiting: Deque[Part] = deque()  # to send (again): busy, a retry, a cut run
        self._open: Dict[int, Item] = {}  # every item not yet reported, by id()

    # ------------------------------------------------------------------ public

    def submit(self, item: Outgoing) -> None:
        """Send ``item``; blocks while its broker (or its fixed queue) is at its limit or
        backing off."""
        self._send_waiting()
        whole = Item(item, item.count)
        self._open[id(whole)] = whole
        if item.queue is not None:
            while item.queue in self._fixed:
                self._advance(self._fixed[item.queue])
            self._fixed[item.queue] = whole
        self._send(Part(whole, item.payload, item.count))

    def flush(self) -> PipelineStats:
        """Wait until every submitted request is acknowledged (or raise)."""
        while True:
            self._send_waiting()
            busy = [b for b in self._brokers.values() if b.fifo]
            if not busy and not self._waiting:
                return self.stats
            for broker in busy:
                if broker.fifo:
                    self._finish_oldest(broker)

    @property
    def in_flight(self) -> int:
        return sum(len(b.fifo) for b in self._brokers.values())

    def unreported(self) -> List[Any]:
        """Results of messages stored for requests that were not reported to ``on_result``
        (sent or answered in parts and still pending, or failed): what a caller that gives
        up must undo (half messages to roll back)."""
        return [r for whole in self._open.values() for r in whole.stored()]

    # ------------------------------------------------------------------ internals

    def _broker(self, name: str) -> BrokerState:
        state = self._brokers.get(name)
        if state is None:
            state = self._brokers[name] = BrokerState(SendWindow(self.max_in_flight))
        return state

    def _pick(self, topic: str, avoid: Sequence[str], refresh: bool = False) -> MessageQueue:
        queues = list(self.sender.queues(topic, refresh))
        fresh = [q for q in queues if q.broker_name not in avoid] or queues
        return fresh[next(self._rr) % len(fresh)]

    def _choose(self, part: Part) -> MessageQueue:
        """The part's queue: its item's fixed one, or the next one round robin, away from
        the broker that just failed it and from brokers backing off."""
        item = part.whole.item
        if item.queue is not None:
            return item.queue
        if part.started is None and part.queue is not None:
            return part.queue  # chosen before it was queued
        now = time.monotonic()
        avoid = list(part.avoid) + [n for n, b in self._brokers.items() if b.window.wait(now)]
        if not part.refresh:
            return self._pick(item.topic, avoid)
        try:
            return self._pick(item.topic, avoid, refresh=True)
        except RocketMQError as route_error:
            raise self._send_failed(part, route_error) from route_error

    def _advance(self, holder: Item) -> None:
        """Make progress on the item holding a fixed queue."""
        if self._waiting:
            self._send_waiting()
        else:
            self._finish_oldest(self._broker(holder.item.queue.broker_name))

    def _send_waiting(self) -> None:
        while self._waiting:
            self._send(self._waiting.popleft())

    def _send(self, part: Part) -> None:
        """Start ``part`` once its broker has room and is not backing off; a run larger than
        a busy broker's window is cut, its rest sent next."""
        queue = self._choose(part)
        broker = self._broker(queue.broker_name)
        window = broker.window
        weight = part.count if self._narrow is not None else 1
        window.fit(part.whole.item.count if self._narrow is not None else 1)
        # A fixed queue's run goes whole: its parts in flight at once could be stored out of
        # order (a gRPC message group's calls after a refused one go on in the next part).
        cuttable = self._narrow is not None and part.whole.item.queue is None
        least = min(weight, max(1, window.size // 4)) if cuttable else weight
        while True:
            now = time.monotonic()
            room = window.size - broker.requests
            if broker.fifo and (len(broker.fifo) >= self.max_in_flight or room < least):
                self._finish_oldest(broker)
                continue
            wait = max(window.wait(now), part.not_before - now)
            if wait <= 0:
                break
            if broker.fifo:  # read answers while the backoff runs
                self._finish_oldest(broker)
            else:
                time.sleep(wait)
        room = max(1, window.size - broker.requests)
        if cuttable and weight > room:
            part, rest = self._cut(part, room)
            self._waiting.appendleft(rest)
            weight = part.count
        now = time.monotonic()
        if part.started is None:  # the deadline runs from the first send, not from the wait
            part.started = now
            part.deadline = now + self.send_timeout
        elif part.refund is not None:  # busy waiting does not use up the deadline
            part.deadline = now + part.refund
            part.refund = None
        part.queue, part.sent_at, part.epoch = queue, now, window.epoch
        part.not_before, part.avoid, part.refresh = 0.0, (), False
        part.weight = weight
        part.brokers.append(queue.broker_name)
        try:
            part.handle = self.sender.start(part.outgoing(), queue)
        except RocketMQError as exc:
            self._failed(part, exc)
            return
        broker.fifo.append(part)
        broker.requests += weight

    def _cut(self, part: Part, head: int) -> Tuple[Part, Part]:
        """The first ``head`` messages of a run, and a part for the rest (same attempt)."""
        whole = part.whole
        if whole.slots is None:
            whole.slots = [None] * whole.item.count
        where = part.where if part.where is not None else list(range(part.count))
        positions = list(range(part.count))
        first = dataclasses.replace(part, payload=self._narrow(part.payload, positions[:head]),
                                    count=head, where=where[:head], brokers=list(part.brokers))
        rest = dataclasses.replace(part, payload=self._narrow(part.payload, positions[head:]),
                                   count=part.count - head, where=where[head:],
                                   brokers=list(part.brokers))
        return first, rest

    def _finish_oldest(self, broker: BrokerState) -> None:
        part = broker.fifo.popleft()
        in_flight = broker.requests
        broker.requests -= part.weight
        wait = max(part.deadline - time.monotonic(), _MIN_WAIT)
        try:
            results = self.sender.finish(part.handle, wait)
            for r in results:
                if r.status not in self.accept:
                    raise NotAccepted(r.status)
        except PartlyRefused as refusal:
            self._refused_in_part(part, broker, refusal, in_flight)
            return
        except RocketMQError as exc:
            if is_busy(exc):  # one answer refused the whole request
                self._busy(part, broker, exc, 1, in_flight)
            else:
                self._failed(part, exc)
            return
        self._stored(part, broker, results)

    def _stored(self, part: Part, broker: BrokerState, results: Sequence[Any]) -> None:
        broker.window.on_success(part.epoch, part.weight, time.monotonic() - part.sent_at)
        broker.clock.progress()
        stats = self.stats
        stats.requests += part.weight
        stats.bytes += part.outgoing().size
        self._keep(part, list(range(part.count)), results)

    def _keep(self, part: Part, positions: Sequence[int], results: Sequence[Any]) -> None:
        """Results of messages of ``part`` stored; the item is reported once all are."""
        whole = part.whole
        name = part.queue.broker_name
        stats = self.stats
        stats.messages += len(positions)
        stats.by_broker[name] = stats.by_broker.get(name, 0) + len(positions)
        whole.left -= len(positions)
        whole.queue = part.queue
        if whole.slots is not None or whole.left:
            if whole.slots is None:
                whole.slots = [None] * whole.item.count
            where = part.where if part.where is not None else range(part.count)
            for position, result in zip(positions, results):
                whole.slots[where[position]] = result
            results = whole.slots
        if whole.left:
            return
        item = whole.item
        if item.queue is not None and self._fixed.get(item.queue) is whole:
            del self._fixed[item.queue]
        self._open.pop(id(whole), None)
        if self.on_result is not None:
            self.on_result(item, whole.queue, results)

    def _refused_in_part(self, part: Part, broker: BrokerState, refusal: PartlyRefused,
                         in_flight: int) -> None:
        """Keep what was stored, send exactly the refused messages again."""
        if refusal.stored:
            broker.window.on_success(part.epoch, len(refusal.stored),
                                     time.monotonic() - part.sent_at)
            broker.clock.progress()
            self.stats.requests += len(refusal.stored)
            self._keep(part, [p for p, _ in refusal.stored], [r for _, r in refusal.stored])
            where = part.where if part.where is not None else range(part.count)
            part.where = [where[p] for p in refusal.refused]
            part.payload = self._narrow(part.payload, refusal.refused)
            part.count = len(refusal.refused)
        self._busy(part, broker, refusal.cause, len(refusal.refused), in_flight)

    def _busy(self, part: Part, broker: BrokerState, error: BaseException, answers: int,
              in_flight: int) -> None:
        """Back off from the broker and queue the refused request to be sent again."""
        now = time.monotonic()
        name = part.queue.broker_name
        broker.window.on_busy(part.epoch, now, in_flight)
        clock = broker.clock
        clock.busy(error, now, answers)
        stats = self.stats
        stats.busy += answers
        stats.busy_by_broker[name] = stats.busy_by_broker.get(name, 0) + answers
        self.busy_log.note(name, error, now, answers)
        busy_for = clock.busy_for(now)
        if busy_for >= self.busy_timeout:
            failure = BrokerStayedBusy(part.whole.item, name, clock, busy_for,
                                       self.busy_timeout, self.busy_timeout_name, error)
            failure.stored = part.whole.stored()
            raise failure from error
        part.refund = max(part.deadline - part.sent_at, _MIN_WAIT)
        part.handle = None
        self._waiting.append(part)

    def _failed(self, part: Part, exc: RocketMQError) -> None:
        """A real failure: retry (on another broker unless the queue is fixed) or raise."""
        now = time.monotonic()
        part.handle = None
        if not retryable(exc) or part.attempts > self.retries or now >= part.deadline:
            raise self._send_failed(part, exc) from exc
        self.stats.retries += 1
        log.warning("send of %d message(s) to %s failed (%s); retrying (attempt %d of %d)",
                    part.count, part.queue, exc, part.attempts + 1, self.retries + 1)
        part.attempts += 1
        if part.whole.item.queue is not None:
            part.not_before = now + min(0.05 * (part.attempts - 1), max(part.deadline - now, 0))
        else:
            part.avoid, part.refresh = [part.queue.broker_name], True
        self._waiting.append(part)

    def _send_failed(self, part: Part, cause: BaseException) -> SendFailed:
        failure = SendFailed(part.whole.item, part.attempts, time.monotonic() - part.started,
                             cause, part.brokers)
        failure.stored = part.whole.stored()
        return failure
