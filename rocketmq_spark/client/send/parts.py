"""What a :class:`~.pipeline.SendPipeline` keeps of each request on its way: the item
submitted (until all of its messages are stored), the part of it one request carries (a run
may go in parts, or be answered in parts), and each broker's requests on the wire."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, List, Optional, Sequence

from .backpressure import BusyClock, SendWindow
from ..protocol.route import MessageQueue


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


@dataclass(eq=False)
class Item:
    """A submitted request until every message of it is stored: the results stored so far,
    in the item's order (``slots``, once it was sent or answered in parts)."""

    item: Outgoing
    left: int
    slots: Optional[List[Any]] = None
    queue: Optional[MessageQueue] = None

    def stored(self) -> List[Any]:
        return [] if self.slots is None else [s for s in self.slots if s is not None]


@dataclass(eq=False)
class Part:
    """What of an item one request carries (all of it, or the messages at ``where``), with
    its attempts and send deadline."""

    whole: Item
    payload: Any
    count: int
    where: Optional[List[int]] = None
    queue: Optional[MessageQueue] = None
    handle: Any = None
    weight: int = 1
    attempts: int = 1
    started: Optional[float] = None
    deadline: Optional[float] = None
    refund: Optional[float] = None  # deadline left when a busy answer came; restored on resend
    sent_at: float = 0.0
    epoch: int = 0
    not_before: float = 0.0
    avoid: Sequence[str] = ()
    refresh: bool = False
    brokers: List[str] = field(default_factory=list)

    def outgoing(self) -> Outgoing:
        item = self.whole.item
        if self.where is None:
            return item
        return Outgoing(item.topic, self.payload, self.count,
                        item.size * self.count // max(item.count, 1), item.queue, item.first_row)


@dataclass
class BrokerState:
    window: SendWindow
    fifo: Deque[Part] = field(default_factory=deque)
    clock: BusyClock = field(default_factory=BusyClock)
    requests: int = 0  # on the wire
