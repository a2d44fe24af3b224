"""Hostile bytes from the network: fuzzing the frame, message, column, batch and route decoders.

* ``test_atheris_fuzz_for_a_minute`` (slow): the atheris harness in ``tests/fuzz_decoders.py``
  for 60 s in a subprocess; a clean exit means no finding (no foreign exception, hang, crash of
  the C decoder, or disagreement between the C decoder and its numpy twin).
* The hypothesis smoke fuzz runs the same checks for a few seconds in every run, so the harness
  code itself is exercised by CI.
* The regression tests below reproduce what fuzzing found, as plain cases.
"""
from __future__ import annotations

import importlib.util
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_decoders as fz
from rocketmq_spark.client.errors import MessageDecodeError, ProtocolError
from rocketmq_spark.client.protocol import pull_decode, message as M, route
from rocketmq_spark.client.protocol.frame import RemotingCommand, encode_frame

HARNESS = Path(__file__).resolve().parent / "fuzz_decoders.py"
SEEDS = fz.seeds()


def test_every_seed_decodes_and_passes_the_checks():
    assert len(SEEDS) > 100  # our own encodings plus the capture's genuine frames
    for seed in SEEDS:
        fz.check_one(seed)


def test_the_harness_reports_a_foreign_exception_as_a_finding(monkeypatch):
    def broken(data):
        raise IndexError("boom")

    monkeypatch.setattr(fz.message, "decode_batch", broken)
    with pytest.raises(fz.Finding, match="decode_batch raised IndexError"):
        fz.check_one(SEEDS[0])


def test_the_harness_reports_an_out_of_range_position(monkeypatch):
    def misplaced(data):
        raise ProtocolError("bad", len(data) + 1, "route body", data)

    monkeypatch.setattr(fz.route, "loads_lenient", misplaced)
    with pytest.raises(fz.Finding, match="position"):
        fz.check_one(b"{}")


@pytest.mark.skipif(pull_decode._native is None, reason="the C accelerator is not built")
def test_guard_page_ends_the_input_for_the_c_decoder():
    data = fz.seeds()[0]
    view = fz.guarded(data)
    if isinstance(view, memoryview):
        assert bytes(view) == data and view.readonly
    assert pull_decode.decode_columns(view).num_rows == 1


# ------------------------------------------------------------------------ hypothesis smoke


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, at, value in edits:
        pos = at % (len(buf) + 1)
        if kind == "flip" and buf:
            buf[pos % len(buf)] ^= 1 << (value % 8)
        elif kind == "byte" and buf:
            buf[pos % len(buf)] = value % 256
        elif kind == "int32" and len(buf) >= 4:
            pos = pos % (len(buf) - 3)
            word = [0, -1, 1, 91, 0x7FFFFFFF, -0x80000000, len(buf), value][value % 8]
            buf[pos:pos + 4] = struct.pack(">i", max(-0x80000000, min(word, 0x7FFFFFFF)))
        elif kind == "cut":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = bytes([value % 256]) * (1 + value % 7)
        elif kind == "delete":
            del buf[pos:pos + 1 + value % 9]
    return bytes(buf)


_edit = st.tuples(st.sampled_from(["flip", "byte", "int32", "cut", "insert", "delete"]),
                  st.integers(0, 1 << 16), st.integers(0, 1 << 31))
_mutated_seed = st.builds(_mutate, st.sampled_from(SEEDS), st.lists(_edit, max_size=4))
_spliced = st.builds(lambda a, b, i: a[:i % (len(a) + 1)] + b, st.sampled_from(SEEDS),
                     st.sampled_from(SEEDS), st.integers(0, 1 << 16))
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["code", "flag", "opaque", "version", "language", "remark", "extFields",
                         "queueDatas", "brokerDatas", "brokerName", "brokerAddrs",
                         "readQueueNums", "writeQueueNums", "perm", "brokerAddrTable",
                         "clusterAddrTable", "0", "1"]) | st.text(max_size=4),
        inner, max_size=5),
    max_leaves=12)


def _json_bytes(value, bare_keys: bool = False) -> bytes:
    text = json.dumps(value, allow_nan=True)
    if bare_keys:  # fastjson's integer map keys, written bare
        text = re.sub(r'"(-?\d+)":', r"\1:", text)
    return text.encode()


# Route and cluster bodies shaped like the real ones, with any JSON value in any field.
_field = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=6), st.none(), st.booleans(),
                   st.lists(st.integers(), max_size=2))
_broker_data = st.fixed_dictionaries({"brokerName": st.text(max_size=4) | _field}, optional={
    "brokerAddrs": st.dictionaries(st.sampled_from(["0", "1", "-1", "x", "1e3"]), _field,
                                   max_size=3) | _field,
    "cluster": _field})
_queue_data = st.fixed_dictionaries({"brokerName": st.text(max_size=4) | _field}, optional={
    "readQueueNums": _field, "writeQueueNums": _field, "perm": _field, "topicSysFlag": _field})
_route_obj = st.fixed_dictionaries({}, optional={
    "queueDatas": st.lists(_queue_data, max_size=3) | _field,
    "brokerDatas": st.lists(_broker_data, max_size=3) | _field, "orderTopicConf": _field})
_cluster_obj = st.fixed_dictionaries({}, optional={
    "brokerAddrTable": st.dictionaries(st.text(max_size=3), _broker_data | _field,
                                       max_size=3) | _field,
    "clusterAddrTable": st.dictionaries(st.text(max_size=3), st.lists(st.text(max_size=3))
                                        | _field, max_size=2) | _field})
_route_body = st.builds(_json_bytes, _route_obj | _cluster_obj, st.booleans())


def _as_frame(header: bytes, body: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


_json_body = st.builds(_json_bytes, _json_values)
_json_frame = st.builds(_as_frame, _json_body, st.binary(max_size=64))
INPUTS = st.one_of(st.binary(max_size=300), _mutated_seed, _mutated_seed, _spliced, _json_body,
                   _json_frame, _route_body, _route_body)


@settings(max_examples=3000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(INPUTS)
def test_hypothesis_smoke_fuzz(data):
    fz.check_one(data)


# --------------------------------------------------------------------------- atheris (slow)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                    reason="atheris is not installed (Linux x86_64 wheels only)")
def test_atheris_fuzz_for_a_minute(tmp_path):
    corpus, artifacts = tmp_path / "corpus", tmp_path / "artifacts"
    artifacts.mkdir()
    dictionary = tmp_path / "decoders.dict"
    fz.write_dictionary(dictionary)
    started = time.monotonic()
    # 60 s in all, at most 30 s for any one input (a hang), inputs up to 8 KiB.
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "-max_total_time=60", "-timeout=30", "-rss_limit_mb=4096",
         "-max_len=8192", "-print_final_stats=1", f"-dict={dictionary}",
         f"-artifact_prefix={artifacts}/", str(corpus)],
        cwd=tmp_path, capture_output=True, text=True, timeout=360)
    elapsed = time.monotonic() - started
    log = proc.stdout + proc.stderr
    (tmp_path / "fuzz.log").write_text(log)
    tail = log[-6000:]
    assert proc.returncode == 0, f"the fuzzer found something (exit {proc.returncode}):\n{tail}"
    assert not list(artifacts.iterdir()), f"the fuzzer left artifacts:\n{tail}"
    assert "Uncaught Python exception" not in log and "ERROR: libFuzzer" not in log, tail
    runs = re.search(r"Done (\d+) runs in (\d+) second", log)
    assert runs, tail
    assert int(runs.group(2)) >= 60 and elapsed >= 60
    assert int(runs.group(1)) > 10_000, tail  # it did fuzz, not stall on one input
    assert "C accelerator on" in log or pull_decode._native is None


# --------------------------------------------------- findings, kept as regular test cases


def _record(offset: int, **kw) -> bytes:
    kw.setdefault("properties", "")
    return M.encode_stored_message(topic="T", queue_id=0, queue_offset=offset,
                                   physical_offset=100 * offset, body=b"b%d" % offset, **kw)


def _bad_magic(rec: bytes) -> bytes:
    return rec[:4] + b"\0\0\0\0" + rec[8:]


def _bad_crc(rec: bytes) -> bytes:
    return rec[:8] + b"\0\0\0\1" + rec[12:]


def _bad_utf8_props(offset: int) -> bytes:
    rec = _record(offset, properties="K\x01\u00ff")
    return rec.replace("K\x01\u00ff".encode(), b"K\x01\xff\xff")


def _decoders(data: bytes):
    """(name, error) of every column decoder on ``data``."""
    out = []
    for pure in ([True, False] if pull_decode._native is not None else [True]):
        saved = pull_decode.FORCE_PURE_PYTHON
        pull_decode.FORCE_PURE_PYTHON = pure
        try:
            with pytest.raises(MessageDecodeError) as err:
                pull_decode.decode_columns(data)
        finally:
            pull_decode.FORCE_PURE_PYTHON = saved
        out.append(("numpy" if pure else "C", err.value))
    with pytest.raises(MessageDecodeError) as err:
        M.decode_messages(data)
    out.append(("scalar", err.value))
    return out


@pytest.mark.parametrize("data, position, offset", [
    # The numpy twin walked every totalSize first and blamed the short tail at byte 188.
    pytest.param(_bad_magic(_record(0)) + _record(1) + b"\0\0\0\5\0", 4, None,
                 id="bad-magic-then-short-tail"),
    # It ran the layout checks of all records before any CRC: it blamed offset 1.
    pytest.param(_bad_crc(_record(0)) + _bad_magic(_record(1)), 8, 0,
                 id="bad-crc-then-bad-magic"),
    # It decoded topic + properties length + properties as one text: a valid record whose
    # properties are 128..255 bytes long (length byte 0x80) was blamed for the next one's
    # bad UTF-8, so the reader would have named the wrong queue offset.
    pytest.param(_record(0, properties="K\x01" + "v" * 126) + _bad_utf8_props(1), None, 1,
                 id="long-properties-then-bad-utf8"),
])
def test_numpy_twin_blames_the_same_first_bad_record_as_the_c_decoder(data, position, offset):
    errors = _decoders(data)
    positions = {name: e.position for name, e in errors}
    assert len(set(positions.values())) == 1, positions
    if position is not None:
        assert errors[0][1].position == position
    if offset is not None:
        assert {e.queue_offset for _, e in errors} == {offset}, [str(e) for _, e in errors]


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"Infinity", b"-Infinity", b"NaN"])
def test_route_with_a_non_finite_number_is_a_protocol_error(number):
    # fuzzing: int(float("inf")) raised OverflowError out of TopicRouteData.from_json
    body = (b'{"brokerDatas":[],"queueDatas":[{"brokerName":"broker-a","perm":6,'
            b'"readQueueNums":' + number + b',"writeQueueNums":4}]}')
    with pytest.raises(ProtocolError, match="route JSON lacks or mistypes a field"):
        route.TopicRouteData.from_json(body)


def test_frame_split_anywhere_decodes_the_same():
    cmd = RemotingCommand(code=11, ext_fields={"a": "b"}, body=b"xyz", opaque=9)
    data = encode_frame(cmd) * 2
    for cut in range(len(data) + 1):
        fz.check_frames(data[:cut])
