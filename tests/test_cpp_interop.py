"""Our client and Apache's C++ client (PyPI ``rocketmq`` 0.4.4) exchanging messages through the
embedded server: what one writes, the other reads, field by field; offsets one commits, the
other sees."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark.client import Message, Producer, QueueRangeReader, ReadSettings
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.protocol.message import SYSFLAG_COMPRESSED
from waiting import wait_until

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                       reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)"),
]

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
BIG_BODY = "".join("%05d," % i for i in range(1000))  # 6,000 bytes: the C++ producer zlibs it


def peer(*args, stdin=None, timeout=60):
    proc = subprocess.run([sys.executable, str(PEER), *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_topic(admin, topic):
    rows = []
    for mq in admin.queues(topic, refresh=True):
        high = admin.offsets("max", [mq])[mq]
        for batch in QueueRangeReader(admin.brokers, admin.address, mq, 0, high,
                                      ReadSettings(consumer_group="interop")):
            for row in batch.to_pylist():
                rows.append(dict(row, broker=mq.broker_name))
    return rows


def test_cpp_producer_messages_read_back_by_our_client(embedded_cluster):
    cluster = embedded_cluster
    cluster.create_topic("InteropFromCpp", queues=4)
    specs = [{"body": f"plain {i}", "tags": ("TagA", "TagB")[i % 2], "keys": f"k{i} alt{i}",
              "properties": {"color": "red", "n": str(i)}} for i in range(10)]
    specs += [{"body": BIG_BODY, "tags": "Big", "keys": f"big{i}"} for i in range(3)]
    sent = peer("produce", "--namesrv", cluster.namesrv_addr, "--topic", "InteropFromCpp",
                stdin=json.dumps(specs))["results"]
    assert [r.get("status") for r in sent] == ["OK"] * len(specs), sent

    with Admin(cluster.namesrv_addr) as admin:
        rows = read_topic(admin, "InteropFromCpp")
    by_id = {r["msg_id"]: r for r in rows}
    assert len(rows) == len(specs) and set(by_id) == {s["msg_id"] for s in sent}
    for spec, result in zip(specs, sent):
        row = by_id[result["msg_id"]]
        assert row["body"] == spec["body"].encode()
        assert row["tags"] == spec["tags"] and row["keys"] == spec["keys"]
        assert row["topic"] == "InteropFromCpp"
        props = dict(item.split("\x01", 1) for item in row["properties"].split("\x02") if item)
        for name, value in spec.get("properties", {}).items():
            assert props[name] == value
        assert "WAIT" not in props and props["CLUSTER"] == "DefaultCluster"
        # the body is inflated by our reader; the flag stays as stored (C++: compressed = 1)
        assert row["sys_flag"] == (SYSFLAG_COMPRESSED if len(row["body"]) >= 4096 else 0)
        assert row["store_host"] == next(b.addr for b in cluster.brokers
                                         if b.name == row["broker"])
        assert row["born_host"].startswith("127.0.0.1:")
        assert row["born_timestamp"] <= row["store_timestamp"]

    # And the C++ consumer, reading the same queues, sees the same messages at the same places.
    pulled = peer("pull", "--namesrv", cluster.namesrv_addr, "--topic", "InteropFromCpp",
                  "--props", "color")["messages"]
    assert {(m["broker"], m["queue_id"], m["queue_offset"], m["id"]) for m in pulled} == {
        (r["broker"], r["queue_id"], r["queue_offset"], r["msg_id"]) for r in rows}


def test_our_producer_messages_read_by_the_cpp_pull_consumer(embedded_cluster):
    cluster = embedded_cluster
    cluster.create_topic("InteropToCpp", queues=2)
    with Producer(cluster.namesrv_addr) as producer:
        singles = [producer.send(Message("InteropToCpp", f"single {i}".encode(),
                                         tags="TagA", keys=f"s{i}",
                                         properties={"color": "blue"}))
                   for i in range(6)]
        big = producer.send(Message("InteropToCpp", BIG_BODY.encode(), tags="Big", keys="big"))
        batch = producer.send_batch([Message("InteropToCpp", f"batch {i}".encode(), tags="TagB",
                                             keys=f"b{i}") for i in range(5)])
    pulled = peer("pull", "--namesrv", cluster.namesrv_addr, "--topic", "InteropToCpp",
                  "--props", "color")["messages"]
    bodies = sorted(m["body"] for m in pulled)
    assert bodies == sorted([f"single {i}" for i in range(6)] + [BIG_BODY]
                            + [f"batch {i}" for i in range(5)])
    by_id = {m["id"]: m for m in pulled}
    for result in singles:
        m = by_id[result.msg_id]
        assert (m["tags"], m["properties"]["color"]) == ("TagA", "blue")
        assert (m["queue_id"], m["queue_offset"]) == (result.queue.queue_id, result.queue_offset)
    assert by_id[big.msg_id]["body"] == BIG_BODY  # our zlib body inflates in the C++ client
    batch_rows = sorted((m for m in pulled if m["body"].startswith("batch")),
                        key=lambda m: m["queue_offset"])
    assert [m["keys"] for m in batch_rows] == [f"b{i}" for i in range(5)]
    assert [m["queue_offset"] for m in batch_rows] == list(range(batch.queue_offset,
                                                                 batch.queue_offset + 5))
    tagged = peer("pull", "--namesrv", cluster.namesrv_addr, "--topic", "InteropToCpp",
                  "--expression", "TagB")["messages"]
    assert sorted(m["body"] for m in tagged) == [f"batch {i}" for i in range(5)]


def test_cpp_push_consumer_offsets_visible_to_our_client(embedded_cluster):
    cluster = embedded_cluster
    cluster.create_topic("InteropPush", queues=4)
    with Producer(cluster.namesrv_addr) as producer:
        for i in range(40):
            producer.send(Message("InteropPush", b"m%d" % i))
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr, "--topic",
         "InteropPush", "--group", "CppPushGroup", "--expect", "40", "--timeout", "30",
         "--linger", "7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline()) == {"started": True}
        with Admin(cluster.namesrv_addr) as admin:
            queues = admin.queues("InteropPush")
            highs = admin.offsets("max", queues)
            state = {}

            def member_listed_and_committed() -> bool:
                state["members"] = admin.brokers.get_consumer_list_by_group(
                    cluster.broker("broker-a").addr, "CppPushGroup")
                state["committed"] = admin.offsets("committed", queues, group="CppPushGroup")
                return bool(state["members"]) and state["committed"] == highs

            wait_until(member_listed_and_committed, 30,
                       "the C++ push consumer listed and its commits at the max offsets")
            members, committed = state["members"], state["committed"]
            assert len(members) == 1 and "@" in members[0]  # the C++ client's id
            assert committed == highs, "the push consumer's commits reach QUERY_CONSUMER_OFFSET"
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    consumed = json.loads(out.strip().splitlines()[-1])["messages"]
    assert sorted(m["body"] for m in consumed) == sorted(f"m{i}" for i in range(40))
