"""Apache's C++ client (PyPI ``rocketmq`` 0.4.4, ``tests/cpp_peer.py``) against an embedded master
and slave: it produces to the master, and when the master is stopped its pull consumer reads
every message from the slave (the route then lists only brokerId 1), while its producer finds no
route to send on, as against genuine 4.9.8 (the capture in tests/data/capture-rocketmq-4.9.8-slave
shows that route and the slave's pull).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark.embedded import EmbeddedCluster

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                       reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)"),
]

PEER = Path(__file__).resolve().parent / "cpp_peer.py"


def run_peer(*args, timeout=90):
    proc = subprocess.run([sys.executable, str(PEER), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cpp_pull_reads_the_slave_while_the_master_is_stopped():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("SlaveCppT", 4)
        sent = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "SlaveCppT",
                        "--group", "CppSlaveProducer", "--count", "20",
                        "--body-prefix", "v")["results"]
        assert [r.get("status") for r in sent] == ["OK"] * 20, sent
        c.wait_replicated()
        master, slave = c.brokers_of("broker-a")
        master.stop()
        got = run_peer("pull", "--namesrv", c.namesrv_addr, "--topic", "SlaveCppT",
                       "--group", "CppSlaveGroup")
        assert sorted(m["body"] for m in got["messages"]) == sorted(f"v{i}" for i in range(20))
        assert sorted(m["id"] for m in got["messages"]) == sorted(r["msg_id"] for r in sent)
        # every queue was read to its end from the slave, and only the slave was there
        ends = {q: s for _, q, _, s, _ in got["pulls"] if s == "NO_NEW_MSG"}
        assert sorted(ends) == [0, 1, 2, 3]
        assert c.node_max_offset("SlaveCppT", "broker-a", 0, 1) == \
            c.node_max_offset("SlaveCppT", "broker-a", 0, 0)
        assert slave.running and not master.running
        # its producer finds no master in the route (only brokerId 1, as the capture's route
        # after the kill) and sends nowhere
        refused = run_peer("produce", "--namesrv", c.namesrv_addr, "--topic", "SlaveCppT",
                           "--count", "1", "--send-timeout", "1000")["results"]
        assert "No route info of this topic" in refused[0]["error"]
        assert c.node_max_offset("SlaveCppT", "broker-a", 0, 1) == \
            c.node_max_offset("SlaveCppT", "broker-a", 0, 0)
