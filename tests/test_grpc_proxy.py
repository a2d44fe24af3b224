"""The 5.x proxy transport end to end: our GrpcProducer and the embedded proxy endpoint, checked
against clients nobody here wrote: the official gRPC client (PyPI rocketmq-python-client 5.1.2,
its own venv, a subprocess: tests/grpc_peer.py) and Apache's C++ client reading via remoting."""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rocketmq_spark.client import ClientConfig, Credentials, Message, QueueRangeReader, ReadSettings
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import (
    AuthError, ProxyAuthError, ProxyError, RequestTimeout, RouteNotFound,
)
from rocketmq_spark.client.grpc import GrpcProducer
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.responses import is_transient
from rocketmq_spark.embedded import EmbeddedCluster

ROOT = Path(__file__).resolve().parent.parent
GRPC_PEER_PYTHON = ROOT / ".venv-grpc-peer" / "bin" / "python"
GRPC_PEER = ROOT / "tests" / "grpc_peer.py"
CPP_PEER = ROOT / "tests" / "cpp_peer.py"

needs_grpc_peer = pytest.mark.skipif(
    not (ROOT / ".venv-grpc-peer" / ".installed-5.1.2").exists(),
    reason="needs .venv-grpc-peer with rocketmq-python-client 5.1.2 (ci/setup.sh makes it; "
           "it could not be installed here)")

AK, SK = "grpcAccess", "grpcSecret-9f3e"


def grpc_peer(*args, stdin=None, timeout=90):
    proc = subprocess.run([str(GRPC_PEER_PYTHON), str(GRPC_PEER), *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"grpc_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpp_peer(*args, timeout=120):
    proc = subprocess.run([sys.executable, str(CPP_PEER), *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_topic(cluster, topic, credentials=None):
    """Every stored message of ``topic``, read with our remoting reader."""
    rows = []
    with Admin(cluster.namesrv_addr, ClientConfig(credentials=credentials)) as admin:
        for mq in admin.queues(topic, refresh=True):
            high = admin.offsets("max", [mq])[mq]
            for batch in QueueRangeReader(admin.brokers, admin.address, mq, 0, high,
                                          ReadSettings(consumer_group="grpc-check")):
                rows.extend(dict(r, broker=mq.broker_name) for r in batch.to_pylist())
    return rows


def props_of(text: str) -> dict:
    from rocketmq_spark.client.protocol.properties import decode_properties

    return decode_properties(text or "")


@pytest.fixture(scope="module")
def cluster():
    with EmbeddedCluster(brokers=2, grpc_proxy=True) as c:
        yield c


@pytest.fixture(scope="module")
def producer(cluster):
    with GrpcProducer(cluster.proxy_endpoint, tls_ca_file=cluster.proxy_tls_cert) as p:
        yield p


def sample(topic: str, n: int, groups: int = 3):
    """Messages with every field set; every third has no sharding key."""
    out = []
    for i in range(n):
        out.append(Message(topic, f"body {i} ✓".encode(), tags=f"tag{i % 4}",
                           keys=[f"k{i}", f"alt{i}"], properties={"n": str(i), "c": "red"},
                           sharding_key=None if i % 3 == 0 else f"group{i % groups}"))
    return out


# ----------------------------------------------------------------------- our producer


def test_our_producer_stores_every_field_and_keeps_groups_in_one_queue(cluster, producer):
    cluster.create_topic("GrpcFields", 4)
    messages = sample("GrpcFields", 60)
    results = producer.send_async(messages).result(30)
    assert [r.msg_id for r in results] == [r.msg_id for r in results] and len(results) == 60
    rows = {r["msg_id"]: r for r in read_topic(cluster, "GrpcFields")}
    assert len(rows) == 60
    by_group = defaultdict(list)
    for m, r in zip(messages, results):
        row = rows[r.msg_id]
        props = props_of(row["properties"])
        assert row["body"] == m.body and row["tags"] == m.tags and row["keys"] == " ".join(m.keys)
        assert props["n"] == m.properties["n"] and props["c"] == "red"
        assert props.get("__SHARDINGKEY") == m.sharding_key
        assert row["queue_offset"] == r.queue_offset
        if m.sharding_key:
            # The queue we predicted from the proxy's rule is the one the message went to.
            assert (row["broker"], row["queue_id"]) == (r.queue.broker_name, r.queue.queue_id)
            by_group[m.sharding_key].append((row["broker"], row["queue_id"],
                                             row["queue_offset"], int(props["n"])))
        else:
            assert r.queue.queue_id == -1  # the proxy does not say where it went
    for group, stored in by_group.items():
        assert len({(b, q) for b, q, _, _ in stored}) == 1, group
        assert [n for *_, n in sorted(stored)] == sorted(n for *_, n in stored), group


def test_multi_message_calls_store_the_first_messages_properties_on_all(cluster):
    """What Apache's proxy + broker store for one call of several messages (the embedded proxy
    forwards it as they do): why one message per call is the default."""
    cluster.create_topic("GrpcBatchCall", 1)
    with GrpcProducer(cluster.proxy_endpoint, tls_ca_file=cluster.proxy_tls_cert,
                      multi_message_calls=True) as p:
        results = p.send([Message("GrpcBatchCall", b"m%d" % i, tags=f"t{i}", keys=f"k{i}")
                          for i in range(3)])
    assert len({r.msg_id for r in results}) == 3  # the proxy answers with each message's id
    rows = sorted(read_topic(cluster, "GrpcBatchCall"), key=lambda r: r["queue_offset"])
    assert [r["body"] for r in rows] == [b"m0", b"m1", b"m2"]
    assert {r["msg_id"] for r in rows} == {results[0].msg_id}
    assert [r["tags"] for r in rows] == ["t0"] * 3


def test_our_producer_to_the_cpp_pull_consumer(cluster, producer):
    if importlib.util.find_spec("rocketmq") is None:
        pytest.skip("needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
    cluster.create_topic("GrpcToCpp", 4)
    messages = sample("GrpcToCpp", 40, groups=4)
    results = producer.send(messages)
    got = cpp_peer("pull", "--namesrv", cluster.namesrv_addr, "--topic", "GrpcToCpp",
                   "--props", "n,c,__SHARDINGKEY")["messages"]
    by_id = {m["id"]: m for m in got}
    assert len(got) == 40 and set(by_id) == {r.msg_id for r in results}
    groups = defaultdict(list)
    for m, r in zip(messages, results):
        seen = by_id[r.msg_id]
        assert seen["body"] == m.body.decode() and seen["tags"] == m.tags
        assert seen["keys"] == " ".join(m.keys)
        assert seen["properties"]["n"] == m.properties["n"] and seen["properties"]["c"] == "red"
        assert seen["properties"]["__SHARDINGKEY"] == (m.sharding_key or "")
        if m.sharding_key:
            groups[m.sharding_key].append((seen["broker"], seen["queue_id"],
                                           seen["queue_offset"], int(m.properties["n"])))
    for group, stored in groups.items():
        assert len({(b, q) for b, q, _, _ in stored}) == 1, group
        assert [n for *_, n in sorted(stored)] == sorted(n for *_, n in stored), group


@needs_grpc_peer
def test_our_producer_to_the_official_simple_consumer(cluster, producer):
    cluster.create_topic("GrpcToOfficial", 2)
    messages = sample("GrpcToOfficial", 24)
    results = producer.send(messages)
    got = grpc_peer("receive", "--endpoints", cluster.proxy_endpoint, "--topic",
                    "GrpcToOfficial", "--group", "OfficialGroup", "--expect", "24",
                    "--timeout", "40", "--tls", "--ca", cluster.proxy_tls_cert)
    assert got["errors"] == []
    by_id = {m["message_id"]: m for m in got["messages"]}
    assert len(got["messages"]) == 24 and set(by_id) == {r.msg_id for r in results}
    for m, r in zip(messages, results):
        seen = by_id[r.msg_id]
        assert seen["body"] == m.body.decode() and seen["tag"] == m.tags
        assert seen["keys"] == sorted(m.keys) and seen["message_group"] == m.sharding_key
        expected = dict(m.properties)
        if m.sharding_key:  # Apache's proxy hands __SHARDINGKEY out as a user property too
            expected["__SHARDINGKEY"] = m.sharding_key
        assert seen["properties"] == expected
        assert seen["delivery_attempt"] == 1
    # Everything was acknowledged: the group's committed offsets reached the end.
    for b in cluster.brokers:
        for q in range(2):
            assert (cluster.consumer_offset("OfficialGroup", "GrpcToOfficial", b.name, q) or 0) \
                == cluster.max_offset("GrpcToOfficial", b.name, q)


@needs_grpc_peer
def test_namespaces_agree_with_the_official_client(cluster, producer):
    """Our producer in namespace ns1 stores into ``ns1%T`` (what the proxy makes of a resource's
    namespace: NamespaceUtil.wrapNamespace); the official producer in ns1 stores there too, and
    the official SimpleConsumer in ns1 (group ``ns1%G``) receives both, and nothing of the
    same topic name outside the namespace."""
    cluster.create_topic("ns1%GrpcNs", 2)
    cluster.create_topic("GrpcNs", 1)  # the same name outside the namespace: not read
    with GrpcProducer(cluster.proxy_endpoint, tls_ca_file=cluster.proxy_tls_cert,
                      namespace="ns1", topics=["GrpcNs"]) as ours:
        sent = [r.msg_id for r in ours.send([Message("GrpcNs", f"ours {i}".encode(), tags="o")
                                             for i in range(6)])]
    official = grpc_peer("produce", "--endpoints", cluster.proxy_endpoint, "--topic", "GrpcNs",
                         "--namespace", "ns1", "--tls", "--ca", cluster.proxy_tls_cert,
                         stdin=json.dumps([{"body": f"official {i}", "tag": "x"}
                                           for i in range(4)]))
    assert all("message_id" in r for r in official["results"]), official
    producer.send([Message("GrpcNs", b"outside the namespace")])
    sent += [r["message_id"] for r in official["results"]]
    stored = read_topic(cluster, "ns1%GrpcNs")
    assert sorted(r["msg_id"] for r in stored) == sorted(sent)
    got = grpc_peer("receive", "--endpoints", cluster.proxy_endpoint, "--topic", "GrpcNs",
                    "--group", "NsGroup", "--namespace", "ns1", "--expect", "10",
                    "--timeout", "40", "--tls", "--ca", cluster.proxy_tls_cert)
    assert got["errors"] == []
    assert sorted(m["message_id"] for m in got["messages"]) == sorted(sent)
    assert sorted(m["body"] for m in got["messages"]) == sorted(
        [f"ours {i}" for i in range(6)] + [f"official {i}" for i in range(4)])
    assert any(cluster.consumer_offset("ns1%NsGroup", "ns1%GrpcNs", b.name, q)
               for b in cluster.brokers for q in range(2))


# ----------------------------------------------------------------------- the official producer


@needs_grpc_peer
def test_official_producer_through_our_proxy_read_by_our_remoting_reader(cluster):
    cluster.create_topic("OfficialToUs", 4)
    specs = [{"body": f"from official {i}", "tag": f"T{i % 3}", "keys": [f"key{i}"],
              "properties": {"i": str(i), "colour": "blue"},
              "message_group": f"g{i % 2}" if i % 4 else ""} for i in range(16)]
    sent = grpc_peer("produce", "--endpoints", cluster.proxy_endpoint, "--topic",
                     "OfficialToUs", "--tls", "--ca", cluster.proxy_tls_cert,
                     stdin=json.dumps(specs))["results"]
    assert all("message_id" in r for r in sent), sent
    rows = {r["msg_id"]: r for r in read_topic(cluster, "OfficialToUs")}
    assert set(rows) == {r["message_id"] for r in sent}
    groups = defaultdict(set)
    for spec, r in zip(specs, sent):
        row = rows[r["message_id"]]
        props = props_of(row["properties"])
        assert row["body"].decode() == spec["body"] and row["tags"] == spec["tag"]
        assert row["keys"] == spec["keys"][0] and row["queue_offset"] == r["offset"]
        assert props["i"] == spec["properties"]["i"] and props["colour"] == "blue"
        assert props.get("__SHARDINGKEY", "") == spec["message_group"]
        assert props["PGROUP"] == "OfficialToUs"  # the proxy names the topic as the group
        if spec["message_group"]:
            groups[spec["message_group"]].add((row["broker"], row["queue_id"]))
    assert all(len(queues) == 1 for queues in groups.values()), groups


# ----------------------------------------------------------------------- ACL, TLS, faults


@pytest.fixture(scope="module")
def acl_cluster():
    with EmbeddedCluster(grpc_proxy=True, acl={AK: SK}) as c:
        c.create_topic("GrpcAcl", 2)
        yield c


def test_acl_signed_calls_pass(acl_cluster):
    with GrpcProducer(acl_cluster.proxy_endpoint, tls_ca_file=acl_cluster.proxy_tls_cert,
                      credentials=Credentials(AK, SK)) as p:
        r = p.send([Message("GrpcAcl", b"signed", tags="a")])
    rows = read_topic(acl_cluster, "GrpcAcl", Credentials(AK, SK))
    assert [row["msg_id"] for row in rows] == [r[0].msg_id]


@pytest.mark.parametrize("credentials", [None, Credentials(AK, "wrong-secret-77"),
                                         Credentials("nobody-ak-55", SK)])
def test_acl_refusals_are_auth_errors_without_secrets(acl_cluster, credentials):
    started = time.monotonic()
    with GrpcProducer(acl_cluster.proxy_endpoint, tls_ca_file=acl_cluster.proxy_tls_cert,
                      credentials=credentials, send_timeout=3) as p:
        with pytest.raises(ProxyAuthError) as info:
            p.send([Message("GrpcAcl", b"refused")])
        assert "<hidden>" in repr(p) or credentials is None
        for text in (repr(p), str(p)):
            assert SK not in text and "wrong-secret-77" not in text
    assert time.monotonic() - started < 5
    error = info.value
    assert isinstance(error, AuthError) and not is_transient(error)
    text = f"{error} {error!r} {error.args}"
    for secret in (SK, "wrong-secret-77", "nobody-ak-55", AK):
        assert secret not in text


@needs_grpc_peer
def test_official_producer_signs_as_our_proxy_expects(acl_cluster):
    sent = grpc_peer("produce", "--endpoints", acl_cluster.proxy_endpoint, "--topic", "GrpcAcl",
                     "--tls", "--ca", acl_cluster.proxy_tls_cert, "--access-key", AK,
                     "--secret-key", SK, stdin=json.dumps([{"body": "official signed"}]))
    assert "message_id" in sent["results"][0], sent
    refused = grpc_peer("produce", "--endpoints", acl_cluster.proxy_endpoint, "--topic",
                        "GrpcAcl", "--tls", "--ca", acl_cluster.proxy_tls_cert,
                        "--access-key", AK, "--secret-key", "bad",
                        stdin=json.dumps([{"body": "official refused"}]))
    assert "error" in refused["results"][0]


def test_tls_verification(cluster):
    cluster.create_topic("GrpcTls", 1)
    # Without the CA the self-signed certificate is refused, clearly and quickly.
    started = time.monotonic()
    with GrpcProducer(cluster.proxy_endpoint, send_timeout=3) as p:
        with pytest.raises(ProxyError) as info:
            p.queues("GrpcTls")
    assert info.value.name == "UNAVAILABLE" and time.monotonic() - started < 5
    # tls_verify=False pins the certificate the proxy presents (its test certificate).
    with GrpcProducer(cluster.proxy_endpoint, tls_verify=False) as p:
        assert p.send([Message("GrpcTls", b"pinned")])[0].status == "SEND_OK"
    # Plaintext against the TLS endpoint fails clearly, not by hanging.
    started = time.monotonic()
    with GrpcProducer(cluster.proxy_endpoint, tls=False, send_timeout=3) as p:
        with pytest.raises((ProxyError, RequestTimeout)):
            p.queues("GrpcTls")
    assert time.monotonic() - started < 5


def test_plaintext_proxy():
    with EmbeddedCluster(grpc_proxy=True, grpc_proxy_tls=False) as c:
        c.create_topic("GrpcPlain", 1)
        with GrpcProducer(c.proxy_endpoint, tls=False) as p:
            r = p.send([Message("GrpcPlain", b"plain", keys="k")])
        assert [row["msg_id"] for row in read_topic(c, "GrpcPlain")] == [r[0].msg_id]


def test_bad_endpoints_fail_fast_and_clearly():
    with pytest.raises(ValueError, match="endpoints"):
        GrpcProducer("no-port-here")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with GrpcProducer(f"127.0.0.1:{port}", tls=False, send_timeout=5) as p:
        with pytest.raises(ProxyError) as info:
            p.send([Message("T", b"x")])
    assert time.monotonic() - started < 3
    assert info.value.name == "UNAVAILABLE" and is_transient(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_a_silent_endpoint_times_out_as_a_transient_error():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []
    stop = threading.Event()

    def accept():  # takes connections and never answers
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        started = time.monotonic()
        with GrpcProducer(f"127.0.0.1:{listener.getsockname()[1]}", tls=False,
                          send_timeout=1.0) as p:
            with pytest.raises(RocketMQErrorTypes) as info:
                p.queues("T")
        assert time.monotonic() - started < 4
        assert is_transient(info.value)
    finally:
        stop.set()
        t.join()
        for conn in accepted:
            conn.close()
        listener.close()


RocketMQErrorTypes = (RequestTimeout, ProxyError)


def test_unknown_topic_and_refused_messages(cluster, producer):
    with pytest.raises(RouteNotFound, match="NoSuchGrpcTopic"):
        producer.queues("NoSuchGrpcTopic")
    cluster.create_topic("GrpcRefused", 1)
    with pytest.raises(ValueError, match="flag"):
        producer.send([Message("GrpcRefused", b"x", flag=3)])
    with pytest.raises(ValueError, match="sharding_key.*delay_level"):
        producer.send([Message("GrpcRefused", b"x", sharding_key="g", delay_level=2)])
    with pytest.raises(ValueError, match="queue"):
        producer.send([Message("GrpcRefused", b"x")], queue=MessageQueue("Other", "broker-a", 0))
    with pytest.raises(ProxyError, match="ILLEGAL_MESSAGE_PROPERTY_KEY.*UNIQ_KEY") as info:
        producer.send([Message("GrpcRefused", b"x", properties={"UNIQ_KEY": "mine"})])
    assert not is_transient(info.value)


def test_delay_level_becomes_a_delivery_timestamp(cluster, producer):
    cluster.create_topic("GrpcDelay", 1)
    before = int(time.time() * 1000)
    producer.send([Message("GrpcDelay", b"later", delay_level=3)])  # level 3: 10 s
    props = props_of(read_topic(cluster, "GrpcDelay")[0]["properties"])
    assert before + 10_000 <= int(props["TIMER_DELIVER_MS"]) <= int(time.time() * 1000) + 10_000
    assert "DELAY" not in props
