"""The answer to a broker's check-back about one of the sink's half messages.

Every half message of an exactlyOnce write carries the query id, the micro-batch id and the
write token of its task attempt (the properties below); :func:`decide` answers from the commit
record (see :mod:`.exactly_once` for the whole protocol), and COMMITs one copy of a row only
once (a 5.1+ broker may ask about a newer copy before the op entry of that COMMIT is written).
"""
from __future__ import annotations

import time
from typing import Optional

from ..client.txn.transaction import CheckRequest, Outcome
from .commit_record import CommitLog
from ..client.txn.op_topic import OP_WRITE_DELAY_S, OpTopic

QUERY_PROPERTY = "SPARK_QUERY_ID"
BATCH_PROPERTY = "SPARK_BATCH_ID"
TOKEN_PROPERTY = "SPARK_WRITE_TOKEN"
# How long after the END_TRANSACTIONs of a batch were sent a check-back about one of its rows
# is answered UNKNOWN: the broker may still be working through them.
END_GRACE_SECONDS = 10.0


def decide(commit_log: CommitLog, query_id: str, ops: OpTopic, request: CheckRequest,
           now: Optional[float] = None) -> Outcome:
    """The answer to a check-back, from the record (see the module's docstring)."""
    props = request.properties
    if props.get(QUERY_PROPERTY) != query_id or BATCH_PROPERTY not in props:
        return Outcome.UNKNOWN  # not this query's (another writer in the group)
    try:
        batch_id = int(props[BATCH_PROPERTY])
    except ValueError:
        return Outcome.UNKNOWN
    token = props.get(TOKEN_PROPERTY, "")
    record = commit_log.committed(batch_id)
    if record is None:
        if token in commit_log.aborted_tokens(batch_id):
            return Outcome.ROLLBACK
        ids = commit_log.committed_ids()
        if ids and batch_id < ids[-1]:
            return Outcome.ROLLBACK  # older than a committed batch: never to be committed
        return Outcome.UNKNOWN       # maybe still running
    if token not in record.tokens:
        return Outcome.ROLLBACK      # a failed or replayed attempt
    ended = commit_log.ended_at(batch_id)
    now = time.time() if now is None else now
    if ended is None or now - ended < END_GRACE_SECONDS:
        return Outcome.UNKNOWN       # END_TRANSACTIONs being sent (or a restart will settle)
    original = next((h for h in record.handles if h.uniq_key == request.uniq_key
                     and h.address == request.address), None)
    if original is None:
        original = next((h for h in record.handles if h.uniq_key == request.uniq_key), None)
    if original is None:
        return Outcome.UNKNOWN
    settled = ops.settled(original.address, record.op_start.get(original.address, 0))
    if original.queue_offset in settled:
        return Outcome.ROLLBACK
    # Not settled by our END_TRANSACTION: COMMIT this copy, once. A 5.1+ broker writes the op
    # entry of that COMMIT up to transactionOpBatchInterval later and may meanwhile ask about a
    # newer copy: wait for the entry (UNKNOWN), then ROLLBACK; COMMIT again only if it never
    # shows (the answer was lost).
    answered = ops.commits_answered.get(request.uniq_key)
    clock = time.monotonic()
    if answered is not None:
        copy_offset, at = answered
        if copy_offset in settled:
            return Outcome.ROLLBACK
        if clock - at < 2 * OP_WRITE_DELAY_S:
            return Outcome.UNKNOWN
    ops.commits_answered[request.uniq_key] = (request.queue_offset, clock)
    return Outcome.COMMIT
