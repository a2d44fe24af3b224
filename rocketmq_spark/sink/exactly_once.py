"""Exactly once (``deliveryGuarantee=exactlyOnce``): the commit record and settlement.

Tasks send every row as a half message carrying (query id, batch id, write token) in its
properties and return the handles END_TRANSACTION needs. On the driver, ``commit(messages,
batchId)``:

1. records durably, under the checkpoint (``<checkpointLocation>/rocketmq-sink/``), that the
   batch is committed, with the write tokens of the task attempts Spark kept and their
   handles (a temporary file, fsync, atomic rename, fsync of the directory);
2. sends END_TRANSACTION COMMIT for every handle;
3. marks the batch's END_TRANSACTIONs as sent (``ended/<batchId>``).

A batch already recorded (a replay after a crash between the record and Spark's commit log)
rolls back the new half messages instead. ``abort`` rolls back what it got and records the
aborted tokens.

Check-backs are answered from the record (:func:`decide`): a token of a recorded batch →
COMMIT, unless the END_TRANSACTION sent for that row's original half message has already
settled it (an op message exists for its half offset: then the broker is asking about a copy
it re-stored while our END_TRANSACTION was on its way, and a COMMIT would write the row
twice) → ROLLBACK; any other token of a recorded or older batch → ROLLBACK; a batch not
recorded yet, or whose END_TRANSACTIONs are being sent → UNKNOWN (asked again later).

On restart, the first ``streamWriter()`` of the new run (on the driver, before any task
writes) settles what the last run left pending (:func:`settle`): for a batch recorded but not
marked, the op topic says which half messages the dead driver's END_TRANSACTIONs reached (read
in both of its forms, :mod:`..client.txn.op_topic`; read again a few seconds later when some look
unsettled, as a 5.1+ broker writes op entries in batches); only the others get a COMMIT. Never
a blind second COMMIT: an op topic that cannot be read fails the restart.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import psutil

from ..client.errors import RocketMQError
from ..client.remoting import RemotingClient
from ..client.txn.transaction import HalfHandle, Outcome, end_transactions
from ..storage import lease_looks_held
from ..storage.lease import TTL_S as LEASE_TTL_S
from .check_back import (
    BATCH_PROPERTY, END_GRACE_SECONDS, QUERY_PROPERTY, TOKEN_PROPERTY, decide,
)
from .commit_record import BatchRecord, CommitLog, record_root
from ..client.txn.op_topic import OP_WRITE_DELAY_S, OpTopic, OpTopicError

__all__ = [  # the protocol in one place; its parts live in the modules imported above
    "BATCH_PROPERTY", "END_GRACE_SECONDS", "QUERY_PROPERTY", "TOKEN_PROPERTY", "BatchRecord",
    "CommitLog", "CommitObserver", "OpTopic", "OpTopicError", "check_limits_warning",
    "commit_batch", "decide", "driver_jvm_pid", "ensure_responder", "new_handles",
    "record_root", "responder_log_dir", "rollback", "settle", "settle_batch", "RESPONDER_LEASE",
]
log = logging.getLogger(__name__)

# A genuine 4.x broker's defaults: transactionCheckInterval 60 s, transactionCheckMax 15.
BROKER_CHECK_INTERVAL = 60
BROKER_CHECK_MAX = 15


def check_limits_warning(interval_s: int = BROKER_CHECK_INTERVAL,
                         check_max: int = BROKER_CHECK_MAX) -> str:
    minutes = interval_s * check_max / 60
    return (f"rocketmq sink (exactlyOnce): a broker asks about an unsettled half message every "
            f"transactionCheckInterval ({interval_s} s on a default 4.x broker) and discards it "
            f"after transactionCheckMax ({check_max}) checks, about {minutes:.0f} minutes. If "
            "this query stays down longer than that after a crash between its commit record "
            "and its END_TRANSACTIONs, the unsettled rows of that batch are lost. Restart "
            "queries promptly, or raise transactionCheckMax on the brokers")


EndTransactionSender = Callable[[Sequence[HalfHandle]], int]


class CommitObserver:
    """The points of an exactly-once commit, on the driver, where a test may act (the kill
    tests SIGKILL the driver there). This one does nothing; a test hands its subclass to
    :func:`.writer.stream_writer`, and it travels pickled with the stream writer."""

    def recorded(self, commit_log: CommitLog, batch_id: int) -> None:
        """The batch is durably recorded as committed; no END_TRANSACTION is sent yet."""

    def send_end_transactions(self, send: EndTransactionSender, handles: Sequence[HalfHandle],
                              commit_log: CommitLog, batch_id: int) -> int:
        """Send the batch's END_TRANSACTION COMMITs: ``send(handles)``, in one call. Returns
        how many were sent."""
        return send(handles)

    def committed(self, commit_log: CommitLog, batch_id: int) -> None:
        """The sink's commit of the batch is done (END_TRANSACTIONs sent and marked, or a
        replay rolled back); Spark has not written its commit log yet."""


def new_handles(record: BatchRecord, previous: BatchRecord) -> List[HalfHandle]:
    """The handles of ``record`` that ``previous`` (the same batch, recorded by an earlier
    run) does not hold: the half messages of a replay, in order."""
    recorded = set(previous.handles)
    return [h for h in record.handles if h not in recorded]


def commit_batch(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic,
                 record: BatchRecord, observer: Optional[CommitObserver] = None) -> int:
    """Record, COMMIT, mark (or, for a batch already recorded, roll the new halves back).
    Returns how many END_TRANSACTION COMMITs were sent."""
    observer = observer or CommitObserver()
    previous = commit_log.committed(record.batch_id)
    if previous is not None:
        fresh = new_handles(record, previous)
        rollback(remoting, record.group, fresh)
        log.warning("rocketmq sink micro-batch %d was already committed by an earlier run; "
                    "rolled back the %d half messages of its replay", record.batch_id,
                    len(fresh))
        settle_batch(commit_log, remoting, ops, record.batch_id)
        observer.committed(commit_log, record.batch_id)
        return 0
    for address in sorted({h.address for h in record.handles}):
        record.op_start[address] = ops.max_offset(address)
    commit_log.record_commit(record)
    observer.recorded(commit_log, record.batch_id)

    def send(handles: Sequence[HalfHandle]) -> int:
        return end_transactions(remoting, record.group, handles, Outcome.COMMIT)

    sent = observer.send_end_transactions(send, record.handles, commit_log, record.batch_id)
    commit_log.mark_ended(record.batch_id)
    observer.committed(commit_log, record.batch_id)
    return sent


def rollback(remoting: RemotingClient, group: str, handles: Iterable[HalfHandle]) -> int:
    """ROLLBACK for every handle (best effort: a check-back settles what this misses)."""
    handles = list(handles)
    if not handles:
        return 0
    try:
        return end_transactions(remoting, group, handles, Outcome.ROLLBACK)
    except RocketMQError as exc:
        log.warning("rolling back %d half messages failed (%s); the brokers' check-backs "
                    "will roll them back", len(handles), exc)
        return 0


def _unsettled(ops: OpTopic, record: BatchRecord) -> List[HalfHandle]:
    """The handles of ``record`` whose half message no op message names yet."""
    todo: List[HalfHandle] = []
    by_address: Dict[str, List[HalfHandle]] = {}
    for h in record.handles:
        by_address.setdefault(h.address, []).append(h)
    for address, items in by_address.items():
        settled = ops.settled(address, record.op_start.get(address, 0))
        todo.extend(h for h in items if h.queue_offset not in settled)
    return todo


def settle_batch(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic,
                 batch_id: int, op_write_delay: float = OP_WRITE_DELAY_S) -> int:
    """COMMIT the rows of a recorded batch that no END_TRANSACTION has reached (the op topic
    says which, read again after ``op_write_delay`` seconds when some look unsettled), then
    mark it. Returns how many COMMITs were sent. Raises :class:`..client.txn.op_topic.OpTopicError`
    when an op topic cannot be read: committing blind could store rows twice."""
    if commit_log.ended_at(batch_id) is not None:
        return 0
    record = commit_log.committed(batch_id)
    if record is None:
        return 0
    todo = _unsettled(ops, record)
    if todo and op_write_delay > 0:
        # A 5.1+ broker keeps op entries in memory for up to transactionOpBatchInterval after
        # the END_TRANSACTION: the dead driver's last ones may not be readable yet.
        time.sleep(op_write_delay)
        todo = _unsettled(ops, record)
    sent = end_transactions(remoting, record.group, todo, Outcome.COMMIT) if todo else 0
    commit_log.mark_ended(batch_id)
    log.warning("rocketmq sink: settled micro-batch %d left pending by an earlier run: %d of "
                "its %d rows had not been committed; committed them now", batch_id, sent,
                len(record.handles))
    return sent


def settle(commit_log: CommitLog, remoting: RemotingClient, ops: OpTopic,
           op_write_delay: float = OP_WRITE_DELAY_S) -> int:
    """Settle every batch the last run recorded but did not finish (restart)."""
    return sum(settle_batch(commit_log, remoting, ops, b, op_write_delay)
               for b in commit_log.pending())


# ------------------------------------------------------------------------------ responder


def driver_jvm_pid() -> Optional[int]:
    """The nearest ancestor process that is a JVM (the Spark driver)."""
    try:
        for parent in psutil.Process().parents():
            cmdline = parent.cmdline()
            if cmdline and os.path.basename(cmdline[0]) == "java":
                return parent.pid
    except psutil.Error:
        return None
    return None


RESPONDER_LEASE = "responder.lease"
# A responder started by this process recently may still be taking its lease.
_started: Dict[str, float] = {}
_seen_held: Dict[str, float] = {}


def responder_log_dir(commit_log: CommitLog) -> str:
    """Where the responder's log goes: beside the record on a local store, else in a local
    temporary folder named after the record's location."""
    local = commit_log.store.local_dir()
    if local:
        return local
    digest = hashlib.sha1(commit_log.root.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"rocketmq-sink-{digest}")


def ensure_responder(commit_log: CommitLog, raw_options: Mapping[str, str], group: str,
                     query_id: str, idle_limit_s: Optional[float] = None) -> None:
    """Start the query's check-back responder unless one holds the record's responder lease.

    It is a process of its own (``python -m rocketmq_spark.sink.responder``), detached from
    Spark's worker, that lives while the driver JVM does (and not longer than ``idle_limit_s``,
    by default :data:`.responder.IDLE_LIMIT_S`, after the last commit), so the brokers always
    have someone of the group to ask. Which responder answers is settled by a lease object in
    the record (:class:`..storage.Lease`, on every store); this only avoids starting one
    needlessly. Options reach it on stdin, never on its command line (they may hold a secret
    key)."""
    if time.monotonic() - _started.get(commit_log.root, -1e9) < 2 * LEASE_TTL_S:
        return
    if time.monotonic() - _seen_held.get(commit_log.root, -1e9) < LEASE_TTL_S / 2:
        return  # seen held a moment ago: no read of the lease every micro-batch
    if lease_looks_held(commit_log.store, RESPONDER_LEASE):
        _seen_held[commit_log.root] = time.monotonic()
        return  # running
    _started[commit_log.root] = time.monotonic()
    config = {"root": commit_log.root, "options": dict(raw_options), "group": group,
              "queryId": query_id, "jvmPid": driver_jvm_pid() or os.getppid()}
    if idle_limit_s is not None:
        config["idleLimitS"] = idle_limit_s
    log_dir = responder_log_dir(commit_log)
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "responder.log"), "ab") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.sink.responder"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=log_file, start_new_session=True, close_fds=True)
    proc.stdin.write(json.dumps(config).encode())
    proc.stdin.close()
