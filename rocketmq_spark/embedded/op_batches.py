"""Op messages as a 5.1+ broker writes them: buffered, comma-joined, in batches.

From 5.1.0 on, ``TransactionalMessageServiceImpl.deletePrepareMessage`` no longer writes one op
message per END_TRANSACTION. It queues ``"<half queue offset>,"`` in memory, and
``TransactionalOpBatchService`` writes the queued entries as one message (tag ``d``) once they
exceed ``transactionOpMsgMaxSize`` bytes (4,096), or ``transactionOpBatchInterval`` (3 s) after
the last write. ``getOpMessage`` takes entries until the body reaches the size, so a body may
pass it by one entry; the rest waits for the next round. The body is therefore
``"2,3,1,0,4,"``: every offset followed by a comma.

Simplified here: one queue (the half topic has one), entries are never refused (the genuine
in-memory queue holds 20,000 and writes the overflow at once), and what is still queued when
the broker stops is written then (a killed genuine broker loses it; its check-back then asks
about those halves again).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, List, Optional

from .background import BackgroundService
from .context import BrokerContext

log = logging.getLogger(__name__)
SEPARATOR = ","  # TransactionalMessageUtil.OFFSET_SEPARATOR


def op_offsets(body: bytes) -> List[int]:
    """The half offsets an op message names, read as the genuine check does
    (``fillOpRemoveMap``: split on commas, ``Long.parseLong`` each part, -1 for what does not
    parse). Covers both forms: ``b"17"`` (4.x) and ``b"2,3,1,"`` (5.1+)."""
    offsets = []
    for part in body.decode("utf-8", "replace").split(SEPARATOR):
        if part == "":
            continue  # Java's split drops the trailing empty part
        try:
            offsets.append(int(part))
        except ValueError:
            offsets.append(-1)
    return offsets


class OpBatches(BackgroundService):
    """One broker's queued op entries and the service that writes them
    (``TransactionalOpBatchService``); ``write(body)`` stores one op message."""

    def __init__(self, context: BrokerContext, write: Callable[[bytes], None]):
        self.context = context
        self.write = write
        self._entries: List[str] = []
        self._size = 0
        self._last_write = time.monotonic()
        self._wake: Optional[asyncio.Event] = None

    @property
    def pending(self) -> int:
        """Entries queued and not yet written."""
        return len(self._entries)

    def add(self, half_offset: int) -> None:
        """Queue the op entry of half message ``half_offset``; past the size, wake the writer."""
        entry = f"{half_offset}{SEPARATOR}"
        self._entries.append(entry)
        self._size += len(entry)
        if self._size > self.context.options.transaction_op_msg_max_size and self._wake:
            self._wake.set()

    def write_due(self, force: bool = False) -> int:
        """One round of ``batchSendOpMessage``: write one op message when the entries exceed
        the size or the interval has passed since the last write (or ``force``). Returns how
        many entries it wrote."""
        opts = self.context.options
        if not self._entries:
            return 0
        due = (force or self._size >= opts.transaction_op_msg_max_size
               or time.monotonic() - self._last_write >= opts.transaction_op_batch_interval)
        if not due:
            return 0
        taken, length = 0, 0
        while taken < len(self._entries) and length < opts.transaction_op_msg_max_size:
            length += len(self._entries[taken])
            taken += 1
        body = "".join(self._entries[:taken]).encode()
        del self._entries[:taken]
        self._size -= length
        self._last_write = time.monotonic()
        self.write(body)
        return taken

    def flush(self) -> None:
        """Write everything queued (the broker is stopping)."""
        while self.write_due(force=True):
            pass

    def stop(self) -> None:
        super().stop()
        self.flush()

    async def _run(self) -> None:
        """Wake every interval, or when the entries pass the size, and write what is due:
        an entry waits at most the interval."""
        self._wake = asyncio.Event()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       self.context.options.transaction_op_batch_interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                while self.write_due():
                    pass
            except Exception:  # pragma: no cover - keep writing the next rounds
                log.exception("%s: writing an op message failed", self.context.name)
