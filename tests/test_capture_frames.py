"""The genuine 4.9.8 capture (shared/captures/rocketmq-4.9.8): every frame decodes, every
stream splits, and every stored message decodes to what Apache's C++ client saw."""
from __future__ import annotations

import random
import zlib
from collections import defaultdict

import pytest

from rocketmq_spark.client.protocol.properties import decode_properties
from rocketmq_spark.client.protocol.frame import (
    FrameDecoder, decode_frame, encode_frame, encode_json_header,
)
from rocketmq_spark.client.protocol.message import (
    MAGIC_V1, decode_batch, decode_messages, offset_msg_id, pack_host,
)



def is_big_body(body: bytes) -> bool:
    """README: 6,000 bytes of '%05d,' x 1000 (big0 counts from 0, big1 from 1000)."""
    first = int(body[:5])
    return body == "".join("%05d," % n for n in range(first, first + 1000)).encode()


# ---------------------------------------------------------------- frames


def test_the_capture_has_its_145_frames(capture):
    assert len(capture.frames) == 145
    assert [r["seq"] for r in capture.frames] == list(range(145))


def test_every_frame_decodes_to_its_recorded_header(capture, capture_record):
    record = capture_record
    header = record["header"]
    data = capture.frame_bytes(record)
    assert len(data) == record["frame_len"] == 8 + record["header_len"] + record["body_len"]
    assert len(record["header_text"].encode()) == record["header_len"]
    cmd = decode_frame(data)
    assert cmd.code == header["code"]
    assert cmd.flag == header["flag"]
    assert cmd.opaque == header["opaque"]
    assert cmd.language == header["language"]
    assert cmd.version == header["version"]
    assert cmd.remark == header.get("remark")
    if "extFields" in header:
        assert cmd.ext_fields == {k: capture.ext_text(v) for k, v in header["extFields"].items()}
    else:
        assert cmd.ext_fields is None
    assert cmd.body == capture.body(record)
    assert cmd.is_response == (record["rpc"] == "response")
    assert cmd.is_oneway == (record["rpc"] == "oneway")


def test_java_written_headers_re_encode_byte_exact(capture):
    """fastjson's layout: sorted properties, ext fields in arrival order, nulls omitted."""
    java = [r for r in capture.frames if r["header"]["language"] == "JAVA"]
    assert len(java) > 60
    for record in java:
        cmd = decode_frame(capture.frame_bytes(record))
        assert encode_json_header(cmd) == record["header_text"].encode(), record["seq"]
        assert encode_frame(cmd) == capture.frame_bytes(record), record["seq"]


def test_cpp_headers_with_numbers_and_trailing_newline_decode(capture):
    pulls = [r for r in capture.frames if r["header"]["language"] == "CPP"
             and r["header"]["code"] == 11]
    assert pulls and all(r["header_text"].endswith("}\n") for r in pulls)
    for record in pulls:
        fields = decode_frame(capture.frame_bytes(record)).fields
        assert isinstance(record["header"]["extFields"]["maxMsgNums"], int)
        assert fields["maxMsgNums"] == "32" and fields["sysFlag"] in ("4", "6", "7")
        assert int(fields["queueId"]) in range(4)


def test_readme_counts_of_requests_oneways_and_responses(capture):
    commands = [decode_frame(capture.frame_bytes(r)) for r in capture.frames]
    responses = sum(c.is_response for c in commands)
    oneways = sum(c.is_oneway for c in commands)
    assert (len(commands) - responses - oneways, oneways, responses) == (74, 5, 66)


def direction_streams(capture):
    """Each connection direction's bytes, in stream order, with its records."""
    streams = defaultdict(list)
    for record in capture.frames:
        streams[(record["conn"], record["dir"])].append(record)
    out = []
    for key, records in sorted(streams.items()):
        records.sort(key=lambda r: r["stream_offset"])
        data = b"".join(capture.frame_bytes(r) for r in records)
        offsets = [r["stream_offset"] for r in records]
        assert offsets == [sum(r["frame_len"] for r in records[:i]) for i in range(len(records))]
        out.append((key, records, data))
    return out


def test_each_direction_fed_whole_byte_by_byte_and_in_chunks_gives_the_same_commands(capture):
    rnd = random.Random(498)
    streams = direction_streams(capture)
    assert len(streams) == 18 and sum(len(r) for _, r, _ in streams) == 145
    for key, records, data in streams:
        expected = [decode_frame(capture.frame_bytes(r)) for r in records]
        assert FrameDecoder().feed(data) == expected, key

        decoder, out = FrameDecoder(), []
        for i in range(len(data)):
            out += decoder.feed(data[i:i + 1])
        assert out == expected and decoder.pending == 0, key

        decoder, out, pos = FrameDecoder(), [], 0
        while pos < len(data):
            step = rnd.choice([1, 3, 7, 100, 1000, 5000])
            out += decoder.feed(data[pos:pos + step])
            pos += step
        assert out == expected and decoder.stream_offset == len(data), key


# ---------------------------------------------------------------- stored messages


def pull_deliveries(capture):
    """(request fields, response fields, messages) of every PULL_MESSAGE response with a body."""
    out = []
    for response in capture.responses_to(11):
        body = capture.body(response)
        if body:
            request = decode_frame(capture.frame_bytes(capture.request_of(response))).fields
            cmd = decode_frame(capture.frame_bytes(response))
            out.append((request, cmd.fields, decode_messages(cmd.body, verify_crc=True)))
    return out


def sent_messages(capture):
    """SEND_MESSAGE requests and their responses, keyed by UNIQ_KEY (the batch has none)."""
    by_key, batches = {}, []
    for response in capture.responses_to(10):
        request = decode_frame(capture.frame_bytes(capture.request_of(response)))
        reply = decode_frame(capture.frame_bytes(response))
        props = decode_properties(request.fields["properties"])
        entry = (request, reply, capture.request_of(response)["client_port"])
        if "UNIQ_KEY" in props:
            by_key[props["UNIQ_KEY"]] = entry
        else:
            batches.append(entry)
    return by_key, batches


def test_readme_counts_of_stored_messages(capture):
    deliveries = pull_deliveries(capture)
    assert len(deliveries) == 11
    messages = [m for _, _, batch in deliveries for m in batch]
    assert len(messages) == 32
    assert len({m.physical_offset for m in messages}) == 13
    compressed = [m for m in messages if m.compressed]
    assert len(compressed) == 4 and len({m.physical_offset for m in compressed}) == 2


def test_every_pull_body_is_consumed_exactly_by_its_messages(capture):
    for _, _, messages in pull_deliveries(capture):
        assert all(m.magic == MAGIC_V1 for m in messages)
    for response in capture.responses_to(11):
        body = capture.body(response)
        assert sum(m.store_size for m in decode_messages(body)) == len(body)


def test_pulled_messages_belong_to_the_requested_queue_and_filter(capture):
    for request, reply, messages in pull_deliveries(capture):
        assert {m.queue_id for m in messages} == {int(request["queueId"])}
        assert all(m.topic == request["topic"] == "CapTopic" for m in messages)
        offsets = [m.queue_offset for m in messages]
        assert offsets == sorted(offsets) and offsets[0] >= int(request["queueOffset"])
        if request["subscription"] == "*":
            assert offsets == list(range(offsets[0], offsets[-1] + 1))
            assert int(reply["nextBeginOffset"]) == offsets[-1] + 1
        else:
            assert {m.tags for m in messages} == {request["subscription"]}
            assert int(reply["nextBeginOffset"]) > offsets[-1]


def test_compressed_deliveries_inflate_to_the_6000_byte_body(capture):
    compressed = [m for _, _, ms in pull_deliveries(capture) for m in ms if m.compressed]
    for msg in compressed:
        assert msg.sys_flag == 1  # zlib, no type bits: the C++ client's legacy form
        assert is_big_body(msg.body) and len(msg.body) == 6000
        assert len(msg.stored_body) == 1788 and msg.stored_body[:2] == b"\x78\x5e"
        assert msg.body_crc == zlib.crc32(msg.stored_body) & 0x7FFFFFFF
        assert msg.store_size == 1971


def test_stored_messages_match_what_was_sent(capture):
    """Broker facts (README obs. 5-7, 11): body and flags as sent, WAIT dropped, CLUSTER added,
    bornHost = the producer's socket, offset msg id = the send response's msgId."""
    by_key, _ = sent_messages(capture)
    seen = set()
    for _, _, messages in pull_deliveries(capture):
        for msg in messages:
            if msg.uniq_key is None:
                continue
            request, reply, client_port = by_key[msg.uniq_key]
            sent = decode_properties(request.fields["properties"])
            assert msg.stored_body == request.body
            assert msg.sys_flag == int(request.fields["sysFlag"])
            assert msg.flag == int(request.fields["flag"])
            assert msg.born_timestamp == int(request.fields["bornTimestamp"])
            assert msg.queue_id == int(request.fields["queueId"]) == int(reply.fields["queueId"])
            assert msg.queue_offset == int(reply.fields["queueOffset"])
            assert msg.offset_msg_id == reply.fields["msgId"]
            assert msg.born_host == f"127.0.0.1:{client_port}"
            assert msg.store_host == "127.0.0.1:10911"
            assert msg.born_timestamp <= msg.store_timestamp
            expected = {k: v for k, v in sent.items() if k != "WAIT"}
            expected["CLUSTER"] = "DefaultCluster"
            assert msg.properties == expected
            seen.add(msg.uniq_key)
    assert seen == set(by_key) and len(seen) == 12


def test_offset_msg_id_helper_agrees_with_the_broker(capture):
    by_key, batches = sent_messages(capture)
    ids = [reply.fields["msgId"] for _, reply, _ in list(by_key.values()) + batches]
    offsets = {m.physical_offset for _, _, ms in pull_deliveries(capture) for m in ms}
    host = pack_host("127.0.0.1:10911")[0]
    assert sorted(ids) == sorted(offset_msg_id(host, o) for o in offsets)


# ---------------------------------------------------------------- the C++ client's view


def client_passes(capture):
    """Messages per pass of client_view.json: pull '*', pull 'TagA', push."""
    passes = {"pulled_all": [], "pulled_taga": [], "pushed": []}
    for request, _, messages in pull_deliveries(capture):
        if request["consumerGroup"] == "CapPushGroup":
            passes["pushed"] += messages
        elif request["subscription"] == "*":
            passes["pulled_all"] += messages
        else:
            passes["pulled_taga"] += messages
    return passes


@pytest.mark.parametrize("view_pass, count", [("pulled_all", 13), ("pulled_taga", 6),
                                              ("pushed", 13)])
def test_decoded_messages_match_the_cpp_client_view(capture, view_pass, count):
    decoded = {(m.queue_id, m.queue_offset): m for m in client_passes(capture)[view_pass]}
    view = capture.client_view[view_pass]
    assert len(decoded) == len(view) == count
    for seen in view:
        msg = decoded[(seen["queue_id"], seen["queue_offset"])]
        assert msg.physical_offset == seen["commit_log_offset"]
        assert msg.store_size == seen["store_size"]
        assert msg.properties.get("color", "") == seen["color"]
        if msg.uniq_key is None:
            continue  # the send_batch message: see test_send_batch_quirk_*
        assert (msg.tags, msg.keys) == (seen["tags"], seen["keys"])
        assert msg.msg_id == msg.uniq_key == seen["msg_id"]
        assert len(msg.body) == seen["body_len"]
        assert msg.body.startswith(seen["body_head"].encode())


def test_send_results_carry_the_uniq_keys_found_in_storage(capture):
    stored = {m.uniq_key: m for m in client_passes(capture)["pulled_all"] if m.uniq_key}
    for sent in capture.client_view["sent"]:
        if sent["msg_id"]:
            assert stored[sent["msg_id"]].queue_offset == sent["offset"]


# ---------------------------------------------------------------- send_batch quirk (obs. 5)


def test_send_batch_quirk_is_one_549_byte_message_with_only_cluster(capture):
    _, batches = sent_messages(capture)
    ((request, reply, _),) = batches
    assert request.code == 10 and request.fields["batch"] == "1"
    batch_messages = {m.physical_offset: m for _, _, ms in pull_deliveries(capture) for m in ms
                      if m.uniq_key is None}
    assert len(batch_messages) == 1
    (msg,) = batch_messages.values()
    assert msg.store_size == 549
    assert (msg.queue_id, msg.queue_offset) == (0, 3)
    assert msg.properties == {"CLUSTER": "DefaultCluster"}
    assert msg.tags is None and msg.keys is None
    assert msg.stored_body == msg.body == request.body and len(msg.body) == 428
    assert msg.offset_msg_id == reply.fields["msgId"]


def test_send_batch_quirk_body_is_the_four_batch_entries(capture):
    (msg,) = {m.physical_offset: m for _, _, ms in pull_deliveries(capture) for m in ms
              if m.uniq_key is None}.values()
    entries = decode_batch(msg.body)
    assert [e.body for e in entries] == [f"batch message {i}".encode() for i in range(4)]
    props = [decode_properties(e.properties) for e in entries]
    assert [p["KEYS"] for p in props] == ["b0", "b1", "b2", "b3"]
    assert {p["TAGS"] for p in props} == {"TagA"} and {p["WAIT"] for p in props} == {"true"}
    assert len({p["UNIQ_KEY"] for p in props}) == 4


def test_send_batch_quirk_as_the_cpp_client_showed_it(capture):
    """The C++ client showed no body, tags or keys, and an offset msg id whose IPv4 bytes are
    reversed (it builds the address from a little-endian int); port and offset agree."""
    (msg,) = {m.physical_offset: m for m in client_passes(capture)["pulled_all"]
              if m.uniq_key is None}.values()
    (seen,) = [v for v in capture.client_view["pulled_all"] if v["queue_offset"] == 3
               and v["queue_id"] == 0]  # the TagA pass skipped it: it has no TAGS
    assert (seen["body_len"], seen["tags"], seen["keys"]) == (0, "", "")
    assert seen["msg_id"][8:] == msg.offset_msg_id[8:]
    assert bytes.fromhex(seen["msg_id"][:8])[::-1] == bytes.fromhex(msg.offset_msg_id[:8])
    assert (0, 3) not in {(v["queue_id"], v["queue_offset"])
                          for v in capture.client_view["pulled_taga"]}
