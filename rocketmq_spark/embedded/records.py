"""Storing records: encode, tag code, append, wake the parked pulls. Written once.

Every way a message enters a broker (a send, END_TRANSACTION's commit and op message, a check
pass's copies, a delayed message coming due, the cluster's direct ``append``) goes through
:meth:`RecordWriter.append`, so they all take the queue offset, the physical offset and the store
time the same way and wake long polls the same way. The broker's C path for transactional
sends (``serve_tx``) does the same steps through the store's own append methods and
``LongPollService.notify_arrival_soon``; a test holds the two paths together.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, NamedTuple, Optional, Sequence

from ..client.protocol.codes import PERM_READ, PERM_WRITE
from ..client.protocol.message import record_layout
from .commitlog import tag_code_of as tag_code  # the rule the commit log's replay uses too
from .store import BrokerStore, TopicConfig

if TYPE_CHECKING:  # pragma: no cover
    from .long_poll import LongPollService

__all__ = ["Appended", "RecordWriter", "ensure_system_topic", "properties_text", "tag_code"]

# encode(index in the run, queue offset, physical offset, store time) -> the stored record
Encoder = Callable[[int, int, int, int], bytes]


def properties_text(record: bytes) -> str:
    """The properties of a stored record, as text."""
    layout = record_layout(record, 0, len(record))
    return bytes(record[layout[9]:layout[9] + layout[10]]).decode("utf-8")


def ensure_system_topic(store: BrokerStore, topic: str) -> None:
    """A system topic (half, op, schedule overflow) gets a config, 1 queue RW, when first used,
    so it routes and pulls like any topic."""
    if topic not in store.topics:
        store.put_topic(TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE))


class Appended(NamedTuple):
    """Where a run of records went: the first one's queue and physical offsets."""

    queue_offset: int
    physical_offset: int
    records: List[bytes]


class RecordWriter:
    """Appends runs of records to one broker's store and wakes the pulls parked on them."""

    def __init__(self, store: BrokerStore, long_poll: "LongPollService"):
        self.store = store
        self.long_poll = long_poll

    def append(self, topic: str, queue_id: int, encode: Encoder, count: int = 1,
               codes: Optional[Sequence[int]] = None, store_timestamp: Optional[int] = None,
               wake_after_answer: bool = True) -> Appended:
        """Encode ``count`` records for the queue's next offsets and store them as one run.

        ``codes`` are their tag codes (None: read from each record's TAGS); the store time is
        the store's clock unless given. Parked pulls are woken after the current request is
        answered (as a genuine broker's dispatch thread does), or at once for records stored
        outside a request (``wake_after_answer=False``, the schedule service)."""
        store = self.store
        queue = store.queue(topic, queue_id)
        now = store.now() if store_timestamp is None else store_timestamp
        first, phys = queue.max_offset, store.commit_log.size
        records: List[bytes] = []
        at = phys
        for index in range(count):
            record = encode(index, first + index, at, now)
            records.append(record)
            at += len(record)
        if not records:
            return Appended(first, phys, records)
        if codes is None:
            codes = [tag_code(properties_text(record)) for record in records]
        store.append(queue, records, codes, now)
        if wake_after_answer:
            self.long_poll.notify_arrival_soon(topic, queue_id, queue.max_offset, codes)
        else:
            self.long_poll.notify_arrival(topic, queue_id, queue.max_offset, codes)
        return Appended(first, phys, records)
