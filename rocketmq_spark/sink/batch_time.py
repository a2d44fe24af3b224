"""A micro-batch's creation time, as Spark keeps it for replays.

Before a micro-batch runs, Spark writes ``<checkpointLocation>/offsets/<batchId>``: a version
line, then a JSON line whose ``batchTimestampMs`` is the batch's time (what
``current_timestamp()`` returns in it), then the sources' offsets. When Spark runs the batch
again after a restart it reads that file back and keeps the same time. The sink puts it in
bytes 10-13 of the batch's message ids (:mod:`.ids`), so a replay resends the same ids. The
file is read through the storage layer, so a checkpoint on HDFS or an object store works too.
"""
from __future__ import annotations

import json
import logging
from typing import Optional

from ..options import OptionError
from ..storage import StorageError, StorageOptions
from .commit_record import spark_checkpoint

log = logging.getLogger(__name__)
_warned = False


def parse_batch_timestamp(data: bytes) -> Optional[int]:
    """``batchTimestampMs`` of an offset log entry's bytes, or None when it has none."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    try:
        value = json.loads(lines[1]).get("batchTimestampMs") if len(lines) > 1 else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def read_batch_timestamp(checkpoint_location: Optional[str], batch_id: int,
                         storage: Optional[StorageOptions] = None) -> Optional[int]:
    """The batch's ``batchTimestampMs`` from Spark's offset log; None without a checkpoint
    location or when the entry cannot be read."""
    if not checkpoint_location:
        return None
    try:
        data = spark_checkpoint(checkpoint_location, storage).read(f"offsets/{batch_id}")
    except (OptionError, StorageError, OSError, ValueError):
        return None
    return parse_batch_timestamp(data) if data else None


def batch_created_ms(checkpoint_location: Optional[str], batch_id: int, fallback_ms: int,
                     storage: Optional[StorageOptions] = None) -> int:
    """The micro-batch's time from Spark's offset log; ``fallback_ms`` (the writer's creation
    on the driver, the same for every task of this run) when the log cannot be read here."""
    found = read_batch_timestamp(checkpoint_location, batch_id, storage)
    if found is not None:
        return found
    global _warned
    if not _warned:
        _warned = True
        log.warning("rocketmq sink: cannot read batchTimestampMs of micro-batch %d from the "
                    "offset log under %s; message ids carry this run's start time instead, "
                    "so a micro-batch replayed after a restart resends its rows with ids that "
                    "differ in bytes 10-13", batch_id,
                    "checkpointLocation" if checkpoint_location else
                    "no checkpointLocation option (set it on writeStream)")
    return fallback_ms
