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
import os
import select
import socket
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

from .acl import Credentials
from .errors import (
    BrokerUnavailable, ClientClosed, ProtocolError, RemotingConnectionError, RequestTimeout,
)
from .protocol.codes import FLAG_ONEWAY, ResponseCode, SerializeType, code_name
from .protocol.frame import (
    FLAG_RESPONSE, FrameDecoder, RemotingCommand, decode_payload, encode_frame,
)
from .protocol.route import split_address
from .protocol.sniff import foreign_protocol, foreign_protocol_message

log = logging.getLogger(__name__)

RECV_BYTES = 256 * 1024
SEND_TIMEOUT = 10.0

# What the native pull loop's run() returns (native/rmq_pull.c).
PULL_BATCH, PULL_END, PULL_RESPONSE, PULL_FOREIGN, PULL_TIMEOUT, PULL_CLOSED, PULL_ERROR, \
    PULL_PROTOCOL = range(8)

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


def _reason(exc: BaseException) -> str:
    """An exception's message without the tuple-ish repr ``ssl.SSLError`` gives its args."""
    if isinstance(exc, ssl.SSLError) and exc.args and isinstance(exc.args[0], str) \
            and len(exc.args) == 1:
        return exc.args[0]
    return str(exc)


def _wait_readable(poller: "select.poll", timeout: float) -> bool:
    if timeout <= 0:
        return bool(poller.poll(0))
    return bool(poller.poll(max(1, int(timeout * 1000 + 0.999))))


class _PlainTransport:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float) -> Optional[bytes]:
        """Bytes received, ``b""`` when the peer closed, ``None`` when ``timeout`` passed."""
        if not _wait_readable(self.poller, timeout):
            return None
        return self.sock.recv(RECV_BYTES)


class _TlsTransport:
    """TLS over memory BIOs, so the reader thread and senders never share an SSL object unlocked.

    ``ssl.SSLSocket`` may not be read and written from two threads at once; here every SSL call
    runs under ``_ssl_lock``, and encrypted bytes leave in order under ``_send_lock``.
    """

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: Optional[str]):
        self.sock = sock
        self.handshake_head = b""  # the peer's first bytes, to name what it speaks on failure
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        self._ssl_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._raw: Optional[bytearray] = None  # encrypted bytes read, reused
        self._plain: Optional[bytearray] = None  # recv's decrypted bytes, reused
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def handshake(self) -> None:
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = self.sock.recv(RECV_BYTES)
                if not data:
                    raise ssl.SSLError("the server closed the connection during the TLS "
                                       "handshake: it may serve plaintext only (turn TLS off)")
                if len(self.handshake_head) < 8:
                    self.handshake_head += data[:8]
                self._in.write(data)
        self._flush()

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.sock.sendall(data)

    def send(self, data: bytes) -> None:
        with self._send_lock:
            with self._ssl_lock:
                view = memoryview(data)
                while view:
                    n = self._obj.write(view)
                    view = view[n:]
                encrypted = self._out.read()
            self.sock.sendall(encrypted)

    def recv(self, timeout: float) -> Optional[bytes]:
        """Decrypted bytes, ``b""`` when the peer closed, ``None`` when ``timeout`` passed."""
        if self._plain is None:
            self._plain = bytearray(RECV_BYTES)
        n = self.recv_into(self._plain, timeout)
        return None if n is None else bytes(memoryview(self._plain)[:n])

    def recv_into(self, buffer, timeout: float) -> Optional[int]:
        """Decrypt into ``buffer`` (writable): how many bytes, ``0`` when the peer closed,
        ``None`` when ``timeout`` passed. The native pull loop's read: its own buffer is
        filled, no bytes object is made per record. What does not fit stays decrypted in the
        SSL object, where the next call looks first."""
        view = memoryview(buffer)
        size, got, deadline = len(view), 0, None
        while True:
            with self._ssl_lock:
                while got < size:
                    try:
                        n = self._obj.read(size - got, view[got:])
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        return got
                    if not n:
                        break
                    got += n
                pending = self._out.pending
            if pending:  # post-handshake messages (key updates) must go out in order
                with self._send_lock:
                    with self._ssl_lock:
                        extra = self._out.read()
                    self.sock.sendall(extra)
            if got:
                return got
            if deadline is None:
                deadline = time.monotonic() + timeout
            if not _wait_readable(self.poller, deadline - time.monotonic()):
                return None
            raw = self._recv_raw()
            if not raw:
                return 0
            with self._ssl_lock:
                self._in.write(raw)

    def _recv_raw(self) -> memoryview:
        """Encrypted bytes from the socket, in one buffer kept for the connection's life (a
        fresh 256 KiB bytes object per read costs more than decrypting it). Only the thread
        holding the reading role calls this; the view is valid until its next call."""
        if self._raw is None:
            self._raw = bytearray(RECV_BYTES)
        return memoryview(self._raw)[:self.sock.recv_into(self._raw)]


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
        self._pullers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # native loops on this socket
        self._closed = False
        self._close_reason = ""
        self.last_used = time.monotonic()
        host, port = split_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise unavailable(address, f"cannot connect: {exc.strerror or exc}") from None
        transport = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                transport = _TlsTransport(sock, tls, host if tls.check_hostname else None)
                transport.handshake()
            else:
                transport = _PlainTransport(sock)
            sock.settimeout(SEND_TIMEOUT)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            if isinstance(transport, _TlsTransport) \
                    and foreign_protocol(transport.handshake_head) == "HTTP":
                raise ProtocolError(foreign_protocol_message(address, "HTTP", True)) from None
            raise unavailable(address, f"TLS handshake failed: {_reason(exc)}") from None
        self._sock = sock
        self._transport = transport

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
        if self._closed:
            raise self._unavailable(self.address, self._close_reason or "connection closed")
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
        if self._closed:
            raise self._unavailable(self.address, self._close_reason or "connection closed")
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
            self._fail(f"send failed: {exc}")
            raise self._unavailable(self.address, f"send failed: {exc}") from None
        self.last_used = time.monotonic()
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

    # ------------------------------------------------------------------ native pull loop

    @property
    def native_ok(self) -> bool:
        """Whether a native pull loop may drive this connection: plain TCP from C, TLS
        through :attr:`native_transport`; signatures are made in C (see native_pull)."""
        return isinstance(self._transport, (_PlainTransport, _TlsTransport))

    @property
    def native_transport(self) -> Optional["_TlsTransport"]:
        """The TLS record layer a native pull loop reads and writes through
        (``recv_into(buffer, timeout)``, ``send(data)``), or ``None`` on plain TCP, where it
        uses the socket itself."""
        return self._transport if isinstance(self._transport, _TlsTransport) else None

    @property
    def native_parts(self) -> Tuple[socket.socket, Any, Any]:
        """What a native pull loop shares with this connection: the socket, the send lock
        (whole frames only) and the opaque counter."""
        return self._sock, self._send_lock, self._opaque

    def run_puller(self, puller, offset: int, timeout: float, max_msgs: int,
                   max_bytes: int) -> Tuple[int, int, Optional[RemotingCommand]]:
        """Drive a native pull loop (``_native.Puller``) from ``offset`` while holding the
        reading role; returns ``(reason, offset, response)``.

        ``reason`` is PULL_BATCH (the output holds ``max_msgs`` or ``max_bytes``), PULL_END
        (the range's end) or PULL_RESPONSE (``response`` answers the pull at ``offset`` and
        needs the Python reader). Frames that are not the loop's own are dispatched here as
        :meth:`wait` would; a closed or broken connection, a bad frame and ``timeout``
        seconds without an answer raise as the other calls do.
        """
        if self._closed:
            raise self._unavailable(self.address, self._close_reason or "connection closed")
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._reading and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimeout(self.address, "PULL_MESSAGE", timeout)
                self._cond.wait(remaining)
            if self._closed:
                raise self._unavailable(self.address, self._close_reason or "connection closed")
            self._reading = True
            self._pullers.add(puller)
        try:
            return self._drive(puller, offset, timeout, max_msgs, max_bytes)
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def _drive(self, puller, offset: int, timeout: float, max_msgs: int, max_bytes: int
               ) -> Tuple[int, int, Optional[RemotingCommand]]:
        while True:
            try:
                reason, offset, extra = puller.run(offset, timeout, max_msgs, max_bytes,
                                                   self._decoder.take())
            except (OSError, ssl.SSLError) as exc:  # from the TLS transport, as _read_until
                self._fail(f"connection lost: {_reason(exc)}")
                raise self._unavailable(self.address, self._close_reason) from None
            except BaseException as exc:  # e.g. MemoryError: the stream's position is lost
                self._fail(f"native pull loop failed: {exc!r}")
                raise
            rest, consumed = puller.rest()
            self._decoder.skip(consumed)
            self.last_used = time.monotonic()
            try:
                self._decoder.feed(rest)  # a partial frame; or a bad one, which raises here
            except ProtocolError as exc:
                exc = self._foreign(exc)
                log.warning("protocol error from %s: %s", self.address, exc)
                self._fail(f"protocol error: {exc}", exc)
                raise exc from None
            if reason in (PULL_BATCH, PULL_END):
                return reason, offset, None
            if reason == PULL_RESPONSE:
                return reason, offset, self._decode_raw(extra)
            if reason == PULL_FOREIGN:
                for frame in extra:
                    cmd = self._decode_raw(frame)
                    if cmd.is_response and cmd.opaque not in self._pending:
                        claimed = puller.claim(cmd.opaque)
                        if claimed == offset:
                            return PULL_RESPONSE, offset, cmd
                        if claimed is not None:
                            continue  # asked again when the loop gets there
                    self._dispatch([cmd])
                continue
            if reason == PULL_TIMEOUT:
                raise RequestTimeout(self.address, "PULL_MESSAGE", timeout)
            if reason == PULL_CLOSED:
                self._fail("closed by the peer")
            elif reason == PULL_ERROR:
                self._fail(f"connection lost: {os.strerror(extra)}")
            else:  # PULL_PROTOCOL: the decoder above should have raised
                self._fail("protocol error in the native pull loop")
            raise self._unavailable(self.address, self._close_reason)

    def _decode_raw(self, payload: bytes) -> RemotingCommand:
        """A frame (after its length prefix) the native loop handed over."""
        try:
            return decode_payload(payload)
        except ProtocolError as exc:
            log.warning("protocol error from %s: %s", self.address, exc)
            self._fail(f"protocol error: {exc}", exc)
            raise

    def close(self, reason: str = "closed by the client") -> None:
        self._fail(reason, ClientClosed(f"connection to {self.address} {reason}"))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {self.address} {state}, {len(self._pending)} in flight>"

    # ------------------------------------------------------------------ internals

    def _fail(self, reason: str, error: Optional[BaseException] = None) -> None:
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

    def _read_until(self, future: Optional[ResponseFuture], deadline: float) -> None:
        """Read and dispatch frames until ``future`` is done, the deadline passes or the
        connection fails. Only the thread holding the reading role calls this."""
        transport = self._transport
        while not self._closed and (future is None or not future.done):
            try:
                data = transport.recv(deadline - time.monotonic())
            except (OSError, ssl.SSLError) as exc:
                self._fail(f"connection lost: {exc}")
                return
            if data is None:  # deadline passed
                return
            if not data:
                silent = self._decoder.stream_offset == 0 and not self._decoder.pending
                self._fail("closed by the peer" + (
                    " before answering anything (if the server requires TLS, turn TLS on)"
                    if silent and not isinstance(transport, _TlsTransport) else ""))
                return
            try:
                commands = self._decoder.feed(data)
            except ProtocolError as exc:
                exc = self._foreign(exc)
                log.warning("protocol error from %s: %s", self.address, exc)
                self._fail(f"protocol error: {exc}", exc)
                return
            self._dispatch(commands)

    def _dispatch(self, commands: List[RemotingCommand]) -> None:
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
        pullers = list(self._pullers)
        if not pullers:
            return False
        payload = encode_frame(cmd)[4:]
        return any(p.offer(payload) for p in pullers)

    def _foreign(self, exc: ProtocolError) -> ProtocolError:
        """``exc``, or a clearer error when the peer's very first bytes are HTTP or TLS."""
        if exc.where != "stream" or exc.position != 0 or not exc.excerpt:
            return exc
        protocol = foreign_protocol(bytes.fromhex(exc.excerpt.replace(" ", "")))
        if protocol is None:
            return exc
        tls = isinstance(self._transport, _TlsTransport)
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
            self._fail(f"send failed: {exc}")
