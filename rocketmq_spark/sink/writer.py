"""The Spark side of the sink: ``df.write`` and ``writeStream`` with ``format("rocketmq")``.

Options and input columns are checked in :func:`batch_writer` / :func:`stream_writer`, which
``DataSource.writer()`` / ``streamWriter()`` call on the driver, so a bad option or column
fails the query before any task runs; they choose the delivery guarantee (:mod:`.delivery`)
once. Each task's ``write()`` sends its rows under that guarantee and returns a
:class:`SinkCommit` once every message is acknowledged. Delivery is at least once by default:
a failed task is run again by Spark and resends its rows with the same message ids; nothing is
rolled back on ``abort``. With ``deliveryGuarantee=exactlyOnce`` rows travel as half messages
that ``commit`` settles (:mod:`.exactly_once`).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..client.errors import RocketMQError
from ..client.namespace import GROUP_MAX_LENGTH, wrap
from ..client.txn.transaction import HalfHandle, Outcome, end_transactions_confirmed
from ..options import NAME_CHARS, OptionError
from ..spark_compat import stream_writer_bases
from . import exactly_once
from .exactly_once import CommitObserver
from ..storage import StorageError, spark_log
from .batch_time import batch_created_ms
from .commit_record import open_record, spark_checkpoint
from .delivery import Delivery, Plan, delivery_of
from .ids import TaskIdentity, new_job_token, now_ms
from .options import SinkOptions, parse_sink_options
from .proxy_guard import exactly_once_proxy, refuse_exactly_once_stream_through_proxy
from .proxy_settle import settle_job
from .topic_type_guard import check_topic_type
from .task import TaskSummary
from .transport import shared_producer

log = logging.getLogger(__name__)
GROUP_PREFIX = "spark-rocketmq-sink-"


@dataclass
class SinkCommit(WriterCommitMessage):
    """One task's commit message: what it sent."""

    summary: TaskSummary


def _task_context():
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the rocketmq sink's write() runs in a Spark task")
    return context


def _group_name(options: SinkOptions, text: str) -> str:
    """The producer group on the wire: ``producerGroup`` or ours named after ``text``, in
    the option ``namespace`` (Java's producers put their group into it when they start, and
    the brokers address check-backs to that name)."""
    room = GROUP_MAX_LENGTH - (len(options.namespace) + 1 if options.namespace else 0)
    name = options.producer_group or (GROUP_PREFIX + re.sub(rf"[^{NAME_CHARS}]", "_", text))
    return wrap(options.namespace, name[:room])


def _handles(messages: List[Optional[WriterCommitMessage]]) -> List[HalfHandle]:
    return [HalfHandle._make(t) for m in messages if isinstance(m, SinkCommit)
            for t in m.summary.handles]


_warned = False


def _warn_limits() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(exactly_once.check_limits_warning())


def _query_id(options: SinkOptions) -> Optional[str]:
    """The query id Spark keeps in ``<checkpointLocation>/metadata`` (stable across runs),
    read through the storage layer (the checkpoint may be on HDFS or an object store)."""
    if not options.checkpoint_location:
        return None
    try:
        return spark_log.query_id(spark_checkpoint(options.checkpoint_location,
                                                   options.checkpoint_storage))
    except (OSError, ValueError, StorageError):
        return None


def _totals(messages: List[Optional[WriterCommitMessage]]) -> str:
    done = [m.summary for m in messages if isinstance(m, SinkCommit)]
    rows = sum(s.rows for s in done)
    retries = sum(s.retries for s in done)
    busy = sum(s.busy for s in done)
    return (f"{rows} rows from {len(done)} of {len(messages)} tasks, {retries} retried "
            f"requests, {busy} busy answers")


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq")``: each task sends its partition's rows."""

    proxy: Optional[str] = None  # exactly once through this 5.x proxy: settled by check-back

    def __init__(self, options: SinkOptions, plan: Plan, job_token: str,
                 created_ms: Optional[int] = None, delivery: Optional[Delivery] = None):
        self.options = options
        self.plan = plan
        self.delivery = delivery or delivery_of(options)
        self.job_token = job_token
        self.created_ms = now_ms() if created_ms is None else created_ms  # ids bytes 10-13

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = _task_context()
        identity = TaskIdentity("job", self.job_token, None, context.partitionId(),
                                self.created_ms)
        return SinkCommit(self.delivery.write(iterator, self.plan, self.options, identity,
                                              self._group()))

    def _group(self) -> str:
        return _group_name(self.options, self.job_token)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        if self.options.exactly_once and self.proxy:
            settle_job(self.options, self.proxy, self._group(), self.job_token,
                       [m.summary.token for m in messages
                        if isinstance(m, SinkCommit) and m.summary.token], _handles(messages))
        elif self.options.exactly_once:
            self._commit_halves(_handles(messages))
        log.info("rocketmq sink job %s committed: %s", self.job_token, _totals(messages))

    def _commit_halves(self, handles: List[HalfHandle]) -> None:
        """COMMIT every half message as requests the brokers answer: a job has no checkpoint
        and no check-back responder, so a COMMIT a busy broker refuses (its END_TRANSACTION
        queue expired it) must be sent again, and one never confirmed must fail the job
        rather than leave its row to be discarded unseen."""
        remoting = shared_producer(self.options).remoting
        wait = (self.options.send_timeout_ms + self.options.broker_busy_timeout_ms) / 1000.0
        applied, missed = end_transactions_confirmed(remoting, self._group(), handles,
                                                     Outcome.COMMIT, wait)
        if missed:
            raise RocketMQError(
                f"rocketmq sink job {self.job_token}: the brokers confirmed {applied} of "
                f"{len(handles)} COMMITs (END_TRANSACTION); the other {len(missed)} rows may be "
                "missing (never duplicated): a broker that never settles a half message "
                "discards it after transactionCheckMax checks")

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        if self.options.exactly_once:
            exactly_once.rollback(shared_producer(self.options).remoting, self._group(),
                        _handles(messages))
            log.warning("rocketmq sink job %s aborted after %s; its half messages are rolled "
                        "back (exactlyOnce)", self.job_token, _totals(messages))
            return
        log.warning("rocketmq sink job %s aborted after %s; messages already acknowledged "
                    "stay in their topics (delivery is at least once)", self.job_token,
                    _totals(messages))


class RocketMQStreamWriter(*stream_writer_bases()):
    """``writeStream.format("rocketmq")``: each micro-batch's tasks send their rows; message
    ids come from (query id, batch id, partition, row), so a replayed batch resends the
    same ids. Its input is Arrow on every Spark (see :func:`.stream_writer_bases`)."""

    def __init__(self, options: SinkOptions, plan: Plan, query_name: Optional[str],
                 raw_options: Optional[Mapping[str, str]] = None,
                 observer: Optional[CommitObserver] = None,
                 delivery: Optional[Delivery] = None):
        self.options = options
        self.plan = plan
        self.delivery = delivery or delivery_of(options)
        self.query_name = query_name
        self.raw_options = dict(raw_options or {})
        self.observer = observer
        # exactlyOnce: the highest batch recorded when this run started (set by stream_writer)
        self.recorded_through: Optional[int] = None
        self.created_ms = now_ms()  # ids' time when Spark's offset log is out of reach

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = _task_context()
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the rocketmq stream sink's task has no query id or batch id "
                               "(sql.streaming.queryId / streaming.sql.batchId)")
        created = batch_created_ms(self.options.checkpoint_location, int(batch_id),
                                   self.created_ms, self.options.checkpoint_storage)
        identity = TaskIdentity("stream", query_id, int(batch_id), context.partitionId(), created)
        return SinkCommit(self.delivery.write(iterator, self.plan, self.options, identity,
                                              self._group(query_id)))

    def _group(self, query_id: str) -> str:
        return _group_name(self.options, self.query_name or query_id)

    def _commit_log(self) -> exactly_once.CommitLog:
        return open_record(self.options.checkpoint_location, self.options.checkpoint_storage)

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        if self.options.exactly_once:
            self._commit_exactly_once(messages, batchId)
        log.info("rocketmq sink micro-batch %d committed: %s", batchId, _totals(messages))

    def _commit_exactly_once(self, messages: List[Optional[WriterCommitMessage]],
                             batch_id: int) -> None:
        commit_log = self._commit_log()
        query_id = _query_id(self.options)
        if query_id is None:
            raise RuntimeError(f"the rocketmq sink cannot read the query id from "
                               f"{self.options.checkpoint_location}/metadata")
        group = self._group(query_id)
        # A batch above those recorded when this run started cannot be a replay: no read of
        # the record for it (a round trip on an object store). Recording it notes activity.
        commit_log.absent_above = self.recorded_through
        exactly_once.ensure_responder(commit_log, self.raw_options, group, query_id)
        _warn_limits()
        remoting = shared_producer(self.options).remoting
        tokens = [m.summary.token for m in messages
                  if isinstance(m, SinkCommit) and m.summary.token]
        record = exactly_once.BatchRecord(batch_id, query_id, group, tokens, _handles(messages))
        sent = exactly_once.commit_batch(commit_log, remoting, exactly_once.OpTopic(remoting),
                                         record, self.observer)
        log.info("rocketmq sink micro-batch %d: %d END_TRANSACTION COMMITs sent", batch_id,
                 sent)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        if self.options.exactly_once:
            commit_log = self._commit_log()
            query_id = _query_id(self.options) or ""
            tokens = [m.summary.token for m in messages
                      if isinstance(m, SinkCommit) and m.summary.token]
            commit_log.record_abort(batchId, tokens)
            commit_log.touch()
            exactly_once.rollback(shared_producer(self.options).remoting, self._group(query_id),
                        _handles(messages))
            log.warning("rocketmq sink micro-batch %d aborted after %s; its half messages "
                        "are rolled back (exactlyOnce) and Spark runs it again", batchId,
                        _totals(messages))
            return
        log.warning("rocketmq sink micro-batch %d aborted after %s; Spark runs it again and "
                    "the messages already sent are sent again with the same ids", batchId,
                    _totals(messages))


def batch_writer(raw: Mapping[str, str], schema: StructType, overwrite: bool
                 ) -> RocketMQBatchWriter:
    """Check options and columns on the driver; a topic cannot be overwritten."""
    if overwrite:
        raise OptionError("a RocketMQ topic cannot be overwritten: use mode(\"append\") "
                          "(messages are appended to the topic)")
    options = parse_sink_options(raw)
    delivery = delivery_of(options)
    plan = delivery.plan(schema, options)
    check_topic_type(options, plan)
    writer = RocketMQBatchWriter(options, plan, new_job_token(), delivery=delivery)
    writer.proxy = exactly_once_proxy(options)
    return writer


def stream_writer(raw: Mapping[str, str], schema: StructType, overwrite: bool,
                  observer: Optional[CommitObserver] = None) -> RocketMQStreamWriter:
    """Check options and columns on the driver. Every output mode appends (complete mode
    sends the whole result again each micro-batch, as the Kafka sink does). ``observer``:
    a test's hooks into the exactly-once commit (see :class:`.exactly_once.CommitObserver`)."""
    options = parse_sink_options(raw)
    query_name = next((str(v) for k, v in raw.items() if str(k).lower() == "queryname"), None)
    delivery = delivery_of(options)
    plan = delivery.plan(schema, options)
    refuse_exactly_once_stream_through_proxy(options)
    check_topic_type(options, plan)
    if options.exactly_once:
        # Before this run writes anything: settle what an earlier run left pending.
        # The record's store is checked here, at the query's start (reads only).
        commit_log = open_record(options.checkpoint_location, options.checkpoint_storage,
                                 check=True)
        if commit_log.pending():
            remoting = shared_producer(options).remoting
            exactly_once.settle(commit_log, remoting, exactly_once.OpTopic(remoting))
        writer = RocketMQStreamWriter(options, plan, query_name, raw, observer, delivery)
        writer.recorded_through = max(commit_log.committed_ids(), default=-1)
        return writer
    return RocketMQStreamWriter(options, plan, query_name, raw, observer, delivery)
