"""Message ids (UNIQ_KEY) that a replay reproduces and that RocketMQ's tools can look up.

A message's id is derived from where its row sits, never from the clock at send time: for a
stream, from (query id, micro-batch id, partition id, row number within the task); for
``df.write``, from (a job token chosen once on the driver, partition id, row number). A task
that Spark runs again, or a micro-batch replayed after a driver restart, resends every message
with the id it had the first time, so consumers can drop the duplicates by message id.

The id has the shape of Java's: 16 bytes as 32 upper-case hex digits. Java's tools
(``mqadmin queryMsgByUniqueKey``, the dashboard: ``MQAdminImpl.queryMessageByUniqKey``) read
bytes 10-13 as milliseconds since the start of a month (``getNearlyTimeFromID``) and search the
brokers' index from that time on, so those bytes carry a time that is at or before the
message's store time:

==========  ================================================================================
bytes 0-5   BLAKE2b digest of the task's identity (first 6 bytes)
bytes 6-9   the row number within the task
bytes 10-13 the creation time of the job or micro-batch (see :func:`month_span`)
bytes 14-15 the same digest (bytes 6-7)
==========  ================================================================================

The creation time is one a replay finds again: a ``df.write`` takes it on the driver with its
job token (every task attempt gets both in the pickled writer); a micro-batch takes Spark's
own ``batchTimestampMs``, which Spark writes to ``<checkpointLocation>/offsets/<batchId>``
before the batch runs and reuses when it runs the batch again after a restart.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

import numpy as np
import pyarrow as pa

from ..client.protocol.send_encode import fixed_width_array

ID_HEX = 32
HEAD_HEX = 12   # digest bytes 0-5
# Java's tools take the month start in their own time zone. Writing the time as a Java
# producer in the westmost zone (UTC-12) would, plus an hour against clock skew, makes every
# tool, in any zone, decode it to at most 13 hours (up to 27 hours east) before the true time,
# never after, so the message stays inside the search window [decoded - 1 s, now].
LEAD_MS = 13 * 3600 * 1000


def new_job_token() -> str:
    """A random token for one ``df.write`` (chosen on the driver, shipped to every task)."""
    return secrets.token_hex(8)


def now_ms() -> int:
    """The wall clock in milliseconds (a job's creation time)."""
    return time.time_ns() // 1_000_000


def month_span(created_ms: int) -> int:
    """Bytes 10-13 of the id: milliseconds from the start of the (UTC) month of
    ``created_ms - LEAD_MS`` to that instant, as Java's ``createUniqID`` counts them."""
    t = created_ms - LEAD_MS
    moment = datetime.fromtimestamp(t / 1000.0, tz=timezone.utc)
    start = datetime(moment.year, moment.month, 1, tzinfo=timezone.utc)
    return t - int(start.timestamp()) * 1000


@dataclass(frozen=True)
class TaskIdentity:
    """Which rows a task writes: the same values on every attempt of the task."""

    kind: str                 # "stream" or "job"
    scope: str                # the query id, or the job token
    batch_id: Optional[int]   # micro-batch id (streams)
    partition: int
    created_ms: int = 0       # the job's or micro-batch's creation time (ids bytes 10-13)

    @property
    def digest(self) -> str:
        """16 hex digits naming the task (kind, scope, batch, partition)."""
        parts = [self.kind, self.scope, "" if self.batch_id is None else str(self.batch_id),
                 str(self.partition)]
        digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8)
        return digest.hexdigest().upper()

    @property
    def time_hex(self) -> str:
        return f"{month_span(self.created_ms):08X}"

    def describe(self) -> str:
        if self.kind == "stream":
            return f"micro-batch {self.batch_id}, partition {self.partition}"
        return f"partition {self.partition}"


_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)


def message_ids(identity: TaskIdentity, first_row: int, count: int) -> pa.Array:
    """The ids of rows ``first_row .. first_row + count - 1`` of the task."""
    numbers = np.arange(first_row, first_row + count, dtype=np.uint64)
    if count and int(numbers[-1]) > 0xFFFFFFFF:
        raise ValueError(f"row number {int(numbers[-1])} does not fit 8 hex digits")
    digest = identity.digest.encode("ascii")
    head = np.frombuffer(digest[:HEAD_HEX], dtype=np.uint8)
    tail = np.frombuffer(identity.time_hex.encode("ascii") + digest[HEAD_HEX:], dtype=np.uint8)
    data = np.empty((count, ID_HEX), dtype=np.uint8)
    data[:, :HEAD_HEX] = head
    nibbles = (numbers[:, None] >> _SHIFTS[None, :]) & 0xF
    data[:, HEAD_HEX:HEAD_HEX + 8] = _DIGITS[nibbles.astype(np.int64)]
    data[:, HEAD_HEX + 8:] = tail
    return fixed_width_array(data, ID_HEX, pa.large_string())


def message_id(identity: TaskIdentity, row: int) -> str:
    """One row's id (what consumers see as the message id)."""
    digest = identity.digest
    return f"{digest[:HEAD_HEX]}{row:08X}{identity.time_hex}{digest[HEAD_HEX:]}"
