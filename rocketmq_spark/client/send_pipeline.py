"""Pipelined sends: several requests in flight per broker, retries within a deadline.

A :class:`SendPipeline` takes ready-made requests (:class:`Outgoing`: a batch of one topic,
already encoded for its transport) and keeps up to ``max_in_flight_per_broker`` of them
waiting for an answer on each broker. Requests without a fixed queue go to the topic's queues
round robin, as Java's producer chooses them; a failed one is retried on a queue of another
broker. A request with a fixed queue (messages with a sharding key) has at most one request in
flight on that queue and is retried on the same queue, so the queue stores its messages in
submission order even when a send has to be repeated.

The pipeline knows no wire format: a :class:`Sender` (the remoting :class:`~.producer.Producer`
or a gRPC producer) starts and finishes the requests.
"""
from __future__ import annotations

import itertools
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import (
    Any, Callable, Deque, Dict, FrozenSet, Iterable, List, Optional, Protocol, Sequence,
)

from .errors import RocketMQError
from .protocol.route import MessageQueue
from .pull import is_transient

log = logging.getLogger(__name__)

SEND_OK = "SEND_OK"
SEND_STATUSES = ("SEND_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE")
# Below this a finish still reads answers that have already arrived (the deadline may have
# passed while the pipeline was waiting on another broker).
_MIN_WAIT = 0.05


@dataclass
class Outgoing:
    """One request: ``count`` messages of ``topic`` encoded as ``payload`` (``size`` bytes).

    ``queue`` fixes the queue (ordered messages); ``None`` lets the pipeline choose.
    ``first_row`` numbers the first message for error messages (rows of a Spark task)."""

    topic: str
    payload: Any
    count: int
    size: int = 0
    queue: Optional[MessageQueue] = None
    first_row: int = 0


class Sender(Protocol):
    """What a pipeline needs from a transport."""

    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        """The topic's writable queues."""

    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        """Send ``item`` to ``queue`` without waiting; returns a handle for :meth:`finish`."""

    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        """Wait for the answer; returns the results (objects with ``status``), one per
        request or one per message. Raises :class:`RocketMQError` on failure."""


class SendFailed(RocketMQError):
    """A request could not be acknowledged within its retries and deadline."""

    def __init__(self, item: Outgoing, attempts: int, elapsed: float, cause: BaseException,
                 brokers: Sequence[str]):
        self.item, self.attempts, self.cause = item, attempts, cause
        rows = (f"the first at row {item.first_row}" if item.count > 1
                else f"row {item.first_row}")
        super().__init__(
            f"sending {item.count} message(s) ({rows}) to topic {item.topic!r} failed after "
            f"{attempts} attempt(s) in {elapsed * 1000:.0f} ms (brokers tried: "
            f"{', '.join(brokers)}): {cause}")


class NotAccepted(RocketMQError):
    """The broker stored the messages but answered with a status the caller did not accept
    (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE)."""

    def __init__(self, status: str, address: str = ""):
        self.status = status
        super().__init__(f"the broker{' ' + address if address else ''} answered {status}, "
                         "which is not an accepted status")


def retryable(error: BaseException) -> bool:
    """Whether a send may succeed when repeated: broker gone, timeout, busy, or a status the
    caller does not accept. Auth errors, unknown topics and illegal messages are not."""
    return isinstance(error, NotAccepted) or is_transient(error)


@dataclass
class PipelineStats:
    """What a pipeline sent: acknowledged messages and requests, retries, per broker."""

    messages: int = 0
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    by_broker: Dict[str, int] = field(default_factory=dict)


@dataclass
class _Pending:
    item: Outgoing
    queue: MessageQueue
    handle: Any
    attempts: int
    started: float
    deadline: float
    brokers: List[str]


class SendPipeline:
    """Sends :class:`Outgoing` requests through ``sender``; :meth:`flush` waits for them all.

    ``accept``: the statuses that count as acknowledged (SEND_OK, plus any of
    FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE); another status is retried
    like a transient failure. ``on_result(item, queue, results)`` sees every acknowledged
    request. A request that cannot be acknowledged raises :class:`SendFailed` from
    :meth:`submit` or :meth:`flush`; requests already acknowledged stay sent.
    """

    def __init__(self, sender: Sender, *, max_in_flight_per_broker: int = 4,
                 send_timeout: float = 5.0, retries: int = 2,
                 accept: Iterable[str] = (SEND_OK,),
                 on_result: Optional[Callable[[Outgoing, MessageQueue, Sequence[Any]], None]]
                 = None):
        if max_in_flight_per_broker < 1:
            raise ValueError("max_in_flight_per_broker must be at least 1")
        self.sender = sender
        self.max_in_flight = max_in_flight_per_broker
        self.send_timeout = send_timeout
        self.retries = retries
        self.accept: FrozenSet[str] = frozenset(accept)
        self.on_result = on_result
        self.stats = PipelineStats()
        self._rr = itertools.count(random.randrange(1 << 16))
        self._in_flight: Dict[str, Deque[_Pending]] = {}
        self._fixed: Dict[MessageQueue, _Pending] = {}  # fixed queue -> its one request

    # ------------------------------------------------------------------ public

    def submit(self, item: Outgoing) -> None:
        """Send ``item``; blocks while its broker (or its fixed queue) is at its limit."""
        if item.queue is not None:
            while item.queue in self._fixed:
                self._finish_oldest(self._fixed[item.queue].queue.broker_name)
            queue = item.queue
        else:
            queue = self._pick(item.topic, ())
        self._start(item, queue, 1, None, None, [])

    def flush(self) -> PipelineStats:
        """Wait until every submitted request is acknowledged (or raise)."""
        while True:
            busy = [b for b, fifo in self._in_flight.items() if fifo]
            if not busy:
                return self.stats
            for broker in busy:
                self._finish_oldest(broker)

    @property
    def in_flight(self) -> int:
        return sum(len(f) for f in self._in_flight.values())

    # ------------------------------------------------------------------ internals

    def _pick(self, topic: str, avoid: Sequence[str], refresh: bool = False) -> MessageQueue:
        queues = list(self.sender.queues(topic, refresh))
        fresh = [q for q in queues if q.broker_name not in avoid] or queues
        return fresh[next(self._rr) % len(fresh)]

    def _start(self, item: Outgoing, queue: MessageQueue, attempts: int,
               started: Optional[float], deadline: Optional[float], brokers: List[str]) -> None:
        broker = queue.broker_name
        fifo = self._in_flight.setdefault(broker, deque())
        while len(fifo) >= self.max_in_flight:
            self._finish_oldest(broker)
        if started is None:  # the deadline runs from the first send, not from the wait
            started = time.monotonic()
            deadline = started + self.send_timeout
        brokers = brokers + [broker]
        try:
            handle = self.sender.start(item, queue)
        except RocketMQError as exc:
            self._failed(_Pending(item, queue, None, attempts, started, deadline, brokers), exc)
            return
        pending = _Pending(item, queue, handle, attempts, started, deadline, brokers)
        fifo.append(pending)
        if item.queue is not None:
            self._fixed[item.queue] = pending

    def _finish_oldest(self, broker: str) -> None:
        pending = self._in_flight[broker].popleft()
        item = pending.item
        if item.queue is not None and self._fixed.get(item.queue) is pending:
            del self._fixed[item.queue]
        wait = max(pending.deadline - time.monotonic(), _MIN_WAIT)
        try:
            results = self.sender.finish(pending.handle, wait)
            for r in results:
                if r.status not in self.accept:
                    raise NotAccepted(r.status)
        except RocketMQError as exc:
            self._failed(pending, exc)
            return
        stats = self.stats
        stats.messages += item.count
        stats.requests += 1
        stats.bytes += item.size
        stats.by_broker[broker] = stats.by_broker.get(broker, 0) + item.count
        if self.on_result is not None:
            self.on_result(item, pending.queue, results)

    def _failed(self, pending: _Pending, exc: RocketMQError) -> None:
        item = pending.item
        now = time.monotonic()
        if (not retryable(exc) or pending.attempts > self.retries
                or now >= pending.deadline):
            raise SendFailed(item, pending.attempts, now - pending.started, exc,
                             pending.brokers) from exc
        self.stats.retries += 1
        log.warning("send of %d message(s) to %s failed (%s); retrying (attempt %d of %d)",
                    item.count, pending.queue, exc, pending.attempts + 1, self.retries + 1)
        if item.queue is not None:
            queue = item.queue
            time.sleep(min(0.05 * pending.attempts, max(pending.deadline - now, 0)))
        else:
            try:
                queue = self._pick(item.topic, [pending.queue.broker_name], refresh=True)
            except RocketMQError as route_error:
                raise SendFailed(item, pending.attempts, now - pending.started, route_error,
                                 pending.brokers) from route_error
        self._start(item, queue, pending.attempts + 1, pending.started, pending.deadline,
                    pending.brokers)

