"""A mixed consumer group loses nothing that its C++ members fail: Apache's C++ PushConsumer
sends those messages back (CONSUMER_SEND_MSG_BACK), the broker stores them in the group's retry
topic, and the ones on the retry queue allocated to the Spark member are read by it, under the
original topic. Before, a Spark member never read its retry share: those messages were lost.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from group_helpers import members, queues_of, running_queues
from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.group.allocation import allocate_all, java_sorted
from rocketmq_spark.client.group.membership import member_client_id
from source_helpers import committed, max_offsets, start_memory
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
TOPIC, GROUP = "MixRetryT", "mixed-retry"
FAILED = [f"f{i}" for i in range(10)]  # the C++ member fails their first delivery


def layout_for(cpp_pid: int) -> dict:
    """Queues per broker such that the C++ member holds a queue on the broker whose retry
    queue falls to the Spark member. Averagely gives the member sorted first the first half of
    the queues and broker-a's retry queue; C++ client ids are ``<pid>-<ip>@DEFAULT``, ours
    ``<ip>@spark-...``, so the pid decides the order."""
    spark_prefix = member_client_id().split("@")[0] + "@spark-"
    cpp_first = java_sorted([f"{cpp_pid}-", spark_prefix])[0] == f"{cpp_pid}-"
    return {"broker-a": 1, "broker-b": 3} if cpp_first else {"broker-a": 3, "broker-b": 1}


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
@pytest.mark.timeout(300)
def test_messages_a_cpp_member_fails_reach_the_spark_member_through_its_retry_queue(
        spark, embedded_cluster_factory, tmp_path):
    cluster = embedded_cluster_factory(brokers=2, message_delay_level=" ".join(["100ms"] * 18))
    retry = f"%RETRY%{GROUP}"
    start_file, stop_file = tmp_path / "start", tmp_path / "stop"
    peer = subprocess.Popen(
        [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr, "--topic", TOPIC,
         "--group", GROUP, "--start-file", str(start_file), "--stop-file", str(stop_file),
         "--fail-keys", ",".join(FAILED), "--timeout", "240", "--linger", "1"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "peer.log", "w"), text=True)
    query = None
    try:
        for broker, n in layout_for(peer.pid).items():
            cluster.create_topic(TOPIC, queues=n, brokers=[broker])
        start_file.touch()
        assert json.loads(peer.stdout.readline()) == {"started": True}
        reader = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                  .option("subscribe", TOPIC).option("consumerGroup", GROUP)
                  .option("membership", "group").option("memberName", "mixretry")
                  .option("startingOffsets", "earliest").option("rebalanceIntervalMs", "1000")
                  .load())
        query = start_memory(reader, "mixretry", str(tmp_path / "cp"))
        ids = wait_until(lambda: len(members(cluster, GROUP)) == 2 and members(cluster, GROUP),
                         60, "the two members")
        (spark_id,) = [i for i in ids if "@spark-mixretry-" in i]
        (cpp_id,) = [i for i in ids if i != spark_id]
        queues = queues_of(cluster, TOPIC)
        retry_queues = queues_of(cluster, retry)
        share = allocate_all("averagely", queues + retry_queues, ids)
        retry_owner = {mq.broker_name: m for m, qs in share.items() for mq in qs if mq in
                       retry_queues}
        mine = [mq for mq in share[cpp_id] if mq.topic == TOPIC]
        cross = [mq for mq in mine if retry_owner[mq.broker_name] == spark_id]
        own = [mq for mq in mine if retry_owner[mq.broker_name] == cpp_id]
        assert len(cross) == 1 and len(own) == 1, (share, retry_owner)
        for member in (spark_id, cpp_id):
            wait_until(lambda: running_queues(cluster, GROUP, member, TOPIC) == sorted(
                mq for mq in share[member] if mq.topic == TOPIC), 60, f"{member}'s share")
        with Producer(cluster.namesrv_addr) as producer:
            sent = {}
            for mq in queues:
                keys = [f"n{mq.broker_name[-1]}{mq.queue_id}-{i}" for i in range(6)]
                keys += FAILED[:5] if mq == cross[0] else FAILED[5:] if mq == own[0] else []
                for k in keys:
                    sent[k] = producer.send(Message(TOPIC, k.encode(), keys=k), queue=mq).msg_id

        def spark_rows():
            return spark.table("mixretry").collect()

        (spark_retry,) = [mq for mq in share[spark_id] if mq.topic == retry]

        def settled() -> bool:
            """Both members committed both topics (the C++ client persists every 5 s), and
            the Spark member read all its retry queue holds, which is not empty."""
            held = max_offsets(cluster.namesrv_addr, retry)[spark_retry.key]
            return (held > 0 and committed(cluster.namesrv_addr, retry, GROUP)
                    == max_offsets(cluster.namesrv_addr, retry)
                    and committed(cluster.namesrv_addr, TOPIC, GROUP)
                    == max_offsets(cluster.namesrv_addr, TOPIC)
                    and len([r for r in spark_rows() if r["reconsumeTimes"]]) == held)

        wait_until(settled, 90, "the Spark member to read what the C++ member sent back to its "
                   "retry queue, and both members to commit")
    finally:
        start_file.touch()
        stop_file.touch()
        output = json.loads(peer.communicate(timeout=60)[0].strip().splitlines()[-1])
        if query is not None:
            query.stop()
    rows = spark_rows()
    by_spark = [r["msgId"] for r in rows]
    assert len(by_spark) == len(set(by_spark)), "the Spark member read a message twice"
    consumed = set(by_spark) | {m["id"] for m in output["messages"]}
    assert consumed >= set(sent.values()), \
        sorted(k for k, i in sent.items() if i not in consumed)  # nothing lost
    # What the C++ member sent back to the Spark member's retry queue, as stored there...
    stored = (spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("assign", json.dumps([spark_retry.key])).load().collect())
    # ...the Spark member read under the original topic, with the first msgId.
    retried = sorted((r["keys"], r["topic"], r["msgId"], r["reconsumeTimes"], r["brokerName"])
                     for r in rows if r["reconsumeTimes"])
    assert retried == sorted((r["keys"], TOPIC, sent[r["keys"]], 1, spark_retry.broker_name)
                             for r in stored)
    assert set(FAILED[:5]) & {r[0] for r in retried}, retried
    assert {m["keys"] for m in output["failed"]} <= set(FAILED)
