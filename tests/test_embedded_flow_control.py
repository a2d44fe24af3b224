"""The embedded broker's flow control against a genuine 4.9.8 broker's (rocketmq_spark/embedded/
flow_control.py), over real sockets.

Apache sources (rocketmq 4.9.x): broker/.../latency/BrokerFastFailure.java (the 10 ms scan, the
``[TIMEOUT_CLEAN_QUEUE]`` remark, which queues it cleans), remoting/.../netty/RequestTask.java
(returnResponse: a fresh JSON response, no extFields, written even to a oneway request),
remoting/.../netty/NettyRemotingAbstract.java (processRequestCommand: ``[OVERLOAD]`` when an
executor rejects, none for oneway), broker/.../BrokerController.java (registerProcessor: which
request codes go to which executor), common/.../BrokerConfig.java (the defaults). The wire form
is checked against the capture in shared/captures/rocketmq-4.9.8-flow-control (a subset in
tests/data/capture-rocketmq-4.9.8-flow-control).

Limits are shrunk (a few ms of queue wait, small capacities) and requests pipelined over several
connections at once, so a backlog builds within a second.
"""
from __future__ import annotations

import re
import socket
import struct
import threading
import time
from typing import List, Tuple

import pytest

from rocketmq_spark.client.protocol.codes import (
    FLAG_ONEWAY, SERVER_VERSION, ResponseCode, SerializeType,
)
from rocketmq_spark.client.protocol.frame import (
    FrameDecoder, RemotingCommand, encode_frame,
)
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.embedded.options import ServerOptions

TIMEOUT_RE = re.compile(r"\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control for a while, "
                        r"period in queue: (\d+)ms, size of queue: (\d+)")
OVERLOAD = "[OVERLOAD]system busy, start flow control for a while"
TOPIC = "FloodT"


def send_frame(i: int, tag: str, serialize: int = SerializeType.ROCKETMQ, *,
               topic: str = TOPIC, oneway: bool = False) -> bytes:
    """SEND_MESSAGE_V2 as the capture's generator sent it (200-byte body, key ``tag + i``)."""
    ext = {"a": "CapFloodGroup", "b": topic, "c": "TBW102", "d": "4", "e": str(i % 4),
           "f": "0", "g": str(int(time.time() * 1000)), "h": "0",
           "i": f"KEYS\x01{tag}{i}\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}
    return encode_frame(RemotingCommand(310, ext, b"%-200d" % i, opaque=i + 1,
                                        flag=FLAG_ONEWAY if oneway else 0,
                                        serialize_type=serialize))


class Answers:
    """Every frame a broker wrote back on one connection, raw and decoded, in arrival order."""

    def __init__(self, addr: str):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.frames: List[Tuple[bytes, RemotingCommand]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = bytearray()
        decoder = FrameDecoder()
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            buf += data
            pos = 0
            while len(buf) - pos >= 4:
                n = struct.unpack_from(">I", buf, pos)[0]
                if len(buf) - pos - 4 < n:
                    break
                raw = bytes(buf[pos:pos + 4 + n])
                pos += 4 + n
                with self._lock:
                    self.frames.append((raw, decoder.feed(raw)[0]))
            del buf[:pos]

    def count(self) -> int:
        with self._lock:
            return len(self.frames)

    def wait(self, n: int, timeout: float = 30.0) -> List[Tuple[bytes, RemotingCommand]]:
        deadline = time.monotonic() + timeout
        while self.count() < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.count() == n, f"{self.count()} answers, expected {n}"
        return list(self.frames)

    def close(self) -> None:
        self.sock.close()


def flood(addr: str, per_connection: List[List[bytes]]) -> List[Answers]:
    """Open one connection per list, then write each list in one go, all at the same time."""
    conns = [Answers(addr) for _ in per_connection]
    writers = [threading.Thread(target=c.sock.sendall, args=(b"".join(frames),))
               for c, frames in zip(conns, per_connection)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    return conns


def stored(cluster: EmbeddedCluster, topic: str = TOPIC) -> int:
    b = cluster.brokers[0].name
    return sum(cluster.max_offset(topic, b, q) for q in range(4))


@pytest.fixture
def make_cluster():
    """Fresh one-broker clusters (with topic FloodT) with the limits a test gives; stopped
    after the test."""
    made: List[EmbeddedCluster] = []

    def make(**limits) -> EmbeddedCluster:
        c = EmbeddedCluster(**limits).start()
        made.append(c)
        c.create_topic(TOPIC, 4)
        return c
    yield make
    for c in made:
        c.stop()


# ------------------------------------------------------------------ the send queue

def test_pipelined_sends_get_timeout_clean_queue_answers_and_the_rest_are_stored(make_cluster):
    """BrokerFastFailure.cleanExpiredRequestInQueue: sends that waited the limit are answered
    SYSTEM_BUSY and dropped; the others are processed; each request gets one answer."""
    busy_cluster = make_cluster(wait_ms_in_send_queue=5)
    n = 1500
    conns = flood(busy_cluster.brokers[0].addr,
                  [[send_frame(i, f"L{k}_") for i in range(n)] for k in range(3)])
    busy = success = 0
    for conn in conns:
        answers = conn.wait(n)
        assert sorted(cmd.opaque for _, cmd in answers) == list(range(1, n + 1))
        for raw, cmd in answers:
            if cmd.code == ResponseCode.SUCCESS:
                success += 1
                assert cmd.serialize_type == SerializeType.ROCKETMQ  # as the request
                continue
            busy += 1
            assert cmd.code == ResponseCode.SYSTEM_BUSY
            period, size = map(int, TIMEOUT_RE.fullmatch(cmd.remark).groups())
            assert period >= 5 and 0 <= size < 3 * n
            # RequestTask.returnResponse: JSON even for a ROCKETMQ request, no extFields key,
            # no body, the broker's language and version
            assert raw[4] == SerializeType.JSON and cmd.ext_fields is None and not cmd.body
            assert (cmd.flag, cmd.language, cmd.version) == (1, "JAVA", SERVER_VERSION)
        conn.close()
    assert busy and success, (busy, success)
    assert stored(busy_cluster) == success  # nothing refused was stored
    stats = busy_cluster.flow_control_stats()
    assert stats["send_timeout"] == stats["busy"] == busy
    assert stats["send_overload"] == 0 and stats["send_queue_peak"] > 0


def test_without_fast_failure_every_send_waits_its_turn(make_cluster):
    """brokerFastFailureEnable=false: no scan, so a backlog only delays."""
    busy_cluster = make_cluster(wait_ms_in_send_queue=5, broker_fast_failure=False)
    n = 1000
    conns = flood(busy_cluster.brokers[0].addr,
                  [[send_frame(i, f"L{k}_") for i in range(n)] for k in range(3)])
    for conn in conns:
        assert {cmd.code for _, cmd in conn.wait(n)} == {ResponseCode.SUCCESS}
        conn.close()
    assert stored(busy_cluster) == 3 * n
    assert busy_cluster.flow_control_stats()["busy"] == 0


def test_sends_beyond_the_queue_capacity_get_overload_answers_at_once(make_cluster):
    """NettyRemotingAbstract.processRequestCommand: the send executor rejects a request when
    its queue holds sendThreadPoolQueueCapacity; the answer is SYSTEM_BUSY "[OVERLOAD]..." (a
    fresh JSON response, no extFields), written at once; nothing of it is stored."""
    cluster = make_cluster(send_queue_capacity=50)
    n = 800
    conns = flood(cluster.brokers[0].addr,
                  [[send_frame(i, f"L{k}_") for i in range(n)] for k in range(3)])
    overload = success = 0
    for conn in conns:
        answers = conn.wait(n)
        assert sorted(cmd.opaque for _, cmd in answers) == list(range(1, n + 1))
        for raw, cmd in answers:
            if cmd.code == ResponseCode.SUCCESS:
                success += 1
                continue
            overload += 1
            assert (cmd.code, cmd.remark) == (ResponseCode.SYSTEM_BUSY, OVERLOAD)
            assert raw[4] == SerializeType.JSON and cmd.ext_fields is None and not cmd.body
        conn.close()
    assert overload and success
    assert stored(cluster) == success
    stats = cluster.flow_control_stats()
    assert stats["send_overload"] == stats["busy"] == overload
    assert stats["send_queue_peak"] == 50


# ------------------------------------------------------------------ settings

def test_defaults_are_those_of_a_default_configured_4_9_8_broker():
    """BrokerConfig.java: sendThreadPoolQueueCapacity 10000, waitTimeMillsInSendQueue 200,
    pullThreadPoolQueueCapacity 100000, waitTimeMillsInPullQueue 5000,
    heartbeatThreadPoolQueueCapacity 50000, waitTimeMillsInHeartbeatQueue 31000,
    endTransactionPoolQueueCapacity 100000, waitTimeMillsInTransactionQueue 3000,
    brokerFastFailureEnable true."""
    o = ServerOptions()
    assert (o.send_queue_capacity, o.wait_ms_in_send_queue) == (10_000, 200)
    assert (o.pull_queue_capacity, o.wait_ms_in_pull_queue) == (100_000, 5_000)
    assert (o.heartbeat_queue_capacity, o.wait_ms_in_heartbeat_queue) == (50_000, 31_000)
    assert (o.transaction_queue_capacity, o.wait_ms_in_transaction_queue) == (100_000, 3_000)
    assert o.broker_fast_failure is True


@pytest.mark.parametrize("name, value", [
    ("send_queue_capacity", 0), ("pull_queue_capacity", -5), ("send_queue_capacity", 2.5),
    ("wait_ms_in_send_queue", -1), ("wait_ms_in_pull_queue", "200"),
    ("wait_ms_in_transaction_queue", True), ("broker_fast_failure", "no"),
])
def test_bad_limits_are_refused_naming_the_option(name, value):
    with pytest.raises(ValueError, match=name):
        EmbeddedCluster(**{name: value})
