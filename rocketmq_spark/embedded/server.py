"""The remoting transport of the embedded servers: listen, frame, dispatch, answer.

One :class:`RemotingServer` per name server or broker, all on one asyncio loop. It owns what is
common to every request: frame decoding (bad frames close the connection, as Netty's decoder
does), fault injection, ACL checks (brokers only, as in 4.9), the generic error answers, the
rule that oneway requests never get an answer, and TLS (enforcing, or permissive by sniffing the
first byte). Request semantics live in the handler (:mod:`.nameserver`, :mod:`.broker`); a
handler with answers that skip decoding (the broker's C paths, :mod:`.fast_paths`) hands them
in as ``fast_path``, and a broker's request queues (:mod:`.flow_control`) come in as
``flow_control``, so this module knows nothing of any broker. Without queues (the name server)
each read is processed as it arrives.

Connections are asyncio Protocols (not streams) to keep the per-request overhead small.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
import time
from typing import Dict, List, Mapping, Optional, Protocol, Set, Tuple

from ..client import acl as client_acl
from ..client.errors import ProtocolError
from ..client.protocol.codes import FLAG_ONEWAY, SERVER_VERSION, ResponseCode
from ..client.protocol.frame import (
    MAX_FRAME_BYTES, RemotingCommand, decode_payload, encode_frame_head,
)
from .acl_permissions import (
    PERMISSION_FRAME, AccountPermissions, needed_permissions, permission_error,
)
from .faults import FaultInjector
from .headers import HeaderError
from .tls import TLS_HANDSHAKE_FIRST_BYTE, TlsSettings

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I").unpack_from
_MAX_LENGTH = MAX_FRAME_BYTES - 4  # what a frame's length word may say, as Netty's decoder
SLICE_BYTES = 64 * 1024  # a fast-path run between two looks at the clock

ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
# the first stack frame Java appends to the remark (RemotingHelper.exceptionSimpleDesc)
ACL_FRAME = ("org.apache.rocketmq.acl.plain.PlainPermissionManager.validate"
             "(PlainPermissionManager.java)")


class FastPath(Protocol):
    """Answers a handler gives to the frames at the start of a received chunk without
    decoding them into commands (a broker's C paths). The server hands it only chunks that
    start on a frame boundary, and only with no ACL and no fault rules."""

    def answer_leading(self, data, peer: str) -> Tuple[List[bytes], int]:
        """The answers, and how many leading bytes of ``data`` they took (0: none). Raising
        closes the connection."""


class FlowControl(Protocol):
    """Where a broker's reads wait to be processed (:mod:`.flow_control`): it calls back
    :meth:`RemotingServer.serve`, :meth:`ServerConnection.hold`, ``write`` and
    ``refuse_stream``."""

    def arrive(self, conn: "ServerConnection", data) -> None:
        """A read, starting at a frame."""


class Handler(Protocol):
    """What a server delegates to: request semantics and per-connection cleanup."""

    def handle(self, conn: "ServerConnection", cmd: RemotingCommand
               ) -> Optional[RemotingCommand]: ...

    def connection_closed(self, conn: "ServerConnection") -> None: ...


class ServerConnection(asyncio.Protocol):
    """One accepted client connection."""

    trusted = False  # ACL applies (an in-process proxy's requests are trusted instead)

    def __init__(self, server: "RemotingServer"):
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self._held = bytearray()  # the start of a frame not yet wholly read
        self.peer = "127.0.0.1:0"
        self.closed = False
        self.tls = False
        self._corked: Optional[list] = None  # answers held until the chunk is handled
        self._calls: Dict[int, asyncio.Future] = {}  # our requests to the client, by opaque

    # asyncio callbacks -------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.server.running:  # accepted just before the server stopped
            self.closed = True
            transport.abort()
            return
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server._connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        held = self._held
        if held:  # a frame cut by an earlier read: wait until it is whole
            held += data
            if len(held) < 4:
                return
            length = _LENGTH(held)[0]
            if 4 <= length <= _MAX_LENGTH and len(held) < 4 + length:
                return
            data = bytes(held)
            held.clear()
        server = self.server
        if server.flow_control is not None:
            server.flow_control.arrive(self, data)
            return
        pos = server.serve(self, data, 0, len(data), None)
        if pos < len(data) and not self.closed:
            self.hold(memoryview(data)[pos:])

    def hold(self, data) -> None:
        """Keep the start of a frame whose end has not been read yet."""
        self._held += data

    def refuse_stream(self, reason: str) -> None:
        """Bytes that are no frame: log and close, as Netty's decoder does."""
        log.warning("%s: closing %s: %s", self.server.name, self.peer, reason)
        self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(ConnectionError(f"{self.peer} closed the connection"))
        self.server._connection_lost(self)

    # sending -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Frames already encoded (busy answers), written at once: they overtake answers still
        being worked out."""
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def send(self, cmd: RemotingCommand) -> None:
        if self.closed or self.transport is None:
            return
        head = encode_frame_head(cmd)
        if self._corked is not None:
            self._corked.append(head)
            if cmd.body:
                self._corked.append(cmd.body)
        else:
            self.transport.write(head)
            if cmd.body:  # pull bodies are large: no copy into a joined frame
                self.transport.write(cmd.body)

    def send_oneway(self, code: int, ext_fields: Dict[str, str], body: bytes = b"") -> None:
        """A server-initiated oneway request (e.g. NOTIFY_CONSUMER_IDS_CHANGED,
        CHECK_TRANSACTION_STATE)."""
        self.send(RemotingCommand(code=code, ext_fields=ext_fields, body=body, flag=FLAG_ONEWAY,
                                  opaque=next(self.server._opaque), language="JAVA",
                                  version=self.server.version))

    def call(self, code: int, ext_fields: Dict[str, str], body: bytes = b"",
             timeout: float = 10.0) -> "asyncio.Future":
        """A server-initiated request that expects an answer (the broker asking a client,
        e.g. GET_CONSUMER_RUNNING_INFO): a future of the client's response, failed with
        TimeoutError after ``timeout`` seconds or ConnectionError when the client goes."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self.closed:
            future.set_exception(ConnectionError(f"{self.peer} is closed"))
            return future
        opaque = next(self.server._opaque)
        self._calls[opaque] = future

        def expire() -> None:
            if self._calls.pop(opaque, None) is not None and not future.done():
                future.set_exception(TimeoutError(f"no answer from {self.peer} in {timeout} s"))

        handle = loop.call_later(timeout, expire)
        future.add_done_callback(lambda _: handle.cancel())
        self.send(RemotingCommand(code=code, ext_fields=ext_fields, body=body, opaque=opaque,
                                  language="JAVA", version=self.server.version))
        return future

    def answered(self, cmd: RemotingCommand) -> None:
        """A response from the client: completes the :meth:`call` it answers (strays are
        dropped)."""
        future = self._calls.pop(cmd.opaque, None)
        if future is not None and not future.done():
            future.set_result(cmd)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


class RemotingServer:
    """Listens on ``host:port`` (0 = any free port) and serves ``handler``, with its
    ``fast_path`` (if any) first on each received chunk."""

    def __init__(self, name: str, handler: Handler, *, host: str = "127.0.0.1", port: int = 0,
                 tls: Optional[TlsSettings] = None, acl: Optional[Mapping[str, str]] = None,
                 faults: Optional[FaultInjector] = None, version: int = SERVER_VERSION,
                 fast_path: Optional[FastPath] = None,
                 flow_control: Optional[FlowControl] = None):
        self.name = name
        self.handler = handler
        self.host = host
        self.port = port
        self.tls = tls
        self.acl = dict(acl) if acl else None
        # accounts with topic and group permissions (:mod:`.acl_permissions`); others may do all
        self.acl_permissions: Dict[str, AccountPermissions] = {}
        self.faults = faults or FaultInjector()
        self.version = version
        self.running = False
        self._connections: Set[ServerConnection] = set()
        self._opaque = itertools.count(1)
        self._listen_sock: Optional[socket.socket] = None
        self._sniffing: Set[socket.socket] = set()
        self._adopting: Set[asyncio.Task] = set()
        self._ssl_ctx = tls.server_context() if tls else None
        self.fast_path = fast_path
        self.flow_control = flow_control

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> Set[ServerConnection]:
        return set(self._connections)

    # lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Bind (the same port again after a stop) and accept connections."""
        if self.running:
            return
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(512)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        # Our own accept loop rather than loop.create_server: an asyncio Server closed between
        # accepting a socket and building its transport leaks that socket, open and unserved
        # (Python 3.11), so a client could outlive a stopped broker.
        self._listen_sock = sock
        loop.add_reader(sock.fileno(), self._accept_ready)
        self.running = True

    async def stop(self) -> None:
        """Close the listener and every connection."""
        if not self.running:
            return
        self.running = False
        if self._listen_sock is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._listen_sock.fileno())
            self._listen_sock.close()
            self._listen_sock = None
        for sock in list(self._sniffing):
            self._drop_sniffing(sock)
        self.drop_connections()
        await asyncio.sleep(0)  # let connection_lost callbacks run

    def drop_connections(self) -> None:
        for conn in list(self._connections):
            conn.close()

    def _connection_lost(self, conn: ServerConnection) -> None:
        self._connections.discard(conn)
        try:
            self.handler.connection_closed(conn)
        except Exception:  # pragma: no cover - cleanup must not kill the loop
            log.exception("%s: connection cleanup failed", self.name)

    # accepting; permissive TLS peeks at the first byte before handing over to asyncio ---

    def _accept_ready(self) -> None:
        loop = asyncio.get_running_loop()
        while self._listen_sock is not None:
            try:
                sock, _ = self._listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("%s: accept failed: %s", self.name, exc)
                return
            sock.setblocking(False)
            if self.tls is not None and self.tls.mode == "permissive":
                self._sniffing.add(sock)
                loop.add_reader(sock.fileno(), self._sniff, sock)
            else:
                self._spawn_adopt(sock, self._ssl_ctx)

    def _drop_sniffing(self, sock: socket.socket) -> None:
        self._sniffing.discard(sock)
        try:
            asyncio.get_running_loop().remove_reader(sock.fileno())
        except (ValueError, OSError):
            pass
        sock.close()

    def _sniff(self, sock: socket.socket) -> None:
        try:
            first = sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop_sniffing(sock)
            return
        if not first:
            self._drop_sniffing(sock)
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        self._sniffing.discard(sock)
        self._spawn_adopt(sock, self._ssl_ctx if first[0] == TLS_HANDSHAKE_FIRST_BYTE else None)

    def _spawn_adopt(self, sock: socket.socket, ssl_ctx) -> None:
        task = asyncio.get_running_loop().create_task(self._adopt(sock, ssl_ctx))
        self._adopting.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._adopting.discard)

    async def _adopt(self, sock: socket.socket, ssl_ctx) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: ServerConnection(self), sock, ssl=ssl_ctx)
        except (OSError, asyncio.CancelledError, ConnectionError) as exc:
            log.info("%s: connection setup failed: %s", self.name, exc)
            sock.close()
        except Exception as exc:  # ssl.SSLError and friends
            log.info("%s: TLS handshake failed: %s", self.name, exc)
            sock.close()

    # requests ----------------------------------------------------------------------

    def serve(self, conn: ServerConnection, data, pos: int, end: int,
              deadline: Optional[float]) -> int:
        """Process the frames of ``data[pos:end]`` in order, the handler's fast path first
        where it may answer, until ``deadline`` (None: to the end); returns where it stopped:
        ``end``, a frame not wholly read, or the first frame left for later. Clients pipeline
        requests (our reader sends 8 pulls in one write): the answers go out in one write."""
        fast_path = self.fast_path
        if fast_path is not None and (self.acl is not None or self.faults.rules):
            fast_path = None
        view = memoryview(data)
        conn._corked = corked = []
        try:
            while pos < end and not conn.closed:
                if fast_path is not None:
                    # with a deadline, a slice at a time (at least its first frame), so the
                    # clock is looked at while a long run is answered
                    limit = end if deadline is None else min(end, pos + SLICE_BYTES)
                    if limit < end and end - pos >= 4:
                        limit = max(limit, min(end, pos + 4 + _LENGTH(view, pos)[0]))
                    try:
                        answers, used = fast_path.answer_leading(view[pos:limit], conn.peer)
                    except Exception:
                        log.exception("%s: closing %s: the fast path failed", self.name,
                                      conn.peer)
                        conn.close()
                        return end
                    if used:
                        corked += answers
                        pos += used
                        if pos >= end or (deadline is not None
                                          and time.monotonic() >= deadline):
                            break
                        if limit < end and pos + 4 + _LENGTH(view, pos)[0] > limit:
                            continue  # the slice ended inside a frame: the next one has it
                if end - pos < 4:
                    break
                length = _LENGTH(view, pos)[0]
                if length < 4 or length > _MAX_LENGTH:
                    conn.refuse_stream(f"frame length {length} is outside [4, {_MAX_LENGTH}]")
                    return end
                if end - pos - 4 < length:
                    break
                try:
                    cmd = decode_payload(view[pos + 4:pos + 4 + length])
                except ProtocolError as exc:
                    conn.refuse_stream(str(exc))
                    return end
                pos += 4 + length
                self.dispatch(conn, cmd)
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            conn._corked = None
            if corked and not conn.closed and conn.transport is not None:
                conn.transport.write(corked[0] if len(corked) == 1 else b"".join(corked))
        return pos

    def dispatch(self, conn: ServerConnection, cmd: RemotingCommand) -> None:
        """Handle one incoming frame: faults first, then ACL, then the handler."""
        if cmd.is_response:
            conn.answered(cmd)  # a client answering one of our calls; strays are dropped
            return
        rule = self.faults.take(self.name, cmd.code)
        if rule is not None:
            if rule.kind == "delay":
                asyncio.get_running_loop().call_later(rule.seconds, self._process, conn, cmd)
                return
            if rule.kind == "drop":  # read and ignored: no effect, no answer
                return
            if not cmd.is_oneway:
                conn.send(cmd.make_response(rule.code, remark=rule.remark or None,
                                            version=self.version))
            return
        self._process(conn, cmd)

    def _process(self, conn: ServerConnection, cmd: RemotingCommand) -> None:
        if conn.closed:
            return
        if self.acl is not None and not conn.trusted:
            error = self._acl_error(cmd)
            if error is not None:
                if not cmd.is_oneway:
                    conn.send(cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=error,
                                                version=self.version))
                return
        try:
            response = self.handler.handle(conn, cmd)
        except HeaderError as exc:
            response = cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc),
                                         version=self.version)
        except Exception as exc:
            log.exception("%s: %s failed", self.name, cmd.describe())
            response = cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                         remark=f"{type(exc).__name__}: {exc}",
                                         version=self.version)
        if response is not None and not cmd.is_oneway:
            conn.send(response)

    def _acl_error(self, cmd: RemotingCommand) -> Optional[str]:
        """The 4.9 PlainPermissionManager's verdict as the remark a client sees, or None."""
        fields = cmd.fields
        access_key = fields.get(client_acl.ACCESS_KEY) if cmd.ext_fields is not None else None
        if access_key is None:
            reason = "No accessKey is configured"
        elif access_key not in self.acl:
            reason = f"No acl config for {access_key}"
        elif not client_acl.verify(fields, cmd.body, self.acl[access_key]):
            reason = f"Check signature failed for accessKey={access_key}"
        elif access_key in self.acl_permissions:
            reason = permission_error(self.acl_permissions[access_key],
                                      needed_permissions(cmd.code, fields))
            return None if reason is None else f"{ACL_EXCEPTION}: {reason}, {PERMISSION_FRAME}"
        else:
            return None
        return f"{ACL_EXCEPTION}: {reason}, {ACL_FRAME}"
