"""Apache's C++ PushConsumer (PyPI ``rocketmq`` 0.4.4, through ``tests/cpp_peer.py``) failing
messages against the embedded broker: CONSUMER_SEND_MSG_BACK as the genuine client sends it
(see test_embedded_send_back.py for the capture it is checked against), redelivery through the
retry topic and, after the group's retryMaxTimes, the dead-letter topic.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark.embedded import EmbeddedCluster
from raw_client import RawClient
from test_embedded_send_back import (
    DLQ_PREFIX, FAST_DELAYS, RETRY_PREFIX, _pull_all, quick_cluster_msg_id,
)
from waiting import wait_until

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                       reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)"),
]


@pytest.fixture(scope="module")
def quick_cluster():
    """Millisecond delay levels; groups auto-created with retryMaxTimes 2."""
    with EmbeddedCluster(brokers=1, message_delay_level=FAST_DELAYS, retry_max_times=2) as c:
        yield c


PEER = Path(__file__).resolve().parent / "cpp_peer.py"
PEER_PROPS = "RETRY_TOPIC,ORIGIN_MESSAGE_ID,REAL_TOPIC,REAL_QID,DELAY,UNIQ_KEY"


def _peer(*args, timeout=60) -> dict:
    proc = subprocess.run([sys.executable, str(PEER), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cpp_push_consumer_gets_a_failed_message_again(quick_cluster, unique_name):
    """The C++ PushConsumer fails a message once: it sends it back and gets it again from the
    retry topic, with reconsume times 1, its own topic (the client restores RETRY_TOPIC), the
    same UNIQ_KEY and the properties the broker added."""
    topic, group = unique_name("SbCpp"), unique_name("SbCppGroup")
    quick_cluster.create_topic(topic, 1)
    ns = quick_cluster.namesrv_addr
    sent = _peer("produce", "--namesrv", ns, "--topic", topic, "--count", "1",
                 "--body-prefix", "fail me ")["results"]
    assert [r.get("status") for r in sent] == ["OK"]
    keys = _peer("pull", "--namesrv", ns, "--topic", topic)["messages"][0]["keys"]
    got = _peer("push", "--namesrv", ns, "--topic", topic, "--group", group, "--expect", "1",
                "--fail-keys", keys, "--props", PEER_PROPS, "--timeout", "30")
    assert [(m["keys"], m["reconsume_times"]) for m in got["failed"]] == [(keys, 0)]
    again = got["messages"]
    assert [(m["keys"], m["topic"], m["reconsume_times"]) for m in again] == [(keys, topic, 1)]
    props = again[0]["properties"]
    first = got["failed"][0]
    assert props["RETRY_TOPIC"] == topic and props["UNIQ_KEY"] == sent[0]["msg_id"]
    assert props["ORIGIN_MESSAGE_ID"] == quick_cluster_msg_id(
        quick_cluster.broker("broker-a").addr, first["commit_log_offset"])
    assert (props["REAL_TOPIC"], props["REAL_QID"], props["DELAY"]) == (
        RETRY_PREFIX + group, "0", "3")


def test_cpp_push_consumer_failing_for_good_fills_the_dlq(quick_cluster, unique_name,
                                                          tmp_path):
    """A message the C++ PushConsumer always fails is delivered 1 + retryMaxTimes (2) times,
    then the broker stores it in %DLQ%<group> with reconsume times 3."""
    topic, group = unique_name("SbCpp"), unique_name("SbCppGroup")
    quick_cluster.create_topic(topic, 1)
    ns = quick_cluster.namesrv_addr
    _peer("produce", "--namesrv", ns, "--topic", topic, "--count", "1")
    keys = _peer("pull", "--namesrv", ns, "--topic", topic)["messages"][0]["keys"]
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "push", "--namesrv", ns, "--topic", topic, "--group", group,
         "--fail-keys", keys, "--fail-times", "99", "--stop-file", str(stop), "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with RawClient(quick_cluster.broker("broker-a").addr) as client:
            dead = wait_until(lambda: _pull_all(client, DLQ_PREFIX + group), 45,
                              "the message in the DLQ")
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    failed = json.loads(out.strip().splitlines()[-1])["failed"]
    assert [(m["keys"], m["reconsume_times"]) for m in failed] == [
        (keys, 0), (keys, 1), (keys, 2)]
    assert [(m.keys, m.reconsume_times, m.properties["DELAY"], m.properties["RETRY_TOPIC"])
            for m in dead] == [(keys, 3, "0", topic)]
