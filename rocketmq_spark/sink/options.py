"""The sink's options: parsed and checked once, on the driver, before anything is sent.

Names follow the source where the concept is the same (``nameServer``, ``accessKey``,
``tls``...) and RocketMQ's Java producer for the rest (``sendTimeoutMs`` is its
``sendMsgTimeout``, ``retries`` its ``retryTimesWhenSendFailed``, ``compressBodyOverBytes`` its
``compressMsgBodyOverHowmuch``). Every error names the option at fault.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from ..client.acl import Credentials
from ..client.config import parse_name_servers
from ..client.send_pipeline import SEND_OK, SEND_STATUSES
from ..client.producer import MAX_MESSAGE_SIZE
from ..client.settings import ConnectionSettings
from ..options import (
    OptionError, lower_keys, parse_credentials, parse_int, parse_tls,
    reject_unknown,
)

KNOWN = {
    "nameserver": "nameServer",
    "endpoints": "endpoints",
    "topic": "topic",
    "producergroup": "producerGroup",
    "accesskey": "accessKey",
    "secretkey": "secretKey",
    "tls": "tls",
    "tlscafile": "tlsCaFile",
    "tlsverify": "tlsVerify",
    "sendtimeoutms": "sendTimeoutMs",
    "retries": "retries",
    "compressbodyoverbytes": "compressBodyOverBytes",
    "maxbatchbytes": "maxBatchBytes",
    "maxinflightperbroker": "maxInFlightPerBroker",
    "acceptstatuses": "acceptStatuses",
    "maxmessagebytes": "maxMessageBytes",
    "deliveryguarantee": "deliveryGuarantee",
}
# Spark adds these to a streaming sink's options; they are not ours to check.
SPARK_ADDED = {"checkpointlocation": "checkpointLocation", "queryname": "queryName"}

TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
GROUP = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
DEFAULT_BATCH_BYTES = 1024 * 1024
# The largest request a 4.x broker decodes is 16 MiB; a batch of 4 MiB is Java's limit too.
MAX_BATCH_BYTES = 4 * 1024 * 1024
AT_LEAST_ONCE = "atLeastOnce"
EXACTLY_ONCE = "exactlyOnce"


@dataclass(frozen=True)
class SinkOptions:
    """What ``df.write`` / ``writeStream`` with ``format("rocketmq")`` was asked to do.

    ``name_servers`` (remoting) or ``endpoints`` (a 5.x proxy, gRPC): exactly one is set.
    ``topic``: the topic of rows without a ``topic`` column value. ``compress_over``: bodies
    of this many bytes or more are zlib-compressed (-1: never)."""

    name_servers: Tuple[str, ...] = ()
    endpoints: Optional[str] = None
    topic: Optional[str] = None
    producer_group: Optional[str] = None
    credentials: Optional[Credentials] = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_verify: bool = True
    send_timeout_ms: int = 5000
    retries: int = 2
    compress_over: int = 4096
    max_batch_bytes: int = DEFAULT_BATCH_BYTES
    max_in_flight_per_broker: int = 4
    accept_statuses: Tuple[str, ...] = (SEND_OK,)
    max_message_bytes: int = MAX_MESSAGE_SIZE
    delivery_guarantee: str = AT_LEAST_ONCE
    checkpoint_location: Optional[str] = None

    @property
    def exactly_once(self) -> bool:
        return self.delivery_guarantee == EXACTLY_ONCE

    @property
    def transport(self) -> str:
        return "grpc" if self.endpoints else "remoting"

    def connection(self) -> ConnectionSettings:
        """The remoting connection settings (the client pool's key)."""
        return ConnectionSettings(self.name_servers, self.credentials, self.tls,
                                  self.tls_ca_file, self.tls_verify,
                                  max(3.0, self.send_timeout_ms / 1000.0))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if k != "credentials")
        return f"SinkOptions({shown}, credentials={'<set>' if self.credentials else None})"


def check_topic(name: str, topic: str) -> str:
    if not TOPIC.match(topic):
        raise OptionError(f"option {name}: {topic!r} is not a valid topic name (letters, "
                          "digits, %, |, _ and -, at most 127)")
    return topic


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """Check every option; raise :class:`OptionError` naming the first one at fault."""
    reject_unknown(raw, {**KNOWN, **SPARK_ADDED}, "the rocketmq sink",
                   "(The sink has no path: name the topic with the option topic or a topic "
                   "column.) " if any(str(k).lower() == "path" for k in raw) else "")
    opts = lower_keys(raw)
    kw = {}
    has_ns = bool(opts.get("nameserver", "").strip())
    has_ep = bool(opts.get("endpoints", "").strip())
    if has_ns and has_ep:
        raise OptionError("set one of the options nameServer (RocketMQ's remoting protocol) "
                          "and endpoints (a 5.x proxy over gRPC), not both")
    if not has_ns and not has_ep:
        raise OptionError("option nameServer is required, e.g. \"host:9876;host2:9876\" (or "
                          "endpoints, for a 5.x proxy over gRPC)")
    if has_ns:
        try:
            kw["name_servers"] = tuple(parse_name_servers(opts["nameserver"]))
        except ValueError as exc:
            raise OptionError(f"option nameServer: {exc}") from None
    else:
        endpoints = opts["endpoints"].strip()
        for item in endpoints.replace(",", ";").split(";"):
            host, sep, port = item.strip().rpartition(":")
            if item.strip() and (not sep or not host or not port.isdigit()):
                raise OptionError(f"option endpoints: {item.strip()!r} is not host:port")
        kw["endpoints"] = endpoints
    if "topic" in opts:
        kw["topic"] = check_topic("topic", opts["topic"].strip())
    if "producergroup" in opts:
        group = opts["producergroup"].strip()
        if not GROUP.match(group):
            raise OptionError(f"option producerGroup {group!r} is not a valid group name "
                              "(letters, digits, %, |, _ and -, at most 255)")
        kw["producer_group"] = group
    kw["credentials"] = parse_credentials(opts)
    kw["tls"], kw["tls_ca_file"], kw["tls_verify"] = parse_tls(opts, default=has_ep)
    if "sendtimeoutms" in opts:
        kw["send_timeout_ms"] = parse_int("sendTimeoutMs", opts["sendtimeoutms"], 1,
                                          3_600_000)
    if "retries" in opts:
        kw["retries"] = parse_int("retries", opts["retries"], 0, 100)
    if "compressbodyoverbytes" in opts:
        kw["compress_over"] = parse_int("compressBodyOverBytes", opts["compressbodyoverbytes"],
                                        -1)
    if "maxbatchbytes" in opts:
        kw["max_batch_bytes"] = parse_int("maxBatchBytes", opts["maxbatchbytes"], 1,
                                          MAX_BATCH_BYTES)
    if "maxinflightperbroker" in opts:
        kw["max_in_flight_per_broker"] = parse_int("maxInFlightPerBroker",
                                                   opts["maxinflightperbroker"], 1, 1024)
    if "maxmessagebytes" in opts:
        kw["max_message_bytes"] = parse_int("maxMessageBytes", opts["maxmessagebytes"], 1,
                                            MAX_BATCH_BYTES * 4)
    if "acceptstatuses" in opts:
        statuses = [s.strip().upper() for s in opts["acceptstatuses"].split(",") if s.strip()]
        for status in statuses:
            if status not in SEND_STATUSES:
                raise OptionError(f"option acceptStatuses: {status!r} is not a send status; "
                                  f"use some of {', '.join(SEND_STATUSES)}")
        kw["accept_statuses"] = tuple(dict.fromkeys([SEND_OK] + statuses))
    if "deliveryguarantee" in opts:
        value = opts["deliveryguarantee"].strip()
        match = {g.lower(): g for g in (AT_LEAST_ONCE, EXACTLY_ONCE)}.get(value.lower())
        if match is None:
            raise OptionError(f"option deliveryGuarantee: {value!r} is not one of "
                              f"{AT_LEAST_ONCE}, {EXACTLY_ONCE}")
        if match == EXACTLY_ONCE and has_ep:
            raise OptionError("option deliveryGuarantee=exactlyOnce works over RocketMQ's "
                              "remoting protocol (nameServer) only: this sink does not speak "
                              "a 5.x proxy's transactional gRPC calls (EndTransaction and the "
                              "telemetry stream's recovery commands) yet. Use nameServer, or "
                              "atLeastOnce with endpoints")
        kw["delivery_guarantee"] = match
    if opts.get("checkpointlocation", "").strip():
        kw["checkpoint_location"] = opts["checkpointlocation"].strip()
    return SinkOptions(**kw)
