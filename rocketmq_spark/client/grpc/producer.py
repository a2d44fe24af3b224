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

Before the first send the producer declares itself as the official clients do: its settings over
a Telemetry stream (the proxy answers with the largest body it takes), then a Heartbeat; the
heartbeat is repeated every ``HEARTBEAT_INTERVAL`` seconds while the producer sends.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from ... import __version__
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
from .dispatch import Call, Dispatcher
from .endpoints import ProxyEndpoints, parse_endpoints
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

    def _expect(self, calls: int) -> None:
        self._remaining = calls
        if calls == 0:
            self._done.set()

    def _part_done(self, indexes: Sequence[int], results: Optional[list],
                   error: Optional[BaseException]) -> None:
        with self._lock:
            if error is not None:
                self._error = self._error or error
            else:
                for i, r in zip(indexes, results):
                    self._results[i] = r
            self._remaining -= 1
            finished = self._remaining == 0
            callbacks = list(self._callbacks) if finished else []
        if finished:
            self._done.set()
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


class GrpcProducer:
    """Sends messages through the 5.x proxy at ``endpoints`` (``host:port[;host:port]``).

    ``tls`` (default on, as the proxy serves it) verifies the proxy's certificate against
    ``tls_ca_file`` or the system's roots; ``tls_verify=False`` trusts the certificate the
    proxy presents (its self-signed test certificate). ``credentials`` sign every call (the
    proxy's ACL). ``send_timeout`` is each call's deadline; at most ``max_in_flight`` calls
    are pending at once, the rest wait in order. ``multi_message_calls``: see the module
    docstring (off: one message per call, what Apache's proxy stores faithfully). Thread-safe.
    """

    def __init__(self, endpoints: str, *, group: str = "rocketmq-spark-producer",
                 credentials: Optional[Credentials] = None, tls: bool = True,
                 tls_verify: bool = True, tls_ca_file: Optional[str] = None,
                 namespace: str = "", send_timeout: float = 5.0, max_in_flight: int = 64,
                 multi_message_calls: bool = False):
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
        self.client_id = auth.new_client_id()
        self.max_body_size = DEFAULT_MAX_BODY_SIZE
        self._address = str(self.endpoints)
        self.multi_message_calls = multi_message_calls
        self._dispatcher = Dispatcher(max_in_flight)
        self._lock = threading.Lock()
        self._channel: Optional[grpc.Channel] = None
        self._stub: Optional[rpc.MessagingServiceStub] = None
        self._session: Optional[Session] = None
        self._routes: Dict[str, _Route] = {}
        self._last_heartbeat = 0.0
        self._closed = False

    def __repr__(self) -> str:
        return (f"GrpcProducer(endpoints={self._address!r}, tls={self.tls}, "
                f"credentials={'<hidden>' if self.credentials else None})")

    # ------------------------------------------------------------------ connection

    def _metadata(self) -> List[Tuple[str, str]]:
        return auth.request_metadata(self.client_id, self.namespace, VERSION, self.credentials)

    def _connect(self) -> rpc.MessagingServiceStub:
        """The stub, after the settings exchange and a first heartbeat (once)."""
        stub = self._stub
        if stub is not None:
            return stub
        with self._lock:
            if self._closed:
                raise ClientClosed("the GrpcProducer is closed")
            if self._stub is not None:
                return self._stub
            channel = self._open_channel()
            try:
                stub = rpc.MessagingServiceStub(channel)
                session = Session(stub, self._metadata(), self._address)
                answer = session.start(producer_settings(
                    self.endpoints.to_proto(), [], self.send_timeout, VERSION), self.send_timeout)
                if answer.HasField("publishing") and answer.publishing.max_body_size > 0:
                    self.max_body_size = answer.publishing.max_body_size
                self._heartbeat(stub, wait=True)
            except BaseException:
                channel.close()
                raise
            self._channel, self._session, self._stub = channel, session, stub
            return stub

    def _open_channel(self) -> grpc.Channel:
        options = [("grpc.enable_retries", 0), ("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", -1)]
        if not self.tls:
            return grpc.insecure_channel(self.endpoints.target, options)
        host, port = self.endpoints.first
        credentials, extra = channel_credentials(host, port, self.tls_verify, self.tls_ca_file,
                                                 self.send_timeout)
        return grpc.secure_channel(self.endpoints.target, credentials, options + extra)

    def _heartbeat(self, stub: rpc.MessagingServiceStub, wait: bool = False) -> None:
        self._last_heartbeat = time.monotonic()
        request = spb.HeartbeatRequest(client_type=pb.PRODUCER)
        if wait:
            response = self._unary(stub.Heartbeat, request, "Heartbeat")
            S.check(response.status, "Heartbeat", self._address)
            return
        future = stub.Heartbeat.future(request, timeout=self.send_timeout,
                                       metadata=self._metadata())
        future.add_done_callback(self._heartbeat_done)

    def _heartbeat_done(self, future) -> None:
        try:
            S.check(future.result().status, "Heartbeat", self._address)
        except (grpc.RpcError, RocketMQError) as exc:
            log.info("heartbeat to proxy %s failed: %s", self._address, exc)

    def _unary(self, method, request, name: str):
        try:
            return method(request, timeout=self.send_timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise S.rpc_error(exc, name, self._address, self.send_timeout) from None

    # ------------------------------------------------------------------ routes

    def _route(self, topic: str, refresh: bool = False) -> _Route:
        route = self._routes.get(topic)
        if route is not None and not refresh and time.monotonic() - route.fetched < ROUTE_TTL:
            return route
        stub = self._connect()
        response = self._unary(stub.QueryRoute, spb.QueryRouteRequest(
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
        for i, m in enumerate(messages):
            size = len(m.body)
            if size == 0:
                raise ValueError(f"message {i} of the call has an empty body; the 5.x proxy "
                                 "refuses empty bodies")
            if size > self.max_body_size:
                raise ValueError(f"message {i} of the call has a body of {size:,} bytes; the "
                                 f"proxy takes at most {self.max_body_size:,}")
            kind = convert.message_type(m)
            if route.accepts and kind not in route.accepts:
                taken = ", ".join(sorted(MESSAGE_TYPE_NAMES.get(t, str(t))
                                         for t in route.accepts))
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
        if queue is not None and queue.topic != messages[0].topic if messages else False:
            raise ValueError(f"queue {queue} is not of topic {messages[0].topic!r}")
        if not messages:
            raise ValueError("send_async needs at least one message")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("all messages of one send_async must have the same topic")
        route = self._route(topic)
        self._check(messages, route)
        now_ms = int(time.time() * 1000)
        protos = [convert.to_proto(m, self.namespace, now_ms) for m in messages]
        stub = self._connect()
        if time.monotonic() - self._last_heartbeat > HEARTBEAT_INTERVAL:
            self._heartbeat(stub)
        future = GrpcSendFuture(len(messages), self._address)
        unknown = MessageQueue(topic, "", convert.UNKNOWN_QUEUE_ID)
        calls: List[Call] = []
        plain = [i for i, m in enumerate(messages) if not m.sharding_key]
        if self.multi_message_calls and len(plain) > 1:
            calls.append(self._call(stub, future, plain, protos, unknown, None))
            plain = []
        for i in plain:
            calls.append(self._call(stub, future, [i], protos, unknown, None))
        for i, m in enumerate(messages):
            if m.sharding_key:
                target = queue_for_group(route.queues, m.sharding_key) if route.queues else unknown
                calls.append(self._call(stub, future, [i], protos, target, m.sharding_key))
        future._expect(len(calls))
        self._dispatcher.submit(calls, self.send_timeout)
        return future

    def _call(self, stub, future: GrpcSendFuture, indexes: List[int], protos: List[pb.Message],
              target: MessageQueue, group: Optional[str]) -> Call:
        request = spb.SendMessageRequest(messages=[protos[i] for i in indexes])
        ids = [protos[i].system_properties.message_id for i in indexes]

        def start():
            return stub.SendMessage.future(request, timeout=self.send_timeout,
                                           metadata=self._metadata())

        def finish(call) -> List[SendResult]:
            try:
                response = call.result()
            except grpc.FutureCancelledError:
                raise ClientClosed("the SendMessage call was cancelled (producer closed)") \
                    from None
            except grpc.RpcError as exc:
                raise S.rpc_error(exc, "SendMessage", self._address, self.send_timeout) \
                    from None
            return convert.send_results(response, ids, target, self._address)

        return Call(start, finish, group,
                    lambda results, error: future._part_done(indexes, results, error))

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
            self._dispatcher.close("the GrpcProducer is closed")
            stub, session, channel = self._stub, self._session, self._channel
            self._stub = self._session = self._channel = None
        if stub is not None:
            try:
                stub.NotifyClientTermination(
                    spb.NotifyClientTerminationRequest(), timeout=min(self.send_timeout, 2.0),
                    metadata=self._metadata())
            except grpc.RpcError as exc:
                log.info("NotifyClientTermination to proxy %s failed: %s", self._address,
                         S.rpc_error(exc, "NotifyClientTermination", self._address, 2.0))
        if session is not None:
            session.close()
        if channel is not None:
            channel.close()

    def __enter__(self) -> "GrpcProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["GrpcProducer", "GrpcSendFuture", "ProxyError"]
