"""The check-back of half messages nobody ended, as a 4.9.8 broker's
``TransactionalMessageServiceImpl.check`` and ``AbstractTransactionalMessageCheckListener``.

The check service runs every ``transaction_check_interval`` seconds. It reads the op queue
from its consume offset, then the half queue from its own (both kept under the group
``CID_RMQ_SYS_TRANS``): a half message with an op message is done; one stored during this
pass, or born less than ``transaction_timeout`` ago, stops the pass; one checked
``transaction_check_max`` times already is discarded (moved to ``TRANS_CHECK_MAX_TIME_TOPIC``,
never delivered); any other is stored again at the end of the half queue with
``TRANSACTION_CHECK_TIMES`` counted up, and CHECK_TRANSACTION_STATE (39, oneway) goes to a
producer connection registered (HEART_BEAT ``producerDataSet``) under its ``PGROUP``, naming
the new copy's offsets. With no producer registered the copy is still made and counted, so a
half message nobody answers for is discarded after about interval x max.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Dict, Generator, List, Optional

from ..client.protocol.codes import RequestCode
from ..client.protocol.message import (
    MessageExt, decode_message, encode_stored_message, offset_msg_id, pack_host,
)
from ..client.protocol.properties import UNIQ_KEY, java_hashmap_order
from .background import BackgroundService
from .context import BrokerContext
from .op_batches import op_offsets
from .records import ensure_system_topic
from .transactions import (
    CHECK_MAX_TIME_TOPIC, CHECK_TIMES, HALF_TOPIC, OP_TOPIC, PGROUP, REAL_QID, REAL_TOPIC,
    REMOVE_TAG, hashmap_text,
)

log = logging.getLogger(__name__)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # whose consume offsets say how far checks have read
SLICE = 256  # messages a check pass reads between two turns of the event loop
FILE_RESERVED_MS = 72 * 3600 * 1000  # half messages older than fileReservedTime are dropped

# What a check pass does with one half message
DISCARD, ASK, STOP = "discard", "ask", "stop"


def _run_to_end(steps: Generator[None, None, int]) -> int:
    """Drive a check pass's steps to the end; its result (0 if another finished it)."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value or 0


@dataclass
class _OpScan:
    """What the op queue says, from the check group's offset: the half offsets ended (each
    with its op message's offset) and the op messages about halves already passed."""

    ended: Dict[int, int] = field(default_factory=dict)
    passed_ops: List[int] = field(default_factory=list)


class TransactionCheckService(BackgroundService):
    """The periodic check-back of one broker's half messages."""

    def __init__(self, context: BrokerContext):
        self.context = context
        self._pick = itertools.count()  # round robin over a group's producer connections
        self._active: Optional[Generator[None, None, int]] = None  # the task's pass
        self.checks_sent = 0
        self.discarded = 0

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.context.options.transaction_check_interval)
            self._active = self._pass()
            try:
                while True:
                    next(self._active)
                    await asyncio.sleep(0)  # let the broker answer requests meanwhile
            except StopIteration:
                pass
            except Exception:  # pragma: no cover - keep checking
                log.exception("%s: transaction check failed", self.context.name)
            finally:
                self._active = None

    def _consume_offset(self, topic: str) -> int:
        store = self.context.store
        offset = store.query_offset(CHECK_GROUP, topic, 0)
        if offset < 0:
            queue = store.existing_queue(topic, 0)
            offset = queue.min_offset if queue is not None else 0
        return offset

    def check(self, now_ms: Optional[int] = None) -> int:
        """One pass of the check service, at once; returns how many check-backs it asked for.
        A pass the service's task has under way is finished first (two passes must not
        interleave: both would ask about the same messages)."""
        if self._active is not None:
            _run_to_end(self._active)
        return _run_to_end(self._pass(now_ms))

    def _pass(self, now_ms: Optional[int] = None) -> Generator[None, None, int]:
        """One pass, yielding every :data:`SLICE` messages so that the service's task can let
        the event loop serve requests (a pass over 100,000 messages takes seconds; a genuine
        broker runs it on a thread of its own)."""
        store = self.context.store
        half = store.existing_queue(HALF_TOPIC, 0)
        if half is None:
            return 0
        ensure_system_topic(store, HALF_TOPIC)
        start = store.now() if now_ms is None else now_ms
        half_offset = max(self._consume_offset(HALF_TOPIC), half.min_offset)
        op_offset = self._consume_offset(OP_TOPIC)
        ops = yield from self._scan_ops(op_offset, half_offset)
        unasked: Dict[str, int] = {}
        asked = 0
        i = half_offset
        while i < half.max_offset:
            if i % SLICE == 0:
                yield
            if ops.ended.pop(i, None) is not None:
                i += 1
                continue
            outcome = self._check_one(half.record(i), start, unasked)
            if outcome == STOP:
                break
            asked += outcome == ASK
            i += 1
        self._commit_progress(half_offset, i, op_offset, ops.passed_ops)
        for group, count in unasked.items():  # one line per group and pass, not per message
            log.warning("%s: no producer of group %s registered to ask about %d half messages "
                        "(stored again; each is discarded after %d checks)", self.context.name,
                        group, count, self.context.options.transaction_check_max)
        return asked

    def _scan_ops(self, op_offset: int, half_offset: int) -> Generator[None, None, _OpScan]:
        """Read the op queue from ``op_offset``: which half messages were ended."""
        scan = _OpScan()
        op = self.context.store.existing_queue(OP_TOPIC, 0)
        if op is None:
            return scan
        for at in range(max(op_offset, op.min_offset), op.max_offset):
            if at % SLICE == 0:
                yield
            op_msg, _ = decode_message(op.record(at), verify_crc=False, decompress=False)
            if op_msg.tags != REMOVE_TAG:
                log.error("%s: op message %d has tag %r, not %r", self.context.name, at,
                          op_msg.tags, REMOVE_TAG)
                continue
            named = [o for o in op_offsets(op_msg.stored_body) if o >= half_offset]
            if not named:  # only halves before the pass: the op message is done with
                scan.passed_ops.append(at)
            for ended in named:
                scan.ended[ended] = at
        return scan

    def _check_one(self, record: bytes, start: int, unasked: Dict[str, int]) -> str:
        """Discard, ask about, or stop the pass at one half message nobody ended; a message
        asked about whose group has no producer is counted in ``unasked``."""
        opts = self.context.options
        msg, _ = decode_message(record, verify_crc=False, decompress=False)
        props = dict(msg.properties)
        times = props.get(CHECK_TIMES)
        count = 1
        if times is not None:
            count = int(times) if times.lstrip("-").isdigit() else -1
            if count >= opts.transaction_check_max:
                self._discard(msg)
                return DISCARD
            count += 1
        if start - msg.born_timestamp > FILE_RESERVED_MS:
            self._discard(msg)
            return DISCARD
        if msg.store_timestamp >= start:
            return STOP  # stored during this pass (a copy made just now): next pass
        age = start - msg.born_timestamp
        if 0 <= age < opts.transaction_timeout * 1000:
            return STOP  # too young; everything after it is younger still
        props[CHECK_TIMES] = str(count)
        if not self._check_back(msg, props):  # a counted copy, whether or not one was asked
            group = props.get(PGROUP) or "(none)"
            unasked[group] = unasked.get(group, 0) + 1
        return ASK

    def _commit_progress(self, half_from: int, half_to: int, op_from: int,
                         passed_ops: List[int]) -> None:
        """Move the check group's offsets past what this pass settled: the half messages it
        went past, and the op messages about halves before the pass's start that follow on
        from the op offset without a gap."""
        store = self.context.store
        if half_to != half_from:
            store.commit_offset(CHECK_GROUP, HALF_TOPIC, 0, half_to)
        op_to = op_from
        for at in sorted(passed_ops):
            if at != op_to:
                break
            op_to += 1
        if op_to != op_from:
            store.commit_offset(CHECK_GROUP, OP_TOPIC, 0, op_to)

    def _discard(self, msg: MessageExt) -> None:
        """A half message checked too often: kept in TRANS_CHECK_MAX_TIME_TOPIC, never delivered."""
        log.warning("%s: half message %s (%s) checked %s times: discarded to %s",
                    self.context.name, msg.uniq_key or msg.offset_msg_id,
                    msg.properties.get(REAL_TOPIC), msg.properties.get(CHECK_TIMES),
                    CHECK_MAX_TIME_TOPIC)
        self.discarded += 1
        ensure_system_topic(self.context.store, CHECK_MAX_TIME_TOPIC)
        text = hashmap_text(msg.properties)
        self.context.records.append(CHECK_MAX_TIME_TOPIC, 0, lambda _, offset, phys, now:
                                    encode_stored_message(
            topic=CHECK_MAX_TIME_TOPIC, queue_id=0, queue_offset=offset, physical_offset=phys,
            body=msg.stored_body, properties=text, flag=msg.flag, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_timestamp=now,
            store_host=msg.store_host, reconsume_times=msg.reconsume_times))

    def _check_back(self, msg: MessageExt, props: Dict[str, str]) -> bool:
        """Store the half message again (counted) and ask its producer group about the copy;
        False when the group has no producer to ask."""
        text = hashmap_text(props)
        # renewHalfMessageInner: topic, queue, body, sysFlag, properties, born time/host and
        # store host carry over; the flag and reconsume times do not
        copy = self.context.records.append(HALF_TOPIC, 0, lambda _, o, p, now:
                                           encode_stored_message(
            topic=HALF_TOPIC, queue_id=0, queue_offset=o, physical_offset=p,
            body=msg.stored_body, properties=text, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_timestamp=now,
            store_host=msg.store_host))
        offset, phys = copy.queue_offset, copy.physical_offset
        conn = self.producer_connection(props.get(PGROUP))
        if conn is None:
            return False
        copy_id = offset_msg_id(pack_host(self.context.addr)[0], phys)
        uniq = props.get(UNIQ_KEY)
        fields = {"tranStateTableOffset": str(offset), "commitLogOffset": str(phys),
                  "offsetMsgId": copy_id}
        if uniq is not None:
            fields["msgId"] = uniq
            fields["transactionId"] = uniq
        fields = {k: fields[k] for k in java_hashmap_order(fields)}
        real_topic, real_qid = props.get(REAL_TOPIC) or "", props.get(REAL_QID, "0")
        # MessageDecoder.encode(msgExt): the half message as its real topic and queue, with the
        # copy's offsets and the counted properties
        body = encode_stored_message(
            topic=real_topic, queue_id=int(real_qid) if real_qid.lstrip("-").isdigit() else 0,
            queue_offset=offset, physical_offset=phys, body=msg.stored_body, properties=text,
            flag=msg.flag, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
            born_host=msg.born_host, store_timestamp=msg.store_timestamp,
            store_host=msg.store_host, reconsume_times=msg.reconsume_times,
            prepared_transaction_offset=msg.prepared_transaction_offset)
        conn.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, fields, body)
        self.checks_sent += 1
        return True

    def producer_connection(self, group: Optional[str]):
        """A live connection registered for producer ``group`` (round robin), or None."""
        if group is None:
            return None
        table = self.context.clients.producers.get(group)
        conns = [c for c in (table or {}) if not getattr(c, "closed", False)]
        if not conns:
            return None
        return conns[next(self._pick) % len(conns)]

    # ---------------------------------------------------------------- inspection

    def pending(self) -> List[int]:
        """Queue offsets of half messages with no op message yet (for tests and tools)."""
        store = self.context.store
        half = store.existing_queue(HALF_TOPIC, 0)
        if half is None:
            return []
        ended = set()
        op = store.existing_queue(OP_TOPIC, 0)
        for at in range(op.min_offset, op.max_offset) if op else ():
            body = decode_message(op.record(at), verify_crc=False, decompress=False)[0]
            ended.update(op_offsets(body.stored_body))
        start = max(self._consume_offset(HALF_TOPIC), half.min_offset)
        return [i for i in range(start, half.max_offset) if i not in ended]
