"""Which rows travel together: from encoded rows to requests of one topic and queue each.

* Rows are split by topic.
* Rows with a sharding key go to the queue Java's ``SelectMessageQueueByHash`` picks for the
  key (|String.hashCode()| mod the topic's queue count), in row order: a queue's requests
  are yielded in the order of their rows, and the pipeline keeps one request in flight per
  such queue, so the queue stores them in that order.
* Other rows fill requests in row order; the pipeline chooses their queues round robin.
* A request holds up to ``max_bytes`` of encoded messages (at least one message); rows of
  different classes (compressed or not) never share one; a delayed row is sent on its own
  (brokers refuse delayed messages in a batch).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence, Tuple

import numpy as np
import pyarrow.compute as pc

from ..client.protocol.route import MessageQueue
from ..client.protocol.send_encode import java_string_hashes
from .transport import Prepared

Request = Tuple[str, Optional[MessageQueue], np.ndarray, bool]  # topic, fixed queue, rows, single


def cut_by_bytes(rows: np.ndarray, sizes: np.ndarray, max_bytes: int,
                 max_rows: Optional[int] = None) -> Iterator[np.ndarray]:
    """Consecutive slices of ``rows`` whose ``sizes`` add up to at most ``max_bytes`` and that
    hold at most ``max_rows`` rows (a row larger than ``max_bytes`` goes alone)."""
    if not len(rows):
        return
    total = np.cumsum(sizes[rows])
    start = 0
    while start < len(rows):
        base = total[start - 1] if start else 0
        end = max(int(np.searchsorted(total, base + max_bytes, "right")), start + 1)
        if max_rows:
            end = min(end, start + max_rows)
        yield rows[start:end]
        start = end


def _requests(topic: str, queue: Optional[MessageQueue], rows: np.ndarray,
              single: Optional[np.ndarray], klass: Optional[np.ndarray], sizes: np.ndarray,
              max_bytes: int, max_rows: Optional[int], ordered: bool) -> Iterator[Request]:
    kind = np.zeros(len(rows), dtype=np.int8)
    if klass is not None:
        kind += klass[rows].astype(np.int8) * 2
    if single is not None:
        kind += single[rows].astype(np.int8)
    if ordered:  # runs of one kind, in row order
        cuts = np.flatnonzero(np.diff(kind)) + 1
        groups = zip(np.split(rows, cuts), np.split(kind, cuts))
        runs = [(g, int(k[0])) for g, k in groups if len(g)]
    else:
        runs = [(rows[kind == k], int(k)) for k in np.unique(kind)]
    for run, k in runs:
        if k & 1:
            for row in run:
                yield topic, queue, np.array([row]), True
        else:
            for part in cut_by_bytes(run, sizes, max_bytes, max_rows):
                yield topic, queue, part, False


def plan_requests(prepared: Prepared, queues_of: Callable[[str], Sequence[MessageQueue]],
                  max_bytes: int, max_rows: Optional[int] = None) -> Iterator[Request]:
    """Every request for the rows of ``prepared``: (topic, fixed queue or None, row indices,
    sent alone); at most ``max_bytes`` and ``max_rows`` a request."""
    rows = prepared.rows
    n = rows.count
    if rows.topic is None:
        groups = [(rows.default_topic, np.arange(n))]
    else:
        encoded = pc.dictionary_encode(rows.topic)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        groups = [(topic, np.flatnonzero(codes == k))
                  for k, topic in enumerate(encoded.dictionary.to_pylist())]
    single = rows.delay > 0 if rows.delay is not None else None
    hashes = keyed = None
    if rows.sharding_key is not None:
        keyed = rows.sharding_key.is_valid().to_numpy(zero_copy_only=False)
        hashes = np.abs(java_string_hashes(rows.sharding_key).astype(np.int64))
    for topic, index in groups:
        free = index
        if keyed is not None and keyed[index].any():
            queues = queues_of(topic)
            slot = np.where(keyed[index], hashes[index] % len(queues), -1)
            for q in np.unique(slot[slot >= 0]):
                yield from _requests(topic, queues[int(q)], index[slot == q], single,
                                     prepared.klass, prepared.sizes, max_bytes, max_rows,
                                     True)
            free = index[slot < 0]
        if len(free):
            yield from _requests(topic, None, free, single, prepared.klass, prepared.sizes,
                                 max_bytes, max_rows, False)
