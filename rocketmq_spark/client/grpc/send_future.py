"""The outcome of one :meth:`GrpcProducer.send_async`: a future over the SendMessage calls
the send became, completed on the producer's I/O loop as each call is answered.

When the proxy answers some calls TOO_MANY_REQUESTS (a busy broker behind it) and stores the
others, the result says which (:class:`~..send.backpressure.PartlyRefused`), so only the refused
messages are sent again."""
from __future__ import annotations

import logging
import threading
from typing import Callable, List, Optional

from ..busy import is_busy
from ..send.backpressure import refused_in_part
from ..errors import RequestTimeout, RocketMQError
from ..send.producer import SendResult
from .dispatch import Call

log = logging.getLogger(__name__)


class GrpcSendFuture:
    """The outcome of one :meth:`GrpcProducer.send_async`: :meth:`result` gives one SendResult
    per message (in the order given) or raises the first failure, a
    :class:`~rocketmq_spark.client.errors.RocketMQError`; when every failure was a busy answer
    and some messages were stored, :class:`~..send.backpressure.PartlyRefused` says which."""

    def __init__(self, count: int, address: str):
        self._results: List[Optional[SendResult]] = [None] * count
        self._errors: List[Optional[BaseException]] = [None] * count
        self._error: Optional[BaseException] = None
        self._remaining = 0
        self._address = address
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: List[Callable[["GrpcSendFuture"], None]] = []
        self._on_finish: Optional[Callable[[], None]] = None

    def expect(self, calls: int, on_finish: Optional[Callable[[], None]] = None) -> None:
        """(the producer) The send became ``calls`` calls; ``on_finish`` runs once all are
        answered, before the done callbacks."""
        self._remaining = calls
        self._on_finish = on_finish
        if calls == 0:
            self._finish()

    def record(self, call: Call, results: Optional[List[SendResult]],
               error: Optional[BaseException]) -> None:
        """(the producer's loop) One call's outcome: the results of the messages it carried
        (``call.context.indexes``), or its error."""
        with self._lock:
            if error is not None:
                self._error = self._error or error
                for index in call.context.indexes:
                    self._errors[index] = error
            else:
                for index, result in zip(call.context.indexes, results):
                    self._results[index] = result
            self._remaining -= 1
            if self._remaining:
                return
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        if self._on_finish is not None:
            self._on_finish()
        for fn in callbacks:
            _run_callback(fn, self)

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[["GrpcSendFuture"], None]) -> None:
        """Call ``fn(self)`` when every call has been answered (at once if they have)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def result(self, timeout: Optional[float] = None) -> List[SendResult]:
        if not self._done.wait(timeout):
            raise RequestTimeout(self._address, "SendMessage (waiting for its result)",
                                 timeout or 0.0)
        if self._error is not None:
            partly = refused_in_part(list(zip(self._results, self._errors)))
            if partly is not None:  # busy answers only (maybe to every call)
                raise partly
            # a real failure before a busy one: the send is retried as a whole
            raise next((e for e in self._errors if e is not None and not is_busy(e)),
                       self._error)
        return list(self._results)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        try:
            self.result(timeout)
        except RocketMQError as exc:
            return exc
        return None


def _run_callback(fn: Callable[[GrpcSendFuture], None], future: GrpcSendFuture) -> None:
    try:
        fn(future)
    except Exception:  # noqa: BLE001 - a callback's bug must not break the producer
        log.exception("a GrpcSendFuture callback raised")
