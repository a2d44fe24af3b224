"""Running SendMessage calls on the producer's event loop: at most ``max_in_flight`` at once,
a message group's one at a time.

Every :meth:`GrpcProducer.send_async` becomes one or more *calls* (see the producer for which),
handed to the loop in one piece. A call of a FIFO message waits until the previous call of its
group has been answered, so a group's messages are stored in the order given; if one fails,
the group's later calls fail with it rather than overtake it. Other calls start as soon as a
slot is free.

Everything here runs on the loop thread, so nothing is locked. A slot is a worker coroutine
that takes ready calls one after another until none is left; workers are started only when
ready calls outnumber them, so a busy producer starts no task per call.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Awaitable, Callable, Deque, Dict, List, Optional, Sequence

from ..errors import ClientClosed


class Call:
    """One SendMessage call: its request, its message group (FIFO) or None, and
    ``on_done(call, results, error)`` for its outcome. ``context`` is the producer's own."""

    __slots__ = ("request", "group", "on_done", "context")

    def __init__(self, request: Any, group: Optional[str],
                 on_done: Callable[["Call", Optional[list], Optional[BaseException]], None],
                 context=None):
        self.request, self.group, self.on_done, self.context = request, group, on_done, context


class Dispatcher:
    """Runs :class:`Call` objects through ``invoke(call)`` (a coroutine giving the call's
    results or raising) with bounded concurrency and per-group order. Loop thread only."""

    def __init__(self, max_in_flight: int, invoke: Callable[[Call], Awaitable[list]]):
        self.max_in_flight = max_in_flight
        self._invoke = invoke
        self._ready: Deque[Call] = deque()
        self._groups: Dict[str, Deque[Call]] = {}  # a group with a call in flight or ready
        self._workers = 0
        self._closed: Optional[str] = None

    @property
    def in_flight(self) -> int:
        return self._workers

    def submit(self, calls: Sequence[Call]) -> None:
        """Queue ``calls`` and start what may start."""
        if self._closed is not None:
            error = ClientClosed(self._closed)
            for call in calls:
                call.on_done(call, None, error)
            return
        ready, groups = self._ready, self._groups
        for call in calls:
            group = call.group
            if group is None:
                ready.append(call)
            elif group in groups:
                groups[group].append(call)
            else:
                groups[group] = deque()
                ready.append(call)
        self._spawn()

    def _spawn(self) -> None:
        wanted = min(self.max_in_flight - self._workers, len(self._ready))
        if wanted > 0:
            loop = asyncio.get_running_loop()
            for _ in range(wanted):
                self._workers += 1
                loop.create_task(self._work())

    async def _work(self) -> None:
        ready = self._ready
        try:
            while ready:
                call = ready.popleft()
                try:
                    results = await self._invoke(call)
                except asyncio.CancelledError:
                    self._finished(call, None, ClientClosed(
                        self._closed or "the SendMessage call was cancelled"))
                    if _cancelling():
                        raise  # this worker is being cancelled (the loop is stopping)
                except BaseException as exc:  # noqa: BLE001 - reported through the call
                    self._finished(call, None, exc)
                else:
                    self._finished(call, results, None)
        finally:
            self._workers -= 1

    def _finished(self, call: Call, results, error) -> None:
        dropped: List[Call] = []
        group = call.group
        if group is not None:
            waiting = self._groups.get(group)
            if error is not None and waiting:
                dropped = list(waiting)  # they may not overtake the failed one
                waiting.clear()
            if waiting:
                self._ready.append(waiting.popleft())
            else:
                self._groups.pop(group, None)
        call.on_done(call, results, error)
        for later in dropped:
            later.on_done(later, None, error)  # not sent: the same error stands for them

    def close(self, reason: str) -> None:
        """Fail every call not yet started (calls in flight end with the channel)."""
        self._closed = reason
        pending = list(self._ready) + [c for q in self._groups.values() for c in q]
        self._ready.clear()
        self._groups.clear()
        error = ClientClosed(reason)
        for call in pending:
            call.on_done(call, None, error)


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not merely the call it awaited,
    which grpc.aio cancels when the channel closes)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling()) if cancelling is not None else True
