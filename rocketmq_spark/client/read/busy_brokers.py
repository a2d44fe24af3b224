"""Back-pressure from a broker in flow control: per-broker backoff for pulls answered busy.

What is busy is :func:`..busy.is_busy` (the senders act on it too). A genuine
broker answers SYSTEM_BUSY to a pull that waited longer than
``waitTimeMillsInPullQueue`` (5 s) in its pull thread pool's queue (4.9's BrokerFastFailure,
``[TIMEOUT_CLEAN_QUEUE]``) or that found the queue full (``pullThreadPoolQueueCapacity``,
100,000; NettyRemotingAbstract's ``[OVERLOAD]``); a 5.x rate limit answers FLOW_CONTROL. The
broker is alive and says "later": that is no failed attempt. Readers of one process share what
they learn per broker (its name at its address, :func:`busy_target`): the first busy answer
after a wait starts a longer wait (exponential, with jitter, capped); busy answers to pulls
sent before it only count. Any other answer from the broker ends the episode. A reader gives
up only when the broker has answered nothing but busy for longer than its budget (the
source's ``brokerBusyTimeoutMs``).

Busy answers are counted per broker and logged at most once a minute per broker.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..busy import LOG_INTERVAL
from ..errors import RocketMQError

log = logging.getLogger(__name__)


class BrokerBusyError(RocketMQError):
    """A broker answered nothing but busy (flow control) for longer than the budget."""

    def __init__(self, broker: str, address: str, seconds: float, answers: int, remark: str,
                 option: str, budget_ms: int):
        self.broker, self.address, self.seconds, self.answers = broker, address, seconds, answers
        self.remark, self.option, self.budget_ms = remark, option, budget_ms
        super().__init__(
            f"broker {broker} at {address} kept answering pulls busy (flow control) for "
            f"{seconds:.1f} s: {answers} busy answers and no other answer since the first "
            f"(last: {remark or 'no remark'}). Gave up after {option}={budget_ms}; raise it to "
            "ride out longer flow control, or read with fewer concurrent tasks")


@dataclass
class _Broker:
    delay: float = 0.0            # the upper bound of the next wait (0: none yet)
    until: float = 0.0            # no new pulls before this time
    since: Optional[float] = None  # the first busy answer with no other answer after it
    answers: int = 0              # busy answers since ``since``
    total: int = 0                # busy answers ever
    unlogged: int = 0             # busy answers not yet in a log line
    logged_at: float = float("-inf")
    remark: str = ""


class BusyBrokers:
    """Busy episodes per broker address; thread-safe. ``active`` is the number of brokers in
    an episode, so a reader's no-busy path costs one attribute read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = random.random):
        self._clock, self._jitter = clock, jitter
        self._brokers: Dict[str, _Broker] = {}
        self._lock = threading.Lock()
        self.active = 0

    def busy(self, address: str, remark: str, base: float, cap: float) -> float:
        """Count a busy answer from ``address``; returns how long to wait before pulling from
        it again. Only the first busy answer after a wait lengthens the next one: the others
        answer pulls sent before it."""
        now = self._clock()
        with self._lock:
            b = self._brokers.setdefault(address, _Broker())
            if b.since is None:
                b.since, b.answers, b.delay = now, 0, max(base, 1e-3)
                self.active += 1
            b.answers += 1
            b.total += 1
            b.unlogged += 1
            b.remark = remark
            if now >= b.until:
                b.until = now + b.delay * (0.5 + 0.5 * self._jitter())  # equal jitter
                b.delay = min(cap, b.delay * 2)
            if now - b.logged_at >= LOG_INTERVAL:
                log.warning("broker %s is in flow control; busy answers to pulls: %d since the "
                            "last report, %d in this episode (%.1f s long; last: %s); pulls to "
                            "it back off, now for %.2f s", address, b.unlogged, b.answers,
                            now - b.since, remark, b.until - now)
                b.logged_at, b.unlogged = now, 0
            return max(0.0, b.until - now)

    def wait(self, address: str) -> float:
        """How long pulls to ``address`` should still wait (0 when not backed off)."""
        b = self._brokers.get(address)
        return 0.0 if b is None else max(0.0, b.until - self._clock())

    def episode(self, address: str) -> Tuple[float, int, str]:
        """(seconds since the episode's first busy answer, busy answers in it, last remark);
        (0, 0, "") when the broker is not in an episode."""
        with self._lock:
            b = self._brokers.get(address)
            if b is None or b.since is None:
                return 0.0, 0, ""
            return self._clock() - b.since, b.answers, b.remark

    def end_episode(self, address: str) -> None:
        """The broker gave an answer that was not busy (or a reader gave up on it): its
        episode ends, and the next busy answer starts a new one with a fresh budget."""
        with self._lock:
            b = self._brokers.get(address)
            if b is not None and b.since is not None:
                b.since, b.answers, b.delay, b.until = None, 0, 0.0, 0.0
                self.active -= 1

    def total(self, address: str) -> int:
        """Busy answers ever counted for ``address`` in this process."""
        b = self._brokers.get(address)
        return 0 if b is None else b.total


def busy_target(address: str, broker_name: str) -> str:
    """What a backoff is kept for: one broker at one address. Brokers behind a 5.x proxy's
    remoting port share its address; one of them in flow control must neither hold up the
    others' readers nor have its episode (and budget) ended by their answers."""
    return f"{broker_name}@{address}" if broker_name else address


BUSY_BROKERS = BusyBrokers()  # shared by the readers of this process
