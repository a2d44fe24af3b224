"""Transactional (half) messages, as a 4.9.8 broker stores, ends and checks them.

What the genuine broker does (``SendMessageProcessor``, ``TransactionalMessageBridge``,
``EndTransactionProcessor``, ``TransactionalMessageServiceImpl.check``,
``AbstractTransactionalMessageCheckListener``), and so what this module does:

* A single send whose ``TRAN_MSG`` property is ``true`` (Java's ``Boolean.parseBoolean``; the
  sysFlag does not decide it) is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with two more
  properties, ``REAL_TOPIC`` and ``REAL_QID``, its properties serialized again from the
  broker's HashMap (``WAIT`` included), and the transaction bits of its sysFlag cleared. The
  answer gives the half queue's offset and the half record's offset message id. A batch whose
  sysFlag has transaction bits is refused (MESSAGE_ILLEGAL, ``CommitLog.putMessages``).
* END_TRANSACTION (37, oneway from producers) finds the half message by ``commitLogOffset``
  and checks the producer group, ``tranStateTableOffset`` and ``commitLogOffset`` against it.
  COMMIT stores the real message (``REAL_TOPIC``/``REAL_QID``, sysFlag COMMIT, the half's
  properties text unchanged, so ``REAL_TOPIC``, ``REAL_QID`` and ``TRAN_MSG`` stay,
  ``preparedTransactionOffset`` = the half's commit-log offset), then an op message; ROLLBACK
  stores only the op message. The op message goes to ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0
  with tag ``d`` and the half queue offset as its body. Nothing remembers what was already
  ended: a second COMMIT stores the real message again, as on the genuine broker.
  ``commitOrRollback`` 0 (UNKNOWN) and values other than 0/8/12 change nothing.
* The check service runs every ``transaction_check_interval`` seconds. It reads the op queue
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
import struct
import zlib
from typing import TYPE_CHECKING, Callable, Dict, Generator, List, Optional, Tuple

from ..client.protocol.codes import PERM_READ, PERM_WRITE, RequestCode
from ..client.protocol.codes import ResponseCode as RC
from ..client.protocol.frame import RemotingCommand, decode_payload, encode_frame
from .background import BackgroundService
from ..client.protocol.message import (
    MAGIC_V1, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK, MessageExt,
    decode_message, encode_stored_message, offset_msg_id, pack_host, record_layout,
)
from ..client.protocol.properties import (
    CLUSTER, TAGS, UNIQ_KEY, WAIT, decode_properties, hashmap_properties, java_hashmap_order,
    java_string_hash, property_value,
)
from .headers import java_bool, opt_str, req_int, req_long, req_str
from .store import TopicConfig

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker
    from .server import ServerConnection

log = logging.getLogger(__name__)

END_TRANSACTION = 37
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # whose consume offsets say how far checks have read
REMOVE_TAG = "d"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
REMOVE_TAG_CODE = java_string_hash(REMOVE_TAG)
SLICE = 256  # messages a check pass reads between two turns of the event loop
FILE_RESERVED_MS = 72 * 3600 * 1000  # half messages older than fileReservedTime are dropped


def is_half(properties: Optional[str]) -> bool:
    """Whether a single send is a prepared (half) message: ``TRAN_MSG`` parses as true."""
    if not properties or TRAN_MSG not in properties:
        return False
    return java_bool(property_value(properties, TRAN_MSG))


def with_transaction_type(sys_flag: int, kind: int) -> int:
    """``MessageSysFlag.resetTransactionValue``."""
    return (sys_flag & ~SYSFLAG_TRANSACTION_MASK) | kind


def hashmap_text(props: Dict[str, str]) -> str:
    """``MessageDecoder.messageProperties2String`` of a broker-side HashMap."""
    return hashmap_properties(props)


OP_PROPERTIES = hashmap_text({TAGS: REMOVE_TAG, WAIT: "true"})  # every op message's


def half_properties(properties: Optional[str], topic: str, queue_id: int, cluster: str) -> str:
    """The properties text a half message is stored with (``parseHalfMessageInner``)."""
    props = decode_properties(properties or "")
    props[CLUSTER] = cluster
    props[REAL_TOPIC] = topic
    props[REAL_QID] = str(queue_id)
    return hashmap_text(props)


def native_tx_answers(broker) -> Optional[Callable[[bytes, str], Tuple[List[bytes], int, int,
                                                                    int]]]:
    """The C answer to plain half sends and END_TRANSACTION COMMIT/ROLLBACK
    (``native/rmq_serve_tx.c``; it stores and answers byte for byte what :func:`handle_send`
    and :meth:`TransactionService.end_transaction` do, and a test holds them together) for
    ``broker``, or ``None`` when the accelerator lacks it or ``ROCKETMQ_SPARK_PURE_PYTHON`` is
    set. The function takes a received chunk and the peer's address and returns the answers
    to the frames at its start that it took (oneway ones have none), the bytes they used and
    how many were sends and END_TRANSACTIONs; everything from the first frame it does not take
    goes the Python way. A frame whose Python call raised (the store's append, say) is answered
    here as the server's dispatch answers a handler's exception (SYSTEM_ERROR); the frames
    before it stand and the run ends with it."""
    from .pull import native_server_function
    serve = native_server_function(broker, "serve_tx")
    if serve is None or not isinstance(getattr(broker, "transactions", None),
                                       TransactionService):
        return None

    def answer(data, peer: str):
        o = broker.options
        result = serve(data, broker.store, broker.long_poll, zlib.crc32,
                       pack_host(broker.addr)[0], pack_host(peer)[0], o.cluster_name,
                       "true" if o.trace_on else "false", o.region, o.max_message_size,
                       o.version)
        if len(result) == 4:  # an accelerator built before serve_tx reported failures
            return result
        got, used, sends, ends, failed = result
        if failed is not None:  # a Python call raised in the middle of the run
            exc, size = failed
            error = _system_error(broker, bytes(data[used + 4:used + size]), exc)
            if error:
                got.append(error)
            used += size
        return got, used, sends, ends
    return answer


def _system_error(broker, payload: bytes, exc: Exception) -> bytes:
    """What the server's dispatch answers (and logs) when a handler raises ``exc`` on the
    request ``payload`` (a frame without its length prefix): SYSTEM_ERROR, the exception's
    type and text as remark; nothing for a oneway request."""
    try:
        cmd = decode_payload(payload)
    except Exception:  # pragma: no cover - the C path took only frames that decode
        raise exc from None
    log.error("%s: %s failed", broker.server.name, cmd.describe(),
              exc_info=(type(exc), exc, exc.__traceback__))
    if cmd.is_oneway:
        return b""
    return encode_frame(cmd.make_response(RC.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}",
                                          version=broker.server.version))


def _run_to_end(steps: Generator[None, None, int]) -> int:
    """Drive a check pass's steps to the end; its result (0 if another finished it)."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value or 0


def _properties_text(record: bytes) -> str:
    layout = record_layout(record, 0, len(record))
    return bytes(record[layout[9]:layout[9] + layout[10]]).decode("utf-8")


_I, _Q, _IQ = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">iq")
_HEAD = struct.Struct(">iiiiiqqiq")  # totalSize .. bornTimestamp


def committed_record(half: bytes, layout, topic: str, queue_id: int, queue_offset: int,
                     physical_offset: int, store_timestamp: int, properties: str,
                     prepared_offset: int) -> Optional[bytes]:
    """The real message END_TRANSACTION COMMIT stores for the half record ``half``: what
    ``encode_stored_message`` builds from the decoded half message (body, flag, born time and
    host, store host, reconsume times carried over; sysFlag COMMIT), assembled from the half's
    own bytes. None when the result would not be a plain V1 record (the caller encodes it)."""
    (_total, _magic, sys_flag, born_len, store_len, body_pos, body_len, *_rest) = layout
    topic_b, props_b = topic.encode("utf-8"), properties.encode("utf-8")
    if len(topic_b) > 127 or len(props_b) > 32767:
        return None
    crc, = _I.unpack_from(half, 8)
    flag, = _I.unpack_from(half, 16)
    born_ts, = _Q.unpack_from(half, 40)
    store_at = 56 + born_len
    reconsume, = _I.unpack_from(half, store_at + store_len)
    total = store_at + store_len + 12 + 4 + body_len + 1 + len(topic_b) + 2 + len(props_b)
    return b"".join((
        _HEAD.pack(total, MAGIC_V1, crc, queue_id, flag, queue_offset, physical_offset,
                   with_transaction_type(sys_flag, TRANSACTION_COMMIT_TYPE), born_ts),
        half[48:48 + born_len], _Q.pack(store_timestamp), half[store_at:store_at + store_len],
        _IQ.pack(reconsume, prepared_offset), half[body_pos - 4:body_pos + body_len],
        bytes((len(topic_b),)), topic_b, len(props_b).to_bytes(2, "big"), props_b))


def op_record(half_offset: int, queue_offset: int, physical_offset: int, now: int,
              host: bytes, v6: bool) -> bytes:
    """The op message for half message ``half_offset`` (what ``encode_stored_message`` builds
    with the broker's address as born and store host)."""
    body = str(half_offset).encode()
    props = OP_PROPERTIES.encode()
    sys_flag = (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6) if v6 else 0
    total = 56 + 2 * len(host) + 12 + 4 + len(body) + 1 + len(OP_TOPIC) + 2 + len(props)
    return b"".join((
        _HEAD.pack(total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, 0, 0, queue_offset,
                   physical_offset, sys_flag, now),
        host, _Q.pack(now), host, _IQ.pack(0, 0), _I.pack(len(body)), body,
        bytes((len(OP_TOPIC),)), OP_TOPIC.encode(), len(props).to_bytes(2, "big"), props))


class TransactionService(BackgroundService):
    """Half/op topics, END_TRANSACTION and the periodic check-back of one broker."""

    def __init__(self, broker: "Broker"):
        self.broker = broker
        self._pick = itertools.count()  # round robin over a group's producer connections
        self._active: Optional[Generator[None, None, int]] = None  # the task's pass
        self.checks_sent = 0
        self.discarded = 0

    # ---------------------------------------------------------------- topics

    def ensure_topic(self, topic: str) -> None:
        """System topics get a config (1 queue, RW) when first used, so they route and pull."""
        store = self.broker.store
        if topic not in store.topics:
            store.put_topic(TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE))

    def _append(self, topic: str, queue_id: int, build, code: Optional[int] = None
                ) -> Tuple[int, int, bytes]:
        """Store one record built by ``build(queue_offset, physical_offset, now)``, whose tag
        code is ``code`` (None: read from the record); returns (queue offset, physical
        offset, record)."""
        from .send import tag_code

        store = self.broker.store
        queue = store.queue(topic, queue_id)
        now = store.now()
        offset, phys = queue.max_offset, store.commit_log.size
        record = build(offset, phys, now)
        if code is None:
            code = tag_code(_properties_text(record))
        store.append(queue, [record], [code], now)
        self.broker.long_poll.notify_arrival_soon(topic, queue_id, queue.max_offset, [code])
        return offset, phys, record

    # ---------------------------------------------------------------- END_TRANSACTION

    def end_transaction(self, conn: "ServerConnection", cmd: RemotingCommand
                        ) -> Optional[RemotingCommand]:
        """END_TRANSACTION: commit or roll back one half message (EndTransactionProcessor)."""
        f = cmd.fields
        group = req_str(f, "producerGroup")
        table_offset = req_long(f, "tranStateTableOffset")
        commit_log_offset = req_long(f, "commitLogOffset")
        kind = req_int(f, "commitOrRollback")
        from_check = java_bool(opt_str(f, "fromTransactionCheck"))
        req_str(f, "msgId")
        version = self.broker.options.version
        if kind not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE,
                        TRANSACTION_ROLLBACK_TYPE):
            return cmd.make_response(RC.SYSTEM_ERROR, None, "org.apache.rocketmq.remoting."
                                     "exception.RemotingCommandException: commitOrRollback "
                                     "field wrong", version=version)
        if kind == TRANSACTION_NOT_TYPE:
            log.info("%s: producer %s answered %s for half message %d (%s)", self.broker.name,
                     conn.peer, "UNKNOWN", table_offset,
                     "check" if from_check else "send")
            return None  # the genuine processor returns no response at all
        found = self._half_at(commit_log_offset)
        if found is None:
            return cmd.make_response(RC.SYSTEM_ERROR, None,
                                     "Find prepared transaction message failed", version=version)
        queue_offset, record = found
        layout = record_layout(record, 0, len(record))
        props_text = bytes(record[layout[9]:layout[9] + layout[10]]).decode("utf-8")
        if property_value(props_text, PGROUP) != group:
            remark = "The producer group wrong"
        elif queue_offset != table_offset:
            remark = "The transaction state table offset wrong"
        else:
            remark = None
        if remark is not None:
            return cmd.make_response(RC.SYSTEM_ERROR, None, remark, version=version)
        if kind == TRANSACTION_COMMIT_TYPE:
            if not self._store_real(record, layout, props_text, commit_log_offset):
                return cmd.make_response(RC.SYSTEM_ERROR, None, "UNKNOWN_ERROR",
                                         version=version)
        self._put_op(queue_offset)
        return cmd.make_response(RC.SUCCESS, None, None, version=version)

    def _half_at(self, commit_log_offset: int) -> Optional[Tuple[int, bytes]]:
        """(queue offset, record) of the half message stored at ``commit_log_offset``.

        Half records are appended in commit-log order, so a binary search over the half
        queue finds it (a record's own physical offset is at bytes 28..36)."""
        queue = self.broker.store.existing_queue(HALF_TOPIC, 0)
        if queue is None:
            return None
        lo, hi = queue.min_offset, queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            phys = queue.record_long(mid, 28)
            if phys == commit_log_offset:
                return mid, queue.record(mid)
            if phys < commit_log_offset:
                lo = mid + 1
            else:
                hi = mid
        return None

    def _store_real(self, record: bytes, layout, props_text: str,
                    commit_log_offset: int) -> bool:
        """The committed message in its real queue (``endMessageTransaction``)."""
        from .send import tag_code

        topic = property_value(props_text, REAL_TOPIC)
        qid = property_value(props_text, REAL_QID) or ""
        if not topic or not qid.lstrip("-").isdigit():
            log.error("%s: half message at %d has no REAL_TOPIC/REAL_QID; not committed",
                      self.broker.name, commit_log_offset)
            return False
        text = hashmap_text(decode_properties(props_text))
        code = tag_code(text)

        def build(offset, phys, now):
            return committed_record(record, layout, topic, int(qid), offset, phys, now, text,
                                    commit_log_offset) or self._encode_real(
                record, topic, int(qid), offset, phys, now, text, commit_log_offset)
        self._append(topic, int(qid), build, code)
        return True

    @staticmethod
    def _encode_real(record: bytes, topic: str, qid: int, offset: int, phys: int, now: int,
                     text: str, commit_log_offset: int) -> bytes:
        """The committed record encoded from the decoded half message (long topics)."""
        msg, _ = decode_message(record, verify_crc=False, decompress=False)
        return encode_stored_message(
            topic=topic, queue_id=qid, queue_offset=offset, physical_offset=phys,
            body=msg.stored_body, properties=text, flag=msg.flag,
            sys_flag=with_transaction_type(msg.sys_flag, TRANSACTION_COMMIT_TYPE),
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_timestamp=now,
            store_host=msg.store_host, reconsume_times=msg.reconsume_times,
            prepared_transaction_offset=commit_log_offset)

    def _put_op(self, half_offset: int) -> None:
        """The op message that marks half message ``half_offset`` as ended."""
        self.ensure_topic(OP_TOPIC)
        host, v6 = pack_host(self.broker.addr)
        self._append(OP_TOPIC, 0, lambda offset, phys, now: op_record(
            half_offset, offset, phys, now, host, v6), REMOVE_TAG_CODE)

    # ---------------------------------------------------------------- check service

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.broker.options.transaction_check_interval)
            self._active = self._pass()
            try:
                while True:
                    next(self._active)
                    await asyncio.sleep(0)  # let the broker answer requests meanwhile
            except StopIteration:
                pass
            except Exception:  # pragma: no cover - keep checking
                log.exception("%s: transaction check failed", self.broker.name)
            finally:
                self._active = None

    def _consume_offset(self, topic: str) -> int:
        store = self.broker.store
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
        store, opts = self.broker.store, self.broker.options
        unasked: Dict[str, int] = {}
        half = store.existing_queue(HALF_TOPIC, 0)
        if half is None:
            return 0
        self.ensure_topic(HALF_TOPIC)
        start = store.now() if now_ms is None else now_ms
        timeout_ms = opts.transaction_timeout * 1000
        half_offset = max(self._consume_offset(HALF_TOPIC), half.min_offset)
        op_offset = self._consume_offset(OP_TOPIC)
        removed: Dict[int, int] = {}
        done_ops: List[int] = []
        op = store.existing_queue(OP_TOPIC, 0)
        for at in range(max(op_offset, op.min_offset) if op else 0, op.max_offset if op else 0):
            if at % SLICE == 0:
                yield
            op_msg, _ = decode_message(op.record(at), verify_crc=False, decompress=False)
            if op_msg.tags != REMOVE_TAG:
                log.error("%s: op message %d has tag %r, not %r", self.broker.name, at,
                          op_msg.tags, REMOVE_TAG)
                continue
            try:
                ended = int(op_msg.stored_body.decode())
            except ValueError:
                ended = -1
            if ended < half_offset:
                done_ops.append(at)
            else:
                removed[ended] = at
        asked = 0
        i = new_offset = half_offset
        while i < half.max_offset:
            if i % SLICE == 0:
                yield
            if removed.pop(i, None) is not None:
                i += 1
                new_offset = i
                continue
            record = half.record(i)
            msg, _ = decode_message(record, verify_crc=False, decompress=False)
            props = dict(msg.properties)
            times = props.get(CHECK_TIMES)
            count = 1
            if times is not None:
                count = int(times) if times.lstrip("-").isdigit() else -1
                if count >= opts.transaction_check_max:
                    self._discard(msg, record)
                    i += 1
                    new_offset = i
                    continue
                count += 1
            if start - msg.born_timestamp > FILE_RESERVED_MS:
                self._discard(msg, record)
                i += 1
                new_offset = i
                continue
            if msg.store_timestamp >= start:
                break  # stored during this pass (a copy made just now): next pass
            age = start - msg.born_timestamp
            if 0 <= age < timeout_ms:
                break  # too young; everything after it is younger still
            props[CHECK_TIMES] = str(count)
            asked += 1  # a counted copy, whether or not a producer could be asked
            if not self._check_back(msg, props):
                group = props.get(PGROUP) or "(none)"
                unasked[group] = unasked.get(group, 0) + 1
            i += 1
            new_offset = i
        if new_offset != half_offset:
            store.commit_offset(CHECK_GROUP, HALF_TOPIC, 0, new_offset)
        new_op = op_offset
        for at in sorted(done_ops):
            if at != new_op:
                break
            new_op += 1
        if new_op != op_offset:
            store.commit_offset(CHECK_GROUP, OP_TOPIC, 0, new_op)
        for group, count in unasked.items():  # one line per group and pass, not per message
            log.warning("%s: no producer of group %s registered to ask about %d half messages "
                        "(stored again; each is discarded after %d checks)", self.broker.name,
                        group, count, opts.transaction_check_max)
        return asked

    def _discard(self, msg: MessageExt, record: bytes) -> None:
        """A half message checked too often: kept in TRANS_CHECK_MAX_TIME_TOPIC, never delivered."""
        log.warning("%s: half message %s (%s) checked %s times: discarded to %s",
                    self.broker.name, msg.uniq_key or msg.offset_msg_id,
                    msg.properties.get(REAL_TOPIC), msg.properties.get(CHECK_TIMES),
                    CHECK_MAX_TIME_TOPIC)
        self.discarded += 1
        self.ensure_topic(CHECK_MAX_TIME_TOPIC)
        text = hashmap_text(msg.properties)
        self._append(CHECK_MAX_TIME_TOPIC, 0, lambda offset, phys, now: encode_stored_message(
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
        offset, phys, _ = self._append(HALF_TOPIC, 0, lambda o, p, now: encode_stored_message(
            topic=HALF_TOPIC, queue_id=0, queue_offset=o, physical_offset=p,
            body=msg.stored_body, properties=text, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_timestamp=now,
            store_host=msg.store_host))
        group = props.get(PGROUP)
        conn = self.producer_connection(group)
        if conn is None:
            return False
        copy_id = offset_msg_id(pack_host(self.broker.addr)[0], phys)
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
        table = self.broker.clients.producers.get(group)
        conns = [c for c in (table or {}) if not getattr(c, "closed", False)]
        if not conns:
            return None
        return conns[next(self._pick) % len(conns)]

    # ---------------------------------------------------------------- inspection

    def pending(self) -> List[int]:
        """Queue offsets of half messages with no op message yet (for tests and tools)."""
        store = self.broker.store
        half = store.existing_queue(HALF_TOPIC, 0)
        if half is None:
            return []
        ended = set()
        op = store.existing_queue(OP_TOPIC, 0)
        for at in range(op.min_offset, op.max_offset) if op else ():
            body = decode_message(op.record(at), verify_crc=False, decompress=False)[0]
            try:
                ended.add(int(body.stored_body.decode()))
            except ValueError:
                pass
        start = max(self._consume_offset(HALF_TOPIC), half.min_offset)
        return [i for i in range(start, half.max_offset) if i not in ended]
