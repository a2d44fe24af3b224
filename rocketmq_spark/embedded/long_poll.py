"""Long polling: PULL_MESSAGE requests parked until a matching message arrives or time is up.

As in the genuine PullRequestHoldService, a parked pull is re-executed (and may not park again)
when a message that passes its tag filter is stored past the requested offset, or when its
``suspendTimeoutMillis`` has passed. The genuine broker checks expiry every 5 s; here the timer
fires on time.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..client.protocol.frame import RemotingCommand

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ParkedPull:
    conn: object
    cmd: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    codes: Optional[frozenset]        # None: every message matches
    timer: Optional[asyncio.TimerHandle] = None


class LongPollService:
    """The parked pulls of one broker."""

    def __init__(self, execute: Callable[[object, RemotingCommand], Optional[RemotingCommand]]):
        self._execute = execute  # runs the pull again without suspending; returns the answer
        self._parked: Dict[Tuple[str, int], List[ParkedPull]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._parked.values())

    def park(self, conn, cmd: RemotingCommand, topic: str, queue_id: int, offset: int,
             codes: Optional[frozenset], timeout: float) -> None:
        parked = ParkedPull(conn, cmd, topic, queue_id, offset, codes)
        self._parked.setdefault((topic, queue_id), []).append(parked)
        parked.timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), self._wake,
                                                             parked)

    def notify_arrival_soon(self, topic: str, queue_id: int, max_offset: int,
                            tag_codes: Iterable[int]) -> None:
        """Schedule :meth:`notify_arrival` after the current request is answered.

        A genuine broker wakes long polls from its dispatch thread, after the send has been
        answered; doing the same here keeps the send's answer ahead of the woken pulls.
        """
        if self._parked.get((topic, queue_id)):
            asyncio.get_running_loop().call_soon(self.notify_arrival, topic, queue_id,
                                                 max_offset, list(tag_codes))

    def notify_arrival(self, topic: str, queue_id: int, max_offset: int,
                       tag_codes: Iterable[int]) -> None:
        """Messages were stored in (topic, queue_id); wake the parked pulls they satisfy."""
        waiting = self._parked.get((topic, queue_id))
        if not waiting:
            return
        codes = None
        for parked in list(waiting):
            if max_offset <= parked.offset:
                continue
            if parked.codes is not None:
                if codes is None:
                    codes = set(tag_codes)
                if parked.codes.isdisjoint(codes):
                    continue
            self._wake(parked)

    def _remove(self, parked: ParkedPull) -> bool:
        waiting = self._parked.get((parked.topic, parked.queue_id))
        if not waiting or parked not in waiting:
            return False
        waiting.remove(parked)
        if not waiting:
            del self._parked[(parked.topic, parked.queue_id)]
        if parked.timer is not None:
            parked.timer.cancel()
        return True

    def _wake(self, parked: ParkedPull) -> None:
        if not self._remove(parked) or getattr(parked.conn, "closed", False):
            return
        try:
            response = self._execute(parked.conn, parked.cmd)
        except Exception:  # pragma: no cover - the handler converts its own errors
            log.exception("re-executing a parked pull failed")
            return
        if response is not None:
            parked.conn.send(response)

    def connection_closed(self, conn) -> None:
        for waiting in list(self._parked.values()):
            for parked in [p for p in waiting if p.conn is conn]:
                self._remove(parked)

    def clear(self) -> None:
        for waiting in list(self._parked.values()):
            for parked in list(waiting):
                self._remove(parked)
