"""Consumer lag of rocketmq streams, from each query progress: what Spark's Kafka source
reports as ``min/max/avgOffsetsBehindLatest``, plus lag in time per queue.

Python sources cannot add metrics to a progress, so a :class:`RocketMQLagListener` computes them
in the driver: offsets behind latest from the progress's ``latestOffset`` (which the source
reports) and ``endOffset``, and for every queue that is behind, the age of its oldest unread
message (the store time of the message at the end offset, one small pull per lagging queue),
which no broker metric gives. Spark before 4.2 has no ``reportLatestOffset``: its progress's
``latestOffset`` is only the batch's end, so there the listener asks the brokers for the
latest offsets itself, when the progress arrives::

    options = {"nameServer": "ns:9876", "subscribe": "orders", "consumerGroup": "etl"}
    lag = RocketMQLagListener(options)
    spark.streams.addListener(lag)
    query = spark.readStream.format("rocketmq").options(**options).load() ... .start()
    ...
    lag.latest(query.id).max_offsets_behind_latest
"""
from __future__ import annotations

import ast
import json
import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Mapping, Optional, Tuple

from pyspark.sql.streaming import StreamingQueryListener

from ..client.admin import LOOKUP_GROUP, Admin
from ..client.namespace import wrap
from ..client.errors import RocketMQError
from ..client.protocol.route import MessageQueue
from ..options import parse_connection_settings
from ..spark_compat import REPORTS_LATEST_OFFSET
from .namespacing import queue_key_without_namespace
from .offsets import queue_offsets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueLag:
    """One queue after a micro-batch. ``oldest_unread_ms`` is the store time of the next
    message to read (None when the queue is caught up, or when it was not looked up)."""

    offsets_behind: int
    oldest_unread_ms: Optional[int] = None


@dataclass(frozen=True)
class LagReport:
    """The lag of one rocketmq source of a query after one micro-batch."""

    query_id: str
    run_id: str
    name: Optional[str]
    batch_id: int
    source: int                       # index of the source in the progress
    timestamp: str                    # the progress's timestamp (batch start, UTC)
    measured_at_ms: int               # when the store times were looked up
    num_input_rows: int
    queues: Dict[str, QueueLag]       # "topic/brokerName/queueId" -> lag (topic: no namespace)

    @property
    def min_offsets_behind_latest(self) -> int:
        return min((q.offsets_behind for q in self.queues.values()), default=0)

    @property
    def max_offsets_behind_latest(self) -> int:
        return max((q.offsets_behind for q in self.queues.values()), default=0)

    @property
    def avg_offsets_behind_latest(self) -> float:
        if not self.queues:
            return 0.0
        return sum(q.offsets_behind for q in self.queues.values()) / len(self.queues)

    @property
    def total_offsets_behind_latest(self) -> int:
        return sum(q.offsets_behind for q in self.queues.values())

    def time_lag_ms(self, queue: str) -> int:
        """Age of the queue's oldest unread message when measured (0 when caught up)."""
        stored = self.queues[queue].oldest_unread_ms
        return 0 if stored is None else max(0, self.measured_at_ms - stored)

    @property
    def max_time_lag_ms(self) -> int:
        """Age of the oldest unread message of any queue (0 when every queue is caught up)."""
        return max((self.time_lag_ms(q) for q in self.queues), default=0)


def offsets_behind(latest: Mapping[str, int], end: Mapping[str, int]) -> Dict[str, int]:
    """Per queue in both offsets: how many messages the batch's end is behind the latest.

    Keys that are not queues (the source's marker for "no queues yet") are left out."""
    out = {}
    for key in sorted(latest):
        if key in end and _is_queue(key):
            out[key] = max(0, int(latest[key]) - int(end[key]))
    return out


def _is_queue(key: str) -> bool:
    try:
        MessageQueue.from_key(key)
    except ValueError:
        return False
    return True


class RocketMQLagListener(StreamingQueryListener):
    """Computes :class:`LagReport`\\ s for the rocketmq sources of every query in the session.

    ``options`` are the reader's options (only the connection ones and ``namespace`` are used:
    nameServer, accessKey/secretKey, tls*; with a namespace, the report names the queues'
    topics without it, as the query's rows do, and the lookups' group is in it).
    ``time_lag=False`` skips the store-time lookups. The last ``history`` reports of each
    query are kept; each report is also logged at INFO and passed to ``on_report`` if given.
    Lookups that fail leave the time lag unknown; the listener never raises into Spark.
    ``latest_from_broker``: look the latest offsets up on the brokers instead of reading the
    progress's ``latestOffset``; by default only where Spark lacks ``reportLatestOffset``
    (before 4.2).
    """

    def __init__(self, options: Mapping[str, str], *, time_lag: bool = True,
                 history: int = 10_000, on_report=None,
                 latest_from_broker: Optional[bool] = None):
        self._settings = parse_connection_settings(
            options, " (RocketMQLagListener: pass the options the query's reader was given)")
        self._namespace = self._settings.namespace
        self._latest_from_broker = latest_from_broker  # None: decided at the first progress
        self._time_lag = time_lag
        self._history = history
        self._on_report = on_report
        self._reports: Dict[str, Deque[LagReport]] = {}
        self._lock = threading.Lock()
        self._admin: Optional[Admin] = None

    def __repr__(self) -> str:
        return f"RocketMQLagListener(nameServer={';'.join(self._settings.name_servers)!r})"

    # ------------------------------------------------------------------ results

    def reports(self, query_id=None) -> List[LagReport]:
        """Reports kept for a query (its ``id``, as a UUID or text), oldest first; for every
        query when ``query_id`` is None."""
        with self._lock:
            if query_id is None:
                return sorted((r for d in self._reports.values() for r in d),
                              key=lambda r: (r.timestamp, r.query_id))
            return list(self._reports.get(str(query_id), ()))

    def latest(self, query_id) -> Optional[LagReport]:
        """The most recent report of a query, or None."""
        with self._lock:
            kept = self._reports.get(str(query_id))
            return kept[-1] if kept else None

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # ------------------------------------------------------------------ listener

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        try:
            self.record(event.progress)
        except Exception:  # a listener that raises only fills Spark's log with errors
            log.exception("computing the rocketmq lag failed")

    def record(self, progress) -> List[LagReport]:
        """Compute, keep and return the reports of one progress (what onQueryProgress does)."""
        made = []
        for index, source in enumerate(progress.sources):
            report = self._report(progress, index, source)
            if report is not None:
                made.append(report)
        for report in made:
            with self._lock:
                kept = self._reports.setdefault(report.query_id, deque(maxlen=self._history))
                kept.append(report)
            log.info("rocketmq lag of query %s batch %d: offsets behind latest min %d / avg %.1f "
                     "/ max %d over %d queues; oldest unread message %.1f s old",
                     report.name or report.query_id, report.batch_id,
                     report.min_offsets_behind_latest, report.avg_offsets_behind_latest,
                     report.max_offsets_behind_latest, len(report.queues),
                     report.max_time_lag_ms / 1000.0)
            if self._on_report is not None:
                self._on_report(report)
        return made

    # ------------------------------------------------------------------ internals

    def _report(self, progress, index: int, source) -> Optional[LagReport]:
        latest, end = _queues(source.latestOffset), _queues(source.endOffset)
        if self._reads_latest_from_broker() and end is not None:
            latest = self._max_offsets(list(end))
        if latest is None or end is None:
            return None  # not a rocketmq source, or no latest offset reported yet
        behind = offsets_behind(latest, end)
        if not behind and not end:
            return None
        stored = self._store_times({k: int(end[k]) for k, n in behind.items() if n > 0}) \
            if self._time_lag else {}
        return LagReport(
            query_id=str(progress.id), run_id=str(progress.runId), name=progress.name,
            batch_id=int(progress.batchId), source=index, timestamp=progress.timestamp,
            measured_at_ms=int(time.time() * 1000), num_input_rows=int(source.numInputRows),
            queues={queue_key_without_namespace(k, self._namespace): QueueLag(n, stored.get(k))
                    for k, n in behind.items()})

    def _reads_latest_from_broker(self) -> bool:
        """By the Spark that runs the source: on Spark Connect the server's, whose version the
        session PySpark hands the listener tells (its classes are out of the client's reach),
        not the client's PySpark."""
        if self._latest_from_broker is None:
            session = getattr(self, "spark", None)  # set by a Connect session's addListener
            self._latest_from_broker = (not REPORTS_LATEST_OFFSET if session is None
                                        else _major_minor(session.version) < (4, 2))
        return self._latest_from_broker

    def _admin_client(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(list(self._settings.name_servers),
                                config=self._settings.client_config())
        return self._admin

    def _max_offsets(self, keys: List[str]) -> Optional[Dict[str, int]]:
        """The brokers' max offsets of the queues ``keys`` name (None: no queue, or none could
        be looked up; a queue whose lookup failed is left out)."""
        if not keys:
            return None
        try:
            found = self._admin_client().offsets("max", [MessageQueue.from_key(k) for k in keys])
        except RocketMQError as exc:
            log.warning("cannot look up the latest offsets for the lag: %s", exc)
            return None
        out = {}
        for mq, value in found.items():
            if isinstance(value, RocketMQError):
                log.info("latest offset of %s unavailable: %s", mq.key, value)
            else:
                out[mq.key] = int(value)
        return out or None

    def _store_times(self, positions: Dict[str, int]) -> Dict[str, int]:
        if not positions:
            return {}
        by_queue = {MessageQueue.from_key(k): v for k, v in positions.items()}
        try:
            found = self._admin_client().store_times(
                by_queue, group=wrap(self._namespace, LOOKUP_GROUP))
        except RocketMQError as exc:
            log.warning("cannot look up the store times for the time lag: %s", exc)
            return {}
        out = {}
        for mq, value in found.items():
            if isinstance(value, RocketMQError):
                log.info("store time of %s at %d unavailable: %s", mq.key, by_queue[mq], value)
            elif value is not None:
                out[mq.key] = value
        return out


def _major_minor(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _queues(text: Optional[str]) -> Optional[Dict[str, int]]:
    """The queue offsets of a progress's offset text, of any version of the source's shape
    (None: not a rocketmq source's offset, or none given)."""
    offset = _json(text)
    if not isinstance(offset, dict):
        return None
    try:
        return queue_offsets(offset)
    except ValueError:
        return None


def _json(text: Optional[str]):
    """A source's offset from a progress: JSON, or, from Spark Connect 4.0 and 4.1 clients
    (whose progress events give it as ``str()`` of a dict), a Python literal."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
