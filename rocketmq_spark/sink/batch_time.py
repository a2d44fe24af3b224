"""A micro-batch's creation time, as Spark keeps it for replays.

Before a micro-batch runs, Spark writes ``<checkpointLocation>/offsets/<batchId>``: a version
line, then a JSON line whose ``batchTimestampMs`` is the batch's time (what
``current_timestamp()`` returns in it), then the sources' offsets. When Spark runs the batch
again after a restart it reads that file back and keeps the same time. The sink puts it in
bytes 10-13 of the batch's message ids (:mod:`.ids`), so a replay resends the same ids.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional
from urllib.parse import urlparse

log = logging.getLogger(__name__)
_warned = False


def offsets_file(checkpoint_location: Optional[str], batch_id: int) -> Optional[str]:
    """The local path of Spark's offset log entry for ``batch_id``; None for no checkpoint or
    one that is not a local path or ``file:`` URI."""
    if not checkpoint_location:
        return None
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        return None
    root = parsed.path if parsed.scheme == "file" else checkpoint_location
    return os.path.join(os.path.abspath(root), "offsets", str(batch_id))


def read_batch_timestamp(path: str) -> Optional[int]:
    """``batchTimestampMs`` of an offset log entry, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            f.readline()  # "v1"
            value = json.loads(f.readline()).get("batchTimestampMs")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def batch_created_ms(checkpoint_location: Optional[str], batch_id: int, fallback_ms: int) -> int:
    """The micro-batch's time from Spark's offset log; ``fallback_ms`` (the writer's creation
    on the driver, the same for every task of this run) when the log cannot be read here."""
    path = offsets_file(checkpoint_location, batch_id)
    found = read_batch_timestamp(path) if path else None
    if found is not None:
        return found
    global _warned
    if not _warned:
        _warned = True
        log.warning("rocketmq sink: cannot read batchTimestampMs from %s; message ids carry "
                    "this run's start time instead, so a micro-batch replayed after a restart "
                    "resends its rows with ids that differ in bytes 10-13 (set the option "
                    "checkpointLocation to a local path or file: URI the executors can read)",
                    path or "the query's offset log (no checkpointLocation option)")
    return fallback_ms
