"""Message ids (UNIQ_KEY) that a replay reproduces.

A message's id is derived from where its row sits, never from the clock: for a stream, from
(query id, micro-batch id, partition id, row number within the task); for ``df.write``, from
(a job token chosen once on the driver, partition id, row number). A task that Spark runs
again, or a micro-batch replayed after a driver restart, resends every message with the id it
had the first time, so consumers can drop the duplicates by message id.

The id has the shape of Java's (32 upper-case hex digits): 24 from a BLAKE2b digest of the
task's identity, then the row number in 8. Unlike Java's ids it carries no IP, pid or time.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from ..client.protocol.send_encode import hex_row_ids

PREFIX_HEX = 24


def new_job_token() -> str:
    """A random token for one ``df.write`` (chosen on the driver, shipped to every task)."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class TaskIdentity:
    """Which rows a task writes: the same values on every attempt of the task."""

    kind: str                 # "stream" or "job"
    scope: str                # the query id, or the job token
    batch_id: Optional[int]   # micro-batch id (streams)
    partition: int

    @property
    def prefix(self) -> str:
        parts = [self.kind, self.scope, "" if self.batch_id is None else str(self.batch_id),
                 str(self.partition)]
        digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=PREFIX_HEX // 2)
        return digest.hexdigest().upper()

    def describe(self) -> str:
        if self.kind == "stream":
            return f"micro-batch {self.batch_id}, partition {self.partition}"
        return f"partition {self.partition}"


def message_ids(identity: TaskIdentity, first_row: int, count: int) -> pa.Array:
    """The ids of rows ``first_row .. first_row + count - 1`` of the task."""
    return hex_row_ids(identity.prefix, first_row, count)


def message_id(identity: TaskIdentity, row: int) -> str:
    """One row's id (what consumers see as the message id)."""
    return f"{identity.prefix}{row:08X}"
