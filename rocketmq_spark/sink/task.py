"""One Spark task's write: its Arrow batches in, its messages acknowledged, a summary out.

The task returns only when every message it was given has been acknowledged with an accepted
status; otherwise it raises, Spark fails the task and runs it again (and the messages it
sends again carry the same message ids, see :mod:`.ids`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import pyarrow as pa

from ..client.errors import RocketMQError
from ..client.send.pipeline import Outgoing, SendPipeline
from ..client.txn.transaction import Outcome, end_transactions_confirmed
from .ids import TaskIdentity, message_id
from .options import SinkOptions
from .requests import plan_requests
from .rows import normalize
from .schema import ColumnPlan
from .topic_type_guard import type_refusal_hint
from .transport import Transport, open_transport

log = logging.getLogger(__name__)
ROLLBACK_WAIT = 10.0  # seconds a failed task waits for its rollbacks to be confirmed


class SinkWriteError(RuntimeError):
    """A task could not get its messages acknowledged; names the task and the cause."""


@dataclass
class TaskSummary:
    """What one task sent (the commit message's content)."""

    partition: int
    rows: int = 0
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    seconds: float = 0.0
    by_broker: Dict[str, int] = field(default_factory=dict)
    # busy answers (back-pressure, not failures): in all and per broker
    busy: int = 0
    busy_by_broker: Dict[str, int] = field(default_factory=dict)
    transport: str = ""
    first_id: Optional[str] = None
    # exactlyOnce: this attempt's write token and its half messages' handles (as tuples)
    token: Optional[str] = None
    handles: List[Tuple] = field(default_factory=list)


def write_task(batches: Iterable[pa.RecordBatch], plan: ColumnPlan, options: SinkOptions,
               identity: TaskIdentity, group: str,
               transport: Optional[Transport] = None,
               half_properties: Optional[Dict[str, str]] = None) -> TaskSummary:
    """Send every row of ``batches``; return once all are acknowledged (or raise).

    ``half_properties`` (exactlyOnce): send half messages with these properties and return
    their handles; on failure, roll back the ones already stored (best effort)."""
    started = time.monotonic()
    transport = transport or open_transport(options, group, half_properties)
    handles: List = []

    def keep_handles(item, queue, results):
        handles.extend(sent.handle for sent in results)

    pipeline = SendPipeline(transport, max_in_flight_per_broker=options.max_in_flight_per_broker,
                            send_timeout=options.send_timeout_ms / 1000.0,
                            retries=options.retries, accept=options.accept_statuses,
                            on_result=keep_handles if half_properties is not None else None,
                            busy_timeout=options.broker_busy_timeout_ms / 1000.0,
                            busy_timeout_name="brokerBusyTimeoutMs",
                            busy_log=transport.busy_log)
    queues: Dict[str, list] = {}

    def queues_of(topic: str):
        if topic not in queues:
            queues[topic] = list(transport.queues(topic))
        return queues[topic]

    row = 0
    try:
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
        stats = pipeline.flush()
    except RocketMQError as exc:
        hint = type_refusal_hint(exc, options.topic)
        if half_properties is not None:
            _roll_back(transport, group, handles + [
                sent.handle for sent in pipeline.unreported()])
            raise SinkWriteError(
                f"the rocketmq sink's task ({identity.describe()}) failed: {exc}. Its half "
                "messages are rolled back (exactlyOnce): nothing of this attempt is "
                f"delivered; Spark runs the task again.{hint}") from exc
        raise SinkWriteError(
            f"the rocketmq sink's task ({identity.describe()}) failed: {exc}. Messages "
            "acknowledged before this stay sent (at least once); Spark runs the task again "
            f"and resends them with the same message ids.{hint}") from exc
    except BaseException:
        # anything else (a bad row, Spark cancelling the task): undo the stored halves too
        if half_properties is not None:
            _roll_back(transport, group, handles + [
                sent.handle for sent in pipeline.unreported()])
        raise
    finally:
        transport.close()
    summary = TaskSummary(identity.partition, row, stats.requests, stats.bytes, stats.retries,
                          time.monotonic() - started, dict(stats.by_broker), stats.busy,
                          dict(stats.busy_by_broker), transport.name,
                          message_id(identity, 0) if row else None)
    if half_properties is not None:
        summary.token = half_properties.get("SPARK_WRITE_TOKEN")
        summary.handles = [h.to_tuple() for h in handles]
    if stats.messages != row:  # every row is one message; anything else is a bug
        raise AssertionError(f"{row} rows but {stats.messages} messages acknowledged")
    log.info("sink task %s: %d rows in %d requests (%d retries, %d busy answers) in %.2f s",
             identity.describe(), row, stats.requests, stats.retries, stats.busy,
             summary.seconds)
    return summary


def _roll_back(transport: Transport, group: str, handles: List) -> None:
    """ROLLBACK the half messages a failed attempt stored, and wait for the brokers to
    confirm (Spark may end this process right after the task fails, closing its connections
    before oneway requests were read); check-backs settle what this misses."""
    producer = getattr(transport, "producer", None)
    if not handles or producer is None:
        return
    applied, missed = end_transactions_confirmed(producer.remoting, group, handles,
                                                 Outcome.ROLLBACK, ROLLBACK_WAIT)
    if missed:
        log.warning("rolled back %d of the %d half messages of a failed task; the brokers' "
                    "check-backs will roll back the other %d", applied, len(handles),
                    len(missed))
