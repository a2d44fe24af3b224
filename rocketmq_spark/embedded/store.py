"""A broker's state: topic configs, consume queues, consumer offsets, retention, persistence.

Persistence (optional, one directory per broker):

* ``commitlog``: every stored record appended back to back (see :mod:`.commitlog`); replaying
  it rebuilds the queues.
* ``config.json``: topic configs, committed consumer offsets, queue min offsets (retention) and
  the last listening port, written atomically (temp file + rename) whenever they change
  (offsets at most every ``flush_interval`` seconds and on stop, like the genuine broker's
  periodic ``consumerOffset.json`` flush).

Everything here runs on the server's event loop thread; nothing is locked.

The fast-path interface, the contract between the store and the embedded broker's C
(native/embedded/rmq_serve.c answers pulls, rmq_serve_tx.c stores half and committed
messages), which uses nothing else of the store:

* to find things: :attr:`BrokerStore.topics` (name to :class:`TopicConfig`),
  :attr:`BrokerStore.queues` (``(topic, queue_id)`` to queue) and :meth:`BrokerStore.queue`;
* to read a queue: :meth:`.ConsumeQueue.buffer_view` and :attr:`.ConsumeQueue.max_offset`;
* to store records, in :meth:`BrokerStore.append`'s order: :meth:`BrokerStore.now` for the
  store time, :attr:`.CommitLog.size` for the physical offset, :meth:`.CommitLog.append`, then
  :meth:`.ConsumeQueue.append` or :meth:`.ConsumeQueue.extend_timed`;
* the clock: when ``now`` is :meth:`BrokerStore.now` itself, a fast path may compute it as that
  method does and keep :attr:`BrokerStore.last_store_timestamp` up to date as it does.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..client.protocol.codes import PERM_READ, PERM_WRITE
from .commitlog import CommitLog
from .queue import ConsumeQueue

log = logging.getLogger(__name__)


@dataclass
class TopicConfig:
    """What a broker knows about a topic (the genuine TopicConfig's fields)."""

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    # 5.x topic attributes (``message.type``: :mod:`.topic_types`); a 4.9.8 broker has none
    attributes: Dict[str, str] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def describe(self) -> str:
        """Java's ``TopicConfig.toString()`` (quoted in some genuine error remarks)."""
        return (f"TopicConfig [topicName={self.topic_name}, readQueueNums={self.read_queue_nums}"
                f", writeQueueNums={self.write_queue_nums}, perm={_perm_string(self.perm)}, "
                f"topicFilterType={self.topic_filter_type}, topicSysFlag={self.topic_sys_flag}"
                f", order={'true' if self.order else 'false'}]")


def _perm_string(perm: int) -> str:
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-") + ("X" if perm & 1 else "-")


class BrokerStore:
    """Topics, queues and offsets of one broker, with optional persistence under ``path``."""

    def __init__(self, path: Optional[Path] = None, flush_interval: float = 1.0):
        self.path = path
        self.flush_interval = flush_interval
        self.topics: Dict[str, TopicConfig] = {}
        self.queues: Dict[Tuple[str, int], ConsumeQueue] = {}
        # (topic, group) -> {queueId: committed offset}; the genuine key is "topic@group".
        self.offsets: Dict[Tuple[str, str], Dict[int, int]] = {}
        self.commit_log = CommitLog(path / "commitlog" if path else None)
        self.port: Optional[int] = None
        # The latest store time handed out (ms): now() never goes below it.
        self.last_store_timestamp = 0
        self._dirty = False
        self._last_flush = 0.0
        self._min_offsets: Dict[Tuple[str, int], int] = {}

    # ---------------------------------------------------------------- lifecycle

    def load(self) -> None:
        """Read config.json and replay the commit log (no-op without a path)."""
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        cfg_file = self.path / "config.json"
        if cfg_file.exists():
            cfg = json.loads(cfg_file.read_text())
            for name, t in cfg.get("topics", {}).items():
                self.topics[name] = TopicConfig(topic_name=name, **t)
            for key, table in cfg.get("offsets", {}).items():
                topic, _, group = key.rpartition("@")
                self.offsets[(topic, group)] = {int(q): int(o) for q, o in table.items()}
            for topic, table in cfg.get("minOffsets", {}).items():
                for q, o in table.items():
                    self._min_offsets[(topic, int(q))] = int(o)
            self.port = cfg.get("port")
        for (topic, qid), min_offset in self._min_offsets.items():
            self.queues[(topic, qid)] = ConsumeQueue(topic, qid, min_offset)
        for rec in self.commit_log.replay():
            q = self.queue(rec.topic, rec.queue_id)
            if rec.queue_offset < q.min_offset:
                continue  # retention dropped it
            if rec.queue_offset != q.max_offset:
                if len(q):
                    log.warning("commit log: %s/%d offset %d does not follow %d; skipped",
                                rec.topic, rec.queue_id, rec.queue_offset, q.max_offset)
                    continue
                q.reset_empty(rec.queue_offset)
            q.append(rec.record, rec.tag_code, rec.store_timestamp)
            self.last_store_timestamp = max(self.last_store_timestamp, rec.store_timestamp)

    def close(self) -> None:
        self.flush(force=True)
        self.commit_log.close()

    def mark_dirty(self, now: bool = False) -> None:
        """Note a change of config/offsets; ``now`` writes at once (topic changes)."""
        self._dirty = True
        if now:
            self.flush(force=True)

    def flush(self, force: bool = False) -> None:
        """Write config.json if something changed (at most every flush_interval unless forced)."""
        if self.path is None or not self._dirty:
            return
        if not force and time.monotonic() - self._last_flush < self.flush_interval:
            return
        data = {
            "topics": {name: {k: v for k, v in asdict(t).items() if k != "topic_name"}
                       for name, t in self.topics.items()},
            "offsets": {f"{topic}@{group}": {str(q): o for q, o in table.items()}
                        for (topic, group), table in self.offsets.items()},
            "minOffsets": {},
            "port": self.port,
        }
        for (topic, qid), q in self.queues.items():
            if q.min_offset:
                data["minOffsets"].setdefault(topic, {})[str(qid)] = q.min_offset
        tmp = self.path / "config.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path / "config.json")
        self._dirty = False
        self._last_flush = time.monotonic()

    # ---------------------------------------------------------------- topics and queues

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty on first use (as the genuine findConsumeQueue does)."""
        q = self.queues.get((topic, queue_id))
        if q is None:
            q = self.queues[(topic, queue_id)] = ConsumeQueue(topic, queue_id)
        return q

    def existing_queue(self, topic: str, queue_id: int) -> Optional[ConsumeQueue]:
        return self.queues.get((topic, queue_id))

    def put_topic(self, config: TopicConfig) -> None:
        self.topics[config.topic_name] = config
        self.mark_dirty(now=True)

    def now(self) -> int:
        """Store timestamp in ms, never going backwards (search by time needs that)."""
        ts = max(int(time.time() * 1000), self.last_store_timestamp)
        self.last_store_timestamp = ts
        return ts

    def append(self, q: ConsumeQueue, records: Sequence[bytes], tag_codes: Iterable[int],
               store_timestamp: int) -> int:
        """Store records built for ``q`` at physical offset ``commit_log.size``; returns the
        first queue offset."""
        data = records[0] if len(records) == 1 else b"".join(records)
        self.commit_log.append(data)
        if len(records) == 1:
            return q.append(records[0], next(iter(tag_codes)), store_timestamp)
        return q.extend(records, tag_codes, store_timestamp)

    def truncate(self, topic: str, queue_id: int, min_offset: int) -> int:
        new_min = self.queue(topic, queue_id).truncate(min_offset)
        self.mark_dirty(now=True)
        return new_min

    # ---------------------------------------------------------------- consumer offsets

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets.setdefault((topic, group), {})[queue_id] = offset
        self._dirty = True

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Committed offset, -1 when none (the genuine ConsumerOffsetManager's answer)."""
        return self.offsets.get((topic, group), {}).get(queue_id, -1)

    def topics_of_group(self, group: str) -> List[str]:
        return [t for (t, g) in self.offsets if g == group]
