"""The sink's options: parsed and checked once, on the driver, before anything is sent.

Names follow the source where the concept is the same (``nameServer``, ``accessKey``,
``tls``...) and RocketMQ's Java producer for the rest (``sendTimeoutMs`` is its
``sendMsgTimeout``, ``retries`` its ``retryTimesWhenSendFailed``, ``compressBodyOverBytes`` its
``compressMsgBodyOverHowmuch``). Every error names the option at fault.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ..client.namespace import wrap, wrapped_name_problem
from ..client.send.pipeline import SEND_OK, SEND_STATUSES
from ..client.send.producer import MAX_MESSAGE_SIZE
from ..client.settings import ConnectionSettings
from ..storage import StorageOptions
from ..storage.options import PREFIX as STORAGE_PREFIX
from .send_back_options import check_send_back_options
from ..options import (
    CONNECTION, ENDPOINTS, ConnectionFields, Option, OptionError, OptionTable, choice,
    connection_settings, group_name, integer, require_name_server, topic_name,
)

DEFAULT_BATCH_BYTES = 1024 * 1024
# The largest request a 4.x broker decodes is 16 MiB; a batch of 4 MiB is Java's limit too.
MAX_BATCH_BYTES = 4 * 1024 * 1024
AT_LEAST_ONCE = "atLeastOnce"
EXACTLY_ONCE = "exactlyOnce"


@dataclass(frozen=True)
class SinkOptions(ConnectionFields):
    """What ``df.write`` / ``writeStream`` with ``format("rocketmq")`` was asked to do.

    ``connection``: ``name_servers`` (remoting) or ``endpoints`` (a 5.x proxy, gRPC), exactly
    one set, credentials, TLS, namespace and ``sendTimeoutMs`` (read through
    :class:`ConnectionFields` too: ``options.tls``...); the key of the shared producers.
    ``topic``: the topic of rows without a ``topic`` column value, as given (``namespace``
    puts it and the ``topic`` column's values into the namespace when they are sent).
    ``compress_over``: bodies of this many bytes or more are zlib-compressed (-1: never)."""

    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    topic: Optional[str] = None
    producer_group: Optional[str] = None
    send_timeout_ms: int = 5000
    retries: int = 2
    compress_over: int = 4096
    max_batch_bytes: int = DEFAULT_BATCH_BYTES
    max_in_flight_per_broker: int = 4
    broker_busy_timeout_ms: int = 60_000
    accept_statuses: Tuple[str, ...] = (SEND_OK,)
    max_message_bytes: int = MAX_MESSAGE_SIZE
    delivery_guarantee: str = AT_LEAST_ONCE
    checkpoint_location: Optional[str] = None
    # checkpointStorage.*: where the exactly-once record goes and the store's settings
    checkpoint_storage: StorageOptions = field(default_factory=StorageOptions)
    # sendBack: rows are messages read from RocketMQ, sent back to this consumer group's
    # retry topic (:mod:`.send_back`) instead of being written to a topic
    send_back: Optional[str] = None
    max_reconsume_times: int = 16

    @property
    def exactly_once(self) -> bool:
        return self.delivery_guarantee == EXACTLY_ONCE

    @property
    def transport(self) -> str:
        return "grpc" if self.endpoints else "remoting"



def _names_fit(kw: Mapping[str, Any]) -> None:
    """The topic and producer group still fit RocketMQ's limits once in the namespace."""
    namespace = kw["connection"].namespace
    for option, name, kind in (("topic", kw.get("topic"), "topic"),
                               ("producerGroup", kw.get("producer_group"), "group")):
        problem = name and wrapped_name_problem(wrap(namespace, name), kind)
        if problem:
            raise OptionError(f"option {option}: in namespace {namespace!r}, {problem}")


def _send_statuses(name: str, value: str) -> Tuple[str, ...]:
    statuses = [s.strip().upper() for s in value.split(",") if s.strip()]
    for status in statuses:
        if status not in SEND_STATUSES:
            raise OptionError(f"option {name}: {status!r} is not a send status; use some of "
                              f"{', '.join(SEND_STATUSES)}")
    return tuple(dict.fromkeys([SEND_OK] + statuses))


SINK_OPTIONS = OptionTable("the rocketmq sink", CONNECTION + (
    ENDPOINTS,
    Option("topic", "topic", topic_name, None, "the topic of rows without a topic value"),
    Option("producerGroup", "producer_group", group_name, None,
           "the producer group sent with each request",
           shown_default="spark-rocketmq-sink-<query name or id> for streams, "
                         "spark-rocketmq-sink-<job token> for df.write"),
    Option("sendTimeoutMs", "send_timeout_ms", integer(1, 3_600_000), 5000,
           "how long a request may take, its retries included"),
    Option("retries", "retries", integer(0, 100), 2,
           "more attempts after a transient failure"),
    Option("compressBodyOverBytes", "compress_over", integer(-1), 4096,
           "bodies this large or larger are zlib-compressed; -1: never"),
    Option("maxBatchBytes", "max_batch_bytes", integer(1, MAX_BATCH_BYTES), DEFAULT_BATCH_BYTES,
           "the most bytes of messages in one SEND_BATCH_MESSAGE request"),
    Option("maxInFlightPerBroker", "max_in_flight_per_broker", integer(1, 1024), 4,
           "requests waiting for an answer, per broker, per task"),
    Option("brokerBusyTimeoutMs", "broker_busy_timeout_ms", integer(0, 86_400_000), 60_000,
           "how long a broker may answer only busy before the write fails"),
    Option("acceptStatuses", "accept_statuses", _send_statuses, (SEND_OK,),
           "send statuses also counted as acknowledged"),
    Option("maxMessageBytes", "max_message_bytes", integer(1, MAX_BATCH_BYTES * 4),
           MAX_MESSAGE_SIZE, "the broker's maxMessageSize"),
    Option("deliveryGuarantee", "delivery_guarantee", choice(AT_LEAST_ONCE, EXACTLY_ONCE),
           AT_LEAST_ONCE, "exactlyOnce: RocketMQ's transactional messages"),
    Option("sendBack", "send_back", group_name, None,
           "a consumer group: send each row (a message as read) back for redelivery to it"),
    Option("maxReconsumeTimes", "max_reconsume_times", integer(0, 2_147_483_647), 16,
           "with sendBack: deliveries after the first before a message goes to the DLQ"),
), passed_through=("checkpointLocation", "queryName"))  # Spark adds these to a stream's


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """Check every option; raise :class:`OptionError` naming the first one at fault."""
    storage = StorageOptions.from_raw(raw)  # checked against the store when it is opened
    raw = {k: v for k, v in raw.items() if not str(k).lower().startswith(STORAGE_PREFIX)}
    given = SINK_OPTIONS.given(
        raw, "(The sink has no path: name the topic with the option topic or a topic column.) "
        if any(str(k).lower() == "path" for k in raw) else "")
    has_ns = bool(given.get("nameserver", "").strip())
    has_ep = bool(given.get("endpoints", "").strip())
    if has_ns and has_ep:
        raise OptionError("set one of the options nameServer (RocketMQ's remoting protocol) "
                          "and endpoints (a 5.x proxy over gRPC), not both")
    if not has_ep:
        require_name_server(given, " (or endpoints, for a 5.x proxy over gRPC)")
    given = {k: v for k, v in given.items()
             if k not in ("nameserver", "endpoints") or v.strip()}
    values = SINK_OPTIONS.parse(given)
    kw: Dict[str, Any] = SINK_OPTIONS.fields(values)
    kw["connection"] = connection_settings(  # a proxy speaks TLS unless told otherwise
        values, given, kw["send_timeout_ms"] / 1000.0, tls_default=has_ep)
    if values.get("deliveryGuarantee") == EXACTLY_ONCE and has_ep:
        raise OptionError("option deliveryGuarantee=exactlyOnce works over RocketMQ's "
                          "remoting protocol (nameServer) only: this sink does not speak a 5.x "
                          "proxy's transactional gRPC calls (EndTransaction and the telemetry "
                          "stream's recovery commands) yet. Use nameServer, or atLeastOnce "
                          "with endpoints")
    _names_fit(kw)
    check_send_back_options(given, kw)
    if given.get("checkpointlocation", "").strip():
        kw["checkpoint_location"] = given["checkpointlocation"].strip()
    if storage.values and values.get("deliveryGuarantee") != EXACTLY_ONCE:
        named = ", ".join("checkpointStorage." + k for k in sorted(storage.values))
        raise OptionError(f"option(s) {named} place the record of "
                          "deliveryGuarantee=exactlyOnce, which this sink does not keep "
                          "(delivery is atLeastOnce): drop them or set "
                          "deliveryGuarantee=exactlyOnce")
    kw["checkpoint_storage"] = storage
    return SinkOptions(**kw)
