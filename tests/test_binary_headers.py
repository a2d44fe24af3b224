"""The ROCKETMQ binary command header: our requests use it, the embedded server answers in it.

Facts held here (apache/rocketmq 4.9.8 and the protocol reference, §1.2 and §1.4; the genuine
capture has no ROCKETMQ frame, so the byte layout is checked against the reference's TV2, which
was checked against RocketMQ's own Java encoder):

* layout: code(2) language(1) version(2) opaque(4) flag(4) remarkLen(4) remark extLen(4), then
  keyLen(2) key valueLen(4) value per ext entry; PYTHON is language 3, V4_9_8 is version 409;
* a 4.9.8 broker answers a request in the request's serialization (NettyRemotingAbstract copies
  ``serializeTypeCurrentRPC`` onto the response), except a parked pull's answer, which its
  long-poll service writes in the server's own serialization, JSON;
* the C codec (native/client/rmq_header.c) and the pull loop's header reader
  (native/client/rmq_pull.c) give the same answer as the pure-Python decoder for every input.
"""
from __future__ import annotations

import struct
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from rocketmq_spark.client import _native
from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.protocol import frame as frame_codec
from rocketmq_spark.client.protocol.codes import RequestCode, SerializeType
from rocketmq_spark.client.protocol.frame import (
    RemotingCommand, decode_frame, decode_payload, encode_frame,
)
from rocketmq_spark.client.pull import pull_result

from raw_client import RawClient  # noqa: E402  (tests/ is on sys.path)

TV2 = bytes.fromhex("00 00 00 25 01 00 00 21 00 69 03 01 99 00 00 00"   # the reference's TV2
                    "01 00 00 00 00 00 00 00 00 00 00 00 0c 00 05 74"
                    "6f 70 69 63 00 00 00 01 54")


def test_request_encodes_as_the_reference_test_vector():
    cmd = RemotingCommand(code=105, ext_fields={"topic": "T"}, opaque=1, version=409,
                          language="PYTHON")
    assert encode_frame(cmd, SerializeType.ROCKETMQ) == TV2
    assert frame_codec._encode_binary_header_py(cmd) == TV2[8:]
    back = decode_frame(TV2)
    assert (back.code, back.language, back.version, back.opaque, back.flag, back.remark,
            back.ext_fields, back.serialize_type) == (105, "PYTHON", 409, 1, 0, None,
                                                      {"topic": "T"}, SerializeType.ROCKETMQ)


def test_the_client_sends_pulls_with_binary_headers_and_gets_binary_answers(embedded_cluster):
    """What our reader puts on the wire, read by a raw socket server standing in for a broker."""
    embedded_cluster.create_topic("BinPull", queues=1)
    embedded_cluster.append("BinPull", "broker-a", 0, [b"m%d" % i for i in range(40)])
    addr = embedded_cluster.broker("broker-a").addr
    with RawClient(addr) as raw:
        fields = {"consumerGroup": "g", "topic": "BinPull", "queueId": "0", "queueOffset": "0",
                  "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
                  "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
        binary = raw.request(RequestCode.PULL_MESSAGE, fields, serialize=SerializeType.ROCKETMQ)
        plain = raw.request(RequestCode.PULL_MESSAGE, fields, serialize=SerializeType.JSON)
    assert binary.serialize_type == SerializeType.ROCKETMQ and binary.code == 0
    assert plain.serialize_type == SerializeType.JSON and plain.code == 0
    assert binary.body == plain.body and binary.ext_fields == plain.ext_fields
    assert binary.remark == "FOUND" and binary.fields["nextBeginOffset"] == "32"


def test_the_readers_requests_on_the_wire():
    """The native loop's requests: a ROCKETMQ header, language PYTHON, version 409, every pull
    field as a string, maxMsgNums and queueOffset patched per request."""
    from rocketmq_spark.client.read.native_pull import pull_template
    from rocketmq_spark.client.pull import PullRequest

    request = PullRequest("G", "T", 3, 0, broker_name="broker-a", max_msg_nums=32)
    frame = pull_template(request)
    cmd = decode_frame(frame)
    assert cmd.serialize_type == SerializeType.ROCKETMQ
    assert (cmd.code, cmd.language, cmd.version) == (RequestCode.PULL_MESSAGE, "PYTHON", 409)
    expected = request.ext_fields()
    del expected["maxMsgNums"], expected["queueOffset"]
    assert cmd.ext_fields == expected


def test_a_parked_pull_is_answered_in_json_like_a_4_9_8_broker(embedded_cluster):
    embedded_cluster.create_topic("BinPark", queues=1)
    addr = embedded_cluster.broker("broker-a").addr
    fields = {"consumerGroup": "g", "topic": "BinPark", "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0",
              "suspendTimeoutMillis": "5000", "subscription": "*", "subVersion": "0"}
    with RawClient(addr) as raw:
        answer = {}
        t = threading.Thread(target=lambda: answer.setdefault(
            "r", raw.request(RequestCode.PULL_MESSAGE, fields, serialize=SerializeType.ROCKETMQ,
                             timeout=10)))
        t.start()
        time.sleep(0.3)
        embedded_cluster.append("BinPark", "broker-a", 0, [b"wake"])
        t.join(10)
    r = answer["r"]
    assert r.code == 0 and r.serialize_type == SerializeType.JSON


# ------------------------------------------------------------------ C codec == Python codec

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(-0x8000, 0x7FFF), version=st.integers(-0x8000, 0x7FFF),
       opaque=st.integers(-2**31, 2**31 - 1), flag=st.integers(-2**31, 2**31 - 1),
       language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO", "RUST", "WHATEVER"]),
       remark=st.none() | texts, ext=st.none() | st.dictionaries(texts, texts, max_size=6))
def test_native_and_python_header_codecs_agree(code, version, opaque, flag, language, remark,
                                               ext):
    cmd = RemotingCommand(code=code, ext_fields=ext, version=version, opaque=opaque, flag=flag,
                          language=language, remark=remark)
    native = frame_codec.encode_binary_header(cmd)
    assert native == frame_codec._encode_binary_header_py(cmd)
    a = frame_codec.decode_binary_header(native)
    b = frame_codec._decode_binary_header_py(native)
    assert a == b


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64) | st.builds(
    lambda h, cut, junk: h[:cut] + junk,
    st.builds(lambda e: frame_codec._encode_binary_header_py(
        RemotingCommand(code=11, ext_fields=e)),
              st.dictionaries(texts, texts, max_size=4)),
    st.integers(0, 80), st.binary(max_size=6)))
def test_native_header_decoder_rejects_exactly_what_python_rejects(data):
    """The C decoder returns None where the Python one raises, and the same command elsewhere
    (so the wrapper's fallback names the fault for every bad header)."""
    try:
        expected = frame_codec._decode_binary_header_py(data)
    except ProtocolError:
        expected = None
    got = _native.decode_binary_header(data)
    if expected is None:
        assert got is None
    else:
        assert got is not None and frame_codec.decode_binary_header(data) == expected


# ------------------------------------------------------------------ the pull loop's reading

def _pull_answer(ext, serialize, code=0, opaque=7, remark="FOUND", body=b"x"):
    cmd = RemotingCommand(code=code, ext_fields=ext, flag=1, opaque=opaque, remark=remark,
                          body=body, language="JAVA")
    return encode_frame(cmd, serialize)


def _agrees(payload: bytes) -> None:
    """The loop's header reading of one answer agrees with the Python reader's."""
    seen = _native.parse_header(payload)
    try:
        cmd = decode_payload(payload)
    except ProtocolError:
        assert seen is None or not seen[-1]
        return
    if seen is None:  # left to Python: fine, as long as the framing was right
        return
    code, flag, opaque, nxt, suggest, delta, has_next, parsed = seen
    assert (code, flag, opaque) == (cmd.code, cmd.flag, cmd.opaque)
    try:
        result = pull_result(cmd) if cmd.code in (0, 19, 20, 21) else None
    except ProtocolError:
        assert not parsed
        return
    if parsed and result is not None:
        assert (nxt, suggest, delta) == (result.next_begin_offset,
                                         result.suggest_which_broker_id, result.offset_delta)
        assert has_next == ("nextBeginOffset" in cmd.fields)


values = st.one_of(st.integers(-10**12, 10**12).map(str), st.sampled_from(["", " 5", "+5",
                                                                             "1_0", "٣", "x",
                                                                             "9" * 25]))


@settings(max_examples=400, deadline=None)
@given(ext=st.dictionaries(st.sampled_from(["nextBeginOffset", "minOffset", "maxOffset",
                                            "suggestWhichBrokerId", "offsetDelta", "other"]),
                           values, max_size=6),
       serialize=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]),
       code=st.sampled_from([0, 1, 19, 20, 21, 26]), remark=st.none() | texts)
def test_the_pull_loop_reads_answer_headers_as_python_does(ext, serialize, code, remark):
    _agrees(_pull_answer(ext, serialize, code, remark=remark)[4:])


@pytest.mark.parametrize("header", [
    '{"code":0,"extFields":{"nextBeginOffset":33,"suggestWhichBrokerId":0},"flag":1,"opaque":5}',
    '{"code":0,"extFields":{"nextBeginOffset":"3\\u0033"},"flag":1,"opaque":5}',
    '{"code":0,"extFields":{"nextBeginOffset":true},"flag":1,"opaque":5}',
    '{"code":0,"extFields":{"nextBeginOffset":"1"},"extFields":{"nextBeginOffset":"2"},'
    '"flag":1,"opaque":5}',
    '{"code":0,"remark":"say \\"hi\\" \\\\ ok","extFields":{"nextBeginOffset":"7",'
    '"a":[1,{"b":null}]},"flag":1,"opaque":5,"x":1.5e3}',
    '\ufeff{"code":0,"extFields":{"nextBeginOffset":"7"},"flag":1,"opaque":5}',
    '{"code":0.0,"flag":1,"opaque":5}',
    '{"code":0,"flag":1,"opaque":5} trailing',
    '{"flag":1,"opaque":5}',
])
def test_the_pull_loop_reads_odd_json_headers_as_python_does(header):
    data = header.encode("utf-8")
    _agrees(struct.pack(">I", len(data)) + data + b"body")


def test_the_pull_loop_reads_every_captured_header_as_python_does(capture):
    """Every frame of the genuine 4.9.8 capture (all JSON, C++ client and Java broker)."""
    for record in capture.frames:
        payload = capture.frame_bytes(record)[4:]
        _agrees(payload)
        seen = _native.parse_header(payload)
        assert seen is not None and seen[-1], record["seq"]  # fastjson's form is all read in C
