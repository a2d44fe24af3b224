"""The pure-Python twin of the C accelerator: a pull body to Arrow columns with numpy.

Used when the accelerator is not built (or ``ROCKETMQ_SPARK_PURE_PYTHON=1``), and for what the
accelerator leaves to Python (IPv6 host strings). The only per-message Python work is the walk
along ``totalSize`` and the body CRC: fixed-width fields are gathered with numpy, and
variable-width ones (body, topic, properties) are cut out of the original buffer by Arrow
itself. The trick for those: consecutive records are in order, so the list
``[start0, end0, start1, end1, ...]`` is a valid, non-decreasing offsets buffer over the whole
body; the even entries of that binary array are exactly the fields, and ``take`` copies them
into a compact array in C. Tags, keys and the client message id come from the properties text
with RE2 regular expressions that pick the last non-empty occurrence (Java's rule).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import MessageDecodeError
from . import message
from .pull_columns import SCHEMA

_TOTAL = struct.Struct(">i")


def _property_pattern(name: str, last: bool) -> str:
    # With ``last``, a greedy prefix makes the match end at the last "name\x01value" item.
    prefix = "(?s)^(?:.*\x02)?" if last else "(?:^|\x02)"
    return f"{prefix}{name}\x01(?P<v>[^\x02]+)"


def _property(props: pa.Array, name: str) -> pa.Array:
    """The property's value per row (null when absent). A name may occur twice (a batch's
    header properties are appended to each message's own); Java keeps the last non-empty one,
    so rows with a repeat take the slower last-match pattern."""
    first = pc.struct_field(pc.extract_regex(props, _property_pattern(name, False)), [0])
    repeats = pc.greater(pc.count_substring(props, name + "\x01"), 1)
    if not pc.any(repeats).as_py():
        return first
    last = pc.struct_field(pc.extract_regex(props, _property_pattern(name, True)), [0])
    return pc.if_else(repeats, last, first)


_HEX = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint16)


def first_fault(body, end: int, verify_crc: bool) -> None:
    """Raise the error of the first bad record, checking the records in order, each for its
    layout, then its CRC, then its UTF-8, as the C decoder does (so both name the same record).
    Only called once a fault is known to exist; returns if it finds none."""
    pos = 0
    while pos < end:
        _, pos = message.decode_message(body, pos, end, verify_crc=verify_crc, decompress=False)


def walk(body, end: Optional[int] = None, verify_crc: bool = True) -> np.ndarray:
    """Start positions of the records in ``body``; checks only that each totalSize fits."""
    end = len(body) if end is None else end
    starts: List[int] = []
    append = starts.append
    unpack = _TOTAL.unpack_from
    pos = 0
    try:
        while pos < end:
            append(pos)
            size = unpack(body, pos)[0]
            if size < message.MIN_RECORD_SIZE:
                break
            pos += size
    except struct.error:
        pass
    if pos != end:
        # Let the scalar decoder name the first fault precisely.
        first_fault(body, end, verify_crc)
        raise MessageDecodeError("records do not end at the end of the body", starts[-1], body)
    return np.array(starts, dtype=np.int64)


_NATIVE = {">i1": np.int8, ">i2": np.int16, ">i4": np.int32, ">i8": np.int64}


def _be(u8: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian integers of ``width`` bytes at each position, as native integers."""
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    return u8[idx].reshape(-1).view(dtype).astype(_NATIVE[dtype])


def _slices(buf: pa.Buffer, starts: np.ndarray, ends: np.ndarray, n: int) -> pa.Array:
    """The byte ranges [starts[i], ends[i]) of ``buf`` as one compact binary array."""
    if n == 0:
        return pa.array([], pa.binary())
    offsets = np.empty(2 * n + 1, dtype=np.int32)
    offsets[0:2 * n:2] = starts
    offsets[1:2 * n:2] = ends
    offsets[2 * n] = ends[-1]
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n,
                                        [None, pa.py_buffer(offsets), buf])
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def host_strings(u8: np.ndarray, pos: np.ndarray, v6: np.ndarray) -> pa.Array:
    """Host strings ("ip:port"), formatted once per distinct host."""
    n = len(pos)
    if n == 0:
        return pa.array([], pa.string())
    width = 20 if v6.any() else 8
    raw = u8[np.minimum(pos[:, None] + np.arange(width), len(u8) - 1)]
    raw[~v6, 8:] = 0
    keys = np.ascontiguousarray(raw).view(f"V{width}").reshape(-1)
    uniq, inverse = np.unique(keys, return_inverse=True)
    texts = []
    for k, is_v6 in zip(uniq, v6[np.unique(inverse, return_index=True)[1]]):
        b = bytes(k)
        texts.append(message.unpack_host(b if is_v6 else b[:8]))
    return pa.array(texts, pa.string()).take(pa.array(inverse.astype(np.int32).reshape(-1)))


def _hex_ids(u8: np.ndarray, host_pos: np.ndarray, host_len: np.ndarray,
             phys_pos: np.ndarray) -> pa.Array:
    """Offset message ids: hex of store host bytes + commit-log offset (vectorised)."""
    n = len(host_pos)
    if n == 0:
        return pa.array([], pa.string())
    if (host_len == 8).all():
        raw = np.concatenate([u8[host_pos[:, None] + np.arange(8)],
                              u8[phys_pos[:, None] + np.arange(8)]], axis=1)
        text = _HEX[raw].reshape(-1).view(np.uint8)
        offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(text.tobytes())])
    ids = []
    for h, hl, p in zip(host_pos, host_len, phys_pos):
        ids.append(message.offset_msg_id(u8[h:h + hl].tobytes(),
                                   int.from_bytes(u8[p:p + 8].tobytes(), "big", signed=True)))
    return pa.array(ids, pa.string())


@dataclass
class _Records:
    """Where each record of a body keeps its fields (one numpy array per field, a row per
    record), and the fixed-width fields themselves."""

    starts: np.ndarray
    queue_id: np.ndarray
    flag: np.ndarray
    queue_offset: np.ndarray
    physical: np.ndarray
    sys_flag: np.ndarray
    born_ts: np.ndarray
    born_v6: np.ndarray
    store_v6: np.ndarray
    store_ts: np.ndarray
    store_host_pos: np.ndarray
    store_len: np.ndarray
    reconsume: np.ndarray
    crc: np.ndarray
    body_pos: np.ndarray
    body_end: np.ndarray
    topic_pos: np.ndarray
    topic_end: np.ndarray
    props_pos: np.ndarray
    props_end: np.ndarray


class _Refusal:
    """Raises the decoder's error for the first record a vectorised check fails."""

    def __init__(self, data: bytes, starts: np.ndarray, queue_offset: np.ndarray,
                 verify_crc: bool):
        self.data, self.starts, self.queue_offset = data, starts, queue_offset
        self.verify_crc = verify_crc

    def check(self, bad: np.ndarray) -> None:
        if bad.any():
            # An earlier record may have another fault (found by a later check here).
            first_fault(self.data, len(self.data), self.verify_crc)
            i = int(np.argmax(bad))
            raise MessageDecodeError("record fails validation", int(self.starts[i]), self.data,
                                     int(self.queue_offset[i]))


def _locate(data: bytes, u8: np.ndarray, starts: np.ndarray, verify_crc: bool) -> _Records:
    """Read the fixed-width fields and find the variable ones, checking that every length
    stays inside its record (the same checks, in the same order, as the C decoder)."""
    end = len(data)
    totals = _be(u8, starts, 4, ">i4").astype(np.int64)
    magic = _be(u8, starts + 4, 4, ">i4")
    queue_offset = _be(u8, starts + 20, 8, ">i8")
    sys_flag = _be(u8, starts + 36, 4, ">i4")
    born_v6 = (sys_flag & message.SYSFLAG_BORNHOST_V6) != 0
    store_v6 = (sys_flag & message.SYSFLAG_STOREHOST_V6) != 0
    store_len = np.where(store_v6, 20, 8)
    store_ts_pos = starts + 48 + np.where(born_v6, 20, 8)
    store_host_pos = store_ts_pos + 8
    reconsume_pos = store_host_pos + store_len
    body_len_pos = reconsume_pos + 12
    rec_end = starts + totals
    refuse = _Refusal(data, starts, queue_offset, verify_crc)

    refuse.check(((magic != message.MAGIC_V1) & (magic != message.MAGIC_V2))
                 | (body_len_pos + 4 > rec_end))
    body_len = _be(u8, body_len_pos, 4, ">i4").astype(np.int64)
    body_pos = body_len_pos + 4
    body_end = body_pos + body_len
    v2 = magic == message.MAGIC_V2
    refuse.check((body_len < 0) | (body_end + np.where(v2, 2, 1) > rec_end))
    topic_len = np.where(v2, _be(u8, np.minimum(body_end, end - 2), 2, ">i2"),
                         _be(u8, body_end, 1, ">i1")).astype(np.int64)
    topic_pos = body_end + np.where(v2, 2, 1)
    topic_end = topic_pos + topic_len
    refuse.check((topic_len < 0) | (topic_end + 2 > rec_end))
    props_len = _be(u8, topic_end, 2, ">i2").astype(np.int64)
    props_pos = topic_end + 2
    refuse.check((props_len < 0) | (props_pos + props_len != rec_end))
    return _Records(
        starts=starts, queue_id=_be(u8, starts + 12, 4, ">i4"),
        flag=_be(u8, starts + 16, 4, ">i4"), queue_offset=queue_offset,
        physical=_be(u8, starts + 28, 8, ">i8"), sys_flag=sys_flag,
        born_ts=_be(u8, starts + 40, 8, ">i8"), born_v6=born_v6, store_v6=store_v6,
        store_ts=_be(u8, store_ts_pos, 8, ">i8"), store_host_pos=store_host_pos,
        store_len=store_len, reconsume=_be(u8, reconsume_pos, 4, ">i4"),
        crc=_be(u8, starts + 8, 4, ">i4"), body_pos=body_pos, body_end=body_end,
        topic_pos=topic_pos, topic_end=topic_end, props_pos=props_pos,
        props_end=props_pos + props_len)


def _check_crcs(data: bytes, records: _Records) -> None:
    """Every body against its stored CRC (the one per-message Python loop)."""
    view = memoryview(data)
    crc32 = zlib.crc32
    for i, (s, e, c) in enumerate(zip(records.body_pos.tolist(), records.body_end.tolist(),
                                      records.crc.tolist())):
        if crc32(view[s:e]) & 0x7FFFFFFF != c:
            first_fault(data, len(data), True)  # an earlier record may be bad UTF-8
            raise MessageDecodeError(
                f"body CRC mismatch: stored {c:#010x}, computed "
                f"{crc32(view[s:e]) & 0x7FFFFFFF:#010x}", int(records.starts[i]) + 8, data,
                int(records.queue_offset[i]))


def _columns(data: bytes, u8: np.ndarray, records: _Records, verify_crc: bool
             ) -> pa.RecordBatch:
    """The batch: variable-width fields cut out of ``data``, the property-derived columns
    (tags, keys, the client message id) and the offset message ids."""
    n, buf, r = len(records.starts), pa.py_buffer(data), records
    bodies = _slices(buf, r.body_pos, r.body_end, n)
    try:
        topics = _slices(buf, r.topic_pos, r.topic_end, n).cast(pa.string())
        props = _slices(buf, r.props_pos, r.props_end, n).cast(pa.string())
    except pa.ArrowInvalid:
        # Decode topic and properties apart (the length between them need not be UTF-8).
        first_fault(data, len(data), verify_crc)
        raise
    offset_ids = _hex_ids(u8, r.store_host_pos, r.store_len, r.starts + 28)
    uniq = _property(props, "UNIQ_KEY")
    return pa.RecordBatch.from_arrays([
        topics, pa.array(r.queue_id, pa.int32()), pa.array(r.queue_offset, pa.int64()),
        pa.array(r.physical, pa.int64()), pa.array(r.flag, pa.int32()),
        pa.array(r.sys_flag.astype(np.int32), pa.int32()), pa.array(r.born_ts, pa.int64()),
        host_strings(u8, r.starts + 48, r.born_v6), pa.array(r.store_ts, pa.int64()),
        host_strings(u8, r.store_host_pos, r.store_v6), pa.array(r.reconsume, pa.int32()), bodies,
        props, _property(props, "TAGS"), _property(props, "KEYS"),
        pc.coalesce(uniq, offset_ids), offset_ids,
    ], schema=SCHEMA)


def decode(data: bytes, verify_crc: bool) -> pa.RecordBatch:
    """The pure-Python twin of the C accelerator (numpy and Arrow do the per-row work)."""
    starts = walk(data, len(data), verify_crc)
    if len(starts) == 0:
        return pa.RecordBatch.from_pylist([], schema=SCHEMA)
    u8 = np.frombuffer(data, dtype=np.uint8)
    records = _locate(data, u8, starts, verify_crc)
    if verify_crc:
        _check_crcs(data, records)
    return _columns(data, u8, records, verify_crc)
