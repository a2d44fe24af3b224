"""The producer's I/O thread: an asyncio event loop that owns its grpc.aio channel.

gRPC's synchronous API completes every call on a channel thread of its own and hands each
completion to Python through locks and condition variables; with one message per call that
costs more than the message. grpc.aio completes calls on the loop that started them, many per
wake-up, so a producer runs one loop in a daemon thread: other threads hand it work in bulk
(:meth:`IoLoop.call_soon`, one wake-up per send) or run a coroutine there and wait
(:meth:`IoLoop.run`).

Every producer of a process shares one loop (:func:`shared_io_loop`) that is never closed:
grpc.aio's poller thread keeps handing completions to the loop it first served, so a closed
loop makes it print "Event loop is closed" tracebacks, and a second loop is not supported.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Awaitable, Callable, Optional


class IoLoop:
    """An event loop running in a daemon thread for the rest of the process's life."""

    def __init__(self, name: str = "rocketmq-grpc-io"):
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop (from any thread)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def submit(self, coro: Awaitable) -> "concurrent.futures.Future":
        """Start ``coro`` on the loop; a future of its outcome."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable, timeout: Optional[float] = None) -> Any:
        """Run ``coro`` on the loop and wait for its outcome (not from the loop thread: a
        callback that runs there must not wait on the producer)."""
        if self.in_loop_thread:
            coro.close()
            raise RuntimeError("a GrpcProducer call that waits was made from the producer's "
                               "own I/O thread (a done callback); callbacks must not block")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


_shared: Optional[IoLoop] = None
_shared_pid = 0
_shared_lock = threading.Lock()


def shared_io_loop() -> IoLoop:
    """This process's I/O loop for grpc.aio, started on first use (again in a forked child,
    which does not inherit the parent's thread) and never stopped."""
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            _shared, _shared_pid = IoLoop(), os.getpid()
        return _shared
