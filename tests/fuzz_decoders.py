"""Fuzz harness for the decoders of bytes that come from the network.

Every input goes to each decoder a broker or name server can reach:

* frames: ``FrameDecoder().feed`` (whole, and split in two and in three), ``decode_frame``,
  ``decode_payload``;
* pull bodies: ``decode_messages`` (with and without the CRC check), ``decode_columns`` with the
  C accelerator and with its numpy twin (``pull_decode.FORCE_PURE_PYTHON``), ``decode_batch``;
* route bodies: ``route.loads_lenient``, ``TopicRouteData.from_json``, ``ClusterInfo.from_json``.

The only acceptable outcomes are success or the project's own :class:`ProtocolError` (and its
subclasses), whose ``position``, when set, is an ``int`` inside the input. Anything else is a
finding: another exception, a hang, a crash of the C code, the C decoder and the numpy twin
disagreeing (different rows, or one failing where the other succeeds, or failing at different
bytes), a split byte stream decoding differently from the whole one, or the scalar decoder and
the column decoder disagreeing on whether a pull body is valid.

Run it with atheris (libFuzzer flags pass through)::

    python tests/fuzz_decoders.py -max_total_time=60 [CORPUS_DIR ...]

The seeds (valid frames and pull bodies built with the project's encoders, the genuine frames
of the RocketMQ 4.9.8 capture, batch and route bodies) are written into the first corpus
directory given, or into a temporary one. ``tests/test_fuzz.py`` runs this harness (slow) and
the same checks under hypothesis (always).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

HERE = Path(__file__).resolve().parent
CAPTURE_FRAMES = Path(os.environ.get(
    "ROCKETMQ_CAPTURE_DIR", HERE / "data" / "capture-rocketmq-4.9.8")) / "frames.jsonl"

atheris = None
if __name__ == "__main__":  # under atheris; the hypothesis smoke test only imports this module
    try:
        import atheris
    except ImportError:
        pass

if atheris is not None:  # instrument our modules for coverage
    with atheris.instrument_imports(include=["rocketmq_spark"]):
        from rocketmq_spark.client.errors import ProtocolError
        from rocketmq_spark.client.protocol import pull_decode, frame, message, route
else:
    from rocketmq_spark.client.errors import ProtocolError
    from rocketmq_spark.client.protocol import pull_decode, frame, message, route


class GuardedBuffer:
    """Puts an input so that it ends exactly where a PROT_NONE page begins: a read past its
    end by the C decoder is a segfault (a crash the fuzzer reports), not a silent overread."""

    def __init__(self, capacity: int = 1 << 20):
        import ctypes
        import mmap

        page = mmap.PAGESIZE
        self.capacity = (capacity + page - 1) // page * page
        self._mm = mmap.mmap(-1, self.capacity + page,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor = ctypes.c_char.from_buffer(self._mm)  # keeps the mapping alive
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.mprotect(ctypes.addressof(self._anchor) + self.capacity, page, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")

    def place(self, data: bytes):
        """A read-only view of ``data`` ending at the guard page (``data`` itself if large)."""
        n = len(data)
        if n > self.capacity:
            return data
        self._mm[self.capacity - n:self.capacity] = data
        return memoryview(self._mm)[self.capacity - n:self.capacity].toreadonly()


_guard: Optional[GuardedBuffer] = None


def guarded(data: bytes):
    global _guard
    if _guard is None:
        try:
            _guard = GuardedBuffer()
        except (OSError, AttributeError, ValueError):  # not Linux-like: no guard page
            return data
    return _guard.place(data)


class Finding(AssertionError):
    """A decoder did something other than succeed or raise a positioned ProtocolError."""


# ------------------------------------------------------------------------------------ checks


def _expect(name: str, data: bytes, call: Callable[[], object]):
    """``call()``'s result, or the ProtocolError it raised (checked); anything else is a
    Finding that names the decoder."""
    try:
        return call()
    except ProtocolError as exc:
        position = exc.position
        if position is not None and (type(position) is not int
                                     or not 0 <= position <= len(data)):
            raise Finding(f"{name}: ProtocolError position {position!r} "
                          f"({type(position).__name__}) outside [0, {len(data)}]: {exc}") from exc
        str(exc)  # the message must format
        return exc
    except Exception as exc:
        raise Finding(f"{name} raised {type(exc).__name__}: {exc!r}"[:2000]) from exc


def _commands(cmds) -> list:
    return [(c.code, c.flag, c.opaque, c.language, c.version, c.remark, c.serialize_type,
             c.ext_fields, bytes(c.body)) for c in cmds]


def _feed(data: bytes, cuts: List[int]):
    """Feed ``data`` to one FrameDecoder in pieces cut at ``cuts``: (commands, pending, error)."""
    decoder = frame.FrameDecoder()
    out = []
    bounds = [0] + cuts + [len(data)]
    for a, b in zip(bounds, bounds[1:]):
        result = _expect("FrameDecoder.feed", data, lambda: decoder.feed(data[a:b]))
        if isinstance(result, ProtocolError):
            return out, None, result
        out.extend(result)
    return out, decoder.pending, None


def check_frames(data: bytes) -> None:
    whole, pending, error = _feed(data, [])
    n = len(data)
    h = int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")
    for cuts in ([h % (n + 1)], sorted({h % (n + 1), (h >> 16) % (n + 1)})):
        split, split_pending, split_error = _feed(data, cuts)
        if (error is None) != (split_error is None):
            raise Finding(f"FrameDecoder: whole feed {'failed' if error else 'succeeded'} but "
                          f"feeding in pieces cut at {cuts} "
                          f"{'failed' if split_error else 'succeeded'}: {error or split_error}")
        if error is None and (_commands(split) != _commands(whole) or split_pending != pending):
            raise Finding(f"FrameDecoder: pieces cut at {cuts} decode to other commands")
        if error is not None and (split_error.position, type(split_error)) != (
                error.position, type(error)):
            raise Finding(f"FrameDecoder: pieces cut at {cuts} fail elsewhere: {split_error} "
                          f"/ whole: {error}")
    one = _expect("decode_frame", data, lambda: frame.decode_frame(data))
    if (not isinstance(one, ProtocolError) and error is None
            and _commands(whole) != _commands([one])):
        raise Finding("decode_frame and FrameDecoder disagree on one whole frame")
    _expect("decode_payload", data, lambda: frame.decode_payload(data))


def _columns(data: bytes, pure: bool, verify_crc: bool, slim: bool):
    saved = pull_decode.FORCE_PURE_PYTHON
    pull_decode.FORCE_PURE_PYTHON = pure
    try:
        return _expect(f"decode_columns({'numpy' if pure else 'C'}, verify_crc={verify_crc})",
                       data, lambda: pull_decode.decode_columns(
                           data if pure else guarded(data), verify_crc=verify_crc,
                           properties=not slim, offset_ids=not slim))
    finally:
        pull_decode.FORCE_PURE_PYTHON = saved


def _rows(result) -> Optional[list]:
    return None if isinstance(result, ProtocolError) else result.to_pylist()


def check_pull_body(data: bytes) -> None:
    slim = bool(data) and data[-1] & 1  # sometimes leave properties and offset ids out
    for verify_crc in (True, False):
        scalar = _expect("decode_messages", data, lambda: message.decode_messages(
            data, verify_crc=verify_crc))
        native = _columns(data, False, verify_crc, slim) if pull_decode._native else None
        pure = _columns(data, True, verify_crc, slim)
        for other, name in ((native, "C"), (pure, "numpy")):
            if other is None:
                continue
            scalar_failed = isinstance(scalar, ProtocolError)
            if isinstance(other, ProtocolError) != scalar_failed:
                raise Finding(f"decode_messages {'failed' if scalar_failed else 'succeeded'} "
                              f"but decode_columns ({name}, verify_crc={verify_crc}) did not: "
                              f"{scalar if scalar_failed else other}")
            if not isinstance(other, ProtocolError):
                got = [(r["queue_offset"], r["body"], r["topic"]) for r in other.to_pylist()]
                want = [(m.queue_offset, m.body, m.topic) for m in scalar]
                if got != want:
                    raise Finding(f"decode_columns ({name}) and decode_messages give other "
                                  f"rows (verify_crc={verify_crc})")
        if native is None:
            continue
        if _rows(native) != _rows(pure):
            raise Finding(f"the C decoder and the numpy twin disagree (verify_crc={verify_crc}, "
                          f"slim={slim}): C {_outcome(native)} / numpy {_outcome(pure)}")
        if isinstance(native, ProtocolError) and native.position != pure.position:
            raise Finding(f"the C decoder and the numpy twin blame different bytes: C "
                          f"{native} / numpy {pure}")
    _expect("decode_batch", data, lambda: message.decode_batch(data))


def _outcome(result) -> str:
    if isinstance(result, ProtocolError):
        return f"raised {result}"
    return f"{result.num_rows} rows"


def check_route(data: bytes) -> None:
    _expect("loads_lenient", data, lambda: route.loads_lenient(data))
    _expect("TopicRouteData.from_json", data, lambda: route.TopicRouteData.from_json(data))
    _expect("ClusterInfo.from_json", data, lambda: route.ClusterInfo.from_json(data))


def check_one(data: bytes) -> None:
    """Every check on one input; raises :class:`Finding` on a bug."""
    data = bytes(data)
    check_frames(data)
    check_pull_body(data)
    check_route(data)


def TestOneInput(data: bytes) -> None:  # noqa: N802 - atheris's name
    check_one(data)


# ------------------------------------------------------------------------------------- seeds


def _records() -> List[bytes]:
    encode = message.encode_stored_message
    props = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x017F0000010001\x02CLUSTER\x01c"
    out = [
        encode(topic="T", queue_id=0, queue_offset=0, physical_offset=0, body=b"hello",
               properties=props, born_timestamp=1, store_timestamp=2),
        encode(topic="T", queue_id=1, queue_offset=7, physical_offset=500, body=b"",
               properties=""),
        encode(topic="TopicV2", queue_id=2, queue_offset=8, physical_offset=900,
               body=b"x" * 40, properties="TAGS\x01a", magic=message.MAGIC_V2),
        encode(topic="T6", queue_id=3, queue_offset=9, physical_offset=1000, body=b"v6",
               properties="KEYS\x01k\x02KEYS\x01k2\x02", born_host="[::1]:1234",
               store_host="[fe80::1]:10911"),
        encode(topic="Tü", queue_id=0, queue_offset=10, physical_offset=1200,
               body="ünïcode".encode(), properties="TAGS\x01ü\x02TAGS\x01"),
    ]
    for kind in (message.COMPRESSION_ZLIB, message.COMPRESSION_LZ4, message.COMPRESSION_ZSTD):
        body, flag = message.compress_body(b"compressible " * 20, kind)
        out.append(encode(topic="TC", queue_id=0, queue_offset=11 + kind, physical_offset=2000,
                          body=body, sys_flag=flag, properties="TAGS\x01z"))
    return out


def _frames() -> List[bytes]:
    RC = frame.RemotingCommand
    S = frame.SerializeType
    records = _records()
    pull = RC(code=0, ext_fields={"nextBeginOffset": "3", "minOffset": "0", "maxOffset": "9",
                                  "suggestWhichBrokerId": "0"}, body=b"".join(records[:3]),
              flag=1, opaque=42, language="JAVA")
    request = RC(code=11, ext_fields={"consumerGroup": "g", "topic": "T", "queueId": "0",
                                      "queueOffset": "0", "maxMsgNums": "32"}, opaque=7)
    error = RC(code=1, ext_fields=None, remark="boom ünïcode", flag=1, opaque=3)
    route_body = RC(code=0, body=_routes()[1], flag=1, opaque=5)
    out = []
    for cmd in (pull, request, error, route_body):
        out.append(frame.encode_frame(cmd, S.JSON))
        out.append(frame.encode_frame(cmd, S.ROCKETMQ))
    out.append(out[0] + out[3])  # two frames back to back
    return out


def _routes() -> List[bytes]:
    data = route.TopicRouteData(
        queue_datas=[route.QueueData("broker-a", 4, 4, 6, 0)],
        broker_datas=[route.BrokerData("broker-a", {0: "127.0.0.1:10911", 1: "127.0.0.1:10912"},
                                       "DefaultCluster")])
    cluster = route.ClusterInfo({"broker-a": data.broker_datas[0]},
                                {"DefaultCluster": ["broker-a"]})
    return [data.to_json(True), data.to_json(False), cluster.to_json()]


def _capture_frames() -> List[bytes]:
    if not CAPTURE_FRAMES.is_file():
        return []
    out = []
    with open(CAPTURE_FRAMES, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            header = r["header_text"].encode("utf-8")
            word = ({"JSON": 0, "ROCKETMQ": 1}[r["serialize"]] << 24) | r["header_len"]
            out.append(struct.pack(">I", r["frame_len"] - 4) + struct.pack(">I", word) + header
                       + bytes.fromhex(r["body_hex"]))
    return out


def seeds() -> List[bytes]:
    """Valid inputs for every decoder; a fuzzer mutates these."""
    records = _records()
    out = list(records) + [b"".join(records), b"".join(records[:3])]
    out.append(message.encode_batch([message.BatchEntry(b"a", "TAGS\x01x"),
                                     message.BatchEntry(b"", "")]))
    out += _frames() + _routes() + _capture_frames()
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


# Tokens for libFuzzer's -dict: JSON oddities Python accepts, the stored-message magics,
# property separators and names, the header keys the decoders look at.
DICTIONARY = [
    b"Infinity", b"-Infinity", b"NaN", b"1e999", b"-0", b"null", b"true", b"false",
    b"\\u0000", b"\\ud800", b"\xef\xbb\xbf", b"{", b"}", b"[", b"]", b'":', b",",
    b'"code"', b'"extFields"', b'"remark"', b'"flag"', b'"opaque"', b'"version"',
    b'"language"', b'"queueDatas"', b'"brokerDatas"', b'"brokerAddrs"', b'"brokerName"',
    b'"readQueueNums"', b'"brokerAddrTable"', b'"clusterAddrTable"', b"{0:",
    b"\xda\xa3\x20\xa7", b"\xda\xa3\x20\xab", b"\x00\x00\x00\x5b", b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00", b"\xff\xff\xff\xff", b"\x01", b"\x02", b"TAGS\x01",
    b"KEYS\x01", b"UNIQ_KEY\x01", b"\x02TAGS\x01",
]


def write_dictionary(path: Path) -> None:
    path.write_text("".join(
        'kw%d="%s"\n' % (i, "".join(chr(c) if 32 <= c < 127 and c not in (34, 92)
                                    else "\\x%02x" % c for c in token))
        for i, token in enumerate(DICTIONARY)))


def write_seeds(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    items = seeds()
    for s in items:
        (folder / f"seed-{hashlib.sha1(s).hexdigest()[:16]}").write_bytes(s)
    return len(items)


def main(argv: List[str]) -> None:
    if atheris is None:
        sys.exit("atheris is not installed (pip install atheris; Linux x86_64)")
    corpora = [a for a in argv[1:] if not a.startswith("-")]
    if not corpora:
        corpus = tempfile.mkdtemp(prefix="rmq-fuzz-corpus-")
        argv = argv + [corpus]
        corpora = [corpus]
    count = write_seeds(Path(corpora[0]))
    if not any(a.startswith("-dict=") for a in argv):
        dictionary = Path(tempfile.mkdtemp(prefix="rmq-fuzz-dict-")) / "decoders.dict"
        write_dictionary(dictionary)
        argv = argv + [f"-dict={dictionary}"]
    print(f"fuzz_decoders: {count} seeds in {corpora[0]}; C accelerator "
          f"{'on' if pull_decode._native else 'MISSING'}", flush=True)
    atheris.Setup(argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
