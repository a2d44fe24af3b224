"""The client connection against scripted peers: multiplexing, timeouts, and hostile bytes.

Each test runs a tiny TCP server on loopback that answers in a chosen (possibly broken) way, so
the faults are real bytes on a real socket, not mocks.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from rocketmq_spark.client.config import make_tls_context
from rocketmq_spark.client.connection import Connection
from rocketmq_spark.client.errors import (
    BrokerUnavailable, ClientClosed, ProtocolError, RequestTimeout, ResponseError,
)
from rocketmq_spark.client.protocol.codes import FLAG_RESPONSE
from rocketmq_spark.client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.broker import BrokerClient
from rocketmq_spark.client.protocol.route import MessageQueue
from waiting import wait_until


class ScriptedPeer:
    """Accepts connections and hands each decoded request to ``script(sock, cmd)``."""

    def __init__(self, script):
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.requests = []
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock):
        decoder = FrameDecoder()
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for cmd in decoder.feed(data):
                self.requests.append(cmd)
                self.script(sock, cmd)

    def close(self):
        self.server.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def respond(sock, request, code=0, **kw):
    sock.sendall(encode_frame(request.make_response(code, **kw)))


@pytest.fixture
def peer_factory():
    peers = []

    def make(script):
        peer = ScriptedPeer(script)
        peers.append(peer)
        return peer

    yield make
    for p in peers:
        p.close()


def test_responses_out_of_order_reach_their_callers(peer_factory):
    held = []

    def script(sock, cmd):
        held.append(cmd)
        if len(held) == 3:  # answer the third first, then the others, reversed
            for req in reversed(held):
                respond(sock, req, ext_fields={"echo": req.fields["n"]})

    peer = peer_factory(script)
    conn = Connection(peer.address)
    futures = [conn.send_request(RemotingCommand(code=30, ext_fields={"n": str(i)}))
               for i in range(3)]
    answers = [conn.wait(f, 5).fields["echo"] for f in futures]
    assert answers == ["0", "1", "2"]
    conn.close()


def test_request_timeout_is_raised_and_late_answer_dropped(peer_factory):
    def script(sock, cmd):
        if cmd.fields.get("slow"):
            time.sleep(0.5)
        respond(sock, cmd, ext_fields={"n": cmd.fields.get("n", "")})

    peer = peer_factory(script)
    conn = Connection(peer.address)
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        conn.invoke(RemotingCommand(code=30, ext_fields={"slow": "1"}), timeout=0.1)
    assert time.monotonic() - started < 0.4
    assert "GET_MAX_OFFSET" in str(info.value)
    # The late answer arrives and is dropped; the connection keeps working.
    assert conn.invoke(RemotingCommand(code=30, ext_fields={"n": "7"}), 2).fields["n"] == "7"
    conn.close()


def test_oneway_gets_no_future_and_sets_flag(peer_factory):
    peer = peer_factory(lambda sock, cmd: None)
    conn = Connection(peer.address)
    assert conn.send_request(RemotingCommand(code=15), oneway=True) is None
    wait_until(lambda: peer.requests, 2, "the oneway request at the peer")
    assert peer.requests[0].is_oneway
    conn.close()


def test_peer_closing_mid_response_fails_pending_requests_at_once(peer_factory):
    def script(sock, cmd):
        frame = encode_frame(cmd.make_response(0, body=b"x" * 1000))
        sock.sendall(frame[:len(frame) // 2])
        sock.close()

    peer = peer_factory(script)
    conn = Connection(peer.address)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as info:
        conn.invoke(RemotingCommand(code=11), timeout=10)
    assert time.monotonic() - started < 2, "a closed connection must not wait for the timeout"
    assert "closed by the peer" in str(info.value)
    assert conn.closed


@pytest.mark.parametrize("garbage, message", [
    (struct.pack(">I", 20_000_000) + b"\0" * 8, "frame length"),
    (struct.pack(">II", 8, 0x00000010) + b"{}{}", "header length 16 overruns"),
    (struct.pack(">II", 12, 8) + b"not json", "not valid JSON"),
    (struct.pack(">II", 8, 0x05000000 | 4) + b"abcd", "unknown header serialization type 5"),
])
def test_garbage_from_the_peer_is_a_protocol_error(peer_factory, garbage, message):
    peer = peer_factory(lambda sock, cmd: sock.sendall(garbage))
    conn = Connection(peer.address)
    with pytest.raises(ProtocolError) as info:
        conn.invoke(RemotingCommand(code=11), timeout=5)
    assert message in str(info.value)
    assert info.value.position is not None


def test_unknown_response_code_is_a_typed_error(peer_factory):
    peer = peer_factory(lambda sock, cmd: respond(sock, cmd, 4242, remark="what is this"))
    brokers = BrokerClient(RemotingClient())
    with pytest.raises(ResponseError) as info:
        brokers.get_max_offset(peer.address, MessageQueue("T", "b", 0))
    assert info.value.code == 4242
    assert "what is this" in str(info.value) and "GET_MAX_OFFSET" in str(info.value)


def test_connect_refused_is_broker_unavailable():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(BrokerUnavailable):
        Connection(f"127.0.0.1:{port}", connect_timeout=1)


def test_peer_requests_are_answered_not_supported(peer_factory):
    """The broker sends its own requests on client connections; unhandled ones get code 3."""
    answers = []

    def script(sock, cmd):
        if cmd.is_response:
            answers.append(cmd)
            return
        sock.sendall(encode_frame(RemotingCommand(code=307, opaque=99, language="JAVA")))
        sock.sendall(encode_frame(RemotingCommand(code=40, opaque=100, flag=2)))  # oneway
        respond(sock, cmd)

    peer = peer_factory(script)
    seen = []
    conn = Connection(peer.address, request_handler=lambda c, cmd: seen.append(cmd.code))
    conn.invoke(RemotingCommand(code=34), 5)
    wait_until(lambda: answers, 2, "the answer to the server's request")
    assert seen == [307, 40]
    assert [(a.code, a.opaque, a.flag & FLAG_RESPONSE) for a in answers] == [(3, 99, 1)]
    conn.close()


def test_closed_connection_refuses_new_requests(peer_factory):
    peer = peer_factory(lambda sock, cmd: respond(sock, cmd))
    conn = Connection(peer.address)
    future = conn.send_request(RemotingCommand(code=30))
    conn.wait(future, 5)
    conn.close()
    with pytest.raises(BrokerUnavailable):
        conn.send_request(RemotingCommand(code=30))


def test_close_fails_waiters_with_client_closed(peer_factory):
    peer = peer_factory(lambda sock, cmd: None)  # never answers
    conn = Connection(peer.address)
    future = conn.send_request(RemotingCommand(code=30))
    threading.Timer(0.1, conn.close).start()
    with pytest.raises(ClientClosed):
        conn.wait(future, 5)


# ------------------------------------------------------------------- peers that are not RocketMQ


class AnsweringPeer:
    """Answers whatever it receives first with fixed bytes (an HTTP server's 400, a TLS alert),
    as servers of other protocols do on a request they cannot parse."""

    def __init__(self, answer: bytes):
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
            with sock:
                if sock.recv(65536):
                    sock.sendall(self.answer)
                    time.sleep(0.5)

    def close(self):
        self.server.close()


HTTP_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TLS_ALERT = bytes.fromhex("15030300020246")  # alert record: fatal protocol_version


@pytest.mark.parametrize("answer, message", [
    (HTTP_400, "answered in HTTP, not RocketMQ's remoting protocol"),
    (TLS_ALERT, "answered in TLS on a plaintext connection: it requires TLS"),
])
def test_a_peer_speaking_http_or_tls_is_named(answer, message):
    peer = AnsweringPeer(answer)
    try:
        started = time.monotonic()
        with RemotingClient() as client:
            with pytest.raises(ProtocolError, match=message) as err:
                client.invoke(peer.address, RemotingCommand(code=106), timeout=10)
        assert peer.address in str(err.value) and "frame length" not in str(err.value)
        assert time.monotonic() - started < 3
    finally:
        peer.close()


def test_tls_client_meeting_an_http_server_is_told_so():
    peer = AnsweringPeer(HTTP_400)
    try:
        with pytest.raises(ProtocolError, match="answered in HTTP"):
            Connection(peer.address, tls=make_tls_context(verify=False))
    finally:
        peer.close()


def test_tls_mismatches_with_a_real_server_say_what_to_change(embedded_cluster_factory):
    tls_only = embedded_cluster_factory(brokers=1, tls="enforcing")
    with RemotingClient() as client:
        with pytest.raises(BrokerUnavailable, match=r"closed by the peer before answering "
                                                    r"anything: the server may require TLS "
                                                    r"\(set tls=true"):
            client.invoke(tls_only.namesrv_addr, RemotingCommand(code=106), timeout=5)
    plain = embedded_cluster_factory(brokers=1)
    with pytest.raises(BrokerUnavailable, match="TLS handshake failed: the server closed the "
                                                "connection .* plaintext only"):
        Connection(plain.namesrv_addr, tls=make_tls_context(verify=False))
