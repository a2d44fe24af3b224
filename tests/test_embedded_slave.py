"""An embedded master + slave answers the genuine 4.9.8 master + slave capture's requests as they
were answered (tests/data/capture-rocketmq-4.9.8-slave, from shared/captures).

The capture: broker-a with brokerId 0 and 1, topic SlaveT (4 queues), 20 messages sent to the
master, then the master SIGKILLed; hand-made requests to the slave. Here the same requests, over
real sockets, to ``EmbeddedCluster(slaves=1)`` before and after ``broker("broker-a").stop()``.
The addresses differ (free ports), the rest must not.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from raw_client import RawClient
from rocketmq_spark.client.protocol.message import decode_messages
from rocketmq_spark.embedded import EmbeddedCluster
from embedded_cli import embedded_cli
from waiting import wait_until

CAPTURE = Path(__file__).resolve().parent / "data" / "capture-rocketmq-4.9.8-slave"
MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"  # the capture's addresses
ROUTE, UNREGISTER, SEND_V2 = 105, 35, 310
# SendMessageProcessor.handlePutMessageResult (SERVICE_NOT_AVAILABLE) + diskUtil()'s format
REFUSAL = re.compile(
    r"service not available now\. It may be caused by one of the following reasons: the "
    r"broker's disk is full \[CL: ( \d|\d\d)\.\d\d CQ: ( \d|\d\d)\.\d\d INDEX: ( \d|\d\d)"
    r"\.\d\d\], messages are put to the slave, message store has been shut down, etc\.")


def _frames():
    with open(CAPTURE / "frames.jsonl", encoding="utf-8") as fh:
        frames = [json.loads(line) for line in fh]
    return {f["seq"]: f for f in frames}


FRAMES = _frames()
VIEW = json.loads((CAPTURE / "client_view.json").read_text())


def _answer_of(seq: int) -> dict:
    return FRAMES[FRAMES[seq]["response_seq"]]["header"]


def _as_captured(body: bytes, master: str, slave: str) -> str:
    return body.decode().replace(master, MASTER).replace(slave, SLAVE)


@pytest.fixture(scope="module")
def cluster():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("SlaveT", 4)
        master = RawClient(c.broker("broker-a").addr)
        for i in range(20):  # the capture's producer: keys v0..v19, tag TagV, round robin
            props = f"KEYS\x01v{i}\x02TAGS\x01TagV\x02WAIT\x01true\x02"
            answer = master.request(SEND_V2, {
                "a": "CapSlaveProducer", "b": "SlaveT", "c": "TBW102", "d": "4",
                "e": str(i % 4), "f": "0", "g": "1795634060000", "h": "0", "i": props,
                "j": "0", "k": "false"}, f"v{i}".encode())
            assert answer.code == 0, answer.remark
        c.wait_replicated()
        yield c


def test_route_lists_master_and_slave_then_only_the_slave(cluster):
    """RouteInfoManager: the slave's registration adds brokerId 1 to brokerAddrs; the master's
    end removes brokerId 0 and keeps the queue data the master registered."""
    master, slave = cluster.broker("broker-a"), cluster.slave("broker-a", 1)
    names = RawClient(cluster.namesrv_addr)
    before = names.request(ROUTE, FRAMES[66]["header"]["extFields"])
    assert before.code == 0
    assert _as_captured(before.body, master.addr, slave.addr) == \
        VIEW["project_client_before_kill"][0]["response"]["body_text"]
    master.stop()
    try:
        after = names.request(ROUTE, FRAMES[68]["header"]["extFields"])
        assert after.code == 0
        assert _as_captured(after.body, master.addr, slave.addr) == \
            VIEW["project_client_after_master_sigkill"][0]["response"]["body_text"]
        _slave_answers_as_captured(cluster)
    finally:
        master.start()
    again = names.request(ROUTE, FRAMES[66]["header"]["extFields"])
    assert _as_captured(again.body, master.addr, slave.addr) == \
        VIEW["project_client_before_kill"][0]["response"]["body_text"]


def _slave_answers_as_captured(cluster):
    """Seq 70-87: offsets, the pull, the offset update and query, the refused send, asked of
    the slave while its master is down."""
    client = RawClient(cluster.slave("broker-a", 1).addr)
    for seq in range(70, 87, 2):
        request, captured = FRAMES[seq]["header"], _answer_of(seq)
        body = bytes.fromhex(FRAMES[seq]["body_hex"] or "")
        answer = client.request(request["code"], request["extFields"], body)
        assert answer.code == captured["code"], (seq, answer.code, answer.remark)
        assert list((answer.ext_fields or {}).items()) == \
            list(captured.get("extFields", {}).items()), seq
        if request["code"] == SEND_V2:
            assert REFUSAL.fullmatch(answer.remark), answer.remark
            assert REFUSAL.fullmatch(captured["remark"])  # the pattern fits the genuine one
        else:
            assert answer.remark == captured.get("remark"), seq
        if request["code"] == 11:  # the pull: queue 0's five messages, v0 v4 v8 v12 v16
            messages = decode_messages(answer.body)
            assert [m.queue_offset for m in messages] == [0, 1, 2, 3, 4]
            assert [m.keys for m in messages] == ["v0", "v4", "v8", "v12", "v16"]
            assert {m.store_host for m in messages} == {cluster.broker("broker-a").addr}
    assert cluster.node_consumer_offset("CapSlaveGroup", "SlaveT", "broker-a", 0, 1) == 3


def test_slave_stores_the_masters_bytes(cluster):
    """HA copies the commit log byte for byte: a pull answers the same body from both nodes."""
    fields = dict(FRAMES[80]["header"]["extFields"])
    got = {}
    for node in cluster.brokers_of("broker-a"):
        for queue_id in range(4):
            fields["queueId"] = str(queue_id)
            answer = RawClient(node.addr).request(11, fields)
            assert answer.code == 0 and answer.remark == "FOUND"
            got.setdefault(queue_id, []).append(answer.body)
    for queue_id, (on_master, on_slave) in got.items():
        assert on_master == on_slave and len(decode_messages(on_slave)) == 5, queue_id


def test_unregister_client_on_the_slave(cluster):
    """Seq 46: the C++ producer's UNREGISTER_CLIENT to the slave is answered SUCCESS, {}."""
    request, captured = FRAMES[46]["header"], _answer_of(46)
    answer = RawClient(cluster.slave("broker-a", 1).addr).request(
        UNREGISTER, request["extFields"], language="CPP", version=request["version"])
    assert (answer.code, answer.ext_fields, answer.remark) == \
        (captured["code"], captured["extFields"], captured.get("remark"))


def test_slave_registration_names_its_master(cluster):
    """Seq 49: the name server's answer to the slave's REGISTER_BROKER carries haServerAddr and
    masterAddr (in-process here: the answer the slave keeps)."""
    captured = _answer_of(48)["extFields"]
    got = cluster._call(lambda: cluster._slaves["broker-a"][0].registration)
    assert list(got) == list(captured)
    assert got["masterAddr"] == cluster.broker("broker-a").addr
    assert re.fullmatch(r"[\d.]+:\d+", got["haServerAddr"])


def test_cli_slaves():
    """``python -m rocketmq_spark.embedded --slaves 1`` prints each slave after its broker; the
    slave gets the messages the CLI filled the master with."""
    with embedded_cli("--slaves", "1", "--topic", "CliS:2", "--fill", "CliS:10:16") as (_,
                                                                                       lines):
        assert [ln[:3] for ln in lines[1:3]] == [["broker", "broker-a", lines[1][2]],
                                                  ["slave", "broker-a", "1"]]
        slave = RawClient(lines[2][3])

        def on_slave():
            return sum(int(slave.request(30, {"topic": "CliS", "queueId": str(q)})
                           .ext_fields["offset"]) for q in range(2))
        wait_until(lambda: on_slave() == 10, 10, "the slave's copy of the fill")


def _replay_to(addr: str, seq: int):
    request = FRAMES[seq]["header"]
    return RawClient(addr).request(request["code"], request.get("extFields"),
                                   language="JAVA", version=request["version"])


def test_master_answers_the_slaves_sync_requests():
    """Seq 50-57: SlaveSynchronize's GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET,
    GET_ALL_DELAY_OFFSET and GET_ALL_SUBSCRIPTIONGROUP_CONFIG, asked of the master: the same
    codes and ext fields; the topic table byte for byte once the embedded broker has the genuine
    one's topics (it makes system topics only when used); the other bodies of the same form."""
    genuine = {seq: bytes.fromhex(FRAMES[FRAMES[seq]["response_seq"]]["body_hex"]).decode()
               for seq in (50, 52, 54, 56)}
    with EmbeddedCluster(brokers=1, default_topic_queue_nums=8) as c:
        # the genuine master's topics (system ones a 4.9.8 broker makes at start, and SlaveT)
        for name, t in json.loads(genuine[50])["topicConfigTable"].items():
            if name != "TBW102":
                c.create_topic(name, t["readQueueNums"], perm=t["perm"])
        addr = c.broker("broker-a").addr
        answers = {seq: _replay_to(addr, seq) for seq in (50, 52, 54, 56)}
        for seq, answer in answers.items():
            captured = _answer_of(seq)
            assert (answer.code, answer.ext_fields, answer.remark) == \
                (captured["code"], captured.get("extFields"), captured.get("remark")), seq
        topics = answers[50].body.decode()
        assert list(json.loads(topics)) == list(json.loads(genuine[50])) == \
            ["dataVersion", "topicConfigTable"]
        assert list(json.loads(topics)["dataVersion"]) == ["counter", "timestamp"]
        # the same table, byte for byte, in the same (ConcurrentHashMap) order
        table = re.compile(r'"topicConfigTable":.*')
        assert table.search(topics).group() == table.search(genuine[50]).group()
        assert answers[52].body.decode() == genuine[52] == '{"offsetTable":{}}'
        assert answers[54].body.decode() == genuine[54]
        groups = json.loads(answers[56].body)
        assert list(groups) == ["dataVersion", "subscriptionGroupTable"]
        # a group's entry has every field of the genuine one, the same defaults
        c._call(c._broker("broker-a").clients.subscription_groups.find, "TOOLS_CONSUMER", True)
        entry = json.loads(_replay_to(addr, 56).body)["subscriptionGroupTable"]["TOOLS_CONSUMER"]
        assert list(entry.items()) == list(
            json.loads(genuine[56])["subscriptionGroupTable"]["TOOLS_CONSUMER"].items())


def test_consumer_and_delay_offsets_as_fastjson_writes_them():
    """ConsumerOffsetManager.encode and ScheduleMessageService.encode (read from source; the
    capture's tables are empty): ``topic@group`` keys, bare integer queue ids and levels."""
    with EmbeddedCluster(brokers=1, message_delay_level="1ms 2ms 3ms") as c:
        c.create_topic("T", 2)
        master = RawClient(c.broker("broker-a").addr)
        for queue_id, offset in ((1, 4), (0, 3)):
            assert master.request(15, {"consumerGroup": "G", "topic": "T",
                                       "queueId": str(queue_id),
                                       "commitOffset": str(offset)}).code == 0
        assert _replay_to(master.addr, 52).body == b'{"offsetTable":{"T@G":{0:3,1:4}}}'
        props = "DELAY\x012\x02WAIT\x01true\x02"
        sent = master.request(310, {"a": "P", "b": "T", "c": "TBW102", "d": "4", "e": "0",
                                    "f": "0", "g": "0", "h": "0", "i": props, "j": "0",
                                    "k": "false"}, b"later")
        assert sent.code == 0
        wait_until(lambda: _replay_to(master.addr, 54).body == b'{"offsetTable":{2:1}}', 10,
                   "the delay level's offset")
