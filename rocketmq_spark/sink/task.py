"""One Spark task's write: its Arrow batches in, its messages acknowledged, a summary out.

The task returns only when every message it was given has been acknowledged with an accepted
status; otherwise it raises, Spark fails the task and runs it again (and the messages it
sends again carry the same message ids, see :mod:`.ids`). :func:`write_task` is the task at
least once; the exactly-once task (:mod:`.exactly_once_task`) sends the same rows as half
messages through the same steps (:func:`task_pipeline`, :func:`send_batches`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import pyarrow as pa

from ..client.errors import RocketMQError
from ..client.send.pipeline import Outgoing, PipelineStats, SendPipeline
from .grpc_transport import GrpcTransport
from .ids import TaskIdentity, message_id
from .options import SinkOptions
from .remoting_transport import RemotingTransport
from .requests import plan_requests
from .rows import normalize
from .schema import ColumnPlan
from .topic_type_guard import type_refusal_hint
from .transport import Transport, shared_grpc_producer, shared_producer

log = logging.getLogger(__name__)


class SinkWriteError(RuntimeError):
    """A task could not get its messages acknowledged; names the task and the cause."""


@dataclass
class TaskSummary(PipelineStats):
    """What one task sent (the commit message's content): its pipeline's figures (messages,
    one a row; requests, bytes, retries, busy answers, per broker) and the task's own."""

    partition: int = 0
    seconds: float = 0.0
    transport: str = ""
    first_id: Optional[str] = None
    # exactlyOnce: this attempt's write token and its half messages' handles (as tuples)
    token: Optional[str] = None
    handles: List[Tuple] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """The rows the task sent: a message each."""
        return self.messages

    @classmethod
    def of(cls, stats: PipelineStats, **task) -> "TaskSummary":
        """A summary holding a copy of ``stats`` and the task's own fields."""
        figures = {f.name: getattr(stats, f.name) for f in dataclasses.fields(PipelineStats)}
        figures = {k: dict(v) if isinstance(v, dict) else v for k, v in figures.items()}
        return cls(**figures, **task)


def open_transport(options: SinkOptions, group: str) -> Transport:
    """The at-least-once transport: gRPC when the option ``endpoints`` is set, RocketMQ's
    remoting protocol otherwise."""
    if options.endpoints:
        return GrpcTransport(shared_grpc_producer(options, group), options)
    return RemotingTransport(shared_producer(options), options, group)


def task_pipeline(transport: Transport, options: SinkOptions,
                  on_result: Optional[Callable] = None) -> SendPipeline:
    """The task's send pipeline over ``transport``, with the options' limits."""
    return SendPipeline(transport, max_in_flight_per_broker=options.max_in_flight_per_broker,
                        send_timeout=options.send_timeout_ms / 1000.0,
                        retries=options.retries, accept=options.accept_statuses,
                        on_result=on_result,
                        busy_timeout=options.broker_busy_timeout_ms / 1000.0,
                        busy_timeout_name="brokerBusyTimeoutMs",
                        busy_log=transport.busy_log)


def send_batches(batches: Iterable[pa.RecordBatch], plan: ColumnPlan, options: SinkOptions,
                 identity: TaskIdentity, transport: Transport, pipeline: SendPipeline) -> int:
    """Check, encode and submit every row of ``batches`` to ``pipeline``; returns the number
    of rows (the caller flushes the pipeline)."""
    queues: Dict[str, list] = {}

    def queues_of(topic: str):
        if topic not in queues:
            queues[topic] = list(transport.queues(topic))
        return queues[topic]

    row = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        rows = normalize(batch, plan, options, identity, row)
        prepared = transport.prepare(rows)
        for topic, queue, index, single in plan_requests(
                prepared, queues_of, options.max_batch_bytes, transport.max_request_rows):
            pipeline.submit(Outgoing(topic, transport.payload(prepared, index, single),
                                     len(index), int(prepared.sizes[index].sum()), queue,
                                     row + int(index[0])))
        row += batch.num_rows
    return row


def task_failed(identity: TaskIdentity, options: SinkOptions, exc: RocketMQError,
                consequence: str) -> SinkWriteError:
    """The task's error: what failed, ``consequence`` (what stays sent), and a hint when a
    topic's message type refused the messages."""
    hint = type_refusal_hint(exc, options.topic)
    return SinkWriteError(f"the rocketmq sink's task ({identity.describe()}) failed: {exc}. "
                          f"{consequence}{hint}")


def summarize(identity: TaskIdentity, rows: int, stats: PipelineStats, started: float,
              transport: Transport) -> TaskSummary:
    """The task's summary once ``stats`` acknowledged its ``rows``; logs it."""
    if stats.messages != rows:  # every row is one message; anything else is a bug
        raise AssertionError(f"{rows} rows but {stats.messages} messages acknowledged")
    summary = TaskSummary.of(stats, partition=identity.partition,
                             seconds=time.monotonic() - started, transport=transport.name,
                             first_id=message_id(identity, 0) if rows else None)
    log.info("sink task %s: %d rows in %d requests (%d retries, %d busy answers) in %.2f s",
             identity.describe(), rows, stats.requests, stats.retries, stats.busy,
             summary.seconds)
    return summary


def write_task(batches: Iterable[pa.RecordBatch], plan: ColumnPlan, options: SinkOptions,
               identity: TaskIdentity, group: str,
               transport: Optional[Transport] = None) -> TaskSummary:
    """Send every row of ``batches`` at least once; return once all are acknowledged (or
    raise: what was acknowledged stays sent, and Spark's retry sends it again, same ids)."""
    started = time.monotonic()
    transport = transport or open_transport(options, group)
    pipeline = task_pipeline(transport, options)
    try:
        rows = send_batches(batches, plan, options, identity, transport, pipeline)
        stats = pipeline.flush()
    except RocketMQError as exc:
        raise task_failed(identity, options, exc, (
            "Messages acknowledged before this stay sent (at least once); Spark runs the task "
            "again and resends them with the same message ids.")) from exc
    finally:
        transport.close()
    return summarize(identity, rows, stats, started, transport)
