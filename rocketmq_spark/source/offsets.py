"""The source's offsets as Spark stores them in the checkpoint, versioned:

    {"version": 2, "queues": {"topic/brokerName/queueId": next offset, ...}}
    {"version": 2, "queues": {...}, "entering": {"topic/brokerName/queueId": offset, ...}}

``queues`` holds every known queue's next offset (``{}``: the position is resolved but the
topics have no queue yet, so queues appearing later enter as new queues instead of resolving
the start again). ``entering`` is written only on Spark without admission control (4.0, 4.1),
where a queue is read in the batch it enters: where each entering queue starts, so that a
replayed batch reads the same range. :data:`UNRESOLVED` is the start of batch 0 before the
starting position is resolved (see :mod:`.stream_reader`); Spark does not write it to the offset
log.

Spark compares offsets as the text of ``json.dumps(offset)``, so :func:`to_offset` always gives
the same text for the same positions (keys in sorted order), and an idle stream gives no empty
batches.

Checkpoints written before the version field hold version 1, read as ever (one test per form in
``tests/test_source_offsets.py``): a flat map of queue keys (``{}`` unresolved);
``{"(no queues yet)": 0}`` for resolved without queues; and on Spark 4.0/4.1 the entering
queues under ``"(entered at)"`` beside the queue keys. New offsets are always version 2, so a
query upgraded mid-stream writes its next batch in the new shape.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..client.protocol.route import MessageQueue

VERSION = 2
UNRESOLVED: Dict[str, Any] = {"version": VERSION, "queues": None}

# Version 1 (no "version" field): placeholders among the queue keys.
_V1_NO_QUEUES_KEY = "(no queues yet)"
_V1_ENTRIES_KEY = "(entered at)"


def to_offset(positions: Mapping[MessageQueue, int],
              entering: Mapping[MessageQueue, int] = ()) -> Dict[str, Any]:
    """The version 2 offset of ``positions`` (and the ``entering`` queues' start positions, when
    there are any), keys in sorted order."""
    out: Dict[str, Any] = {"version": VERSION, "queues": _keyed(positions)}
    if entering:
        out["entering"] = _keyed(entering)
    return out


def with_entries(offset: Mapping[str, Any], entries: Mapping[MessageQueue, int]) -> dict:
    """``offset`` (any version) as a version 2 offset that also records where ``entries``
    start (none: no ``entering`` field)."""
    return to_offset(from_offset(offset), entries)


def is_unresolved(offset: Mapping[str, Any]) -> bool:
    """Whether ``offset`` is the start of batch 0 before the starting position is resolved
    (``{}`` in version 1)."""
    return _parts(offset)[0] is None


def from_offset(offset: Mapping[str, Any]) -> Dict[MessageQueue, int]:
    """The queues' positions from an offset of any version (none when unresolved); raises
    ValueError naming a malformed entry."""
    return _positions(_parts(offset)[0] or {}, "queues")


def entries_of(offset: Mapping[str, Any]) -> Dict[MessageQueue, int]:
    """The entering queues' start positions recorded by :func:`to_offset` (none: empty)."""
    return _positions(_parts(offset)[1] or {}, "entering")


def queue_offsets(offset: Mapping[str, Any]) -> Dict[str, int]:
    """``{"topic/brokerName/queueId": next offset}`` from an offset of any version, as JSON
    gives it (the lag listener reads progress events with it)."""
    return {mq.key: value for mq, value in from_offset(offset).items()}


def _keyed(positions: Mapping[MessageQueue, int]) -> Dict[str, int]:
    return {key: int(value) for key, value in sorted((mq.key, v) for mq, v in positions.items())}


def _parts(offset: Mapping[str, Any]):
    """``(queues or None when unresolved, entering or None)`` of an offset of any version."""
    if not isinstance(offset, Mapping):
        raise ValueError(f"a rocketmq offset must be a JSON object, got {offset!r}")
    if "version" not in offset:  # version 1: queue keys and placeholders side by side
        if not offset:
            return None, None
        queues = {k: v for k, v in offset.items() if k not in (_V1_NO_QUEUES_KEY, _V1_ENTRIES_KEY)}
        entering = offset.get(_V1_ENTRIES_KEY)
        if entering is not None and not isinstance(entering, Mapping):
            raise ValueError(f"{_V1_ENTRIES_KEY!r} must map queues to offsets, got {entering!r}")
        return queues, entering
    version = offset["version"]
    if version != VERSION:
        raise ValueError(
            f"this rocketmq offset has version {version!r}; this rocketmq-spark reads versions 1 "
            f"and {VERSION} (a checkpoint written by a newer release?): {offset!r}")
    unknown = set(offset) - {"version", "queues", "entering"}
    if unknown:
        raise ValueError(f"rocketmq offset has unknown fields {sorted(unknown)}: {offset!r}")
    queues, entering = offset.get("queues"), offset.get("entering")
    for name, value in (("queues", queues), ("entering", entering)):
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{name!r} of a rocketmq offset must map queues to offsets, "
                             f"got {value!r}")
    return queues, entering


def _positions(keyed: Mapping[str, Any], field: str) -> Dict[MessageQueue, int]:
    out: Dict[MessageQueue, int] = {}
    for key, value in keyed.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"offset of {key!r} ({field}) must be a non-negative integer, "
                             f"got {value!r}")
        out[MessageQueue.from_key(key)] = value
    return out
