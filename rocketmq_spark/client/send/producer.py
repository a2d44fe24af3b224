"""A producer: single and batch sends, queue choice, topic auto-creation through TBW102.

Big volumes go through :meth:`Producer.send_many` (or a :class:`~.pipeline.SendPipeline` fed
with :class:`EncodedRequest` payloads, as the Spark sink does): batches of one queue each,
several requests in flight per broker, retries on another broker.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..broker import BrokerClient, SendResponse, send_command
from ..config import ClientConfig
from ..errors import RocketMQError, RouteNotFound
from ..masters import master_address
from ..nameserver import NameServerClient
from ..busy import DEFAULT_BUSY_TIMEOUT, is_busy
from .backpressure import BusyClock, BusyLog, SendWindow
from .encoding import (
    BATCH_HEADER_PROPERTIES, MAX_MESSAGE_SIZE, MessageTooLarge, size_problem,
)
from .pipeline import SEND_OK, BrokerStayedBusy, Outgoing, SendPipeline
from ..protocol import properties
from ..protocol.message import (
    COMPRESSION_ZLIB, BatchEntry, compress_body, encode_batch, new_uniq_key,
)
from ..protocol.codes import DEFAULT_TOPIC, SEND_V2_KEYS
from ..protocol.route import MessageQueue, TopicRouteData
from ..responses import is_transient
from ..remoting import RemotingClient

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = 1024 * 1024
MAX_DELAY_LEVEL = 18


@dataclass
class Message:
    """A message to send. ``keys`` may be one string or several (stored space-separated).

    ``sharding_key``: messages with the same key belong together in order (RocketMQ's ordered
    messages; stored as ``__SHARDINGKEY``); :meth:`Producer.send_many` sends them to one
    queue, the one Java's ``SelectMessageQueueByHash`` picks for the key. ``delay_level``:
    1-18, deliver after that delay level (stored as ``DELAY``). ``uniq_key``: the message id
    (``UNIQ_KEY``); a fresh one is made when it is None."""

    topic: str
    body: bytes
    tags: Optional[str] = None
    keys: Union[str, Sequence[str], None] = None
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sharding_key: Optional[str] = None
    delay_level: int = 0
    uniq_key: Optional[str] = None

    def property_map(self, uniq_key: str) -> Dict[str, str]:
        props = dict(self.properties)
        if self.keys:
            keys = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
            props[properties.KEYS] = keys
        if self.tags:
            props[properties.TAGS] = self.tags
        if self.sharding_key:
            props[properties.SHARDING_KEY] = self.sharding_key
        if self.delay_level:
            props[properties.DELAY] = str(self.delay_level)
        props.setdefault(properties.UNIQ_KEY, self.uniq_key or uniq_key)
        props.setdefault(properties.WAIT, "true")
        return props


@dataclass
class SendResult:
    status: str
    msg_id: str             # the client id (UNIQ_KEY); the first one for a batch
    offset_msg_id: str      # the broker's id(s)
    queue: MessageQueue
    queue_offset: int       # the first message's offset for a batch
    address: str = ""       # the broker that answered (END_TRANSACTION goes there)
    transaction_id: str = ""  # a half message's, from the send response


@dataclass
class EncodedRequest:
    """A send request's body and header fields, ready for any queue of its topic.

    ``batch``: ``body`` is a SEND_BATCH_MESSAGE body (:func:`~..protocol.message.encode_batch`)
    and ``properties`` the batch header's (WAIT only: a header UNIQ_KEY would override every
    message's own). Otherwise ``body`` is one message's and ``properties`` its own.
    ``sys_flag`` carries the compression bits (for a batch: of every message in it)."""

    body: bytes
    properties: str
    sys_flag: int = 0
    flag: int = 0
    batch: bool = False
    first_id: str = ""


@dataclass
class EncodedRun:
    """Single messages for one queue, each its own request, written to the socket together.

    For messages a broker refuses in a batch (half messages of a transaction): a request per
    message, but neither a system call nor a Python object per message. ``bodies`` and
    ``properties`` are Arrow binary columns (properties as UTF-8 text); ``ids`` the messages'
    UNIQ_KEYs, in the same order."""

    bodies: Any
    properties: Any
    ids: List[str]
    sys_flag: int = 0
    flag: int = 0

    def __len__(self) -> int:
        return len(self.ids)


def queue_for_key(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    """The queue Java's ``SelectMessageQueueByHash`` picks: |String.hashCode()| mod n."""
    return queues[abs(properties.java_string_hash(key)) % len(queues)]


class Producer:
    """Sends messages to a topic's writable queues, round robin unless a queue is given.

    A topic the name servers do not know is sent through the TBW102 template route, so a broker
    with auto-creation on creates it, as RocketMQ's own producers do.

    ``send_timeout`` bounds a send with its retries (``retries`` more attempts after the
    first); ``accept`` lists the send statuses that count as acknowledged besides SEND_OK
    (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE): another status is retried
    by :meth:`send_many`. A busy broker's answers are no attempts: sends wait and repeat them
    (see :mod:`.backpressure`) until a broker has answered nothing but busy for
    ``busy_timeout`` seconds; ``busy_log`` counts them for every pipeline of this producer.
    """

    def __init__(self, name_server: Union[str, Sequence[str]],
                 group: str = "rocketmq-spark-producer", config: Optional[ClientConfig] = None,
                 compress_over: int = 4096, compression: int = COMPRESSION_ZLIB,
                 default_topic_queue_nums: int = 4, send_timeout: float = 5.0, retries: int = 2,
                 max_message_size: int = MAX_MESSAGE_SIZE, max_in_flight_per_broker: int = 4,
                 accept: Iterable[str] = (SEND_OK,), busy_timeout: float = DEFAULT_BUSY_TIMEOUT):
        self.config = config or ClientConfig()
        self.remoting = RemotingClient(self.config)
        self.names = NameServerClient(name_server, self.remoting)
        self.brokers = BrokerClient(self.remoting)
        self.group = group
        self.compress_over = compress_over
        self.compression = compression
        self.default_topic_queue_nums = default_topic_queue_nums
        self.send_timeout = send_timeout
        self.retries = retries
        self.max_message_size = max_message_size
        self.max_in_flight_per_broker = max_in_flight_per_broker
        self.accept = frozenset(accept) | {SEND_OK}
        self.busy_timeout = busy_timeout
        self.busy_log = BusyLog()  # busy answers to every pipeline of this producer
        self._rr = itertools.count(random.randrange(1 << 16))  # as Java: a random first queue
        self._lock = threading.Lock()
        # Topics the name servers did not know: (when, route derived from TBW102).
        self._templates: Dict[str, Tuple[float, TopicRouteData]] = {}

    # ------------------------------------------------------------------ routes

    def _route(self, topic: str, refresh: bool = False) -> TopicRouteData:
        """The topic's route; for a topic the name servers do not know, TBW102's route.

        A template route is kept for the route TTL, as Java keeps it in its publish table
        until the next route poll: sends keep rotating over every broker of TBW102, so each
        of them creates the topic on its first send. Asking the name servers again at once
        would find the topic on the first broker only and send everything there."""
        held = self._templates.get(topic)
        if held is not None and time.monotonic() - held[0] < self.names.route_ttl:
            if not refresh:
                return held[1]
            route = self._template_route(topic, True)
            self._templates[topic] = (held[0], route)
            return route
        try:
            route = self.names.route(topic, refresh)
            self._templates.pop(topic, None)
            return route
        except RouteNotFound:
            route = self._template_route(topic, refresh)
            self._templates[topic] = (time.monotonic(), route)
            return route

    def _template_route(self, topic: str, refresh: bool) -> TopicRouteData:
        try:
            template = self.names.route(DEFAULT_TOPIC, refresh)
        except RouteNotFound:
            raise RouteNotFound(topic, f"topic {topic!r} does not exist, and no broker creates "
                                       "topics on first send (no route for TBW102: "
                                       "autoCreateTopicEnable is off); create the topic first"
                                ) from None
        n = self.default_topic_queue_nums
        return dataclasses.replace(template, queue_datas=[
            dataclasses.replace(q, read_queue_nums=min(q.read_queue_nums, n),
                                write_queue_nums=min(q.write_queue_nums, n))
            for q in template.queue_datas])

    def queues(self, topic: str, refresh: bool = False) -> List[MessageQueue]:
        """The writable queues of ``topic`` (from the template route if it is new)."""
        route = self._route(topic, refresh)
        queues = route.writable_queues(topic)
        if not queues:
            raise RouteNotFound(topic, route.unwritable_reason(topic))
        return queues

    def _address(self, queue: MessageQueue, route: TopicRouteData) -> str:
        # The broker may have left the route (stopped, or its master is gone) since the queue
        # was chosen: a send elsewhere may work, so this is a broker failure, not a refusal.
        return master_address((route,), queue.broker_name,
                              f"no master of {queue.broker_name} is in the route of topic "
                              f"{queue.topic!r}")

    # ------------------------------------------------------------------ encoding

    def check_size(self, topic: str, body_size: int, properties_size: int = 0,
                   what: str = "a message", raw_size: Optional[int] = None) -> None:
        """Raise :class:`MessageTooLarge` for what the broker would refuse (``body_size`` as
        sent; ``raw_size`` before compression)."""
        problem = size_problem(topic, body_size, properties_size, self.max_message_size,
                               raw_size, what)
        if problem:
            raise MessageTooLarge(problem)

    def encode(self, message: Message) -> EncodedRequest:
        """One message as a single send; bodies of ``compress_over`` bytes or more are
        compressed."""
        uniq = message.uniq_key or new_uniq_key()
        body, sys_flag = bytes(message.body), 0
        if self.compress_over >= 0 and len(body) >= self.compress_over:
            body, sys_flag = compress_body(body, self.compression)
        props = properties.encode_properties(message.property_map(uniq))
        self.check_size(message.topic, len(body), len(props.encode()),
                        raw_size=len(message.body))
        return EncodedRequest(body, props, sys_flag, message.flag, False, uniq)

    def encode_batch(self, messages: Sequence[Message]) -> EncodedRequest:
        """Messages of one topic as one SEND_BATCH_MESSAGE (uncompressed, as Java's producer
        sends batches). Messages with a delay level cannot be batched (brokers refuse it)."""
        if not messages:
            raise ValueError("a batch needs at least one message")
        topic = messages[0].topic
        entries, first = [], None
        for m in messages:
            if m.topic != topic:
                raise ValueError("all messages of a batch must have the same topic")
            if m.delay_level:
                raise ValueError("a message with a delay level cannot be sent in a batch")
            uniq = m.uniq_key or new_uniq_key()
            first = first or uniq
            props = properties.encode_properties(m.property_map(uniq))
            body = bytes(m.body)
            self.check_size(topic, len(body), len(props.encode()))
            entries.append(BatchEntry(body, props, m.flag))
        return EncodedRequest(encode_batch(entries), BATCH_HEADER_PROPERTIES, 0, 0, True,
                              first or "")

    # ------------------------------------------------------------------ the Sender protocol

    def start(self, item: Outgoing, queue: MessageQueue, group: Optional[str] = None) -> Any:
        """Send ``item`` (an :class:`EncodedRequest` or :class:`EncodedRun` payload) to
        ``queue`` without waiting."""
        request: Union[EncodedRequest, EncodedRun] = item.payload
        route = self._route(queue.topic)
        address = self._address(queue, route)
        born = int(time.time() * 1000)
        if isinstance(request, EncodedRun):
            return address, self._start_run(address, queue, group or self.group, request,
                                            born), queue, list(request.ids)
        pending = self.brokers.send_message_async(
            address, queue.broker_name, producer_group=group or self.group, topic=queue.topic,
            queue_id=queue.queue_id, body=request.body, properties=request.properties,
            sys_flag=request.sys_flag, flag=request.flag, batch=request.batch,
            born_timestamp=born, default_topic_queue_nums=self.default_topic_queue_nums)
        return address, pending, queue, request.first_id

    def _start_run(self, address: str, queue: MessageQueue, group: str, run: EncodedRun,
                   born: int) -> List[Tuple[Any, Any]]:
        """Write a run's requests at once: spliced from one template over the columns, or,
        on a connection that signs requests, as commands."""
        conn = self.remoting.connection(address)
        if conn.credentials is not None:
            bodies, props = run.bodies.to_pylist(), run.properties.to_pylist()
            return self.brokers.send_messages_async(
                address, queue.broker_name, producer_group=group, topic=queue.topic,
                queue_id=queue.queue_id, born_timestamp=born,
                default_topic_queue_nums=self.default_topic_queue_nums,
                messages=[(b, p.decode("utf-8"), run.sys_flag, run.flag)
                          for b, p in zip(bodies, props)])
        from ..protocol.spliced_requests import RequestTemplate, buffer_of

        template = send_command(queue.broker_name, group, queue.topic, queue.queue_id, b"", "",
                                run.sys_flag, run.flag, born, self.default_topic_queue_nums)
        template.version = self.remoting.config.version
        columns = RequestTemplate(template, [SEND_V2_KEYS["properties"]])
        futures = conn.send_encoded(len(run), lambda opaques: buffer_of(
            columns.frames(opaques, [run.properties], run.bodies)), "SEND_MESSAGE_V2")
        return [(conn, f) for f in futures]

    def finish(self, handle: Any, timeout: float) -> List[SendResult]:
        """The answer to a request :meth:`start` sent (an :class:`EncodedRequest`; a run's
        answers are collected by its sender, see :func:`~..txn.transaction.collect_half_answers`);
        raises for a refusal or a lost connection."""
        address, pending, queue, first_id = handle
        if isinstance(first_id, list):
            raise TypeError("a run's answers are collected by the sender that started it "
                            "(transaction.collect_half_answers), not by Producer.finish")
        return [self._result(queue, first_id,
                             self.brokers.send_wait(address, pending, timeout), address)]

    def pipeline(self, **overrides) -> SendPipeline:
        """A :class:`SendPipeline` over this producer with its limits and accepted statuses."""
        settings = dict(max_in_flight_per_broker=self.max_in_flight_per_broker,
                        send_timeout=self.send_timeout, retries=self.retries,
                        accept=self.accept, busy_timeout=self.busy_timeout)
        settings.update(overrides)
        return SendPipeline(self, **settings)

    # ------------------------------------------------------------------ sending

    def send(self, message: Message, queue: Optional[MessageQueue] = None) -> SendResult:
        """Send one message and wait; bodies of ``compress_over`` bytes or more are
        compressed. A transient failure is retried on another broker (when ``queue`` is not
        given) within ``send_timeout``."""
        return self._send_with_retry(message.topic, queue, self.encode(message))

    def send_batch(self, messages: Sequence[Message], queue: Optional[MessageQueue] = None
                   ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE; they land in one queue with
        consecutive offsets. Batches are not compressed (as with Java producers)."""
        return self._send_with_retry(messages[0].topic if messages else "", queue,
                                     self.encode_batch(messages))

    def _pick(self, topic: str, route: TopicRouteData, avoid: set = frozenset()) -> MessageQueue:
        candidates = route.writable_queues(topic)
        if not candidates:
            raise RouteNotFound(topic, route.unwritable_reason(topic))
        fresh = [q for q in candidates if q.broker_name not in avoid] or candidates
        return fresh[next(self._rr) % len(fresh)]

    def _result(self, target: MessageQueue, uniq: str, r: SendResponse,
                address: str = "") -> SendResult:
        return SendResult(r.status, uniq, r.offset_msg_id,
                          MessageQueue(target.topic, target.broker_name, r.queue_id),
                          r.queue_offset, address, r.transaction_id)

    def _send_with_retry(self, topic: str, queue: Optional[MessageQueue],
                         request: EncodedRequest) -> SendResult:
        """One request until stored: transient failures retried (``retries``, within
        ``send_timeout``, on another broker unless ``queue`` is given); busy answers waited
        out with a backoff, not counted as attempts, for up to ``busy_timeout``."""
        tried: set = set()
        deadline = time.monotonic() + self.send_timeout
        attempt = 0
        backoff, clock = SendWindow(1), BusyClock()
        busy_broker = None
        while True:
            route = self._route(topic, refresh=attempt > 0)
            avoid = tried | {busy_broker} if busy_broker else tried
            target = queue or self._pick(topic, route, avoid)
            sent_at = time.monotonic()
            try:
                handle = self.start(Outgoing(topic, request, 1), target)
                return self.finish(handle, max(deadline - sent_at, 0.05))[0]
            except RocketMQError as exc:
                now = time.monotonic()
                if is_busy(exc):
                    self.busy_log.note(target.broker_name, exc, now)
                    clock.busy(exc, now)
                    if clock.busy_for(now) >= self.busy_timeout:
                        raise BrokerStayedBusy(Outgoing(topic, request, 1), target.broker_name,
                                               clock, clock.busy_for(now), self.busy_timeout,
                                               "busy_timeout", exc) from exc
                    backoff.on_busy(backoff.epoch, now)
                    pause = backoff.wait(now)
                    deadline += now - sent_at + pause  # busy waiting does not use it up
                    busy_broker = target.broker_name
                    time.sleep(pause)
                    continue
                if (not is_transient(exc) or attempt == self.retries
                        or time.monotonic() >= deadline):
                    raise
                attempt += 1
                tried.add(target.broker_name)
                log.info("send to %s failed (%s); retrying", target, exc)
                time.sleep(0.05 * attempt)

    def send_many(self, messages: Iterable[Message], batch_size: int = 256,
                  in_flight: int = 8, max_batch_bytes: int = MAX_BATCH_BYTES
                  ) -> List[SendResult]:
        """Send many messages fast: consecutive messages of a topic packed into batches of
        up to ``batch_size`` messages and ``max_batch_bytes``, each batch to the next queue
        round robin, ``in_flight`` requests in flight per broker, failed batches retried on
        another broker.

        Messages with a ``sharding_key`` go to the queue of their key (Java's
        ``SelectMessageQueueByHash``), in order; messages with a ``delay_level`` are sent one
        by one (brokers refuse delayed messages in a batch). Returns one result per request,
        in the order they were acknowledged. A request that cannot be acknowledged raises
        :class:`~.pipeline.SendFailed`; the ones already acknowledged stay sent."""
        results: List[SendResult] = []
        pipeline = self.pipeline(max_in_flight_per_broker=in_flight,
                                 on_result=lambda item, queue, rs: results.extend(rs))
        open_batches: Dict[Tuple[str, Optional[MessageQueue]], Tuple[List[Message], int]] = {}
        queues: Dict[str, List[MessageQueue]] = {}

        def flush_batch(key):
            batch, size = open_batches.pop(key)
            pipeline.submit(Outgoing(key[0], self.encode_batch(batch), len(batch), size,
                                     key[1]))

        for m in messages:
            fixed = None
            if m.sharding_key:
                if m.topic not in queues:
                    queues[m.topic] = self.queues(m.topic)
                fixed = queue_for_key(queues[m.topic], m.sharding_key)
            if m.delay_level:
                if (m.topic, fixed) in open_batches:  # keep a key's messages in order
                    flush_batch((m.topic, fixed))
                pipeline.submit(Outgoing(m.topic, self.encode(m), 1, len(m.body), fixed))
                continue
            key = (m.topic, fixed)
            batch, size = open_batches.get(key, ([], 0))
            if batch and (len(batch) >= batch_size or size + len(m.body) > max_batch_bytes):
                flush_batch(key)
                batch, size = [], 0
            batch.append(m)
            open_batches[key] = (batch, size + len(m.body))
        for key in list(open_batches):
            flush_batch(key)
        pipeline.flush()
        return results

    def close(self) -> None:
        self.remoting.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
