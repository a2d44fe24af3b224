"""Spark reads go on from a slave while a master is down, and back on the master when it returns.

Two brokers, each with a slave (``EmbeddedCluster(slaves=1)``); the master of ``broker-a`` is
stopped (its address leaves the route, as the genuine name server drops a master whose
connection closed: capture ``rocketmq-4.9.8-slave``). Every message is read exactly once
(checkpointed streams into parquet: counts and distinct (brokerName, queueId, queueOffset) and
msgIds), the group's offsets are committed to whichever node serves (read on the embedded
nodes), and the lag listener keeps reporting. Apache's C++ PushConsumer, in the same scenario,
is the reference for what a client may expect from the slave.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException

from rocketmq_spark import RocketMQLagListener
from rocketmq_spark.embedded.cluster import EmbeddedCluster

from source_helpers import produce, reader, run_available_now
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
TOPIC, GROUP = "SlaveT", "SlaveG"


@pytest.fixture
def cluster():
    """A cluster of its own (the tests stop and start a master), 4 queues on each broker,
    3,000 messages sent and copied by both slaves."""
    with EmbeddedCluster(brokers=2, slaves=1) as c:
        c.create_topic(TOPIC, queues=4)
        produce(c.namesrv_addr, TOPIC, range(3000))
        c.wait_replicated()
        c.sync_slaves()  # the slaves know the topic (SlaveSynchronize, every 10 s)
        yield c


def _rows(spark, path: str):
    return spark.read.parquet(path).select("brokerName", "queueId", "queueOffset", "msgId",
                                           "keys").collect()


def _exactly_once(rows, expected: int) -> None:
    assert len(rows) == expected
    assert len({(r.brokerName, r.queueId, r.queueOffset) for r in rows}) == expected
    assert len({r.msgId for r in rows}) == expected
    assert len({r.keys for r in rows}) == expected


def _committed(cluster, node_of):
    """The group's offset of every queue on the node ``node_of(broker)`` says."""
    return {(b, q): cluster.node_consumer_offset(GROUP, TOPIC, b, q, node_of(b))
            for b in ("broker-a", "broker-b") for q in range(4)}


def _maxima(cluster):
    return {(b, q): cluster.node_max_offset(TOPIC, b, q, 1)
            for b in ("broker-a", "broker-b") for q in range(4)}


def test_batch_and_available_now_read_from_the_slave(spark, cluster, tmp_path):
    cluster.broker("broker-a").stop()
    batch = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", TOPIC).load()
    rows = batch.select("brokerName", "queueId", "queueOffset", "msgId", "keys").collect()
    _exactly_once(rows, 3000)
    assert sum(r.brokerName == "broker-a" for r in rows) == 1500

    df = reader(spark, cluster.namesrv_addr, TOPIC, startingOffsets="earliest",
                consumerGroup=GROUP)
    run_available_now(spark, df, str(tmp_path / "cp"), sink=str(tmp_path / "out"))
    _exactly_once(_rows(spark, str(tmp_path / "out")), 3000)
    # broker-a's offsets went to its slave, broker-b's to its master
    assert _committed(cluster, lambda b: 1 if b == "broker-a" else 0) == _maxima(cluster)


@pytest.mark.slow
def test_stream_goes_on_from_the_slave_and_back_to_the_master(spark, cluster, tmp_path):
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    options = {"nameServer": cluster.namesrv_addr, "subscribe": TOPIC}
    lag = RocketMQLagListener(options, time_lag=True)
    spark.streams.addListener(lag)
    df = reader(spark, cluster.namesrv_addr, TOPIC, startingOffsets="earliest",
                consumerGroup=GROUP, maxMessagesPerTrigger=1000)
    query = df.writeStream.format("parquet").option("path", out) \
        .option("checkpointLocation", cp).trigger(processingTime="200 milliseconds").start()
    try:
        def read_rows(n):
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            try:
                return len(_rows(spark, out)) >= n
            except AnalysisException:  # no file written yet
                return False

        wait_until(lambda: read_rows(1000), 120, "the first 1,000 rows")
        cluster.broker("broker-a").stop()  # mid-stream
        reports = len(lag.reports(query.id))
        produce(cluster.namesrv_addr, TOPIC, range(3000, 4000))  # all to broker-b now
        wait_until(lambda: read_rows(4000), 120, "4,000 rows, broker-a's from its slave")
        wait_until(lambda: lag.reports(query.id)[reports:] and lag.latest(
            query.id).max_offsets_behind_latest == 0, 60, "lag reports while the master "
            "is down, the last one caught up")
        assert all(len(r.queues) == 8 for r in lag.reports(query.id)[reports:])
        wait_until(lambda: _committed(cluster, lambda b: 1 if b == "broker-a" else 0)
                   == _maxima(cluster), 60, "offsets committed to broker-a's slave")

        cluster.broker("broker-a").start()  # back: sends reach it again, reads go there
        produce(cluster.namesrv_addr, TOPIC, range(4000, 5000))
        wait_until(lambda: read_rows(5000), 120, "5,000 rows")
        cluster.wait_replicated()
        wait_until(lambda: _committed(cluster, lambda b: 0) == _maxima(cluster), 60,
                   "every offset committed to the masters")
    finally:
        query.stop()
        spark.streams.removeListener(lag)
        lag.close()
    _exactly_once(_rows(spark, out), 5000)
    assert query.exception() is None


def test_cpp_push_consumer_reads_the_slave_too(cluster):
    """The reference: Apache's C++ PushConsumer (0.4.4) with broker-a's master stopped
    consumes broker-a's messages from the slave and commits their offsets there."""
    cluster.broker("broker-a").stop()
    proc = subprocess.run(
        [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr, "--topic",
         TOPIC, "--group", GROUP, "--expect", "3000", "--timeout", "60", "--linger", "1"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    messages = json.loads(proc.stdout.strip().splitlines()[-1])["messages"]
    assert len(messages) == 3000 and len({m["keys"] for m in messages}) == 3000
    committed = _committed(cluster, lambda b: 1 if b == "broker-a" else 0)
    assert committed == _maxima(cluster)


def test_the_sink_sends_to_the_masters_left_and_says_when_none_is(spark, cluster):
    """Producers send to masters only (a slave refuses sends with code 14, as captured): with
    broker-a's master down every row goes to broker-b; with both down the write fails naming
    the brokers that lack a master."""
    cluster.broker("broker-a").stop()
    rows = spark.range(200).selectExpr("cast(id as string) as body")

    def write():
        rows.write.format("rocketmq").mode("append").option("nameServer", cluster.namesrv_addr) \
            .option("topic", TOPIC).save()

    before = {b: sum(cluster.node_max_offset(TOPIC, b, q, 1 if b == "broker-a" else 0)
                     for q in range(4)) for b in ("broker-a", "broker-b")}
    write()
    after = {b: sum(cluster.node_max_offset(TOPIC, b, q, 1 if b == "broker-a" else 0)
                    for q in range(4)) for b in ("broker-a", "broker-b")}
    assert {b: after[b] - before[b] for b in after} == {"broker-a": 0, "broker-b": 200}

    cluster.broker("broker-b").stop()
    with pytest.raises(Exception) as info:
        write()
    assert "no master of broker-a, broker-b is in the route" in str(info.value)
