"""A TLS-only server reached over plaintext: the error says the server may require TLS and
names the option (``tls=true``), from the client, a batch read and a stream.

Apache's servers in TLS enforcing mode close a plaintext connection without answering
(4.9.8 ``NettyRemotingServer.HandshakeHandler``: "Clients intend to establish an insecure
connection while this server is running in SSL enforcing mode"); the embedded server does
the same. A peer may also reset the connection instead of closing it: the same hint then.
"""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from rocketmq_spark.client.errors import BrokerUnavailable
from rocketmq_spark.client.protocol.codes import FLAG_RESPONSE
from rocketmq_spark.client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from rocketmq_spark.client.remoting import RemotingClient

HINT = r"before answering anything: the server may require TLS \(set tls=true"


@pytest.fixture(scope="module")
def tls_only():
    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=1, tls="enforcing") as cluster:
        cluster.create_topic("TlsOnly", queues=2)
        yield cluster


def test_batch_read_without_tls_says_the_server_may_require_it(spark, tls_only):
    with pytest.raises(Exception, match=HINT):
        (spark.read.format("rocketmq").option("nameServer", tls_only.namesrv_addr)
         .option("subscribe", "TlsOnly").load().count())


def test_stream_without_tls_says_the_server_may_require_it(spark, tls_only, tmp_path):
    query = (spark.readStream.format("rocketmq").option("nameServer", tls_only.namesrv_addr)
             .option("subscribe", "TlsOnly").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
             .start())
    try:
        with pytest.raises(Exception, match=HINT):  # Spark raises the query's failure here
            query.awaitTermination(120)
        assert "the server may require TLS (set tls=true" in str(query.exception())
    finally:
        query.stop()


def test_the_same_cluster_over_tls_reads(spark, tls_only):
    """The hint's advice works: the same read with tls=true succeeds (no message yet: 0 rows)."""
    rows = (spark.read.format("rocketmq").option("nameServer", tls_only.namesrv_addr)
            .option("subscribe", "TlsOnly").option("tls", "true").option("tlsVerify", "false")
            .load().count())
    assert rows == 0


class ResettingPeer:
    """Resets every connection (SO_LINGER 0) once a request arrives, or, with ``answer``, once
    a second request arrives after answering the first."""

    def __init__(self, answer: bool = False):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            data = sock.recv(65536)
            if data and self.answer:
                request = FrameDecoder().feed(data)[0]
                sock.sendall(encode_frame(RemotingCommand(code=0, flag=FLAG_RESPONSE,
                                                          opaque=request.opaque)))
                sock.recv(65536)  # the next request
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def close(self):
        self.server.close()


def test_a_reset_before_any_answer_gets_the_hint():
    peer = ResettingPeer()
    try:
        with RemotingClient() as client:
            with pytest.raises(BrokerUnavailable, match="connection lost: .*" + HINT):
                client.invoke(peer.address, RemotingCommand(code=106), timeout=5)
    finally:
        peer.close()


def test_a_reset_after_an_answer_does_not_blame_tls():
    peer = ResettingPeer(answer=True)
    try:
        with RemotingClient() as client:
            assert client.invoke(peer.address, RemotingCommand(code=106), timeout=5).code == 0
            with pytest.raises(BrokerUnavailable, match="connection lost|closed by") as err:
                client.invoke(peer.address, RemotingCommand(code=106), timeout=5)
        assert "TLS" not in str(err.value)
    finally:
        peer.close()
