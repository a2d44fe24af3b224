"""What a :class:`~.reader.QueueRangeReader` asks of a pull engine, what an engine uses of its
reader (:class:`RangeReading`), and the batch it fills.

An engine keeps pulls in flight for one queue range and the bodies of the batch being filled;
the reader acts on every answer that is not a plain FOUND (see the reader's module doc). Two
engines exist: :class:`~.python_pull_engine.PythonPullEngine` and
:class:`~.native_pull_engine.NativePullEngine` (the C loop); the reader picks one per range.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, List, Optional, Protocol, Tuple

import pyarrow as pa

from ..broker import BrokerClient
from ..pull import PullRequest, PullResult
from .settings import ReadSettings


def join(parts: List) -> object:
    """Concatenate pull bodies into a buffer from Arrow's memory pool, which is reused from one
    batch to the next (a fresh multi-megabyte bytes object faults in new pages every time)."""
    if len(parts) == 1:
        return parts[0]
    out = pa.allocate_buffer(sum(len(p) for p in parts))
    view = memoryview(out).cast("B")
    pos = 0
    for part in parts:
        view[pos:pos + len(part)] = part
        pos += len(part)
    return out


class RangeReading(Protocol):
    """What an engine uses of the reader it serves (the reader imports the engines, so they
    name it by this)."""

    settings: ReadSettings
    brokers: BrokerClient
    start: int
    end: int
    filtered: bool

    @property
    def broker_id(self) -> int: ...

    def broker_address(self) -> str: ...

    def pull_request(self, offset: int, nums: Optional[int] = None) -> PullRequest: ...

    def decode_batch(self, data, pieces: Callable[[], Tuple[List, List[int]]]
                     ) -> pa.RecordBatch: ...


class PullEngine(ABC):
    """A pipeline of pulls for one reader and the bodies of the batch being filled.

    :meth:`advance` returns ``(offset, result)``: the offset after the FOUND answers the
    engine consumed itself and the answer (a :class:`~..pull.PullResult`) the reader must act
    on, or ``None`` when the batch is full or the range's end reached. The reader hands FOUND
    bodies back with :meth:`add` and takes a batch with :meth:`decode`."""

    name = ""

    def __init__(self, reader: RangeReading):
        self.reader = reader
        self.settings = reader.settings
        self.answers = 0  # answers the reader acted on
        self.depth = 1 if reader.filtered else max(1, self.settings.pipeline_depth)
        self.window = self.depth  # requests allowed in flight now (less after a busy answer)
        self.bodies: List = []
        self.firsts: List[int] = []
        self.nbytes = 0
        self.messages = 0

    @abstractmethod
    def advance(self, offset: int) -> Tuple[int, Optional[PullResult]]:
        """Pull from ``offset`` on until an answer needs the reader or the batch is full."""

    @abstractmethod
    def abandon(self) -> None:
        """Forget the pulls in flight (their answers are dropped on arrival)."""

    def resume_offset(self, offset: int) -> int:
        """Where to pull next after :meth:`advance` from ``offset`` raised: past whatever
        the engine already put in the batch, so nothing is read twice."""
        return offset

    def narrow(self) -> None:
        """A busy answer: one pull in flight from now on, doubling back to ``depth`` with
        each answer, so a broker in flow control gets one request per backoff, not a burst."""
        self.window = 1

    def widen(self) -> None:
        """An answer arrived: the window doubles back towards ``depth``."""
        if self.window < self.depth:
            self.window = min(self.depth, self.window * 2)

    def acted_on_answer(self) -> None:
        self.answers += 1

    def add(self, body, first: int, messages: int) -> None:
        """A FOUND body (its first offset, how many messages of the range it holds)."""
        self.bodies.append(body)
        self.firsts.append(first)
        self.nbytes += len(body)
        self.messages += messages

    def buffered(self) -> bool:
        return bool(self.bodies)

    def full(self) -> bool:
        s = self.settings
        return bool(self.bodies) and (self.nbytes >= s.batch_max_bytes
                                      or self.messages >= s.batch_max_messages)

    def decode(self) -> pa.RecordBatch:
        """The buffered bodies as one batch; the buffer starts over empty."""
        bodies, firsts = self.bodies, self.firsts
        self.bodies, self.firsts, self.nbytes, self.messages = [], [], 0, 0
        return self.reader.decode_batch(join(bodies), lambda: (bodies, firsts))

    def moved(self) -> None:
        """The broker sent the reader elsewhere (suggestWhichBrokerId)."""
        self.abandon()

    def count(self) -> int:
        """How many pulls were answered."""
        return self.answers

    def close(self) -> None:
        self.abandon()
