"""A background producer for tests that read while messages flow: numbered messages sent from
a thread of its own at a steady rate, each send required to succeed, so every number is stored
exactly once and a test can count what its readers saw."""
from __future__ import annotations

import threading
import time
from typing import Optional

from rocketmq_spark.client import Producer


class PacedFeeder:
    """Subclasses say what to send in :meth:`feed`, calling :meth:`pace` after each send;
    :meth:`join` raises whatever the thread raised and checks that all ``n`` were sent."""

    def __init__(self, namesrv: str, n: int, rate: float):
        self.namesrv, self.n, self.rate = namesrv, n, rate
        self.sent = 0
        self.error: Optional[BaseException] = None
        self._next_at = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "PacedFeeder":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with Producer(self.namesrv) as producer:
                self.restart_pace()
                self.feed(producer)
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def feed(self, producer: Producer) -> None:
        raise NotImplementedError

    def restart_pace(self) -> None:
        """Pace from now on (after a pause)."""
        self._next_at = time.monotonic()

    def pace(self, sent: int) -> None:
        """``sent`` more messages went out: wait for their share of the rate."""
        self.sent += sent
        self._next_at += sent / self.rate
        time.sleep(max(0.0, self._next_at - time.monotonic()))

    def join(self, timeout: float = 300) -> None:
        self._thread.join(timeout)
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}")
        assert self.sent == self.n
