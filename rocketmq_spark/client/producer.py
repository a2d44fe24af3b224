"""A producer: single and batch sends, queue choice, topic auto-creation through TBW102."""
from __future__ import annotations

import dataclasses
import itertools
import random
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .broker import BrokerClient, SendResponse
from .config import ClientConfig
from .errors import RocketMQError, RouteNotFound
from .nameserver import NameServerClient
from .protocol import message as M
from .protocol import properties as P
from .protocol.codes import DEFAULT_TOPIC
from .protocol.route import MessageQueue, TopicRouteData
from .pull import is_transient
from .remoting import RemotingClient

log = logging.getLogger(__name__)


@dataclass
class Message:
    """A message to send. ``keys`` may be one string or several (stored space-separated).

    ``sharding_key``: messages with the same key belong together in order (RocketMQ's ordered
    messages; stored as ``__SHARDINGKEY``). ``delay_level``: 1-18, deliver after that delay
    level (stored as ``DELAY``). ``uniq_key``: the message id (``UNIQ_KEY``); a fresh one is
    made when it is None."""

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
            props[P.KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.tags:
            props[P.TAGS] = self.tags
        if self.sharding_key:
            props[P.SHARDING_KEY] = self.sharding_key
        if self.delay_level:
            props[P.DELAY] = str(self.delay_level)
        props.setdefault(P.UNIQ_KEY, self.uniq_key or uniq_key)
        props.setdefault(P.WAIT, "true")
        return props


@dataclass
class SendResult:
    status: str
    msg_id: str             # the client id (UNIQ_KEY); the first one for a batch
    offset_msg_id: str      # the broker's id(s)
    queue: MessageQueue
    queue_offset: int       # the first message's offset for a batch


class Producer:
    """Sends messages to a topic's writable queues, round robin unless a queue is given.

    A topic the name servers do not know is sent through the TBW102 template route, so a broker
    with auto-creation on creates it, as RocketMQ's own producers do.
    """

    def __init__(self, name_server: Union[str, Sequence[str]],
                 group: str = "rocketmq-spark-producer", config: Optional[ClientConfig] = None,
                 compress_over: int = 4096, compression: int = M.COMPRESSION_ZLIB,
                 default_topic_queue_nums: int = 4, send_timeout: float = 5.0, retries: int = 2):
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
        queues = self._route(topic, refresh).writable_queues(topic)
        if not queues:
            raise RouteNotFound(topic, "the topic has no writable queue")
        return queues

    def _address(self, queue: MessageQueue, route: TopicRouteData) -> str:
        broker = route.broker(queue.broker_name)
        if broker is None or broker.master_addr is None:
            raise RouteNotFound(queue.topic, f"broker {queue.broker_name} has no master")
        return broker.master_addr

    # ------------------------------------------------------------------ sending

    def _encode(self, message: Message) -> tuple:
        uniq = message.uniq_key or M.new_uniq_key()
        body, sys_flag = bytes(message.body), 0
        if self.compress_over >= 0 and len(body) >= self.compress_over:
            body, sys_flag = M.compress_body(body, self.compression)
        props = P.encode_properties(message.property_map(uniq))
        return uniq, body, sys_flag, props

    def send(self, message: Message, queue: Optional[MessageQueue] = None) -> SendResult:
        """Send one message; bodies of ``compress_over`` bytes or more are compressed."""
        uniq, body, sys_flag, props = self._encode(message)
        return self._send_with_retry(message.topic, queue, uniq, dict(
            body=body, properties=props, sys_flag=sys_flag, flag=message.flag))

    def send_batch(self, messages: Sequence[Message], queue: Optional[MessageQueue] = None
                   ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE; they land in one queue with
        consecutive offsets. Batches are not compressed (as with Java producers)."""
        topic, first, body = self._encode_batch(messages)
        return self._send_with_retry(topic, queue, first, self._batch_fields(body))

    @staticmethod
    def _encode_batch(messages: Sequence[Message]) -> tuple:
        if not messages:
            raise ValueError("a batch needs at least one message")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("all messages of a batch must have the same topic")
        entries, first = [], None
        for m in messages:
            uniq = m.uniq_key or M.new_uniq_key()
            first = first or uniq
            entries.append(M.BatchEntry(bytes(m.body), P.encode_properties(m.property_map(uniq)),
                                        m.flag))
        return topic, first, M.encode_batch(entries)

    @staticmethod
    def _batch_fields(body: bytes) -> dict:
        # The batch header carries WAIT only: a UNIQ_KEY here would overwrite every message's own.
        return dict(body=body, properties=P.encode_properties({P.WAIT: "true"}), batch=True)

    def _send_async(self, target: MessageQueue, route: TopicRouteData, fields: dict):
        return self.brokers.send_message_async(
            self._address(target, route), target.broker_name, producer_group=self.group,
            topic=target.topic, queue_id=target.queue_id, born_timestamp=int(time.time() * 1000),
            default_topic_queue_nums=self.default_topic_queue_nums, **fields)

    def _pick(self, topic: str, route: TopicRouteData, avoid: set = frozenset()) -> MessageQueue:
        candidates = route.writable_queues(topic)
        if not candidates:
            raise RouteNotFound(topic, "the topic has no writable queue")
        fresh = [q for q in candidates if q.broker_name not in avoid] or candidates
        return fresh[next(self._rr) % len(fresh)]

    def _result(self, target: MessageQueue, uniq: str, r: SendResponse) -> SendResult:
        return SendResult(r.status, uniq, r.offset_msg_id,
                          MessageQueue(target.topic, target.broker_name, r.queue_id),
                          r.queue_offset)

    def _send_with_retry(self, topic: str, queue: Optional[MessageQueue], uniq: str,
                         fields: dict) -> SendResult:
        tried: set = set()
        for attempt in range(self.retries + 1):
            route = self._route(topic, refresh=attempt > 0)
            target = queue or self._pick(topic, route, tried)
            try:
                pending = self._send_async(target, route, fields)
                r = self.brokers.send_wait(self._address(target, route), pending,
                                           self.send_timeout)
            except RocketMQError as exc:
                if not is_transient(exc) or attempt == self.retries:
                    raise
                tried.add(target.broker_name)
                log.info("send to %s failed (%s); retrying", target, exc)
                time.sleep(0.05 * (attempt + 1))
                continue
            return self._result(target, uniq, r)
        raise AssertionError("unreachable")

    def send_many(self, messages: Iterable[Message], batch_size: int = 256,
                  in_flight: int = 8) -> List[SendResult]:
        """Send many messages fast: message by message round robin over each topic's queues,
        packed into one batch per queue of up to ``batch_size``, several batches in flight.

        Returns one result per batch, in send order. No retries: a failure raises, and the
        batches already acknowledged stay sent."""
        pending: List = []
        results: List[SendResult] = []
        queues: Dict[str, List[MessageQueue]] = {}
        chunks: Dict[MessageQueue, List[Message]] = {}

        def finish_oldest():
            target, address, uniq, p = pending.pop(0)
            results.append(self._result(target, uniq,
                                        self.brokers.send_wait(address, p, self.send_timeout)))

        def start(target: MessageQueue, batch: List[Message]):
            topic, first, body = self._encode_batch(batch)
            route = self._route(topic)
            pending.append((target, self._address(target, route), first,
                            self._send_async(target, route, self._batch_fields(body))))
            if len(pending) >= in_flight:
                finish_oldest()

        for m in messages:
            if m.topic not in queues:
                queues[m.topic] = self.queues(m.topic)
            topic_queues = queues[m.topic]
            target = topic_queues[next(self._rr) % len(topic_queues)]
            chunk = chunks.setdefault(target, [])
            chunk.append(m)
            if len(chunk) >= batch_size:
                start(target, chunks.pop(target))
        for target, chunk in chunks.items():
            start(target, chunk)
        while pending:
            finish_oldest()
        return results

    def close(self) -> None:
        self.remoting.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
