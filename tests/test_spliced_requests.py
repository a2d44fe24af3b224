"""Requests spliced over columns (client/protocol/spliced_requests.py) against the codec.

Every frame a :class:`RequestTemplate` makes must be byte for byte the frame
:func:`encode_frame` makes of the same command, and decode back to the row's values."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.broker import send_command
from rocketmq_spark.client.protocol.frame import (
    FLAG_ONEWAY, SerializeType, decode_payload, encode_frame,
)
from rocketmq_spark.client.protocol.spliced_requests import RequestTemplate, buffer_of
from rocketmq_spark.client.txn.transaction import (
    HalfHandle, Outcome, end_transaction_command,
)

VERSION = 317


def expected(commands) -> bytes:
    return b"".join(encode_frame(c, SerializeType.ROCKETMQ) for c in commands)


def half_send(props: str, body: bytes, opaque: int, sys_flag: int = 4):
    cmd = send_command("broker-a", "grp", "Topic", 3, body, props, sys_flag, 0, 1_700_000_000_123)
    cmd.version, cmd.opaque = VERSION, opaque
    return cmd


def send_template(sys_flag: int = 4) -> RequestTemplate:
    template = half_send("", b"", 0, sys_flag)
    return RequestTemplate(template, ["i"])  # "i": SEND_MESSAGE_V2's properties


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(texts, st.binary(max_size=64)), min_size=1, max_size=12),
       st.integers(0, 2**31 - 64), st.sampled_from([4, 4 | 1]))
def test_send_frames_match_the_codec(rows, first_opaque, sys_flag):
    props = [p for p, _ in rows]
    bodies = [b for _, b in rows]
    opaques = np.arange(first_opaque, first_opaque + len(rows))
    frames = send_template(sys_flag).frames(opaques, [pa.array(props, pa.string())],
                                            pa.array(bodies, pa.binary()))
    commands = [half_send(p, b, int(o), sys_flag) for p, b, o in zip(props, bodies, opaques)]
    assert bytes(buffer_of(frames)) == expected(commands)


def test_end_transaction_frames_match_the_codec_and_decode_back():
    handles = [HalfHandle("broker-a", "127.0.0.1:1", f"UNIQ{i:04d}é", i * 7, 10**12 + i * 431,
                          f"TX{i}") for i in range(50)]
    template = end_transaction_command("grp", HalfHandle("b", "", "0", 0, 0, "0"),
                                       Outcome.COMMIT)
    template.version, template.flag = VERSION, template.flag | FLAG_ONEWAY
    columns = RequestTemplate(template, ["tranStateTableOffset", "commitLogOffset", "msgId",
                                         "transactionId", "bname"])
    values = [pa.array([str(h.queue_offset) for h in handles]),
              pa.array([str(h.commit_log_offset) for h in handles]),
              pa.array([h.uniq_key for h in handles]),
              pa.array([h.transaction_id for h in handles]),
              pa.array([h.broker_name for h in handles])]
    frames = columns.frames(np.arange(1, 51), values)
    commands = []
    for i, h in enumerate(handles):
        c = end_transaction_command("grp", h, Outcome.COMMIT)
        c.version, c.opaque, c.flag = VERSION, i + 1, c.flag | FLAG_ONEWAY
        commands.append(c)
    assert bytes(buffer_of(frames)) == expected(commands)
    third = decode_payload(frames[2].as_py()[4:])
    assert third.opaque == 3 and third.is_oneway
    assert third.ext_fields["commitLogOffset"] == str(10**12 + 2 * 431)
    assert third.ext_fields["msgId"] == "UNIQ0002é"
    assert third.ext_fields["bname"] == "broker-a"  # a 5.1+ proxy's remoting port reads it


def test_a_slice_of_frames_is_its_rows_frames():
    frames = send_template().frames(np.arange(10), [pa.array([f"p{i}" for i in range(10)])],
                                    pa.array([b"b%d" % i for i in range(10)], pa.binary()))
    part = frames.slice(3, 4)
    assert bytes(buffer_of(part)) == expected([half_send(f"p{i}", b"b%d" % i, i)
                                               for i in range(3, 7)])


def test_a_template_names_only_fields_it_has():
    with pytest.raises(ValueError, match="no header field 'nope'"):
        RequestTemplate(half_send("", b"", 0), ["nope"])
