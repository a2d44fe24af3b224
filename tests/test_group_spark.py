"""Spark queries as members of one RocketMQ consumer group (``membership=group``), in a real
local Spark session against the embedded brokers: the queues are shared, move when members join
and leave, and the union of the members' sinks holds every message exactly once.

Each query has its own streaming-source runner process, so two queries of one session are two
members with their own client ids and connections, as two applications would be.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from group_helpers import (
    TOPIC_QUEUES, Feeder, LockHolder, duplicates, lock_holders, member_query, members,
    queues_of, queues_read, running_queues, shares, sink_rows,
)
from rocketmq_spark.client.group.allocation import allocate_all
from source_helpers import committed, max_offsets
from waiting import wait_until


def union_keys(spark, work: Path, names):
    return [int(r["keys"]) for n in names for r in sink_rows(spark, work, n)]


@pytest.fixture
def topic(embedded_cluster):
    """Not conftest's topic: the group's topic, with the TOPIC_QUEUES queues the share checks
    count, on the fresh cluster each group test gets."""
    embedded_cluster.create_topic("GroupT", queues=TOPIC_QUEUES)
    return "GroupT"


def committed_back(cluster, topic: str, group: str) -> bool:
    """Every queue's committed offset has reached its max offset: each member has called
    Spark's next ``latestOffset`` after its last batch, so no batch is between its sink commit
    and the hand-back of its end."""
    return committed(cluster.namesrv_addr, topic, group) == max_offsets(cluster.namesrv_addr,
                                                                        topic)


@pytest.mark.timeout(480)
def test_members_share_queues_and_hand_them_over_exactly_once(spark, embedded_cluster_factory,
                                                             tmp_path):
    """m1 alone, with two queues locked by another client: it reads the other ten, then the
    one released, then the one whose lock expires. m2 joins (6 queues each); m3 joins while
    messages flow (4 each); m2 stops cleanly (6 each again). The union of the three parquet
    sinks holds every message exactly once."""
    # Locks expire after 3 s here (60 s on a default broker), so the members renew every
    # second (rebalanceIntervalMs; they trust a lock for 1.5 intervals).
    cluster = embedded_cluster_factory(brokers=2, rebalance_lock_max_live_seconds=3.0)
    topic, group, n = "GroupT", "spark-members", 7200
    cluster.create_topic(topic, queues=TOPIC_QUEUES)
    queues = queues_of(cluster, topic)
    names = ["m1", "m2", "m3"]
    options = {"lockQueues": "true", "rebalanceIntervalMs": "1000"}
    blocked = [queues[0], queues[TOPIC_QUEUES]]  # broker-a/0 and broker-b/0
    # Another client holds these two (e.g. an orderly consumer), renewing every 0.5 s.
    blocker = LockHolder(cluster, group, blocked).start()
    feeder = Feeder(cluster.namesrv_addr, topic, n, rate=1500, chunk=20)
    first, half, three_quarters = (feeder.hold_at(240), feeder.hold_at(n // 2),
                                   feeder.hold_at(3 * n // 4))
    queries = {}
    try:
        queries["m1"] = member_query(spark, cluster.namesrv_addr, topic, group, "m1", tmp_path,
                                     **options)
        feeder.start()  # 20 messages in each queue, then it waits
        wait_until(lambda: len(sink_rows(spark, tmp_path, "m1")) >= 200, 90,
                   "m1 to read the ten queues it could lock")
        read = queues_read(sink_rows(spark, tmp_path, "m1"))
        assert sorted(read) == sorted(set(queues) - set(blocked))
        blocker.release(blocked[0])  # unlocked: m1 takes it at once
        blocker.abandon(blocked[1])  # no longer renewed: m1 takes it when it expires
        wait_until(lambda: queues_read(sink_rows(spark, tmp_path, "m1")).get(blocked[0]) == 20,
                   30, "m1 to read the queue released")
        wait_until(lambda: queues_read(sink_rows(spark, tmp_path, "m1")).get(blocked[1]) == 20,
                   30, "m1 to read the queue whose lock expired")
        assert list(shares(lock_holders(cluster, group)).values()) == [12]  # all m1's now

        queries["m2"] = member_query(spark, cluster.namesrv_addr, topic, group, "m2", tmp_path,
                                     **options)
        wait_until(lambda: sorted(shares(lock_holders(cluster, group)).values()) == [6, 6], 60,
                   "m1 and m2 to hold 6 queues each")
        ids = members(cluster, group)
        assert len(ids) == 2 and all("@spark-m" in i for i in ids), ids
        first.set()
        wait_until(lambda: feeder.sent > n // 4, 60, "a quarter of the messages")
        queries["m3"] = member_query(spark, cluster.namesrv_addr, topic, group, "m3", tmp_path,
                                     **options)
        wait_until(lambda: sorted(shares(lock_holders(cluster, group)).values()) == [4, 4, 4],
                   60, "three members with 4 queues each")
        joined_at = feeder.sent  # the feeder waits at n/2 at most: m3 joined mid-stream
        half.set()
        # The clean stop comes while m2 is between batches with its last batch committed back
        # (a stop that lands after a batch's sink commit and before Spark's next trigger hands
        # that batch over again: the window the README states, measured by
        # ci/bench_rebalance.py).
        wait_until(lambda: feeder.sent == 3 * n // 4, 60, "three quarters of the messages")
        wait_until(lambda: committed_back(cluster, topic, group), 120,
                   "every member to commit what it read")
        t0 = time.monotonic()
        queries.pop("m2").stop()  # a clean stop: its queues go to m1 and m3
        wait_until(lambda: sorted(shares(lock_holders(cluster, group)).values()) == [6, 6], 60,
                   "m1 and m3 to take m2's queues")
        handover = time.monotonic() - t0
        three_quarters.set()
        feeder.join()
        wait_until(lambda: len(union_keys(spark, tmp_path, names)) >= n, 180,
                   "every message in the sinks")
    finally:
        for q in queries.values():
            q.stop()
        blocker.close()
    keys = union_keys(spark, tmp_path, names)
    assert duplicates(keys) == {}, f"read twice: {len(duplicates(keys))} messages"
    assert sorted(keys) == list(range(n))
    assert all(queues_read(sink_rows(spark, tmp_path, name)) for name in names)
    assert n // 4 < joined_at <= n // 2
    assert handover < 10, f"m2's queues moved {handover:.1f} s after its stop"


PEER = Path(__file__).resolve().parent / "cpp_peer.py"


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
@pytest.mark.timeout(300)
def test_mixed_group_with_cpp_push_consumers_agrees_on_the_queues(spark, embedded_cluster,
                                                                 topic, tmp_path):
    """One Spark member and two C++ PushConsumers (Apache's client, in subprocesses) in one
    group: each computes its own share, the shares agree (no queue read by two members, none
    by nobody), and every message is consumed exactly once."""
    cluster, group, n = embedded_cluster, "mixed-group", 2400
    stop_file = tmp_path / "stop"
    peers, query = [], None
    try:
        query = member_query(spark, cluster.namesrv_addr, topic, group, "mixed", tmp_path,
                             lockQueues="true")
        wait_until(lambda: len(lock_holders(cluster, group)) == 12, 60, "the Spark member")
        for i in range(2):
            peers.append(subprocess.Popen(
                [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr,
                 "--topic", topic, "--group", group, "--stop-file", str(stop_file),
                 "--timeout", "240", "--linger", "1"],
                stdout=subprocess.PIPE, stderr=open(tmp_path / f"peer{i}.log", "w"),
                text=True))
            assert json.loads(peers[-1].stdout.readline()) == {"started": True}
        ids = wait_until(lambda: len(members(cluster, group)) == 3 and members(cluster, group),
                         60, "three members")
        spark_id = [i for i in ids if "@spark-mixed-" in i][0]
        expected = allocate_all("averagely", queues_of(cluster, topic), ids)
        wait_until(lambda: sorted(lock_holders(cluster, group)) == sorted(expected[spark_id]),
                   60, "the Spark member to keep only its share")
        # Each C++ member reports the queues it reads (what mqadmin consumerProgress shows):
        # once they are the shares the Java rules give, the group has settled.
        for cpp_id in (i for i in ids if i != spark_id):
            wait_until(lambda: running_queues(cluster, group, cpp_id, topic)
                       == sorted(expected[cpp_id]), 60, f"{cpp_id} to settle on its share")
        assert running_queues(cluster, group, spark_id, topic) == sorted(expected[spark_id])
        feeder = Feeder(cluster.namesrv_addr, topic, n, rate=4000).start()
        feeder.join()
        wait_until(lambda: len(sink_rows(spark, tmp_path, "mixed")) >= len(
            [k for k, mq in feeder.queue_of.items() if mq in expected[spark_id]]), 120,
            "the Spark member's share")
        wait_until(lambda: committed(cluster.namesrv_addr, topic, group)
                   == max_offsets(cluster.namesrv_addr, topic), 60,
                   "every member to commit (the C++ client persists every 5 s)")
    finally:
        stop_file.touch()
        outputs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1])
                   for p in peers]
        if query is not None:
            query.stop()
    read_by = {spark_id: [int(r["keys"]) for r in sink_rows(spark, tmp_path, "mixed")]}
    cpp_ids = [i for i in ids if i != spark_id]
    for out in outputs:
        keys = [int(m["keys"]) for m in out["messages"]]
        owners = {feeder.queue_of[k] for k in keys}
        match = [i for i in cpp_ids if owners <= set(expected[i])]
        assert len(match) == 1, f"a C++ member read queues of two shares: {owners}"
        read_by[match[0]] = keys
    all_keys = [k for keys in read_by.values() for k in keys]
    assert duplicates(all_keys) == {} and sorted(all_keys) == list(range(n))
    for member, keys in read_by.items():
        assert {feeder.queue_of[k] for k in keys} == set(expected[member]), member


@pytest.mark.timeout(240)
def test_available_now_drains_its_share_and_leaves(spark, embedded_cluster, topic, tmp_path):
    """A Trigger.AvailableNow member reads the queues allocated to it at its start, up to
    their ends at that moment, commits them for the group and leaves at once."""
    from test_group_member import make_member

    cluster, group = embedded_cluster, "drain-group"
    other = make_member(cluster.namesrv_addr, group, topic, "other").start()
    try:
        other.apply_allocation({})  # holds its share (it never reads: no Spark behind it)
        feeder = Feeder(cluster.namesrv_addr, topic, 1200, rate=100_000, chunk=20).start()
        feeder.join()
        reader = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                  .option("subscribe", topic).option("consumerGroup", group)
                  .option("membership", "group").option("memberName", "drain")
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 200)
                  .load())
        query = (reader.select("topic", "brokerName", "queueId", "queueOffset", "keys")
                 .writeStream.format("parquet").option("path", str(tmp_path / "drain-out"))
                 .option("checkpointLocation", str(tmp_path / "drain-cp"))
                 .trigger(availableNow=True).start())
        seen = set()

        def drained() -> bool:
            seen.update(cluster.consumer_clients(group))
            return not query.isActive

        wait_until(drained, 180, "the AvailableNow query to drain and stop", interval=0.02)
        assert not query.isActive and query.exception() is None
        (mine,) = seen - {other.client_id}
        assert "@spark-drain-" in mine
        share = allocate_all("averagely", queues_of(cluster, topic), [other.client_id, mine])
        rows = sink_rows(spark, tmp_path, "drain")
        expected = sorted(k for k, mq in feeder.queue_of.items() if mq in share[mine])
        assert sorted(int(r["keys"]) for r in rows) == expected and len(expected) == 600
        assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # 200 a batch
        # It left on its own: the other member is alone again and was told so.
        assert cluster.consumer_clients(group) == [other.client_id]
        wait_until(lambda: len(other.wanted) == 12, 10, "the other member to take over")
        got = committed(cluster.namesrv_addr, topic, group)
        assert all(got[mq.key] == 100 for mq in share[mine])
    finally:
        other.leave()
