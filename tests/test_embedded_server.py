"""The embedded RocketMQ server, over real sockets, with hand-built frames.

Every request the connector needs, the pull statuses, long polling, caps, tag filtering,
retention, persistence, ACL, TLS and the fault controls. The client side is
:class:`RawClient` (frames from ``client/protocol/frame.py`` and nothing else).
"""
from __future__ import annotations

import json
import signal
import socket
import ssl
import struct
import time

import pytest

from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.protocol.codes import SerializeType
from rocketmq_spark.client.protocol.message import (
    BatchEntry, decode_messages, encode_batch, offset_msg_id, pack_host,
)
from rocketmq_spark.client.protocol.properties import java_string_hash
from rocketmq_spark.client.protocol.route import ClusterInfo, TopicRouteData, loads_lenient
from rocketmq_spark.embedded import EmbeddedCluster
from raw_client import RawClient
from rocketmq_spark.embedded.tls import client_context
from embedded_cli import embedded_cli
from waiting import wait_until

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."

# request codes
SEND, PULL, QUERY_OFFSET, UPDATE_OFFSET, CREATE_TOPIC = 10, 11, 14, 15, 17
SEARCH, MAX_OFFSET, MIN_OFFSET, EARLIEST = 29, 30, 31, 32
HEART_BEAT, UNREGISTER, CONSUMER_LIST, NOTIFY = 34, 35, 38, 40
ROUTE, CLUSTER_INFO, TOPIC_LIST, CONSUME_STATS, SEND_V2, SEND_BATCH = 105, 106, 206, 208, 310, 320


# ------------------------------------------------------------------------------------ helpers


def pull_fields(topic, queue_id=0, offset=0, sys_flag=4, sub="*", max_nums=32, suspend=0,
                commit=0, group="G", sub_version=0):
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
              "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
              "commitOffset": str(commit), "suspendTimeoutMillis": str(suspend),
              "subVersion": str(sub_version)}
    if sub is not None:
        fields["subscription"] = sub
    return fields


def pull(client, topic, queue_id=0, offset=0, **kwargs):
    return client.request(PULL, pull_fields(topic, queue_id, offset, **kwargs))


def v2_fields(topic, queue_id=0, props="", batch=None, default_queues=4, sys_flag=0):
    fields = {"a": "P", "b": topic, "c": "TBW102", "d": str(default_queues), "e": str(queue_id),
              "f": str(sys_flag), "g": str(int(time.time() * 1000)), "h": "0", "i": props,
              "j": "0", "k": "false"}
    if batch is not None:
        fields["m"] = batch
    return fields


def send(client, topic, body, queue_id=0, tags=None, keys=None, **extra):
    props = ""
    if tags:
        props += f"TAGS\x01{tags}\x02"
    if keys:
        props += f"KEYS\x01{keys}\x02"
    for k, v in extra.items():
        props += f"{k}\x01{v}\x02"
    props += "WAIT\x01true\x02"
    resp = client.request(SEND_V2, v2_fields(topic, queue_id, props), body)
    assert resp.code == 0, resp.remark
    return resp


def messages(resp):
    return decode_messages(resp.body) if resp.code == 0 else []


@pytest.fixture
def cluster(embedded_cluster):
    """A fresh cluster for each test, not conftest's shared one: tests here stop brokers,
    count clients and use fixed names."""
    return embedded_cluster


@pytest.fixture
def ns(cluster):
    with RawClient(cluster.namesrv_addr) as client:
        yield client


@pytest.fixture
def broker_a(cluster):
    with RawClient(cluster.broker("broker-a").addr) as client:
        yield client


@pytest.fixture
def broker_b(cluster):
    with RawClient(cluster.broker("broker-b").addr) as client:
        yield client


# ------------------------------------------------------------------------------------ cluster


def test_cluster_layout(cluster):
    assert [b.name for b in cluster.brokers] == ["broker-a", "broker-b"]
    for b in cluster.brokers:
        assert b.running and b.addr.startswith("127.0.0.1:") and b.port > 0
    assert cluster.namesrv_addr.startswith("127.0.0.1:")
    assert len({cluster.namesrv_addr, *(b.addr for b in cluster.brokers)}) == 3
    with pytest.raises(KeyError):
        cluster.broker("broker-z")


# ------------------------------------------------------------------------------------ name server


def test_route_json_by_client_version(cluster, ns):
    cluster.create_topic("RouteT", queues=4)
    legacy = ns.request(ROUTE, {"topic": "RouteT"}, version=63, language="CPP")
    assert legacy.code == 0 and legacy.ext_fields is None and legacy.remark is None
    assert legacy.version == 409 and legacy.language == "JAVA"
    text = legacy.body.decode()
    assert '"brokerAddrs":{0:"127.0.0.1:' in text
    standard = ns.request(ROUTE, {"topic": "RouteT"}, version=401)
    assert '"brokerAddrs":{"0":"127.0.0.1:' in standard.body.decode()
    asked = ns.request(ROUTE, {"topic": "RouteT", "acceptStandardJsonOnly": "true"}, version=63)
    assert asked.body == standard.body
    assert legacy.body.replace(b'{0:', b'{"0":') == standard.body
    route = TopicRouteData.from_json(legacy.body)
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    assert {b.broker_name: b.broker_addrs[0] for b in route.broker_datas} == {
        b.name: b.addr for b in cluster.brokers}
    assert all(q.perm == 6 and q.read_queue_nums == 4 for q in route.queue_datas)


def test_route_single_broker_is_byte_identical_to_genuine(cluster, ns):
    cluster.create_topic("CapLike", queues=4, brokers=["broker-a"])
    resp = ns.request(ROUTE, {"topic": "CapLike"}, version=63)
    addr = cluster.broker("broker-a").addr
    expected = ('{"brokerDatas":[{"brokerAddrs":{0:"%s"},"brokerName":"broker-a",'
                '"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
                '"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
                % addr).encode()
    assert resp.body == expected


def test_route_unknown_topic(ns):
    resp = ns.request(ROUTE, {"topic": "NoSuchTopic"}, version=63)
    assert resp.code == 17 and resp.ext_fields is None
    assert resp.remark == f"No topic route info in name server for the topic: NoSuchTopic{FAQ}"


def test_cluster_info_and_topic_list(cluster, ns):
    cluster.create_topic("ListedT")
    resp = ns.request(CLUSTER_INFO, version=409)
    assert resp.code == 0 and resp.ext_fields is None
    assert b'{0:"127.0.0.1:' in resp.body  # always bare keys, even for 4.9.4+ clients
    info = ClusterInfo.from_json(resp.body)
    assert sorted(info.cluster_addr_table["DefaultCluster"]) == ["broker-a", "broker-b"]
    assert info.broker_addr_table["broker-b"].broker_addrs == {0: cluster.broker("broker-b").addr}
    topics = ns.request(TOPIC_LIST)
    assert topics.code == 0
    listed = loads_lenient(topics.body)["topicList"]
    assert "ListedT" in listed and "TBW102" in listed


def test_tbw102_route_is_the_genuine_default(ns):
    resp = ns.request(ROUTE, {"topic": "TBW102"}, version=409)
    route = TopicRouteData.from_json(resp.body)
    shapes = {(q.perm, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas}
    assert shapes == {(7, 4, 4)}


# ------------------------------------------------------------------------------------ generic


@pytest.mark.parametrize("server", ["namesrv", "broker"])
def test_unknown_code_and_oneway(cluster, server):
    addr = cluster.namesrv_addr if server == "namesrv" else cluster.broker("broker-a").addr
    with RawClient(addr) as client:
        resp = client.request(999)
        assert resp.code == 3 and resp.remark == " request type 999 not supported"
        assert resp.ext_fields is None
        client.send(999, oneway=True, opaque=4242)
        client.send(UNREGISTER if server == "broker" else ROUTE, {"clientID": "x"} if
                    server == "broker" else {"topic": "TBW102"}, oneway=True, opaque=4243)
        after = client.request(999)  # answered after the oneways were processed
        assert after.code == 3
        time.sleep(0.05)
        assert client.stray_responses == []  # nothing came back for opaques 4242 and 4243


def test_oneway_gets_no_answer_even_on_error(cluster):
    with socket.create_connection(tuple(cluster.broker("broker-a").addr.split(":"))) as sock:
        from rocketmq_spark.client.protocol.frame import RemotingCommand, encode_frame
        sock.sendall(encode_frame(RemotingCommand(code=999, flag=2, opaque=1)))
        sock.sendall(encode_frame(RemotingCommand(code=PULL, flag=2, opaque=2)))  # missing fields
        sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            sock.recv(100)


def test_binary_header_answered_in_kind(cluster, ns):
    cluster.create_topic("BinT")
    resp = ns.request(ROUTE, {"topic": "BinT"}, serialize=SerializeType.ROCKETMQ)
    assert resp.serialize_type == SerializeType.ROCKETMQ and resp.code == 0
    assert b'{"0":' in resp.body or b"{0:" in resp.body


def test_missing_header_field_is_system_error(cluster, broker_a):
    cluster.create_topic("HdrT")
    fields = pull_fields("HdrT")
    del fields["queueId"]
    resp = broker_a.request(PULL, fields)
    assert resp.code == 1 and "the custom field <queueId> is null" in resp.remark
    fields = pull_fields("HdrT")
    fields["queueOffset"] = "abc"
    resp = broker_a.request(PULL, fields)
    assert resp.code == 1 and 'NumberFormatException: For input string: "abc"' in resp.remark


def test_bad_frame_closes_connection(cluster):
    client = RawClient(cluster.broker("broker-a").addr)
    client.send_raw(b"\xff\xff\xff\xff" + b"x" * 8)  # length beyond 16 MiB
    assert client.closed.wait(2)
    client.close()


# ------------------------------------------------------------------------------------ send


def test_send_v2_stored_form(cluster, broker_a):
    cluster.create_topic("SendT", queues=4)
    props = ("KEYS\x01k0\x02TAGS\x01TagA\x02UNIQ_KEY\x010100007F0000F9E800004143CC730100\x02"
             "WAIT\x01true\x02color\x01red\x02")
    resp = broker_a.request(SEND_V2, v2_fields("SendT", 1, props), b"property message 0")
    assert resp.code == 0 and resp.remark is None
    assert list(resp.ext_fields) == ["queueId", "TRACE_ON", "MSG_REGION", "msgId", "queueOffset"]
    assert resp.ext_fields["queueId"] == "1" and resp.ext_fields["queueOffset"] == "0"
    addr = cluster.broker("broker-a").addr
    assert resp.ext_fields["msgId"] == offset_msg_id(pack_host(addr)[0], 0)
    second = send(broker_a, "SendT", b"x", queue_id=1)
    assert second.ext_fields["queueOffset"] == "1"

    got = pull(broker_a, "SendT", 1)
    msgs = messages(got)
    assert [m.queue_offset for m in msgs] == [0, 1]
    m = msgs[0]
    assert m.body == b"property message 0" and m.topic == "SendT" and m.queue_id == 1
    # genuine 4.9.8 order (Java HashMap), WAIT dropped, CLUSTER added, no trailing separator
    raw = got.body[:m.store_size]
    assert raw.endswith(b"\x00\x5c" b"color\x01red\x02KEYS\x01k0\x02UNIQ_KEY\x01"
                        b"0100007F0000F9E800004143CC730100\x02CLUSTER\x01DefaultCluster"
                        b"\x02TAGS\x01TagA")
    assert m.store_host == addr
    local = broker_a.sock.getsockname()
    assert m.born_host == f"{local[0]}:{local[1]}"
    assert m.physical_offset == 0 and msgs[1].physical_offset == m.store_size
    assert resp.ext_fields["msgId"] == m.offset_msg_id
    assert second.ext_fields["msgId"] == msgs[1].offset_msg_id
    assert m.store_timestamp >= m.born_timestamp - 1000


def test_send_v1_with_cpp_style_numbers(cluster, broker_a):
    cluster.create_topic("V1T", queues=2)
    fields = {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x", "batch": "0",
              "bornTimestamp": "1795343966401", "defaultTopic": "TBW102",
              "defaultTopicQueueNums": 4, "flag": 0, "producerGroup": "P",
              "properties": "KEYS\x01k0\x02TAGS\x01TagA\x02WAIT\x01true\x02", "queueId": 1,
              "reconsumeTimes": "0", "sysFlag": 0, "topic": "V1T", "unitMode": "0"}
    # a frame with JSON numbers inside extFields, exactly as the C++ client writes it
    header = json.dumps({"code": SEND, "extFields": fields, "flag": 0, "language": "CPP",
                         "opaque": 77, "remark": "", "version": 63},
                        separators=(",", ":")).encode()
    body = b"plain"
    frame = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    resp = broker_a.send_frame(frame, 77).result(5)
    assert resp.code == 0 and resp.ext_fields["queueId"] == "1"
    m = messages(pull(broker_a, "V1T", 1))[0]
    assert m.properties == {"KEYS": "k0", "CLUSTER": "DefaultCluster", "TAGS": "TagA"}
    assert m.born_timestamp == 1795343966401


def test_cpp_batch_flag_one_is_a_single_message(cluster, broker_a):
    """C++ clients send batches on code 10 with batch=1; 4.9.8 stores them as one message."""
    cluster.create_topic("CppBatchT", queues=1)
    body = encode_batch([BatchEntry(b"batch message %d" % i, f"KEYS\x01b{i}\x02TAGS\x01TagA\x02")
                         for i in range(4)])
    fields = v2_fields("CppBatchT", 0, "WAIT\x01true\x02", batch="1")
    resp = broker_a.request(SEND_V2, fields, body)
    assert resp.code == 0 and "," not in resp.ext_fields["msgId"]
    msgs = messages(pull(broker_a, "CppBatchT", 0))
    assert len(msgs) == 1 and msgs[0].body == body
    assert msgs[0].properties == {"CLUSTER": "DefaultCluster"}


def test_send_batch(cluster, broker_a):
    cluster.create_topic("BatchT", queues=2)
    send(broker_a, "BatchT", b"before", queue_id=1)
    entries = [BatchEntry(b"m%d" % i, f"KEYS\x01b{i}\x02TAGS\x01T{i % 2}\x02") for i in range(3)]
    entries.append(BatchEntry(b"no-trailing", "KEYS\x01b3"))
    entries.append(BatchEntry(b"no-props", ""))
    fields = v2_fields("BatchT", 1, "WAIT\x01true", batch="true")
    resp = broker_a.request(SEND_BATCH, fields, encode_batch(entries))
    assert resp.code == 0 and resp.ext_fields["queueOffset"] == "1"
    ids = resp.ext_fields["msgId"].split(",")
    msgs = messages(pull(broker_a, "BatchT", 1))
    assert [m.queue_offset for m in msgs] == [0, 1, 2, 3, 4, 5]
    assert ids == [m.offset_msg_id for m in msgs[1:]]
    tail = "CLUSTER\x01DefaultCluster\x02WAIT\x01true"  # HashMap order
    raw_props = [pull(broker_a, "BatchT", 1, m.queue_offset, max_nums=1).body for m in msgs[1:]]
    assert msgs[1].properties == {"KEYS": "b0", "TAGS": "T0", "WAIT": "true",
                                  "CLUSTER": "DefaultCluster"}
    assert raw_props[0].endswith(b"KEYS\x01b0\x02TAGS\x01T0\x02" + tail.encode())
    assert raw_props[3].endswith(b"KEYS\x01b3\x02" + tail.encode())  # separator inserted
    assert raw_props[4].endswith(b"\x00" + bytes([len(tail)]) + tail.encode())
    assert [m.body for m in msgs[1:]] == [e.body for e in entries]
    # tag codes come from the stored properties: T1 filter finds exactly message b1
    got = messages(pull(broker_a, "BatchT", 1, sub="T1"))
    assert [m.properties["KEYS"] for m in got] == ["b1"]


def test_send_errors(cluster, broker_a):
    cluster.create_topic("ErrT", queues=2)
    bad = broker_a.request(SEND_V2, v2_fields("bad topic!"), b"x")
    assert bad.code == 1 and "contains illegal characters" in bad.remark
    assert set(bad.ext_fields) == {"TRACE_ON", "MSG_REGION"}
    big_q = broker_a.request(SEND_V2, v2_fields("ErrT", 5), b"x")
    assert big_q.code == 1 and big_q.remark.startswith("request queueId[5] is illegal, TopicConfig")
    fields = v2_fields("ErrT")
    del fields["a"]
    missing = broker_a.request(SEND_V2, fields, b"x")
    assert missing.code == 1 and "<producerGroup> is null" in missing.remark
    forbidden = broker_a.request(SEND_V2, v2_fields("SCHEDULE_TOPIC_XXXX"), b"x")
    assert forbidden.code == 16


def test_auto_create_through_tbw102(cluster, ns, broker_b):
    resp = broker_b.request(SEND_V2, v2_fields("AutoT", 0, "TAGS\x01x\x02", default_queues=8),
                            b"first")
    assert resp.code == 0
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "AutoT"}).body)
    # only the broker that got the send has it: min(8, TBW102's 4) queues, perm 7 minus inherit
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
            for q in route.queue_datas] == [("broker-b", 4, 4, 6)]
    resp = broker_b.request(SEND_V2, v2_fields("AutoT2", 0, default_queues=2), b"x")
    assert cluster.topic_config("AutoT2", "broker-b").write_queue_nums == 2


def test_no_auto_create_when_disabled(embedded_cluster_factory):
    c = embedded_cluster_factory(auto_create_topics=False)
    with RawClient(c.broker("broker-a").addr) as client:
        resp = client.request(SEND_V2, v2_fields("NoAutoT"), b"x")
        assert resp.code == 17
        assert resp.remark == f"topic[NoAutoT] not exist, apply first please!{FAQ}"
    with RawClient(c.namesrv_addr) as client:
        assert client.request(ROUTE, {"topic": "TBW102"}).code == 17


# ------------------------------------------------------------------------------------ pull


def test_pull_statuses(cluster, broker_a):
    cluster.create_topic("PullT", queues=2)
    empty = pull(broker_a, "PullT", 0, 0)
    assert (empty.code, empty.remark) == (19, "NO_MESSAGE_IN_QUEUE")
    assert empty.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "0",
                                "maxOffset": "0", "minOffset": "0"}
    moved = pull(broker_a, "PullT", 0, 5)
    assert (moved.code, moved.remark, moved.ext_fields["nextBeginOffset"]) == (
        21, "NO_MESSAGE_IN_QUEUE", "0")
    for i in range(5):
        send(broker_a, "PullT", b"m%d" % i)
    found = pull(broker_a, "PullT", 0, 2)
    assert (found.code, found.remark) == (0, "FOUND")
    assert list(found.ext_fields) == ["suggestWhichBrokerId", "nextBeginOffset", "maxOffset",
                                      "minOffset"]
    assert [m.body for m in messages(found)] == [b"m2", b"m3", b"m4"]
    assert found.ext_fields["nextBeginOffset"] == "5" and found.ext_fields["maxOffset"] == "5"
    one = pull(broker_a, "PullT", 0, 5)
    assert (one.code, one.remark, one.ext_fields["nextBeginOffset"]) == (
        19, "OFFSET_OVERFLOW_ONE", "5")
    badly = pull(broker_a, "PullT", 0, 9)
    assert (badly.code, badly.remark, badly.ext_fields["nextBeginOffset"]) == (
        21, "OFFSET_OVERFLOW_BADLY", "5")
    assert cluster.truncate("PullT", "broker-a", 0, 3) == 3
    small = pull(broker_a, "PullT", 0, 1)
    assert (small.code, small.remark, small.ext_fields) == (21, "OFFSET_TOO_SMALL", {
        "suggestWhichBrokerId": "0", "nextBeginOffset": "3", "maxOffset": "5", "minOffset": "3"})
    after = pull(broker_a, "PullT", 0, 3)
    assert [m.queue_offset for m in messages(after)] == [3, 4]
    assert after.ext_fields["minOffset"] == "3"


def test_pull_request_errors(cluster, broker_a):
    cluster.create_topic("PullErrT", queues=2)
    unknown = pull(broker_a, "NoSuchT")
    assert unknown.code == 17 and unknown.ext_fields == {}
    assert unknown.remark == f"topic[NoSuchT] not exist, apply first please! {FAQ}"
    illegal = pull(broker_a, "PullErrT", 2)
    assert illegal.code == 1 and illegal.remark.startswith(
        "queueId[2] is illegal, topic:[PullErrT] topicConfig.readQueueNums:[2] "
        "consumer:[/127.0.0.1:")
    no_group = pull(broker_a, "PullErrT", 0, sys_flag=0, sub=None, group="NoHeartbeat")
    assert no_group.code == 24 and no_group.remark == f"the consumer's group info not exist{FAQ}"
    cluster.create_topic("ReadOnlyT", perm=2)
    assert pull(broker_a, "ReadOnlyT").code == 16
    sql = broker_a.request(PULL, {**pull_fields("PullErrT", sub="a > 1"),
                                  "expressionType": "SQL92"})
    assert sql.code == 1 and "by SQL92" in sql.remark


def test_pull_caps(cluster, broker_a):
    cluster.create_topic("CapT", queues=1)
    cluster.append("CapT", "broker-a", 0, [b"x" * 10] * 100)
    assert len(messages(pull(broker_a, "CapT", max_nums=64))) == 32
    assert len(messages(pull(broker_a, "CapT", max_nums=10))) == 10
    r = pull(broker_a, "CapT", 0, 90, max_nums=32)
    assert len(messages(r)) == 10 and r.ext_fields["nextBeginOffset"] == "100"
    cluster.append("CapT", "broker-a", 0, [b"y" * 100_000] * 5)
    r = pull(broker_a, "CapT", 0, 100)
    assert [len(m.body) for m in messages(r)] == [100_000, 100_000]  # third would pass 256 KiB
    assert r.ext_fields["nextBeginOffset"] == "102"
    cluster.append("CapT", "broker-a", 0, [b"z" * 300_000])
    r = pull(broker_a, "CapT", 0, 105)
    assert len(messages(r)) == 1  # the first message always comes, whatever its size


def test_pull_caps_are_configurable(embedded_cluster_factory):
    c = embedded_cluster_factory(max_transfer_count=5, max_transfer_bytes=1000)
    c.create_topic("CfgCapT", queues=1)
    c.append("CfgCapT", "broker-a", 0, [b"x"] * 20)
    with RawClient(c.broker("broker-a").addr) as client:
        assert len(messages(pull(client, "CfgCapT"))) == 5
        c.append("CfgCapT", "broker-a", 0, [b"y" * 300] * 5)  # ~420-byte records
        assert len(messages(pull(client, "CfgCapT", 0, 20))) == 2


def test_tag_filter_by_hash_code(cluster, broker_a):
    cluster.create_topic("TagT", queues=1)
    for i, tag in enumerate(["a", "b", "a", None, "c", "Aa", "BB"]):
        send(broker_a, "TagT", b"m%d" % i, tags=tag)
    r = pull(broker_a, "TagT", sub="a")
    assert [m.queue_offset for m in messages(r)] == [0, 2]
    assert r.ext_fields["nextBeginOffset"] == "7"  # every entry of the window was examined
    assert [m.queue_offset for m in messages(pull(broker_a, "TagT", sub=" a || c "))] == [0, 2, 4]
    # the broker compares Java hash codes: "Aa" and "BB" collide, clients re-check tags
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert [m.tags for m in messages(pull(broker_a, "TagT", sub="Aa"))] == ["Aa", "BB"]
    assert len(messages(pull(broker_a, "TagT", sub="*"))) == 7
    assert len(messages(pull(broker_a, "TagT", sub=""))) == 7
    # the cap counts matched messages only
    r = pull(broker_a, "TagT", sub="a", max_nums=1)
    assert [m.queue_offset for m in messages(r)] == [0] and r.ext_fields["nextBeginOffset"] == "1"


def test_no_matched_window(cluster, broker_a):
    cluster.create_topic("WindowT", queues=1)
    cluster.append("WindowT", "broker-a", 0, [b"b"] * 1000, tags="b")
    cluster.append("WindowT", "broker-a", 0, [b"a"], tags="a")
    r = pull(broker_a, "WindowT", sub="a")
    assert (r.code, r.remark, r.ext_fields["nextBeginOffset"]) == (20, "NO_MATCHED_MESSAGE", "800")
    r = pull(broker_a, "WindowT", 0, 800, sub="a")
    assert [m.queue_offset for m in messages(r)] == [1000]
    assert r.ext_fields["nextBeginOffset"] == "1001"
    # window = max(16000, maxMsgNums * 20) bytes of 20-byte entries
    r = pull(broker_a, "WindowT", sub="a", max_nums=1000)
    assert (r.code, r.ext_fields["nextBeginOffset"]) == (20, "1000")
    r = pull(broker_a, "WindowT", sub="a", max_nums=1001)
    assert [m.queue_offset for m in messages(r)] == [1000]


def test_long_poll_expiry(cluster, broker_a):
    cluster.create_topic("LpT", queues=1)
    start = time.monotonic()
    r = pull(broker_a, "LpT", sys_flag=6, suspend=600)
    elapsed = time.monotonic() - start
    assert 0.55 < elapsed < 3
    assert (r.code, r.remark) == (19, "NO_MESSAGE_IN_QUEUE")
    send(broker_a, "LpT", b"one")
    start = time.monotonic()
    r = pull(broker_a, "LpT", 0, 1, sys_flag=6, suspend=500)
    assert time.monotonic() - start > 0.45
    assert (r.code, r.remark, r.ext_fields["nextBeginOffset"]) == (19, "OFFSET_OVERFLOW_ONE", "1")


def test_long_poll_wakes_on_matching_arrival(cluster, broker_a, broker_b):
    cluster.create_topic("LpWakeT", queues=2)
    pending = broker_a.send(PULL, pull_fields("LpWakeT", 0, 0, sys_flag=6, suspend=20000,
                                              sub="want"))
    other = broker_a.send(PULL, pull_fields("LpWakeT", 1, 0, sys_flag=6, suspend=20000))
    time.sleep(0.1)
    send(broker_a, "LpWakeT", b"skip", tags="other")  # does not match: stays parked
    send(broker_b, "LpWakeT", b"elsewhere", tags="want")  # other broker
    time.sleep(0.2)
    assert not pending.done() and not other.done()
    start = time.monotonic()
    send(broker_a, "LpWakeT", b"hit", tags="want")
    r = pending.result(2)
    assert time.monotonic() - start < 1
    assert (r.code, r.remark) == (0, "FOUND")
    assert [(m.queue_offset, m.body) for m in messages(r)] == [(1, b"hit")]
    assert r.ext_fields["nextBeginOffset"] == "2"
    cluster.append("LpWakeT", "broker-a", 1, [b"direct"])
    assert [m.body for m in messages(other.result(2))] == [b"direct"]


def test_long_poll_commit_only_on_first_run_and_closed_connection(cluster):
    cluster.create_topic("LpCommitT", queues=1)
    client = RawClient(cluster.broker("broker-a").addr)
    fut = client.send(PULL, pull_fields("LpCommitT", 0, 0, sys_flag=7, commit=0, suspend=20000,
                                        group="LpG"))
    time.sleep(0.1)
    assert cluster.consumer_offset("LpG", "LpCommitT", "broker-a", 0) == 0
    client.close()
    with pytest.raises(ConnectionError):
        fut.result(2)
    time.sleep(0.1)
    cluster.append("LpCommitT", "broker-a", 0, [b"x"])  # nobody to wake; must not fail
    with RawClient(cluster.broker("broker-a").addr) as c2:
        assert pull(c2, "LpCommitT").code == 0


def test_commit_offset_bit(cluster, broker_a):
    cluster.create_topic("CommitT", queues=1)
    send(broker_a, "CommitT", b"x")
    pull(broker_a, "CommitT", 0, 0, sys_flag=5, commit=7, group="CG")
    assert cluster.consumer_offset("CG", "CommitT", "broker-a", 0) == 7
    pull(broker_a, "CommitT", 0, 0, sys_flag=4, commit=9, group="CG")  # bit 0 not set
    assert cluster.consumer_offset("CG", "CommitT", "broker-a", 0) == 7


# ------------------------------------------------------------------------------------ offsets


def test_consumer_offsets(cluster, broker_a):
    cluster.create_topic("OffT", queues=2)
    q = {"consumerGroup": "OG", "topic": "OffT", "queueId": "0"}
    first = broker_a.request(QUERY_OFFSET, q)
    assert (first.code, first.ext_fields, first.remark) == (0, {"offset": "0"}, None)
    upd = broker_a.request(UPDATE_OFFSET, {**q, "commitOffset": "12"})
    assert (upd.code, upd.ext_fields, upd.remark) == (0, {}, None)
    assert broker_a.request(QUERY_OFFSET, q).ext_fields == {"offset": "12"}
    broker_a.send(UPDATE_OFFSET, {**q, "commitOffset": "3"}, oneway=True)  # backwards is fine
    time.sleep(0.05)
    assert broker_a.request(QUERY_OFFSET, q).ext_fields == {"offset": "3"}
    assert cluster.consumer_offset("OG", "OffT", "broker-a", 0) == 3
    assert cluster.consumer_offset("OG", "OffT", "broker-b", 0) is None
    # nothing stored and the queue's head was truncated: QUERY_NOT_FOUND
    cluster.append("OffT", "broker-a", 1, [b"x"] * 3)
    cluster.truncate("OffT", "broker-a", 1, 2)
    q1 = {**q, "queueId": "1"}
    nf = broker_a.request(QUERY_OFFSET, q1)
    assert (nf.code, nf.ext_fields) == (22, {})
    assert nf.remark == "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


def test_max_min_earliest(cluster, broker_a):
    def offset(code, topic, queue_id):
        r = broker_a.request(code, {"topic": topic, "queueId": str(queue_id)})
        assert r.code == 0 and list(r.ext_fields) == ["offset"]
        return int(r.ext_fields["offset"])

    cluster.create_topic("MaxT", queues=2)
    assert offset(MAX_OFFSET, "MaxT", 0) == 0
    assert offset(MAX_OFFSET, "Unknown", 9) == 0 and offset(MIN_OFFSET, "Unknown", 9) == 0
    e = broker_a.request(EARLIEST, {"topic": "MaxT", "queueId": "0"})
    assert (e.code, e.ext_fields) == (0, {"timestamp": "-1"})
    cluster.append("MaxT", "broker-a", 0, [b"a", b"b", b"c"])
    assert offset(MAX_OFFSET, "MaxT", 0) == 3
    cluster.truncate("MaxT", "broker-a", 0, 1)
    assert offset(MIN_OFFSET, "MaxT", 0) == 1
    msgs = messages(pull(broker_a, "MaxT", 0, 1))
    e = broker_a.request(EARLIEST, {"topic": "MaxT", "queueId": "0"})
    assert e.ext_fields == {"timestamp": str(msgs[0].store_timestamp)}
    assert cluster.max_offset("MaxT", "broker-a", 0) == 3
    assert cluster.min_offset("MaxT", "broker-a", 0) == 1


def _stamped(cluster, client, topic, n):
    """n messages, each stored in a later millisecond than the previous one."""
    for i in range(n):
        cluster.append(topic, "broker-a", 0, [b"t%d" % i])
        time.sleep(0.003)
    return [m.store_timestamp for m in messages(pull(client, topic))]


def test_search_offset_by_timestamp_lower(cluster, broker_a):
    cluster.create_topic("SearchT", queues=1)
    empty = broker_a.request(SEARCH, {"topic": "SearchT", "queueId": "0", "timestamp": "1"})
    assert empty.ext_fields == {"offset": "0"}
    ts = _stamped(cluster, broker_a, "SearchT", 5)
    assert sorted(set(ts)) == ts and len(set(ts)) == 5

    def search(t, **extra):
        r = broker_a.request(SEARCH, {"topic": "SearchT", "queueId": "0", "timestamp": str(t),
                                      **extra})
        assert r.code == 0 and list(r.ext_fields) == ["offset"]
        return int(r.ext_fields["offset"])

    assert [search(t) for t in ts] == [0, 1, 2, 3, 4]
    assert search(ts[2] - 1) == 2 and search(ts[2] + 1) == 3  # first stored at or after
    assert search(ts[0] - 10_000) == 0
    assert search(ts[-1] + 10_000) == 5  # every message older: max offset
    assert search(ts[2] + 1, boundaryType="UPPER") == 2
    assert search(ts[0] - 1, boundaryType="upper") == 0
    cluster.truncate("SearchT", "broker-a", 0, 2)
    assert search(ts[0]) == 2


def test_search_offset_nearest_mode(embedded_cluster_factory):
    c = embedded_cluster_factory(search_by_time="nearest")
    c.create_topic("NearT", queues=1)
    with RawClient(c.broker("broker-a").addr) as client:
        ts = _stamped(c, client, "NearT", 3)

        def search(t):
            r = client.request(SEARCH, {"topic": "NearT", "queueId": "0", "timestamp": str(t)})
            return int(r.ext_fields["offset"])

        assert search(ts[-1] + 10_000) == 2  # 4.x: the last message, not max
        assert search(ts[1]) == 1
        assert search(ts[1] + 1) in (1, 2)


# ------------------------------------------------------------------------------------ clients


def heartbeat_body(client_id, group, topics=("HbT",), sub="*", consume_type=1):
    subs = ",".join('{"subString":"%s","subVersion":"1","topic":"%s"}' % (sub, t) for t in topics)
    return ('{"clientID":"%s","consumerDataSet":[{"consumeFromWhere":0,"consumeType":%d,'
            '"groupName":"%s","messageModel":1,"subscriptionDataSet":[%s]}]}\n'
            % (client_id, consume_type, group, subs)).encode()


def test_heartbeat_registry_and_notify(cluster, ns):
    cluster.create_topic("HbT", queues=2)
    addr = cluster.broker("broker-a").addr
    c1, c2 = RawClient(addr), RawClient(addr)
    try:
        hb = c1.request(HEART_BEAT, body=heartbeat_body("client-1", "HbG"), language="CPP",
                        version=63)
        assert (hb.code, hb.ext_fields, hb.remark) == (0, None, None)
        note = c1.wait_server_request(NOTIFY, 2)
        assert note is not None and note.ext_fields == {"consumerGroup": "HbG"}
        assert note.flag == 2 and note.language == "JAVA"
        # same heartbeat again: no change, no notification
        c1.request(HEART_BEAT, body=heartbeat_body("client-1", "HbG"))
        time.sleep(0.05)
        assert len([r for r in c1.server_requests if r.code == NOTIFY]) == 1
        retry = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "%RETRY%HbG"}).body)
        assert [(q.read_queue_nums, q.perm) for q in retry.queue_datas] == [(1, 6)]

        c2.request(HEART_BEAT, body=heartbeat_body("client-2", "HbG"))
        assert c2.wait_server_request(NOTIFY, 2) is not None
        assert c1.wait_server_request(NOTIFY, 2, start=1) is not None  # members are told
        lst = c1.request(CONSUMER_LIST, {"consumerGroup": "HbG"})
        assert (lst.code, lst.ext_fields) == (0, {})
        assert sorted(loads_lenient(lst.body)["consumerIdList"]) == ["client-1", "client-2"]
        assert sorted(cluster.consumer_clients("HbG")) == ["client-1", "client-2"]

        un = c2.request(UNREGISTER, {"clientID": "client-2", "consumerGroup": "HbG",
                                     "producerGroup": ""})
        assert (un.code, un.ext_fields) == (0, {})
        assert c1.wait_server_request(NOTIFY, 2, start=2) is not None
        assert loads_lenient(c1.request(CONSUMER_LIST, {"consumerGroup": "HbG"}).body)[
            "consumerIdList"] == ["client-1"]
    finally:
        c1.close()
        c2.close()
    wait_until(lambda: not cluster.consumer_clients("HbG"), 2,
               "the closed clients to leave the group")
    with RawClient(addr) as c3:
        gone = c3.request(CONSUMER_LIST, {"consumerGroup": "HbG"})
        assert (gone.code, gone.ext_fields, gone.remark) == (
            1, {}, "no consumer for this group, HbG")


def test_heartbeat_subscription_used_by_pull_without_subscription_flag(cluster, broker_a):
    cluster.create_topic("HbSubT", queues=1)
    for tag in ["a", "b", "a"]:
        send(broker_a, "HbSubT", tag.encode(), tags=tag)
    body = ('{"clientID":"j1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",'
            '"consumeType":"CONSUME_PASSIVELY","groupName":"HbSubG","messageModel":"CLUSTERING",'
            '"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[97],"expressionType":'
            '"TAG","subString":"a","subVersion":5,"tagsSet":["a"],"topic":"HbSubT"}],'
            '"unitMode":false}],"producerDataSet":[]}').encode()
    assert broker_a.request(HEART_BEAT, body=body).code == 0
    r = pull(broker_a, "HbSubT", sys_flag=2, sub=None, group="HbSubG", sub_version=5)
    assert [m.body for m in messages(r)] == [b"a", b"a"]
    newer = pull(broker_a, "HbSubT", sys_flag=2, sub=None, group="HbSubG", sub_version=6)
    assert (newer.code, newer.remark) == (25, "the consumer's subscription not latest")
    other = pull(broker_a, "OtherT", sys_flag=2, sub=None, group="HbSubG")
    assert other.code == 17
    cluster.create_topic("OtherT", queues=1)
    other = pull(broker_a, "OtherT", sys_flag=2, sub=None, group="HbSubG")
    assert (other.code, other.remark) == (24, f"the consumer's subscription not exist{FAQ}")


def test_expired_heartbeat_drops_client(embedded_cluster_factory):
    c = embedded_cluster_factory(brokers=1, channel_expiry_seconds=0.5, housekeeping_interval=0.1)
    c.create_topic("ExpT")
    client = RawClient(c.broker("broker-a").addr)
    client.request(HEART_BEAT, body=heartbeat_body("exp-1", "ExpG", ("ExpT",)))
    assert c.consumer_clients("ExpG") == ["exp-1"]
    assert client.closed.wait(3)  # the genuine broker closes channels that stop heartbeating
    assert c.consumer_clients("ExpG") == []
    client.close()


def test_producer_heartbeat_and_unregister(cluster, broker_a):
    body = b'{"clientID":"p-1","producerDataSet":[{"groupName":"PG"}]}\n'
    assert broker_a.request(HEART_BEAT, body=body).code == 0
    r = broker_a.request(UNREGISTER, {"clientID": "p-1", "producerGroup": "PG",
                                      "consumerGroup": ""})
    assert (r.code, r.ext_fields) == (0, {})


def test_consume_stats(cluster, broker_a):
    cluster.create_topic("StatsT", queues=2)
    cluster.append("StatsT", "broker-a", 0, [b"x"] * 5)
    broker_a.request(UPDATE_OFFSET, {"consumerGroup": "SG", "topic": "StatsT", "queueId": "0",
                                     "commitOffset": "3"})
    r = broker_a.request(CONSUME_STATS, {"consumerGroup": "SG"})
    assert r.code == 0
    # fastjson writes MessageQueue map keys as objects
    assert '"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"StatsT"}:' \
           '{"brokerOffset":5,"consumerOffset":3,' in r.body.decode()
    assert '{"brokerName":"broker-a","queueId":1,"topic":"StatsT"}:{"brokerOffset":0,' \
           '"consumerOffset":0,"lastTimestamp":0}' in r.body.decode()


# ------------------------------------------------------------------------------------ admin


def test_update_and_create_topic(cluster, ns, broker_a):
    fields = {"readQueueNums": "4", "perm": "6", "writeQueueNums": "2",
              "topicFilterType": "SINGLE_TAG", "topic": "AdminT", "defaultTopic": "TBW102",
              "topicSysFlag": "0", "order": "false"}
    r = broker_a.request(CREATE_TOPIC, fields, language="JAVA")
    assert (r.code, r.ext_fields, r.remark) == (0, None, "not set any response code")
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "AdminT"}).body)
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4, 2)]
    sys_topic = broker_a.request(CREATE_TOPIC, {**fields, "topic": "TBW102"})
    assert (sys_topic.code, sys_topic.remark) == (
        1, "The topic[TBW102] is conflict with system topic.")
    bad = broker_a.request(CREATE_TOPIC, {**fields, "topic": "a/b"})
    assert bad.code == 1 and "illegal characters" in bad.remark


def test_add_queues_while_running(cluster, ns, broker_a):
    cluster.create_topic("GrowT", queues=2)
    cluster.append("GrowT", "broker-a", 1, [b"kept"])
    cluster.add_queues("GrowT", 6, brokers=["broker-a"])
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "GrowT"}).body)
    nums = {q.broker_name: (q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas}
    assert nums == {"broker-a": (6, 6), "broker-b": (2, 2)}
    send(broker_a, "GrowT", b"new", queue_id=5)
    assert [m.body for m in messages(pull(broker_a, "GrowT", 5))] == [b"new"]
    assert [m.body for m in messages(pull(broker_a, "GrowT", 1))] == [b"kept"]


def test_read_write_queue_counts(cluster, ns, broker_a):
    cluster.create_topic("RwT", read_queues=4, write_queues=2)
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "RwT"}).body)
    assert {(q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas} == {(4, 2)}
    assert len(route.readable_queues("RwT")) == 8 and len(route.writable_queues("RwT")) == 4
    assert pull(broker_a, "RwT", 3).code == 19


# ------------------------------------------------------------------------------------ lifecycle


def test_broker_stop_start_same_port(cluster, ns):
    cluster.create_topic("StopT", queues=1)
    cluster.append("StopT", "broker-a", 0, [b"survives"])
    a = cluster.broker("broker-a")
    port = a.port
    client = RawClient(a.addr)
    a.stop()
    assert not a.running
    assert client.closed.wait(2)
    client.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "StopT"}).body)
    assert [q.broker_name for q in route.queue_datas] == ["broker-b"]
    a.start()
    assert a.running and a.port == port
    route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "StopT"}).body)
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    with RawClient(a.addr) as again:
        assert [m.body for m in messages(pull(again, "StopT"))] == [b"survives"]


def test_a_client_that_connects_just_before_a_stop_is_disconnected(cluster):
    """Stopping right after a connect once left the accepted socket open and unserved (asyncio's
    Server, closed between accept and transport, leaks it): up to 3 stops in 100 hit that."""
    broker = cluster.broker("broker-a")
    for attempt in range(1000):
        client = RawClient(broker.addr)
        broker.stop()
        try:
            assert client.closed.wait(2), f"still connected to the stopped broker ({attempt})"
        finally:
            client.close()
            broker.start()


def test_all_brokers_stopped_means_no_route(embedded_cluster_factory):
    c = embedded_cluster_factory(brokers=1)
    c.create_topic("GoneT")
    c.brokers[0].stop()
    with RawClient(c.namesrv_addr) as client:
        assert client.request(ROUTE, {"topic": "GoneT"}).code == 17


def test_drop_connections(cluster):
    clients = [RawClient(cluster.namesrv_addr), RawClient(cluster.broker("broker-a").addr),
               RawClient(cluster.broker("broker-b").addr)]
    for c in clients:
        assert c.request(999).code == 3  # the server has accepted the connection
    cluster.drop_connections()
    for c in clients:
        assert c.closed.wait(2)
        c.close()
    with RawClient(cluster.broker("broker-a").addr) as c:
        assert c.request(999).code == 3


def test_stop_start_namesrv(cluster):
    addr = cluster.namesrv_addr
    cluster.stop_namesrv()
    with pytest.raises(OSError):
        RawClient(addr, timeout=1)
    with RawClient(cluster.broker("broker-a").addr) as b:  # brokers keep serving
        assert b.request(999).code == 3
    cluster.start_namesrv()
    assert cluster.namesrv_addr == addr
    with RawClient(addr) as c:
        assert c.request(ROUTE, {"topic": "TBW102"}).code == 0


def test_persistence_across_restart(tmp_path):
    data = tmp_path / "data"
    with EmbeddedCluster(brokers=2, data_dir=data) as c:
        c.create_topic("PersistT", queues=2)
        with RawClient(c.broker("broker-a").addr) as client:
            for i in range(5):
                send(client, "PersistT", b"p%d" % i, queue_id=i % 2, tags="t")
            client.request(UPDATE_OFFSET, {"consumerGroup": "PG", "topic": "PersistT",
                                           "queueId": "0", "commitOffset": "2"})
            before = pull(client, "PersistT", 0).body
        c.create_topic("OnlyB", queues=3, brokers=["broker-b"])
        c.truncate("PersistT", "broker-a", 1, 1)
        port_a = c.broker("broker-a").port
        namesrv = c.namesrv_addr
    log_size = (data / "broker-a" / "commitlog").stat().st_size
    with EmbeddedCluster(brokers=2, data_dir=data) as c:
        assert c.broker("broker-a").port == port_a  # the previous ports, when free
        assert c.namesrv_addr == namesrv
        assert c.consumer_offset("PG", "PersistT", "broker-a", 0) == 2
        assert c.max_offset("PersistT", "broker-a", 0) == 3
        assert c.min_offset("PersistT", "broker-a", 1) == 1
        assert c.max_offset("PersistT", "broker-a", 1) == 2
        assert c.topic_config("OnlyB", "broker-b").read_queue_nums == 3
        assert c.topic_config("OnlyB", "broker-a") is None
        with RawClient(c.broker("broker-a").addr) as client:
            assert pull(client, "PersistT", 0).body == before  # byte-identical records
            r = send(client, "PersistT", b"after", queue_id=0)
            assert r.ext_fields["queueOffset"] == "3"
            msgs = messages(pull(client, "PersistT", 0))
            assert msgs[-1].physical_offset == log_size  # the commit log continues
            assert [m.tags for m in messages(pull(client, "PersistT", 0, sub="t"))] == ["t"] * 3


def test_persistence_survives_torn_tail(tmp_path):
    data = tmp_path / "data"
    with EmbeddedCluster(data_dir=data) as c:
        c.append("TornT", "broker-a", 0, [b"whole-1", b"whole-2"])
    log_file = data / "broker-a" / "commitlog"
    with open(log_file, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00garbage")
    with EmbeddedCluster(data_dir=data) as c:
        assert c.max_offset("TornT", "broker-a", 0) == 2
        c.append("TornT", "broker-a", 0, [b"whole-3"])
    with EmbeddedCluster(data_dir=data) as c:
        with RawClient(c.broker("broker-a").addr) as client:
            assert [m.body for m in messages(pull(client, "TornT"))] == [
                b"whole-1", b"whole-2", b"whole-3"]


# ------------------------------------------------------------------------------------ faults


def test_fail_next(cluster, broker_a, broker_b):
    cluster.create_topic("FaultT", queues=1)
    cluster.fail_next(2, 2, "[REJECTREQUEST]system busy", request_codes=[PULL], broker="broker-a")
    assert broker_a.request(MAX_OFFSET, {"topic": "FaultT", "queueId": "0"}).code == 0
    assert pull(broker_b, "FaultT").code == 19
    r = pull(broker_a, "FaultT")
    assert (r.code, r.remark) == (2, "[REJECTREQUEST]system busy")
    assert pull(broker_a, "FaultT").code == 2
    assert pull(broker_a, "FaultT").code == 19
    cluster.fail_next(1, 17, broker="namesrv")
    with RawClient(cluster.namesrv_addr) as ns:
        assert ns.request(ROUTE, {"topic": "TBW102"}).code == 17
        assert ns.request(ROUTE, {"topic": "TBW102"}).code == 0
    cluster.fail_next(5, 1, request_codes=[PULL])
    cluster.clear_faults()
    assert pull(broker_a, "FaultT").code == 19


def test_delay_next(cluster, broker_a):
    cluster.create_topic("DelayT", queues=1)
    cluster.delay_next(1, 0.4, request_codes=[MAX_OFFSET])
    slow = broker_a.send(MAX_OFFSET, {"topic": "DelayT", "queueId": "0"})
    start = time.monotonic()
    fast = broker_a.request(MIN_OFFSET, {"topic": "DelayT", "queueId": "0"})  # not held up
    assert fast.code == 0 and not slow.done()
    assert slow.result(2).code == 0
    assert time.monotonic() - start >= 0.35


# ------------------------------------------------------------------------------------ ACL and TLS


def test_acl(embedded_cluster_factory):
    c = embedded_cluster_factory(acl={"ak": "sk"})
    c.create_topic("AclT", queues=1)
    creds = Credentials("ak", "sk")
    with RawClient(c.broker("broker-a").addr) as b:
        unsigned = pull(b, "AclT")
        assert unsigned.code == 1 and unsigned.remark.startswith(
            "org.apache.rocketmq.acl.common.AclException: No accessKey is configured")
        fields = creds.sign(pull_fields("AclT"))
        fields["Signature"] = "AAAA" + fields["Signature"][4:]
        wrong = b.request(PULL, fields)
        assert wrong.code == 1 and "Check signature failed for accessKey=ak" in wrong.remark
        cpp_style = b.request(PULL, {**pull_fields("AclT"), "AccessKey": "", "Signature": "x"})
        assert cpp_style.code == 1 and "No acl config for " in cpp_style.remark
        ok = b.request(PULL, creds.sign(pull_fields("AclT")))
        assert ok.code == 19
        body = b"signed body"
        sent = b.request(SEND_V2, creds.sign(v2_fields("AclT"), body), body)
        assert sent.code == 0
        tampered = b.request(SEND_V2, creds.sign(v2_fields("AclT"), body), body + b"!")
        assert tampered.code == 1
    with RawClient(c.namesrv_addr) as ns:  # name servers do not check ACL
        assert ns.request(ROUTE, {"topic": "AclT"}).code == 0


def test_tls_enforcing(embedded_cluster_factory):
    c = embedded_cluster_factory(brokers=1, tls="enforcing")
    cert = c.tls_settings.certfile
    with RawClient(c.namesrv_addr, ssl_context=client_context(cert)) as ns:
        assert ns.request(ROUTE, {"topic": "TBW102"}).code == 0
    with RawClient(c.broker("broker-a").addr, ssl_context=client_context()) as b:
        assert b.request(MAX_OFFSET, {"topic": "TBW102", "queueId": "0"}).code == 0
    plain = RawClient(c.broker("broker-a").addr)
    try:
        with pytest.raises((TimeoutError, ConnectionError)):
            plain.request(999, timeout=1)
    finally:
        plain.close()


def test_tls_permissive_accepts_both(embedded_cluster_factory):
    c = embedded_cluster_factory(brokers=1, tls="permissive")
    for addr in (c.namesrv_addr, c.broker("broker-a").addr):
        with RawClient(addr, ssl_context=client_context(c.tls_settings.certfile)) as tls_client:
            assert tls_client.request(999).code == 3
            assert isinstance(tls_client.sock, ssl.SSLSocket)
        with RawClient(addr) as plain:
            assert plain.request(999).code == 3
    c.brokers[0].stop()
    c.brokers[0].start()
    with RawClient(c.broker("broker-a").addr, ssl_context=client_context()) as again:
        assert again.request(999).code == 3


# ------------------------------------------------------------------------------------ CLI


def test_cli(tmp_path):
    with embedded_cli("--brokers", "2", "--data-dir", str(tmp_path / "cli"), "--topic",
                      "CliT:3", "--fill", "CliT:30:16") as (proc, lines):
        assert lines[0][0] == "namesrv" and lines[0][1].startswith("127.0.0.1:")
        assert [ln[1] for ln in lines[1:3]] == ["broker-a", "broker-b"]
        with RawClient(lines[0][1]) as ns:
            route = TopicRouteData.from_json(ns.request(ROUTE, {"topic": "CliT"}).body)
            assert len(route.readable_queues("CliT")) == 6
        total = 0
        for _, _, addr in lines[1:3]:
            with RawClient(addr) as b:
                for q in range(3):
                    r = b.request(MAX_OFFSET, {"topic": "CliT", "queueId": str(q)})
                    total += int(r.ext_fields["offset"])
        assert total == 30
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert (tmp_path / "cli" / "broker-a" / "commitlog").stat().st_size > 0


def test_append_can_back_date_but_never_before_the_queue_s_last_message(cluster):
    cluster.create_topic("HistoryT", queues=1)
    cluster.append("HistoryT", "broker-a", 0, [b"old"] * 3, store_timestamp=1_000_000)
    cluster.append("HistoryT", "broker-a", 0, [b"later"], store_timestamp=2_000_000)
    assert [cluster.store_time("HistoryT", "broker-a", 0, o) for o in range(4)] == \
        [1_000_000] * 3 + [2_000_000]
    with pytest.raises(ValueError, match="older than the last message"):
        cluster.append("HistoryT", "broker-a", 0, [b"x"], store_timestamp=1_500_000)
    cluster.append("HistoryT", "broker-a", 0, [b"now"])  # an undated append is stored now
    assert cluster.store_time("HistoryT", "broker-a", 0, 4) > 2_000_000
    assert cluster.store_time("HistoryT", "broker-a", 0, 5) is None
