"""Apache's C++ client (PyPI ``rocketmq`` 0.4.4) against the embedded server.

The client runs in a subprocess (``tests/cpp_peer.py``) so a crash or its background threads
cannot take pytest down. It sends with legacy SEND_MESSAGE headers, asks for routes as version
63 (bare integer keys), pulls with subscription flags and commits offsets as a push consumer:
all of that must work as against a genuine broker.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rocketmq_spark.client.protocol.message import SYSFLAG_COMPRESSED, decode_messages
from raw_client import RawClient
from waiting import wait_until

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                       reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)"),
]

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
BIG_BODY = "".join("%05d," % i for i in range(1000))  # 6,000 bytes: the client zlib-compresses it


def run_peer(*args, stdin=None, timeout=60):
    proc = subprocess.run([sys.executable, str(PEER), *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sample_messages():
    msgs = [{"body": f"plain message {i}", "tags": "TagA" if i % 2 == 0 else "TagB",
             "keys": f"k{i}"} for i in range(8)]
    msgs += [{"body": f"property message {i}", "tags": "TagA", "keys": f"p{i}",
              "properties": {"color": "red", "size": str(i)}} for i in range(2)]
    msgs += [{"body": BIG_BODY, "tags": "TagB", "keys": f"big{i}"} for i in range(2)]
    return msgs


def test_cpp_producer_and_pull_consumer(embedded_cluster):
    c = embedded_cluster
    c.create_topic("CppT", queues=4)
    sent_specs = sample_messages()
    sent = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "CppT",
                    "--group", "CppProducer", stdin=json.dumps(sent_specs))["results"]
    assert [r.get("status") for r in sent] == ["OK"] * len(sent_specs), sent
    ids = [r["msg_id"] for r in sent]
    assert len(set(ids)) == len(ids)

    # what the server stored for the big bodies: compressed as sent, CRC over the stored bytes
    stored = []
    for b in c.brokers:
        with RawClient(b.addr) as client:
            for q in range(4):
                r = client.request(11, {"consumerGroup": "Check", "topic": "CppT",
                                        "queueId": str(q), "queueOffset": "0",
                                        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
                                        "suspendTimeoutMillis": "0", "subVersion": "0",
                                        "subscription": "*"})
                stored += decode_messages(r.body) if r.code == 0 else []
    assert len(stored) == len(sent_specs)
    big = [m for m in stored if m.keys and m.keys.startswith("big")]
    assert len(big) == 2
    for m in big:
        assert m.sys_flag & SYSFLAG_COMPRESSED and len(m.stored_body) < 6000
        assert zlib.decompress(m.stored_body).decode() == BIG_BODY == m.body.decode()
    assert {m.properties.get("UNIQ_KEY") for m in stored} == set(ids)
    assert all("WAIT" not in m.properties and m.properties["CLUSTER"] == "DefaultCluster"
               for m in stored)

    pulled = run_peer("pull", "--namesrv", c.namesrv_addr, "--topic", "CppT", "--group",
                      "CppPull", "--props", "color,size")
    got = {m["id"]: m for m in pulled["messages"]}
    assert set(got) == set(ids)
    for spec, msg_id in zip(sent_specs, ids):
        m = got[msg_id]
        assert (m["topic"], m["tags"], m["keys"], m["body"]) == (
            "CppT", spec["tags"], spec["keys"], spec["body"])
        props = spec.get("properties", {})
        assert m["properties"] == {"color": props.get("color", ""), "size": props.get("size", "")}
    # every queue was read to its end: the last status per queue is NO_NEW_MSG at max offset
    last = {}
    for broker, queue, _, status, next_begin in pulled["pulls"]:
        last[(broker, queue)] = (status, next_begin)
    assert all(s == "NO_NEW_MSG" for s, _ in last.values())
    assert sum(n for _, n in last.values()) == len(sent_specs)


def test_cpp_tag_filtered_pull(embedded_cluster):
    c = embedded_cluster
    c.create_topic("CppTagT", queues=2)
    for b in c.brokers:
        for q in range(2):
            c.append("CppTagT", b.name, q, [b"a-1", b"a-2"], tags="TagA")
            c.append("CppTagT", b.name, q, [b"b-1"], tags="TagB")
            c.append("CppTagT", b.name, q, [b"untagged"])
    pulled = run_peer("pull", "--namesrv", c.namesrv_addr, "--topic", "CppTagT",
                      "--expression", "TagA")
    assert sorted(m["body"] for m in pulled["messages"]) == sorted(["a-1", "a-2"] * 4)
    assert {m["tags"] for m in pulled["messages"]} == {"TagA"}


def test_cpp_auto_created_topic(embedded_cluster):
    """No admin step: the C++ producer sends to an unknown topic through TBW102's route."""
    c = embedded_cluster
    specs = [{"body": f"auto {i}", "tags": "T", "keys": f"a{i}"} for i in range(6)]
    sent = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "CppAutoT",
                    stdin=json.dumps(specs))["results"]
    assert [r.get("status") for r in sent] == ["OK"] * 6, sent
    assert any(c.topic_config("CppAutoT", b.name) for b in c.brokers)
    pulled = run_peer("pull", "--namesrv", c.namesrv_addr, "--topic", "CppAutoT")
    assert sorted(m["body"] for m in pulled["messages"]) == sorted(s["body"] for s in specs)


def test_cpp_send_batch_is_stored_as_one_message(embedded_cluster):
    """The C++ client sends batches on code 10 with batch=1; like 4.9.8 we store one message."""
    c = embedded_cluster
    c.create_topic("CppBatchT", queues=1, brokers=["broker-a"])
    specs = [{"body": f"batch message {i}", "tags": "TagA", "keys": f"b{i}"} for i in range(4)]
    sent = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "CppBatchT", "--batch",
                    stdin=json.dumps(specs))["results"]
    assert sent[0].get("status") == "OK" and sent[0]["offset"] == 0, sent
    assert c.max_offset("CppBatchT", "broker-a", 0) == 1


def test_cpp_push_consumer_group(embedded_cluster):
    c = embedded_cluster
    c.create_topic("CppPushT", queues=4)
    expected = []
    for b in c.brokers:
        for q in range(4):
            bodies = [f"{b.name}-{q}-{i}".encode() for i in range(3)]
            c.append("CppPushT", b.name, q, bodies, tags="x")
            expected += [x.decode() for x in bodies]
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "push", "--namesrv", c.namesrv_addr, "--topic", "CppPushT",
         "--group", "CppPushG", "--expect", str(len(expected)), "--timeout", "40",
         "--linger", "1.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    listed = None

    def group_listed_or_peer_exited() -> bool:
        nonlocal listed
        if proc.poll() is not None:
            return True
        with RawClient(c.broker("broker-b").addr) as client:
            r = client.request(38, {"consumerGroup": "CppPushG"})
            if r.code == 0:
                listed = json.loads(r.body)["consumerIdList"]
        return listed is not None

    try:
        wait_until(group_listed_or_peer_exited, 30, "the C++ push consumer in its group")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert listed and len(listed) == 1 and "@" in listed[0]
    result = json.loads(out.strip().splitlines()[-1])
    assert sorted(m["body"] for m in result["messages"]) == sorted(expected)
    # offsets were committed for every queue (UPDATE_CONSUMER_OFFSET or the pull commit bit)
    for b in c.brokers:
        for q in range(4):
            assert c.consumer_offset("CppPushG", "CppPushT", b.name, q) == 3
    # after shutdown the client unregistered: the group is empty again
    assert c.consumer_clients("CppPushG", "broker-a") == []


def test_cpp_client_acl_signatures(embedded_cluster_factory):
    """The C++ client's request signatures verify; a wrong secret is refused."""
    c = embedded_cluster_factory(brokers=1, acl={"cppAK": "cppSK"})
    c.create_topic("CppAclT", queues=2)
    specs = [{"body": "signed", "tags": "a", "keys": "k"}]
    ok = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "CppAclT",
                  "--access-key", "cppAK", "--secret-key", "cppSK", stdin=json.dumps(specs))
    assert ok["results"][0].get("status") == "OK", ok
    bad = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "CppAclT",
                   "--access-key", "cppAK", "--secret-key", "wrong", stdin=json.dumps(specs))
    assert "error" in bad["results"][0]
    pulled = run_peer("pull", "--namesrv", c.namesrv_addr, "--topic", "CppAclT",
                      "--access-key", "cppAK", "--secret-key", "cppSK")
    assert [m["body"] for m in pulled["messages"]] == ["signed"]
    assert c.max_offset("CppAclT", "broker-a", 0) + c.max_offset("CppAclT", "broker-a", 1) == 1
