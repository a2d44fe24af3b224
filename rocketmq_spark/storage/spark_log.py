"""Spark's own checkpoint files, read through the storage layer (any scheme Spark writes to).

``metadata`` holds the query id (stable across restarts); ``commits/<batchId>`` exists once
Spark has committed a micro-batch.
"""
from __future__ import annotations

import json
from typing import List, Optional

from .store import Store


def query_id(checkpoint: Store) -> Optional[str]:
    """The query id of ``<checkpointLocation>/metadata``; None before Spark wrote it."""
    data = checkpoint.read("metadata")
    if not data:
        return None
    for line in data.decode(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                return str(json.loads(line)["id"])
            except (ValueError, KeyError):
                return None
    return None


def committed_batches(checkpoint: Store) -> List[int]:
    """The micro-batches Spark has committed (``commits/<batchId>``), in order."""
    return sorted(int(e.name) for e in checkpoint.list("commits") if e.name.isdigit())
