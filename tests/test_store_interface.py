"""The store's fast-path interface (embedded/store.py, embedded/queue.py): what the embedded
broker's C (native/embedded/) reads and writes of the store, and nothing else."""
from __future__ import annotations

import re
from pathlib import Path

from rocketmq_spark.embedded.queue import ConsumeQueue, QueueBuffer
from rocketmq_spark.embedded.store import BrokerStore

EMBEDDED_C = Path(__file__).resolve().parent.parent / "native" / "embedded"


def _record(view: QueueBuffer, index: int) -> bytes:
    start = view.record_ends[index - 1] if index else view.buffer_start
    end = view.record_ends[index]
    return bytes(view.buffer[start - view.buffer_start:end - view.buffer_start])


def test_buffer_view_slices_each_record_as_the_queue_reads_it():
    queue = ConsumeQueue("T", 0, first_offset=7)
    queue.append(b"a" * 5, 0, 1)
    queue.extend([b"bb", b"ccc"], [1, 2], 2)
    queue.extend_timed([b"dddd", b"e"], [3, 4], [3, 4])
    queue.truncate(9)  # retention drops the head: positions stay absolute
    view = queue.buffer_view()
    assert view.first_offset == queue.min_offset == 9
    assert view.record_ends.typecode == "q"
    assert view.first_offset + len(view.record_ends) == queue.max_offset
    for index in range(len(view.record_ends)):
        assert _record(view, index) == queue.record(view.first_offset + index)


def test_broker_store_now_keeps_last_store_timestamp():
    store = BrokerStore()
    ahead = store.now() + 10 ** 6
    store.last_store_timestamp = ahead  # a wall clock that went back
    assert store.now() == ahead and store.last_store_timestamp == ahead


def test_the_embedded_c_reads_no_private_attribute():
    """No name the C looks up is private: no string literal of native/embedded/ starts with an
    underscore (the C once read a queue's _first, _buf_start, _ends and _buf)."""
    literals = [literal for source in sorted(EMBEDDED_C.glob("*.[ch]"))
                for literal in re.findall(r'"((?:[^"\\\n]|\\.)*)"', source.read_text())]
    assert "buffer_view" in literals and "last_store_timestamp" in literals
    assert [literal for literal in literals if literal.startswith("_")] == []
