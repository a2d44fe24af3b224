"""The producer's connection to a 5.x proxy: the grpc.aio channel on the shared I/O loop, the
client's introduction (settings over Telemetry, then a Heartbeat), the heartbeats that follow,
and every call but the sends' planning.

The introduction is what the official clients do after their first QueryRoute: the settings
over a Telemetry stream (the proxy answers with the largest body it takes; the stream stays open
for the client's life) and a Heartbeat, repeated every ``HEARTBEAT_INTERVAL`` seconds while the
producer sends. The settings declare the topics the producer publishes to (Apache's proxy
refuses settings without one): those it was made with and the first one it sends to; a topic
met later is declared before its first send by sending the settings again, grown, and waiting
for the proxy's answer (:meth:`ProxyChannel.declare`). A stream the proxy ended is opened again
with every topic declared so far. Closing tells the proxy the client is gone
(NotifyClientTermination).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any, Awaitable, Callable, FrozenSet, List, Optional, Sequence

import grpc
from grpc import aio

from ..errors import ClientClosed, RequestTimeout, RocketMQError
from . import definition_pb2 as definition
from . import service_pb2 as service
from . import service_pb2_grpc as service_grpc
from . import status
from .auth import CallMetadata
from .endpoints import ProxyEndpoints
from .io_loop import IoLoop, shared_io_loop
from .telemetry import Session, producer_settings, topic_resources
from .tls import channel_credentials

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 10.0
DEFAULT_MAX_BODY_SIZE = 4 * 1024 * 1024
_CLOSED = "the GrpcProducer is closed"


class ProxyChannel:
    """One producer's channel to the proxy at ``endpoints``, opened on first use.

    ``tls``/``tls_verify``/``tls_ca_file`` as :class:`GrpcProducer` takes them; ``metadata()``
    gives each call's metadata; ``timeout`` is each call's deadline. Thread-safe; the
    coroutines run on the I/O loop."""

    def __init__(self, endpoints: ProxyEndpoints, metadata: CallMetadata, version: str, *,
                 tls: bool, tls_verify: bool, tls_ca_file: Optional[str], timeout: float,
                 topics: Sequence[str] = (), namespace: str = ""):
        self.endpoints = endpoints
        self.address = str(endpoints)
        self.timeout = timeout
        self.max_body_size = DEFAULT_MAX_BODY_SIZE  # until the proxy's settings say
        self._metadata = metadata
        self._version = version
        self._tls = (tls, tls_verify, tls_ca_file)
        self._lock = threading.Lock()
        self._io: Optional[IoLoop] = None
        self._channel: Optional[aio.Channel] = None
        self._stub: Optional[service_grpc.MessagingServiceStub] = None
        self._session: Optional[Session] = None
        self._last_heartbeat = 0.0
        self._closed = False
        self._namespace = namespace
        self._topics: List[str] = list(dict.fromkeys(t for t in topics if t))  # to declare
        self.declared: FrozenSet[str] = frozenset()  # the topics the proxy has accepted

    # ------------------------------------------------------------------ opening

    def connect(self) -> None:
        """Open the channel (once)."""
        if self._io is not None:
            return
        with self._lock:
            if self._closed:
                raise ClientClosed(_CLOSED)
            if self._io is not None:
                return
            credentials = None
            tls, verify, ca_file = self._tls
            if tls:  # may fetch the presented certificate: blocking, so not on the loop
                host, port = self.endpoints.first
                credentials = channel_credentials(host, port, verify, ca_file, self.timeout)
            io = shared_io_loop()
            try:
                io.run(self._open(credentials), self._wait_limit(1))
            except BaseException:
                if self._channel is not None:  # the loop is shared: close what _open made
                    try:
                        io.run(self._close_channel(), 5.0)
                    except Exception:  # noqa: BLE001 - the first error is the one to raise
                        pass
                raise
            self._io = io

    def _wait_limit(self, calls: int) -> float:
        """How long a caller waits for ``calls`` consecutive calls (each has its deadline)."""
        return calls * self.timeout + 5.0

    async def _open(self, credentials) -> None:
        options = [("grpc.enable_retries", 0), ("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", -1)]
        if credentials is None:
            channel = aio.insecure_channel(self.endpoints.target, options)
        else:
            channel_creds, extra_options = credentials
            channel = aio.secure_channel(self.endpoints.target, channel_creds,
                                         options + extra_options)
        self._channel = channel
        self._stub = service_grpc.MessagingServiceStub(channel)

    def introduce(self, topic: str) -> None:
        """Before a send to ``topic``: the settings over Telemetry (with ``topic`` among the
        topics) and a first Heartbeat, once; later, ``topic`` declared if it is new. Learns
        the largest body the proxy takes."""
        session = self._session
        if session is not None and session.ended is None and topic in self.declared:
            return
        self.connect()
        with self._lock:
            session = self._session
            if session is not None and session.ended is not None:
                log.info("the settings stream to proxy %s ended (%s); opening it again",
                         self.address, session.ended)
                self.run(self._end_session(session))
                self._session = session = None
            topics = self._topics + [topic] if topic not in self._topics else self._topics
            if session is None:
                self.run(self._start_session(topics), 2)
            elif topic not in self.declared:
                self.run(self._declare(session, topics))

    def _settings(self, topics: Sequence[str]) -> definition.Settings:
        return producer_settings(self.endpoints.to_proto(),
                                 topic_resources(topics, self._namespace), self.timeout,
                                 self._version)

    def _accepted(self, answer: definition.Settings, topics: Sequence[str]) -> None:
        if answer.HasField("publishing") and answer.publishing.max_body_size > 0:
            self.max_body_size = answer.publishing.max_body_size
        self._topics = list(topics)
        self.declared = frozenset(topics)

    async def _start_session(self, topics: Sequence[str]) -> None:
        session = Session(self._stub, self._metadata(), self.address)
        answer = await session.start(self._settings(topics), self.timeout)
        try:
            self._last_heartbeat = time.monotonic()
            await self._heartbeat()
        except BaseException:
            session.close()
            raise
        self._accepted(answer, topics)
        self._session = session

    async def _declare(self, session: Session, topics: Sequence[str]) -> None:
        """The settings again, with ``topics``; the proxy's answer before any send."""
        self._accepted(await session.update(self._settings(topics), self.timeout), topics)

    @staticmethod
    async def _end_session(session: Session) -> None:
        session.close()

    # ------------------------------------------------------------------ calls

    def run(self, coro: Awaitable, calls: int = 1) -> Any:
        """Run ``coro`` on the loop and wait (from a caller's thread) as long as ``calls``
        consecutive calls may take."""
        io = self._io
        if io is None:
            coro.close()
            raise ClientClosed(_CLOSED)
        try:
            return io.run(coro, self._wait_limit(calls))
        except RuntimeError:
            if self._closed:
                raise ClientClosed(_CLOSED) from None
            raise
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(self.address, "a call to the proxy", self.timeout) from None

    def call(self, method_name: str, request) -> Any:
        """A unary call (the stub's ``method_name``) from a caller's thread, waiting for its
        answer."""
        self.connect()
        return self.run(self._unary(getattr(self._stub, method_name), request, method_name))

    async def _unary(self, method, request, name: str):
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise status.rpc_error(exc, name, self.address, self.timeout) from None

    async def send_message(self, request: service.SendMessageRequest
                           ) -> service.SendMessageResponse:
        """(loop) One SendMessage call; a failed call raises its typed error."""
        return await self._unary(self._stub.SendMessage, request, "SendMessage")

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread."""
        io = self._io
        if io is None:
            raise ClientClosed(_CLOSED)
        try:
            io.call_soon(fn, *args)
        except RuntimeError:  # the loop is closed
            raise ClientClosed(_CLOSED) from None

    # ------------------------------------------------------------------ heartbeats

    def heartbeat_if_due(self) -> None:
        """Repeat the heartbeat in the background when ``HEARTBEAT_INTERVAL`` has passed."""
        if time.monotonic() - self._last_heartbeat > HEARTBEAT_INTERVAL:
            self._last_heartbeat = time.monotonic()
            self.call_soon(self._heartbeat_soon)

    async def _heartbeat(self) -> None:
        response = await self._unary(self._stub.Heartbeat, service.HeartbeatRequest(
            client_type=definition.PRODUCER), "Heartbeat")
        status.check(response.status, "Heartbeat", self.address)

    def _heartbeat_soon(self) -> None:
        """(loop) A heartbeat whose failure is only logged."""
        async def beat():
            try:
                await self._heartbeat()
            except RocketMQError as exc:
                log.info("heartbeat to proxy %s failed: %s", self.address, exc)
        asyncio.get_running_loop().create_task(beat())

    # ------------------------------------------------------------------ closing

    def close(self, first: Callable[[], None]) -> None:
        """Run ``first()`` on the loop (the producer fails its unsent calls), tell the proxy
        this client is gone, close the settings stream and the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            io, self._io = self._io, None
        if io is None:
            return
        try:
            io.run(self._shutdown(first), self._wait_limit(1))
        except Exception as exc:  # noqa: BLE001 - closing goes on regardless
            log.info("closing the GrpcProducer for proxy %s: %s", self.address, exc)

    async def _shutdown(self, first: Callable[[], None]) -> None:
        first()
        if self._session is not None:
            timeout = min(self.timeout, 2.0)
            try:
                await self._stub.NotifyClientTermination(
                    service.NotifyClientTerminationRequest(), timeout=timeout,
                    metadata=self._metadata())
            except grpc.RpcError as exc:
                log.info("NotifyClientTermination to proxy %s failed: %s", self.address,
                         status.rpc_error(exc, "NotifyClientTermination", self.address,
                                          timeout))
        await self._close_channel()

    async def _close_channel(self) -> None:
        if self._session is not None:
            self._session.close()
        if self._channel is not None:
            await self._channel.close()
