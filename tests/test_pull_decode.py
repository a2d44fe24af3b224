"""The bulk decoder (pull body -> Arrow columns): the C accelerator and its numpy twin must give
exactly what the one-message-at-a-time decoder gives, and fail where it fails."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.protocol import pull_decode
from rocketmq_spark.client.errors import MessageDecodeError
from rocketmq_spark.client.protocol.message import (
    SYSFLAG_COMPRESSED, compress_body, decode_messages, encode_stored_message)
from rocketmq_spark.client.protocol.properties import decode_properties

pytestmark = pytest.mark.filterwarnings("ignore")

DECODERS = ["numpy"] + (["native"] if pull_decode._native is not None else [])


@pytest.fixture(params=DECODERS)
def decoder(request, monkeypatch):
    monkeypatch.setattr(pull_decode, "FORCE_PURE_PYTHON", request.param == "numpy")
    return request.param


def test_the_accelerator_is_built_here():
    """CI builds the C extension; if this fails the wheel lost it (the fallback still works)."""
    assert pull_decode._native is not None


def expected_rows(body: bytes):
    return [{
        "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "physical_offset": m.physical_offset, "flag": m.flag,
        "sys_flag": m.sys_flag, "born_timestamp": m.born_timestamp,
        "born_host": m.born_host, "store_timestamp": m.store_timestamp,
        "store_host": m.store_host, "reconsume_times": m.reconsume_times, "body": m.body,
        "properties": m.properties,
        "tags": m.tags, "keys": m.keys, "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id,
    } for m in decode_messages(body)]


def compare(body: bytes):
    rows = pull_decode.decode_columns(body).to_pylist()
    want = expected_rows(body)
    assert len(rows) == len(want)
    for row, exp in zip(rows, want):
        row["properties"] = decode_properties(row["properties"])
        assert row == exp


def test_genuine_pull_bodies(decoder, capture):
    bodies = [body for body in (capture.body(r) for r in capture.responses_to(11)) if body]
    assert len(bodies) == 11
    for body in bodies:
        compare(body)
    # all at once: several pull bodies concatenated decode as one batch
    compare(b"".join(bodies))


hosts_v4 = st.builds(lambda a, p: f"{a[0]}.{a[1]}.{a[2]}.{a[3]}:{p}",
                     st.tuples(*[st.integers(0, 255)] * 4), st.integers(0, 65535))
hosts_v6 = st.sampled_from(["[::1]:10911", "[fe80::1:2]:1", "[2001:db8::ff00:42:8329]:65535"])
prop_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
                    max_size=12)


@st.composite
def records(draw):
    body = draw(st.binary(max_size=600))
    sys_flag = draw(st.sampled_from([0, 0x2, 0x8]))
    if draw(st.booleans()) and body:
        body, bits = compress_body(body, draw(st.sampled_from([0, 1, 2, 3])))
        sys_flag |= bits
    props = {}
    for name in draw(st.lists(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "WAIT"]),
                              max_size=6)):
        props[name] = draw(prop_text)
    text = "\x02".join(f"{k}\x01{v}" for k, v in props.items())
    if draw(st.booleans()) and props:  # a repeated name: the later non-empty value must win
        text += f"\x02{next(iter(props))}\x01{draw(prop_text)}"
    return encode_stored_message(
        topic=draw(st.text(min_size=1, max_size=200).filter(lambda t: len(t.encode()) < 300)),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        queue_offset=draw(st.integers(0, 2**62)), physical_offset=draw(st.integers(0, 2**62)),
        body=body, properties=text, flag=draw(st.integers(-2**31, 2**31 - 1)),
        sys_flag=sys_flag, born_timestamp=draw(st.integers(0, 2**45)),
        born_host=draw(st.one_of(hosts_v4, hosts_v6)),
        store_timestamp=draw(st.integers(0, 2**45)),
        store_host=draw(st.one_of(hosts_v4, hosts_v6)),
        reconsume_times=draw(st.integers(0, 16)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records(), max_size=8))
def test_random_bodies_match_the_scalar_decoder(recs):
    body = b"".join(recs)
    for force in (False, True):
        pull_decode.FORCE_PURE_PYTHON = force
        try:
            compare(body)
        finally:
            pull_decode.FORCE_PURE_PYTHON = False


def sample_body(n=5):
    return b"".join(encode_stored_message(
        topic="T", queue_id=1, queue_offset=100 + i, physical_offset=1000 * i,
        body=b"payload %d" % i, properties=f"TAGS\x01t{i}\x02KEYS\x01k{i}",
        born_host="127.0.0.1:1", store_host="127.0.0.1:2") for i in range(n))


@pytest.mark.parametrize("corrupt, message", [
    (lambda b: b[:-3], "does not fit"),                                  # truncated
    (lambda b: b[:4] + b"\xde\xad\xbe\xef" + b[8:], "bad magic"),         # magic
    (lambda b: b[:8] + bytes([b[8] ^ 0x40]) + b[9:], "CRC mismatch"),     # CRC
    (lambda b: b[:84] + b"\x7f\xff\xff\xff" + b[88:], "body length"),     # body length
])
def test_corruption_names_the_bytes(decoder, corrupt, message):
    body = sample_body()
    with pytest.raises(MessageDecodeError) as info:
        pull_decode.decode_columns(corrupt(body))
    assert message in str(info.value)
    assert info.value.position is not None


def test_corrupt_second_record_is_reported_at_its_offset(decoder):
    body = bytearray(sample_body())
    second = len(encode_stored_message(
        topic="T", queue_id=1, queue_offset=100, physical_offset=0, body=b"payload 0",
        properties="TAGS\x01t0\x02KEYS\x01k0", born_host="127.0.0.1:1",
        store_host="127.0.0.1:2"))
    body[second + 8] ^= 0x01  # the second record's CRC
    with pytest.raises(MessageDecodeError) as info:
        pull_decode.decode_columns(bytes(body))
    assert info.value.position == second + 8
    assert info.value.queue_offset == 101


def test_bad_compressed_body_names_the_queue_offset(decoder):
    rec = encode_stored_message(topic="T", queue_id=0, queue_offset=7, physical_offset=0,
                                  body=b"not zlib at all", sys_flag=SYSFLAG_COMPRESSED)
    with pytest.raises(MessageDecodeError) as info:
        pull_decode.decode_columns(rec)
    assert info.value.queue_offset == 7 and "inflate" in str(info.value)


def test_empty_body_is_an_empty_batch(decoder):
    batch = pull_decode.decode_columns(b"")
    assert batch.num_rows == 0 and batch.schema == pull_decode.SCHEMA


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80"])  # overlong, surrogate
def test_invalid_utf8_in_properties_is_named(decoder, bad):
    rec = encode_stored_message(topic="T", queue_id=0, queue_offset=3, physical_offset=0,
                                  body=b"x", properties="TAGS\x01ab\x02KEYS\x01kkk")
    start = rec.index(b"kkk")
    broken = rec[:start] + bad + rec[start + len(bad):]
    with pytest.raises(MessageDecodeError) as info:
        pull_decode.decode_columns(broken)
    assert "UTF-8" in str(info.value)


@pytest.mark.skipif(pull_decode._native is None, reason="the C accelerator is not built")
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=700), offset=st.integers(0, 15), clmul=st.booleans())
def test_native_crc_is_zlibs_crc32_on_both_paths(data, offset, clmul):
    """The carry-less-multiply path (64 bytes and up) and the table path agree with zlib, at any
    alignment."""
    import zlib

    view = memoryview(bytes(offset) + data)[offset:]
    assert pull_decode._native.crc32(view, clmul) == zlib.crc32(data)


@pytest.mark.parametrize("size", [63, 64, 100, 1000, 6000])
def test_a_flipped_bit_in_a_large_body_fails_the_crc(decoder, size):
    body = encode_stored_message(topic="T", queue_id=0, queue_offset=0, physical_offset=0,
                                   body=bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    damaged = bytearray(body)
    damaged[-8] ^= 0x10  # a body byte: after it come 3 body bytes, the topic, the props length
    assert pull_decode.decode_columns(body).num_rows == 1
    with pytest.raises(MessageDecodeError, match="CRC mismatch"):
        pull_decode.decode_columns(bytes(damaged))
