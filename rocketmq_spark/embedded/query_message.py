"""QUERY_MESSAGE (12) and VIEW_MESSAGE_BY_ID (33): finding stored messages by key and by
physical offset, as a 4.9.8 broker's ``QueryMessageProcessor`` answers them.

A genuine broker indexes every stored message under ``topic#UNIQ_KEY`` and ``topic#key`` for
each of its space-separated ``KEYS`` (``IndexService.buildIndex``; rolled-back transactional
records are not indexed) and looks keys up in its index files, newest first, keeping the
entries whose store time lies in ``[beginTimestamp, endTimestamp]``. This broker has no index
files: it scans the topic's queues over that window, which finds the same messages (index
files keep times in seconds from their first entry; here the store time is compared whole).
Java's ``queryMessageByUniqKey`` starts its window at the time it reads out of the id, so a
message stored before that time is not found, here as there.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Dict, List, Optional, Tuple

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import KEYS, UNIQ_KEY, decode_properties, java_hashmap_order
from .context import BrokerContext
from .headers import req_int, req_long, req_str
from .queue import ConsumeQueue
from .records import properties_text

QUERY_MESSAGE = 12
VIEW_MESSAGE_BY_ID = 33
UNIQUE_KEY_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG
DEFAULT_QUERY_MAX_NUM = 32     # MessageStoreConfig.defaultQueryMaxNum
MAX_MSGS_NUM_BATCH = 64        # MessageStoreConfig.maxMsgsNumBatch (IndexService caps maxNum)
NOT_FOUND_REMARK = "can not find message, maybe time range not correct"
_SYS_FLAG_AT, _STORE_TIME_AT, _PHYSICAL_AT = 36, 0, 28
_TRANSACTION_MASK, _ROLLBACK = 0x0C, 0x0C  # MessageSysFlag.getTransactionValue


def _indexed_keys(record: bytes) -> List[str]:
    """The keys a genuine broker indexes the record under (without the ``topic#``)."""
    if int.from_bytes(record[_SYS_FLAG_AT:_SYS_FLAG_AT + 4], "big") & _TRANSACTION_MASK \
            == _ROLLBACK:
        return []
    props = decode_properties(properties_text(record))
    keys = [props[UNIQ_KEY]] if props.get(UNIQ_KEY) else []
    return keys + [k for k in props.get(KEYS, "").split(" ") if k]


def _queues_of(context: BrokerContext, topic: str) -> List[ConsumeQueue]:
    return [q for (t, _), q in sorted(context.store.queues.items()) if t == topic]


def _matches(queue: ConsumeQueue, key: str, begin: int, end: int
             ) -> List[Tuple[int, int, bytes]]:
    """(store time, physical offset, record) of the queue's messages indexed under ``key``
    whose store time is within ``[begin, end]``."""
    found = []
    for offset in range(queue.search(begin, "lower"), queue.max_offset):
        stored = queue.store_time(offset)
        if stored is None or stored > end:
            break
        if stored < begin:
            continue
        record = queue.record(offset)
        if key in _indexed_keys(record):
            found.append((stored, queue.record_long(offset, _PHYSICAL_AT), record))
    return found


def _answer(cmd: RemotingCommand, code: int, fields: Dict[str, str], remark: Optional[str],
            body: bytes, version: int) -> RemotingCommand:
    ordered = {k: fields[k] for k in java_hashmap_order(fields)}
    return cmd.make_response(code, ordered, remark, body=body, version=version)


def handle_query_message(context: BrokerContext, cmd: RemotingCommand) -> RemotingCommand:
    """Messages of ``topic`` stored under ``key`` within the window, oldest physical offset
    first; QUERY_NOT_FOUND when none. ``indexLastUpdate*`` name the newest indexed message
    (0 when nothing matched, as a genuine broker leaves them)."""
    f = cmd.fields
    topic, key = req_str(f, "topic"), req_str(f, "key")
    max_num = req_int(f, "maxNum")
    begin, end = req_long(f, "beginTimestamp"), req_long(f, "endTimestamp")
    if f.get(UNIQUE_KEY_QUERY_FLAG) == "true":
        max_num = DEFAULT_QUERY_MAX_NUM
    max_num = min(max_num, MAX_MSGS_NUM_BATCH)
    hits = [m for q in _queues_of(context, topic) for m in _matches(q, key, begin, end)]
    hits.sort(key=lambda m: m[1], reverse=True)  # the index gives the newest entries first
    kept = sorted(hits[:max(max_num, 0)], key=lambda m: m[1])
    last_time = last_offset = 0
    if kept:
        last_time, last_offset = _newest_indexed(context)
    fields = {"indexLastUpdateTimestamp": str(last_time),
              "indexLastUpdatePhyoffset": str(last_offset)}
    if kept:
        return _answer(cmd, ResponseCode.SUCCESS, fields, None,
                       b"".join(m[2] for m in kept), context.options.version)
    return _answer(cmd, ResponseCode.QUERY_NOT_FOUND, fields, NOT_FOUND_REMARK, b"",
                   context.options.version)


def _newest_indexed(context: BrokerContext) -> Tuple[int, int]:
    """(store time, physical offset) of the broker's newest stored message."""
    newest = (0, 0)
    for queue in context.store.queues.values():
        if queue.max_offset > queue.min_offset:
            last = queue.max_offset - 1
            newest = max(newest, (queue.record_long(last, _PHYSICAL_AT),
                                  queue.store_time(last) or 0))
    return newest[1], newest[0]


def _record_at(queue: ConsumeQueue, physical: int) -> Optional[bytes]:
    lo, hi = queue.min_offset, queue.max_offset
    offsets = range(lo, hi)

    class _Physical:  # bisect over the queue's physical offsets, which only grow
        def __getitem__(self, i: int) -> int:
            return queue.record_long(offsets[i], _PHYSICAL_AT)

        def __len__(self) -> int:
            return len(offsets)

    i = bisect_left(_Physical(), physical)
    if i < len(offsets) and queue.record_long(offsets[i], _PHYSICAL_AT) == physical:
        return queue.record(offsets[i])
    return None


def handle_view_message(context: BrokerContext, cmd: RemotingCommand) -> RemotingCommand:
    """The stored message that starts at physical ``offset`` (what an offset message id
    names), or SYSTEM_ERROR naming the offset."""
    offset = req_long(cmd.fields, "offset")
    for queue in context.store.queues.values():
        record = _record_at(queue, offset)
        if record is not None:
            return cmd.make_response(ResponseCode.SUCCESS, None, None, body=record,
                                     version=context.options.version)
    return cmd.make_response(ResponseCode.SYSTEM_ERROR, None,
                             f"can not find message by the offset, {offset}",
                             version=context.options.version)
