"""The exactly-once sink's durable record under the query's checkpoint.

``<checkpointLocation>/rocketmq-sink/``: ``committed/<batchId>.json`` (the batch is committed:
its write tokens and half-message handles), ``ended/<batchId>`` (its END_TRANSACTIONs were
sent), ``aborted/<batchId>-<n>.json`` (tokens of aborted attempts). Every file is written whole
or not at all (temporary file, fsync, rename, fsync of the directory), so a driver killed at
any point leaves a record that says exactly how far the commit got.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set
from urllib.parse import urlparse

from ..client.transaction import HalfHandle
from ..options import OptionError

RECORD_DIR = "rocketmq-sink"


def record_root(checkpoint_location: Optional[str]) -> str:
    """The sink's directory under a local checkpoint location (a path or a file: URI)."""
    if not checkpoint_location:
        raise OptionError("option deliveryGuarantee=exactlyOnce needs the query's "
                          "checkpointLocation option (the sink keeps its commit record "
                          "under it): set .option(\"checkpointLocation\", ...) on writeStream")
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        raise OptionError(f"option deliveryGuarantee=exactlyOnce keeps its commit record under "
                          f"checkpointLocation, which must be a local path or file: URI (got "
                          f"{checkpoint_location!r}; {parsed.scheme}: is not supported yet)")
    path = parsed.path if parsed.scheme == "file" else checkpoint_location
    return os.path.join(os.path.abspath(path), RECORD_DIR)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``path`` so that it exists whole or not at all, durably."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@dataclass
class BatchRecord:
    """What ``commit`` recorded about one micro-batch."""

    batch_id: int
    query_id: str
    group: str
    tokens: List[str]
    handles: List[HalfHandle]
    op_start: Dict[str, int] = field(default_factory=dict)  # broker address -> op offset

    def to_json(self) -> bytes:
        return json.dumps({"batchId": self.batch_id, "queryId": self.query_id,
                           "group": self.group, "tokens": self.tokens,
                           "opStart": self.op_start,
                           "handles": [h.to_tuple() for h in self.handles]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "BatchRecord":
        obj = json.loads(data)
        return cls(int(obj["batchId"]), obj["queryId"], obj["group"], list(obj["tokens"]),
                   [HalfHandle.from_tuple(t) for t in obj["handles"]],
                   {k: int(v) for k, v in obj.get("opStart", {}).items()})


class CommitLog:
    """The sink's record under the checkpoint: ``committed/<batchId>.json``,
    ``ended/<batchId>``, ``aborted/<batchId>-<n>.json``."""

    def __init__(self, root: str, retain: int = 200):
        self.root = root
        self.retain = retain
        self._cache: Dict[int, BatchRecord] = {}

    def _path(self, kind: str, name: str) -> str:
        return os.path.join(self.root, kind, name)

    def committed(self, batch_id: int) -> Optional[BatchRecord]:
        record = self._cache.get(batch_id)
        if record is None:
            try:
                with open(self._path("committed", f"{batch_id}.json"), "rb") as f:
                    record = BatchRecord.from_json(f.read())
            except FileNotFoundError:
                return None
            self._cache[batch_id] = record
        return record

    def committed_ids(self) -> List[int]:
        try:
            names = os.listdir(os.path.join(self.root, "committed"))
        except FileNotFoundError:
            return []
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def record_commit(self, record: BatchRecord) -> None:
        write_atomic(self._path("committed", f"{record.batch_id}.json"), record.to_json())
        self._cache[record.batch_id] = record

    def ended_at(self, batch_id: int) -> Optional[float]:
        """When the batch's END_TRANSACTIONs were marked sent (None: not marked)."""
        try:
            return os.stat(self._path("ended", str(batch_id))).st_mtime
        except FileNotFoundError:
            return None

    def mark_ended(self, batch_id: int) -> None:
        write_atomic(self._path("ended", str(batch_id)), b"")
        self._prune()

    def pending(self) -> List[int]:
        """Batches recorded as committed whose END_TRANSACTIONs were not marked sent."""
        return [b for b in self.committed_ids() if self.ended_at(b) is None]

    def record_abort(self, batch_id: int, tokens: Sequence[str]) -> None:
        name = f"{batch_id}-{time.time_ns()}.json"
        write_atomic(self._path("aborted", name), json.dumps(list(tokens)).encode())

    def aborted_tokens(self, batch_id: int) -> Set[str]:
        out: Set[str] = set()
        directory = os.path.join(self.root, "aborted")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for n in names:
            if n.startswith(f"{batch_id}-") and n.endswith(".json"):
                with open(os.path.join(directory, n), "rb") as f:
                    out.update(json.loads(f.read()))
        return out

    def touch(self) -> None:
        """Note activity (the check-back responder stays while the query writes)."""
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, "active"), "a"):
            os.utime(os.path.join(self.root, "active"))

    def last_active(self) -> float:
        try:
            return os.stat(os.path.join(self.root, "active")).st_mtime
        except FileNotFoundError:
            return 0.0

    def _prune(self) -> None:
        """Drop the handles of old settled batches (a broker stops asking about a half
        message after transactionCheckMax checks); keep the newest ``retain``."""
        ids = self.committed_ids()
        for b in ids[:-self.retain] if len(ids) > self.retain else []:
            if self.ended_at(b) is None:
                continue
            for kind, name in (("committed", f"{b}.json"), ("ended", str(b))):
                try:
                    os.unlink(self._path(kind, name))
                except FileNotFoundError:
                    pass
            self._cache.pop(b, None)
