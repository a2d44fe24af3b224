"""One Spark task's write exactly once: every row a half message, handles back to the driver.

The task sends its rows as half messages of a transaction (:class:`~.remoting_transport
.HalfMessageTransport`), each carrying the query, the batch and a write token fresh for this
attempt, and returns their handles; the driver COMMITs the attempt Spark keeps (see
:mod:`.exactly_once`). A task that fails rolls back the half messages it stored, and waits a
moment for the brokers to confirm: nothing of a failed attempt is delivered.
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import Dict, Iterable, List, Optional

import pyarrow as pa

from ..client.errors import RocketMQError
from ..client.txn.transaction import (
    HalfHandle, Outcome, end_transactions_confirmed, half_properties,
)
from .check_back import BATCH_PROPERTY, QUERY_PROPERTY, TOKEN_PROPERTY
from .ids import TaskIdentity
from .options import SinkOptions
from .remoting_transport import HalfMessageTransport
from .schema import ColumnPlan
from .task import TaskSummary, send_batches, summarize, task_failed, task_pipeline
from .transport import shared_producer

log = logging.getLogger(__name__)
ROLLBACK_WAIT = 10.0  # seconds a failed task waits for its rollbacks to be confirmed


def half_message_properties(group: str, scope: str, batch_id: int) -> Dict[str, str]:
    """A task attempt's half-message properties: a fresh write token per attempt, so the
    record can tell the attempt Spark kept from failed ones (row ids repeat across them)."""
    props = half_properties(group)
    props.update({QUERY_PROPERTY: scope, BATCH_PROPERTY: str(batch_id),
                  TOKEN_PROPERTY: secrets.token_hex(8)})
    return props


def open_half_transport(options: SinkOptions, group: str,
                        properties: Dict[str, str]) -> HalfMessageTransport:
    """The exactly-once transport: half messages over RocketMQ's remoting protocol."""
    if options.endpoints:
        raise ValueError("half messages are sent over the remoting protocol only")
    return HalfMessageTransport(shared_producer(options), options, group, properties)


def write_halves(batches: Iterable[pa.RecordBatch], plan: ColumnPlan, options: SinkOptions,
                 identity: TaskIdentity, group: str, half_properties: Dict[str, str],
                 transport: Optional[HalfMessageTransport] = None) -> TaskSummary:
    """Send every row of ``batches`` as a half message with ``half_properties`` (see
    :func:`half_message_properties`); return the summary with the attempt's token and the
    handles of its half messages. On failure, roll back those already stored."""
    started = time.monotonic()
    transport = transport or open_half_transport(options, group, half_properties)
    handles: List[HalfHandle] = []

    def keep_handles(item, queue, results):
        handles.extend(sent.handle for sent in results)

    pipeline = task_pipeline(transport, options, on_result=keep_handles)
    try:
        rows = send_batches(batches, plan, options, identity, transport, pipeline)
        stats = pipeline.flush()
    except RocketMQError as exc:
        _roll_back(transport, group, handles + [sent.handle for sent in pipeline.unreported()])
        raise task_failed(identity, options, exc, (
            "Its half messages are rolled back (exactlyOnce): nothing of this attempt is "
            "delivered; Spark runs the task again.")) from exc
    except BaseException:
        # anything else (a bad row, Spark cancelling the task): undo the stored halves too
        _roll_back(transport, group, handles + [sent.handle for sent in pipeline.unreported()])
        raise
    finally:
        transport.close()
    summary = summarize(identity, rows, stats, started, transport)
    summary.token = half_properties.get(TOKEN_PROPERTY)
    summary.handles = [h.to_tuple() for h in handles]
    return summary


def _roll_back(transport: HalfMessageTransport, group: str, handles: List[HalfHandle]) -> None:
    """ROLLBACK the half messages a failed attempt stored, and wait for the brokers to
    confirm (Spark may end this process right after the task fails, closing its connections
    before oneway requests were read); check-backs settle what this misses."""
    if not handles:
        return
    applied, missed = end_transactions_confirmed(transport.producer.remoting, group, handles,
                                                 Outcome.ROLLBACK, ROLLBACK_WAIT)
    if missed:
        log.warning("rolled back %d of the %d half messages of a failed task; the brokers' "
                    "check-backs will roll back the other %d", applied, len(handles),
                    len(missed))
