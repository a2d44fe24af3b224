"""SQL92 property filters on the embedded broker's pulls, over real sockets.

The genuine reference is the capture ``tests/data/capture-rocketmq-4.9.8-sql92`` (a 4.9.8 broker
with enablePropertyFilter=true, then false): its producer's frames are replayed byte for byte and
its hand-made pulls must get the genuine answers. The rest follows 4.9.8's PullMessageProcessor,
ExpressionMessageFilter, ConsumerFilterManager and DefaultMessageStore.getMessage (read from
source, not captured: the scan window, the caps, the heartbeat path's codes).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from embedded_cli import embedded_cli, printed
from raw_client import RawClient  # tests/ is on sys.path
from rocketmq_spark.client.protocol.frame import encode_frame, RemotingCommand
from rocketmq_spark.client.protocol.message import decode_messages
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.client.protocol.properties import decode_properties
from rocketmq_spark.embedded import accelerator
from rocketmq_spark.embedded.property_filter import PropertyText

CAPTURE = Path(__file__).resolve().parent / "data" / "capture-rocketmq-4.9.8-sql92"
PULL, HEART_BEAT, CHECK_CLIENT_CONFIG = 11, 34, 46
SERIALIZE = {"JSON": 0, "ROCKETMQ": 1}


def _frames():
    with open(CAPTURE / "frames.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _frame_bytes(rec) -> bytes:
    header = rec["header_text"].encode("utf-8")
    word = (SERIALIZE[rec["serialize"]] << 24) | rec["header_len"]
    return ((rec["frame_len"] - 4).to_bytes(4, "big") + word.to_bytes(4, "big") + header
            + bytes.fromhex(rec["body_hex"]))


def _replay(cluster, frames, conns):
    """Send the client requests of ``conns`` in capture order, one connection per captured
    one; returns [(request record, genuine answer record, our answer)]."""
    by_seq = {r["seq"]: r for r in frames}
    clients, out = {}, []
    try:
        for rec in frames:
            if rec["conn"] not in conns or rec["rpc"] != "request" \
                    or not rec["dir"].startswith("client->"):
                continue
            if rec["conn"] not in clients:
                addr = cluster.namesrv_addr if rec["port"] == 9876 else \
                    cluster.broker("broker-a").addr
                clients[rec["conn"]] = RawClient(addr)
            fut = clients[rec["conn"]].send_frame(_frame_bytes(rec), rec["header"]["opaque"])
            out.append((rec, by_seq[rec["response_seq"]], fut.result(5)))
    finally:
        for client in clients.values():
            client.close()
    return out


def _differences(rec, genuine, ours):
    """What differs between our answer to a captured pull and the genuine one."""
    g = genuine["header"]
    problems = []
    got = (ours.code, ours.remark, ours.flag, ours.language, ours.version, ours.opaque)
    want = (g["code"], g.get("remark"), g["flag"], g["language"], g["version"], g["opaque"])
    if got != want:
        problems.append(f"header {got} != genuine {want}")
    if list((ours.ext_fields or {}).items()) != [(k, str(v)) for k, v in
                                                 g.get("extFields", {}).items()]:
        problems.append(f"extFields {ours.ext_fields} != genuine {g.get('extFields')}")
    g_msgs = decode_messages(bytes.fromhex(genuine["body_hex"]), decompress=False)
    o_msgs = decode_messages(ours.body or b"", decompress=False)
    fields = ("queue_id", "queue_offset", "physical_offset", "store_size", "stored_body")
    if [[getattr(m, f) for f in fields] + [list(m.properties.items())] for m in o_msgs] != \
            [[getattr(m, f) for f in fields] + [list(m.properties.items())] for m in g_msgs]:
        problems.append(f"messages {[m.queue_offset for m in o_msgs]} != genuine "
                        f"{[m.queue_offset for m in g_msgs]}")
    return [f"seq {rec['seq']}: {p}" for p in problems]


def test_capture_pulls_get_the_genuine_answers_with_property_filter():
    frames = _frames()
    with EmbeddedCluster(enable_property_filter=True) as cluster:
        cluster.create_topic("SqlT", 4)
        sent = _replay(cluster, frames, {0, 1})     # the C++ producer: route, 20 sends
        assert [ours.code for _, _, ours in sent] == [0] * len(sent)
        pulls = _replay(cluster, frames, {2})       # the SQL92 pulls, bad expressions too
    assert len(pulls) == 11
    problems = [p for rec, genuine, ours in pulls for p in _differences(rec, genuine, ours)]
    assert not problems, "\n".join(problems)


def test_capture_sql92_refused_without_property_filter():
    # PullMessageProcessor: SYSTEM_ERROR "The broker does not support consumer to filter
    # message by SQL92"; the TAG pull that follows is served
    frames = _frames()
    with EmbeddedCluster() as cluster:
        cluster.create_topic("SqlT", 4)
        _replay(cluster, frames, {0, 1})
        pulls = _replay(cluster, frames, {5})
    assert [(ours.code, ours.remark) for _, _, ours in pulls] == [
        (1, "The broker does not support consumer to filter message by SQL92"), (0, "FOUND")]
    problems = [p for rec, genuine, ours in pulls for p in _differences(rec, genuine, ours)]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------- hand-made pulls


@pytest.fixture(scope="module")
def filtering():
    with EmbeddedCluster(enable_property_filter=True) as cluster:
        yield cluster


def _pull(client, topic, expression, offset=0, nums=32, sys_flag=4, group="G", sub_version=1,
          expression_type="SQL92", queue=0):
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue),
              "queueOffset": str(offset), "maxMsgNums": str(nums), "sysFlag": str(sys_flag),
              "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": str(sub_version)}
    if expression is not None:
        fields.update(subscription=expression, expressionType=expression_type)
    answer = client.request(PULL, fields, timeout=10)
    found = decode_messages(answer.body, decompress=False) if answer.body else []
    return answer, [m.queue_offset for m in found]


def _store(cluster, topic, props_by_offset):
    cluster.create_topic(topic, 1)
    for props in props_by_offset:
        cluster.append(topic, "broker-a", 0, [b"body"], properties=props)


def test_next_begin_offset_skips_filtered_messages_and_the_window_is_800(filtering):
    # DefaultMessageStore.getMessage: max(16000, maxMsgNums * 20) bytes of consume queue
    _store(filtering, "SqlWin", [{"n": str(i)} for i in range(1000)])
    with RawClient(filtering.broker("broker-a").addr) as client:
        answer, found = _pull(client, "SqlWin", "n = 900")
        assert (answer.code, answer.remark, found) == (20, "NO_MATCHED_MESSAGE", [])
        assert answer.ext_fields["nextBeginOffset"] == "800"
        answer, found = _pull(client, "SqlWin", "n = 900", offset=800)
        assert (answer.code, found, answer.ext_fields["nextBeginOffset"]) == (0, [900], "1000")
        # a larger maxMsgNums widens the window to maxMsgNums entries
        answer, found = _pull(client, "SqlWin", "n = 900", nums=1000)
        assert (answer.code, found, answer.ext_fields["nextBeginOffset"]) == (0, [900], "1000")
        # the batch stops at maxMsgNums matches; nextBeginOffset is after the last examined
        answer, found = _pull(client, "SqlWin", "n >= 10 AND n < 20", nums=3)
        assert (found, answer.ext_fields["nextBeginOffset"]) == ([10, 11, 12], "13")
        # and at the broker's 32-message cap
        answer, found = _pull(client, "SqlWin", "n > 100", offset=50, nums=64)
        assert (found, answer.ext_fields["nextBeginOffset"]) == (list(range(101, 133)), "133")


def test_properties_tags_and_keys_and_null_semantics(filtering):
    _store(filtering, "SqlProps", [{"TAGS": "A", "KEYS": "k0", "a": "1"}, {"TAGS": "B", "a": "x"},
                                   {"KEYS": "k2"}])
    with RawClient(filtering.broker("broker-a").addr) as client:
        assert _pull(client, "SqlProps", "TAGS = 'B' OR KEYS = 'k2'")[1] == [1, 2]
        assert _pull(client, "SqlProps", "a IS NULL")[1] == [2]
        assert _pull(client, "SqlProps", "a > 0")[1] == [0]          # 'x' does not convert
        assert _pull(client, "SqlProps", "a <> '1'")[1] == [1]       # NULL <> is not true
        # 4.9.8 has no CONTAINS: the word is a property name and the parser stops there
        answer, found = _pull(client, "SqlProps", "KEYS CONTAINS 'k'")
        assert (answer.code, found) == (20, [])


def test_unparsable_expression_in_the_pull_lets_everything_through(filtering):
    _store(filtering, "SqlBad", [{"a": "1"}, {}])
    with RawClient(filtering.broker("broker-a").addr) as client:
        for text in ("a >>> 3", "a = NULL", "a IN"):
            answer, found = _pull(client, "SqlBad", text)
            assert (answer.code, found) == (0, [0, 1]), text
        answer, _ = _pull(client, "SqlBad", "")   # FilterAPI.build: an empty SQL92 expression
        assert (answer.code, answer.remark) == (23, "parse the consumer's subscription failed")


def _heartbeat(client, group, topic, expression, version, expression_type="SQL92"):
    body = json.dumps({"clientID": "sql-client", "consumerDataSet": [{
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
        "groupName": group, "messageModel": "CLUSTERING", "subscriptionDataSet": [{
            "topic": topic, "subString": expression, "subVersion": version,
            "expressionType": expression_type, "classFilterMode": False}]}],
        "producerDataSet": []}).encode()
    assert client.request(HEART_BEAT, body=body).code == 0


def test_heartbeat_registered_filter_serves_pulls_without_subscription(filtering):
    # PullMessageProcessor's subscription-less path and ConsumerFilterManager
    _store(filtering, "SqlHb", [{"a": str(i)} for i in range(6)])
    with RawClient(filtering.broker("broker-a").addr) as client:
        answer, _ = _pull(client, "SqlHb", None, sys_flag=0, group="HbGood")
        assert (answer.code, answer.remark.startswith("the consumer's group info not exist")) \
            == (24, True)
        _heartbeat(client, "HbGood", "SqlHb", "a >= 4", 5)
        answer, found = _pull(client, "SqlHb", None, sys_flag=0, group="HbGood", sub_version=5)
        assert (answer.code, found) == (0, [4, 5])
        answer, _ = _pull(client, "SqlHb", None, sys_flag=0, group="HbGood", sub_version=6)
        assert (answer.code, answer.remark) == (25, "the consumer's subscription not latest")
        # an older version does not replace the registered filter; a newer one does
        _heartbeat(client, "HbGood", "SqlHb", "a < 2", 4)
        assert _pull(client, "SqlHb", None, sys_flag=0, group="HbGood", sub_version=5)[1] == [4, 5]
        _heartbeat(client, "HbGood", "SqlHb", "a < 2", 7)
        assert _pull(client, "SqlHb", None, sys_flag=0, group="HbGood", sub_version=7)[1] == [0, 1]
        # an expression that does not compile registers no filter data
        _heartbeat(client, "HbBad", "SqlHb", "a >>> 2", 5)
        answer, _ = _pull(client, "SqlHb", None, sys_flag=0, group="HbBad", sub_version=5)
        assert (answer.code, answer.remark) == (
            27, "The broker's consumer filter data is not exist!Your expression may be wrong!")


def test_heartbeat_path_and_other_types_refused_without_property_filter():
    with EmbeddedCluster() as cluster:
        _store(cluster, "SqlOff", [{"a": "1"}])
        with RawClient(cluster.broker("broker-a").addr) as client:
            _heartbeat(client, "HbOff", "SqlOff", "a = 1", 1)
            answer, _ = _pull(client, "SqlOff", None, sys_flag=0, group="HbOff")
            assert (answer.code, answer.remark) == (
                1, "The broker does not support consumer to filter message by SQL92")
            # ExpressionType.isTagType is exact: "tag" is another (unknown) type
            answer, _ = _pull(client, "SqlOff", "*", expression_type="tag")
            assert (answer.code, answer.remark) == (
                1, "The broker does not support consumer to filter message by tag")


def test_long_polled_sql92_pull_answers_the_matching_arrival(filtering):
    _store(filtering, "SqlPoll", [{"a": "0"}])
    with RawClient(filtering.broker("broker-a").addr) as client:
        fields = {"consumerGroup": "G", "topic": "SqlPoll", "queueId": "0", "queueOffset": "1",
                  "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0",
                  "suspendTimeoutMillis": "20000", "subVersion": "1",
                  "subscription": "a = 7", "expressionType": "SQL92"}
        parked = client.send(PULL, fields)
        filtering.append("SqlPoll", "broker-a", 0, [b"late"], properties={"a": "7"})
        answer = parked.result(10)
        found = [m.queue_offset for m in decode_messages(answer.body, decompress=False)]
        assert (answer.code, found, answer.ext_fields["nextBeginOffset"]) == (0, [1], "2")


def test_sql92_pull_behind_a_plain_pull_in_one_chunk_is_filtered(filtering):
    # The C fast path answers plain pulls at the start of a received chunk; a SQL92 pull must
    # go the Python way and be filtered.
    _store(filtering, "SqlChunk", [{"a": str(i)} for i in range(4)])
    assert accelerator.native_function("serve_pulls") is not None, "the C path is not built"
    common = {"consumerGroup": "G", "topic": "SqlChunk", "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
              "suspendTimeoutMillis": "0", "subVersion": "1"}
    plain = RemotingCommand(code=PULL, opaque=101, ext_fields=dict(
        common, subscription="*", expressionType="TAG"))
    sql = RemotingCommand(code=PULL, opaque=102, ext_fields=dict(
        common, subscription="a = 2", expressionType="SQL92"))
    with RawClient(filtering.broker("broker-a").addr) as client:
        futures = [client.send_frame(b"", 101), client.send_frame(b"", 102)]
        client.send_raw(encode_frame(plain) + encode_frame(sql))
        answers = [f.result(5) for f in futures]
    found = [[m.queue_offset for m in decode_messages(a.body, decompress=False)]
             for a in answers]
    assert found == [[0, 1, 2, 3], [2]]


def _check_client(client, expression, expression_type="SQL92"):
    body = json.dumps({"clientId": "sql-client", "group": "G", "subscriptionData": {
        "topic": "T", "subString": expression, "expressionType": expression_type,
        "subVersion": 1, "classFilterMode": False, "tagsSet": [], "codeSet": []}}).encode()
    answer = client.request(CHECK_CLIENT_CONFIG, body=body)
    return answer.code, answer.remark, answer.ext_fields


def test_check_client_config_as_client_manage_processor(filtering):
    # ClientManageProcessor.checkClientConfig, which Java consumers with SQL92 call first
    with RawClient(filtering.broker("broker-a").addr) as client:
        assert _check_client(client, "a > 1") == (0, None, None)
        assert _check_client(client, "TagA", "TAG") == (0, None, None)
        code, remark, _ = _check_client(client, "a >>> 1")
        assert code == 23 and "expected a property" in remark
        assert _check_client(client, "a > 1", "BLOOM") == (23, None, None)
    with EmbeddedCluster() as cluster, RawClient(cluster.broker("broker-a").addr) as client:
        assert _check_client(client, "a > 1") == (
            1, "The broker does not support consumer to filter message by SQL92", None)
        assert _check_client(client, "*", "TAG") == (0, None, None)


def test_command_line_flag_enables_property_filter():
    with embedded_cli("--topic", "SqlCli:1", "--fill", "SqlCli:3",
                      "--enable-property-filter") as (_, lines):
        [(_, _, addr)] = printed(lines, "broker")
        with RawClient(addr) as client:
            answer, found = _pull(client, "SqlCli", "KEYS IS NULL AND nothing IS NULL")
        assert (answer.code, found) == (0, [0, 1, 2])


@given(st.text(alphabet="ab\x01\x02", max_size=24), st.sampled_from(["a", "b", "ab", "ba"]))
def test_property_lookup_is_javas_string2message_properties(text, name):
    # MessageDecoder.string2messageProperties, as decode_properties implements it
    assert PropertyText(text).get(name) == decode_properties(text).get(name)
