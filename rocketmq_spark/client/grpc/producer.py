"""GrpcProducer: sends messages through a RocketMQ 5.x proxy's gRPC endpoint.

The proxy picks the queue of every SendMessage call (see :mod:`.queue_choice`): a message with
a sharding key keeps its group's queue only when it is sent alone, so FIFO messages go one per
call, a group's next one after the previous one is answered (for order).

A call may carry several messages, but Apache's proxy (5.x, through 5.3 at least) forwards
them to the broker as one batch whose header holds the *first* message's properties, and the
broker appends those to every message of the batch: every message then reads back with the
first one's id (UNIQ_KEY), tags, keys and properties. So by default every message goes in a
call of its own (many calls in flight); ``multi_message_calls=True`` packs the non-FIFO
messages of one :meth:`GrpcProducer.send_async` into one call, for a proxy known to keep each
message's own properties.

The producer introduces itself as the official clients do: QueryRoute for a topic first, then,
before the first send, its settings over a Telemetry stream (the proxy answers with the largest
body it takes) and a Heartbeat; the heartbeat is repeated every ``HEARTBEAT_INTERVAL`` seconds
while the producer sends.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import grpc
from grpc import aio

from ..version import __version__
from ..acl import Credentials
from ..errors import ClientClosed, ProxyError, RequestTimeout, RocketMQError, RouteNotFound
from ..producer import Message, SendResult
from ..protocol.route import MessageQueue
from . import auth
from . import convert
from . import definition_pb2 as pb
from . import service_pb2 as spb
from . import service_pb2_grpc as rpc
from . import status as S
from . import wire
from .dispatch import Call, Dispatcher
from .endpoints import ProxyEndpoints, parse_endpoints
from .io_loop import IoLoop, shared_io_loop
from .queue_choice import queue_for_group
from .telemetry import Session, producer_settings
from .tls import channel_credentials

log = logging.getLogger(__name__)

VERSION = f"rocketmq-spark/{__version__}"
HEARTBEAT_INTERVAL = 10.0
ROUTE_TTL = 30.0
DEFAULT_MAX_BODY_SIZE = 4 * 1024 * 1024
MESSAGE_TYPE_NAMES = {pb.NORMAL: "NORMAL", pb.FIFO: "FIFO", pb.DELAY: "DELAY",
                      pb.TRANSACTION: "TRANSACTION"}
_WRITABLE = (pb.WRITE, pb.READ_WRITE)
SEND_MESSAGE = "/apache.rocketmq.v2.MessagingService/SendMessage"
MAX_QUEUED = 100_000  # messages submitted and not yet answered, before a send waits


class _Route:
    """What QueryRoute said about a topic: its writable queues and the message types taken."""

    def __init__(self, queues: List[MessageQueue], accepts: frozenset, fetched: float):
        self.queues = queues
        self.accepts = accepts
        self.fetched = fetched


class GrpcSendFuture:
    """The outcome of one :meth:`GrpcProducer.send_async`: :meth:`result` gives one SendResult
    per message (in the order given) or raises the first failure, a
    :class:`~rocketmq_spark.client.errors.RocketMQError`."""

    def __init__(self, count: int, address: str):
        self._results: List[Optional[SendResult]] = [None] * count
        self._error: Optional[BaseException] = None
        self._remaining = 0
        self._address = address
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: List[Callable[["GrpcSendFuture"], None]] = []
        self._on_finish: Optional[Callable[[], None]] = None

    def _expect(self, calls: int, on_finish: Optional[Callable[[], None]] = None) -> None:
        self._remaining = calls
        self._on_finish = on_finish
        if calls == 0:
            self._finish()

    def _call_done(self, call, results: Optional[list],
                   error: Optional[BaseException]) -> None:
        """One call's outcome (on the producer's loop)."""
        indexes = call.context[0]
        with self._lock:
            if error is not None:
                self._error = self._error or error
            else:
                for i, r in zip(indexes, results):
                    self._results[i] = r
            self._remaining -= 1
            if self._remaining:
                return
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        if self._on_finish is not None:
            self._on_finish()
        for fn in callbacks:
            _run_callback(fn, self)

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[["GrpcSendFuture"], None]) -> None:
        """Call ``fn(self)`` when every call has been answered (at once if they have)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def result(self, timeout: Optional[float] = None) -> List[SendResult]:
        if not self._done.wait(timeout):
            raise RequestTimeout(self._address, "SendMessage (waiting for its result)",
                                 timeout or 0.0)
        if self._error is not None:
            raise self._error
        return list(self._results)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        try:
            self.result(timeout)
        except RocketMQError as exc:
            return exc
        return None


def _run_callback(fn, future) -> None:
    try:
        fn(future)
    except Exception:  # noqa: BLE001 - a callback's bug must not break the producer
        log.exception("a GrpcSendFuture callback raised")


class _Budget:
    """How many messages may be submitted and not yet answered: a send waits for room."""

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._closed = False
        self._cv = threading.Condition()

    def take(self, n: int, timeout: float, address: str) -> None:
        with self._cv:
            if not self._cv.wait_for(lambda: self._closed or self._used == 0
                                     or self._used + n <= self.limit, timeout):
                raise RequestTimeout(address, "SendMessage (waiting for queue space)", timeout)
            if self._closed:
                raise ClientClosed("the GrpcProducer is closed")
            self._used += n

    def give(self, n: int) -> None:
        with self._cv:
            self._used -= n
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class GrpcProducer:
    """Sends messages through the 5.x proxy at ``endpoints`` (``host:port[;host:port]``).

    ``tls`` (default on, as the proxy serves it) verifies the proxy's certificate against
    ``tls_ca_file`` or the system's roots; ``tls_verify=False`` trusts the certificate the
    proxy presents (its self-signed test certificate). ``credentials`` sign every call (the
    proxy's ACL). ``send_timeout`` is each call's deadline; at most ``max_in_flight`` calls
    are pending at once, the rest wait in order. ``multi_message_calls``: see the module
    docstring (off: one message per call, what Apache's proxy stores faithfully). Thread-safe.

    The calls run on an event loop in a thread of the producer's own (grpc.aio), so a call
    costs no thread hand-off of its own: callbacks added to a :class:`GrpcSendFuture` run on
    that thread and must not block.
    """

    def __init__(self, endpoints: str, *, group: str = "rocketmq-spark-producer",
                 credentials: Optional[Credentials] = None, tls: bool = True,
                 tls_verify: bool = True, tls_ca_file: Optional[str] = None,
                 namespace: str = "", send_timeout: float = 5.0, max_in_flight: int = 64,
                 multi_message_calls: bool = False, max_queued: int = MAX_QUEUED):
        self.endpoints: ProxyEndpoints = parse_endpoints(endpoints)
        if send_timeout <= 0:
            raise ValueError(f"send_timeout must be positive, got {send_timeout}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.group = group
        self.credentials = credentials
        self.tls = tls
        self.tls_verify = tls_verify
        self.tls_ca_file = tls_ca_file
        self.namespace = namespace or ""
        self.send_timeout = send_timeout
        self.max_in_flight = max_in_flight
        self.client_id = auth.new_client_id()
        self.max_body_size = DEFAULT_MAX_BODY_SIZE
        self._address = str(self.endpoints)
        self.multi_message_calls = multi_message_calls
        self._metadata = auth.CallMetadata(self.client_id, self.namespace, VERSION, credentials)
        self._budget = _Budget(max_queued)
        self._lock = threading.Lock()
        self._io: Optional[IoLoop] = None
        self._channel: Optional[aio.Channel] = None
        self._stub: Optional[rpc.MessagingServiceStub] = None
        self._send_call = None
        self._dispatcher: Optional[Dispatcher] = None
        self._session: Optional[Session] = None
        self._routes: Dict[str, _Route] = {}
        self._last_heartbeat = 0.0
        self._closed = False

    def __repr__(self) -> str:
        return (f"GrpcProducer(endpoints={self._address!r}, tls={self.tls}, "
                f"credentials={'<hidden>' if self.credentials else None})")

    # ------------------------------------------------------------------ connection

    def _connect(self) -> IoLoop:
        """The I/O loop with the channel open (once)."""
        io = self._io
        if io is not None:
            return io
        with self._lock:
            if self._closed:
                raise ClientClosed("the GrpcProducer is closed")
            if self._io is not None:
                return self._io
            credentials = None
            if self.tls:  # may fetch the presented certificate: blocking, so not on the loop
                host, port = self.endpoints.first
                credentials = channel_credentials(host, port, self.tls_verify,
                                                  self.tls_ca_file, self.send_timeout)
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
            return io

    def _wait_limit(self, calls: int) -> float:
        """How long a caller waits for ``calls`` consecutive calls (each has its deadline)."""
        return calls * self.send_timeout + 5.0

    async def _open(self, credentials) -> None:
        options = [("grpc.enable_retries", 0), ("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", -1)]
        if credentials is None:
            channel = aio.insecure_channel(self.endpoints.target, options)
        else:
            creds, extra = credentials
            channel = aio.secure_channel(self.endpoints.target, creds, options + extra)
        self._channel = channel
        self._stub = rpc.MessagingServiceStub(channel)
        # SendMessage takes the request serialized already (see wire.py).
        self._send_call = channel.unary_unary(
            SEND_MESSAGE, request_serializer=None,
            response_deserializer=spb.SendMessageResponse.FromString, _registered_method=True)
        self._dispatcher = Dispatcher(self.max_in_flight, self._invoke)

    def _declare(self, io: IoLoop) -> None:
        """Before the first send, as the official clients do after their first QueryRoute:
        the settings over a Telemetry stream, then a first Heartbeat (once)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is None:
                self._run(io, self._start_session(), 2)

    async def _start_session(self) -> None:
        session = Session(self._stub, self._metadata(), self._address)
        answer = await session.start(producer_settings(
            self.endpoints.to_proto(), [], self.send_timeout, VERSION), self.send_timeout)
        try:
            if answer.HasField("publishing") and answer.publishing.max_body_size > 0:
                self.max_body_size = answer.publishing.max_body_size
            self._last_heartbeat = time.monotonic()
            response = await self._unary(self._stub.Heartbeat, spb.HeartbeatRequest(
                client_type=pb.PRODUCER), "Heartbeat")
            S.check(response.status, "Heartbeat", self._address)
        except BaseException:
            session.close()
            raise
        self._session = session

    def _run(self, io: IoLoop, coro, calls: int = 1):
        """Run ``coro`` on the loop and wait (from a caller's thread)."""
        try:
            return io.run(coro, self._wait_limit(calls))
        except RuntimeError:
            if self._closed:
                raise ClientClosed("the GrpcProducer is closed") from None
            raise
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(self._address, "a call to the proxy",
                                 self.send_timeout) from None

    async def _close_channel(self) -> None:
        if self._session is not None:
            self._session.close()
        if self._channel is not None:
            await self._channel.close()

    async def _unary(self, method, request, name: str):
        try:
            return await method(request, timeout=self.send_timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise S.rpc_error(exc, name, self._address, self.send_timeout) from None

    def _call(self, method_name: str, request, name: str):
        """A unary call from a caller's thread, waiting for its answer."""
        io = self._connect()
        return self._run(io, self._unary(getattr(self._stub, method_name), request, name))

    def _heartbeat_soon(self) -> None:
        """(loop) Repeat the heartbeat in the background; a failure is only logged."""
        async def beat():
            try:
                response = await self._unary(self._stub.Heartbeat, spb.HeartbeatRequest(
                    client_type=pb.PRODUCER), "Heartbeat")
                S.check(response.status, "Heartbeat", self._address)
            except RocketMQError as exc:
                log.info("heartbeat to proxy %s failed: %s", self._address, exc)
        asyncio.get_running_loop().create_task(beat())

    # ------------------------------------------------------------------ routes

    def _route(self, topic: str, refresh: bool = False) -> _Route:
        route = self._routes.get(topic)
        if route is not None and not refresh and time.monotonic() - route.fetched < ROUTE_TTL:
            return route
        response = self._call("QueryRoute", spb.QueryRouteRequest(
            topic=pb.Resource(name=topic, resource_namespace=self.namespace),
            endpoints=self.endpoints.to_proto()), "QueryRoute")
        if response.status.code == pb.TOPIC_NOT_FOUND:
            raise RouteNotFound(topic, f"the proxy knows no topic {topic!r} "
                                       f"({response.status.message})".rstrip(),
                                self._address)
        S.check(response.status, "QueryRoute", self._address)
        # The route's queue ids need not be the broker's (Apache lists read-only ones first);
        # a broker with n writable entries takes writes on its queues 0..n-1.
        writable: Dict[str, int] = {}
        accepts = set()
        for q in response.message_queues:
            if q.permission in _WRITABLE and q.broker.id == 0:
                writable[q.broker.name] = writable.get(q.broker.name, 0) + 1
                accepts.update(q.accept_message_types)
        queues = [MessageQueue(topic, name, i) for name, n in writable.items() for i in range(n)]
        route = _Route(sorted(queues), frozenset(accepts), time.monotonic())
        self._routes[topic] = route
        return route

    def queues(self, topic: str, refresh: bool = False) -> List[MessageQueue]:
        """The writable queues of ``topic`` (QueryRoute; cached for ``ROUTE_TTL`` seconds).
        Unlike a 4.x broker the proxy never creates a topic: an unknown one is RouteNotFound."""
        queues = self._route(topic, refresh).queues
        if not queues:
            raise RouteNotFound(topic, f"topic {topic!r} has no writable queue", self._address)
        return list(queues)

    # ------------------------------------------------------------------ sending

    def _check(self, messages: Sequence[Message], route: _Route) -> None:
        accepts = route.accepts
        limit = self.max_body_size
        for i, m in enumerate(messages):
            size = len(m.body)
            if size == 0:
                raise ValueError(f"message {i} of the call has an empty body; the 5.x proxy "
                                 "refuses empty bodies")
            if size > limit:
                raise ValueError(f"message {i} of the call has a body of {size:,} bytes; the "
                                 f"proxy takes at most {limit:,}")
            kind = convert.message_type(m)
            if accepts and kind not in accepts:
                taken = ", ".join(sorted(MESSAGE_TYPE_NAMES.get(t, str(t)) for t in accepts))
                raise ValueError(f"topic {m.topic!r} takes {taken} messages only; message {i} "
                                 f"is {MESSAGE_TYPE_NAMES[kind]}")

    def send_async(self, messages: Sequence[Message],
                   queue: Optional[MessageQueue] = None) -> GrpcSendFuture:
        """Send ``messages`` (one topic) through the proxy; the future's result has one
        SendResult per message, in order. A FIFO message (``sharding_key``) goes alone to its
        group's queue, after the group's previous message was answered; the others go one per
        call, or all in one call with ``multi_message_calls``. ``queue`` is accepted for the
        remoting producer's signature but does not place anything: the 5.x proxy chooses every
        call's queue itself; each result's ``queue`` says what is known of it.

        Raises ValueError for messages the 5.x API cannot carry, before sending anything."""
        if not messages:
            raise ValueError("send_async needs at least one message")
        topic = messages[0].topic
        if queue is not None and queue.topic != topic:
            raise ValueError(f"queue {queue} is not of topic {topic!r}")
        if any(m.topic != topic for m in messages):
            raise ValueError("all messages of one send_async must have the same topic")
        route = self._route(topic)
        io = self._connect()
        self._declare(io)  # (learns the largest body the proxy takes)
        self._check(messages, route)
        now_ms = int(time.time() * 1000)
        writer = wire.RequestWriter(topic, self.namespace, convert.BORN_HOST, now_ms)
        encoded = [convert.encode(writer, m, now_ms) for m in messages]
        count = len(messages)
        future = GrpcSendFuture(count, self._address)
        unknown = MessageQueue(topic, "", convert.UNKNOWN_QUEUE_ID)
        calls: List[Call] = []
        part_done = future._call_done
        plain = [i for i, m in enumerate(messages) if not m.sharding_key]
        if self.multi_message_calls and len(plain) > 1:
            calls.append(Call(writer.request([encoded[i][0] for i in plain]), None, part_done,
                              (plain, [encoded[i][1] for i in plain], unknown)))
            plain = []
        for i in plain:
            body, mid = encoded[i]
            calls.append(Call(writer.request((body,)), None, part_done, ((i,), (mid,), unknown)))
        for i, m in enumerate(messages):
            if m.sharding_key:
                target = queue_for_group(route.queues, m.sharding_key) if route.queues else unknown
                body, mid = encoded[i]
                calls.append(Call(writer.request((body,)), m.sharding_key, part_done,
                                  ((i,), (mid,), target)))
        self._budget.take(count, self.send_timeout, self._address)
        future._expect(len(calls), lambda: self._budget.give(count))
        if time.monotonic() - self._last_heartbeat > HEARTBEAT_INTERVAL:
            self._last_heartbeat = time.monotonic()
            self._submit(io, self._heartbeat_soon)
        self._submit(io, self._dispatcher.submit, calls)
        return future

    def _submit(self, io: IoLoop, fn, *args) -> None:
        try:
            io.call_soon(fn, *args)
        except RuntimeError:  # the loop is closed: close() ran meanwhile
            raise ClientClosed("the GrpcProducer is closed") from None

    async def _invoke(self, call: Call) -> List[SendResult]:
        """(loop) One SendMessage call: its results, or the error it ended with."""
        try:
            response = await self._send_call(call.request, timeout=self.send_timeout,
                                             metadata=self._metadata())
        except grpc.RpcError as exc:
            raise S.rpc_error(exc, "SendMessage", self._address, self.send_timeout) from None
        _, ids, target = call.context
        return convert.send_results(response, ids, target, self._address)

    def send(self, messages: Sequence[Message],
             queue: Optional[MessageQueue] = None) -> List[SendResult]:
        """:meth:`send_async` and wait: one SendResult per message."""
        return self.send_async(messages, queue).result()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Tell the proxy this client is gone, close the settings stream and the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            io, self._io = self._io, None
        self._budget.close()
        if io is None:
            return
        try:
            io.run(self._shutdown(), self._wait_limit(1))
        except Exception as exc:  # noqa: BLE001 - closing goes on regardless
            log.info("closing the GrpcProducer for proxy %s: %s", self._address, exc)

    async def _shutdown(self) -> None:
        self._dispatcher.close("the GrpcProducer is closed")
        if self._session is not None:
            timeout = min(self.send_timeout, 2.0)
            try:
                await self._stub.NotifyClientTermination(
                    spb.NotifyClientTerminationRequest(), timeout=timeout,
                    metadata=self._metadata())
            except grpc.RpcError as exc:
                log.info("NotifyClientTermination to proxy %s failed: %s", self._address,
                         S.rpc_error(exc, "NotifyClientTermination", self._address, timeout))
        await self._close_channel()

    def __enter__(self) -> "GrpcProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["GrpcProducer", "GrpcSendFuture", "ProxyError"]
