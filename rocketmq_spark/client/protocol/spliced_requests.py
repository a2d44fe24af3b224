"""Many requests of one shape, encoded over Arrow columns: one frame per row, back to back.

Some requests go one message at a time although thousands are sent together: a broker
refuses half (transactional) messages in a batch, and END_TRANSACTION names one half message.
Encoding each as a :class:`~.frame.RemotingCommand` costs tens of microseconds of Python per
row; here a *template* command is encoded once (with the ROCKETMQ binary header) and the rows'
own values (the opaque, one or two header values, the body) are spliced into it column by
column, so the frames of a whole run come out as one buffer ready for a single write.

The result is byte for byte what :func:`~.frame.encode_frame` gives for each row's command
(``tests/test_spliced_requests.py`` holds the two against each other).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .frame import RemotingCommand, SerializeType, encode_binary_header
from .send_encode import fixed_width_array, byte_lengths

_EMPTY = pa.scalar(b"", pa.large_binary())
_FIXED = 5             # code (2), language (1), version (2)
_OPAQUE_END = 9        # opaque (4)
_EXT_LEN_AT = 17       # flag (4), remark length (4): the template carries no remark
_EXT_AT = 21
_MARK = "\x00rocketmq-spark-column-{}\x00"


@dataclass(frozen=True)
class _Slot:
    key: str
    start: int   # where the value's 4-byte length starts in the template's header
    end: int     # where the placeholder value ends


class RequestTemplate:
    """The frames of ``command`` for many rows that differ only in the header values of
    ``columns`` (each a key of ``command.ext_fields``), their opaques and their bodies."""

    def __init__(self, command: RemotingCommand, columns: Sequence[str]):
        if command.remark:
            raise ValueError("a request template carries no remark")
        fields: Dict[str, str] = dict(command.ext_fields or {})
        for i, key in enumerate(columns):
            if key not in fields:
                raise ValueError(f"the template has no header field {key!r}")
            fields[key] = _MARK.format(i)
        probe = RemotingCommand(code=command.code, ext_fields=fields, flag=command.flag,
                                opaque=0, language=command.language, version=command.version)
        header = encode_binary_header(probe)
        slots = []
        for i, key in enumerate(columns):
            mark = _MARK.format(i).encode()
            at = header.index(mark)
            slots.append(_Slot(key, at - 4, at + len(mark)))
        slots.sort(key=lambda s: s.start)
        self.columns = list(columns)
        self._order = [self.columns.index(s.key) for s in slots]
        self._head = header[:_FIXED]
        self._flag_remark = header[_OPAQUE_END:_EXT_LEN_AT]
        self._ext_fixed = len(header) - _EXT_AT - sum(s.end - s.start - 4 for s in slots)
        self._pieces = []  # constant bytes between the row values
        pos = _EXT_AT
        for s in slots:
            self._pieces.append(header[pos:s.start])
            pos = s.end
        self._tail = header[pos:]

    def frames(self, opaques: np.ndarray, values: Sequence[pa.Array],
               bodies: Optional[pa.Array] = None) -> pa.LargeBinaryArray:
        """One frame per row: ``values[i]`` holds the header values of ``columns[i]``
        (strings or UTF-8 binary, no nulls); ``bodies`` the bodies (none: empty)."""
        n = len(opaques)
        values = [v.cast(pa.large_binary()) for v in values]
        lengths = [byte_lengths(v) for v in values]
        body_len = byte_lengths(bodies) if bodies is not None else np.zeros(n, np.int64)
        ext_len = self._ext_fixed + sum(lengths)
        header_len = _EXT_AT + ext_len
        words = np.empty((n, 2), dtype=">u4")
        words[:, 0] = 4 + header_len + body_len
        words[:, 1] = (int(SerializeType.ROCKETMQ) << 24) | header_len
        pieces = [_column(words.view(np.uint8).reshape(n, 8)), _constant(self._head),
                  _int32s(opaques), _constant(self._flag_remark), _int32s(ext_len)]
        for piece, k in zip(self._pieces, self._order):
            if piece:
                pieces.append(_constant(piece))
            pieces.append(_int32s(lengths[k]))
            pieces.append(values[k])
        if self._tail:
            pieces.append(_constant(self._tail))
        if bodies is not None:
            pieces.append(bodies.cast(pa.large_binary()))
        return pc.binary_join_element_wise(*pieces, _EMPTY)


def _constant(data: bytes) -> pa.Scalar:
    return pa.scalar(data, pa.large_binary())


def _column(data: np.ndarray) -> pa.Array:
    return fixed_width_array(data, data.shape[1])


def _int32s(values: np.ndarray) -> pa.Array:
    words = np.asarray(values).astype(">i4")
    return _column(words.view(np.uint8).reshape(len(words), 4))


def buffer_of(frames: pa.Array) -> memoryview:
    """The frames back to back, as they go on the wire (no copy)."""
    offsets = frames.buffers()[1]
    ends = np.frombuffer(offsets, dtype=np.int64, count=len(frames) + 1,
                         offset=frames.offset * 8)
    data = frames.buffers()[2]
    if data is None:
        return memoryview(b"")
    return memoryview(data)[int(ends[0]):int(ends[-1])]
