"""The pull pipeline at a genuine broker's caps: the native loop, its Python twin, and the
embedded broker's C answer to plain pulls, each held against the pure-Python reference.

A default broker serves at most 32 messages (256 KiB) a pull from memory and 8 (64 KiB) from
disk, whatever ``maxMsgNums`` asks. The reader learns that cap from the answers, keeps
``pipeline_depth`` requests in flight and asks at once for exactly the gap an answer leaves.
"""
from __future__ import annotations

import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rocketmq_spark.client import QueueRangeReader, ReadSettings, _native
from rocketmq_spark.client.accelerator import FORCE_PURE_PYTHON
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.read.native_pull import pull_template
from rocketmq_spark.client.protocol.codes import RequestCode, SerializeType
from rocketmq_spark.client.protocol.frame import RemotingCommand, decode_frame, encode_frame
from rocketmq_spark.client.pull import PullRequest
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.embedded import _native as embedded_native
from rocketmq_spark.embedded.pull import handle_pull

from test_connection import HTTP_400, AnsweringPeer  # noqa: E402  (tests/ is on sys.path)

# Tests that hold a C path against its Python twin: ROCKETMQ_SPARK_PURE_PYTHON switches the C off.
compares_c_with_python = pytest.mark.skipif(
    FORCE_PURE_PYTHON, reason="ROCKETMQ_SPARK_PURE_PYTHON is set: no C path to compare")

GROUP = "pipeline-group"


def bodies(n: int, seed: int = 0) -> list:
    """Messages of varied sizes (so a byte cap cuts pulls at varying counts)."""
    return [(b"%d:" % i) + b"x" * ((i * 7919 + seed) % 700) for i in range(n)]


def read(admin, mq, start, end, **kw):
    reader = QueueRangeReader(admin.brokers, admin.address, mq, start, end,
                              ReadSettings(consumer_group=GROUP, **kw))
    rows = [(r["queue_offset"], r["body"]) for b in reader for r in
            b.select(["queue_offset", "body"]).to_pylist()]
    return rows, reader


@pytest.fixture(scope="module")
def capped():
    """Broker caps of 7 messages / 2,000 bytes: every pull is cut, by count or by size."""
    from rocketmq_spark.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(brokers=1, max_transfer_count=7, max_transfer_bytes=2000)
    cluster.start()
    cluster.create_topic("Capped", queues=1)
    cluster.append("Capped", "broker-a", 0, bodies(600))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def capped_admin(capped):
    with Admin(capped.namesrv_addr) as admin:
        yield admin


@compares_c_with_python
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 599), length=st.integers(1, 600),
       nums=st.sampled_from([1, 5, 7, 32, 1024]),
       depth=st.sampled_from([1, 2, 16]), batch=st.sampled_from([3, 50, 32768]))
def test_native_and_python_readers_return_exactly_the_range(capped, capped_admin, start, length,
                                                            nums, depth, batch):
    assert_loops_agree(capped_admin, start, length, nums, depth, batch)


def assert_loops_agree(admin, start: int, length: int, nums: int, depth: int, batch: int):
    """The native and the pure-Python loop both read exactly [start, start+length) of the
    600 bodies in queue 0 of "Capped"."""
    end = min(600, start + length)
    mq = admin.queues("Capped")[0]
    expected = [(i, b) for i, b in enumerate(bodies(600))][start:end]
    kw = dict(max_msg_nums=nums, pipeline_depth=depth, batch_max_messages=batch)
    native, nr = read(admin, mq, start, end, **kw)
    python, pr = read(admin, mq, start, end, native=False, **kw)
    assert nr.path == "native" and pr.path == "python"
    assert native == expected and python == expected


def test_the_reader_learns_the_brokers_cap(embedded_cluster_factory):
    """pullBatchSize 1024 against a default broker: about one pull per 32 messages, not a
    request for 1,024 that returns 32 and leaves the pipeline misaligned."""
    cluster = embedded_cluster_factory(brokers=1)  # 32 messages / 256 KiB, the defaults
    cluster.create_topic("Learn", queues=1)
    cluster.append("Learn", "broker-a", 0, [b"m"] * 3200)
    with Admin(cluster.namesrv_addr) as admin:
        mq = admin.queues("Learn")[0]
        for native in (True, False):
            rows, reader = read(admin, mq, 0, 3200, max_msg_nums=1024, native=native)
            assert [o for o, _ in rows] == list(range(3200))
            assert 100 <= reader.pulls <= 110, (native, reader.pulls)


def test_answers_out_of_order_are_kept_until_their_turn(capped, capped_admin):
    """The broker holds the first pull back, so later answers overtake it."""
    mq = capped_admin.queues("Capped")[0]
    for native in (True, False):
        capped.delay_next(1, 0.3, request_codes=[RequestCode.PULL_MESSAGE])
        rows, reader = read(capped_admin, mq, 0, 300, native=native, pull_timeout=5)
        assert [o for o, _ in rows] == list(range(300)) and reader.retries == 0


@compares_c_with_python
def test_other_frames_on_the_socket_are_dispatched_during_the_loop(capped, capped_admin):
    """An answer to another request that arrives while the native loop reads the socket goes
    to that request's future. (The broker holds that answer 0.1 s and the first pull 0.4 s,
    so it arrives while the loop waits.)"""
    assert_other_answers_reach_their_futures(capped, capped_admin)


def assert_other_answers_reach_their_futures(cluster, admin) -> None:
    """A GET_MAX_OFFSET answered (0.1 s late) while the native loop reads queue 0 of "Capped"
    (600 bodies; its first pull held 0.4 s) completes its own future."""
    mq = admin.queues("Capped")[0]
    conn = admin.brokers.remoting.connection(admin.address(mq, 0, False))
    cluster.delay_next(1, 0.1, request_codes=[RequestCode.GET_MAX_OFFSET])
    cluster.delay_next(1, 0.4, request_codes=[RequestCode.PULL_MESSAGE])
    future = conn.send_request(RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields={
        "topic": "Capped", "queueId": "0"}))
    rows, reader = read(admin, mq, 0, 600)
    assert reader.path == "native" and len(rows) == 600
    assert future.done and future.result().fields["offset"] == "600"


def test_answers_read_by_another_caller_reach_the_loop(capped, capped_admin):
    """While the reader's generator is suspended with pulls in flight, another request on the
    same connection reads the socket: the pulls' answers are kept for the loop, not dropped
    (which would stall the reader until its pull timeout). The broker answers the first pull
    at once and the other 15 of the first burst after 0.3 s, while the other request waits
    for its own answer (held 0.8 s); a batch of one message returns after the first answer."""
    mq = capped_admin.queues("Capped")[0]
    reader = QueueRangeReader(capped_admin.brokers, capped_admin.address, mq, 0, 600,
                              ReadSettings(consumer_group=GROUP, batch_max_messages=1,
                                           pull_timeout=3, retry_deadline=0))
    capped.delay_next(1, 0.001, request_codes=[RequestCode.PULL_MESSAGE])
    capped.delay_next(15, 0.3, request_codes=[RequestCode.PULL_MESSAGE])
    capped.delay_next(1, 0.8, request_codes=[RequestCode.GET_MAX_OFFSET])
    try:
        batches = iter(reader)
        first = next(batches)
        assert capped_admin.brokers.get_max_offset(capped_admin.address(mq, 0, False), mq) == 600
    finally:
        capped.clear_faults()
    started = time.monotonic()
    rest = [r for b in batches for r in b.column("queue_offset").to_pylist()]
    assert first.column("queue_offset").to_pylist() + rest == list(range(600))
    assert time.monotonic() - started < 2 and reader.retries == 0


@compares_c_with_python
def test_a_peer_that_is_not_a_broker_is_named_by_the_native_loop():
    peer = AnsweringPeer(HTTP_400)
    try:
        from rocketmq_spark.client import BrokerClient, MessageQueue

        with RemotingClient() as remoting:
            reader = QueueRangeReader(BrokerClient(remoting), lambda *a: peer.address,
                                      MessageQueue("T", "broker-a", 0), 0, 10,
                                      ReadSettings(consumer_group=GROUP, pull_timeout=3))
            with pytest.raises(ProtocolError, match="answered in HTTP"):
                list(reader)
            assert reader.path == "native"
    finally:
        peer.close()


# ------------------------------------------------------------------ the broker's C answers

def _pull_frame(fields: dict, serialize: int, opaque: int = 9) -> bytes:
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=fields, opaque=opaque)
    return encode_frame(cmd, serialize)


class _Conn:
    peer = "127.0.0.1:1"
    closed = False


field_values = {
    "queueId": st.sampled_from(["0", "1", "-1", "00", "x", None]),
    "queueOffset": st.sampled_from(["0", "5", "599", "600", "601", "-3", "1e3", None])
    | st.integers(0, 650).map(str),
    "maxMsgNums": st.sampled_from(["1", "7", "32", "0", "-5", "99999", None]),
    "sysFlag": st.sampled_from(["4", "6", "5", "0", "2", None]),
    "commitOffset": st.sampled_from(["0", "12", None]),
    "suspendTimeoutMillis": st.sampled_from(["0", "15000", None]),
    "subscription": st.sampled_from(["*", "", "a", " * ", None]),
    "subVersion": st.sampled_from(["0", "1700000000000", None]),
    "expressionType": st.sampled_from(["TAG", "tag", "SQL92", "", None]),
    "topic": st.sampled_from(["Capped", "Nope", None]),
    "consumerGroup": st.sampled_from(["g", None]),
}


PLAIN = {"consumerGroup": "g", "topic": "Capped", "queueId": "0", "queueOffset": "0",
         "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
         "subscription": "*", "subVersion": "0", "expressionType": "TAG"}


def _both(cluster, frame: bytes):
    """(the C answer or None, the Python answer) to one pull, on the broker's loop."""
    broker = cluster.broker("broker-a")._broker

    def run():
        answers, used = broker.fast_paths.pulls(frame)
        if not answers:
            return None, None
        return answers[0], encode_frame(handle_pull(broker.context, _Conn(),
                                                    decode_frame(frame)))
    return cluster._call(run)


@compares_c_with_python
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.fixed_dictionaries({}, optional=field_values),
       keep=st.lists(st.sampled_from(sorted(field_values)), max_size=len(field_values)),
       serialize=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]),
       numbers=st.booleans())
def test_the_brokers_c_answer_is_the_python_answer(capped, changes, keep, serialize, numbers):
    """Byte for byte: whenever the C path answers a pull, embedded/pull.py answers the same.
    Requests are a plain pull with some fields changed or left out."""
    fields = dict(PLAIN)
    for key, value in changes.items():
        if key in keep:  # only some of the drawn changes apply, so most requests stay close
            if value is None:
                fields.pop(key, None)
            else:
                fields[key] = value
    frame = _pull_frame(fields, serialize)
    if numbers and serialize == SerializeType.JSON:  # the C++ client sends some as numbers
        text = frame[8:].decode()
        for key in ("queueId", "maxMsgNums", "sysFlag"):
            value = fields.get(key)
            if value is not None and value.isdigit() and value == str(int(value)):
                text = text.replace(f'"{key}":"{value}"', f'"{key}":{value}')
        header = text.encode()
        frame = struct.pack(">II", 4 + len(header), len(header)) + header
    native, python = _both(capped, frame)
    if native is not None:
        assert native == python


@compares_c_with_python
def test_the_brokers_c_answer_at_every_offset_and_count(capped):
    """Every offset of the queue (and past its end), counts that the message cap, the byte cap
    or the queue's end cut: the C path answers each FOUND pull as Python does."""
    answered = 0
    for offset in range(0, 604, 3):
        for nums in (1, 2, 5, 7, 9, 40):
            for serialize in (SerializeType.ROCKETMQ, SerializeType.JSON):
                fields = dict(PLAIN, queueOffset=str(offset), maxMsgNums=str(nums))
                native, python = _both(capped, _pull_frame(fields, serialize, opaque=offset))
                if native is not None:
                    answered += 1
                    assert native == python, (offset, nums, serialize)
    assert answered == 200 * 6 * 2  # every offset in [0, 600) answered in C; none beyond


@compares_c_with_python
def test_the_readers_pulls_take_the_c_answer(capped):
    """What the native loop sends is what the C path answers (so benchmarks measure it)."""
    broker = capped.broker("broker-a")._broker
    template = pull_template(PullRequest(GROUP, "Capped", 0, 0, broker_name="broker-a"))
    fields = decode_frame(template).ext_fields
    for serialize in (SerializeType.ROCKETMQ, SerializeType.JSON):
        frame = _pull_frame(dict(fields, maxMsgNums="32", queueOffset="10"), serialize)
        answers, used = capped._call(lambda: broker.fast_paths.pulls(frame + frame))
        assert used == 2 * len(frame) and len(answers) == 2
        answer = decode_frame(answers[0])
        assert answer.serialize_type == serialize and answer.remark == "FOUND"
        assert 10 < int(answer.fields["nextBeginOffset"]) <= 17  # capped: 7 messages, 2000 B
        python = capped._call(lambda: handle_pull(broker.context, _Conn(),
                                                  decode_frame(frame)))
        assert answers[0] == encode_frame(python)


def test_native_accelerators_have_the_pull_loop_and_the_pull_server():
    assert hasattr(_native, "Puller") and hasattr(embedded_native, "serve_pulls")


# ------------------------------------------------------------------ genuine answers

class CapturedBroker:
    """Answers each pull with the genuine 4.9.8 broker's captured answer to the same pull
    (queue, offset, subscription), only the opaque changed; PULL_NOT_FOUND otherwise."""

    def __init__(self, capture):
        import re
        import socket as _socket

        self.answers = {}
        for resp in capture.responses_to(RequestCode.PULL_MESSAGE):
            f = capture.request_of(resp)["header"]["extFields"]
            key = (int(f["queueId"]), int(f["queueOffset"]), f.get("subscription") or "*")
            self.answers.setdefault(key, resp)
        self._opaque = re.compile(rb'"opaque":-?\d+')
        self.server = _socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        from rocketmq_spark.client.protocol.frame import FrameDecoder

        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(sock, FrameDecoder()),
                             daemon=True).start()

    def _connection(self, sock, decoder):
        with sock:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                out = []
                for cmd in decoder.feed(data):
                    f = cmd.fields
                    key = (int(f["queueId"]), int(f["queueOffset"]), f.get("subscription") or "*")
                    record = self.answers.get(key)
                    if record is None:
                        out.append(encode_frame(cmd.make_response(19, {
                            "nextBeginOffset": f["queueOffset"], "minOffset": "0",
                            "maxOffset": f["queueOffset"], "suggestWhichBrokerId": "0"},
                            "OFFSET_OVERFLOW_ONE"), SerializeType.JSON))
                        continue
                    header = self._opaque.sub(b'"opaque":%d' % cmd.opaque,
                                              record["header_text"].encode())
                    body = bytes.fromhex(record["body_hex"])
                    out.append(struct.pack(">II", 4 + len(header) + len(body), len(header))
                               + header + body)
                sock.sendall(b"".join(out))

    def close(self):
        self.server.close()


@compares_c_with_python
@pytest.mark.parametrize("subscription", ["*", "TagA"])
def test_both_loops_read_the_genuine_brokers_answers_alike(capture, subscription):
    """The capture's pull answers (JSON headers, fastjson's field order, a NO_MATCHED_MESSAGE
    for the TagA pass) served to the native loop and to the Python loop: the same rows, and
    exactly the records the genuine broker stored."""
    from rocketmq_spark.client import BrokerClient, MessageQueue
    from rocketmq_spark.client.protocol.message import decode_messages

    broker = CapturedBroker(capture)
    try:
        with RemotingClient() as remoting:
            for queue_id in range(4):
                first = broker.answers[(queue_id, 0, subscription)]
                end = int(first["header"]["extFields"]["nextBeginOffset"])
                expected = [(m.queue_offset, m.body) for m in decode_messages(
                    bytes.fromhex(first["body_hex"]))
                    if subscription == "*" or m.tags == subscription]
                got = {}
                for native in (True, False):
                    reader = QueueRangeReader(
                        BrokerClient(remoting), lambda *a: broker.address,
                        MessageQueue("CapTopic", "broker-a", queue_id), 0, end,
                        ReadSettings(consumer_group="CapPullGroup", subscription=subscription,
                                     native=native, pull_timeout=3))
                    got[native] = [(r["queue_offset"], r["body"]) for b in reader
                                   for r in b.select(["queue_offset", "body"]).to_pylist()]
                    assert reader.path == ("native" if native else "python")
                assert got[True] == got[False] == expected, queue_id
    finally:
        broker.close()


def assert_a_signal_interrupts(cluster, read_held) -> None:
    """With every pull held 4 s, a SIGUSR1 handler raising 0.3 s into ``read_held()`` stops it
    at once, not after the pull timeout."""
    import os
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    cluster.delay_next(40, 4.0, request_codes=[RequestCode.PULL_MESSAGE])
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(Interrupted):
            read_held()
        assert time.monotonic() - started < 2
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        cluster.clear_faults()


def test_a_signal_interrupts_the_native_loop_at_once(capped, capped_admin):
    """A Python signal handler (Ctrl-C's, here SIGUSR1's) runs while the loop waits for a held
    pull, not after the pull timeout; the connection is then closed, not left mid-frame."""
    mq = capped_admin.queues("Capped")[0]
    assert_a_signal_interrupts(capped, lambda: read(capped_admin, mq, 0, 600, pull_timeout=10))
    rows, _ = read(capped_admin, mq, 0, 600)  # the client recovers on a new connection
    assert len(rows) == 600
