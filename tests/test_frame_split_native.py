"""FrameDecoder's C splitter (native/client/rmq_header.c split_frames) against the Python path.

The Python path is the reference: the same streams, cut at random places, go through a decoder
with the splitter and one without it, and every feed must give the same commands (all fields,
types included) or the same ProtocolError (message, position, where), and the same
``stream_offset`` and ``pending`` after it."""
from __future__ import annotations

import random
import struct

import pytest

from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.protocol import frame as frame_codec
from rocketmq_spark.client.protocol.codes import LANGUAGES, SerializeType
from rocketmq_spark.client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame

pytestmark = pytest.mark.skipif(frame_codec._native_split is None,
                                reason="the C accelerator lacks split_frames")

TEXTS = ["", "a", "topic", "héllo", "日本", "x" * 300, "\U0001F600", "k=v;"]


def random_command(rng: random.Random) -> RemotingCommand:
    ser = rng.choice([SerializeType.ROCKETMQ] * 3 + [SerializeType.JSON])
    ext = None if ser == SerializeType.JSON and rng.random() < 0.2 else {
        rng.choice(TEXTS) + str(i): rng.choice(TEXTS) for i in range(rng.choice([0, 0, 1, 3, 8]))}
    return RemotingCommand(
        code=rng.randint(-0x8000, 0x7FFF), ext_fields=ext,
        body=rng.choice([b"", b"x", bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 90)))]),
        flag=rng.choice([0, 1, 2, 3, -1, 0x7FFFFFFF]), opaque=rng.randint(-2 ** 31, 2 ** 31 - 1),
        language=rng.choice(LANGUAGES), version=rng.randint(-0x8000, 0x7FFF),
        remark=rng.choice([None, None, "", "bad", "ünïcode remark"]), serialize_type=ser)


def corrupt(rng: random.Random, data: bytes) -> bytes:
    """The stream with a few bytes changed: lengths, header bytes, UTF-8, anything."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(out))
        out[pos] = rng.choice([0x00, 0xFF, 0x80, 0xC3, 0x7F, 0x01, rng.getrandbits(8)])
    return bytes(out)


def raw_frame(header: bytes, ser: int = 1, body: bytes = b"") -> bytes:
    return (struct.pack(">I", 4 + len(header) + len(body))
            + struct.pack(">I", (ser << 24) | len(header)) + header + body)


def run(data: bytes, cuts, native: bool, monkeypatch, max_frame: int = 1 << 24):
    """What a decoder gives for ``data`` fed in the pieces ``cuts`` makes: per feed, the
    commands as field tuples or the error; the decoder stops at its first error, as the
    connection does."""
    split = frame_codec._native_codec.split_frames if native else None
    monkeypatch.setattr(frame_codec, "_native_split", split)
    decoder = FrameDecoder(max_frame)
    results = []
    bounds = [0] + sorted(cuts) + [len(data)]
    for a, b in zip(bounds, bounds[1:]):
        try:
            cmds = decoder.feed(data[a:b])
        except ProtocolError as exc:
            results.append(("error", str(exc), exc.position, exc.where, exc.excerpt))
            break
        results.append([(type(c), tuple((k, type(v), v) for k, v in vars(c).items()))
                        for c in cmds])
    results.append((decoder.stream_offset, decoder.pending))
    return results


def compare(data: bytes, cuts, monkeypatch, max_frame: int = 1 << 24):
    python = run(data, cuts, False, monkeypatch, max_frame)
    native = run(data, cuts, True, monkeypatch, max_frame)
    assert native == python
    return python


def test_native_splitter_takes_rocketmq_frames_and_stops_at_json():
    cmds = [RemotingCommand(code=10, ext_fields={"a": "b"}, body=b"x", opaque=i,
                            serialize_type=SerializeType.ROCKETMQ) for i in range(3)]
    json_cmd = RemotingCommand(code=11, ext_fields={"c": "d"}, opaque=9)
    data = b"".join(encode_frame(c) for c in cmds) + encode_frame(json_cmd) + encode_frame(cmds[0])
    got, used = frame_codec._native_codec.split_frames(data, 0, 1 << 24)
    assert got == cmds and used == sum(len(encode_frame(c)) for c in cmds)
    assert [vars(c) for c in got] == [vars(c) for c in cmds]
    assert frame_codec._native_codec.split_frames(data, used, 1 << 24) == ([], 0)  # the JSON frame
    assert frame_codec.FrameDecoder().feed(data) == cmds + [json_cmd, cmds[0]]


def test_random_streams_decode_the_same(monkeypatch):
    rng = random.Random(11)
    for _ in range(300):
        data = b"".join(encode_frame(random_command(rng)) for _ in range(rng.randint(1, 12)))
        cuts = [rng.randrange(len(data) + 1) for _ in range(rng.choice([0, 1, 3, 10]))]
        result = compare(data, cuts, monkeypatch)
        assert result[-1] == (len(data), 0)


def test_corrupted_streams_fail_the_same(monkeypatch):
    rng = random.Random(12)
    errors = 0
    for _ in range(1500):
        data = b"".join(encode_frame(random_command(rng)) for _ in range(rng.randint(1, 6)))
        data = corrupt(rng, data)
        cuts = [rng.randrange(len(data) + 1) for _ in range(rng.choice([0, 2, 6]))]
        result = compare(data, cuts, monkeypatch, max_frame=rng.choice([1 << 24, 200]))
        errors += any(r[0] == "error" for r in result[:-1] if isinstance(r, tuple))
    assert errors > 300  # the corruptions do reach the error paths


@pytest.mark.parametrize("header", [
    b"",                                                                       # too short
    struct.pack(">hBhii", 1, 0, 1, 1, 0) + struct.pack(">i", 5) + b"ab",      # remark overruns
    struct.pack(">hBhii", 1, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 3),
    struct.pack(">hBhii", 1, 0, 1, 1, 0) + struct.pack(">i", 2) + b"\xc3\x28"
    + struct.pack(">i", 0),                                                    # remark not UTF-8
    struct.pack(">hBhii", 1, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 7)
    + struct.pack(">h", 1) + b"\xff" + struct.pack(">i", 0),                   # key not UTF-8
    struct.pack(">hBhii", 1, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 6)
    + struct.pack(">h", -1) + struct.pack(">i", 0),                            # negative key length
    struct.pack(">hBhii", 1, 200, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 0),
])
def test_hand_made_headers(monkeypatch, header):
    good = encode_frame(RemotingCommand(code=1, ext_fields={},
                                        serialize_type=SerializeType.ROCKETMQ))
    for data in (good + raw_frame(header) + good, good + raw_frame(header, 2) + good,
                 good + raw_frame(header, body=b"body") + good):
        compare(data, [], monkeypatch)
        compare(data, [len(good) + 3], monkeypatch)


def test_frame_lengths_out_of_range(monkeypatch):
    good = encode_frame(RemotingCommand(code=1, ext_fields={"k": "v"},
                                        serialize_type=SerializeType.ROCKETMQ))
    for bad in (struct.pack(">I", 0), struct.pack(">I", 3), struct.pack(">I", 0xFFFFFFFF),
                struct.pack(">II", 4, 0x01000020)):
        compare(good + bad + good, [], monkeypatch)
    compare(good * 3, [], monkeypatch, max_frame=len(good) - 1)
    compare(good * 3, [], monkeypatch, max_frame=len(good))


def test_many_distinct_short_texts_decode_the_same(monkeypatch):
    # the C decoder reuses short ASCII strings it has seen (a small cache): thousands of
    # distinct keys and values, alike in length and first letters, must still come out exact
    rng = random.Random(13)
    texts = [f"k{rng.randrange(10 ** rng.randint(1, 6))}" for _ in range(6000)]
    cmds = [RemotingCommand(code=1, ext_fields={texts[i]: texts[-1 - i], "q": texts[i // 2]},
                            remark=texts[i // 3], opaque=i, serialize_type=SerializeType.ROCKETMQ)
            for i in range(3000)]
    data = b"".join(encode_frame(c) for c in cmds)
    result = compare(data, [len(data) // 3], monkeypatch)
    assert sum(len(r) for r in result[:-1]) == len(cmds)
    assert FrameDecoder().feed(data) == cmds
