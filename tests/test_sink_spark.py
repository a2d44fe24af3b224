"""df.write.format("rocketmq") in a real Spark session against the embedded server over real
sockets: read back by Apache's C++ client (not our source), sharding-key order, delayed rows,
a broker stopping mid-write, and a clear error for each kind of bad input."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.send.producer import queue_for_key
from rocketmq_spark.client.protocol.message import SYSFLAG_COMPRESSED, decode_message
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
has_cpp = pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                             reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")


def cpp_pull(namesrv: str, topic: str, props: str) -> list:
    proc = subprocess.run([sys.executable, str(PEER), "pull", "--namesrv", namesrv, "--topic",
                           topic, "--props", props], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["messages"]


def write(df, namesrv: str, topic=None, **options):
    w = df.write.format("rocketmq").mode("append").option("nameServer", namesrv)
    if topic:
        w = w.option("topic", topic)
    for k, v in options.items():
        w = w.option(k, str(v))
    w.save()


def read_back(spark, namesrv: str, topic: str):
    return (spark.read.format("rocketmq").option("nameServer", namesrv)
            .option("subscribe", topic).option("includeProperties", "true").load())


BIG = 6000  # every 997th row has a body this large: compressed on the wire


def rich_rows(spark, n: int, partitions: int = 4):
    return spark.range(n, numPartitions=partitions).selectExpr(
        f"CASE WHEN id % 997 = 0 THEN concat('body-', id, '-', repeat('z', {BIG})) "
        "ELSE concat('body-', id) END AS body",
        "concat('Tag', id % 3) AS tags",
        "array(concat('k', id), concat('x', id)) AS keys",
        "map('n', CAST(id AS STRING), 'color', 'red') AS properties",
        "concat('s', id % 10) AS shardingKey")


# ------------------------------------------------------------------ the round trip


@has_cpp
@pytest.mark.cpp
@pytest.mark.parametrize("n", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_round_trip_read_back_by_the_cpp_pull_consumer(spark, cluster, unique_name, n):
    topic = unique_name("SinkRoundTrip")
    cluster.create_topic(topic, queues=4)
    write(rich_rows(spark, n), cluster.namesrv_addr, topic)

    got = cpp_pull(cluster.namesrv_addr, topic, "n,color,__SHARDINGKEY,UNIQ_KEY")
    assert len(got) == n
    by_id = {}
    for m in got:
        i = int(m["properties"]["n"])
        assert i not in by_id, f"row {i} arrived twice"
        by_id[i] = m
    assert set(by_id) == set(range(n))
    for i, m in by_id.items():
        body = f"body-{i}" + (f"-{'z' * BIG}" if i % 997 == 0 else "")
        assert (m["body"], m["tags"], m["keys"]) == (body, f"Tag{i % 3}", f"k{i} x{i}")
        assert m["properties"]["color"] == "red"
        assert m["properties"]["__SHARDINGKEY"] == f"s{i % 10}"
        assert m["id"] == m["properties"]["UNIQ_KEY"]
    assert len({m["id"] for m in got}) == n, "every message has its own id"

    # One sharding key, one queue (the one Java's SelectMessageQueueByHash picks), and each
    # task's rows of that key in their order (spark.range splits ids into contiguous ranges).
    with Admin(cluster.namesrv_addr) as admin:
        queues = admin.queues(topic, refresh=True)
    by_key = defaultdict(list)
    for m in got:
        by_key[m["properties"]["__SHARDINGKEY"]].append(m)
    for key, placed in by_key.items():
        want = queue_for_key(queues, key)
        assert {(m["broker"], m["queue_id"]) for m in placed} == {
            (want.broker_name, want.queue_id)}
        for part in range(4):
            mine = [m for m in placed if int(m["properties"]["n"]) * 4 // n == part]
            offsets = [m["queue_offset"] for m in sorted(
                mine, key=lambda m: int(m["properties"]["n"]))]
            assert offsets == sorted(offsets)

    # The large bodies travelled and are stored compressed (the C++ client inflated them).
    flags = {}
    for b in cluster.brokers:
        for qid in range(4):
            q = cluster._call(cluster._broker(b.name).store.existing_queue, topic, qid)
            for offset in range(q.min_offset if q else 0, q.max_offset if q else 0):
                m = decode_message(q.record(offset), decompress=False)[0]
                flags[int(m.properties["n"])] = m.sys_flag
    assert all(bool(f & SYSFLAG_COMPRESSED) == (i % 997 == 0) for i, f in flags.items())


def test_rows_without_a_sharding_key_spread_over_every_queue(spark, cluster, unique_name):
    topic = unique_name("SinkSpread")
    cluster.create_topic(topic, queues=4)
    n = 12_000
    df = spark.range(n, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    write(df, cluster.namesrv_addr, topic, maxBatchBytes=4096)
    rows = read_back(spark, cluster.namesrv_addr, topic).select(
        "brokerName", "queueId", "msgId").collect()
    counts = defaultdict(int)
    for r in rows:
        counts[(r.brokerName, r.queueId)] += 1
    assert len(counts) == 8 and sum(counts.values()) == n
    assert min(counts.values()) > n / 8 / 2, counts
    assert len({r.msgId for r in rows}) == n


def test_a_topic_column_routes_rows_and_new_topics_land_on_every_broker(spark, cluster,
                                                                       unique_name):
    a, b = unique_name("SinkAutoA"), unique_name("SinkAutoB")
    df = spark.range(2000, numPartitions=2).selectExpr(
        f"IF(id % 2 = 0, '{a}', '{b}') AS topic", "CAST(id AS STRING) AS body")
    # Small requests, so that each task sends several per topic: like Java's producer, the
    # sink rotates a new topic's requests over TBW102's queues on every broker.
    write(df, cluster.namesrv_addr, maxBatchBytes=2048)
    with Admin(cluster.namesrv_addr) as admin:
        for topic in (a, b):
            route = admin.names.route(topic, refresh=True)
            assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    for topic, parity in ((a, 0), (b, 1)):
        bodies = [int(r.body) for r in read_back(spark, cluster.namesrv_addr, topic)
                  .select(F.col("body").cast("string").alias("body")).collect()]
        assert sorted(bodies) == list(range(parity, 2000, 2))


def test_delayed_rows_arrive_after_their_level(spark, embedded_cluster_factory, unique_name):
    cluster = embedded_cluster_factory(brokers=1, message_delay_level="2s 4s")
    topic = unique_name("SinkDelay")
    cluster.create_topic(topic, queues=2)
    df = spark.range(20, numPartitions=1).selectExpr(
        "CAST(id AS STRING) AS body", "CAST(IF(id < 5, 1, 0) AS INT) AS delayLevel")
    started = time.time()
    write(df, cluster.namesrv_addr, topic)
    first = read_back(spark, cluster.namesrv_addr, topic).collect()
    assert sorted(int(r.body) for r in first) == list(range(5, 20)), \
        "delayed rows wait in SCHEDULE_TOPIC_XXXX"
    time.sleep(max(0.0, started + 3.0 - time.time()))
    rows = read_back(spark, cluster.namesrv_addr, topic).collect()
    delayed = [r for r in rows if int(r.body) < 5]
    assert len(rows) == 20 and len(delayed) == 5
    for r in delayed:
        assert r.properties["DELAY"] == "1" and r.properties["REAL_TOPIC"] == topic
        assert (r.storeTimestamp - r.bornTimestamp).total_seconds() >= 2.0


# ------------------------------------------------------------------ faults


def test_a_broker_stopping_mid_write_loses_no_row(spark, embedded_cluster, unique_name):
    cluster = embedded_cluster
    topic = unique_name("SinkBrokerStop")
    cluster.create_topic(topic, queues=4)
    n = 100_000
    df = spark.range(n, numPartitions=2).selectExpr("CAST(id AS STRING) AS body",
                                                    "CAST(id AS STRING) AS keys")

    def stop_when_writing():
        wait_until(lambda: cluster.max_offset(topic, "broker-b", 0) > 0, 60,
                   "the first write to broker-b", interval=0.02)
        cluster.broker("broker-b").stop()

    stopper = threading.Thread(target=stop_when_writing)
    stopper.start()
    write(df, cluster.namesrv_addr, topic, maxBatchBytes=65536, sendTimeoutMs=10000)
    stopper.join()
    assert not cluster.broker("broker-b").running, "the broker stopped during the write"
    cluster.broker("broker-b").start()
    rows = read_back(spark, cluster.namesrv_addr, topic).select(
        "keys", "msgId", "brokerName").collect()
    assert len({r.keys for r in rows}) == n, "every row arrived"
    assert len({r.msgId for r in rows}) == n
    on_b = sum(r.brokerName == "broker-b" for r in rows)
    assert 0 < on_b < n / 2, "broker-b took rows until it stopped, broker-a the rest"


# ------------------------------------------------------------------ bad input


def _fails(action, *texts):
    with pytest.raises(Exception) as info:
        action()
    message = str(info.value)
    for text in texts:
        assert text in message, f"{text!r} not in the error:\n{message[:3000]}"
    return message


def _empty(cluster, topic):
    return all(cluster.max_offset(topic, b.name, q) == 0 for b in cluster.brokers
               for q in range(4))


@pytest.mark.parametrize("exprs, options, texts", [
    (["CAST(id AS STRING) AS body", "'x' AS value"], {},
     ["column 'value' is not one the rocketmq sink writes"]),
    (["CAST(id AS DOUBLE) AS body"], {}, ["column 'body' must be binary or string, got double"]),
    (["CAST(id AS STRING) AS body"], {"topic": None}, ["no topic: set the option topic"]),
    (["CAST(id AS STRING) AS body"], {"retries": "many"},
     ["option retries must be a whole number"]),
    (["CAST(id AS STRING) AS body"], {"nameserver ": "x"}, ["unknown option"]),
])
def test_bad_columns_and_options_fail_before_any_task(spark, cluster, unique_name, exprs,
                                                      options, texts):
    topic = unique_name("SinkBadSchema")
    cluster.create_topic(topic, queues=4)
    df = spark.range(10).selectExpr(*exprs)
    options = dict(options)
    target = options.pop("topic", topic)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    _fails(lambda: write(df, cluster.namesrv_addr, target, **options), *texts)
    assert _empty(cluster, topic)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs, "no job ran"


def test_overwrite_is_refused(spark, cluster, unique_name):
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS body")
    _fails(lambda: df.write.format("rocketmq").mode("overwrite")
           .option("nameServer", cluster.namesrv_addr).option("topic", "T").save(),
           "a RocketMQ topic cannot be overwritten", 'mode("append")')


@pytest.mark.parametrize("exprs, options, texts", [
    (["IF(id = 7, NULL, CAST(id AS STRING)) AS body"], {},
     ["row 7 (partition 0): the body is null"]),
    (["IF(id = 3, repeat('x', 5242880), 'small') AS body"], {"compressBodyOverBytes": "-1"},
     ["row 3 (partition 0): the message for topic", "has a body of 5,242,880 bytes",
      "the broker takes at most 4,194,304"]),
    (["'b' AS body", "IF(id = 5, map('UNIQ_KEY', 'mine'), map('ok', 'v')) AS properties"], {},
     ["row 5 (partition 0): property 'UNIQ_KEY' is a name RocketMQ reserves"]),
    (["'b' AS body", "IF(id = 2, 'Not A Topic', NULL) AS topic"], {},
     ["row 2 (partition 0): 'Not A Topic' is not a valid topic name"]),
    (["'b' AS body", "CAST(id * 10 AS INT) AS delayLevel"], {},
     ["row 2 (partition 0): delayLevel 20 is not a delay level"]),
])
def test_bad_rows_fail_the_task_and_name_the_row(spark, cluster, unique_name, exprs, options,
                                                 texts):
    topic = unique_name("SinkBadRow")
    cluster.create_topic(topic, queues=4)
    df = spark.range(10, numPartitions=1).selectExpr(*exprs)
    _fails(lambda: write(df, cluster.namesrv_addr, topic, **options), *texts)
    assert _empty(cluster, topic), "the bad row's Arrow batch was not sent"


def test_an_unknown_topic_without_auto_create_names_the_topic(spark, embedded_cluster_factory,
                                                             unique_name):
    cluster = embedded_cluster_factory(brokers=1, auto_create_topics=False)
    topic = unique_name("SinkNoSuchTopic")
    df = spark.range(10).selectExpr("CAST(id AS STRING) AS body")
    _fails(lambda: write(df, cluster.namesrv_addr, topic),
           f"topic '{topic}' does not exist", "create the topic first")


def test_credentials_sign_the_sends_and_never_show(spark, embedded_cluster_factory,
                                                   unique_name):
    cluster = embedded_cluster_factory(brokers=1, acl={"SinkAK": "SinkSecret-123"})
    topic = unique_name("SinkAcl")
    cluster.create_topic(topic, queues=2)
    df = spark.range(100).selectExpr("CAST(id AS STRING) AS body")
    write(df, cluster.namesrv_addr, topic, accessKey="SinkAK", secretKey="SinkSecret-123")
    assert sum(cluster.max_offset(topic, "broker-a", q) for q in range(2)) == 100
    message = _fails(lambda: write(df, cluster.namesrv_addr, topic, accessKey="SinkAK",
                                   secretKey="wrong-secret-456"),
                     f"to topic '{topic}' failed after 1 attempt(s)")
    assert "wrong-secret-456" not in message and "SinkSecret-123" not in message
