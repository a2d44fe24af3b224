"""The native pull loop on ACL-signed and TLS connections, held against the pure-Python loop,
the signer of client/acl.py and the signatures Apache's C++ client put on its pulls.

* ACL: every request carries ``Signature`` = base64(HMAC-SHA1(secret, the values of its ext
  fields sorted by key, then its body)). Per pull only queueOffset and maxMsgNums change (the
  opaque is a header field, not an ext field: unsigned), so the loop signs each request in C
  (native/client/rmq_hmac.c) over the content Python cut around those two values once
  (acl.signed_parts). The C SHA-1/HMAC is held against hashlib/hmac, the loop's requests
  against ``Credentials.sign`` and ``acl.verify``, its signatures against the genuine C++
  client's on the 4.9.8 capture's pulls, and the whole against the embedded broker, which
  refuses a bad signature as a 4.9 broker does.
* TLS: the loop reads and writes through the connection's TLS record layer (Python's ssl
  over memory BIOs); its rows equal the Python loop's against enforcing and permissive
  brokers, with and without ACL.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rocketmq_spark.client import _native
from rocketmq_spark.client import (
    AuthError, ClientConfig, MessageQueue, QueueRangeReader, ReadSettings, make_tls_context,
)
from rocketmq_spark.client import acl
from rocketmq_spark.client.accelerator import FORCE_PURE_PYTHON
from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.read.native_pull import build_puller, make_puller
from rocketmq_spark.client.protocol.codes import RequestCode, SerializeType
from rocketmq_spark.client.protocol.frame import RemotingCommand, decode_frame, encode_frame
from rocketmq_spark.client.pull import PullRequest

from test_pull_pipeline import (  # noqa: E402  (tests/ is on sys.path)
    assert_a_signal_interrupts, assert_loops_agree, assert_other_answers_reach_their_futures,
    bodies,
)

GROUP = "secure-pipeline-group"
AK, SK = "ak-pipeline", "sk-pipeline-very-secret"
PATCHED = ("maxMsgNums", "queueOffset")


# ------------------------------------------------------------------ the C signer

def test_c_sha1_matches_hashlib_at_every_length():
    """Every padding case (lengths around the 55/56/64-byte block edges) and a long input."""
    for n in list(range(0, 300)) + [4096, 1_000_003]:
        data = bytes((i * 131 + n) & 0xFF for i in range(n))
        assert _native.sha1(data) == hashlib.sha1(data).digest(), n


@settings(max_examples=400, deadline=None)
@given(key=st.binary(max_size=200), data=st.binary(max_size=400))
def test_c_hmac_matches_pythons(key, data):
    """Keys shorter and longer than a block (a long key is hashed first), any content."""
    assert _native.hmac_sha1(key, data) == hmac.new(key, data, hashlib.sha1).digest()


# Keys whose Java (UTF-16) order differs from code point order, plus ordinary ones.
tricky = st.text(st.sampled_from("aAzZ_0q\u00e9\uffff\U00010000\U0001F600"), min_size=1,
                 max_size=4)
texts = st.text(max_size=12) | tricky


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(tricky | st.text(min_size=1, max_size=8), texts, max_size=8),
       patched=st.lists(tricky | st.sampled_from(PATCHED), min_size=1, max_size=3,
                        unique=True),
       values=st.lists(st.text(max_size=6), min_size=3, max_size=3), body=st.binary(max_size=8))
def test_signed_parts_rebuild_the_signed_content(fields, patched, values, body):
    """The content cut around the patched fields, with any values put back in the order
    given, is what acl.signed_content signs (Java's UTF-16 key order included)."""
    patched = [k for k in patched if k not in acl.UNSIGNED_FIELDS]
    fields = {k: v for k, v in fields.items() if k not in patched}
    parts, order = acl.signed_parts(fields, patched)
    chosen = dict(zip(patched, values))
    rebuilt = parts[0] + b"".join(chosen[k].encode() + parts[i + 1]
                                  for i, k in enumerate(order))
    assert sorted(order) == sorted(patched) and len(parts) == len(patched) + 1
    assert rebuilt + body == acl.signed_content({**fields, **chosen}, body)


def _puller(request, credentials=None, end=1 << 62, transport=None):
    """A loop for ``request`` on a socket that never connects: enough to encode requests."""
    sock = socket.socket()
    puller = build_puller(sock, threading.Lock(), itertools.count(1), request, end, 16, False,
                          transport=transport, credentials=credentials)
    return puller, sock


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(group=names, topic=names, queue_id=st.integers(0, 1023), broker=st.text(max_size=12),
       subscription=st.sampled_from(["*", "TagA", "TagA || TagB", "\u6807\u7b7e"]),
       access_key=names, secret=st.text(st.characters(blacklist_categories=("Cs",)),
                                        min_size=1, max_size=120),
       token=st.none() | names, offset=st.integers(0, (1 << 63) - 1),
       nums=st.integers(1, (1 << 31) - 1), opaques=st.lists(st.integers(0, (1 << 31) - 1),
                                                           min_size=2, max_size=2))
def test_the_loops_signed_requests_are_what_the_python_signer_sends(
        group, topic, queue_id, broker, subscription, access_key, secret, token, offset, nums,
        opaques):
    """For random requests and credentials (non-ASCII, secrets longer than a block): the
    frame the loop sends carries exactly the fields Credentials.sign gives the same request,
    the broker-side check passes, and the opaque is not signed."""
    credentials = Credentials(access_key, secret, token)
    request = PullRequest(group, topic, queue_id, 0, broker_name=broker, max_msg_nums=32,
                          subscription=subscription)
    puller, sock = _puller(request, credentials)
    try:
        frames = [decode_frame(puller.request(offset, nums, opaque)) for opaque in opaques]
    finally:
        sock.close()
    expected = credentials.sign(dict(request.ext_fields(), queueOffset=str(offset),
                                     maxMsgNums=str(nums)))
    for cmd, opaque in zip(frames, opaques):
        assert cmd.serialize_type == SerializeType.ROCKETMQ and cmd.opaque == opaque
        assert cmd.code == RequestCode.PULL_MESSAGE and cmd.ext_fields == expected
        assert acl.verify(cmd.ext_fields, b"", secret)
    assert puller.signed and not puller.tls


def test_an_unsigned_loop_sends_no_signature():
    request = PullRequest("G", "T", 0, 0, broker_name="broker-a")
    puller, sock = _puller(request)
    sock.close()
    cmd = decode_frame(puller.request(5, 32, 1))
    assert not puller.signed and cmd.ext_fields == dict(request.ext_fields(), queueOffset="5")
    assert acl.ACCESS_KEY not in cmd.ext_fields and acl.SIGNATURE not in cmd.ext_fields


def test_signatures_equal_apache_cpp_clients_on_its_captured_pulls(capture):
    """Apache's C++ client (4.9.8 capture) signs every pull, with an empty access key and
    secret when none is configured. For each of its pulls, the loop's request built from the
    same fields carries the very Signature the C++ client sent."""
    pulls = [r for r in capture.frames if r["rpc"] == "request"
             and r.get("code_name") == "PULL_MESSAGE"
             and acl.SIGNATURE in (r["header"].get("extFields") or {})]
    assert len(pulls) >= 20
    for record in pulls:
        fields = {k: str(v) for k, v in record["header"]["extFields"].items()}
        genuine = fields.pop(acl.SIGNATURE)
        offset, nums = int(fields.pop("queueOffset")), int(fields.pop("maxMsgNums"))
        (head, mid, tail), order = acl.signed_parts(fields, PATCHED)
        template = encode_frame(RemotingCommand(code=RequestCode.PULL_MESSAGE,
                                                ext_fields=fields), SerializeType.ROCKETMQ)
        sock = socket.socket()
        try:
            puller = _native.Puller(sock, threading.Lock(), itertools.count(1), template,
                                    1 << 62, nums, 16, signer=(b"", head, mid, tail,
                                                               order[0] == "queueOffset"))
            cmd = decode_frame(puller.request(offset, nums, record["header"]["opaque"]))
        finally:
            sock.close()
        assert cmd.ext_fields[acl.SIGNATURE] == genuine, record["seq"]


def test_a_bad_signer_is_refused_without_showing_it():
    sock = socket.socket()
    try:
        for signer in ((SK.encode(), b"", b""), (SK, b"", b"", b"", False), SK.encode()):
            with pytest.raises(TypeError) as err:
                _native.Puller(sock, threading.Lock(), itertools.count(1),
                               encode_frame(RemotingCommand(code=11, ext_fields={}),
                                            SerializeType.ROCKETMQ), 10, 1, 1, signer=signer)
            assert SK not in str(err.value) and SK not in repr(err.value)
    finally:
        sock.close()


# ------------------------------------------------------------------ against the embedded broker

SECURED = {
    "acl": dict(acl={AK: SK}),
    "tls-enforcing": dict(tls="enforcing"),
    "acl+tls-permissive": dict(acl={AK: SK}, tls="permissive"),
}


# Tests of the C loop on secured connections: ROCKETMQ_SPARK_PURE_PYTHON switches it off.
needs_the_c_loop = pytest.mark.skipif(
    FORCE_PURE_PYTHON, reason="ROCKETMQ_SPARK_PURE_PYTHON is set: the C pull loop is off")


def _config(options, secret=SK):
    return ClientConfig(
        credentials=Credentials(AK, secret) if "acl" in options else None,
        tls=make_tls_context(verify=False) if "tls" in options else None)


@pytest.fixture(scope="module", params=sorted(SECURED))
def secured(request):
    """A broker with caps of 7 messages / 2,000 bytes (every pull is cut) behind ACL, TLS or
    both, and an Admin configured to match."""
    from rocketmq_spark.embedded import EmbeddedCluster

    options = SECURED[request.param]
    cluster = EmbeddedCluster(brokers=1, max_transfer_count=7, max_transfer_bytes=2000,
                              **options)
    cluster.start()
    cluster.create_topic("Capped", queues=1)
    cluster.append("Capped", "broker-a", 0, bodies(600))
    try:
        with Admin(cluster.namesrv_addr, config=_config(options)) as admin:
            yield cluster, admin, options
    finally:
        cluster.stop()


def read(admin, mq, start, end, **kw):
    reader = QueueRangeReader(admin.brokers, admin.address, mq, start, end,
                              ReadSettings(consumer_group=GROUP, **kw))
    rows = [(r["queue_offset"], r["body"]) for b in reader for r in
            b.select(["queue_offset", "body"]).to_pylist()]
    return rows, reader


@needs_the_c_loop
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 599), length=st.integers(1, 600),
       nums=st.sampled_from([1, 5, 7, 32, 1024]), depth=st.sampled_from([1, 2, 16]),
       batch=st.sampled_from([3, 50, 32768]))
def test_native_and_python_loops_read_the_same_rows(secured, start, length, nums, depth,
                                                    batch):
    cluster, admin, options = secured
    assert_loops_agree(admin, start, length, nums, depth, batch)


@needs_the_c_loop
def test_the_loop_on_a_secured_connection_signs_and_encrypts(secured):
    """The reader's loop is the signing / TLS one (not a plain loop that happens to pass)."""
    cluster, admin, options = secured
    mq = admin.queues("Capped")[0]
    conn = admin.brokers.remoting.connection(admin.address(mq, 0, False))
    puller = make_puller(conn, PullRequest(GROUP, "Capped", 0, 0, broker_name="broker-a"),
                         600, 16, False, 0)
    assert (puller.signed, puller.tls) == ("acl" in options, "tls" in options)


@needs_the_c_loop
@pytest.mark.parametrize("secret", ["sk-wrong-guess", None], ids=["wrong-secret", "unsigned"])
def test_a_refused_signature_fails_both_loops_alike_and_at_once(embedded_cluster_factory,
                                                                secret):
    """The broker refuses a wrong signature ("Check signature failed") and a request without
    one: both loops raise the same AuthError at once (never retried), naming no key."""
    cluster = embedded_cluster_factory(brokers=1, acl={AK: SK}, tls="permissive")
    cluster.create_topic("Refused", queues=1)
    cluster.append("Refused", "broker-a", 0, [b"x"] * 50)
    mq = MessageQueue("Refused", "broker-a", 0)
    config = ClientConfig(credentials=Credentials(AK, secret) if secret else None,
                          tls=make_tls_context(verify=False))
    errors = {}
    with Admin(cluster.namesrv_addr, config=config) as admin:
        for native in (True, False):
            started = time.monotonic()
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 50, ReadSettings(
                consumer_group=GROUP, native=native, retry_deadline=30))
            with pytest.raises(AuthError) as err:
                list(reader)
            assert reader.path == ("native" if native else "python")
            assert reader.retries == 0 and time.monotonic() - started < 5
            errors[native] = str(err.value)
    assert errors[True] == errors[False]
    assert ("signature" in errors[True]) if secret else ("No accessKey" in errors[True])
    for text in errors.values():
        assert SK not in text and AK not in text and (secret or SK) not in text


@needs_the_c_loop
@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
def test_a_dropped_tls_connection_is_retried(embedded_cluster_factory, mode):
    """The broker closes every connection while the loop waits for a held pull: the reader
    reconnects (a new TLS handshake) and reads every message once."""
    cluster = embedded_cluster_factory(brokers=1, tls=mode, acl={AK: SK})
    cluster.create_topic("Dropped", queues=1)
    cluster.append("Dropped", "broker-a", 0, bodies(300))
    with Admin(cluster.namesrv_addr, config=_config("acl+tls")) as admin:
        mq = admin.queues("Dropped")[0]
        cluster.delay_next(1, 0.6, request_codes=[RequestCode.PULL_MESSAGE])
        timer = threading.Timer(0.3, cluster.drop_connections)
        timer.start()
        try:
            rows, reader = read(admin, mq, 0, 300, retry_backoff=0.01, pull_timeout=5)
        finally:
            timer.cancel()
    assert reader.path == "native" and reader.retries >= 1
    assert rows == list(enumerate(bodies(300)))


class FaultyProxy:
    """A TCP proxy to a broker that spoils its first connection once ``after`` bytes of the
    broker's answers have passed: ``reset`` closes it with a TCP RST, ``corrupt`` flips one
    byte of a TLS record (the client's decryption fails). Later connections pass untouched."""

    def __init__(self, upstream: str, fault: str, after: int = 30_000):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.fault, self.after, self.spoiled = fault, after, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        first = True
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            broker = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, broker, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(broker, client, first),
                             daemon=True).start()
            first = False

    def _pipe(self, src, dst, spoil):
        passed = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if spoil and passed + len(data) > self.after:
                    self.spoiled += 1
                    if self.fault == "reset":
                        dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
                        dst.close()
                        src.close()
                        return
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0xFF
                    data, spoil = bytes(data), False
                passed += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.server.close()


@needs_the_c_loop
@pytest.mark.parametrize("fault", ["reset", "corrupt"])
def test_a_broken_tls_stream_is_a_lost_connection_and_retried(embedded_cluster_factory, fault):
    """The TLS layer fails under the loop (a TCP reset; a record that does not decrypt): the
    connection is lost, as on the Python path, and the reader retries on a new one and reads
    every message once."""
    from rocketmq_spark.client import BrokerClient, RemotingClient

    cluster = embedded_cluster_factory(brokers=1, tls="enforcing", acl={AK: SK})
    cluster.create_topic("Spoiled", queues=1)
    cluster.append("Spoiled", "broker-a", 0, bodies(2000))
    proxy = FaultyProxy(cluster.broker("broker-a").addr, fault)
    try:
        with RemotingClient(_config("acl+tls")) as remoting:
            reader = QueueRangeReader(BrokerClient(remoting), lambda *a: proxy.address,
                                      MessageQueue("Spoiled", "broker-a", 0), 0, 2000,
                                      ReadSettings(consumer_group=GROUP, retry_backoff=0.01,
                                                   pull_timeout=5))
            rows = [(r["queue_offset"], r["body"]) for b in reader
                    for r in b.select(["queue_offset", "body"]).to_pylist()]
    finally:
        proxy.close()
    assert proxy.spoiled == 1 and reader.path == "native" and reader.retries >= 1
    assert rows == list(enumerate(bodies(2000)))


def test_tls_bytes_left_decrypted_by_the_loop_are_read_next(embedded_cluster_factory):
    """The loop's read (recv_into) leaves what does not fit its buffer decrypted in the SSL
    object; the connection's own read (recv) takes it from there at once instead of waiting
    on a socket that has nothing more to say."""
    from rocketmq_spark.client.connection import Connection

    cluster = embedded_cluster_factory(brokers=1, tls="enforcing")
    cluster.create_topic("Left", queues=1)
    cluster.append("Left", "broker-a", 0, bodies(100))
    conn = Connection(cluster.broker("broker-a").addr, tls=make_tls_context(verify=False))
    try:
        transport = conn.native_transport
        request = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=PullRequest(
            GROUP, "Left", 0, 0, max_msg_nums=32).ext_fields())
        conn.send_request(request)
        head = bytearray(100)
        assert transport.recv_into(head, 5) == 100
        data, started = bytes(head), time.monotonic()
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            more = transport.recv(5)
            assert more, "the rest of the answer did not come"
            data += more
        assert time.monotonic() - started < 1
        answer = decode_frame(data)
        assert answer.opaque == request.opaque and answer.remark == "FOUND"
        assert answer.fields["nextBeginOffset"] == "32"
    finally:
        conn.close()


@needs_the_c_loop
def test_other_frames_on_a_tls_connection_are_dispatched_during_the_loop(
        embedded_cluster_factory):
    """An answer to another request that arrives while the loop reads through TLS goes to that
    request's future (the broker holds it 0.1 s and the first pull 0.4 s)."""
    cluster = embedded_cluster_factory(brokers=1, tls="enforcing", acl={AK: SK},
                                       max_transfer_count=7, max_transfer_bytes=2000)
    cluster.create_topic("Capped", queues=1)
    cluster.append("Capped", "broker-a", 0, bodies(600))
    with Admin(cluster.namesrv_addr, config=_config("acl+tls")) as admin:
        assert_other_answers_reach_their_futures(cluster, admin)


@needs_the_c_loop
def test_a_signal_interrupts_the_tls_loop_at_once(embedded_cluster_factory):
    """A Python signal handler runs while the loop waits on a held pull through TLS, not after
    the pull timeout; the next read recovers on a new connection."""
    cluster = embedded_cluster_factory(brokers=1, tls="enforcing", acl={AK: SK})
    cluster.create_topic("Held", queues=1)
    cluster.append("Held", "broker-a", 0, bodies(200))
    with Admin(cluster.namesrv_addr, config=_config("acl+tls")) as admin:
        mq = admin.queues("Held")[0]
        assert_a_signal_interrupts(cluster, lambda: read(admin, mq, 0, 200, pull_timeout=10))
        rows, reader = read(admin, mq, 0, 200)
        assert len(rows) == 200 and reader.path == "native"


@needs_the_c_loop
def test_keys_stay_out_of_logs_and_reprs_of_the_secured_loop(embedded_cluster_factory, caplog):
    """A signed TLS read, logged at DEBUG, and a refused one: neither key in any log record,
    error or repr (the access key travels on the wire only)."""
    cluster = embedded_cluster_factory(brokers=1, acl={AK: SK}, tls="enforcing")
    cluster.create_topic("Quiet", queues=1)
    cluster.append("Quiet", "broker-a", 0, bodies(100))
    texts = []
    with caplog.at_level(logging.DEBUG, logger="rocketmq_spark"):
        for secret in (SK, "sk-wrong-guess"):
            with Admin(cluster.namesrv_addr, config=_config("acl+tls", secret)) as admin:
                mq = MessageQueue("Quiet", "broker-a", 0)
                conn = admin.brokers.remoting.connection(admin.address(mq, 0, False))
                puller = make_puller(conn, PullRequest(GROUP, "Quiet", 0, 0), 100, 16, False,
                                     0)
                texts += [repr(puller), str(puller), repr(conn), repr(admin.brokers.remoting)]
                try:
                    rows, reader = read(admin, mq, 0, 100)
                    assert len(rows) == 100 and reader.path == "native"
                except AuthError as exc:
                    texts += [str(exc), repr(exc)]
    assert len(texts) == 10  # the refusal happened and was captured
    texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    for text in texts:
        assert SK not in text and AK not in text and "sk-wrong-guess" not in text


def test_pure_python_switch_still_takes_the_python_loop(embedded_cluster_factory):
    """ROCKETMQ_SPARK_PURE_PYTHON=1 (the fallback) reads an ACL + TLS broker in Python."""
    cluster = embedded_cluster_factory(brokers=1, acl={AK: SK}, tls="enforcing")
    cluster.create_topic("Fallback", queues=1)
    cluster.append("Fallback", "broker-a", 0, bodies(100))
    script = textwrap.dedent(f"""
        from rocketmq_spark.client import (ClientConfig, QueueRangeReader, ReadSettings,
                                           make_tls_context)
        from rocketmq_spark.client.acl import Credentials
        from rocketmq_spark.client.admin import Admin
        config = ClientConfig(credentials=Credentials({AK!r}, {SK!r}),
                              tls=make_tls_context(verify=False))
        with Admin({cluster.namesrv_addr!r}, config=config) as admin:
            mq = admin.queues("Fallback")[0]
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 100,
                                      ReadSettings(consumer_group="g"))
            print(sum(b.num_rows for b in reader), reader.path)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, ROCKETMQ_SPARK_PURE_PYTHON="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["100", "python"]
