"""Stored messages (the records in a PULL_MESSAGE body) and send-side encodings.

Record layout (big-endian; hosts are 8 bytes for IPv4, 20 for IPv6):
``totalSize(4) magic(4) bodyCRC(4) queueId(4) flag(4) queueOffset(8) physicalOffset(8) sysFlag(4)
bornTimestamp(8) bornHost storeTimestamp(8) storeHost reconsumeTimes(4) preparedTxOffset(8)
bodyLen(4) body topicLen(1, or 2 for magic V2) topic propsLen(2) props``.

This module decodes to one :class:`MessageExt` per record, which is what tests and small reads
want. The bulk path that goes straight to columns is :mod:`.columns`.
"""
from __future__ import annotations

import calendar
import functools
import ipaddress
import os
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import MessageDecodeError
from .properties import KEYS, TAGS, UNIQ_KEY, decode_properties

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
COMPRESSION_SHIFT = 8
COMPRESSION_MASK = 0x700

COMPRESSION_ZLIB_LEGACY = 0
COMPRESSION_LZ4 = 1
COMPRESSION_ZSTD = 2
COMPRESSION_ZLIB = 3

# Fixed part up to and including bodyLength, for IPv4 hosts.
_HEAD_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
_PREFIX = struct.Struct(">iiiiiqqiq")  # up to bornTimestamp (48 bytes)
MIN_RECORD_SIZE = 91


@dataclass
class MessageExt:
    """One decoded stored message. ``body`` is decompressed; ``stored_body`` is as on the wire."""

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: Dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    physical_offset: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    magic: int = MAGIC_V1
    store_size: int = 0
    stored_body: bytes = b""
    offset_msg_id: str = ""

    @property
    def tags(self) -> Optional[str]:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> Optional[str]:
        return self.properties.get(KEYS)

    @property
    def uniq_key(self) -> Optional[str]:
        return self.properties.get(UNIQ_KEY)

    @property
    def msg_id(self) -> str:
        """What Java's ``getMsgId()`` returns: the client id (UNIQ_KEY) if any, else the
        offset id."""
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def compressed(self) -> bool:
        return bool(self.sys_flag & SYSFLAG_COMPRESSED)


# --------------------------------------------------------------------------------------------
# Hosts and message ids


@functools.lru_cache(maxsize=1024)
def pack_host(address: str) -> Tuple[bytes, bool]:
    """``"ip:port"`` (or ``"[v6]:port"``) to the stored form; returns (bytes, is_ipv6).

    Cached: a broker stores every message with the same few hosts."""
    host, _, port = address.rpartition(":")
    ip = ipaddress.ip_address(host.strip("[]"))
    if not port.isdigit() or int(port) > 0x7FFFFFFF:
        raise ValueError(f"host {address!r} has no valid port")
    return ip.packed + struct.pack(">i", int(port)), ip.version == 6


def unpack_host(data: bytes) -> str:
    """The stored host bytes as ``"ip:port"``; IPv6 hosts are bracketed (``"[::1]:port"``)."""
    port = struct.unpack_from(">i", data, len(data) - 4)[0]
    if len(data) == 8:
        return f"{data[0]}.{data[1]}.{data[2]}.{data[3]}:{port}"
    return f"[{ipaddress.IPv6Address(bytes(data[:16]))}]:{port}"


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """The broker's message id: store address + port + commit-log offset, uppercase hex."""
    return (bytes(store_host) + struct.pack(">q", physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> Tuple[str, int]:
    """(store address, commit-log offset) of an offset message id."""
    raw = bytes.fromhex(msg_id)
    if len(raw) not in (16, 28):
        raise ValueError(f"offset message id must be 32 or 56 hex characters, got {len(msg_id)}")
    return unpack_host(raw[:-8]), struct.unpack(">q", raw[-8:])[0]


def commit_log_offset_of(msg_id: str) -> int:
    """The commit-log offset in an offset message id (its last 16 hex digits), without
    decoding the store host."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"offset message id must be 32 or 56 hex characters, got {len(msg_id)}")
    value = int(msg_id[-16:], 16)
    return value - (1 << 64) if value >= 1 << 63 else value


class UniqKeyFactory:
    """Client message ids (UNIQ_KEY): ip(4) + pid(2) + instance(4) + ms this month(4) + counter(2).

    Unique per process and across processes on one host, like the Java client's ids.
    """

    def __init__(self, ip: Optional[str] = None):
        try:
            packed = socket.inet_aton(ip or "127.0.0.1")
        except OSError:
            packed = b"\x7f\x00\x00\x01"
        self._prefix = (packed + struct.pack(">H", os.getpid() & 0xFFFF)
                        + struct.pack(">I", id(self) & 0xFFFFFFFF)).hex().upper()
        self._counter = 0
        self._lock = threading.Lock()
        self._month_start = 0.0
        self._next_month = 0.0

    def __call__(self) -> str:
        with self._lock:
            now = time.time()
            if now >= self._next_month:
                t = time.gmtime(now)
                year, month = t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1
                self._month_start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
                self._next_month = calendar.timegm((year, month, 1, 0, 0, 0))
            self._counter = (self._counter + 1) & 0xFFFF
            elapsed = int((now - self._month_start) * 1000) & 0xFFFFFFFF
            return self._prefix + f"{elapsed:08X}{self._counter:04X}"


new_uniq_key = UniqKeyFactory()


# --------------------------------------------------------------------------------------------
# Compression


def compression_type(sys_flag: int) -> int:
    return (sys_flag & COMPRESSION_MASK) >> COMPRESSION_SHIFT


def decompress_body(data: bytes, sys_flag: int) -> bytes:
    """Inflate a body whose sysFlag has COMPRESSED set; raises ValueError on bad data."""
    kind = compression_type(sys_flag)
    if kind in (COMPRESSION_ZLIB_LEGACY, COMPRESSION_ZLIB):
        return zlib.decompress(data)
    if kind == COMPRESSION_LZ4:
        import lz4.frame

        return lz4.frame.decompress(data)
    if kind == COMPRESSION_ZSTD:
        import zstandard

        # Java writes streaming frames without a content size, so decompress as a stream.
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out = dobj.decompress(data)
        if not getattr(dobj, "eof", True):  # a cut stream just yields less: check its end
            raise ValueError("zstd frame is incomplete")
        return out
    raise ValueError(f"unknown compression type {kind} in sysFlag {sys_flag:#x}")


def compress_body(data: bytes, kind: int = COMPRESSION_ZLIB, level: int = 5) -> Tuple[bytes, int]:
    """Compress a body; returns (bytes, sysFlag bits to set)."""
    if kind in (COMPRESSION_ZLIB_LEGACY, COMPRESSION_ZLIB):
        out = zlib.compress(data, level)
    elif kind == COMPRESSION_LZ4:
        import lz4.frame

        out = lz4.frame.compress(data)
    elif kind == COMPRESSION_ZSTD:
        import zstandard

        out = zstandard.ZstdCompressor(level=level).compress(data)
    else:
        raise ValueError(f"unknown compression type {kind}")
    return out, SYSFLAG_COMPRESSED | (kind << COMPRESSION_SHIFT)


# --------------------------------------------------------------------------------------------
# Decoding stored records


def record_layout(buf, pos: int, end: int, queue_offset_hint: Optional[int] = None):
    """Validate the record at ``pos`` and return its field positions.

    Returns ``(total, magic, sys_flag, born_host_len, store_host_len, body_pos, body_len,
    topic_pos, topic_len, props_pos, props_len)``. Raises :class:`MessageDecodeError` with the
    byte position of the fault.
    """
    if end - pos < MIN_RECORD_SIZE:
        raise MessageDecodeError(f"{end - pos} bytes left, too few for a stored message "
                                 f"(at least {MIN_RECORD_SIZE})", pos, buf, queue_offset_hint)
    total, magic = struct.unpack_from(">ii", buf, pos)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise MessageDecodeError(f"bad magic code {magic & 0xFFFFFFFF:#010x}", pos + 4, buf,
                                 queue_offset_hint)
    if total < MIN_RECORD_SIZE or pos + total > end:
        raise MessageDecodeError(f"totalSize {total} does not fit the {end - pos} bytes left",
                                 pos, buf, queue_offset_hint)
    sys_flag = struct.unpack_from(">i", buf, pos + 36)[0]
    born_len = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    store_len = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    p = pos + 48 + born_len + 8 + store_len + 12
    rec_end = pos + total
    if p + 4 > rec_end:
        raise MessageDecodeError(f"totalSize {total} ends inside the fixed part (sysFlag "
                                 f"{sys_flag:#x} asks for {p + 4 - pos} bytes)", pos, buf,
                                 queue_offset_hint)
    body_len = struct.unpack_from(">i", buf, p)[0]
    body_pos = p + 4
    if body_len < 0 or body_pos + body_len > rec_end:
        raise MessageDecodeError(f"body length {body_len} overruns the record", p, buf,
                                 queue_offset_hint)
    p = body_pos + body_len
    if magic == MAGIC_V2:
        if p + 2 > rec_end:
            raise MessageDecodeError("record ends before its topic length", p, buf,
                                     queue_offset_hint)
        topic_len = struct.unpack_from(">h", buf, p)[0]
        topic_pos = p + 2
    else:
        if p + 1 > rec_end:
            raise MessageDecodeError("record ends before its topic length", p, buf,
                                     queue_offset_hint)
        topic_len = struct.unpack_from(">b", buf, p)[0]
        topic_pos = p + 1
    if topic_len < 0 or topic_pos + topic_len + 2 > rec_end:
        raise MessageDecodeError(f"topic length {topic_len} overruns the record", topic_pos - 1,
                                 buf, queue_offset_hint)
    p = topic_pos + topic_len
    props_len = struct.unpack_from(">h", buf, p)[0]
    props_pos = p + 2
    if props_len < 0 or props_pos + props_len != rec_end:
        raise MessageDecodeError(f"properties length {props_len} does not end the record "
                                 f"(totalSize {total})", p, buf, queue_offset_hint)
    return (total, magic, sys_flag, born_len, store_len, body_pos, body_len, topic_pos,
            topic_len, props_pos, props_len)


def decode_message(buf, pos: int = 0, end: Optional[int] = None, verify_crc: bool = True,
                   decompress: bool = True) -> Tuple[MessageExt, int]:
    """Decode the record at ``pos``; returns the message and the position after it."""
    end = len(buf) if end is None else end
    layout = record_layout(buf, pos, end)
    (total, magic, sys_flag, born_len, store_len, body_pos, body_len, topic_pos, topic_len,
     props_pos, props_len) = layout
    _, _, crc, queue_id, flag, queue_offset, phys, _, born_ts = _PREFIX.unpack_from(buf, pos)
    p = pos + 48
    born_host = bytes(buf[p:p + born_len])
    p += born_len
    store_ts = struct.unpack_from(">q", buf, p)[0]
    p += 8
    store_host = bytes(buf[p:p + store_len])
    p += store_len
    reconsume, prepared = struct.unpack_from(">iq", buf, p)
    stored_body = bytes(buf[body_pos:body_pos + body_len])
    if verify_crc and (zlib.crc32(stored_body) & 0x7FFFFFFF) != crc:
        raise MessageDecodeError(
            f"body CRC mismatch: stored {crc:#010x}, computed "
            f"{zlib.crc32(stored_body) & 0x7FFFFFFF:#010x}", pos + 8, buf, queue_offset)
    try:
        topic = bytes(buf[topic_pos:topic_pos + topic_len]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageDecodeError(f"topic is not UTF-8: {exc.reason}", topic_pos + exc.start,
                                 buf, queue_offset) from None
    try:
        props = decode_properties(bytes(buf[props_pos:props_pos + props_len]).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MessageDecodeError(f"properties are not UTF-8: {exc.reason}", props_pos + exc.start,
                                 buf, queue_offset) from None
    body = stored_body
    if decompress and sys_flag & SYSFLAG_COMPRESSED:
        try:
            body = decompress_body(stored_body, sys_flag)
        except Exception as exc:  # zlib.error, lz4/zstd errors, ValueError
            raise MessageDecodeError(f"compressed body does not inflate: {exc}", body_pos, buf,
                                     queue_offset) from None
    msg = MessageExt(
        topic=topic, queue_id=queue_id, queue_offset=queue_offset, body=body, properties=props,
        flag=flag, sys_flag=sys_flag, physical_offset=phys, born_timestamp=born_ts,
        born_host=unpack_host(born_host), store_timestamp=store_ts,
        store_host=unpack_host(store_host), reconsume_times=reconsume,
        prepared_transaction_offset=prepared, body_crc=crc, magic=magic, store_size=total,
        stored_body=stored_body, offset_msg_id=offset_msg_id(store_host, phys))
    return msg, pos + total


def decode_messages(body: bytes, verify_crc: bool = True, decompress: bool = True
                    ) -> List[MessageExt]:
    """Every record of a FOUND pull body, in order."""
    out = []
    pos, end = 0, len(body)
    while pos < end:
        msg, pos = decode_message(body, pos, end, verify_crc, decompress)
        out.append(msg)
    return out


# --------------------------------------------------------------------------------------------
# Encoding stored records (used by the embedded server and the test vectors)


def encode_stored_message(*, topic: str, queue_id: int, queue_offset: int, physical_offset: int,
                          body: bytes, properties: str = "", flag: int = 0, sys_flag: int = 0,
                          born_timestamp: int = 0, born_host: str = "127.0.0.1:0",
                          store_timestamp: int = 0, store_host: str = "127.0.0.1:10911",
                          reconsume_times: int = 0, prepared_transaction_offset: int = 0,
                          magic: Optional[int] = None) -> bytes:
    """The stored record a broker writes; ``body`` is stored as given (already compressed)."""
    born, born_v6 = pack_host(born_host)
    store, store_v6 = pack_host(store_host)
    sys_flag = (sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
                | (SYSFLAG_BORNHOST_V6 if born_v6 else 0)
                | (SYSFLAG_STOREHOST_V6 if store_v6 else 0))
    topic_b = topic.encode("utf-8")
    props_b = properties.encode("utf-8")
    if len(props_b) > 32767:
        raise ValueError(f"properties are {len(props_b)} bytes; at most 32767 fit a record")
    if magic is None:
        magic = MAGIC_V1 if len(topic_b) <= 127 else MAGIC_V2
    elif magic == MAGIC_V1 and len(topic_b) > 127:
        raise ValueError(f"topic of {len(topic_b)} bytes needs magic V2 (V1 holds 127 at most)")
    topic_field = (struct.pack(">b", len(topic_b)) if magic == MAGIC_V1
                   else struct.pack(">h", len(topic_b))) + topic_b
    tail = (struct.pack(">i", len(body)) + body + topic_field + struct.pack(">h", len(props_b))
            + props_b)
    head_len = 48 + len(born) + 8 + len(store) + 12
    total = 4 + head_len - 4 + len(tail)
    head = (struct.pack(">iiiiiqqiq", total, magic, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag,
                        queue_offset, physical_offset, sys_flag, born_timestamp)
            + born + struct.pack(">q", store_timestamp) + store
            + struct.pack(">iq", reconsume_times, prepared_transaction_offset))
    return head + tail


# --------------------------------------------------------------------------------------------
# SEND_BATCH_MESSAGE body


@dataclass
class BatchEntry:
    """One message of a SEND_BATCH_MESSAGE body."""

    body: bytes
    properties: str = ""
    flag: int = 0


def encode_batch(entries: Sequence[BatchEntry]) -> bytes:
    out = bytearray()
    for e in entries:
        props = e.properties.encode("utf-8")
        total = 4 + 4 + 4 + 4 + 4 + len(e.body) + 2 + len(props)
        out += struct.pack(">iiiii", total, 0, 0, e.flag, len(e.body))
        out += e.body
        out += struct.pack(">h", len(props)) + props
    return bytes(out)


def decode_batch(data: bytes) -> List[BatchEntry]:
    """Split a batch body; raises MessageDecodeError naming the offending position."""
    out = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < 22:
            raise MessageDecodeError(f"batch entry of {end - pos} bytes is too short", pos, data)
        total, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", data, pos)
        if total < 22 or pos + total > end or 20 + body_len + 2 > total or body_len < 0:
            raise MessageDecodeError(f"batch entry totalSize {total} / body length {body_len} "
                                     "do not fit", pos, data)
        body = bytes(data[pos + 20:pos + 20 + body_len])
        plen = struct.unpack_from(">h", data, pos + 20 + body_len)[0]
        if plen < 0 or 20 + body_len + 2 + plen != total:
            raise MessageDecodeError(f"batch entry properties length {plen} does not end the "
                                     "entry", pos + 20 + body_len, data)
        p0 = pos + 22 + body_len
        try:
            props = bytes(data[p0:p0 + plen]).decode("utf-8")
        except UnicodeDecodeError:
            raise MessageDecodeError("batch entry properties are not UTF-8", p0, data) from None
        out.append(BatchEntry(body=body, properties=props, flag=flag))
        pos += total
    return out
