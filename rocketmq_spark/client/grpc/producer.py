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

The producer introduces itself as the official clients do: QueryRoute for a topic first
(:mod:`.routes`), then, before the first send, its settings and a Heartbeat
(:mod:`.channel`). The settings name the topics it publishes to (Apache's proxy refuses
settings without one): ``topics`` and, before the first send to any other topic, that topic,
by sending the settings again and waiting for the proxy's answer. :mod:`.send_calls` turns a
send into calls, :mod:`.dispatch` runs them and
:class:`~.send_future.GrpcSendFuture` collects their results.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..acl import Credentials
from ..send.backpressure import BusyLog
from ..errors import ProxyError, RouteNotFound
from ..send.producer import Message, SendResult
from ..protocol.route import MessageQueue
from ..version import __version__
from . import auth
from . import convert
from .channel import ProxyChannel
from .dispatch import Call, Dispatcher
from .endpoints import ProxyEndpoints, parse_endpoints
from .routes import RouteCache
from .send_calls import CallContext, SendBudget, check_messages, plan_calls
from .send_future import GrpcSendFuture

VERSION = f"rocketmq-spark/{__version__}"
MAX_QUEUED = 100_000  # messages submitted and not yet answered, before a send waits


class GrpcProducer:
    """Sends messages through the 5.x proxy at ``endpoints`` (``host:port[;host:port]``).

    ``tls`` (default on, as the proxy serves it) verifies the proxy's certificate against
    ``tls_ca_file`` or the system's roots; ``tls_verify=False`` trusts the certificate the
    proxy presents (its self-signed test certificate). ``credentials`` sign every call (the
    proxy's ACL). ``topics``: the topics declared in the first settings (others are declared
    when first sent to). ``namespace`` (a 5.x namespace, "" for none) goes into every
    resource (topics of the settings, routes and messages) and the ``x-mq-namespace`` header;
    the proxy stores the topic as ``namespace%topic``. ``send_timeout`` is each call's
    deadline; at most ``max_in_flight`` calls are pending at once, the rest wait in order.
    ``multi_message_calls``: see the module docstring (off: one message per call, what
    Apache's proxy stores faithfully). Thread-safe.
    A busy broker behind the proxy makes it answer TOO_MANY_REQUESTS: a future's result then
    says which messages were refused (:class:`~..send.backpressure.PartlyRefused`) for a
    :class:`~..send.pipeline.SendPipeline` to send again after a backoff.

    The calls run on an event loop in a thread of the producer's own (grpc.aio), so a call
    costs no thread hand-off of its own: callbacks added to a :class:`GrpcSendFuture` run on
    that thread and must not block.
    """

    def __init__(self, endpoints: str, *, group: str = "rocketmq-spark-producer",
                 credentials: Optional[Credentials] = None, tls: bool = True,
                 tls_verify: bool = True, tls_ca_file: Optional[str] = None,
                 namespace: str = "", send_timeout: float = 5.0, max_in_flight: int = 64,
                 multi_message_calls: bool = False, max_queued: int = MAX_QUEUED,
                 topics: Sequence[str] = ()):
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
        self.multi_message_calls = multi_message_calls
        self.client_id = auth.new_client_id()
        self._address = str(self.endpoints)
        metadata = auth.CallMetadata(self.client_id, self.namespace, VERSION, credentials)
        self._channel = ProxyChannel(self.endpoints, metadata, VERSION, tls=tls,
                                     tls_verify=tls_verify, tls_ca_file=tls_ca_file,
                                     timeout=send_timeout, topics=topics,
                                     namespace=self.namespace)
        self._routes = RouteCache(self.endpoints, self.namespace,
                                  lambda request: self._channel.call("QueryRoute", request))
        self._dispatcher = Dispatcher(max_in_flight, self._invoke)
        self._budget = SendBudget(max_queued)
        self.busy_log = BusyLog()  # TOO_MANY_REQUESTS answers, logged once a minute

    def __repr__(self) -> str:
        return (f"GrpcProducer(endpoints={self._address!r}, tls={self.tls}, "
                f"credentials={'<hidden>' if self.credentials else None})")

    @property
    def max_body_size(self) -> int:
        """The largest body the proxy takes (its settings' answer, once introduced)."""
        return self._channel.max_body_size

    def queues(self, topic: str, refresh: bool = False) -> List[MessageQueue]:
        """The writable queues of ``topic`` (QueryRoute; cached for ``routes.ROUTE_TTL``
        seconds). Unlike a 4.x broker the proxy never creates a topic: an unknown one is
        RouteNotFound."""
        queues = self._routes.route(topic, refresh).queues
        if not queues:
            raise RouteNotFound(topic, f"topic {topic!r} has no writable queue", self._address)
        return list(queues)

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
        route = self._routes.route(topic)
        channel = self._channel
        channel.introduce(topic)  # settings naming the topic (and the largest body taken)
        check_messages(messages, route, channel.max_body_size)
        count = len(messages)
        future = GrpcSendFuture(count, self._address)
        calls = plan_calls(messages, route, self.namespace, self.multi_message_calls,
                           future.record)
        self._budget.take(count, self.send_timeout, self._address)
        future.expect(len(calls), lambda: self._budget.give(count))
        channel.heartbeat_if_due()
        channel.call_soon(self._dispatcher.submit, calls)
        return future

    async def _invoke(self, call: Call) -> List[SendResult]:
        """(loop) One SendMessage call: its results, or the error it ended with."""
        response = await self._channel.send_message(call.request)
        context: CallContext = call.context
        return convert.send_results(response, context.message_ids, context.queue,
                                    self._address)

    def send(self, messages: Sequence[Message],
             queue: Optional[MessageQueue] = None) -> List[SendResult]:
        """:meth:`send_async` and wait: one SendResult per message."""
        return self.send_async(messages, queue).result()

    def close(self) -> None:
        """Fail the calls not yet sent, tell the proxy this client is gone, close the
        settings stream and the channel."""
        self._budget.close()
        self._channel.close(lambda: self._dispatcher.close("the GrpcProducer is closed"))

    def __enter__(self) -> "GrpcProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["GrpcProducer", "GrpcSendFuture", "ProxyError"]
