"""One consume queue: the stored records of (topic, queueId) back to back in one buffer.

Records are kept exactly as a PULL_MESSAGE body carries them, so an unfiltered pull is a single
slice of the buffer: no per-message Python work. Side arrays hold each record's end position,
tag hash code and store timestamp (what a genuine consume-queue entry holds), for the byte cap,
tag filtering and search by time. Retention drops the head (``truncate``), which advances the
min offset exactly like the genuine broker's cleanup does.

The fast-path interface: the embedded broker's C (native/embedded/) reads a queue through
:meth:`ConsumeQueue.buffer_view` only, and writes it through :meth:`ConsumeQueue.append` and
:meth:`ConsumeQueue.extend_timed` only (see :mod:`.store` for the rest of the contract).
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

_LONG = struct.Struct(">q")
CQ_ENTRY_BYTES = 20  # a genuine consume-queue entry; the filter window is counted in these


class QueueBuffer(NamedTuple):
    """A queue's records as they lie, for a fast path that slices them itself.

    Record ``i`` (queue offset ``first_offset + i``) is
    ``buffer[start - buffer_start:record_ends[i] - buffer_start]`` where ``start`` is
    ``record_ends[i - 1]``, or ``buffer_start`` for the first record. ``record_ends`` holds
    signed 64-bit positions (array typecode ``"q"``), absolute: they do not move when retention
    drops the head. The view is the queue's own storage, valid until the queue is next
    written; a reader must not change it.
    """

    first_offset: int
    buffer_start: int
    record_ends: array
    buffer: bytearray


def filter_window(max_msg_nums: int) -> int:
    """Entries a genuine broker examines per pull: max(16000, maxMsgNums * 20) bytes / 20."""
    return max(16000, max_msg_nums * CQ_ENTRY_BYTES) // CQ_ENTRY_BYTES


def scan_kept(ends: Sequence[int], buf, base: int, i0: int, stop: int, prev_end: int,
              keep: Optional[Callable[[int, int], bool]], max_msg_nums: int, max_count: int,
              max_bytes: int) -> Tuple[bytes, int, int]:
    """A filtered pull's scan of entries [i0, stop) (record ``idx`` ends at ``ends[idx]``,
    ``buf`` holds the records from commit-log offset ``base``): keep those ``keep(idx, start)``
    accepts (every one when None), the pull's caps checked before the filter as
    DefaultMessageStore.getMessage does. Returns (body, entries examined, messages kept)."""
    pieces: List[Tuple[int, int]] = []
    total = count = 0
    idx = i0
    while idx < stop:
        end = ends[idx]
        size = end - prev_end
        if count and (max_msg_nums <= count or total + size > max_bytes or count >= max_count):
            break
        if keep is None or keep(idx, prev_end):
            if pieces and pieces[-1][1] == prev_end:
                pieces[-1] = (pieces[-1][0], end)
            else:
                pieces.append((prev_end, end))
            total += size
            count += 1
        prev_end = end
        idx += 1
    return b"".join(buf[s - base:e - base] for s, e in pieces), idx - i0, count


class ConsumeQueue:
    """Records for offsets [min_offset, max_offset) of one queue."""

    __slots__ = ("topic", "queue_id", "_buf", "_buf_start", "_ends", "_tags", "_times", "_first")

    def __init__(self, topic: str, queue_id: int, first_offset: int = 0):
        self.topic = topic
        self.queue_id = queue_id
        self._buf = bytearray()
        self._buf_start = 0          # absolute position of _buf[0]
        self._ends = array("q")      # absolute end position of each record
        self._tags = array("i")      # Java String.hashCode() of TAGS, 0 when untagged
        self._times = array("q")     # store timestamps (ms), non-decreasing
        self._first = first_offset   # queue offset of the first retained record

    # ---------------------------------------------------------------- offsets

    @property
    def min_offset(self) -> int:
        return self._first

    @property
    def max_offset(self) -> int:
        return self._first + len(self._ends)

    def __len__(self) -> int:
        return len(self._ends)

    def buffer_view(self) -> QueueBuffer:
        """The records as they lie (see :class:`QueueBuffer`): what a fast path reads."""
        return QueueBuffer(self._first, self._buf_start, self._ends, self._buf)

    # ---------------------------------------------------------------- writing

    def append(self, record: bytes, tag_code: int, store_timestamp: int) -> int:
        """Add one record; returns its queue offset."""
        offset = self._first + len(self._ends)
        self._buf += record
        self._ends.append(self._buf_start + len(self._buf))
        self._tags.append(tag_code)
        self._times.append(store_timestamp)
        return offset

    def extend(self, records: Sequence[bytes], tag_codes: Iterable[int],
               store_timestamp: int) -> int:
        """Add several records stored at the same time; returns the first one's offset."""
        offset = self._first + len(self._ends)
        end = self._buf_start + len(self._buf)
        ends = self._ends
        for rec in records:
            end += len(rec)
            ends.append(end)
        self._buf += b"".join(records)
        self._tags.extend(tag_codes)
        self._times.extend([store_timestamp] * len(records))
        return offset

    def extend_timed(self, records: Sequence[bytes], tag_codes: Iterable[int],
                     store_timestamps: Iterable[int]) -> int:
        """Add records with a store time each: what :meth:`append` of each in turn does, in one
        call (the embedded broker's C transactional path stores a chunk's records so, see
        native/embedded/rmq_serve_tx.c). Returns the first one's offset."""
        offset = self._first + len(self._ends)
        # the ends without a Python loop: start + the running total of the sizes
        self._ends.extend(map((self._buf_start + len(self._buf)).__add__,
                              accumulate(map(len, records))))
        self._buf += b"".join(records)
        self._tags.extend(tag_codes)
        self._times.extend(store_timestamps)
        return offset

    def reset_empty(self, first_offset: int) -> None:
        """Move an empty queue's offsets (used when replaying a log whose head was dropped)."""
        if self._ends:
            raise ValueError("queue is not empty")
        self._first = first_offset

    def truncate(self, min_offset: int) -> int:
        """Drop records below ``min_offset`` (clamped to max); returns the new min offset."""
        min_offset = min(max(min_offset, self._first), self.max_offset)
        drop = min_offset - self._first
        if drop > 0:
            cut = self._ends[drop - 1]
            del self._buf[:cut - self._buf_start]
            self._buf_start = cut
            del self._ends[:drop]
            del self._tags[:drop]
            del self._times[:drop]
            self._first = min_offset
        return self._first

    # ---------------------------------------------------------------- reading

    def _start_of(self, index: int) -> int:
        return self._ends[index - 1] if index else self._buf_start

    def read(self, offset: int, max_msg_nums: int, max_count: int,
             max_bytes: int) -> Tuple[bytearray, int, int]:
        """Unfiltered pull from ``offset`` (min <= offset < max).

        Returns (body, entries examined, messages returned); the first message is always
        returned, whatever its size, as the genuine broker does.
        """
        i = offset - self._first
        n = min(max(max_msg_nums, 1), max(max_count, 1), len(self._ends) - i,
                filter_window(max_msg_nums))
        start = self._start_of(i)
        j = bisect_right(self._ends, start + max_bytes, i, i + n)
        k = max(j - i, 1)
        end = self._ends[i + k - 1]
        base = self._buf_start
        return self._buf[start - base:end - base], k, k

    def read_filtered(self, offset: int, codes: frozenset, max_msg_nums: int, max_count: int,
                      max_bytes: int) -> Tuple[bytes, int, int]:
        """Tag-filtered pull: scan at most the genuine window, keep entries whose tag hash is in
        ``codes``. Returns (body, entries examined, messages returned)."""
        i0 = offset - self._first
        stop = min(len(self._ends), i0 + filter_window(max_msg_nums))
        tags = self._tags
        return scan_kept(self._ends, self._buf, self._buf_start, i0, stop, self._start_of(i0),
                         lambda idx, _: tags[idx] in codes, max_msg_nums, max_count, max_bytes)

    def record(self, offset: int) -> bytes:
        """The stored record at ``offset`` (for tests and GET_CONSUME_STATS)."""
        i = offset - self._first
        if not 0 <= i < len(self._ends):
            raise IndexError(offset)
        base = self._buf_start
        return bytes(self._buf[self._start_of(i) - base:self._ends[i] - base])

    def record_long(self, offset: int, at: int) -> int:
        """The big-endian 8-byte number at byte ``at`` of the record at ``offset`` (e.g. its
        physical offset at 28), without copying the record."""
        i = offset - self._first
        if not 0 <= i < len(self._ends):
            raise IndexError(offset)
        return _LONG.unpack_from(self._buf, self._start_of(i) - self._buf_start + at)[0]

    def overwrite(self, offset: int, record: bytes) -> bytes:
        """Replace the stored bytes of the record at ``offset`` with ``record`` of the same
        length and return the previous bytes (fault injection: pulls serve the new bytes as
        they are, and the record's extent stays what the consume queue says, as on a genuine
        broker whose commit log went bad)."""
        i = offset - self._first
        if not 0 <= i < len(self._ends):
            raise IndexError(offset)
        base = self._buf_start
        start, end = self._start_of(i) - base, self._ends[i] - base
        if len(record) != end - start:
            raise ValueError(f"record at offset {offset} is {end - start} bytes, not "
                             f"{len(record)}")
        old = bytes(self._buf[start:end])
        self._buf[start:end] = record
        return old

    def store_time(self, offset: int) -> Optional[int]:
        i = offset - self._first
        return self._times[i] if 0 <= i < len(self._times) else None

    def earliest_time(self) -> int:
        """Store time of the message at the min offset; -1 when nothing is retained."""
        return self._times[0] if self._times else -1

    def search(self, timestamp: int, boundary: str = "lower") -> int:
        """Offset by store time.

        ``lower`` (5.1.1+ default): the smallest offset whose store time >= timestamp, the max
        offset when every message is older. ``upper``: the largest offset whose store time <=
        timestamp, the min offset when every message is newer. ``nearest`` (4.x): the entry
        closest in time, the last message when every message is older. Nothing retained: the
        max offset (0 for a queue never written).
        """
        times = self._times
        n = len(times)
        if n == 0:
            return self.max_offset
        if boundary == "upper":
            return self._first + max(bisect_right(times, timestamp) - 1, 0)
        idx = bisect_left(times, timestamp)
        if boundary == "nearest":
            if idx >= n:
                return self._first + n - 1
            if times[idx] == timestamp or idx == 0:
                return self._first + idx
            left, right = times[idx - 1], times[idx]
            return self._first + (idx if abs(timestamp - left) > abs(timestamp - right)
                                  else idx - 1)
        return self._first + idx
