"""The producer paths the sink relies on, against the embedded server over real sockets:
topic auto-creation through TBW102 on every broker, pipelined batch sends, retries on another
broker, accepted statuses, sharding-key queue choice and the oversize check."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_spark.client import (
    BrokerUnavailable, Message, Producer, ResponseError, RouteNotFound,
)
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.send.pipeline import Outgoing, SendFailed
from rocketmq_spark.client.send.parts import Item, Part
from rocketmq_spark.client.send.producer import EncodedRequest, MessageTooLarge, queue_for_key
from rocketmq_spark.client.protocol.properties import DELAY, SHARDING_KEY, WAIT, encode_properties
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.message import decode_messages
from rocketmq_spark.client.responses import is_transient
from waiting import wait_until

CPP_PEER = Path(__file__).resolve().parent / "cpp_peer.py"


def test_auto_created_topic_lands_on_every_broker_that_allows_it(embedded_cluster,
                                                                 unique_name):
    """Java's producer keeps the TBW102 template route for a new topic and rotates its sends
    over every queue of it, so each broker with auto-creation creates the topic on its first
    send; the topic's route then lists them all (it once listed only the broker that
    created the topic first)."""
    topic = unique_name("AutoEvery")
    with Producer(embedded_cluster.namesrv_addr) as producer:
        results = [producer.send(Message(topic, b"m%d" % i)) for i in range(8)]
    assert {r.status for r in results} == {"SEND_OK"}
    assert {r.queue.broker_name for r in results} == {"broker-a", "broker-b"}
    with Admin(embedded_cluster.namesrv_addr) as admin:
        route = admin.names.route(topic, refresh=True)
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    assert all(q.write_queue_nums == 4 for q in route.queue_datas)


def test_unknown_topic_with_auto_create_off_names_the_topic(embedded_cluster_factory,
                                                           unique_name):
    cluster = embedded_cluster_factory(brokers=1, auto_create_topics=False)
    topic = unique_name("NoAuto")
    with Producer(cluster.namesrv_addr) as producer:
        with pytest.raises(RouteNotFound) as info:
            producer.send(Message(topic, b"x"))
    assert topic in str(info.value) and "create the topic first" in str(info.value)


# ---------------------------------------------------------------------- helpers


def stored(cluster, topic: str):
    """Every message of ``topic`` on every broker: (broker, queue id, offset, MessageExt)."""
    out = []
    for b in cluster.brokers:
        config = cluster.topic_config(topic, b.name)
        if config is None:
            continue
        store = cluster._broker(b.name).store
        for qid in range(config.read_queue_nums):
            q = cluster._call(store.existing_queue, topic, qid)
            if q is None:
                continue
            for offset in range(q.min_offset, q.max_offset):
                out.append((b.name, qid, offset, decode_messages(q.record(offset))[0]))
    return out


def messages(topic: str, n: int, **kw):
    return [Message(topic, b"m%d" % i, keys=f"k{i}", **kw) for i in range(n)]


# ---------------------------------------------------------------------- pipelined sends


def test_send_many_spreads_batches_and_keeps_every_message(embedded_cluster, unique_name):
    topic = unique_name("Many")
    embedded_cluster.create_topic(topic, 4)
    with Producer(embedded_cluster.namesrv_addr) as producer:
        results = producer.send_many(messages(topic, 5000), batch_size=100, in_flight=4)
    assert len(results) == 50 and {r.status for r in results} == {"SEND_OK"}
    rows = stored(embedded_cluster, topic)
    assert sorted(m.body for *_, m in rows) == sorted(b"m%d" % i for i in range(5000))
    assert len({(b, q) for b, q, *_ in rows}) == 8, "round robin over every queue"


def test_sharding_keys_keep_their_order_in_the_queue_java_picks(embedded_cluster, unique_name):
    topic = unique_name("Keyed")
    embedded_cluster.create_topic(topic, 4)
    keys = [f"order-{i % 11}" for i in range(3000)]
    with Producer(embedded_cluster.namesrv_addr) as producer:
        queues = producer.queues(topic)
        producer.send_many([Message(topic, b"%d" % i, sharding_key=k)
                            for i, k in enumerate(keys)], batch_size=64)
    by_key = {}
    for broker, qid, offset, m in sorted(stored(embedded_cluster, topic),
                                         key=lambda r: (r[0], r[1], r[2])):
        by_key.setdefault(m.properties[SHARDING_KEY], []).append((broker, qid, int(m.body)))
    for key, placed in by_key.items():
        want = queue_for_key(queues, key)
        assert {(b, q) for b, q, _ in placed} == {(want.broker_name, want.queue_id)}
        assert [n for *_, n in placed] == [i for i, k in enumerate(keys) if k == key]


def test_a_busy_broker_is_retried_on_another(embedded_cluster, unique_name):
    topic = unique_name("Busy")
    embedded_cluster.create_topic(topic, 2)
    embedded_cluster.fail_next(3, ResponseCode.SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy",
                               request_codes=[RequestCode.SEND_BATCH_MESSAGE],
                               broker="broker-a")
    with Producer(embedded_cluster.namesrv_addr) as producer:
        pipeline = producer.pipeline()
        for i in range(0, 2000, 100):
            pipeline.submit(Outgoing(topic, producer.encode_batch(
                messages(topic, 2000)[i:i + 100]), 100))
        stats = pipeline.flush()
    assert stats.messages == 2000 and (stats.retries, stats.busy) == (0, 3)
    bodies = [m.body for *_, m in stored(embedded_cluster, topic)]
    assert sorted(bodies) == sorted(b"m%d" % i for i in range(2000)), "each exactly once"


def test_statuses_not_accepted_are_retried_accepted_ones_are_not(embedded_cluster,
                                                                 unique_name):
    topic = unique_name("Flush")
    embedded_cluster.create_topic(topic, 2)
    for accept, retries in (((), 1), (("FLUSH_DISK_TIMEOUT",), 0)):
        embedded_cluster.fail_next(1, ResponseCode.FLUSH_DISK_TIMEOUT, "",
                                   request_codes=[RequestCode.SEND_BATCH_MESSAGE])
        with Producer(embedded_cluster.namesrv_addr, accept=accept) as producer:
            pipeline = producer.pipeline()
            pipeline.submit(Outgoing(topic, producer.encode_batch(messages(topic, 10)), 10))
            assert pipeline.flush().retries == retries


def test_refusals_fail_at_once_and_name_the_topic(embedded_cluster, unique_name):
    topic = unique_name("Refused")
    embedded_cluster.create_topic(topic, 2)
    embedded_cluster.fail_next(1, ResponseCode.NO_PERMISSION, "the topic is not writable",
                               request_codes=[RequestCode.SEND_BATCH_MESSAGE])
    with Producer(embedded_cluster.namesrv_addr) as producer:
        pipeline = producer.pipeline()
        pipeline.submit(Outgoing(topic, producer.encode_batch(messages(topic, 10)), 10,
                                 first_row=40))
        with pytest.raises(SendFailed) as info:
            pipeline.flush()
    text = str(info.value)
    assert f"to topic {topic!r}" in text and "after 1 attempt(s)" in text
    assert "row 40" in text and "NO_PERMISSION" in text


def test_a_send_that_gets_no_answer_fails_within_the_deadline(embedded_cluster, unique_name):
    topic = unique_name("Slow")
    embedded_cluster.create_topic(topic, 2)
    embedded_cluster.delay_next(100, 3.0, request_codes=[RequestCode.SEND_BATCH_MESSAGE])
    with Producer(embedded_cluster.namesrv_addr, send_timeout=0.6, retries=5) as producer:
        pipeline = producer.pipeline()
        started = time.monotonic()
        pipeline.submit(Outgoing(topic, producer.encode_batch(messages(topic, 10)), 10))
        with pytest.raises(SendFailed, match="got no response"):
            pipeline.flush()
        assert time.monotonic() - started < 2.0
    embedded_cluster.clear_faults()


def test_a_broker_stopping_mid_send_loses_nothing(embedded_cluster, unique_name):
    topic = unique_name("Stop")
    embedded_cluster.create_topic(topic, 4)
    all_messages = messages(topic, 30000)
    with Producer(embedded_cluster.namesrv_addr, send_timeout=10) as producer:
        pipeline = producer.pipeline()
        for i in range(0, len(all_messages), 200):
            if i == 10000:
                embedded_cluster.broker("broker-b").stop()
            pipeline.submit(Outgoing(topic, producer.encode_batch(all_messages[i:i + 200]),
                                     200))
        stats = pipeline.flush()
    embedded_cluster.broker("broker-b").start()
    bodies = {m.body for *_, m in stored(embedded_cluster, topic)}
    assert bodies == {m.body for m in all_messages}
    assert stats.by_broker.get("broker-b", 0) < 15000 < stats.by_broker["broker-a"]


def test_too_large_messages_are_refused_before_sending(embedded_cluster, unique_name):
    topic = unique_name("Big")
    with Producer(embedded_cluster.namesrv_addr) as producer:
        with pytest.raises(MessageTooLarge, match=f"for topic '{topic}' has a body of "
                                                  "5,242,880 bytes"):
            producer.send(Message(topic, os.urandom(5 * 1024 * 1024)))
        with pytest.raises(MessageTooLarge, match="properties"):
            producer.send(Message(topic, b"x", properties={"p": "v" * 40000}))


# ---------------------------------------------------------------------- delayed messages


def test_a_delayed_message_waits_in_the_schedule_topic(embedded_cluster_factory, unique_name):
    cluster = embedded_cluster_factory(brokers=1, message_delay_level="400ms 1s 2s")
    topic = unique_name("Later")
    cluster.create_topic(topic, 1)
    with Producer(cluster.namesrv_addr) as producer:
        sent = time.time()
        later = producer.send(Message(topic, b"later", tags="T", delay_level=1,
                                      properties={"user": "u"}))
        producer.send(Message(topic, b"capped", delay_level=9))
        producer.send(Message(topic, b"now"))
        with pytest.raises(ResponseError, match="MESSAGE_ILLEGAL"):
            producer._send_with_retry(topic, None, EncodedRequest(
                producer.encode_batch([Message(topic, b"b")]).body,
                encode_properties({WAIT: "true", DELAY: "1"}), batch=True))
    assert (later.queue.queue_id, later.queue_offset) == (0, 0), "the schedule queue's offset"
    assert [m.body for *_, m in stored(cluster, topic)] == [b"now"]
    assert cluster.max_offset("SCHEDULE_TOPIC_XXXX", "broker-a", 0) == 1
    wait_until(lambda: len(stored(cluster, topic)) >= 3, 10, "the three messages stored")
    got = {m.body: m for *_, m in stored(cluster, topic)}
    assert list(got) == [b"now", b"later", b"capped"]
    m = got[b"later"]
    assert 0.4 <= (m.store_timestamp / 1000.0) - sent < 1.5
    assert m.properties["REAL_TOPIC"] == topic and m.properties["REAL_QID"] == "0"
    assert m.properties[DELAY] == "1" and m.properties["user"] == "u" and m.tags == "T"
    assert m.uniq_key == later.msg_id
    assert got[b"capped"].properties[DELAY] == "3", "levels above the table's are capped"
    assert (got[b"capped"].store_timestamp - got[b"capped"].born_timestamp) >= 2000


def test_delayed_messages_survive_a_restart_without_a_second_delivery(tmp_path, unique_name):
    from rocketmq_spark.embedded import EmbeddedCluster

    topic = unique_name("LaterRestart")
    with EmbeddedCluster(brokers=1, data_dir=tmp_path, message_delay_level="300ms 3s") as c:
        c.create_topic(topic, 1)
        with Producer(c.namesrv_addr) as producer:
            producer.send(Message(topic, b"soon", delay_level=1))
            producer.send(Message(topic, b"after-restart", delay_level=2))
        wait_until(lambda: len(stored(c, topic)) >= 1, 5, "the first delayed message")
    with EmbeddedCluster(brokers=1, data_dir=tmp_path, message_delay_level="300ms 3s") as c:
        wait_until(lambda: len(stored(c, topic)) >= 2, 10,
                   "the message delayed over the restart")
        time.sleep(0.5)
        assert [m.body for *_, m in stored(c, topic)] == [b"soon", b"after-restart"]


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_the_cpp_client_reads_a_delayed_message_with_its_properties(embedded_cluster_factory,
                                                                      unique_name):
    cluster = embedded_cluster_factory(brokers=1, message_delay_level="200ms")
    topic = unique_name("LaterCpp")
    cluster.create_topic(topic, 1)
    with Producer(cluster.namesrv_addr) as producer:
        producer.send(Message(topic, b"delayed", keys="k", delay_level=1))
    time.sleep(0.8)
    out = subprocess.run([sys.executable, str(CPP_PEER), "pull", "--namesrv",
                          cluster.namesrv_addr, "--topic", topic, "--props",
                          "DELAY,REAL_TOPIC,REAL_QID"], capture_output=True, text=True,
                         timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])["messages"]
    assert [(m["body"], m["keys"], m["properties"]) for m in got] == [
        ("delayed", "k", {"DELAY": "1", "REAL_TOPIC": topic, "REAL_QID": "0"})]


def test_a_queue_whose_broker_left_the_route_is_a_broker_failure(embedded_cluster, unique_name):
    """A queue chosen before its broker stopped, sent after the route was refreshed without
    it: a transient broker failure (the pipeline sends elsewhere), not a refused topic."""
    topic = unique_name("Gone")
    embedded_cluster.create_topic(topic, 2)
    with Producer(embedded_cluster.namesrv_addr) as producer:
        stale = [q for q in producer.queues(topic) if q.broker_name == "broker-b"][0]
        embedded_cluster.broker("broker-b").stop()
        producer.queues(topic, refresh=True)
        item = Outgoing(topic, producer.encode_batch(messages(topic, 5)), 5)
        with pytest.raises(BrokerUnavailable) as info:
            producer.start(item, stale)
        assert is_transient(info.value) and "broker-b" in str(info.value)
        pipeline = producer.pipeline()
        pipeline._send(Part(Item(item, item.count), item.payload, item.count, queue=stale))
        assert pipeline.flush().by_broker == {"broker-a": 5}
    embedded_cluster.broker("broker-b").start()


def test_the_deadline_runs_from_a_requests_first_send_not_from_its_wait(embedded_cluster,
                                                                        unique_name):
    """Requests queued behind a slow broker's in-flight limit do not use up their send timeout
    while they wait for a slot."""
    topic = unique_name("Queued")
    embedded_cluster.create_topic(topic, 2, brokers=["broker-a"])
    embedded_cluster.delay_next(4, 0.4, request_codes=[RequestCode.SEND_BATCH_MESSAGE])
    with Producer(embedded_cluster.namesrv_addr, send_timeout=0.7, retries=0,
                  max_in_flight_per_broker=1) as producer:
        pipeline = producer.pipeline()
        for i in range(4):
            pipeline.submit(Outgoing(topic, producer.encode_batch(messages(topic, 3)), 3))
        stats = pipeline.flush()
    assert (stats.messages, stats.retries) == (12, 0)
