"""Starting SendMessage calls: at most ``max_in_flight`` at once, a message group's one at a time.

Every :meth:`GrpcProducer.send_async` becomes one or more *calls* (see the producer for which).
A call of a FIFO message waits until the previous call of its group has been answered, so a
group's messages are stored in the order given; if one fails, the group's later calls fail
with it rather than overtake it. Other calls start as soon as a slot is free. Calls are started
from the submitting thread or from gRPC's completion callbacks, never blocking the latter.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Deque, Dict, List, Optional

from ..errors import ClientClosed, RequestTimeout


class Call:
    """One SendMessage call to make: ``start()`` returns a grpc future; ``finish(future)`` turns
    its outcome into results or raises."""

    __slots__ = ("start", "finish", "group", "on_done")

    def __init__(self, start: Callable, finish: Callable, group: Optional[str],
                 on_done: Callable[[Optional[list], Optional[BaseException]], None]):
        self.start, self.finish, self.group, self.on_done = start, finish, group, on_done


class Dispatcher:
    """Runs :class:`Call` objects with bounded concurrency and per-group order."""

    def __init__(self, max_in_flight: int, max_queued: int = 100_000):
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._cv = threading.Condition()
        self._ready: Deque[Call] = deque()
        self._groups: Dict[str, Deque[Call]] = {}  # a group with a call in flight or ready
        self._in_flight = 0
        self._queued = 0
        self._closed: Optional[str] = None

    def submit(self, calls: List[Call], timeout: float) -> None:
        """Queue ``calls`` (waiting while too many are queued) and start what may start."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._queued < self.max_queued or self._closed,
                                     timeout):
                raise RequestTimeout("proxy", "SendMessage (waiting for queue space)", timeout)
            if self._closed:
                raise ClientClosed(self._closed)
            for call in calls:
                self._queued += 1
                if call.group is None:
                    self._ready.append(call)
                elif call.group in self._groups:
                    self._groups[call.group].append(call)
                else:
                    self._groups[call.group] = deque()
                    self._ready.append(call)
        self._pump()

    def _pump(self) -> None:
        while True:
            with self._cv:
                if self._in_flight >= self.max_in_flight or not self._ready:
                    return
                call = self._ready.popleft()
                self._in_flight += 1
            try:
                future = call.start()
            except BaseException as exc:  # noqa: BLE001 - reported through the call
                self._finished(call, None, exc)
                continue
            future.add_done_callback(lambda f, call=call: self._completed(call, f))

    def _completed(self, call: Call, future) -> None:
        try:
            results = call.finish(future)
        except BaseException as exc:  # noqa: BLE001 - reported through the call
            self._finished(call, None, exc)
        else:
            self._finished(call, results, None)
        self._pump()

    def _finished(self, call: Call, results, error) -> None:
        dropped: List[Call] = []
        with self._cv:
            self._in_flight -= 1
            self._queued -= 1
            if call.group is not None:
                waiting = self._groups.get(call.group)
                if error is not None and waiting:
                    dropped = list(waiting)  # they may not overtake the failed one
                    waiting.clear()
                    self._queued -= len(dropped)
                if waiting:
                    self._ready.append(waiting.popleft())
                else:
                    self._groups.pop(call.group, None)
            self._cv.notify_all()
        call.on_done(results, error)
        for later in dropped:
            later.on_done(None, error)  # not sent: the same error stands for them

    def close(self, reason: str) -> None:
        """Fail every call not yet started."""
        with self._cv:
            self._closed = reason
            pending = list(self._ready) + [c for q in self._groups.values() for c in q]
            self._ready.clear()
            self._groups.clear()
            self._queued -= len(pending)
            self._cv.notify_all()
        for call in pending:
            call.on_done(None, ClientClosed(reason))

