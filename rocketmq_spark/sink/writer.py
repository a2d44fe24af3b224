"""The Spark side of the sink: ``df.write`` and ``writeStream`` with ``format("rocketmq")``.

Options and input columns are checked in :func:`batch_writer` / :func:`stream_writer`, which
``DataSource.writer()`` / ``streamWriter()`` call on the driver, so a bad option or column
fails the query before any task runs. Each task's ``write()`` sends its rows
(:func:`.task.write_task`) and returns a :class:`SinkCommit` once every message is
acknowledged. Delivery is at least once: a failed task is run again by Spark and resends its
rows with the same message ids; nothing is rolled back on ``abort``.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..options import OptionError
from .ids import TaskIdentity, new_job_token
from .options import SinkOptions, parse_sink_options
from .schema import ColumnPlan, plan_columns
from .task import TaskSummary, write_task

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


def _group_name(text: str) -> str:
    return (GROUP_PREFIX + re.sub(r"[^%|a-zA-Z0-9_-]", "_", text))[:255]


def _totals(messages: List[Optional[WriterCommitMessage]]) -> str:
    done = [m.summary for m in messages if isinstance(m, SinkCommit)]
    rows = sum(s.rows for s in done)
    retries = sum(s.retries for s in done)
    return (f"{rows} rows from {len(done)} of {len(messages)} tasks, {retries} retried "
            "requests")


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq")``: each task sends its partition's rows."""

    def __init__(self, options: SinkOptions, plan: ColumnPlan, job_token: str):
        self.options = options
        self.plan = plan
        self.job_token = job_token

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = _task_context()
        identity = TaskIdentity("job", self.job_token, None, context.partitionId())
        group = self.options.producer_group or _group_name(self.job_token)
        return SinkCommit(write_task(iterator, self.plan, self.options, identity, group))

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        log.info("rocketmq sink job %s committed: %s", self.job_token, _totals(messages))

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        log.warning("rocketmq sink job %s aborted after %s; messages already acknowledged "
                    "stay in their topics (delivery is at least once)", self.job_token,
                    _totals(messages))


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("rocketmq")``: each micro-batch's tasks send their rows; message
    ids come from (query id, batch id, partition, row), so a replayed batch resends the
    same ids."""

    def __init__(self, options: SinkOptions, plan: ColumnPlan, query_name: Optional[str]):
        self.options = options
        self.plan = plan
        self.query_name = query_name

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = _task_context()
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the rocketmq stream sink's task has no query id or batch id "
                               "(sql.streaming.queryId / streaming.sql.batchId)")
        identity = TaskIdentity("stream", query_id, int(batch_id), context.partitionId())
        group = self.options.producer_group or _group_name(self.query_name or query_id)
        return SinkCommit(write_task(iterator, self.plan, self.options, identity, group))

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        log.info("rocketmq sink micro-batch %d committed: %s", batchId, _totals(messages))

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
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
    return RocketMQBatchWriter(options, plan_columns(schema, options.topic), new_job_token())


def stream_writer(raw: Mapping[str, str], schema: StructType, overwrite: bool
                  ) -> RocketMQStreamWriter:
    """Check options and columns on the driver. Every output mode appends (complete mode
    sends the whole result again each micro-batch, as the Kafka sink does)."""
    options = parse_sink_options(raw)
    query_name = next((str(v) for k, v in raw.items() if str(k).lower() == "queryname"), None)
    return RocketMQStreamWriter(options, plan_columns(schema, options.topic), query_name)
