"""Remoting frames: TV1/TV2 (docs/rocketmq-protocol.md §11), JSON and ROCKETMQ headers, the
stream decoder, and what happens to bad bytes."""
from __future__ import annotations

import dataclasses
import json
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.protocol.codes import LANGUAGES, MAX_FRAME_BYTES, SerializeType
from rocketmq_spark.client.protocol.frame import (
    FrameDecoder, RemotingCommand, decode_frame, decode_payload, encode_frame,
    encode_json_header,
)

# ---------------------------------------------------------------- published vectors (§11)

TV1 = bytes.fromhex("""
00 00 00 81 00 00 00 7d 7b 22 63 6f 64 65 22 3a 31 30 35 2c 22 65 78 74 46 69 65 6c 64 73 22 3a
7b 22 74 6f 70 69 63 22 3a 22 54 22 7d 2c 22 66 6c 61 67 22 3a 30 2c 22 6c 61 6e 67 75 61 67 65
22 3a 22 50 59 54 48 4f 4e 22 2c 22 6f 70 61 71 75 65 22 3a 31 2c 22 73 65 72 69 61 6c 69 7a 65
54 79 70 65 43 75 72 72 65 6e 74 52 50 43 22 3a 22 4a 53 4f 4e 22 2c 22 76 65 72 73 69 6f 6e 22
3a 34 30 39 7d""")

TV2 = bytes.fromhex("""
00 00 00 25 01 00 00 21 00 69 03 01 99 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 0c 00 05 74
6f 70 69 63 00 00 00 01 54""")

# The §1.3 example header: TV1's header text.
TV1_HEADER = (b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"PYTHON","opaque":1,'
              b'"serializeTypeCurrentRPC":"JSON","version":409}')

INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
INT16 = st.integers(-2 ** 15, 2 ** 15 - 1)
FAST = settings(max_examples=150, deadline=None)


def route_request() -> RemotingCommand:
    """TV1/TV2's command: GET_ROUTEINFO_BY_TOPIC for topic T."""
    return RemotingCommand(code=105, ext_fields={"topic": "T"}, opaque=1, language="PYTHON",
                           version=409)


def frame(header: bytes, serialize_type: int = 0, body: bytes = b"") -> bytes:
    """A frame around raw header bytes (for feeding the decoder bad headers)."""
    return (struct.pack(">I", 4 + len(header) + len(body))
            + struct.pack(">I", (serialize_type << 24) | len(header)) + header + body)


def binary_header(code=105, language=3, version=409, opaque=1, flag=0, remark=b"",
                  ext=b"", remark_len=None, ext_len=None) -> bytes:
    """A ROCKETMQ header (§1.4) with optionally wrong length fields."""
    return (struct.pack(">hBhii", code, language, version, opaque, flag)
            + struct.pack(">i", len(remark) if remark_len is None else remark_len) + remark
            + struct.pack(">i", len(ext) if ext_len is None else ext_len) + ext)


def ext_entry(key: bytes, value: bytes, key_len=None, value_len=None) -> bytes:
    return (struct.pack(">h", len(key) if key_len is None else key_len) + key
            + struct.pack(">i", len(value) if value_len is None else value_len) + value)


# ---------------------------------------------------------------- TV1 / TV2


def test_tv1_json_request_encodes_byte_exact():
    assert encode_frame(route_request()) == TV1


def test_tv1_header_is_the_reference_example_text():
    assert encode_json_header(route_request()) == TV1_HEADER
    assert TV1[8:] == TV1_HEADER


def test_tv1_decodes_to_its_fields():
    cmd = decode_frame(TV1)
    assert cmd == route_request()
    assert (cmd.code, cmd.fields, cmd.flag, cmd.opaque) == (105, {"topic": "T"}, 0, 1)
    assert (cmd.language, cmd.version, cmd.remark, cmd.body) == ("PYTHON", 409, None, b"")
    assert cmd.serialize_type == SerializeType.JSON
    assert not cmd.is_response and not cmd.is_oneway


def test_tv2_binary_request_encodes_byte_exact():
    assert encode_frame(route_request(), SerializeType.ROCKETMQ) == TV2


def test_serialize_type_of_the_command_picks_the_header_when_not_given():
    cmd = route_request()
    cmd.serialize_type = SerializeType.ROCKETMQ
    assert encode_frame(cmd) == TV2
    assert encode_frame(cmd, SerializeType.JSON) == TV1


def test_tv2_decodes_to_its_fields():
    cmd = decode_frame(TV2)
    expected = route_request()
    expected.serialize_type = SerializeType.ROCKETMQ
    assert cmd == expected


def test_payload_decoding_matches_frame_decoding():
    assert decode_payload(TV1[4:]) == decode_frame(TV1)
    assert decode_payload(TV2[4:]) == decode_frame(TV2)


@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_length_words_describe_header_and_body(serialize_type):
    cmd = RemotingCommand(code=10, ext_fields={"a": "b"}, body=b"payload", remark="r")
    data = encode_frame(cmd, serialize_type)
    length, word = struct.unpack_from(">II", data)
    assert length == len(data) - 4
    assert word >> 24 == serialize_type
    header_len = word & 0xFFFFFF
    assert data[8 + header_len:] == b"payload"


# ---------------------------------------------------------------- JSON header layout (§1.3)


def header_object_pairs(cmd: RemotingCommand):
    return json.loads(encode_json_header(cmd), object_pairs_hook=lambda pairs: pairs)


def test_json_header_properties_in_fastjson_alphabetical_order():
    cmd = RemotingCommand(code=11, ext_fields={"z": "1", "a": "2"}, flag=1, opaque=7,
                          remark="FOUND", language="JAVA", version=479)
    keys = [k for k, _ in header_object_pairs(cmd)]
    assert keys == sorted(keys)
    assert keys == ["code", "extFields", "flag", "language", "opaque", "remark",
                    "serializeTypeCurrentRPC", "version"]


def test_json_header_is_compact():
    cmd = RemotingCommand(code=11, ext_fields={"k": "v w"}, remark="a b")
    text = encode_json_header(cmd)
    assert text == json.dumps(json.loads(text), separators=(",", ":"),
                              ensure_ascii=False).encode("utf-8")


def test_json_header_says_it_is_json():
    pairs = dict(header_object_pairs(RemotingCommand(code=1)))
    assert pairs["serializeTypeCurrentRPC"] == "JSON"


def test_null_remark_is_omitted_but_empty_remark_is_kept():
    assert "remark" not in dict(header_object_pairs(RemotingCommand(code=1, remark=None)))
    assert dict(header_object_pairs(RemotingCommand(code=1, remark="")))["remark"] == ""


def test_ext_fields_none_omits_the_property_and_empty_writes_an_empty_object():
    assert "extFields" not in dict(header_object_pairs(RemotingCommand(code=0,
                                                                       ext_fields=None)))
    assert b'"extFields":{}' in encode_json_header(RemotingCommand(code=0, ext_fields={}))


def test_ext_fields_keep_their_insertion_order():
    cmd = RemotingCommand(code=0, ext_fields={"queueId": "0", "TRACE_ON": "true", "msgId": "X"})
    ext = dict(header_object_pairs(cmd))["extFields"]
    assert [k for k, _ in ext] == ["queueId", "TRACE_ON", "msgId"]


def test_non_ascii_text_is_written_as_raw_utf8():
    header = encode_json_header(RemotingCommand(code=1, remark="Grüße 主题",
                                                ext_fields={"tópico": "値"}))
    assert "Grüße 主题".encode("utf-8") in header
    assert "tópico".encode("utf-8") in header and "値".encode("utf-8") in header


def test_missing_ext_fields_and_remark_decode_as_none():
    cmd = decode_frame(frame(b'{"code":0,"flag":1,"language":"JAVA","opaque":3,"version":409}'))
    assert cmd.ext_fields is None and cmd.fields == {} and cmd.remark is None
    assert cmd.is_response and cmd.opaque == 3


def test_unknown_header_properties_are_ignored():
    cmd = decode_frame(frame(b'{"code":5,"brandNew":{"x":[1,2]},"opaque":9,"extFields":{}}'))
    assert (cmd.code, cmd.opaque, cmd.ext_fields) == (5, 9, {})


def test_ext_values_sent_as_json_numbers_and_booleans_become_strings():
    header = (b'{"code":11,"extFields":{"queueId":0,"sysFlag":2,"maxMsgNums":32,'
              b'"commitOffset":-7,"big":9007199254740993,"on":true,"off":false,'
              b'"queueOffset":"100"},"flag":0,"language":"CPP","opaque":1,"remark":"",'
              b'"version":63}\n')
    cmd = decode_frame(frame(header))
    assert cmd.ext_fields == {"queueId": "0", "sysFlag": "2", "maxMsgNums": "32",
                              "commitOffset": "-7", "big": "9007199254740993", "on": "true",
                              "off": "false", "queueOffset": "100"}
    assert all(isinstance(v, str) for v in cmd.ext_fields.values())
    assert (cmd.language, cmd.version, cmd.remark) == ("CPP", 63, "")


def test_header_ints_may_arrive_as_numeric_strings():
    cmd = decode_frame(frame(b'{"code":"105","flag":"1","opaque":"12","version":"409"}'))
    assert (cmd.code, cmd.flag, cmd.opaque, cmd.version) == (105, 1, 12, 409)


def test_flag_bits_mean_response_and_oneway():
    assert RemotingCommand(code=0, flag=1).is_response
    assert RemotingCommand(code=40, flag=2).is_oneway
    assert not RemotingCommand(code=40, flag=2).is_response


def test_make_response_copies_opaque_and_serialization():
    request = route_request()
    request.serialize_type = SerializeType.ROCKETMQ
    response = request.make_response(0, {"offset": "5"}, remark="ok")
    assert response.is_response and response.opaque == request.opaque
    assert response.serialize_type == SerializeType.ROCKETMQ
    assert decode_frame(encode_frame(response)) == response


# ---------------------------------------------------------------- ROCKETMQ header (§1.4)


def test_binary_header_cannot_carry_an_empty_remark():
    cmd = RemotingCommand(code=1, remark="")
    assert decode_frame(encode_frame(cmd, SerializeType.ROCKETMQ)).remark is None


def test_binary_header_writes_missing_ext_fields_as_an_empty_map():
    cmd = RemotingCommand(code=1, ext_fields=None)
    assert decode_frame(encode_frame(cmd, SerializeType.ROCKETMQ)).ext_fields == {}


def test_binary_header_skips_entries_with_null_values():
    cmd = RemotingCommand(code=1, ext_fields={"a": None, "b": "x"})
    assert decode_frame(encode_frame(cmd, SerializeType.ROCKETMQ)).ext_fields == {"b": "x"}


def test_binary_header_language_codes():
    for code, name in enumerate(LANGUAGES):
        data = frame(binary_header(language=code), SerializeType.ROCKETMQ)
        assert decode_frame(data).language == name
        cmd = RemotingCommand(code=1, language=name)
        assert decode_frame(encode_frame(cmd, SerializeType.ROCKETMQ)).language == name


# ---------------------------------------------------------------- round trips

TEXT = st.text(max_size=40)
EXT = st.dictionaries(st.text(max_size=20), TEXT, max_size=8)


@st.composite
def json_commands(draw) -> RemotingCommand:
    return RemotingCommand(
        code=draw(INT32), flag=draw(INT32), opaque=draw(INT32), version=draw(INT32),
        language=draw(st.sampled_from(LANGUAGES)), remark=draw(st.none() | TEXT),
        ext_fields=draw(st.none() | EXT), body=draw(st.binary(max_size=200)),
        serialize_type=SerializeType.JSON)


@st.composite
def binary_commands(draw) -> RemotingCommand:
    return RemotingCommand(
        code=draw(INT16), flag=draw(INT32), opaque=draw(INT32), version=draw(INT16),
        language=draw(st.sampled_from(LANGUAGES)),
        remark=draw(st.none() | st.text(min_size=1, max_size=40)),
        ext_fields=draw(EXT), body=draw(st.binary(max_size=200)),
        serialize_type=SerializeType.ROCKETMQ)


ANY_COMMAND = json_commands() | binary_commands()


@FAST
@given(json_commands())
def test_json_frames_round_trip(cmd):
    assert decode_frame(encode_frame(cmd)) == cmd


@FAST
@given(binary_commands())
def test_binary_frames_round_trip(cmd):
    assert decode_frame(encode_frame(cmd)) == cmd


@FAST
@given(json_commands())
def test_json_commands_survive_the_binary_header(cmd):
    """Values that fit both headers mean the same in both."""
    cmd.code &= 0x7FFF
    cmd.version &= 0x7FFF
    cmd.ext_fields = cmd.ext_fields or {}
    cmd.remark = cmd.remark or None
    back = decode_frame(encode_frame(cmd, SerializeType.ROCKETMQ))
    cmd.serialize_type = SerializeType.ROCKETMQ
    assert back == cmd


# ---------------------------------------------------------------- FrameDecoder


def stream_of(commands) -> bytes:
    return b"".join(encode_frame(c) for c in commands)


@FAST
@given(st.lists(ANY_COMMAND, max_size=6))
def test_decoder_fed_byte_by_byte_returns_every_command_in_order(commands):
    data = stream_of(commands)
    decoder = FrameDecoder()
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i:i + 1])
    assert out == commands
    assert decoder.pending == 0 and decoder.stream_offset == len(data)


@FAST
@given(st.lists(ANY_COMMAND, max_size=6), st.randoms(use_true_random=False))
def test_decoder_fed_random_chunks_returns_every_command_in_order(commands, rnd):
    data = stream_of(commands)
    decoder = FrameDecoder()
    out, pos = [], 0
    while pos < len(data):
        step = rnd.randint(0, 64)
        out += decoder.feed(data[pos:pos + step])
        pos += step
    assert out == commands
    assert decoder.pending == 0


def test_decoder_keeps_a_partial_frame_until_it_is_complete():
    decoder = FrameDecoder()
    assert decoder.feed(TV1 + TV2[:10]) == [decode_frame(TV1)]
    assert decoder.pending == 10
    assert decoder.feed(TV2[10:]) == [decode_frame(TV2)]
    assert decoder.pending == 0 and decoder.stream_offset == len(TV1) + len(TV2)


def test_decoder_accepts_a_frame_of_exactly_the_maximum_size():
    body = bytes(MAX_FRAME_BYTES - 4 - 4 - len(encode_json_header(RemotingCommand(code=1))))
    data = encode_frame(RemotingCommand(code=1, body=body))
    assert len(data) == MAX_FRAME_BYTES
    (cmd,) = FrameDecoder().feed(data)
    assert len(cmd.body) == len(body)


# ---------------------------------------------------------------- bad input


def protocol_error(fn, *args) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    assert type(info.value) is ProtocolError
    return info.value


@pytest.mark.parametrize("data, position, words", [
    pytest.param(b"", 0, "no length prefix", id="empty"),
    pytest.param(b"\x00\x00\x00", 0, "no length prefix", id="3-bytes"),
    pytest.param(TV1[:-1], 0, "129 bytes follow but 128", id="truncated"),
    pytest.param(TV1[:8], 0, "129 bytes follow but 4", id="header-missing"),
    pytest.param(TV1 + b"\x00", 0, "129 bytes follow but 130", id="trailing-byte"),
    pytest.param(b"\x00\x00\x00\x02\x00\x7d", 4, "too short", id="length-below-4"),
    pytest.param(b"\x00\x00\x00\x08\x00\x00\x00\x64abcd", 4, "header length 100",
                 id="header-overruns-frame"),
    pytest.param(frame(b"{}", 2), 4, "serialization type 2", id="unknown-type-2"),
    pytest.param(frame(b"{}", 0xFF), 4, "serialization type 255", id="unknown-type-255"),
])
def test_malformed_frames_raise_protocol_error_at_the_fault(data, position, words):
    err = protocol_error(decode_frame, data)
    assert err.position == position
    assert err.where == "frame"
    assert words in str(err)


def test_payload_errors_are_positioned_in_the_payload():
    err = protocol_error(decode_payload, b"\x00\x00\x00\x64abcd")
    assert err.position == 0 and "header length 100" in str(err)
    assert protocol_error(decode_payload, b"\x00\x00").position == 0


def header_error(header: bytes, serialize_type: int = 0) -> ProtocolError:
    err = protocol_error(decode_frame, frame(header, serialize_type))
    assert err.where == "header"
    assert 0 <= err.position <= len(header)
    return err


@pytest.mark.parametrize("header, position, words", [
    pytest.param(b"", 0, "not valid JSON", id="empty"),
    pytest.param(b'{"code":', 8, "not valid JSON", id="cut-short"),
    pytest.param(b'{"code":1,"flag":x}', 17, "not valid JSON", id="bad-token"),
    pytest.param('{"remark":"é",?}'.encode(), 15, "not valid JSON", id="position-in-bytes"),
    pytest.param(b"\x00\x01garbage", 0, "not valid JSON", id="garbage"),
    pytest.param(b"[1,2]", 0, "not an object", id="array"),
    pytest.param(b'{"flag":0}', 0, "no 'code'", id="no-code"),
    pytest.param(b'{"code":"abc"}', 1, "'code'", id="code-not-a-number"),
    pytest.param(b'{"code":1e400}', 1, "'code'", id="code-infinite"),
    pytest.param(b'{"code":NaN}', 1, "'code'", id="code-nan"),
    pytest.param(b'{"code":2147483648}', 1, "'code'", id="code-over-int32"),
    pytest.param(b'{"code":1,"opaque":[1]}', 10, "'opaque'", id="opaque-array"),
    pytest.param(b'{"code":1,"version":{}}', 10, "'version'", id="version-object"),
    pytest.param(b'{"code":1,"flag":-2147483649}', 10, "'flag'", id="flag-under-int32"),
    pytest.param(b'{"code":1,"extFields":[]}', 0, "extFields", id="ext-not-object"),
    pytest.param(b'{"code":1,"extFields":{0:"a"}}', 23, "not valid JSON", id="ext-bare-key"),
    pytest.param(b'{"code":1,"remark":["x"]}', 0, "remark", id="remark-array"),
    pytest.param(b'{"code":1,"remark":"\xff"}', 20, "not UTF-8", id="invalid-utf8"),
    pytest.param(b'{"code":1,"remark":"\xc3"}', 20, "not UTF-8", id="cut-utf8-sequence"),
    pytest.param('{"code":1}'.encode("utf-16"), 0, "not UTF-8", id="utf16-header"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, 0, "nested too deeply", id="deep-nesting"),
])
def test_bad_json_headers_raise_protocol_error_at_the_fault(header, position, words):
    err = header_error(header)
    assert err.position == position
    assert words in str(err)


@pytest.mark.parametrize("header, position, words", [
    pytest.param(b"\x00" * 20, 20, "shorter than its fixed part", id="too-short"),
    pytest.param(binary_header(remark_len=-1), 13, "remark length -1", id="negative-remark"),
    pytest.param(binary_header(remark=b"ab", remark_len=50), 13, "remark length 50",
                 id="remark-overruns"),
    pytest.param(binary_header(remark=b"ab")[:-2], 19, "before the extFields length",
                 id="ext-length-missing"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v"), ext_len=20), 17,
                 "extFields length 20", id="ext-length-too-big"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v"), ext_len=3), 17,
                 "extFields length 3", id="ext-length-too-small"),
    pytest.param(binary_header(ext_len=-4), 17, "extFields length -4", id="ext-length-negative"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v", key_len=40)), 21, "key length 40",
                 id="key-overruns"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v", key_len=-1)), 21, "key length -1",
                 id="key-negative"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v", value_len=9)), 24, "value length 9",
                 id="value-overruns"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"v", value_len=-2)), 24, "value length -2",
                 id="value-negative"),
    pytest.param(binary_header(ext=b"\x00"), 21, "cut short", id="entry-cut-short"),
    pytest.param(binary_header(remark=b"ok\xff"), 19, "not UTF-8", id="remark-not-utf8"),
    pytest.param(binary_header(ext=ext_entry(b"\xfe", b"v")), 23, "not UTF-8", id="key-not-utf8"),
    pytest.param(binary_header(ext=ext_entry(b"k", b"\xc3(")), 28, "not UTF-8",
                 id="value-not-utf8"),
])
def test_bad_binary_headers_raise_protocol_error_at_the_fault(header, position, words):
    err = header_error(header, SerializeType.ROCKETMQ)
    assert err.position == position
    assert words in str(err)


def test_error_excerpt_shows_the_bytes_at_the_fault():
    err = header_error(b'{"code":1,"remark":"\xff"}')
    assert err.excerpt.startswith("ff 22 7d")
    assert "ff 22 7d" in str(err)


def test_decoder_rejects_a_length_over_16_mib_before_the_bytes_arrive():
    decoder = FrameDecoder()
    too_long = struct.pack(">I", MAX_FRAME_BYTES - 3)  # length + 4 = 16 MiB + 1
    err = protocol_error(decoder.feed, TV1 + too_long)
    assert err.position == len(TV1) and err.where == "stream"
    assert str(MAX_FRAME_BYTES - 3) in str(err)
    assert err.excerpt == too_long.hex(" ")


@pytest.mark.parametrize("length", [0, 3])
def test_decoder_rejects_lengths_below_the_header_length_word(length):
    err = protocol_error(FrameDecoder().feed, struct.pack(">I", length) + b"\x00" * 8)
    assert err.position == 0 and f"frame length {length}" in str(err)


def test_decoder_reports_bad_frames_with_their_stream_offset():
    bad = frame(b'{"code":1,"flag":x}')
    decoder = FrameDecoder()
    err = protocol_error(decoder.feed, TV1 + TV2 + bad)
    assert err.position == 17 and err.where == "header"
    assert f"stream byte {len(TV1) + len(TV2)}" in str(err)


def test_decoder_and_decode_frame_agree_on_frame_level_positions():
    bad = frame(b"{}", 3)
    assert protocol_error(FrameDecoder().feed, bad).position == \
        protocol_error(decode_frame, bad).position == 4


def outcome(decode, data: bytes):
    """``(result, None)`` or ``(None, error)``; any exception but ProtocolError escapes."""
    try:
        return decode(data), None
    except ProtocolError as err:
        return None, err


def assert_positioned(err: ProtocolError, data: bytes, offset: int = 0) -> None:
    """A documented error: a plain ProtocolError placed inside the bytes it names."""
    assert type(err) is ProtocolError
    assert err.where in ("frame", "header", "stream")
    limit = len(data) - (offset if err.where == "frame" else 0)
    assert 0 <= err.position <= limit
    assert f"(at byte {err.position} of the {err.where}" in str(err)


def assert_body_follows_header(cmd: RemotingCommand, payload: bytes) -> None:
    """A decoded command's serialization and body are the ones its length words give."""
    (word,) = struct.unpack_from(">I", payload)
    assert isinstance(cmd, RemotingCommand)
    assert cmd.serialize_type == word >> 24
    assert cmd.body == payload[4 + (word & 0xFFFFFF):]


def assert_decoders_agree(data: bytes) -> RemotingCommand:
    """``decode_frame``, ``decode_payload`` and ``FrameDecoder`` give the same command for the
    same bytes, or the same error at the same place; returns the command (None on an error)."""
    cmd, err = outcome(decode_frame, data)
    streamed, stream_err = outcome(FrameDecoder().feed, data)
    if err is not None:
        assert_positioned(err, data)
    if stream_err is not None:
        assert_positioned(stream_err, data)
    length_matches = len(data) >= 4 and struct.unpack_from(">I", data)[0] + 4 == len(data)
    if not length_matches:
        assert cmd is None and err.where == "frame" and err.position == 0
        assert "length prefix" in str(err)
        return None
    payload_cmd, payload_err = outcome(decode_payload, data[4:])
    if cmd is not None:
        assert_body_follows_header(cmd, data[4:])
        assert payload_cmd == cmd and streamed == [cmd]
        return cmd
    assert_positioned(payload_err, data[4:])
    assert payload_err.where == err.where and stream_err.where == err.where
    shift = 4 if err.where == "frame" else 0
    assert payload_err.position + shift == err.position == stream_err.position
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_commands_or_protocol_errors(data):
    assert_decoders_agree(data)


@settings(max_examples=300, deadline=None)
@given(ANY_COMMAND, st.data())
def test_corrupted_frames_give_commands_or_protocol_errors(cmd, data):
    """Damage a valid frame after its length prefix (so the header parsers see it): the result
    agrees across the decoders, and a frame whose header was spared keeps its fields."""
    raw = bytearray(encode_frame(cmd))
    header_end = 8 + (struct.unpack_from(">I", raw, 4)[0] & 0xFFFFFF)
    # half the frames are damaged anywhere, half only in the body (when there is one)
    first = data.draw(st.sampled_from([4, header_end])) if header_end < len(raw) else 4
    damaged_at = []
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(first, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
        damaged_at.append(i)
    cut = data.draw(st.integers(8 if first == 4 else header_end, len(raw)))
    damaged = struct.pack(">I", cut - 4) + bytes(raw[4:cut])
    back = assert_decoders_agree(damaged)
    if min(damaged_at) >= header_end and cut >= header_end:
        assert back is not None
        assert back == dataclasses.replace(cmd, body=bytes(raw[header_end:cut]))


def test_decoder_never_waits_forever_on_a_hostile_stream():
    """Random streams either decode, fail, or leave less than one frame pending."""
    rnd = random.Random(1234)
    for _ in range(200):
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200)))
        decoder = FrameDecoder()
        try:
            decoder.feed(data)
        except ProtocolError:
            continue
        if decoder.pending >= 4:
            (length,) = struct.unpack_from(">I", data, len(data) - decoder.pending)
            assert 4 <= length <= MAX_FRAME_BYTES - 4 and length + 4 > decoder.pending
