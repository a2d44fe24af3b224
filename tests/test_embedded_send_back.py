"""CONSUMER_SEND_MSG_BACK (36), retry topics and dead letters on the embedded broker, as 4.9.8.

The genuine reference is the capture ``tests/data/capture-rocketmq-4.9.8-retry-dlq`` (a copy of
shared/captures/rocketmq-4.9.8-retry-dlq without the pcap): Apache's C++ push consumer failing
messages on a 4.9.8 broker (send-back, redelivery through ``%RETRY%CapRetryGroup`` after delay
level 3) and a hand-made send-back with ``maxReconsumeTimes`` 1 that moved a message to
``%DLQ%CapRetryGroup``. Its client requests are replayed, in order, against a fresh embedded
broker whose delay levels are milliseconds; every answer must be the genuine one, stored records
included. Refusals the capture does not show are checked against Apache's source:
broker/src/main/java/org/apache/rocketmq/broker/processor/SendMessageProcessor.java
(asyncConsumerSendMsgBack, handleRetryAndDLQ) and
broker/src/main/java/org/apache/rocketmq/broker/subscription/SubscriptionGroupManager.java
(findSubscriptionGroupConfig).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, List

import pytest

from rocketmq_spark.client.errors import ResponseError
from rocketmq_spark.client.protocol.codes import ResponseCode
from rocketmq_spark.client.protocol.message import (
    decode_messages, pack_host, parse_offset_msg_id,
)
from rocketmq_spark.client.protocol.route import TopicRouteData
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.group.send_back import send_back_command, send_message_back
from rocketmq_spark.embedded import EmbeddedCluster
from raw_client import RawClient
from waiting import wait_until

RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"

CAPTURE = Path(__file__).resolve().parent / "data" / "capture-rocketmq-4.9.8-retry-dlq"
GENUINE_BROKER = "127.0.0.1:10911"
GENUINE_HOST_HEX = pack_host(GENUINE_BROKER)[0].hex().upper()
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
SEND_BACK, SEND, PULL, MAX_OFFSET, ROUTE = 36, 10, 11, 30, 105
UPDATE_SUBSCRIPTION_GROUP, HEART_BEAT = 200, 34
# the default table's 18 levels, in milliseconds instead of seconds and minutes
FAST_DELAYS = " ".join(f"{n}ms" for n in range(10, 190, 10))
RETRY, DLQ = "%RETRY%CapRetryGroup", "%DLQ%CapRetryGroup"


def _frames() -> List[dict]:
    with open(CAPTURE / "frames.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _frame_bytes(record: dict) -> bytes:
    header = record["header_text"].encode("utf-8")
    return (struct.pack(">I", record["frame_len"] - 4) + struct.pack(">I", record["header_len"])
            + header + bytes.fromhex(record["body_hex"]))


def _records(body: bytes):
    msgs = decode_messages(body, decompress=False)
    out, pos = [], 0
    for m in msgs:
        out.append((m, body[pos:pos + m.store_size]))
        pos += m.store_size
    return out


def _compare_pull(seq, genuine: bytes, ours: bytes, broker_addr: str, hosts: Dict[str, str],
                  problems: List[str]) -> None:
    """Stored records alike: every field, the properties in order (ORIGIN_MESSAGE_ID names our
    broker's address, the same commit-log offset) and the bytes up to hosts and store time."""
    g_recs, o_recs = _records(genuine), _records(ours)
    if len(g_recs) != len(o_recs):
        problems.append(f"seq {seq}: {len(o_recs)} messages, genuine {len(g_recs)}")
        return
    our_host_hex = pack_host(broker_addr)[0].hex().upper()
    for (g, g_rec), (o, o_rec) in zip(g_recs, o_recs):
        for name in ("topic", "queue_id", "queue_offset", "physical_offset", "sys_flag", "flag",
                     "stored_body", "body_crc", "store_size", "born_timestamp",
                     "reconsume_times", "prepared_transaction_offset"):
            if getattr(g, name) != getattr(o, name):
                problems.append(f"seq {seq} {g.topic}@{g.queue_offset}: {name} "
                                f"{getattr(o, name)!r} != genuine {getattr(g, name)!r}")
        g_props = dict(g.properties)
        if "ORIGIN_MESSAGE_ID" in g_props:
            g_addr, g_off = parse_offset_msg_id(g_props["ORIGIN_MESSAGE_ID"])
            o_addr, o_off = parse_offset_msg_id(o.properties.get("ORIGIN_MESSAGE_ID", "00" * 16))
            if (g_addr, g_off) != (GENUINE_BROKER, o_off) or o_addr != broker_addr:
                problems.append(f"seq {seq}: ORIGIN_MESSAGE_ID {o_addr} {o_off}, genuine "
                                f"{g_addr} {g_off}")
            g_props["ORIGIN_MESSAGE_ID"] = o.properties.get("ORIGIN_MESSAGE_ID")
        if list(g_props.items()) != list(o.properties.items()):
            problems.append(f"seq {seq} {g.topic}@{g.queue_offset}: properties "
                            f"{list(o.properties.items())} != genuine {list(g_props.items())}")
        if o.store_host != broker_addr or o.born_host != hosts.get(g.born_host):
            problems.append(f"seq {seq}: hosts {o.born_host} -> {o.store_host}, expected "
                            f"{hosts.get(g.born_host)} -> {broker_addr}")
        g_rec = g_rec.replace(GENUINE_HOST_HEX.encode(), our_host_hex.encode())
        if g_rec[:48] + o_rec[48:72] + g_rec[72:] != o_rec:
            problems.append(f"seq {seq} {g.topic}@{g.queue_offset}: record bytes differ beyond "
                            "hosts and store time")


def _compare_answer(rec, genuine, ours, broker_addr, hosts, problems) -> None:
    seq, g = rec["seq"], genuine["header"]
    name = rec["code_name"]
    if ours.code != g["code"] or ours.remark != g.get("remark"):
        problems.append(f"seq {seq} {name}: {ours.code} {ours.remark!r} != genuine "
                        f"{g['code']} {g.get('remark')!r}")
        return
    if (ours.flag, ours.language, ours.version) != (g["flag"], g["language"], g["version"]):
        problems.append(f"seq {seq} {name}: header {ours!r} differs from genuine {g}")
    g_ext = {k: str(v) for k, v in g["extFields"].items()} if "extFields" in g else None
    if g_ext is not None and "msgId" in g_ext:
        g_addr, g_off = parse_offset_msg_id(g_ext["msgId"])
        o_addr, o_off = parse_offset_msg_id(ours.ext_fields.get("msgId", "00" * 16))
        if (g_off, o_addr) != (o_off, broker_addr):
            problems.append(f"seq {seq}: msgId at {o_addr} {o_off}, genuine {g_addr} {g_off}")
        g_ext["msgId"] = ours.ext_fields["msgId"]
    if g_ext != ours.ext_fields or (g_ext is not None and list(g_ext) != list(ours.ext_fields)):
        problems.append(f"seq {seq} {name}: ext {ours.ext_fields} != genuine {g_ext}")
    g_body = bytes.fromhex(genuine["body_hex"])
    if rec["header"]["code"] == PULL:
        _compare_pull(seq, g_body, ours.body, broker_addr, hosts, problems)
    elif ours.body != g_body.replace(GENUINE_BROKER.encode(), broker_addr.encode()):
        problems.append(f"seq {seq} {name}: body {ours.body[:300]!r} != genuine "
                        f"{g_body[:300]!r}")


def _max_offset(addr: str, topic: str) -> int:
    with RawClient(addr) as client:
        answer = client.request(MAX_OFFSET, {"topic": topic, "queueId": "0"})
    return int(answer.ext_fields["offset"])


@pytest.fixture(scope="module")
def replay():
    """The capture's client requests (C++ client and hand-made) sent again in capture order,
    one connection per captured connection; before the C++ consumer's first pull of the retry
    topic, wait until the schedule has moved the five sent-back messages there."""
    frames = _frames()
    by_seq = {r["seq"]: r for r in frames}
    problems: List[str] = []
    # this capture's broker had TBW102 with 8 queues (the C++ client asks for its route)
    with EmbeddedCluster(brokers=1, message_delay_level=FAST_DELAYS,
                         default_topic_queue_nums=8) as cluster:
        cluster.create_topic("RetryT", 4)  # mqadmin updateTopic, before the capture
        broker_addr = cluster.broker("broker-a").addr
        clients: Dict[int, RawClient] = {}
        hosts: Dict[str, str] = {}
        try:
            for rec in frames:
                if rec["client_kind"] not in ("cpp-client", "py-client") \
                        or rec["rpc"] != "request" or not rec["dir"].startswith("client->"):
                    continue
                header = rec["header"]
                if header["code"] == PULL and header["extFields"]["topic"] == RETRY \
                        and header["extFields"]["queueOffset"] == "0":
                    wait_until(lambda: _max_offset(broker_addr, RETRY) == 5, 10,
                               "the five sent-back messages in the retry topic")
                if rec["conn"] not in clients:
                    addr = cluster.namesrv_addr if rec["port"] == 9876 else broker_addr
                    clients[rec["conn"]] = RawClient(addr)
                    local = clients[rec["conn"]].sock.getsockname()
                    hosts[f"127.0.0.1:{rec['client_port']}"] = f"{local[0]}:{local[1]}"
                future = clients[rec["conn"]].send_frame(_frame_bytes(rec), header["opaque"])
                if rec.get("response_seq") is None:
                    continue  # a long poll the genuine broker still held at shutdown
                _compare_answer(rec, by_seq[rec["response_seq"]], future.result(10),
                                broker_addr, hosts, problems)
            topics = {name: cluster.broker("broker-a")._broker.store.topics.get(name)
                      for name in (RETRY, DLQ)}
        finally:
            for client in clients.values():
                client.close()
    return problems, topics


def test_replayed_capture_gets_the_genuine_answers(replay):
    """Send-backs (C++ header without maxReconsumeTimes, hand-made one with it), routes of the
    retry topic (TOPIC_NOT_EXIST before the heartbeat) and the DLQ (TOPIC_NOT_EXIST before the
    send-back, then 1 queue perm 6), pulls of the redelivered and dead messages: same codes,
    remarks, ext fields, route bodies and stored records (RECONSUMETIMES 1 then 2, REAL_TOPIC,
    ORIGIN_MESSAGE_ID, RETRY_TOPIC, WAIT=false, DELAY=3 then 0, in the genuine order)."""
    problems, _ = replay
    assert not problems, "\n".join(problems)


def test_retry_and_dead_letter_topic_configs(replay):
    _, topics = replay
    for name in (RETRY, DLQ):
        config = topics[name]
        assert (config.read_queue_nums, config.write_queue_nums, config.perm,
                config.topic_sys_flag) == (1, 1, 6, 0), name


# ------------------------------------------------------------------ beyond the capture


@pytest.fixture(scope="module")
def quick_cluster():
    """A broker of its own: millisecond delay levels, groups auto-created with
    retryMaxTimes 2."""
    with EmbeddedCluster(brokers=1, message_delay_level=FAST_DELAYS, retry_max_times=2) as c:
        yield c


def _send(client: RawClient, topic: str, props: str, queue_id: int = 0, **header) -> int:
    """SEND_MESSAGE (V1 keys) of one message; returns its commit-log offset."""
    fields = {"producerGroup": "P", "topic": topic, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": "0",
              "bornTimestamp": "1700000000000", "flag": "0", "properties": props,
              "reconsumeTimes": "0", "unitMode": "false"}
    fields.update(header)
    answer = client.request(SEND, fields, b"body")
    assert answer.code == 0, answer.remark
    return parse_offset_msg_id(answer.ext_fields["msgId"])[1]


def _send_back(client: RawClient, offset: int, group: str, delay_level: int = 0,
               version: int = 409, **extra):
    fields = {"offset": str(offset), "group": group, "delayLevel": str(delay_level)}
    fields.update(extra)
    return client.request(SEND_BACK, fields, version=version)


def _pull_all(client: RawClient, topic: str, queue_id: int = 0):
    answer = client.request(PULL, {
        "consumerGroup": "Reader", "topic": topic, "queueId": str(queue_id),
        "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    return decode_messages(answer.body) if answer.code == 0 and answer.body else []


def _route(cluster, topic: str):
    with RawClient(cluster.namesrv_addr) as client:
        return client.request(ROUTE, {"topic": topic})


def test_delay_levels_and_dead_letters(quick_cluster, unique_name):
    """delayLevel 0 is 3 + reconsume times, a positive one is used as given (a level above the
    table's last is lowered to it), a negative one sends the message straight to the DLQ;
    past the group's retryMaxTimes (2 here) the message is dead."""
    topic, group = unique_name("SbTopic"), unique_name("SbGroup")
    quick_cluster.create_topic(topic, 1)
    addr = quick_cluster.broker("broker-a").addr
    with RawClient(addr) as client:
        first = _send(client, topic, "KEYS\x01a\x02UNIQ_KEY\x01U1\x02WAIT\x01true")
        assert _send_back(client, first, group).code == 0
        retry = RETRY_PREFIX + group
        msgs = wait_until(lambda: _pull_all(client, retry), 5, "the first redelivery")
        assert [(m.reconsume_times, m.properties["DELAY"]) for m in msgs] == [(1, "3")]
        assert msgs[0].properties["RETRY_TOPIC"] == topic
        assert msgs[0].properties["UNIQ_KEY"] == "U1"
        assert _send_back(client, msgs[0].physical_offset, group, delay_level=99).code == 0
        msgs = wait_until(lambda: _pull_all(client, retry)[1:], 5, "the second redelivery")
        assert [(m.reconsume_times, m.properties["DELAY"]) for m in msgs] == [(2, "18")]
        # reconsume times 2 = retryMaxTimes: dead, at once, DELAY 0, origin kept
        assert _send_back(client, msgs[0].physical_offset, group).code == 0
        dead = _pull_all(client, DLQ_PREFIX + group)
        assert [(m.reconsume_times, m.properties["DELAY"]) for m in dead] == [(3, "0")]
        assert dead[0].properties["ORIGIN_MESSAGE_ID"] == \
            quick_cluster_msg_id(addr, first)
        # a negative delay level: dead without retries
        second = _send(client, topic, "KEYS\x01b")
        assert _send_back(client, second, group, delay_level=-1).code == 0
        dead = _pull_all(client, DLQ_PREFIX + group)
        assert [(m.reconsume_times, m.keys) for m in dead][1:] == [(1, "b")]
    route = _route(quick_cluster, DLQ_PREFIX + group)
    data = TopicRouteData.from_json(route.body)
    assert [(q.read_queue_nums, q.write_queue_nums, q.perm) for q in data.queue_datas] == \
        [(1, 1, 6)]


def quick_cluster_msg_id(addr: str, offset: int) -> str:
    return pack_host(addr)[0].hex().upper() + f"{offset:016X}"


def test_max_reconsume_times_of_the_header_counts_from_version_3_4_9(quick_cluster,
                                                                      unique_name):
    """maxReconsumeTimes in the header replaces the group's retryMaxTimes only for clients of
    version 121 (V3_4_9) and later: the C++ client (version 63) gets the group's."""
    topic, group = unique_name("SbTopic"), unique_name("SbGroup")
    quick_cluster.create_topic(topic, 1)
    with RawClient(quick_cluster.broker("broker-a").addr) as client:
        offset = _send(client, topic, "KEYS\x01v")
        assert _send_back(client, offset, group, version=63, maxReconsumeTimes="0").code == 0
        assert _pull_all(client, DLQ_PREFIX + group) == []
        assert _send_back(client, offset, group, version=121, maxReconsumeTimes="0").code == 0
        assert [m.reconsume_times for m in _pull_all(client, DLQ_PREFIX + group)] == [1]


def test_refusals(unique_name):
    """SUBSCRIPTION_GROUP_NOT_EXIST when groups are not auto-created (not for CID_RMQ_SYS_
    groups), NO_PERMISSION for a retry topic that is not writable, SYSTEM_ERROR for an offset
    where no message starts, and a missing header field (SendMessageProcessor,
    SubscriptionGroupManager)."""
    with EmbeddedCluster(brokers=1, auto_create_subscription_group=False) as cluster:
        cluster.create_topic("T", 1)
        cluster.create_topic("%RETRY%CID_RMQ_SYS_G", 1, perm=4)  # read-only
        with RawClient(cluster.broker("broker-a").addr) as client:
            offset = _send(client, "T", "KEYS\x01k")
            answer = _send_back(client, offset, "Unknown")
            assert (answer.code, answer.remark, answer.ext_fields) == (
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, Unknown {FAQ}", None)
            answer = _send_back(client, offset, "CID_RMQ_SYS_G")
            assert (answer.code, answer.remark) == (
                ResponseCode.NO_PERMISSION,
                "the topic[%RETRY%CID_RMQ_SYS_G] sending message is forbidden")
            cluster.create_topic("%RETRY%CID_RMQ_SYS_G", 1)
            answer = _send_back(client, offset + 1, "CID_RMQ_SYS_G")
            assert (answer.code, answer.remark) == (
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset + 1}")
            answer = client.request(SEND_BACK, {"group": "CID_RMQ_SYS_G", "delayLevel": "0"})
            assert (answer.code, answer.remark) == (
                ResponseCode.SYSTEM_ERROR, "org.apache.rocketmq.remoting.exception."
                "RemotingCommandException: the custom field <offset> is null")
            # a send to the retry topic of an unknown group is refused the same way
            fields = {"producerGroup": "P", "topic": "%RETRY%Unknown", "defaultTopic": "TBW102",
                      "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                      "bornTimestamp": "1", "flag": "0", "properties": "", "reconsumeTimes": "0"}
            answer = client.request(SEND, fields, b"x")
            assert (answer.code, answer.remark) == (
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, Unknown {FAQ}")


def test_sends_to_a_retry_topic_past_the_max_go_to_the_dlq(quick_cluster, unique_name):
    """The Java consumer's fallback when a send-back fails: it sends the message to
    %RETRY%<group> with reconsumeTimes and maxReconsumeTimes in the header; from the max on
    the broker stores it in %DLQ%<group> (handleRetryAndDLQ); the answer keeps the queue id
    asked for."""
    group = unique_name("SbGroup")
    retry, dlq = RETRY_PREFIX + group, DLQ_PREFIX + group
    with RawClient(quick_cluster.broker("broker-a").addr) as client:
        _send(client, retry, "KEYS\x01r1", reconsumeTimes="1")
        _send(client, retry, "KEYS\x01r2", reconsumeTimes="2")  # the group's max: 2
        _send(client, retry, "KEYS\x01r3", reconsumeTimes="1", maxReconsumeTimes="1")
        assert [m.keys for m in _pull_all(client, retry)] == ["r1"]
        dead = _pull_all(client, dlq)
        assert [(m.keys, m.reconsume_times, m.queue_id) for m in dead] == \
            [("r2", 2, 0), ("r3", 1, 0)]


def test_client_request_is_the_captured_one(unique_name):
    """send_back_command writes the fields Java's consumerSendMessageBack writes, as the
    capture's hand-made request (seq 125) carried them; send_message_back gets SUCCESS or
    raises the broker's refusal."""
    captured = _frames()[125]["header"]["extFields"]
    cmd = send_back_command(3635, "CapRetryGroup", 0, "0100007F00009BD00000A5FE13850200",
                            "RetryT", max_reconsume_times=1)
    assert (cmd.code, cmd.ext_fields) == (SEND_BACK, captured)
    assert list(cmd.ext_fields) == list(captured)
    with EmbeddedCluster(brokers=1, auto_create_subscription_group=False,
                         message_delay_level=FAST_DELAYS) as cluster:
        cluster.create_topic("T", 1)
        addr = cluster.broker("broker-a").addr
        with RawClient(addr) as raw:
            offset = _send(raw, "T", "KEYS\x01c")
        with RemotingClient() as remoting:
            send_message_back(remoting, addr, offset, "CID_RMQ_SYS_C", 0, "id", "T")
            with pytest.raises(ResponseError) as refused:
                send_message_back(remoting, addr, offset, "Nobody", 0, "id", "T")
            assert refused.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        with RawClient(addr) as raw:
            assert wait_until(lambda: [m.keys for m in _pull_all(raw, "%RETRY%CID_RMQ_SYS_C")],
                              10, "the redelivery") == ["c"]


def test_a_groups_own_retry_settings(quick_cluster, unique_name):
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (mqadmin updateSubGroup) sets a group's
    retryQueueNums and retryMaxTimes: 0 retry queues drop a sent-back message (SUCCESS,
    nothing stored, no retry topic); 3 queues make a 3-queue retry topic; retryMaxTimes 1
    sends the second failure to the DLQ (AdminBrokerProcessor, asyncConsumerSendMsgBack)."""
    topic, dropping, wide = (unique_name("SbTopic"), unique_name("SbDrop"),
                             unique_name("SbWide"))
    quick_cluster.create_topic(topic, 1)
    with RawClient(quick_cluster.broker("broker-a").addr) as client:
        for group, queues, times in ((dropping, 0, 16), (wide, 3, 1)):
            body = json.dumps({"groupName": group, "retryQueueNums": queues,
                               "retryMaxTimes": times, "consumeEnable": True}).encode()
            answer = client.request(UPDATE_SUBSCRIPTION_GROUP, {}, body)
            assert (answer.code, answer.remark) == (0, None)
        offset = _send(client, topic, "KEYS\x01w")
        assert _send_back(client, offset, dropping).code == 0
        assert _route(quick_cluster, RETRY_PREFIX + dropping).code == ResponseCode.TOPIC_NOT_EXIST
        assert _send_back(client, offset, wide).code == 0
        route = TopicRouteData.from_json(_route(quick_cluster, RETRY_PREFIX + wide).body)
        assert [(q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == \
            [(3, 3, 6)]

        def redelivered():
            return [m for q in range(3) for m in _pull_all(client, RETRY_PREFIX + wide, q)]
        again = wait_until(redelivered, 5, "the redelivery")
        assert _send_back(client, again[0].physical_offset, wide).code == 0
        assert [m.reconsume_times for m in _pull_all(client, DLQ_PREFIX + wide)] == [2]
        answer = client.request(UPDATE_SUBSCRIPTION_GROUP, {}, b"[1]")
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark.startswith("com.alibaba.fastjson.JSONException")


def test_heartbeat_creates_the_retry_topic_of_known_groups(unique_name):
    """A consumer's heartbeat creates %RETRY%<group> with the group's retryQueueNums queues;
    when groups are not auto-created, an unknown group gets none (ClientManageProcessor)."""
    known, unknown = unique_name("SbKnown"), unique_name("SbUnknown")

    def heartbeat(client, group):
        body = json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [], "unitMode": False}]}).encode()
        assert client.request(HEART_BEAT, {}, body).code == 0

    with EmbeddedCluster(brokers=1, auto_create_subscription_group=False) as cluster:
        with RawClient(cluster.broker("broker-a").addr) as client:
            client.request(UPDATE_SUBSCRIPTION_GROUP, {}, json.dumps(
                {"groupName": known, "retryQueueNums": 2}).encode())
            heartbeat(client, known)
            heartbeat(client, unknown)
        route = TopicRouteData.from_json(_route(cluster, RETRY_PREFIX + known).body)
        assert [(q.read_queue_nums, q.perm) for q in route.queue_datas] == [(2, 6)]
        assert _route(cluster, RETRY_PREFIX + unknown).code == ResponseCode.TOPIC_NOT_EXIST


def test_a_slave_refuses_send_backs_as_its_store_does(unique_name):
    """On a slave the message is found (replicated) but the store refuses the put:
    SYSTEM_ERROR with the put status's name (asyncConsumerSendMsgBack's default branch;
    DefaultMessageStore refuses puts on a slave with SERVICE_NOT_AVAILABLE)."""
    with EmbeddedCluster(brokers=1, slaves=1) as cluster:
        cluster.create_topic("T", 1)
        with RawClient(cluster.broker("broker-a").addr) as master:
            offset = _send(master, "T", "KEYS\x01s")
        with RawClient(cluster.slave("broker-a", 1).addr) as slave:
            wait_until(lambda: _pull_all(slave, "T"), 10, "the message on the slave")
            answer = _send_back(slave, offset, "G")
            assert (answer.code, answer.remark) == (ResponseCode.SYSTEM_ERROR,
                                                    "SERVICE_NOT_AVAILABLE")
            assert _pull_all(slave, "%RETRY%G") == []
