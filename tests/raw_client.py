"""A small blocking remoting client built directly on the frame codec, for testing servers.

It sends hand-built commands and matches answers by opaque; a reader thread collects requests
the server sends (NOTIFY_CONSUMER_IDS_CHANGED). It has none of the real client's logic, which
is the point: tests of the server should not depend on the client under test.
"""
from __future__ import annotations

import itertools
import select
import socket
import ssl
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Dict, List, Optional

from rocketmq_spark.client.protocol.codes import CLIENT_VERSION, FLAG_ONEWAY, SerializeType
from rocketmq_spark.client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from rocketmq_spark.client.protocol.route import split_address


class RawClient:
    """One connection to ``addr`` ("host:port"); optionally TLS via ``ssl_context``."""

    def __init__(self, addr: str, ssl_context: Optional[ssl.SSLContext] = None,
                 timeout: float = 5.0):
        host, port = split_address(addr)
        self.addr = addr
        self.timeout = timeout
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=host)
        self._tls = ssl_context is not None
        # OpenSSL objects must not be used from two threads at once: with TLS the reader polls
        # and every socket call is made under _io_lock (plain sockets need none of that).
        sock.settimeout(0.05 if self._tls else None)
        self._io_lock = threading.Lock()
        self._stopping = threading.Event()
        self.sock = sock
        self._opaque = itertools.count(1)
        self._pending: Dict[int, Future] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.server_requests: List[RemotingCommand] = []
        self.stray_responses: List[RemotingCommand] = []  # answers nobody waited for
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"raw-client-{addr}")
        self._reader.start()

    # ---------------------------------------------------------------- sending

    def send(self, code: int, ext: Optional[Dict[str, str]] = None, body: bytes = b"", *,
             version: int = CLIENT_VERSION, language: str = "PYTHON",
             serialize: int = SerializeType.JSON, oneway: bool = False,
             opaque: Optional[int] = None) -> Optional[Future]:
        """Send a request; returns a Future of the answer (None for oneway)."""
        cmd = RemotingCommand(code=code, ext_fields=ext if ext is not None else {}, body=body,
                              flag=FLAG_ONEWAY if oneway else 0,
                              opaque=next(self._opaque) if opaque is None else opaque,
                              language=language, version=version, serialize_type=serialize)
        return self.send_command(cmd)

    def send_command(self, cmd: RemotingCommand) -> Optional[Future]:
        fut: Optional[Future] = None
        if not cmd.is_oneway:
            fut = Future()
            with self._lock:
                self._pending[cmd.opaque] = fut
        self.send_raw(encode_frame(cmd))
        return fut

    def send_raw(self, data: bytes) -> None:
        if not self._tls:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        while view:
            with self._io_lock:
                try:
                    sent = self.sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, socket.timeout):
                    sent = 0
            view = view[sent:]

    def send_frame(self, data: bytes, opaque: int, expect_answer: bool = True
                   ) -> Optional[Future]:
        """Send a ready-made frame (e.g. replayed from a capture) whose request has ``opaque``."""
        fut: Optional[Future] = None
        if expect_answer:
            fut = Future()
            with self._lock:
                self._pending[opaque] = fut
        self.send_raw(data)
        return fut

    def request(self, code: int, ext: Optional[Dict[str, str]] = None, body: bytes = b"", *,
                timeout: Optional[float] = None, **kwargs) -> RemotingCommand:
        """Send and wait for the answer (raises TimeoutError when none comes)."""
        fut = self.send(code, ext, body, **kwargs)
        try:
            return fut.result(self.timeout if timeout is None else timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer to request code {code} within "
                               f"{self.timeout if timeout is None else timeout} s") from None

    # ---------------------------------------------------------------- receiving

    def _read_loop(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = self._recv()
                if data is None:
                    continue
                if not data:
                    break
                for cmd in decoder.feed(data):
                    if cmd.is_response:
                        with self._lock:
                            fut = self._pending.pop(cmd.opaque, None)
                        if fut is not None:
                            fut.set_result(cmd)
                        else:
                            self.stray_responses.append(cmd)
                    else:
                        with self._cond:
                            self.server_requests.append(cmd)
                            self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            self.closed.set()
            with self._cond:
                pending, self._pending = self._pending, {}
                self._cond.notify_all()
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"connection to {self.addr} closed"))

    def _recv(self) -> Optional[bytes]:
        """Bytes from the socket, b"" at EOF, None when nothing arrived yet (TLS polling)."""
        if not self._tls:
            return self.sock.recv(1 << 20)
        if self._stopping.is_set():
            return b""
        if not self.sock.pending():
            readable, _, _ = select.select([self.sock], [], [], 0.05)
            if not readable:
                return None
        with self._io_lock:
            try:
                return self.sock.recv(1 << 20)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, socket.timeout):
                return None

    def wait_server_request(self, code: int, timeout: float = 5.0,
                            start: int = 0) -> Optional[RemotingCommand]:
        """The first server-sent request with ``code`` at index >= ``start``, waiting for it."""
        def find():
            for cmd in self.server_requests[start:]:
                if cmd.code == code:
                    return cmd
            return None
        with self._cond:
            self._cond.wait_for(lambda: find() is not None or self.closed.is_set(), timeout)
            return find()

    def close(self) -> None:
        if self._tls:  # let the reader leave OpenSSL before the socket goes away
            self._stopping.set()
            self._reader.join(timeout=5)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass
        self.sock.close()
        self._reader.join(timeout=5)

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
