"""A busy broker is back-pressure, not a failure: how a sender yields.

A RocketMQ broker that cannot keep up refuses requests instead of queueing them without end:
4.9.8's ``BrokerFastFailure`` answers SYSTEM_BUSY to a send that waited longer than
``waitTimeMillsInSendQueue`` (200 ms) in its queue, and the remoting layer answers SYSTEM_BUSY
when the send pool rejects work. Such an answer says "not now", nothing about when: busy is a
window that opens and closes within a second (``shared/captures/rocketmq-4.9.8-flow-control``).
So a sender treats it as a signal to slow down, not as a failed attempt:

* :class:`SendWindow`: per broker, the requests a sender keeps in flight, cut in half on a busy
  answer and grown by one per window's worth of successes (AIMD), between 1 and the
  configured maximum; and the time before which nothing new goes to that broker (exponential
  backoff with jitter, reset by a success).
* :class:`BusyClock`: how long a broker has answered busy without storing anything for us; a
  sender gives up only when that passes its budget (``busy_timeout``).
* :class:`BusyLog`: busy answers are counted and logged at most once a minute per producer.

What is busy: :func:`..busy.is_busy`.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

from ..busy import (
    BACKOFF_FIRST, BACKOFF_LEAST, BACKOFF_MAX, LOG_INTERVAL, busy_remark, is_busy,
)
from ..errors import RocketMQError

log = logging.getLogger(__name__)


class PartlyRefused(RocketMQError):
    """Some messages of one request (a run of single sends, or several gRPC calls) were
    refused as busy and the others stored: only the refused ones are to be sent again.

    ``stored``: (position in the request, that message's result) for each stored message;
    ``refused``: the positions refused; ``cause``: one of the busy answers."""

    def __init__(self, stored: Sequence[Tuple[int, object]], refused: Sequence[int],
                 cause: RocketMQError):
        self.stored, self.refused, self.cause = list(stored), list(refused), cause
        super().__init__(f"{len(refused)} of {len(stored) + len(refused)} messages refused "
                         f"as busy: {cause}")


def refused_in_part(outcomes: Sequence[Tuple[object, Optional[BaseException]]]
                    ) -> Optional[PartlyRefused]:
    """For the per-message outcomes ``(result, error)`` of one request: a
    :class:`PartlyRefused` when every error is a busy answer, else None (no error, or a real
    one the caller raises)."""
    stored, refused, cause = [], [], None
    for i, (result, error) in enumerate(outcomes):
        if error is None:
            stored.append((i, result))
        elif is_busy(error):
            refused.append(i)
            cause = cause or error
        else:
            return None
    return PartlyRefused(stored, refused, cause) if refused else None


@dataclass
class SendWindow:
    """One broker's requests in flight (AIMD) and its backoff.

    Counted in requests on the wire: a run of single sends (half messages) is as many
    requests as messages, so ``maximum`` is ``max_items`` items of the largest seen
    (``unit`` requests); a pipeline cuts a run to fit a smaller window. A busy answer halves
    the window (from what was in flight, when less), never below 1; successes grow it back
    by ``unit / 8`` (at least 1) requests per window's worth, never above ``maximum``.

    ``epoch`` changes at every cut: a busy answer to a request sent before the last cut says
    nothing new (the requests in flight then were refused together) and cuts nothing more,
    as TCP halves its window once per round trip. Each cut also sets ``ready_at``, before
    which nothing new goes to the broker: a backoff doubling from ``first`` (or the time a
    stored request took, ``rtt``, when shorter) up to ``cap``, with equal jitter, back to the
    first step after a success."""

    max_items: int
    unit: int = 1
    limit: float = 0.0
    epoch: int = 0
    ready_at: float = 0.0
    backoff_step: int = 0
    rtt: Optional[float] = None  # a moving average of the time stored requests took
    first: float = BACKOFF_FIRST
    cap: float = BACKOFF_MAX
    rng: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError("the most requests in flight must be at least 1")
        self.limit = float(self.maximum)

    @property
    def maximum(self) -> int:
        return self.max_items * self.unit

    @property
    def size(self) -> int:
        """How many requests may be in flight now."""
        return max(1, int(self.limit))

    def fit(self, requests: int) -> None:
        """An item of ``requests`` requests is coming: a window never cut grows with it."""
        if requests > self.unit:
            whole = self.limit >= self.maximum
            self.unit = requests
            if whole:
                self.limit = float(self.maximum)

    def on_success(self, epoch: int, requests: int = 1, took: Optional[float] = None) -> None:
        """``requests`` requests sent in ``epoch`` were stored, ``took`` seconds after they
        were sent."""
        if took is not None:
            self.rtt = took if self.rtt is None else 0.8 * self.rtt + 0.2 * took
        step = max(1.0, self.unit / 8.0)
        self.limit = min(float(self.maximum), self.limit + requests * step / self.limit)
        if epoch == self.epoch:
            self.backoff_step = 0

    def on_busy(self, epoch: int, now: float, in_flight: Optional[int] = None) -> None:
        """A request sent in ``epoch`` was refused as busy (``in_flight``: requests on the
        wire to the broker then): halve and back off, once per epoch."""
        if epoch == self.epoch:
            base = self.limit if in_flight is None else min(self.limit, float(in_flight))
            self.limit = max(1.0, base / 2.0)
            self.epoch += 1
            self.backoff_step += 1
            first = self.first if self.rtt is None else max(BACKOFF_LEAST,
                                                            min(self.first, self.rtt))
            delay = min(self.cap, first * (2 ** (self.backoff_step - 1)))
            # equal jitter: never less than half the step, so senders spread out but wait
            self.ready_at = max(self.ready_at, now + delay * (0.5 + 0.5 * self.rng()))

    def wait(self, now: float) -> float:
        """Seconds before a new request may go to this broker."""
        return max(0.0, self.ready_at - now)


@dataclass
class BusyClock:
    """A broker's busy answers to one sender: how many, since when without progress, the last
    remark. ``since`` is the first busy answer after the broker last stored something."""

    answers: int = 0
    since: Optional[float] = None
    remark: str = ""
    address: str = ""

    def busy(self, error: BaseException, now: float, answers: int = 1) -> None:
        self.answers += answers
        self.remark = busy_remark(error)
        self.address = getattr(error, "address", "") or self.address
        if self.since is None:
            self.since = now

    def progress(self) -> None:
        self.since = None

    def busy_for(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


@dataclass
class BusyLog:
    """Busy answers seen by one producer, logged at most once per ``interval`` seconds (the
    first at once): a count and the last remark, never a line per request. Thread-safe (the
    producer is shared by the tasks of a process)."""

    interval: float = LOG_INTERVAL
    total: int = 0
    by_broker: Dict[str, int] = field(default_factory=dict)
    _unlogged: int = 0
    _last_log: Optional[float] = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, broker: str, error: BaseException, now: Optional[float] = None,
             answers: int = 1) -> None:
        """Count ``answers`` busy answers from ``broker`` (``error``: the last one)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.total += answers
            self.by_broker[broker] = self.by_broker.get(broker, 0) + answers
            self._unlogged += answers
            if self._last_log is not None and now - self._last_log < self.interval:
                return
            count, self._unlogged = self._unlogged, 0
            since = "" if self._last_log is None else f" in the last {now - self._last_log:.0f} s"
            self._last_log = now
        address = getattr(error, "address", "")
        log.warning("brokers answered busy %d time(s)%s, the last %s%s: %s; sends slow down "
                    "and are repeated, and fail only when a broker stays busy", count, since,
                    broker, f" ({address})" if address else "", busy_remark(error))
