"""Remoting frames: the command header (JSON or ROCKETMQ binary) and the length-prefixed frame.

Pure functions over bytes; no sockets. Both the client and the embedded server use them.

Frame layout (big-endian): ``length(4) | serType(1) hdrLen(3) | header | body`` where ``length``
counts everything after itself.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .. import accelerator
from ..errors import ProtocolError
from .codes import (
    CLIENT_VERSION, FLAG_ONEWAY, FLAG_RESPONSE, LANGUAGE_CODES, LANGUAGES, MAX_FRAME_BYTES,
    SerializeType, code_name,
)

# The optional C binary header codec (native/client/rmq_header.c), None when it is not built.
_native_codec = accelerator.built_module()
# FrameDecoder's C splitter (native/client/rmq_header.c split_frames): set below, once the
# command class exists; None without it (not built, or ROCKETMQ_SPARK_PURE_PYTHON set).
_native_split = None

_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag


@dataclass
class RemotingCommand:
    """One request or response.

    ``ext_fields`` maps header keys to strings; ``None`` means the header carries no
    ``extFields`` object at all (what a genuine broker sends when a response has no custom header).
    """

    code: int
    ext_fields: Optional[Dict[str, str]] = field(default_factory=dict)
    body: bytes = b""
    flag: int = 0
    opaque: int = 0
    language: str = "PYTHON"
    version: int = CLIENT_VERSION
    remark: Optional[str] = None
    serialize_type: int = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @property
    def fields(self) -> Dict[str, str]:
        """``ext_fields``, never ``None``."""
        return self.ext_fields if self.ext_fields is not None else {}

    def make_response(self, code: int, ext_fields: Optional[Dict[str, str]] = None,
                      remark: Optional[str] = None, body: bytes = b"", language: str = "JAVA",
                      version: int = CLIENT_VERSION) -> "RemotingCommand":
        """A response to this request: same opaque, response bit set, same serialization."""
        return RemotingCommand(code=code, ext_fields=ext_fields, body=body, flag=FLAG_RESPONSE,
                               opaque=self.opaque, language=language, version=version,
                               remark=remark, serialize_type=self.serialize_type)

    def describe(self) -> str:
        """A short label for errors and logs (never includes header values)."""
        kind = "response" if self.is_response else "request"
        return f"{code_name(self.code, self.is_response)} {kind} (opaque {self.opaque})"

    def __repr__(self) -> str:
        # Header values may carry an AccessKey and Signature; show only the keys.
        keys = sorted(self.ext_fields) if self.ext_fields else []
        return (f"RemotingCommand(code={self.code}, flag={self.flag}, opaque={self.opaque}, "
                f"remark={self.remark!r}, ext_keys={keys}, body={len(self.body)} bytes)")


# --------------------------------------------------------------------------------------------
# JSON header


def _field_text(value) -> str:
    """Header values may arrive as JSON numbers or booleans (the C++ client sends them)."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    return str(value)


_quote = json.encoder.encode_basestring  # JSON string literal, non-ASCII kept (fastjson's way)


def encode_json_header(cmd: RemotingCommand) -> bytes:
    """fastjson's layout: compact, properties in alphabetical order, nulls left out.

    Written by hand rather than with ``json.dumps``: it is on the path of every request."""
    parts = ['{"code":', str(int(cmd.code))]
    if cmd.ext_fields is not None:
        parts.append(',"extFields":{')
        parts.append(",".join(f"{_quote(k)}:{_quote(v)}" for k, v in cmd.ext_fields.items()))
        parts.append("}")
    parts.append(f',"flag":{int(cmd.flag)},"language":{_quote(cmd.language)},'
                 f'"opaque":{int(cmd.opaque)}')
    if cmd.remark is not None:
        parts.append(',"remark":')
        parts.append(_quote(cmd.remark))
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}')
    return "".join(parts).encode("utf-8")


def _json_int(obj: dict, key: str, default: int, data: bytes) -> int:
    """An int property of the header; Java's fields are 32-bit ints."""
    value = obj.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not -0x80000000 <= number <= 0x7FFFFFFF:
        pos = bytes(data).find(f'"{key}"'.encode())
        raise ProtocolError(f"JSON header field {key!r} is not a 32-bit integer: "
                            f"{str(value)[:40]!r}", max(pos, 0), "header", data)
    return number


def decode_json_header(data: bytes, body: bytes = b"") -> RemotingCommand:
    # Java reads the header as UTF-8 (json.loads on bytes would also take UTF-16/32).
    bom = 3 if bytes(data[:3]) == b"\xef\xbb\xbf" else 0
    try:
        text = bytes(data[bom:]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"JSON header is not UTF-8: {exc.reason}", bom + exc.start, "header",
                            data) from None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        pos = getattr(exc, "pos", None)
        pos = bom + len(text[:pos].encode("utf-8")) if pos is not None else None
        raise ProtocolError(f"JSON header is not valid JSON: {exc}", pos, "header", data) from None
    except RecursionError:
        raise ProtocolError("JSON header is nested too deeply", 0, "header", data) from None
    if not isinstance(obj, dict):
        raise ProtocolError("JSON header is not an object", 0, "header", data)
    if "code" not in obj:
        raise ProtocolError("JSON header has no 'code'", 0, "header", data)
    ext = obj.get("extFields")
    if ext is not None:
        if not isinstance(ext, dict):
            raise ProtocolError("JSON header 'extFields' is not an object", 0, "header", data)
        ext = {k: v if v.__class__ is str else _field_text(v) for k, v in ext.items()}
    remark = obj.get("remark")
    if isinstance(remark, (dict, list)):
        raise ProtocolError("JSON header 'remark' is not a string", 0, "header", data)
    return RemotingCommand(
        code=_json_int(obj, "code", 0, data), ext_fields=ext, body=body,
        flag=_json_int(obj, "flag", 0, data), opaque=_json_int(obj, "opaque", 0, data),
        language=str(obj.get("language", "OTHER")), version=_json_int(obj, "version", 0, data),
        remark=None if remark is None else _field_text(remark),
        serialize_type=SerializeType.JSON)


# --------------------------------------------------------------------------------------------
# ROCKETMQ binary header


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    if not (-0x8000 <= cmd.code <= 0x7FFF and -0x8000 <= cmd.version <= 0x7FFF):
        raise ValueError(f"code {cmd.code} and version {cmd.version} must fit the ROCKETMQ "
                         "header's 16-bit fields; send such requests with a JSON header")
    if _native_codec is not None:
        return _native_codec.encode_binary_header(
            cmd.code, LANGUAGE_CODES.get(cmd.language, 7), cmd.version, cmd.opaque, cmd.flag,
            cmd.remark, cmd.ext_fields)
    return _encode_binary_header_py(cmd)


def _encode_binary_header_py(cmd: RemotingCommand) -> bytes:
    """The pure-Python encoder (the reference for native/client/rmq_header.c)."""
    out = bytearray(_BIN_FIXED.pack(cmd.code, LANGUAGE_CODES.get(cmd.language, 7), cmd.version,
                                    cmd.opaque, cmd.flag))
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    out += _INT.pack(len(remark)) + remark
    ext = bytearray()
    for key, value in (cmd.ext_fields or {}).items():
        if key is None or value is None:
            continue
        k = key.encode("utf-8")
        v = value.encode("utf-8")
        ext += struct.pack(">h", len(k)) + k + _INT.pack(len(v)) + v
    out += _INT.pack(len(ext)) + ext
    return bytes(out)


def decode_binary_header(data: bytes, body: bytes = b"") -> RemotingCommand:
    if _native_codec is not None:
        fields = _native_codec.decode_binary_header(data)
        if fields is not None:
            code, lang, version, opaque, flag, remark, ext = fields
            return RemotingCommand(code=code, ext_fields=ext, body=body, flag=flag,
                                   opaque=opaque,
                                   language=LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER",
                                   version=version, remark=remark,
                                   serialize_type=SerializeType.ROCKETMQ)
        # malformed: the Python decoder names the fault
    return _decode_binary_header_py(data, body)


def _decode_binary_header_py(data: bytes, body: bytes = b"") -> RemotingCommand:
    """The pure-Python decoder (the reference for native/client/rmq_header.c)."""
    n = len(data)
    if n < _BIN_FIXED.size + 8:
        raise ProtocolError(f"ROCKETMQ header is {n} bytes, shorter than its fixed part (21)",
                            n, "header", data)
    code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(data, 0)
    pos = _BIN_FIXED.size
    remark_len = _INT.unpack_from(data, pos)[0]
    pos += 4
    if remark_len < 0 or pos + remark_len > n:
        raise ProtocolError(f"ROCKETMQ header remark length {remark_len} overruns the header",
                            pos - 4, "header", data)
    remark = _utf8(data, pos, remark_len) if remark_len else None
    pos += remark_len
    if pos + 4 > n:
        raise ProtocolError("ROCKETMQ header ends before the extFields length", pos, "header",
                            data)
    ext_len = _INT.unpack_from(data, pos)[0]
    pos += 4
    if ext_len < 0 or pos + ext_len != n:
        raise ProtocolError(f"ROCKETMQ header extFields length {ext_len} does not match the "
                            f"{n - pos} bytes left", pos - 4, "header", data)
    ext: Dict[str, str] = {}
    while pos < n:
        if pos + 2 > n:
            raise ProtocolError("extFields entry cut short", pos, "header", data)
        klen = struct.unpack_from(">h", data, pos)[0]
        if klen < 0 or pos + 2 + klen + 4 > n:
            raise ProtocolError(f"extFields key length {klen} overruns the header", pos,
                                "header", data)
        key = _utf8(data, pos + 2, klen)
        pos += 2 + klen
        vlen = _INT.unpack_from(data, pos)[0]
        if vlen < 0 or pos + 4 + vlen > n:
            raise ProtocolError(f"extFields value length {vlen} overruns the header", pos,
                                "header", data)
        ext[key] = _utf8(data, pos + 4, vlen)
        pos += 4 + vlen
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code=code, ext_fields=ext, body=body, flag=flag, opaque=opaque,
                           language=language, version=version, remark=remark,
                           serialize_type=SerializeType.ROCKETMQ)


def _utf8(data: bytes, pos: int, length: int) -> str:
    try:
        return bytes(data[pos:pos + length]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"header string is not UTF-8: {exc.reason}", pos + exc.start,
                            "header", data) from None


# --------------------------------------------------------------------------------------------
# Frames


def encode_frame_head(cmd: RemotingCommand, serialize_type: Optional[int] = None) -> bytes:
    """Everything of the frame before its body: write it, then ``cmd.body``, to send a large
    body without copying it into one buffer first."""
    ser = cmd.serialize_type if serialize_type is None else serialize_type
    header = encode_binary_header(cmd) if ser == SerializeType.ROCKETMQ else encode_json_header(cmd)
    return b"".join((_UINT.pack(4 + len(header) + len(cmd.body or b"")),
                     _UINT.pack((int(ser) << 24) | len(header)), header))


def encode_frame(cmd: RemotingCommand, serialize_type: Optional[int] = None) -> bytes:
    """The whole frame, length prefix included."""
    head = encode_frame_head(cmd, serialize_type)
    return head + cmd.body if cmd.body else head


def decode_payload(payload: bytes) -> RemotingCommand:
    """Decode a frame without its 4-byte length prefix."""
    return _decode_payload(payload, 0)


def _decode_payload(data, start: int) -> RemotingCommand:
    """Decode ``data[start:]`` (a frame after its length prefix); error positions are
    positions in ``data``, so a caller that passes the whole frame gets frame positions."""
    n = len(data) - start
    if n < 4:
        raise ProtocolError(f"frame of {n} bytes is too short for its header-length word", start,
                            "frame", data)
    word = _UINT.unpack_from(data, start)[0]
    ser, hlen = word >> 24, word & 0xFFFFFF
    if 4 + hlen > n:
        raise ProtocolError(f"header length {hlen} overruns the {n}-byte frame", start, "frame",
                            data)
    header = bytes(data[start + 4:start + 4 + hlen])
    body = bytes(data[start + 4 + hlen:])
    if ser == SerializeType.JSON:
        return decode_json_header(header, body)
    if ser == SerializeType.ROCKETMQ:
        return decode_binary_header(header, body)
    raise ProtocolError(f"unknown header serialization type {ser}", start, "frame", data)


def decode_frame(frame: bytes) -> RemotingCommand:
    """Decode one complete frame, length prefix included; the length must match exactly."""
    if len(frame) < 4:
        raise ProtocolError(f"frame of {len(frame)} bytes has no length prefix", 0, "frame", frame)
    length = _UINT.unpack_from(frame, 0)[0]
    if length + 4 != len(frame):
        raise ProtocolError(f"length prefix says {length} bytes follow but {len(frame) - 4} do",
                            0, "frame", frame)
    return _decode_payload(frame, 4)


class FrameDecoder:
    """Incremental decoder for a byte stream: feed bytes, get whole commands.

    Rejects frames over ``max_frame`` bytes before buffering them, as RocketMQ does.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES):
        self._buf = bytearray()
        self._max = max_frame
        self.stream_offset = 0  # bytes consumed so far, for error positions

    def feed(self, data: bytes) -> List[RemotingCommand]:
        buf = self._buf
        buf += data
        out: List[RemotingCommand] = []
        pos = 0
        end = len(buf)
        view = memoryview(buf)  # slices of it are copied once, into the header and the body
        split = _native_split
        try:
            while end - pos >= 4:
                if split is not None and end - pos > 4 and buf[pos + 4] == 1:
                    # the C splitter takes the leading ROCKETMQ frames (serialization byte 1)
                    # and stops at anything else (a JSON header, an incomplete or malformed
                    # frame): that is decoded or rejected below, and the splitter tries again
                    # at the next ROCKETMQ frame
                    got, used = split(buf, pos, self._max)
                    if used:
                        out += got
                        pos += used
                        if end - pos < 4:
                            break
                length = _UINT.unpack_from(buf, pos)[0]
                if length + 4 > self._max or length < 4:
                    raise ProtocolError(f"frame length {length} is outside "
                                        f"[4, {self._max - 4}]", self.stream_offset + pos,
                                        "stream", bytes(buf[pos:pos + 16]),
                                        data_offset=self.stream_offset + pos)
                if end - pos - 4 < length:
                    break
                try:
                    out.append(_decode_payload(view[pos:pos + 4 + length], 4))
                except ProtocolError as exc:
                    exc.args = (f"{exc.args[0]} [frame at stream byte "
                                f"{self.stream_offset + pos}]",)
                    raise
                pos += 4 + length
        finally:
            view.release()
        if pos:
            del buf[:pos]
            self.stream_offset += pos
        return out

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet make a whole frame."""
        return len(self._buf)

    def take(self) -> bytes:
        """Hand the buffered bytes to another reader of the stream (the native pull loop),
        which gives back what it does not frame with :meth:`feed`."""
        data = bytes(self._buf)
        del self._buf[:]
        return data

    def skip(self, consumed: int) -> None:
        """Count ``consumed`` bytes another reader framed, so error positions stay right."""
        self.stream_offset += consumed


if _native_codec is not None and not accelerator.FORCE_PURE_PYTHON:
    _native_codec.frame_setup(RemotingCommand, tuple(LANGUAGES), SerializeType.ROCKETMQ)
    _native_split = _native_codec.split_frames
