"""The whole connector with ``nameServer`` naming a 5.x proxy's remoting port (the embedded
one, :mod:`rocketmq_spark.embedded.proxy_remoting`): every request goes through it, the
brokers behind it share its one address."""
from __future__ import annotations

import json

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.source.offsets import queue_offsets
from source_helpers import (
    assert_read_in_queue_order, ids_of, available_now_with_lag_listener, produce, reader,
    run_available_now,
)
from waiting import wait_until


@pytest.fixture(scope="module")
def proxied():
    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=2, proxy_remoting=True) as cluster:
        yield cluster


def broker_offsets(cluster, topic: str, group: str) -> dict:
    return {f"{topic}/{b.name}/{q}": cluster.consumer_offset(group, topic, b.name, q)
            for b in cluster.brokers for q in range(4)}


def test_stream_restarts_exactly_once_and_commits_back_through_the_proxy(spark, proxied,
                                                                        unique_name, tmp_path):
    topic, group = unique_name("PxStream"), unique_name("PxStreamGroup")
    proxied.create_topic(topic, 4)
    proxy = proxied.proxy_remoting_addr
    checkpoint, sink = str(tmp_path / "cp"), str(tmp_path / "out")
    produce(proxy, topic, range(0, 1500))
    forwarded = proxied.proxy_remoting.forwarded
    df = reader(spark, proxy, topic, startingOffsets="earliest", consumerGroup=group,
                maxMessagesPerTrigger=500)
    run_available_now(spark, df, checkpoint, sink)
    assert spark.read.parquet(sink).count() == 1500
    produce(proxy, topic, range(1500, 2500))
    query = run_available_now(spark, df, checkpoint, sink)
    assert proxied.proxy_remoting.forwarded > forwarded + 16  # pulls and offsets went through
    out = spark.read.parquet(sink)
    assert ids_of(out.select("keys").collect()) == list(range(2500))
    assert_read_in_queue_order(out, 8)
    # commit-back: UPDATE_CONSUMER_OFFSET through the proxy, stored by each broker
    end = queue_offsets(json.loads(query.lastProgress["sources"][0]["endOffset"]))
    assert broker_offsets(proxied, topic, group) == end


def test_batch_read_through_the_proxy(spark, proxied, unique_name):
    topic = unique_name("PxBatch")
    proxied.create_topic(topic, 4)
    produce(proxied.proxy_remoting_addr, topic, range(700))
    df = spark.read.format("rocketmq").option("nameServer", proxied.proxy_remoting_addr) \
        .option("subscribe", topic).load()
    rows = df.select("keys", "brokerName").collect()
    assert ids_of(rows) == list(range(700))
    assert {r.brokerName for r in rows} == {"broker-a", "broker-b"}


def test_group_membership_through_the_proxy(spark, proxied, unique_name, tmp_path):
    topic, group = unique_name("PxMember"), unique_name("PxMemberGroup")
    proxied.create_topic(topic, 4)
    produce(proxied.proxy_remoting_addr, topic, range(400))
    df = reader(spark, proxied.proxy_remoting_addr, topic, startingOffsets="earliest",
                consumerGroup=group, membership="group", memberName="px")
    query = df.writeStream.format("memory").queryName("px_member") \
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        wait_until(lambda: spark.table("px_member").count() == 400, 120, "the member's rows")
        with Admin(proxied.proxy_remoting_addr) as admin:
            members = admin.brokers.get_consumer_list_by_group(proxied.proxy_remoting_addr,
                                                               group)
        assert len(members) == 1 and "@spark-px-" in members[0]
        assert ids_of(spark.table("px_member").collect()) == list(range(400))
        assert query.exception() is None
    finally:
        query.stop()


def test_lag_listener_through_the_proxy(spark, proxied, unique_name, tmp_path):
    topic = unique_name("PxLag")
    proxied.create_topic(topic, 2, brokers=["broker-b"])
    for q in (0, 1):
        proxied.append(topic, "broker-b", q, [b"%d" % i for i in range(50)])
    df = reader(spark, proxied.proxy_remoting_addr, topic, startingOffsets="earliest",
                maxMessagesPerTrigger=50)
    lag, query = available_now_with_lag_listener(
        spark, {"nameServer": proxied.proxy_remoting_addr, "subscribe": topic}, df,
        str(tmp_path / "cp"))
    assert [r.total_offsets_behind_latest for r in lag.reports(query.id)] == [100, 50, 0]


def test_sink_writes_through_the_proxy(spark, proxied, unique_name, tmp_path):
    """At least once (exactly once through a proxy is refused, see
    test_proxy_remoting_sink_51.py)."""
    topic = unique_name("PxSink")
    proxied.create_topic(topic, 4)
    forwarded = proxied.proxy_remoting.forwarded
    (spark.range(600).selectExpr("CAST(id AS STRING) AS body", "CAST(id AS STRING) AS keys")
     .write.mode("append").format("rocketmq").option("nameServer", proxied.proxy_remoting_addr)
     .option("topic", topic).option("checkpointLocation", str(tmp_path / "cp")).save())
    assert proxied.proxy_remoting.forwarded > forwarded
    wait_until(lambda: sum(proxied.max_offset(topic, b.name, q) for b in proxied.brokers
                           for q in range(4)) == 600, 30, "every row stored")
