"""The embedded cluster's 5.x proxy endpoint: ``MessagingService`` over gRPC (grpc.aio) on the
cluster's own event loop, over the same broker stores as the remoting brokers.

It answers as Apache's proxy does in cluster mode, where that is observable:

* QueryRoute lists every broker's queues with the proxy's own address (the access point the
  client gave) as the broker endpoints, and accepts NORMAL, FIFO, DELAY and TRANSACTION
  messages (our topics have no message type); an unknown topic is TOPIC_NOT_FOUND (the proxy
  never creates topics).
* SendMessage picks the queue (see :mod:`rocketmq_spark.client.grpc.queue_choice`) and, in
  :mod:`.grpc_send`, builds each message's properties as the proxy does (user properties, TAGS,
  KEYS, UNIQ_KEY, TIMER_DELIVER_MS, RECONSUME_TIME, PGROUP = the topic, __SHARDINGKEY) and hands
  the broker a SEND_MESSAGE_V2, or for several messages one SEND_BATCH_MESSAGE whose header
  carries the first message's properties, as the proxy does. The broker appends those header
  properties to every message of the batch (5.x brokers do), so every message of a multi-message
  call reads back with the first message's id, tags, keys and properties: the genuine behaviour,
  kept so that tests see what a real proxy would store. The answer is one entry per call (the
  batch's ids comma-separated).
* It refuses what Apache's 5.0 proxy refuses, with the same code and message: names, message
  sizes and properties (:mod:`.grpc_validation`), settings that declare no topic or group and
  a Heartbeat from a client without settings (:mod:`.grpc_settings`), a call without a client
  id (CLIENT_ID_REQUIRED). A resource's namespace makes the broker topic ``ns%topic``.
* Telemetry answers a client's settings with the proxy's view merged in; Heartbeat and
  NotifyClientTermination answer OK; ReceiveMessage, AckMessage and ChangeInvisibleDuration
  serve the official SimpleConsumer (see :mod:`.grpc_delivery`); QueryAssignment assigns every
  broker to every member.
* With ``acl``, every call must be signed (``authorization`` metadata): a bad or missing
  signature is answered with status UNAUTHORIZED.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

import grpc
from grpc import aio

from ..client.grpc import auth
from ..client.grpc import definition_pb2 as definition
from ..client.grpc import service_pb2 as service
from ..client.grpc import service_pb2_grpc as service_grpc
from ..client.grpc.queue_choice import queue_for_group
from ..client.protocol.codes import PERM_READ, PERM_WRITE
from ..client.protocol.route import MessageQueue
from .grpc_delivery import GroupDelivery, InvalidHandle, decode_handle, tag_filter, to_proto
from .grpc_send import PropertiesEncoder, broker_request, checked_properties, send_response
from .grpc_settings import ClientSettings, SettingsRefused
from .grpc_validation import (
    ProxyLimits, Refused, status, topic_not_found, validate_group, validate_topic, wrap,
)
from .tls import TlsSettings

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker

log = logging.getLogger(__name__)

ALL_MESSAGE_TYPES = (definition.NORMAL, definition.FIFO, definition.DELAY, definition.TRANSACTION)
POLL_INTERVAL = 0.05
MAX_LONG_POLL = 30.0
DEFAULT_INVISIBLE = 30.0
CLIENT_ID_REQUIRED = "client id cannot be empty"


def _peer_address(context) -> str:
    """``ipv4:127.0.0.1:5000`` -> ``127.0.0.1:5000`` (the born host of messages)."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        host, _, port = rest.rpartition(":")
        return f"{host.strip('[]')}:{port}"
    return rest if kind == "ipv4" else "127.0.0.1:0"


def _metadata(context) -> Dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _group_and_topic(group: definition.Resource, topic: definition.Resource) -> Tuple[str, str]:
    """The wrapped names, checked (GrpcValidator.validateTopicAndConsumerGroup)."""
    topic_name, group_name = wrap(topic), wrap(group)
    validate_topic(topic_name)
    validate_group(group_name)
    return group_name, topic_name


class GrpcProxy(service_grpc.MessagingServiceServicer):
    """The gRPC endpoint. Create and start it on the cluster's loop."""

    def __init__(self, brokers: List["Broker"], *, host: str = "127.0.0.1", port: int = 0,
                 tls: Optional[TlsSettings] = None, acl: Optional[Mapping[str, str]] = None,
                 max_message_size: int = 4 * 1024 * 1024):
        self._brokers = brokers
        self.host = host
        self.port = port
        self.tls = tls
        self.acl = dict(acl) if acl else None
        self.limits = ProxyLimits(max_message_size=max_message_size)
        self.clients = ClientSettings(self.limits)  # client id -> its accepted settings
        self._server: Optional[aio.Server] = None
        self._rr = itertools.count(random.randrange(1 << 16))
        self._deliveries: Dict[Tuple[str, str, str], GroupDelivery] = {}
        self._writable_cache: Dict[str, tuple] = {}
        self._properties = PropertiesEncoder()

    # ---------------------------------------------------------------- lifecycle

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        server = aio.server(options=[("grpc.max_receive_message_length", 130 * 1024 * 1024),
                                     ("grpc.so_reuseport", 0)])
        service_grpc.add_MessagingServiceServicer_to_server(self, server)
        where = f"{self.host}:{self.port}"
        if self.tls is not None:
            with open(self.tls.keyfile, "rb") as k, open(self.tls.certfile, "rb") as c:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            self.port = server.add_secure_port(where, creds)
        else:
            self.port = server.add_insecure_port(where)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=0.5)
            # Let the cancelled streams (Telemetry, long polls) unwind before the loop closes.
            await asyncio.sleep(0.1)

    # ---------------------------------------------------------------- checks

    def _refusal(self, context) -> Optional[definition.Status]:
        """The status to answer instead of serving the call, or None: the ACL's signature
        check, then (GrpcMessagingApplication.validateContext) the client id every call of a
        5.x client carries."""
        metadata = _metadata(context)
        if self.acl is not None:
            try:
                auth.verify_metadata(metadata, self.acl)
            except auth.AuthFailure as exc:
                return status(definition.UNAUTHORIZED, f"authentication failed: {exc}")
        if not metadata.get(auth.CLIENT_ID, "").strip():
            return status(definition.CLIENT_ID_REQUIRED, CLIENT_ID_REQUIRED)
        return None

    def _running_brokers(self) -> List["Broker"]:
        return [b for b in self._brokers if b.running]

    def _endpoints(self, given: definition.Endpoints) -> definition.Endpoints:
        if given.addresses:
            return given
        return definition.Endpoints(scheme=definition.IPv4,
                                    addresses=[definition.Address(host=self.host, port=self.port)])

    def _writable(self, topic: str) -> List[Tuple[MessageQueue, "Broker"]]:
        """The topic's writable queues on running brokers, sorted as the proxy sorts them
        (kept while the brokers' state and the topic's configs stay the same)."""
        state = []
        for b in self._brokers:
            config = b.store.topics.get(topic) if b.running else None
            state.append(None if config is None else
                         (id(config), config.perm, config.write_queue_nums))
        state = tuple(state)
        cached = self._writable_cache.get(topic)
        if cached is not None and cached[0] == state:
            return cached[1]
        out = []
        for b in self._running_brokers():
            config = b.store.topics.get(topic)
            if config is not None and config.perm & PERM_WRITE:
                out.extend((MessageQueue(topic, b.name, i), b)
                           for i in range(config.write_queue_nums))
        out.sort(key=lambda item: item[0])
        self._writable_cache[topic] = (state, out)
        return out

    # ---------------------------------------------------------------- routes

    async def QueryRoute(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.QueryRouteResponse(status=refusal)
        topic = wrap(request.topic)
        try:
            validate_topic(topic)
        except Refused as exc:
            return service.QueryRouteResponse(status=exc.status)
        endpoints = self._endpoints(request.endpoints)
        queues = []
        for b in self._running_brokers():
            config = b.store.topics.get(topic)
            if config is None:
                continue
            broker = definition.Broker(name=b.name, id=0, endpoints=endpoints)
            readable, writable = bool(config.perm & PERM_READ), bool(config.perm & PERM_WRITE)
            r = config.read_queue_nums if readable else 0
            w = config.write_queue_nums if writable else 0
            both = min(r, w)
            # Apache's layout: read-only ids first, then write-only, then read-write.
            perms = ([definition.READ] * (r - both) + [definition.WRITE] * (w - both)
                     + [definition.READ_WRITE] * both)
            queues.extend(definition.MessageQueue(topic=request.topic, id=i, permission=perm,
                                          broker=broker, accept_message_types=ALL_MESSAGE_TYPES)
                          for i, perm in enumerate(perms))
        if not queues:
            return service.QueryRouteResponse(status=topic_not_found(topic).status)
        return service.QueryRouteResponse(status=status(definition.OK), message_queues=queues)

    async def QueryAssignment(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.QueryAssignmentResponse(status=refusal)
        topic = wrap(request.topic)
        try:
            validate_topic(topic)
            validate_group(wrap(request.group))
        except Refused as exc:
            return service.QueryAssignmentResponse(status=exc.status)
        endpoints = self._endpoints(request.endpoints)
        assignments = [
            definition.Assignment(message_queue=definition.MessageQueue(
                topic=request.topic, id=-1, permission=definition.READ_WRITE,
                broker=definition.Broker(name=b.name, id=0, endpoints=endpoints),
                accept_message_types=ALL_MESSAGE_TYPES))
            for b in self._running_brokers() if topic in b.store.topics]
        if not assignments:
            return service.QueryAssignmentResponse(status=topic_not_found(topic).status)
        return service.QueryAssignmentResponse(status=status(definition.OK),
                                               assignments=assignments)

    # ---------------------------------------------------------------- client lifecycle

    async def Heartbeat(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.HeartbeatResponse(status=refusal)
        client_id = _metadata(context)[auth.CLIENT_ID]
        return service.HeartbeatResponse(status=self.clients.heartbeat(client_id, request))

    async def NotifyClientTermination(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.NotifyClientTerminationResponse(status=refusal)
        self.clients.forget(_metadata(context)[auth.CLIENT_ID])
        return service.NotifyClientTerminationResponse(status=status(definition.OK))

    async def Telemetry(self, request_iterator, context):
        """Settings are accepted or refused as :mod:`.grpc_settings` says; a refusal ends the
        stream with its gRPC status, as Apache's proxy does."""
        refusal = self._refusal(context)
        if refusal is not None:
            yield service.TelemetryCommand(status=refusal)
            return
        metadata = _metadata(context)
        client_id, language = metadata[auth.CLIENT_ID], metadata.get(auth.LANGUAGE, "")
        async for command in request_iterator:
            if command.HasField("settings"):
                try:
                    answer = self.clients.accept(client_id, language, command.settings)
                except SettingsRefused as exc:
                    await context.abort(exc.code, exc.details)
                yield service.TelemetryCommand(status=status(definition.OK), settings=answer)

    # ---------------------------------------------------------------- sending

    async def SendMessage(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.SendMessageResponse(status=refusal)
        try:
            return await self._send(request, _peer_address(context))
        except Refused as exc:
            return service.SendMessageResponse(status=exc.status)

    async def _send(self, request, peer: str) -> service.SendMessageResponse:
        messages = request.messages
        topic, properties = checked_properties(messages, self.limits, self._properties,
                                               int(time.time() * 1000))
        writable = self._writable(topic)
        if not writable:
            raise topic_not_found(topic)
        group = messages[0].system_properties.message_group if len(messages) == 1 else ""
        if group:
            queue, broker = queue_for_group(writable, group)
        else:
            queue, broker = writable[next(self._rr) % len(writable)]
        request = broker_request(messages, properties, topic, queue.queue_id, broker.name)
        # as Apache's proxy, a client of the broker: the request waits in its send queue
        return send_response(messages, await broker.queued_request(peer, request))


    # ---------------------------------------------------------------- receiving

    def _delivery(self, group: str, topic: str, broker_name: str) -> Optional[GroupDelivery]:
        key = (group, topic, broker_name)
        delivery = self._deliveries.get(key)
        if delivery is None:
            broker = next((b for b in self._running_brokers() if b.name == broker_name), None)
            if broker is None:
                return None
            delivery = self._deliveries[key] = GroupDelivery(group, topic, broker_name,
                                                             broker.store)
        return delivery

    async def ReceiveMessage(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            yield service.ReceiveMessageResponse(status=refusal)
            return
        try:
            group, topic = _group_and_topic(request.group, request.message_queue.topic)
        except Refused as exc:
            yield service.ReceiveMessageResponse(status=exc.status)
            return
        try:
            tags = tag_filter(request.filter_expression)
        except ValueError as exc:
            yield service.ReceiveMessageResponse(status=status(definition.ILLEGAL_FILTER_EXPRESSION,
                                                           str(exc)))
            return
        delivery = self._delivery(group, topic, request.message_queue.broker.name)
        if delivery is None:
            yield service.ReceiveMessageResponse(status=status(
                definition.NOT_FOUND,
                f"broker {request.message_queue.broker.name} is not available"))
            return
        invisible = (request.invisible_duration.ToMilliseconds() / 1000.0
                     if request.HasField("invisible_duration") else DEFAULT_INVISIBLE)
        wait = (request.long_polling_timeout.ToMilliseconds() / 1000.0
                if request.HasField("long_polling_timeout") else 0.0)
        loop = asyncio.get_running_loop()
        until = loop.time() + min(max(wait, 0.0), MAX_LONG_POLL)
        batch = max(request.batch_size, 1)
        while True:
            found = delivery.receive(batch, invisible, tags)
            if found or loop.time() >= until or context.done():
                break
            await asyncio.sleep(POLL_INTERVAL)
        if not found:
            yield service.ReceiveMessageResponse(status=status(definition.MESSAGE_NOT_FOUND,
                                                           "no new message"))
            return
        yield service.ReceiveMessageResponse(status=status(definition.OK))
        now = service.ReceiveMessageResponse()
        now.delivery_timestamp.GetCurrentTime()
        yield now
        for message, handle, attempt in found:
            yield service.ReceiveMessageResponse(message=to_proto(message, handle, attempt,
                                                              invisible))

    async def AckMessage(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.AckMessageResponse(status=refusal)
        try:
            group, topic = _group_and_topic(request.group, request.topic)
        except Refused as exc:
            return service.AckMessageResponse(status=exc.status)
        results, codes = [], set()
        for entry in request.entries:
            result = self._ack_one(group, topic, entry.receipt_handle)
            codes.add(result.code)
            results.append(service.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                status=result))
        overall = (status(definition.MULTIPLE_RESULTS) if len(codes) > 1
                   else (results[0].status if results else status(definition.OK)))
        return service.AckMessageResponse(status=overall, entries=results)

    def _ack_one(self, group: str, topic: str, handle: str) -> definition.Status:
        try:
            broker_name = decode_handle(handle)[0]
            delivery = self._delivery(group, topic, broker_name)
            if delivery is None:
                raise InvalidHandle(f"broker {broker_name} is not available")
            delivery.ack(handle)
        except InvalidHandle as exc:
            return status(definition.INVALID_RECEIPT_HANDLE, str(exc))
        return status(definition.OK)

    async def ChangeInvisibleDuration(self, request, context):
        refusal = self._refusal(context)
        if refusal is not None:
            return service.ChangeInvisibleDurationResponse(status=refusal)
        try:
            group, topic = _group_and_topic(request.group, request.topic)
        except Refused as exc:
            return service.ChangeInvisibleDurationResponse(status=exc.status)
        try:
            delivery = self._delivery(group, topic, decode_handle(request.receipt_handle)[0])
            if delivery is None:
                raise InvalidHandle("the broker of this receipt handle is not available")
            handle = delivery.change_invisible(
                request.receipt_handle, request.invisible_duration.ToMilliseconds() / 1000.0)
        except InvalidHandle as exc:
            return service.ChangeInvisibleDurationResponse(
                status=status(definition.INVALID_RECEIPT_HANDLE, str(exc)))
        return service.ChangeInvisibleDurationResponse(status=status(definition.OK),
                                                       receipt_handle=handle)
