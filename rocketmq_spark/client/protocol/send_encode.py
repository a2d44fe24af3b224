"""Send-side encodings over Arrow columns: many messages at once, without a Python object each.

* :func:`encode_entries`: every message of a column as its SEND_BATCH_MESSAGE entry (the layout
  of :func:`.message.encode_batch`); the result's data buffer is the entries back to back, so a
  batch request of consecutive rows is one slice of it (:func:`entries_body`).
* :func:`java_string_hashes`: Java's ``String.hashCode()`` of a string column, for choosing a
  queue by key the way Java's ``SelectMessageQueueByHash`` does.
* :func:`property_pieces` / :func:`join_pieces`: the ``name\\x01value\\x02`` text of properties,
  column by column.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, java_string_hash

ENTRY_HEAD_BYTES = 20  # totalSize, magic, bodyCRC, flag, bodyLength (big-endian int32 each)
_EMPTY = pa.scalar(b"", pa.large_binary())


def fixed_width_array(data: np.ndarray, width: int, type_: pa.DataType = pa.large_binary()
                 ) -> pa.Array:
    """An Arrow binary/string array over ``data`` (``n`` x ``width`` bytes, C order)."""
    n = len(data)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    if type_ in (pa.binary(), pa.string()):
        offsets = offsets.astype(np.int32)
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets),
                                            pa.py_buffer(np.ascontiguousarray(data))])


def byte_lengths(array: pa.Array) -> np.ndarray:
    """Byte length of every value (0 for nulls), as int64."""
    return pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(
        np.int64)


def encode_entries(bodies: pa.Array, properties: pa.Array, flag: int = 0) -> pa.LargeBinaryArray:
    """One SEND_BATCH_MESSAGE entry per row: ``totalSize magic(0) bodyCRC(0) flag bodyLength
    body propertiesLength(int16) properties``. Neither column may hold nulls."""
    n = len(bodies)
    body_len = byte_lengths(bodies)
    prop_len = byte_lengths(properties)
    head = np.zeros((n, 5), dtype=">i4")
    head[:, 0] = ENTRY_HEAD_BYTES + body_len + 2 + prop_len
    head[:, 3] = flag
    head[:, 4] = body_len
    plen = prop_len.astype(">i2")
    return pc.binary_join_element_wise(
        fixed_width_array(head.view(np.uint8).reshape(n, ENTRY_HEAD_BYTES), ENTRY_HEAD_BYTES),
        bodies.cast(pa.large_binary()),
        fixed_width_array(plen.view(np.uint8).reshape(n, 2), 2),
        properties.cast(pa.large_binary()), _EMPTY)


def entry_offsets(entries: pa.Array) -> np.ndarray:
    """Where each entry starts in the data buffer, plus the end (n + 1 values)."""
    buffers = entries.buffers()
    large = pa.types.is_large_binary(entries.type) or pa.types.is_large_string(entries.type)
    dtype = np.int64 if large else np.int32
    return np.frombuffer(buffers[1], dtype=dtype, count=len(entries) + 1,
                         offset=entries.offset * np.dtype(dtype).itemsize).astype(np.int64)


def entries_body(entries: pa.Array, rows: np.ndarray) -> bytes:
    """The batch body of ``rows`` (indices into ``entries``): one slice of the data buffer when
    they are consecutive, else the entries taken in that order."""
    first, last = int(rows[0]), int(rows[-1])
    if last - first + 1 == len(rows) and (len(rows) < 2 or bool(np.all(np.diff(rows) == 1))):
        offsets = entry_offsets(entries)
        return bytes(memoryview(entries.buffers()[2])[offsets[first]:offsets[last + 1]])
    taken = entries.take(pa.array(rows))
    offsets = entry_offsets(taken)
    return bytes(memoryview(taken.buffers()[2])[offsets[0]:offsets[-1]])


def java_string_hashes(strings: pa.Array) -> np.ndarray:
    """Java's ``String.hashCode()`` of every value, as int32 (0 for nulls).

    ASCII values are hashed with numpy (their UTF-16 code units are their bytes); the rest
    one by one in Python."""
    strings = strings.cast(pa.large_string())
    n = len(strings)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out.astype(np.int32)
    offsets = entry_offsets(strings)
    data_buf = strings.buffers()[2]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, np.uint8))[offsets[0]:offsets[-1]]
    starts = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets)
    if len(data):
        longest = int(lengths.max())
        pow31 = np.ones(longest + 1, dtype=np.uint64)
        for i in range(1, longest + 1):
            pow31[i] = (pow31[i - 1] * 31) & 0xFFFFFFFF
        row_of = np.repeat(np.arange(n), lengths)
        ends = (starts + lengths)[row_of]
        exponent = ends - 1 - np.arange(len(data))
        terms = (data.astype(np.uint64) * pow31[exponent]) & 0xFFFFFFFF
        filled = lengths > 0  # empty rows own no bytes: segments start at the others
        out[filled] = (np.add.reduceat(terms, starts[filled]) & 0xFFFFFFFF).astype(np.int64)
        ascii_rows = np.ones(n, dtype=bool)
        high = data >= 0x80
        if high.any():
            ascii_rows[np.unique(row_of[high])] = False
            for i in np.flatnonzero(~ascii_rows):
                out[i] = java_string_hash(strings[int(i)].as_py()) & 0xFFFFFFFF
    out = np.where(out >= 1 << 31, out - (1 << 32), out)
    if strings.null_count:
        out[strings.is_null().to_numpy(zero_copy_only=False)] = 0
    return out.astype(np.int32)


def property_piece(name: str, values: pa.Array) -> pa.Array:
    """``name\\x01value\\x02`` per row; null where the value is null."""
    return pc.binary_join_element_wise(
        pa.scalar((name + NAME_VALUE_SEPARATOR).encode(), pa.large_binary()),
        values.cast(pa.large_binary()),
        pa.scalar(PROPERTY_SEPARATOR.encode(), pa.large_binary()), _EMPTY)


def join_pieces(pieces: Sequence[pa.Array]) -> pa.Array:
    """Row by row concatenation of property texts; null pieces are left out."""
    pieces = [p.cast(pa.large_binary()) for p in pieces]
    if len(pieces) == 1:
        return pc.fill_null(pieces[0], _EMPTY)
    # null_handling="replace" with "": pyarrow 26's "skip" drops rows whose pieces are all
    # null from the result (it comes out shorter than its inputs).
    return pc.binary_join_element_wise(*pieces, _EMPTY, null_handling="replace",
                                       null_replacement="")


def map_properties(maps: pa.MapArray) -> pa.Array:
    """The ``k\\x01v\\x02...`` text of a ``map<string,string>`` column; null for null or empty
    maps. Callers check names and values first (no nulls, no separators)."""
    pairs = pc.binary_join_element_wise(
        maps.keys.cast(pa.large_binary()), maps.items.cast(pa.large_binary()),
        pa.scalar(NAME_VALUE_SEPARATOR.encode(), pa.large_binary()))
    lists = pa.LargeListArray.from_arrays(maps.offsets.cast(pa.int64()), pairs,
                                          mask=maps.is_null())
    joined = pc.binary_join(lists, pa.scalar(PROPERTY_SEPARATOR.encode(), pa.large_binary()))
    with_tail = pc.binary_join_element_wise(
        joined, pa.scalar(PROPERTY_SEPARATOR.encode(), pa.large_binary()), _EMPTY)
    empty = pc.equal(pc.binary_length(joined), 0)
    return pc.if_else(empty, pa.scalar(None, pa.large_binary()), with_tail)


def repeated(value: bytes, n: int) -> pa.Array:
    """``value`` ``n`` times, as a large_binary column."""
    row = np.frombuffer(value, dtype=np.uint8)
    return fixed_width_array(np.tile(row, (n, 1)) if n else np.zeros((0, len(value)), np.uint8),
                        len(value))


def first_index(mask: pa.Array) -> Optional[int]:
    """The first index where a boolean column is true (nulls count as false), or None."""
    values = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    hits = np.flatnonzero(values)
    return int(hits[0]) if len(hits) else None

