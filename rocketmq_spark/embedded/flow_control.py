"""A broker's request queues and their fast failure, as a default-configured 4.9.8 broker has
them: what makes a busy broker answer SYSTEM_BUSY instead of only answering late.

A genuine broker's Netty threads read and decode requests as fast as they arrive and hand each
to the executor of its kind (BrokerController.registerProcessor): sends (SEND_MESSAGE,
SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, CONSUMER_SEND_MSG_BACK), pulls (PULL_MESSAGE), heartbeats
(HEART_BEAT), END_TRANSACTION, and the rest. Each executor's queue is bounded: a request that
finds it full is answered SYSTEM_BUSY ``[OVERLOAD]`` at once, a oneway one not at all
(NettyRemotingAbstract.processRequestCommand). Every 10 ms BrokerFastFailure answers SYSTEM_BUSY
``[TIMEOUT_CLEAN_QUEUE]`` to each request that has waited in the send, pull, heartbeat or
END_TRANSACTION queue for at least that queue's limit, oldest first, and drops it unprocessed
(RequestTask.returnResponse: a fresh JSON response without extFields, whatever the request's
serialization, and written even for a oneway request).

Here one event loop reads and processes, so the queue is made real: a read is processed at once
only while nothing waits (``arrive``), and for a bounded time (:data:`SLICE_SECONDS`); what is
left, and everything read meanwhile, is queued with its read time, across connections, and
worked through in arrival order in slices between reads, so a backlog builds up exactly when
requests come faster than they are processed. Each queued read keeps its raw bytes, so the
broker's C paths still answer them a run of frames at a time. Frames are indexed (kind, opaque,
oneway) only when queued, which is only under load.

Not modelled: the store's page cache (isOSPageCacheBusy: a commit-log append holding its lock
over osPageCacheBusyTimeOutMills, 1 s), behind ``[PCBUSY_CLEAN_QUEUE]``, ``[PC_SYNCHRONIZED]``
and ``[REJECTREQUEST]``: one event loop never appends while a request waits for the lock. A
woken long poll is answered at once rather than queued again (executeRequestWhenWakeup).
The other executors' queues (admin, client and consumer management) are not bounded here.
"""
from __future__ import annotations

import asyncio
import re
import struct
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from ..client.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType
from ..client.protocol.frame import MAX_FRAME_BYTES, FrameDecoder, RemotingCommand, encode_frame
from . import accelerator
from .options import ServerOptions

SEND, PULL, HEARTBEAT, TRANSACTION, OTHER = range(5)
EXECUTORS = ("send", "pull", "heartbeat", "transaction", "other")
# request code -> executor (4.9.8 BrokerController.registerProcessor)
EXECUTOR_OF_CODE = {10: SEND, 310: SEND, 320: SEND, 36: SEND,  # SEND_MESSAGE(_V2), BATCH, BACK
                    11: PULL, 34: HEARTBEAT, 37: TRANSACTION}

TIMEOUT_REMARK = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                  "period in queue: {}ms, size of queue: {}")
OVERLOAD_REMARK = "[OVERLOAD]system busy, start flow control for a while"

SCAN_SECONDS = 0.010   # BrokerFastFailure's period
SLICE_SECONDS = 0.002  # processing between two looks at the sockets
MIN_FRAME = 20         # the smallest request frame: length, header word, {"code":N}

_LENGTH = struct.Struct(">I").unpack_from
_BINARY = struct.Struct(">hBhii").unpack_from  # code, language, version, opaque, flag
_JSON_INT = re.compile(rb'"(code|flag|opaque)":(-?\d+)')

# one queued request: (start, end) in its read's bytes, executor, opaque, oneway
Frame = Tuple[int, int, int, int, bool]


class FrameError(ValueError):
    """A length word no request can have (the connection is closed, as Netty's decoder does)."""


def index_frames(data, pos: int = 0) -> Tuple[List[Frame], int]:
    """The complete frames of ``data[pos:]`` and where they end (an incomplete frame, or the
    end). Reads only what the queues need: a header that does not show it counts as OTHER
    (its processing finds the fault)."""
    frames: List[Frame] = []
    end = len(data)
    while end - pos >= 4:
        length = _LENGTH(data, pos)[0]
        if length < 4 or length + 4 > MAX_FRAME_BYTES:
            raise FrameError(f"frame length {length} is outside [4, {MAX_FRAME_BYTES - 4}]")
        stop = pos + 4 + length
        if stop > end:
            break
        code, opaque, flag = _code_opaque_flag(data, pos + 4, length)
        kind = OTHER if flag & FLAG_RESPONSE else EXECUTOR_OF_CODE.get(code, OTHER)
        frames.append((pos, stop, kind, opaque, bool(flag & FLAG_ONEWAY)))
        pos = stop
    return frames, pos


def _more_frames_than_py(data, limit: int) -> bool:
    """Whether ``data`` holds more than ``limit`` whole frames, by their lengths alone (the
    reference for the C ``more_frames_than``)."""
    pos, end, n = 0, len(data), 0
    while end - pos >= 4:
        pos += 4 + _LENGTH(data, pos)[0]
        if pos > end:
            break
        n += 1
        if n > limit:
            return True
    return False


_more_frames_than = accelerator.native_function("more_frames_than") or _more_frames_than_py


def _code_opaque_flag(data, at: int, length: int) -> Tuple[int, int, int]:
    word = _LENGTH(data, at)[0]
    header = min(word & 0xFFFFFF, length - 4)
    if word >> 24 == SerializeType.ROCKETMQ:
        if header < 13:
            return -1, 0, 0
        code, _, _, opaque, flag = _BINARY(data, at + 4)
        return code, opaque, flag
    # JSON, keys in alphabetical order (fastjson, jsoncpp, ours): the first "code" and the last
    # "flag" and "opaque" are the header's own, whatever extFields hold
    found: Dict[bytes, int] = {}
    for match in _JSON_INT.finditer(bytes(data[at + 4:at + 4 + header])):
        key = match.group(1)
        if key != b"code" or key not in found:
            found[key] = int(match.group(2))
    return found.get(b"code", -1), found.get(b"opaque", 0), found.get(b"flag", 0)


def busy_answer(opaque: int, remark: str, version: int) -> bytes:
    """SYSTEM_BUSY as RemotingCommand.createResponseCommand builds it: JSON, no extFields."""
    return encode_frame(RemotingCommand(ResponseCode.SYSTEM_BUSY, None, flag=FLAG_RESPONSE,
                                        opaque=opaque, language="JAVA", version=version,
                                        remark=remark, serialize_type=SerializeType.JSON))


class QueuedRead:
    """The complete frames of one read of one connection, waiting since ``arrival``."""

    __slots__ = ("conn", "data", "arrival", "frames", "next", "counts")

    def __init__(self, conn, data, arrival: float, frames: List[Optional[Frame]],
                 counts: List[int]):
        self.conn = conn
        self.data = data
        self.arrival = arrival
        self.frames = frames  # a refused frame becomes None
        self.next = 0         # the first frame not yet processed
        self.counts = counts  # frames waiting, per executor


class RequestQueues:
    """One broker's executor queues: what waits, for how long, and the busy answers.

    The server hands every read of complete-or-partial frames to :meth:`arrive`, and gets
    called back through ``conn.server.serve(conn, data, start, end, deadline)``, which
    processes the frames of ``data[start:end]`` in order until the deadline and returns where
    it stopped, and ``conn.hold(data)``, which keeps an incomplete frame for the next read."""

    def __init__(self, options: ServerOptions):
        o = options
        self.version = o.version
        self.capacity = (o.send_queue_capacity, o.pull_queue_capacity,
                         o.heartbeat_queue_capacity, o.transaction_queue_capacity, 0)
        waits = (o.wait_ms_in_send_queue, o.wait_ms_in_pull_queue, o.wait_ms_in_heartbeat_queue,
                 o.wait_ms_in_transaction_queue)
        self.waits = tuple(enumerate(waits)) if o.broker_fast_failure else ()
        self.queued = [0] * len(EXECUTORS)
        self.reads: Deque[QueuedRead] = deque()
        self.stats: Dict[str, int] = {"busy": 0}
        for name in EXECUTORS[:OTHER]:
            self.stats[f"{name}_timeout"] = self.stats[f"{name}_overload"] = 0
            self.stats[f"{name}_queue_peak"] = 0
        self._scheduled = False
        self._last_scan = 0.0
        self._bounded = min(self.capacity[:OTHER])  # a read with more frames may overflow
        self._inline_bytes = MIN_FRAME * self._bounded  # a shorter one cannot

    # ---------------------------------------------------------------- arrivals

    def arrive(self, conn, data) -> None:
        """A read of ``conn`` (starting at a frame): processed now when nothing waits and it
        cannot overflow a queue, else queued behind what waits."""
        now = time.monotonic()
        idle = not self.reads
        if idle and (len(data) < self._inline_bytes
                     or not _more_frames_than(data, self._bounded)):
            pos = conn.server.serve(conn, data, 0, len(data), now + SLICE_SECONDS)
            if conn.closed or pos == len(data):
                return
            idle = False  # the slice is spent: the rest waits for the next one
            data = memoryview(data)[pos:]
        self._queue(conn, data, now)
        if idle and self.reads:
            self.work()  # nothing else waits: start on it now
        elif self.reads and not self._scheduled:
            self._schedule()

    def _queue(self, conn, data, now: float) -> None:
        try:
            frames, end = index_frames(data)
        except FrameError as exc:
            conn.refuse_stream(str(exc))
            return
        if end < len(data):
            conn.hold(data[end:])
        if not frames:
            return
        counts = [0] * len(EXECUTORS)
        kept: List[Optional[Frame]] = list(frames)  # a refused frame is None: runs of the
        overload: List[bytes] = []                   # others are contiguous bytes
        queued, capacity, stats = self.queued, self.capacity, self.stats
        for i, frame in enumerate(frames):
            kind = frame[2]
            if kind != OTHER and queued[kind] >= capacity[kind]:
                stats[f"{EXECUTORS[kind]}_overload"] += 1
                if not frame[4]:
                    stats["busy"] += 1
                    overload.append(busy_answer(frame[3], OVERLOAD_REMARK, self.version))
                kept[i] = None
                continue
            queued[kind] += 1
            counts[kind] += 1
        for kind, n in enumerate(counts[:OTHER]):
            if n and queued[kind] > stats[f"{EXECUTORS[kind]}_queue_peak"]:
                stats[f"{EXECUTORS[kind]}_queue_peak"] = queued[kind]
        if overload:
            conn.write(b"".join(overload))
        if any(counts):
            self.reads.append(QueuedRead(conn, data, now, kept, counts))

    # ---------------------------------------------------------------- the executor

    def _schedule(self) -> None:
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self.work)

    def work(self) -> None:
        """One slice: the fast-failure scan when due, then the oldest reads, in order."""
        self._scheduled = False
        now = time.monotonic()
        if self.waits and now - self._last_scan >= SCAN_SECONDS:
            self._last_scan = now
            self._expire(now)
        deadline = now + SLICE_SECONDS
        reads = self.reads
        while reads:
            read = reads[0]
            if self._run(read, deadline):
                reads.popleft()
            if time.monotonic() >= deadline:
                break
        if reads:
            self._schedule()

    def _run(self, read: QueuedRead, deadline: float) -> bool:
        """Process ``read``'s frames from where it stopped; True when none is left."""
        frames, i, n = read.frames, read.next, len(read.frames)
        conn = read.conn
        if conn.closed:  # nobody to answer: what it held no longer waits
            self._forget(read, i)
            return True
        while i < n:
            if frames[i] is None:
                i += 1
                continue
            j = i + 1
            while j < n and frames[j] is not None:
                j += 1
            pos = conn.server.serve(conn, read.data, frames[i][0], frames[j - 1][1], deadline)
            while i < j and frames[i][1] <= pos:
                kind = frames[i][2]
                self.queued[kind] -= 1
                read.counts[kind] -= 1
                i += 1
            if i < j:  # out of time, or the connection closed
                read.next = i
                if conn.closed:
                    self._forget(read, i)
                    return True
                return False
        read.next = n
        return True

    def _forget(self, read: QueuedRead, start: int) -> None:
        for frame in read.frames[start:]:
            if frame is not None:
                self.queued[frame[2]] -= 1
        read.next = len(read.frames)

    # ---------------------------------------------------------------- fast failure

    def _expire(self, now: float) -> None:
        """BrokerFastFailure.cleanExpiredRequestInQueue for each queue with a limit: answer
        and drop, oldest first, every request that has waited at least the limit."""
        answers: Dict[object, List[bytes]] = {}
        for kind, wait in self.waits:
            if not self.queued[kind]:
                continue
            name = f"{EXECUTORS[kind]}_timeout"
            for read in self.reads:
                behind = int((now - read.arrival) * 1000)
                if behind < wait:
                    break
                if not read.counts[kind] or read.conn.closed:
                    continue  # (what a closed connection sent is dropped by the executor)
                frames = read.frames
                for i in range(read.next, len(frames)):
                    frame = frames[i]
                    if frame is None or frame[2] != kind:
                        continue
                    frames[i] = None
                    read.counts[kind] -= 1
                    self.queued[kind] -= 1
                    self.stats[name] += 1
                    self.stats["busy"] += 1
                    remark = TIMEOUT_REMARK.format(behind, self.queued[kind])
                    answers.setdefault(read.conn, []).append(
                        busy_answer(frame[3], remark, self.version))
        for conn, frames in answers.items():
            conn.write(b"".join(frames))


class LocalConnection:
    """One request of an in-process client (the embedded 5.x proxy, which a genuine proxy is
    a remoting client of its broker for): it waits in the broker's queues as a remote
    client's does, and its answer, busy or not, resolves :attr:`answer`."""

    trusted = True  # no ACL check: the proxy checked its client's (a genuine proxy signs
    #                 what it sends its brokers with its own account)

    def __init__(self, server, peer: str):
        self.server = server
        self.peer = peer            # the born host of what it sends
        self.closed = False
        self.transport = self       # where the server writes answers it batched
        self._corked = None
        self.answer: asyncio.Future = asyncio.get_running_loop().create_future()

    def request(self, cmd: RemotingCommand) -> asyncio.Future:
        self.server.flow_control.arrive(self, encode_frame(cmd))
        return self.answer

    def send(self, cmd: RemotingCommand) -> None:
        if not self.answer.done():
            self.answer.set_result(cmd)

    def write(self, data: bytes) -> None:
        for cmd in FrameDecoder().feed(data):
            self.send(cmd)

    def refuse_stream(self, reason: str) -> None:
        if not self.answer.done():
            self.answer.set_exception(ConnectionError(reason))

    def hold(self, data) -> None:  # pragma: no cover - a request is one whole frame
        raise AssertionError("an in-process request is always a whole frame")

    def close(self) -> None:
        self.closed = True
