"""How a message to send goes on the wire, and the sizes a broker refuses.

One place for the send side's wire details: the compression flag and level, the WAIT property
every message carries, a batch header's properties, and the size checks (a body over the
broker's ``maxMessageSize``, properties over 32,767 bytes). :func:`size_problem` words a
refusal for one message; :func:`encode_columns` encodes many messages at once, column by
column with Arrow, and checks them with the same words. The :class:`~.producer.Producer`'s
``encode`` and the Spark sink's transports both build on them.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import RocketMQError
from ..protocol import message, properties
from ..protocol.send_encode import (
    ENTRY_HEAD_BYTES, byte_lengths, encode_entries, join_pieces, property_piece, repeated,
)

# A default-configured broker's maxMessageSize: larger bodies are refused.
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
MAX_PROPERTIES_SIZE = 32767  # a property text's length travels as an int16
ZLIB_LEVEL = 5  # Java's producer compresses with level 5
COMPRESSED_SYS_FLAG = (message.SYSFLAG_COMPRESSED
                       | (message.COMPRESSION_ZLIB << message.COMPRESSION_SHIFT))
# Every message asks the broker to answer once it is stored (Java's producers set WAIT=true).
WAIT_PIECE = f"{properties.WAIT}{properties.NAME_VALUE_SEPARATOR}true" \
             f"{properties.PROPERTY_SEPARATOR}".encode()
# A SEND_BATCH_MESSAGE header's properties: WAIT only (a header UNIQ_KEY would override every
# message's own).
BATCH_HEADER_PROPERTIES = properties.encode_properties({properties.WAIT: "true"})
ENTRY_OVERHEAD = ENTRY_HEAD_BYTES + 2  # a batch entry's fixed part
# Half messages written to a queue together: each is a request of its own (brokers refuse
# transactional messages in a batch), written to the socket as one run.
HALF_RUN_ROWS = 512


class MessageTooLarge(RocketMQError, ValueError):
    """A message the broker would refuse for its size (body or properties)."""


def size_problem(topic: str, body_size: int, properties_size: int, max_message_size: int,
                 raw_size: Optional[int] = None, what: str = "a message",
                 option: str = "") -> Optional[str]:
    """Why a broker would refuse the message (``body_size`` as sent, ``raw_size`` before
    compression), or None. ``option``: the caller's setting that holds ``max_message_size``."""
    if body_size > max_message_size:
        raw = raw_size if raw_size is not None else body_size
        squeezed = f" ({body_size:,} compressed)" if raw != body_size else ""
        named = f" (option {option})" if option else ""
        return (f"{what} for topic {topic!r} has a body of {raw:,} bytes{squeezed}; the "
                f"broker takes at most {max_message_size:,}{named}")
    if properties_size > MAX_PROPERTIES_SIZE:
        return (f"{what} for topic {topic!r} has {properties_size:,} bytes of properties; "
                f"the broker takes at most {MAX_PROPERTIES_SIZE:,}")
    return None


class ColumnTooLarge(MessageTooLarge):
    """A message among many (:func:`encode_columns`) is too large; ``index`` is its row."""

    def __init__(self, index: int, problem: str):
        self.index = index
        super().__init__(problem)


def check_columns(topic_of: Callable[[int], str], sent: np.ndarray, max_message_size: int,
                  raw: Optional[np.ndarray] = None, props: Optional[np.ndarray] = None,
                  option: str = "") -> None:
    """Raise :class:`ColumnTooLarge` for the first message a broker would refuse, worded by
    :func:`size_problem` (sizes per row: ``sent`` bodies, ``raw`` before compression,
    ``props`` the properties' bytes)."""
    props = np.zeros_like(sent) if props is None else props
    bad = np.flatnonzero((sent > max_message_size) | (props > MAX_PROPERTIES_SIZE))
    if len(bad):
        i = int(bad[0])
        raise ColumnTooLarge(i, size_problem(
            topic_of(i), int(sent[i]), int(props[i]), max_message_size,
            int(raw[i]) if raw is not None else None, "the message", option) or "")


@dataclass
class EncodedColumns:
    """Many messages encoded: ``body`` as sent, ``properties`` (text, UTF-8), ``entries`` (a
    SEND_BATCH_MESSAGE entry each), ``sizes`` (bytes each adds to a batch request) and
    ``compressed`` (an int8 mask, None when no body is compressed)."""

    body: pa.Array
    properties: pa.Array
    entries: pa.Array
    sizes: np.ndarray
    compressed: Optional[np.ndarray] = None

    def sys_flag(self, row: int) -> int:
        """The compression bits of ``row`` (rows of one request share them)."""
        return COMPRESSED_SYS_FLAG if self.compressed is not None and self.compressed[row] \
            else 0


def property_pieces(ids: pa.Array, user: Optional[pa.Array] = None,
                    keys: Optional[pa.Array] = None, tags: Optional[pa.Array] = None,
                    sharding_key: Optional[pa.Array] = None,
                    delay: Optional[np.ndarray] = None) -> List[pa.Array]:
    """The property texts of many messages, a column per property (null: not set): the
    user's ``k\\x01v\\x02`` text, KEYS, TAGS, the sharding key, DELAY (0: none), UNIQ_KEY."""
    pieces = [p for p in (user,) if p is not None]
    for name, values in ((properties.KEYS, keys), (properties.TAGS, tags),
                         (properties.SHARDING_KEY, sharding_key)):
        if values is not None:
            pieces.append(property_piece(name, values))
    if delay is not None and delay.any():
        level = pc.if_else(pa.array(delay > 0), pa.array(delay).cast(pa.large_string()),
                           pa.scalar(None, pa.large_string()))
        pieces.append(property_piece(properties.DELAY, level))
    pieces.append(property_piece(properties.UNIQ_KEY, ids))
    return pieces


def encode_columns(body: pa.Array, pieces: Sequence[pa.Array], compress_over: int,
                   max_message_size: int, topic_of: Callable[[int], str],
                   option: str = "") -> EncodedColumns:
    """Encode many messages: bodies of ``compress_over`` bytes or more compressed (zlib, as
    Java's producer; -1: none), WAIT added to the property ``pieces``, sizes checked
    (:class:`ColumnTooLarge` names the first row a broker would refuse)."""
    raw = byte_lengths(body)
    compressed = None
    if compress_over >= 0:
        big = np.flatnonzero(raw >= compress_over)
        if len(big):
            squeezed = [zlib.compress(body[int(i)].as_buffer(), ZLIB_LEVEL) for i in big]
            mask = np.zeros(len(body), dtype=bool)
            mask[big] = True
            body = pc.replace_with_mask(body, pa.array(mask),
                                        pa.array(squeezed, pa.large_binary()))
            compressed = mask.astype(np.int8)
    sent = byte_lengths(body)
    check_columns(topic_of, sent, max_message_size, raw, option=option)
    props = join_pieces([*pieces, repeated(WAIT_PIECE, len(body))])
    props_len = byte_lengths(props)
    check_columns(topic_of, sent, max_message_size, raw, props_len, option)
    return EncodedColumns(body, props, encode_entries(body, props),
                          ENTRY_OVERHEAD + sent + props_len, compressed)

