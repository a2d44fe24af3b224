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

import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
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

from embedded_cli import embedded_cli, printed

TIMEOUT_RE = re.compile(r"\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control for a while, "
                        r"period in queue: (\d+)ms, size of queue: (\d+)")
OVERLOAD = "[OVERLOAD]system busy, start flow control for a while"
TOPIC = "FloodT"
PULL, GET_MAX_OFFSET, END_TRANSACTION = 11, 30, 37
CAPTURE = Path(os.environ.get(
    "ROCKETMQ_FLOW_CONTROL_CAPTURE_DIR",
    Path(__file__).resolve().parent / "data" / "capture-rocketmq-4.9.8-flow-control"))


def send_frame(i: int, tag: str, serialize: int = SerializeType.ROCKETMQ, *,
               topic: str = TOPIC, oneway: bool = False) -> bytes:
    """SEND_MESSAGE_V2 as the capture's generator sent it (200-byte body, key ``tag + i``)."""
    ext = {"a": "CapFloodGroup", "b": topic, "c": "TBW102", "d": "4", "e": str(i % 4),
           "f": "0", "g": str(int(time.time() * 1000)), "h": "0",
           "i": f"KEYS\x01{tag}{i}\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}
    return encode_frame(RemotingCommand(310, ext, b"%-200d" % i, opaque=i + 1,
                                        flag=FLAG_ONEWAY if oneway else 0,
                                        serialize_type=serialize))


def frame(code: int, fields, opaque: int, *, oneway: bool = False,
          serialize: int = SerializeType.ROCKETMQ) -> bytes:
    return encode_frame(RemotingCommand(code, fields, opaque=opaque,
                                        flag=FLAG_ONEWAY if oneway else 0,
                                        serialize_type=serialize))


def pull_frame(i: int, queue_id: int = 0) -> bytes:
    """A pull at offset 0 filtered by a tag, not suspended: answered at once, by the broker's
    Python path (the C path answers only unfiltered pulls, too fast to build a backlog from a
    few thousand requests)."""
    return frame(PULL, {"consumerGroup": "G", "topic": TOPIC, "queueId": str(queue_id),
                        "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "4",
                        "commitOffset": "0", "suspendTimeoutMillis": "0",
                        "subscription": "TagA", "subVersion": "0"}, i + 1)


def sync_frame(opaque: int) -> bytes:
    """A request answered after everything written before it on its connection was processed
    or refused (a connection's requests are processed in order)."""
    return frame(GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"}, opaque)


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

    def until(self, opaque: int, timeout: float = 30.0) -> List[RemotingCommand]:
        """Every answer up to and including the one to ``opaque``, which must come last."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                got = [cmd for _, cmd in self.frames]
            if got and got[-1].opaque == opaque:
                return got
            time.sleep(0.01)
        raise AssertionError(f"no answer to opaque {opaque} at the end of {len(got)} answers")

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


def answers_of(conns: List[Answers], n: int) -> List[RemotingCommand]:
    """The ``n`` answers of each connection (closed after), checked to be one per opaque."""
    out = []
    for conn in conns:
        got = [cmd for _, cmd in conn.wait(n)]
        assert len({cmd.opaque for cmd in got}) == n
        out += got
        conn.close()
    return out


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


def test_expired_oneway_sends_get_a_busy_answer_and_overflowing_ones_none(make_cluster):
    """A oneway request never gets a processing answer, but RequestTask.returnResponse (what
    BrokerFastFailure answers with) writes SYSTEM_BUSY whatever the request's flag, so an
    expired oneway send is answered, with its opaque; NettyRemotingAbstract answers
    [OVERLOAD] only to a request that is not oneway. Read from the Apache sources: the capture
    has no oneway request."""
    cluster = make_cluster(wait_ms_in_send_queue=5)
    n = 1500
    conns = flood(cluster.brokers[0].addr,
                  [[send_frame(i, f"L{k}_", oneway=True) for i in range(n)] + [sync_frame(n + 1)]
                   for k in range(3)])
    busy = 0
    for conn in conns:
        answers = conn.until(n + 1)
        assert answers[-1].code == ResponseCode.SUCCESS
        for cmd in answers[:-1]:
            assert cmd.code == ResponseCode.SYSTEM_BUSY and TIMEOUT_RE.fullmatch(cmd.remark)
            assert 1 <= cmd.opaque <= n
        busy += len(answers) - 1
        conn.close()
    assert busy and stored(cluster) == 3 * n - busy
    assert cluster.flow_control_stats()["send_timeout"] == busy

    cluster = make_cluster(send_queue_capacity=20)
    conns = flood(cluster.brokers[0].addr,
                  [[send_frame(i, f"L{k}_", oneway=True) for i in range(n)] + [sync_frame(n + 1)]
                   for k in range(3)])
    for conn in conns:
        assert [cmd.opaque for cmd in conn.until(n + 1)] == [n + 1]
        conn.close()
    dropped = cluster.flow_control_stats()["send_overload"]
    assert dropped and stored(cluster) == 3 * n - dropped
    assert cluster.flow_control_stats()["busy"] == 0  # counted, never answered


def test_end_transaction_queue_expires_with_its_own_limit(make_cluster):
    """BrokerFastFailure cleans the END_TRANSACTION queue too (waitTimeMillsInTransactionQueue),
    and not with the send queue's limit. The sink's END_TRANSACTION is oneway: an expired one
    is answered SYSTEM_BUSY and not applied."""
    ends = [[frame(END_TRANSACTION, {"producerGroup": "G", "tranStateTableOffset": "0",
                                     "commitLogOffset": str(10 ** 9 + i),
                                     "commitOrRollback": "8", "fromTransactionCheck": "false",
                                     "msgId": "7F000001000000000000000000000000"},
                   i + 1, oneway=True) for i in range(2000)] + [sync_frame(2001)]
            for _ in range(3)]
    cluster = make_cluster(wait_ms_in_send_queue=1)  # not the END_TRANSACTION queue's limit
    for conn in flood(cluster.brokers[0].addr, ends):
        assert [cmd.opaque for cmd in conn.until(2001)] == [2001]
        conn.close()
    assert cluster.flow_control_stats()["busy"] == 0
    cluster = make_cluster(wait_ms_in_transaction_queue=2)
    busy = 0
    for conn in flood(cluster.brokers[0].addr, ends):
        got = conn.until(2001)
        assert all(TIMEOUT_RE.fullmatch(cmd.remark or "") for cmd in got[:-1])
        busy += len(got) - 1
        conn.close()
    stats = cluster.flow_control_stats()
    assert busy and stats["transaction_timeout"] == busy and stats["send_timeout"] == 0


# ------------------------------------------------------------------ the pull queue

def test_pipelined_pulls_get_busy_answers_with_the_pull_limits(make_cluster):
    """PULL_MESSAGE goes to its own executor (BrokerController.registerProcessor) whose queue
    BrokerFastFailure cleans with waitTimeMillsInPullQueue and which holds
    pullThreadPoolQueueCapacity; the send queue's limits do not apply to it."""
    cluster = make_cluster(wait_ms_in_send_queue=1)
    b = cluster.brokers[0].name
    cluster.append(TOPIC, b, 0, [b"m"] * 3)
    n = 1500
    pulls = [[pull_frame(i) for i in range(n)] for _ in range(3)]
    got = answers_of(flood(cluster.brokers[0].addr, pulls), n)
    assert ResponseCode.SYSTEM_BUSY not in {cmd.code for cmd in got}

    cluster = make_cluster(wait_ms_in_pull_queue=2)
    cluster.append(TOPIC, b, 0, [b"m"] * 3)
    got = answers_of(flood(cluster.brokers[0].addr, pulls), n)
    busy = [cmd for cmd in got if cmd.code == ResponseCode.SYSTEM_BUSY]
    assert busy and len(busy) < len(got)
    for cmd in busy:
        period, _ = map(int, TIMEOUT_RE.fullmatch(cmd.remark).groups())
        assert period >= 2 and cmd.ext_fields is None and not cmd.body
    stats = cluster.flow_control_stats()
    assert stats["pull_timeout"] == stats["busy"] == len(busy) and stats["send_timeout"] == 0

    cluster = make_cluster(pull_queue_capacity=30)
    cluster.append(TOPIC, b, 0, [b"m"] * 3)
    got = answers_of(flood(cluster.brokers[0].addr, pulls), n)
    overload = [cmd for cmd in got if cmd.code == ResponseCode.SYSTEM_BUSY]
    assert overload and {cmd.remark for cmd in overload} == {OVERLOAD}
    assert cluster.flow_control_stats()["pull_overload"] == len(overload)


# ------------------------------------------------------------------ the genuine capture

def _capture_frames() -> List[dict]:
    path = CAPTURE / "frames.jsonl"
    if not path.is_file():
        pytest.fail(f"the flow-control capture is missing at {path}")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _wire(record: dict) -> bytes:
    header = (record["header_text"].encode("utf-8") if "header_text" in record
              else bytes.fromhex(record["header_hex"]))
    word = (1 if record["serialize"] == "ROCKETMQ" else 0) << 24 | len(header)
    body = bytes.fromhex(record["body_hex"])
    return struct.pack(">II", 4 + len(header) + len(body), word) + header + body


def _shape(header: bytes) -> bytes:
    """A JSON busy header with its numbers (opaque, period, size) blanked."""
    return re.sub(rb'"opaque":\d+', b'"opaque":N',
                  re.sub(rb"\d+ms, size of queue: \d+", b"Nms, size of queue: N", header))


def test_replayed_capture_requests_get_the_genuine_answer_kinds_and_wire_form(make_cluster):
    """The capture's observed requests (JSON on one connection, ROCKETMQ on the other), sent
    again while three load connections flood the broker, as in the capture: each gets one
    answer, SUCCESS or SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] and nothing else; busy answers are
    JSON with the genuine header layout byte for byte (up to the numbers) on both; SUCCESS
    answers keep the request's serialization and the genuine ext fields."""
    records = _capture_frames()
    requests = {conn: [r for r in records if r["conn"] == conn and r["rpc"] == "request"]
                for conn in (0, 1)}
    genuine = {(r["conn"], r["code_name"]): r for r in records if r["rpc"] == "response"}
    cluster = make_cluster(wait_ms_in_send_queue=5)
    addr = cluster.brokers[0].addr
    observed = [Answers(addr) for _ in (0, 1)]

    def write(first: int, last: int) -> None:
        for conn, sock in zip((0, 1), observed):
            sock.sock.sendall(b"".join(_wire(r) for r in requests[conn][first:last]))

    write(0, 5)  # an idle broker: answered at once
    for sock in observed:
        sock.wait(5)
    loaders = [Answers(addr) for _ in range(3)]
    writers = [threading.Thread(target=sock.sock.sendall,
                                args=(b"".join(send_frame(i, f"L{k}_") for i in range(2000)),))
               for k, sock in enumerate(loaders)]
    for w in writers:
        w.start()
    for batch in range(5, 45, 5):  # read among the load, behind what waits
        write(batch, batch + 5)
    for w in writers:
        w.join()
    answers_of(loaders, 2000)
    write(45, 50)  # idle again
    kinds = set()
    for conn, sock in zip((0, 1), observed):
        got = sock.wait(50)
        assert sorted(cmd.opaque for _, cmd in got) == list(range(1, 51))
        for raw, cmd in got:
            if cmd.code == ResponseCode.SYSTEM_BUSY:
                kinds.add("busy")
                want = _wire(genuine[(conn, "SYSTEM_BUSY")])
                assert raw[4] == SerializeType.JSON
                assert _shape(raw[8:]) == _shape(want[8:]), (raw, want)
                continue
            assert cmd.code == ResponseCode.SUCCESS, (cmd.code, cmd.remark)
            kinds.add("success")
            want = genuine[(conn, "SUCCESS")]
            assert raw[4] == (1 if want["serialize"] == "ROCKETMQ" else 0)
            if want["serialize"] == "JSON":
                assert list(cmd.ext_fields) == list(want["header"]["extFields"])
            else:  # the send handler's ROCKETMQ field order is not this test's subject
                assert set(cmd.ext_fields) == set(want["header"]["extFields"])
        sock.close()
    assert kinds == {"busy", "success"}


# ------------------------------------------------------------------ the 5.x proxy

def test_a_busy_broker_reaches_a_grpc_client_as_apache_proxy_answers(make_cluster):
    """Apache's 5.x proxy is a remoting client of its broker: its SendMessage waits in the
    broker's send queue like any send. A SYSTEM_BUSY answer becomes MQBrokerException
    (MQClientAPIImpl.processSendResponse), which the proxy's ResponseBuilder.buildStatus turns
    into status TOO_MANY_REQUESTS with the broker's remark as message
    (buildCode: SYSTEM_BUSY -> TOO_MANY_REQUESTS; mqBrokerException.getErrorMessage())."""
    import grpc

    from rocketmq_spark.client.grpc import definition_pb2 as definition
    from rocketmq_spark.client.grpc import service_pb2 as service
    from rocketmq_spark.client.grpc import service_pb2_grpc

    cluster = make_cluster(grpc_proxy=True, grpc_proxy_tls=False, wait_ms_in_send_queue=2)
    addr = cluster.brokers[0].addr
    stop = threading.Event()
    loaders = [Answers(addr) for _ in range(3)]

    def load(sock: Answers, k: int) -> None:  # keeps the broker behind until stopped
        i = 0
        while not stop.is_set():
            sock.sock.sendall(b"".join(send_frame(i + j, f"L{k}_") for j in range(300)))
            i += 300

    writers = [threading.Thread(target=load, args=(sock, k), daemon=True)
               for k, sock in enumerate(loaders)]
    for w in writers:
        w.start()
    statuses = []
    try:
        with grpc.insecure_channel(cluster.proxy_endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            for i in range(200):
                message = definition.Message(
                    topic=definition.Resource(name=TOPIC), body=b"grpc-%d" % i,
                    system_properties=definition.SystemProperties(message_id=f"G{i}"))
                answer = stub.SendMessage(service.SendMessageRequest(messages=[message]),
                                          metadata=(("x-mq-client-id", "busy-test"),),
                                          timeout=30)
                statuses.append(answer.status)
                if answer.status.code == definition.TOO_MANY_REQUESTS:
                    assert not answer.entries
                    break
    finally:
        stop.set()
        for w in writers:
            w.join(30)
        for sock in loaders:
            sock.close()
    busy = statuses[-1]
    assert busy.code == definition.TOO_MANY_REQUESTS, statuses[-3:]
    period, _ = map(int, TIMEOUT_RE.fullmatch(busy.message).groups())
    assert period >= 2
    assert {s.code for s in statuses[:-1]} <= {definition.OK}


# ------------------------------------------------------------------ the command line

def test_command_line_flags_set_the_limits():
    """``python -m rocketmq_spark.embedded`` with the flow-control flags: a busy answer for
    sends, [OVERLOAD] for pulls; a bad value exits naming the option."""
    bad = subprocess.run([sys.executable, "-m", "rocketmq_spark.embedded",
                          "--wait-ms-in-pull-queue", "-3"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "wait_ms_in_pull_queue" in bad.stderr
    assert "Traceback" not in bad.stderr
    with embedded_cli("--topic", f"{TOPIC}:4", "--wait-ms-in-send-queue", "2",
                      "--send-queue-capacity", "100000", "--pull-queue-capacity", "7",
                      "--wait-ms-in-pull-queue", "60000") as (_, lines):
        [(_, _, addr)] = printed(lines, "broker")
        got = answers_of(flood(addr, [[send_frame(i, f"L{k}_") for i in range(1500)]
                                      for k in range(3)]), 1500)
        periods = [int(TIMEOUT_RE.fullmatch(cmd.remark).group(1)) for cmd in got
                   if cmd.code == ResponseCode.SYSTEM_BUSY]
        assert periods and min(periods) >= 2
        assert min(periods) < 200  # not the default limit
        got = answers_of(flood(addr, [[pull_frame(i) for i in range(300)] for _ in range(3)]),
                         300)
        assert OVERLOAD in {cmd.remark for cmd in got}


# ------------------------------------------------------------------ the C frame count

def test_the_c_frame_count_agrees_with_the_python_one():
    """native/embedded/rmq_serve.c more_frames_than against its Python reference, on whole,
    cut and damaged frame streams (how a read is found unable to overflow a queue)."""
    import random

    from rocketmq_spark.embedded import accelerator, flow_control
    native = accelerator.native_function("more_frames_than")
    if native is None:
        pytest.skip("the embedded broker's C module is not built or is switched off")
    rng = random.Random(7)
    stream = b"".join(send_frame(i, "c") for i in range(30)) + b"".join(
        pull_frame(i) for i in range(30))
    for _ in range(400):
        data = bytearray(stream[rng.randrange(0, 300):rng.randrange(len(stream) // 2,
                                                                    len(stream) + 1)])
        for _ in range(rng.randrange(3)):  # damage a byte, maybe a length word
            data[rng.randrange(len(data))] = rng.randrange(256)
        for limit in (0, 1, 7, 29, 59, 60, 1000):
            assert native(bytes(data), limit) == flow_control._more_frames_than_py(data, limit)
    assert native(b"\xff\xff\xff\xff" + b"x" * 10, 0) is False  # a length past the end


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
