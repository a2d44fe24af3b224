"""The exactly-once sink's durable record, kept through the storage layer (:mod:`..storage`).

By default under the query's checkpoint, ``<checkpointLocation>/rocketmq-sink/`` (Spark's
``s3a://b/p`` gives ``s3://b/p/rocketmq-sink``); the option ``checkpointStorage.location``
puts it elsewhere. It holds ``committed/<batchId>.json`` (the batch is committed: its write
tokens and half-message handles), ``ended/<batchId>`` (when its END_TRANSACTIONs were sent),
``aborted/<batchId>-<n>.json`` (tokens of aborted attempts) and ``responder.lease`` (which
check-back responder answers). Every object is written whole or not at all (a temporary file
and a rename on disks and HDFS, one PUT on object stores), so a driver killed at any point
leaves a record that says exactly how far the commit got.
"""
from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Union

from ..client.txn.transaction import HalfHandle
from ..options import OptionError
from ..storage import (
    Location, StorageConfigError, StorageOptions, Store, open_store, parse_location,
    record_location,
)
from ..storage.filesystems import Loader
from ..storage.locations import RECORD_DIR
from ..storage.store import write_atomic

__all__ = ["RECORD_DIR", "BatchRecord", "CommitLog", "open_record", "record_location_of",
           "record_root", "spark_checkpoint", "write_atomic"]


def record_location_of(checkpoint_location: Optional[str],
                       storage: Optional[StorageOptions] = None) -> Location:
    """Where the sink's record lives (see the module's docstring)."""
    storage = storage or StorageOptions()
    if not checkpoint_location and not storage.location:
        raise OptionError("option deliveryGuarantee=exactlyOnce needs the query's "
                          "checkpointLocation option (the sink keeps its commit record "
                          "under it): set .option(\"checkpointLocation\", ...) on writeStream")
    try:
        return record_location(checkpoint_location, storage.location)
    except StorageConfigError as exc:
        raise OptionError(str(exc)) from None


# Stores opened by this process, by location and options (a filesystem is reused).
_stores: Dict[tuple, Store] = {}


def _open(location: Location, storage: StorageOptions, loader: Loader) -> Store:
    key = (location.uri, tuple(sorted(storage.values.items())))
    store = _stores.get(key) if loader is importlib.import_module else None
    if store is None:
        try:
            store = open_store(location, storage, loader)
        except StorageConfigError as exc:
            raise OptionError(str(exc)) from None
        if loader is importlib.import_module:
            _stores[key] = store
    return store


def open_record(checkpoint_location: Optional[str], storage: Optional[StorageOptions] = None,
                loader: Loader = importlib.import_module, check: bool = False) -> "CommitLog":
    """The sink's record of a query; ``check``: fail now when its store cannot be reached
    (the query's start), reading only."""
    storage = storage or StorageOptions()
    location = record_location_of(checkpoint_location, storage)
    if location.kind == "local":
        try:
            storage.library_kwargs("local", location.scheme or "file")
        except StorageConfigError as exc:
            raise OptionError(f"{exc} (the record is on a local disk: "
                              f"{location.path})") from None
    store = _open(location, storage, loader)
    if check:
        store.check()
    return CommitLog(store)


def spark_checkpoint(checkpoint_location: str, storage: Optional[StorageOptions] = None,
                     loader: Loader = importlib.import_module) -> Store:
    """Spark's own checkpoint (its ``metadata``, ``commits/``), through the same layer; the
    ``checkpointStorage.*`` settings apply when it is on the record's kind of store."""
    storage = storage or StorageOptions()
    try:
        location = parse_location(checkpoint_location, "checkpointLocation")
    except StorageConfigError as exc:
        raise OptionError(str(exc)) from None
    record_kind = record_location_of(checkpoint_location, storage).kind
    same = location.kind == record_kind and location.kind != "local"
    return _open(location, storage if same else StorageOptions(), loader)


def record_root(checkpoint_location: Optional[str]) -> str:
    """The sink's record under ``checkpoint_location``, as a URI (a path when local)."""
    location = record_location_of(checkpoint_location)
    return location.path if location.kind == "local" else location.uri


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
    """The sink's record on a :class:`..storage.Store`: ``committed/<batchId>.json``,
    ``ended/<batchId>``, ``aborted/<batchId>-<n>.json``. ``root``: a local path, a URI or
    a store."""

    def __init__(self, root: Union[str, Store], retain: int = 200,
                 storage: Optional[StorageOptions] = None):
        self.store = root if isinstance(root, Store) else open_store(
            parse_location(root, "sink record location"), storage)
        self.root = (self.store.location.path if self.store.location.kind == "local"
                     else self.store.location.uri)
        self.retain = retain
        self._cache: Dict[int, BatchRecord] = {}
        # Batches above this are known not to be recorded (the writer's run recorded up to
        # it when it started): :meth:`committed` need not read for them.
        self.absent_above: Optional[int] = None

    def committed(self, batch_id: int) -> Optional[BatchRecord]:
        record = self._cache.get(batch_id)
        if record is None and self.absent_above is not None and batch_id > self.absent_above:
            return None
        if record is None:
            data = self.store.read(f"committed/{batch_id}.json")
            if data is None:
                return None
            record = BatchRecord.from_json(data)
            self._cache[batch_id] = record
        return record

    def committed_ids(self) -> List[int]:
        return sorted(int(e.name[:-5]) for e in self.store.list("committed")
                      if e.name.endswith(".json") and e.name[:-5].isdigit())

    def ended_ids(self) -> List[int]:
        return sorted(int(e.name) for e in self.store.list("ended") if e.name.isdigit())

    def record_commit(self, record: BatchRecord) -> None:
        self.store.write(f"committed/{record.batch_id}.json", record.to_json())
        self._cache[record.batch_id] = record

    def ended_at(self, batch_id: int) -> Optional[float]:
        """When the batch's END_TRANSACTIONs were marked sent (None: not marked)."""
        data = self.store.read(f"ended/{batch_id}")
        if data is None:
            return None
        try:
            return float(json.loads(data)["at"])
        except (ValueError, KeyError, TypeError):  # an older run's empty mark: its mtime
            return next((e.mtime for e in self.store.list("ended")
                         if e.name == str(batch_id)), time.time())

    def mark_ended(self, batch_id: int) -> None:
        self.store.write(f"ended/{batch_id}", json.dumps({"at": time.time()}).encode())

    def pending(self) -> List[int]:
        """Batches recorded as committed whose END_TRANSACTIONs were not marked sent."""
        ended = set(self.ended_ids())
        return [b for b in self.committed_ids() if b not in ended]

    def record_abort(self, batch_id: int, tokens: Sequence[str]) -> None:
        name = f"aborted/{batch_id}-{time.time_ns()}.json"
        self.store.write(name, json.dumps(list(tokens)).encode())

    def aborted_tokens(self, batch_id: int) -> Set[str]:
        out: Set[str] = set()
        for e in self.store.list("aborted"):
            if e.name.startswith(f"{batch_id}-") and e.name.endswith(".json"):
                data = self.store.read(f"aborted/{e.name}")
                if data:
                    out.update(json.loads(data))
        return out

    def touch(self) -> None:
        """Note activity (the check-back responder stays while the query writes)."""
        self.store.write("active", json.dumps({"at": time.time()}).encode())

    def last_active(self) -> float:
        """The last activity noted: a touch, or a batch recorded."""
        times = [e.mtime for e in self.store.list("committed")]
        data = self.store.read("active")
        if data:
            try:
                times.append(float(json.loads(data)["at"]))
            except (ValueError, KeyError, TypeError):
                times.extend(e.mtime for e in self.store.list("") if e.name == "active")
        return max(times, default=0.0)

    def prune(self, limit: Optional[int] = None) -> int:
        """Drop the handles of old settled batches (a broker stops asking about a half
        message after transactionCheckMax checks); keep the newest ``retain``. The
        check-back responder does it now and then, off the commit's path (on an object store
        each delete is a few requests), at most ``limit`` batches a call. Returns how many
        batches were dropped."""
        ids = self.committed_ids()
        if len(ids) <= self.retain:
            return 0
        ended = set(self.ended_ids())
        dropped = 0
        for b in ids[:-self.retain]:
            if b not in ended:
                continue
            if limit is not None and dropped >= limit:
                break
            self.store.delete(f"committed/{b}.json")
            self.store.delete(f"ended/{b}")
            self._cache.pop(b, None)
            dropped += 1
        return dropped
