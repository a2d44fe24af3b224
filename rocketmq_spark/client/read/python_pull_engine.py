"""The pure-Python pull engine: the same algorithm as native/client/rmq_pull.c.

Used where the C loop is not built or switched off (``ROCKETMQ_SPARK_PURE_PYTHON=1``, or
``ReadSettings(native=False)``), and held against it by the tests.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..pull import PullResult, PullStatus
from .pull_engine import PullEngine, RangeReading


class PythonPullEngine(PullEngine):
    """Pulls one answer at a time, up to ``depth`` requests in flight.

    Requests ask for ``step`` messages at contiguous offsets; a capped answer teaches the step
    (so a broker serving 32 messages a pull is asked for 32), and an answer that stops short
    leaves a gap that is requested at once for exactly what is missing."""

    name = "python"

    def __init__(self, reader: RangeReading):
        super().__init__(reader)
        self.inflight: Dict[int, Tuple[int, str, tuple]] = {}  # offset -> (nums, address, pending)
        self.step = max(1, self.settings.max_msg_nums)
        self.full_streak = 0

    def _plan(self, offset: int) -> List[Tuple[int, int]]:
        """The ``(offset, nums)`` requests to send now so the pipeline stays full."""
        end = self.reader.end
        filtered = self.reader.filtered
        wanted = []
        covered, next_start = offset, None
        for start, (nums, _, _) in self.inflight.items():
            if start > offset and (next_start is None or start < next_start):
                next_start = start
            covered = max(covered, start + nums)
        if offset not in self.inflight:
            limit = min(next_start, end) if next_start is not None else end
            nums = self.settings.max_msg_nums if filtered else min(self.step, limit - offset)
            wanted.append((offset, nums))
            covered = max(covered, offset + nums)
        if not filtered and len(self.inflight) + len(wanted) <= self.window // 2:
            while len(self.inflight) + len(wanted) < self.window and covered < end:
                nums = min(self.step, end - covered)
                wanted.append((covered, nums))
                covered += nums
        return wanted

    def advance(self, offset: int) -> Tuple[int, Optional[PullResult]]:
        reader = self.reader
        for stale in [k for k in self.inflight if k < offset]:
            del self.inflight[stale]  # answers for skipped offsets are dropped on arrival
        if offset >= reader.end or self.full():
            return offset, None
        wanted = self._plan(offset)
        if wanted:
            address = reader.broker_address()
            sent = reader.brokers.pull_many_async(
                address, [reader.pull_request(o, n) for o, n in wanted])
            for (o, n), pending in zip(wanted, sent):
                self.inflight[o] = (n, address, pending)
        nums, address, pending = self.inflight.pop(offset)
        result = reader.brokers.pull_wait(address, pending, self.settings.pull_timeout)
        if result.status is PullStatus.FOUND:
            if self.window < self.depth:
                self.widen()
            if not reader.filtered:
                self._learn(result.next_begin_offset - offset, nums, result.next_begin_offset)
        return offset, result

    def _learn(self, got: int, nums: int, nxt: int) -> None:
        """Adjust the step to the broker's cap per pull, seen in an answer of ``got``."""
        if nxt >= self.reader.end:
            return
        if got < nums:
            self.step, self.full_streak = max(1, got), 0
        elif got == nums == self.step:
            self.full_streak += 1
            if self.full_streak >= 64:  # now and then, ask whether the cap has grown
                self.full_streak = 0
                self.step = min(self.settings.max_msg_nums, self.step * 2)

    def abandon(self) -> None:
        self.inflight.clear()
