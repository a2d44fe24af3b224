"""The byte streams under a connection: plain TCP, or TLS over memory BIOs.

A transport sends whole buffers and receives with a deadline; it knows nothing of frames.
:func:`open_stream` connects, shakes hands and turns every failure into the error a caller
of the connection expects (the peer unavailable, or a clear word when it speaks HTTP).
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import Optional, Tuple, Type, Union

from .errors import ProtocolError, RemotingConnectionError
from .protocol.route import split_address
from .protocol.sniff import foreign_protocol, foreign_protocol_message

RECV_BYTES = 256 * 1024
SEND_TIMEOUT = 10.0


def error_reason(exc: BaseException) -> str:
    """An exception's message without the tuple-ish repr ``ssl.SSLError`` gives its args."""
    if isinstance(exc, ssl.SSLError) and exc.args and isinstance(exc.args[0], str) \
            and len(exc.args) == 1:
        return exc.args[0]
    return str(exc)


def wait_readable(poller: "select.poll", timeout: float) -> bool:
    """Whether the polled socket became readable within ``timeout`` seconds."""
    if timeout <= 0:
        return bool(poller.poll(0))
    return bool(poller.poll(max(1, int(timeout * 1000 + 0.999))))


class PlainTransport:
    """Plain TCP: the socket itself."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float) -> Optional[bytes]:
        """Bytes received, ``b""`` when the peer closed, ``None`` when ``timeout`` passed."""
        if not wait_readable(self.poller, timeout):
            return None
        return self.sock.recv(RECV_BYTES)


class TlsTransport:
    """TLS over memory BIOs, so the reading thread and senders never share an SSL object
    unlocked.

    ``ssl.SSLSocket`` may not be read and written from two threads at once; here every SSL call
    runs under ``_ssl_lock``, and encrypted bytes leave in order under ``_send_lock``.
    """

    def __init__(self, sock: socket.socket, context: ssl.SSLContext,
                 server_hostname: Optional[str]):
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
            if not wait_readable(self.poller, deadline - time.monotonic()):
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


ByteStream = Union[PlainTransport, TlsTransport]


def open_stream(address: str, connect_timeout: float, tls: Optional[ssl.SSLContext],
                   unavailable: Type[RemotingConnectionError]
                ) -> Tuple[socket.socket, ByteStream]:
    """Connect to ``address`` (TLS when ``tls`` is given, handshake done): the socket and its
    transport. Raises ``unavailable`` when the peer cannot be reached or the handshake fails,
    and :class:`ProtocolError` when a TLS client reached an HTTP server."""
    host, port = split_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as exc:
        raise unavailable(address, f"cannot connect: {exc.strerror or exc}") from None
    transport: Optional[ByteStream] = None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            transport = TlsTransport(sock, tls, host if tls.check_hostname else None)
            transport.handshake()
        else:
            transport = PlainTransport(sock)
        sock.settimeout(SEND_TIMEOUT)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        if isinstance(transport, TlsTransport) \
                and foreign_protocol(transport.handshake_head) == "HTTP":
            raise ProtocolError(foreign_protocol_message(address, "HTTP", True)) from None
        raise unavailable(address, f"TLS handshake failed: {error_reason(exc)}") from None
    return sock, transport
