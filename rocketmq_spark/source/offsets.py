"""The source's offsets as Spark stores them: ``{"topic/brokerName/queueId": next offset}``.

Spark compares offsets as the text of ``json.dumps(offset)``, so the keys are always in sorted
order: the same positions give the same text, and an idle stream gives no empty batches.
``{}`` is the start of batch 0 before the starting position is resolved (see
:mod:`.stream_reader`). A resolved position with no queue at all (the topics have no route yet)
is :data:`NO_QUEUES`, never ``{}``, so that queues appearing later enter as new queues instead of
resolving the start again.

On Spark without admission control (4.0, 4.1) a queue is read in the batch it enters, so the
end offset of that batch also records where each entering queue starts, under
:data:`ENTRIES_KEY` (see :func:`with_entries`): a replayed batch reads the same range.
"""
from __future__ import annotations

from typing import Dict, Mapping

from ..client.protocol.route import MessageQueue

UNRESOLVED: Dict[str, int] = {}
_NO_QUEUES_KEY = "(no queues yet)"
NO_QUEUES: Dict[str, int] = {_NO_QUEUES_KEY: 0}
ENTRIES_KEY = "(entered at)"


def to_offset(positions: Mapping[MessageQueue, int]) -> Dict[str, int]:
    """Canonical offset dict: string keys in sorted order, integer values (:data:`NO_QUEUES`
    when there are no positions)."""
    if not positions:
        return dict(NO_QUEUES)
    return {key: int(value) for key, value in sorted((mq.key, v) for mq, v in positions.items())}


def from_offset(offset: Mapping[str, int]) -> Dict[MessageQueue, int]:
    """Positions from an offset dict; raises ValueError naming a malformed entry."""
    out: Dict[MessageQueue, int] = {}
    for key, value in offset.items():
        if key in (_NO_QUEUES_KEY, ENTRIES_KEY):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"offset of {key!r} must be a non-negative integer, got {value!r}")
        out[MessageQueue.from_key(key)] = value
    return out


def with_entries(offset: Dict[str, int], entries: Mapping[MessageQueue, int]) -> dict:
    """``offset`` plus the positions its entering queues are read from (none: unchanged),
    keys still in sorted order."""
    if not entries:
        return offset
    out = dict(offset)
    out[ENTRIES_KEY] = {mq.key: int(v) for mq, v in sorted(entries.items())}
    return dict(sorted(out.items()))


def entries_of(offset: Mapping) -> Dict[MessageQueue, int]:
    """The entering queues' positions recorded by :func:`with_entries` (none: empty)."""
    recorded = offset.get(ENTRIES_KEY) or {}
    if not isinstance(recorded, dict):
        raise ValueError(f"{ENTRIES_KEY!r} must map queues to offsets, got {recorded!r}")
    return from_offset(recorded)
