"""The option ``namespace`` end to end, in a real Spark session against the embedded cluster
over real sockets: our sink's rows land in ``ns%T`` where Apache's C++ PullConsumer reads them,
our source reads them back under ``T``, commits land under ``ns%group``, the lag listener names
``T``, and a ``membership=group`` member heartbeats as ``ns%group`` with the retry topic
``%RETRY%ns%group``."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark import RocketMQLagListener
from rocketmq_spark.client.admin import Admin
from source_helpers import produce, reader, run_available_now
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
has_cpp = pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                             reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
N = 40


def cpp_pull(namesrv: str, topic: str) -> list:
    proc = subprocess.run([sys.executable, str(PEER), "pull", "--namesrv", namesrv, "--topic",
                           topic], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["messages"]


def max_offsets(namesrv: str, topic: str) -> int:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic, refresh=True)
        return sum(admin.offsets("max", queues).values())


@pytest.mark.cpp
@has_cpp
@pytest.mark.timeout(300)
def test_sink_source_commits_and_lag_in_a_namespace(spark, cluster, unique_name, tmp_path):
    namesrv = cluster.namesrv_addr
    ns, topic, group = unique_name("ns"), unique_name("T"), unique_name("g")
    wire = f"{ns}%{topic}"
    cluster.create_topic(wire, queues=2)
    cluster.create_topic(topic, queues=2)  # the same name outside the namespace stays empty
    # Half the rows name the topic in a column, half leave it to the option: both go to ns%T.
    df = spark.range(N, numPartitions=2).selectExpr(
        f"CASE WHEN id % 2 = 0 THEN '{topic}' END AS topic", "concat('b', id) AS body")
    (df.write.format("rocketmq").mode("append").option("nameServer", namesrv)
     .option("namespace", ns).option("topic", topic).save())

    pulled = cpp_pull(namesrv, wire)
    assert sorted(m["body"] for m in pulled) == sorted(f"b{i}" for i in range(N))
    assert {m["topic"] for m in pulled} == {wire}
    assert max_offsets(namesrv, topic) == 0

    rows = (spark.read.format("rocketmq").option("nameServer", namesrv)
            .option("namespace", ns).option("subscribe", topic).load()
            .select("topic", "body").collect())
    assert sorted(r.body.decode() for r in rows) == sorted(f"b{i}" for i in range(N))
    assert {r.topic for r in rows} == {topic}

    options = {"nameServer": namesrv, "namespace": ns, "subscribe": topic,
               "consumerGroup": group}
    lag = RocketMQLagListener(options, latest_from_broker=True)
    try:
        stream = reader(spark, namesrv, topic, namespace=ns, consumerGroup=group,
                        startingOffsets="earliest")
        query = run_available_now(spark, stream, str(tmp_path / "cp"))
        streamed = spark.table(query.table_name).select("topic").collect()
        assert len(streamed) == N and {r.topic for r in streamed} == {topic}
        queues = [(b.name, q) for b in cluster.brokers for q in range(2)]
        # Commit-back is under ns%group (the batch's end, on the next latestOffset/commit).
        wait_until(lambda: sum(cluster.consumer_offset(f"{ns}%{group}", wire, b, q) or 0
                               for b, q in queues) == N, 60, "the offsets under ns%group")
        assert all(cluster.consumer_offset(group, wire, b, q) is None for b, q in queues)
        # More messages after the run: the listener sees them behind the run's end, names the
        # queues T/broker/queue and looks the store times up (pulls as ns%lookup group).
        produce(namesrv, wire, range(N, N + 8))
        report = lag.record(query.lastProgress)[0]
    finally:
        lag.close()
    assert report.queues and all(k.startswith(f"{topic}/") for k in report.queues)
    assert report.total_offsets_behind_latest == 8
    behind = [k for k, q in report.queues.items() if q.offsets_behind]
    assert behind and all(report.queues[k].oldest_unread_ms is not None for k in behind)


@pytest.mark.timeout(240)
def test_a_group_member_in_a_namespace(spark, cluster, unique_name, tmp_path):
    """membership=group: the member heartbeats as ns%group, subscribes to ns%T and to the retry
    topic %RETRY%ns%group, reads its rows under T and commits under ns%group."""
    namesrv = cluster.namesrv_addr
    ns, topic, group = unique_name("ns"), unique_name("T"), unique_name("g")
    wire, wire_group = f"{ns}%{topic}", f"{ns}%{group}"
    cluster.create_topic(wire, queues=2)
    produce(namesrv, wire, range(N))
    df = reader(spark, namesrv, topic, namespace=ns, consumerGroup=group, membership="group",
                memberName="nsm", startingOffsets="earliest")
    query = (df.select("topic", "keys").writeStream.format("memory").queryName("ns_member")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="0 seconds").start())
    try:
        wait_until(lambda: spark.table("ns_member").count() == N, 120, "the member's rows")
        info = cluster._call(lambda: cluster._broker("broker-a").clients.consumers.get(
            wire_group))
        assert info is not None and any("@spark-nsm-" in c for c in info.client_ids())
        assert set(info.subscriptions) == {wire, f"%RETRY%{wire_group}"}
        assert cluster.consumer_clients(group, "broker-a") == []
        assert {r.topic for r in spark.table("ns_member").collect()} == {topic}
        wait_until(lambda: sum(cluster.consumer_offset(wire_group, wire, b.name, q) or 0
                               for b in cluster.brokers for q in range(2)) == N, 60,
                   "the member's commits under ns%group")
    finally:
        query.stop()


@pytest.mark.cpp
@has_cpp
@pytest.mark.timeout(240)
def test_exactly_once_in_a_namespace(spark, cluster, unique_name):
    """df.write exactly once: the half messages go to ns%T as half messages of the producer
    group ns%pg (Java's transactional producer puts its group into the namespace, and the
    broker addresses check-backs to that name), and the commit makes them visible there."""
    from broker_store import stored_messages

    namesrv = cluster.namesrv_addr
    ns, topic, group = unique_name("ns"), unique_name("T"), unique_name("pg")
    wire = f"{ns}%{topic}"
    cluster.create_topic(wire, queues=2)
    (spark.range(N, numPartitions=2).selectExpr("concat('e', id) AS body")
     .write.format("rocketmq").mode("append").option("nameServer", namesrv)
     .option("namespace", ns).option("topic", topic).option("producerGroup", group)
     .option("deliveryGuarantee", "exactlyOnce").save())
    assert sorted(m["body"] for m in cpp_pull(namesrv, wire)) == sorted(
        f"e{i}" for i in range(N))
    halves = [m for _, m in stored_messages(cluster, "RMQ_SYS_TRANS_HALF_TOPIC", queues=1)
              if m.properties.get("REAL_TOPIC") == wire]
    assert len(halves) == N and {m.properties["PGROUP"] for m in halves} == {f"{ns}%{group}"}


@pytest.mark.cpp
@has_cpp
@pytest.mark.timeout(240)
def test_grpc_sink_in_a_namespace(spark, unique_name):
    """Through a 5.x proxy the producer sends the namespace (resource_namespace and the
    x-mq-namespace header) and the proxy stores the rows in ns%T."""
    from rocketmq_spark.embedded import EmbeddedCluster

    ns, topic = unique_name("ns"), unique_name("T")
    with EmbeddedCluster(brokers=1, grpc_proxy=True) as proxied:
        proxied.create_topic(f"{ns}%{topic}", 2)
        df = spark.range(N, numPartitions=2).selectExpr(
            f"CASE WHEN id % 2 = 0 THEN '{topic}' END AS topic", "concat('g', id) AS body")
        (df.write.format("rocketmq").mode("append")
         .option("endpoints", proxied.proxy_endpoint).option("tlsCaFile", proxied.proxy_tls_cert)
         .option("namespace", ns).option("topic", topic).save())
        pulled = cpp_pull(proxied.namesrv_addr, f"{ns}%{topic}")
    assert sorted(m["body"] for m in pulled) == sorted(f"g{i}" for i in range(N))


@pytest.mark.cpp
@has_cpp
@pytest.mark.timeout(300)
def test_a_member_beside_a_cpp_consumer_of_the_namespaced_group(spark, cluster, unique_name,
                                                               tmp_path):
    """A Spark member (namespace=ns, consumerGroup=g, subscribe=T) and Apache's C++
    PushConsumer of group ns%g on topic ns%T are one group: each takes the share the Java
    allocation gives it among both."""
    from group_helpers import lock_holders, member_query, members, queues_of, running_queues
    from rocketmq_spark.client.group.allocation import allocate_all

    namesrv = cluster.namesrv_addr
    ns, topic, group = unique_name("ns"), unique_name("T"), unique_name("g")
    wire, wire_group = f"{ns}%{topic}", f"{ns}%{group}"
    cluster.create_topic(wire, queues=4)
    stop_file, peer, query = tmp_path / "stop", None, None
    try:
        query = member_query(spark, namesrv, topic, group, "nscpp", tmp_path, namespace=ns,
                             lockQueues="true")
        wait_until(lambda: len(lock_holders(cluster, wire_group)) == 8, 60, "the Spark member")
        peer = subprocess.Popen(
            [sys.executable, str(PEER), "push", "--namesrv", namesrv, "--topic", wire,
             "--group", wire_group, "--stop-file", str(stop_file), "--timeout", "200",
             "--linger", "1"], stdout=subprocess.PIPE,
            stderr=open(tmp_path / "peer.log", "w"), text=True)
        assert json.loads(peer.stdout.readline()) == {"started": True}
        ids = wait_until(lambda: len(members(cluster, wire_group)) == 2
                         and members(cluster, wire_group), 60, "two members of ns%group")
        spark_id = [i for i in ids if "@spark-nscpp-" in i][0]
        cpp_id = [i for i in ids if i != spark_id][0]
        expected = allocate_all("averagely", queues_of(cluster, wire), ids)
        wait_until(lambda: sorted(lock_holders(cluster, wire_group))
                   == sorted(expected[spark_id]), 60, "the Spark member to keep its share")
        wait_until(lambda: running_queues(cluster, wire_group, cpp_id, wire)
                   == sorted(expected[cpp_id]), 60, "the C++ member to settle on its share")
    finally:
        stop_file.touch()
        if peer is not None:
            peer.communicate(timeout=60)
        if query is not None:
            query.stop()


@pytest.mark.timeout(180)
def test_a_pattern_reads_the_matching_topics_of_its_namespace(spark, cluster, unique_name):
    namesrv = cluster.namesrv_addr
    ns, other, stem = unique_name("ns"), unique_name("nsx"), unique_name("P")
    wanted = [f"{stem}a", f"{stem}b"]
    for name in [f"{ns}%{t}" for t in wanted] + [f"{stem}c", f"{other}%{stem}d",
                                                 f"%RETRY%{ns}%{stem}e"]:
        cluster.create_topic(name, queues=1)
        cluster.append(name, "broker-a", 0, [b"x", b"y", b"z"])
    rows = (spark.read.format("rocketmq").option("nameServer", namesrv)
            .option("namespace", ns).option("subscribePattern", f"{stem}.*").load()
            .select("topic").collect())
    assert sorted(r.topic for r in rows) == sorted(wanted * 3)
