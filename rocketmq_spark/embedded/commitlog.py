"""The broker's commit log: stored records appended back to back, optionally in a file.

Like a genuine commit log, the physical offset of a record is its position in the log, and the
records already carry topic, queue id and queue offset, so replaying the file rebuilds every
queue. Without a path the log only counts bytes (physical offsets still advance).
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ..client.errors import MessageDecodeError
from ..client.protocol.message import record_layout
from ..client.protocol.properties import TAGS, java_string_hash, property_value

log = logging.getLogger(__name__)


@dataclass
class ReplayedRecord:
    topic: str
    queue_id: int
    queue_offset: int
    record: bytes
    tag_code: int
    store_timestamp: int


def tag_code_of(properties_text: str) -> int:
    """The consume-queue tag code: Java hashCode of the TAGS property, 0 without tags."""
    tags = property_value(properties_text, TAGS)
    return java_string_hash(tags) if tags else 0


class CommitLog:
    """Append-only log of stored records; ``size`` is the next physical offset."""

    def __init__(self, path: Optional[Path] = None):
        self.path = path
        self.size = 0
        self._fd: Optional[int] = None

    def replay(self) -> Iterator[ReplayedRecord]:
        """Yield every complete record of the file, then open it for appending.

        A torn record at the end (the process died mid-write) is cut off.
        """
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        good = 0
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as fh, mmap.mmap(fh.fileno(), 0,
                                                        access=mmap.ACCESS_READ) as mm:
                end = len(mm)
                pos = 0
                while pos < end:
                    try:
                        (total, _magic, sys_flag, born_len, _store_len, _body_pos, _body_len,
                         topic_pos, topic_len, props_pos, props_len) = record_layout(mm, pos, end)
                    except MessageDecodeError as exc:
                        log.warning("commit log %s: dropping %d bytes after offset %d: %s",
                                    self.path, end - pos, pos, exc)
                        break
                    queue_id, = struct.unpack_from(">i", mm, pos + 12)
                    queue_offset, = struct.unpack_from(">q", mm, pos + 20)
                    store_ts, = struct.unpack_from(">q", mm, pos + 48 + born_len)
                    topic = mm[topic_pos:topic_pos + topic_len].decode("utf-8")
                    props = mm[props_pos:props_pos + props_len].decode("utf-8")
                    yield ReplayedRecord(topic, queue_id, queue_offset, mm[pos:pos + total],
                                         tag_code_of(props), store_ts)
                    pos += total
                good = pos
            if good != self.path.stat().st_size:
                os.truncate(self.path, good)
        self.size = good
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, data: bytes) -> None:
        """Append records whose physical offsets start at ``size``."""
        if self._fd is not None:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        self.size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
