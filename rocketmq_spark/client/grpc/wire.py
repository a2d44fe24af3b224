"""SendMessageRequest bytes written directly, without building protobuf objects.

A gRPC call of one message spends more on building ``Message``, ``SystemProperties`` and
``Timestamp`` objects than on serializing them. The request is simple enough to write as
protobuf wire format by hand: length-delimited fields and varints, in field-number order as
protobuf's own encoder writes them. What does not change between messages (the topic
resource, the born host, a send's born timestamp) is encoded once. :func:`convert.to_proto`
stays the reference: the tests parse these bytes with the generated classes and compare.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from . import definition_pb2 as pb

_LEN = 2
_VARINT = 0


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int (negative int64s take 10 bytes)."""
    if value < 0:
        value &= (1 << 64) - 1
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else varint(n)) + payload


def _text(tag: bytes, value: str) -> bytes:
    return _len_field(tag, value.encode("utf-8"))


def timestamp(millis: int) -> bytes:
    """A ``google.protobuf.Timestamp``'s fields for ``millis`` since the epoch."""
    seconds, ms = divmod(millis, 1000)
    out = b""
    if seconds:
        out += b"\x08" + varint(seconds)
    if ms:
        out += b"\x10" + varint(ms * 1_000_000)
    return out


# Message
_TOPIC = _tag(1, _LEN)
_USER_PROPERTY = _tag(2, _LEN)
_SYSTEM = _tag(3, _LEN)
_BODY = _tag(4, _LEN)
# Resource
_NAMESPACE = _tag(1, _LEN)
_NAME = _tag(2, _LEN)
# map entry
_KEY = _tag(1, _LEN)
_VALUE = _tag(2, _LEN)
# SystemProperties
_SP_TAG = _tag(1, _LEN)
_SP_KEYS = _tag(2, _LEN)
_SP_MESSAGE_ID = _tag(3, _LEN)
_SP_BODY_ENCODING = _tag(5, _VARINT)
_SP_MESSAGE_TYPE = _tag(6, _VARINT)
_SP_BORN_TIMESTAMP = _tag(7, _LEN)
_SP_BORN_HOST = _tag(8, _LEN)
_SP_DELIVERY_TIMESTAMP = _tag(11, _LEN)
_SP_MESSAGE_GROUP = _tag(17, _LEN)
# SendMessageRequest
_MESSAGES = _tag(1, _LEN)


def resource(name: str, namespace: str = "") -> bytes:
    """A ``Resource``'s fields."""
    return (_text(_NAMESPACE, namespace) if namespace else b"") + _text(_NAME, name)


def user_properties(properties: Mapping[str, str]) -> bytes:
    """``Message.user_properties`` (field 2) entries."""
    return b"".join(_len_field(_USER_PROPERTY, (_text(_KEY, k) if k else b"")
                               + (_text(_VALUE, v) if v else b""))
                    for k, v in properties.items())


class RequestWriter:
    """Writes the SendMessageRequest of messages of one topic, born at one instant.

    ``born_host`` and the topic's resource are encoded once; :meth:`message` writes one
    ``Message`` and :meth:`request` wraps messages into a request."""

    __slots__ = ("_topic", "_tail", "_born")

    def __init__(self, topic: str, namespace: str, born_host: str, now_ms: int):
        self._topic = _len_field(_TOPIC, resource(topic, namespace))
        self._born = now_ms
        born = _len_field(_SP_BORN_TIMESTAMP, timestamp(now_ms)) + _text(_SP_BORN_HOST,
                                                                          born_host)
        encoding = _SP_BODY_ENCODING + varint(pb.IDENTITY)
        # body_encoding, message_type, born_timestamp, born_host: fields 5-8, per message type
        self._tail: Dict[int, bytes] = {
            kind: encoding + _SP_MESSAGE_TYPE + varint(kind) + born
            for kind in (pb.NORMAL, pb.FIFO, pb.DELAY)}

    def message(self, body: bytes, message_id: str, kind: int, tags: Optional[str] = None,
                keys: Sequence[str] = (), properties: Optional[Mapping[str, str]] = None,
                message_group: Optional[str] = None,
                delivery_ms: Optional[int] = None) -> bytes:
        """One ``Message`` (the bytes of a ``messages`` entry's payload)."""
        system = _text(_SP_TAG, tags) if tags else b""
        for key in keys:
            system += _text(_SP_KEYS, key)
        system += _text(_SP_MESSAGE_ID, message_id) + self._tail[kind]
        if delivery_ms is not None:
            system += _len_field(_SP_DELIVERY_TIMESTAMP, timestamp(delivery_ms))
        if message_group:
            system += _text(_SP_MESSAGE_GROUP, message_group)
        return (self._topic + (user_properties(properties) if properties else b"")
                + _len_field(_SYSTEM, system) + _len_field(_BODY, body))

    @staticmethod
    def request(messages: Iterable[bytes]) -> bytes:
        """A SendMessageRequest of the given ``Message`` encodings."""
        return b"".join(_len_field(_MESSAGES, m) for m in messages)


def split_keys(keys) -> Tuple[str, ...]:
    """``Message.keys`` (a string or several) as a tuple."""
    if not keys:
        return ()
    return (keys,) if isinstance(keys, str) else tuple(keys)
