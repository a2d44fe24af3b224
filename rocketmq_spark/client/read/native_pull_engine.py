"""The native pull engine: the C loop (native/client/rmq_pull.c) consumes FOUND answers.

Their bodies stay in the loop's buffer and are decoded there in place; everything else comes
back to the reader as a :class:`~..pull.PullResult`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import pyarrow as pa

from . import native_pull
from .native_pull_driver import PULL_RESPONSE, run_puller
from ..pull import PullResult, PullStatus, pull_result
from .pull_engine import PullEngine, RangeReading


def split_output(data: bytes, pieces: List[Tuple[int, int]]) -> Tuple[List[bytes], List[int]]:
    """The native loop's output cut back into each pull's body, with its first offset."""
    bodies, firsts = [], []
    for k, (start, first) in enumerate(pieces):
        stop = pieces[k + 1][0] if k + 1 < len(pieces) else len(data)
        bodies.append(data[start:stop])
        firsts.append(first)
    return bodies, firsts


class NativePullEngine(PullEngine):
    """A ``_native.Puller`` per connection; FOUND bodies go to its buffer, and move to the
    Python buffer only when the loop is retired (another broker, a new connection)."""

    name = "native"

    def __init__(self, reader: RangeReading):
        self.puller = None
        self.conn = None
        super().__init__(reader)
        self.native_pulls = 0  # FOUND answers consumed by earlier loops of this reader
        self.reached = reader.start  # the output covers the range up to here

    @property
    def window(self) -> int:
        """The loop's window (see :meth:`PullEngine.narrow`); kept here between loops."""
        return self.puller.window if self.puller is not None else self._window

    @window.setter
    def window(self, value: int) -> None:
        self._window = value
        if self.puller is not None:
            self.puller.window = value

    def _loop(self):
        """The loop for the reader's current broker, made anew when the connection changed."""
        reader = self.reader
        address = reader.broker_address()
        conn = reader.brokers.remoting.connection(address)
        if self.puller is None or conn is not self.conn or conn.closed:
            self._retire()
            puller = native_pull.make_puller(
                conn, reader.pull_request(reader.start), reader.end, self.depth,
                reader.filtered, reader.broker_id, reader.brokers.remoting.config.version)
            if puller is None:
                raise RuntimeError(f"connection to {address} cannot run the native pull loop")
            puller.window = self._window
            self.puller, self.conn = puller, conn
        return self.puller

    def advance(self, offset: int) -> Tuple[int, Optional[PullResult]]:
        s = self.settings
        if offset >= self.reader.end or self.full():
            return offset, None
        self.reached = offset
        puller = self._loop()
        room = (max(0, s.batch_max_messages - self.messages),
                max(0, s.batch_max_bytes - self.nbytes))
        try:
            reason, offset, response = run_puller(self.conn, puller, offset, s.pull_timeout,
                                                  *room)
        finally:  # the loop may have consumed answers before what it raises for
            self.reached = max(self.reached, puller.reached)
        if reason != PULL_RESPONSE:
            return offset, None
        result = pull_result(response, "PULL_MESSAGE", self.conn.address)
        if result.status is PullStatus.FOUND:
            self.widen()
        return offset, result

    def resume_offset(self, offset: int) -> int:
        return max(offset, self.reached)

    def _retire(self) -> None:
        """Move the old loop's output to Python and forget its requests."""
        puller, self.puller, self.conn = self.puller, None, None
        if puller is None:
            return
        self._window = puller.window
        puller.abandon()
        self.native_pulls += puller.pulls
        self._take_output(puller)

    def _take_output(self, puller) -> None:
        if puller.nbytes or puller.messages:
            bodies, firsts = split_output(bytes(memoryview(puller)), puller.pieces())
            self.bodies.extend(bodies)
            self.firsts.extend(firsts)
            self.nbytes += puller.nbytes
            self.messages += puller.messages
            puller.clear()

    def add(self, body, first: int, messages: int) -> None:
        if self.puller is not None:
            self.puller.append(body, first, messages)
        else:
            super().add(body, first, messages)

    def _native_bytes(self) -> int:
        return self.puller.nbytes if self.puller is not None else 0

    def buffered(self) -> bool:
        return bool(self.bodies) or self._native_bytes() > 0 or (
            self.puller is not None and self.puller.messages > 0)

    def full(self) -> bool:
        s = self.settings
        messages = self.messages + (self.puller.messages if self.puller is not None else 0)
        nbytes = self.nbytes + self._native_bytes()
        return self.buffered() and (nbytes >= s.batch_max_bytes
                                    or messages >= s.batch_max_messages)

    def decode(self) -> pa.RecordBatch:
        puller = self.puller
        if puller is None or self.bodies:
            if puller is not None:
                self._take_output(puller)
            return super().decode()
        with memoryview(puller) as view:  # decoded in place; released before clear()
            batch = self.reader.decode_batch(
                view, lambda: split_output(bytes(view), puller.pieces()))
        puller.clear()
        return batch

    def moved(self) -> None:
        self._retire()

    def abandon(self) -> None:
        if self.puller is not None:
            self.puller.abandon()

    def close(self) -> None:
        self._retire()

    def count(self) -> int:
        return self.answers + self.native_pulls + (self.puller.pulls if self.puller else 0)
