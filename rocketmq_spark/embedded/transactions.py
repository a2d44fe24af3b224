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
* Under release 5.1 the op entries are queued and written in batches, comma-joined
  (:mod:`.op_batches`).

The check-back of half messages nobody ended is :mod:`.transaction_check`.
"""
from __future__ import annotations

import logging
import struct
import zlib
from typing import Dict, Optional, Tuple

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import (
    MAGIC_V1, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK,
    decode_message, encode_stored_message, pack_host, record_layout,
)
from ..client.protocol.properties import (
    CLUSTER, TAGS, WAIT, decode_properties, hashmap_properties, java_string_hash,
    property_value,
)
from .context import BrokerContext
from .headers import java_bool, opt_str, req_int, req_long, req_str
from .op_batches import OpBatches
from .records import ensure_system_topic, tag_code
from .store import BrokerStore

log = logging.getLogger(__name__)

END_TRANSACTION = 37
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
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


def op_record(body: bytes, queue_offset: int, physical_offset: int, now: int,
              host: bytes, v6: bool) -> bytes:
    """An op message with ``body`` (4.x: one half offset; 5.1+: comma-joined offsets, see
    :mod:`.op_batches`), as ``encode_stored_message`` builds it with the broker's address as
    born and store host."""
    props = OP_PROPERTIES.encode()
    sys_flag = (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6) if v6 else 0
    total = 56 + 2 * len(host) + 12 + 4 + len(body) + 1 + len(OP_TOPIC) + 2 + len(props)
    return b"".join((
        _HEAD.pack(total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, 0, 0, queue_offset,
                   physical_offset, sys_flag, now),
        host, _Q.pack(now), host, _IQ.pack(0, 0), _I.pack(len(body)), body,
        bytes((len(OP_TOPIC),)), OP_TOPIC.encode(), len(props).to_bytes(2, "big"), props))


def half_at(store: BrokerStore, commit_log_offset: int) -> Optional[Tuple[int, bytes]]:
    """(queue offset, record) of the half message stored at ``commit_log_offset``.

    Half records are appended in commit-log order, so a binary search over the half queue finds
    it (a record's own physical offset is at bytes 28..36)."""
    queue = store.existing_queue(HALF_TOPIC, 0)
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


class EndTransactionHandler:
    """END_TRANSACTION of one broker: commit or roll back a half message."""

    def __init__(self, context: BrokerContext):
        self.context = context
        # 5.1+: op entries are queued and written in batches (TransactionalOpBatchService)
        self.op_batches: Optional[OpBatches] = (
            OpBatches(context, self._write_op) if context.options.at_least("5.1") else None)

    def start(self) -> None:
        """Start the op batch writer (5.1+; on the loop)."""
        if self.op_batches is not None:
            self.op_batches.start()

    def stop(self) -> None:
        """Stop the op batch writer, writing what it still holds."""
        if self.op_batches is not None:
            self.op_batches.stop()

    def handle(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        """Commit or roll back one half message (EndTransactionProcessor); ``conn`` is the
        producer's connection (only its ``peer`` is read)."""
        f = cmd.fields
        group = req_str(f, "producerGroup")
        table_offset = req_long(f, "tranStateTableOffset")
        commit_log_offset = req_long(f, "commitLogOffset")
        kind = req_int(f, "commitOrRollback")
        from_check = java_bool(opt_str(f, "fromTransactionCheck"))
        req_str(f, "msgId")
        version = self.context.options.version
        if kind not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE,
                        TRANSACTION_ROLLBACK_TYPE):
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, None, "org.apache.rocketmq."
                                     "remoting.exception.RemotingCommandException: "
                                     "commitOrRollback field wrong", version=version)
        if kind == TRANSACTION_NOT_TYPE:
            log.info("%s: producer %s answered %s for half message %d (%s)", self.context.name,
                     conn.peer, "UNKNOWN", table_offset,
                     "check" if from_check else "send")
            return None  # the genuine processor returns no response at all
        found = half_at(self.context.store, commit_log_offset)
        if found is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, None,
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
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, None, remark, version=version)
        if kind == TRANSACTION_COMMIT_TYPE:
            if not self._store_real(record, layout, props_text, commit_log_offset):
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, None, "UNKNOWN_ERROR",
                                         version=version)
        self._put_op(queue_offset)
        return cmd.make_response(ResponseCode.SUCCESS, None, None, version=version)

    def _store_real(self, record: bytes, layout, props_text: str,
                    commit_log_offset: int) -> bool:
        """The committed message in its real queue (``endMessageTransaction``)."""
        topic = property_value(props_text, REAL_TOPIC)
        qid = property_value(props_text, REAL_QID) or ""
        if not topic or not qid.lstrip("-").isdigit():
            log.error("%s: half message at %d has no REAL_TOPIC/REAL_QID; not committed",
                      self.context.name, commit_log_offset)
            return False
        text = hashmap_text(decode_properties(props_text))

        def encode(_, offset, phys, now):
            return committed_record(record, layout, topic, int(qid), offset, phys, now, text,
                                    commit_log_offset) or _encode_real(
                record, topic, int(qid), offset, phys, now, text, commit_log_offset)
        self.context.records.append(topic, int(qid), encode, codes=[tag_code(text)])
        return True

    def _put_op(self, half_offset: int) -> None:
        """Mark half message ``half_offset`` as ended: its own op message (4.x), or an entry
        of the next batched one (5.1+)."""
        if self.op_batches is not None:
            self.op_batches.add(half_offset)
        else:
            self._write_op(str(half_offset).encode())

    def _write_op(self, body: bytes) -> None:
        """Store one op message with ``body``."""
        ensure_system_topic(self.context.store, OP_TOPIC)
        host, v6 = pack_host(self.context.addr)
        self.context.records.append(OP_TOPIC, 0, lambda _, offset, phys, now: op_record(
            body, offset, phys, now, host, v6), codes=[REMOVE_TAG_CODE])


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
