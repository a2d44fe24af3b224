"""One remoting connection: a socket (optionally TLS) with requests multiplexed by opaque.

Callers send from any thread. There is no reader thread: a caller waiting for a response reads
the socket itself and hands every frame it decodes to the request it answers, so the common
case (one thread, one connection, as in a Spark task) never switches threads. When several
threads wait on one connection, one of them reads at a time and the others sleep on a
condition until their response has been delivered or the reading role is free.

Responses may arrive in any order (genuine brokers reorder them), and the broker may send its
own requests on the same socket, which are answered here. Every wait has a deadline:
connecting, sending (the socket's write timeout) and each request's own timeout. A broken
connection fails every request in flight at once instead of leaving it to time out.
"""
from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type

from .acl import Credentials
from .errors import (
    BrokerUnavailable, ClientClosed, ProtocolError, RemotingConnectionError, RequestTimeout,
)
from .protocol.codes import FLAG_ONEWAY, ResponseCode, SerializeType, code_name
from .protocol.frame import (
    FLAG_RESPONSE, FrameDecoder, RemotingCommand, decode_payload, encode_frame,
)
from .protocol.sniff import foreign_protocol, foreign_protocol_message
from .transport import TlsTransport, open_stream

log = logging.getLogger(__name__)

RequestHandler = Callable[["Connection", RemotingCommand], Optional[RemotingCommand]]


class ResponseFuture:
    """The pending answer to one request; completed by whichever thread reads its response."""

    __slots__ = ("opaque", "request_name", "response", "error", "done")

    def __init__(self, opaque: int, request_name: str):
        self.opaque = opaque
        self.request_name = request_name
        self.response: Optional[RemotingCommand] = None
        self.error: Optional[BaseException] = None
        self.done = False

    def result(self) -> RemotingCommand:
        """The response; only valid once ``done``. Raises the connection's error if any."""
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


class Connection:
    """A connected remoting channel to one address.

    ``credentials`` sign every request sent on it; ``request_handler`` answers requests that the
    peer sends (for example NOTIFY_CONSUMER_IDS_CHANGED). Unhandled peer requests that expect an
    answer get REQUEST_CODE_NOT_SUPPORTED, as a minimal Java client would send.
    """

    def __init__(self, address: str, *, connect_timeout: float = 3.0,
                 tls: Optional[ssl.SSLContext] = None, credentials: Optional[Credentials] = None,
                 request_handler: Optional[RequestHandler] = None,
                 on_close: Optional[Callable[["Connection"], None]] = None,
                 unavailable: Type[RemotingConnectionError] = BrokerUnavailable,
                 serialize_type: int = SerializeType.JSON):
        self.address = address
        self.credentials = credentials
        self.serialize_type = serialize_type
        self._request_handler = request_handler
        self._on_close = on_close
        self._unavailable = unavailable
        self._opaque = itertools.count(1)
        self._pending: Dict[int, ResponseFuture] = {}
        self._cond = threading.Condition(threading.Lock())
        self._send_lock = threading.Lock()
        self._reading = False  # one thread at a time holds the reading role
        self._decoder = FrameDecoder()
        # Native pull loops on this socket: offered the responses nobody here waits for.
        self._response_takers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._closed = False
        self._close_reason = ""
        self._sock, self._transport = open_stream(address, connect_timeout, tls, unavailable)

    # ------------------------------------------------------------------ public

    @property
    def closed(self) -> bool:
        return self._closed

    def send_request(self, cmd: RemotingCommand, oneway: bool = False) -> Optional[ResponseFuture]:
        """Send ``cmd``; returns the future of its response (``None`` for a oneway request)."""
        return self.send_requests([cmd], oneway)[0]

    def send_requests(self, cmds: Sequence[RemotingCommand], oneway: bool = False
                      ) -> List[Optional[ResponseFuture]]:
        """Send several requests in one write (one system call); returns their futures."""
        self.raise_if_closed()
        frames, futures = [], []
        for cmd in cmds:
            cmd.opaque = next(self._opaque) & 0x7FFFFFFF
            if oneway:
                cmd.flag |= FLAG_ONEWAY
            if cmd.ext_fields is None:
                cmd.ext_fields = {}
            if self.credentials is not None:
                self.credentials.sign(cmd.ext_fields, cmd.body)
            frames.append(encode_frame(cmd, self._serialization(cmd)))
            futures.append(None if oneway else ResponseFuture(cmd.opaque,
                                                              code_name(cmd.code, False)))
        return self._write(frames[0] if len(frames) == 1 else b"".join(frames), futures)

    def send_encoded(self, count: int, encode: Callable[[List[int]], Any], request_name: str,
                     oneway: bool = False) -> List[Optional[ResponseFuture]]:
        """Send ``count`` requests that ``encode(opaques)`` turns into frames (a bytes-like
        of them back to back, e.g. from a :class:`~.protocol.spliced_requests.RequestTemplate`)
        in one write; returns their futures. Not on a signing connection (each request's
        signature covers its own fields)."""
        if self.credentials is not None:
            raise ValueError("requests encoded by the caller cannot be signed; send commands")
        self.raise_if_closed()
        opaques = [next(self._opaque) & 0x7FFFFFFF for _ in range(count)]
        data = encode(opaques)
        futures: List[Optional[ResponseFuture]] = [None] * count if oneway else [
            ResponseFuture(o, request_name) for o in opaques]
        return self._write(data, futures)

    def _write(self, data: Any, futures: List[Optional[ResponseFuture]]
               ) -> List[Optional[ResponseFuture]]:
        """Register the futures of the requests in ``data`` (None: oneway), then write it."""
        waiting = [f for f in futures if f is not None]
        if waiting:
            with self._cond:
                for future in waiting:
                    self._pending[future.opaque] = future
        try:
            with self._send_lock:
                self._transport.send(data)
        except (OSError, ssl.SSLError) as exc:
            self.fail(f"send failed: {exc}")
            raise self._unavailable(self.address, f"send failed: {exc}") from None
        return futures

    def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` and wait at most ``timeout`` seconds for its response."""
        return self.wait(self.send_request(cmd), timeout)

    def wait(self, future: ResponseFuture, timeout: float) -> RemotingCommand:
        """Wait for a future from :meth:`send_request`; raises RequestTimeout after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                while not future.done and self._reading:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if future.done:
                    return future.result()
                if time.monotonic() >= deadline:
                    self._pending.pop(future.opaque, None)
                    raise RequestTimeout(self.address, future.request_name, timeout)
                self._reading = True
            try:
                self._read_until(future, deadline)
            finally:
                with self._cond:
                    self._reading = False
                    self._cond.notify_all()

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        self.send_request(cmd, oneway=True)

    def poll(self) -> bool:
        """Read whatever has already arrived without blocking (peer requests, a close).

        Returns whether the connection is still open. Idle pooled connections are polled
        before reuse, so a connection the broker closed is noticed before a request is lost
        on it."""
        with self._cond:
            if self._closed or self._reading:
                return not self._closed
            self._reading = True
        try:
            self._read_until(None, time.monotonic())
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()
        return not self._closed

    def close(self, reason: str = "closed by the client") -> None:
        self.fail(reason, ClientClosed(f"connection to {self.address} {reason}"))

    def fail(self, reason: str, error: Optional[BaseException] = None) -> None:
        """Close the connection for ``reason``: every request in flight fails at once (with
        ``error``, by default the peer unavailable), and later calls raise."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._close_reason = reason
            pending, self._pending = self._pending, {}
            err = error or self._unavailable(self.address, reason)
            for future in pending.values():
                future.error = err
                future.done = True
            self._cond.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("on_close callback failed")

    def closed_error(self) -> RemotingConnectionError:
        """The error a call on this closed connection raises (the peer unavailable)."""
        return self._unavailable(self.address, self._close_reason or "connection closed")

    def raise_if_closed(self) -> None:
        if self._closed:
            raise self.closed_error()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {self.address} {state}, {len(self._pending)} in flight>"

    # ------------------------------------------------------------------ a loop reading the socket
    # For a loop that reads and writes this socket itself (the native pull loop, see
    # :mod:`.read.native_pull_driver`): it holds the reading role, takes the bytes the frame
    # decoder has buffered, hands back what it read past its own frames, and passes on
    # the frames that are not its own.

    @property
    def native_transport(self) -> Optional[TlsTransport]:
        """The TLS record layer a native pull loop reads and writes through
        (``recv_into(buffer, timeout)``, ``send(data)``), or ``None`` on plain TCP, where it
        uses the socket itself."""
        return self._transport if isinstance(self._transport, TlsTransport) else None

    @property
    def native_parts(self) -> Tuple[socket.socket, Any, Any]:
        """What a native pull loop shares with this connection: the socket, the send lock
        (whole frames only) and the opaque counter."""
        return self._sock, self._send_lock, self._opaque

    @contextmanager
    def reading_role(self, timeout: float, request_name: str) -> Iterator[None]:
        """Hold the reading role (no other thread reads the socket meanwhile); waits at most
        ``timeout`` seconds for it, then raises :class:`RequestTimeout`."""
        self.raise_if_closed()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._reading and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimeout(self.address, request_name, timeout)
                self._cond.wait(remaining)
            self.raise_if_closed()
            self._reading = True
        try:
            yield
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def add_response_taker(self, taker: Any) -> None:
        """Offer ``taker`` (``offer(payload) -> bool``) the responses nobody here waits for:
        one may answer a pull its loop sent, read while another thread held the socket."""
        with self._cond:
            self._response_takers.add(taker)

    def take_buffered(self) -> bytes:
        """The bytes read but not yet decoded: the loop continues the stream from them."""
        return self._decoder.take()

    def resume_stream(self, consumed: int, rest: bytes) -> None:
        """The loop read ``consumed`` bytes of frames it handled itself, then ``rest`` (the
        start of a frame): decoding here continues after them. Raises (and closes the
        connection) when ``rest`` is not the start of a valid frame."""
        self._decoder.skip(consumed)
        try:
            self._decoder.feed(rest)
        except ProtocolError as exc:
            exc = self._foreign(exc)
            log.warning("protocol error from %s: %s", self.address, exc)
            self.fail(f"protocol error: {exc}", exc)
            raise exc from None

    def awaits(self, opaque: int) -> bool:
        """Whether a request sent through this connection waits for the answer ``opaque``."""
        return opaque in self._pending

    def decode_frame(self, payload: bytes) -> RemotingCommand:
        """A frame (after its length prefix) the loop handed over; a bad one closes the
        connection and raises."""
        try:
            return decode_payload(payload)
        except ProtocolError as exc:
            log.warning("protocol error from %s: %s", self.address, exc)
            self.fail(f"protocol error: {exc}", exc)
            raise

    # ------------------------------------------------------------------ internals

    def _read_until(self, future: Optional[ResponseFuture], deadline: float) -> None:
        """Read and dispatch frames until ``future`` is done, the deadline passes or the
        connection fails. Only the thread holding the reading role calls this."""
        transport = self._transport
        while not self._closed and (future is None or not future.done):
            try:
                data = transport.recv(deadline - time.monotonic())
            except (OSError, ssl.SSLError) as exc:
                self.fail(self.lost_reason(f"connection lost: {exc}",
                                           isinstance(exc, ConnectionResetError)))
                return
            if data is None:  # deadline passed
                return
            if not data:
                self.fail(self.lost_reason("closed by the peer", True))
                return
            try:
                commands = self._decoder.feed(data)
            except ProtocolError as exc:
                exc = self._foreign(exc)
                log.warning("protocol error from %s: %s", self.address, exc)
                self.fail(f"protocol error: {exc}", exc)
                return
            self.dispatch(commands)

    def dispatch(self, commands: List[RemotingCommand]) -> None:
        """Hand responses to their futures (or to the native loop that sent the request) and
        answer the peer's requests. The futures of a whole read are completed under one
        acquisition of the lock (a run of pipelined requests is answered in one read)."""
        unclaimed: List[RemotingCommand] = []
        completed = False
        with self._cond:
            pending = self._pending
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    waiting = pending.pop(cmd.opaque, None)
                    if waiting is not None:
                        waiting.response = cmd
                        waiting.done = True
                        completed = True
                        continue
                unclaimed.append(cmd)
            if completed:
                self._cond.notify_all()
        for cmd in unclaimed:
            if cmd.flag & FLAG_RESPONSE:
                if not self._offer(cmd):
                    log.debug("dropping late response %s from %s", cmd.describe(),
                              self.address)
            else:
                self._serve_peer_request(cmd)

    def _offer(self, cmd: RemotingCommand) -> bool:
        """Give a response nobody waits for to the native loops of this connection: it may
        answer one of their pulls, read while another thread held the socket."""
        takers = list(self._response_takers)
        if not takers:
            return False
        payload = encode_frame(cmd)[4:]
        return any(taker.offer(payload) for taker in takers)

    def lost_reason(self, reason: str, by_peer: bool) -> str:
        """``reason``, plus the likely cause when the peer dropped a plaintext connection
        before its first answer: a TLS-only server (Apache's, in TLS enforcing mode, closes
        such a connection without a word)."""
        silent = self._decoder.stream_offset == 0 and not self._decoder.pending
        if by_peer and silent and not isinstance(self._transport, TlsTransport):
            return (f"{reason} before answering anything: the server may require TLS "
                    "(set tls=true; ClientConfig(tls=...) outside Spark)")
        return reason

    def _foreign(self, exc: ProtocolError) -> ProtocolError:
        """``exc``, or a clearer error when the peer's very first bytes are HTTP or TLS."""
        if exc.where != "stream" or exc.position != 0 or not exc.excerpt:
            return exc
        protocol = foreign_protocol(bytes.fromhex(exc.excerpt.replace(" ", "")))
        if protocol is None:
            return exc
        tls = isinstance(self._transport, TlsTransport)
        return ProtocolError(foreign_protocol_message(self.address, protocol, tls))

    def _serialization(self, cmd: RemotingCommand) -> int:
        """The connection's header format, or JSON for a code or version that does not fit the
        ROCKETMQ header's 16-bit fields (the 5.x POP family, 200050...)."""
        if self.serialize_type == SerializeType.ROCKETMQ and not (
                -0x8000 <= cmd.code <= 0x7FFF and -0x8000 <= cmd.version <= 0x7FFF):
            return SerializeType.JSON
        return self.serialize_type

    def _serve_peer_request(self, cmd: RemotingCommand) -> None:
        response = None
        if self._request_handler is not None:
            try:
                response = self._request_handler(self, cmd)
            except Exception:
                log.exception("handler for peer request %s failed", cmd.describe())
        if cmd.is_oneway:
            return
        if response is None:
            response = cmd.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f" request type {cmd.code} not supported", language="PYTHON")
        response.opaque = cmd.opaque
        try:
            with self._send_lock:
                self._transport.send(encode_frame(response, self._serialization(response)))
        except (OSError, ssl.SSLError) as exc:
            self.fail(f"send failed: {exc}")
