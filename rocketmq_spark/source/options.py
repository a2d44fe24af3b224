"""The source's options: parsed and checked once, before anything runs.

Names follow Spark's Kafka source where the concept is the same (``subscribe``,
``subscribePattern``, ``assign``, ``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``startingOffsetsByTimestamp``, ``endingTimestamp``,
``failOnDataLoss``, ``minPartitions``); ``maxMessagesPerTrigger`` is Kafka's
``maxOffsetsPerTrigger`` in RocketMQ's words. :data:`SOURCE_OPTIONS` declares them (see
:mod:`rocketmq_spark.options`); :func:`parse_source_options` parses each, then applies the
rules between them. Every error names the option at fault.
"""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..client.namespace import RETRY_PREFIX
from ..client.protocol.properties import split_tags_expression
from ..client.protocol.route import MessageQueue
from ..client.settings import ConnectionSettings
from ..options import (
    CONNECTION, ConnectionFields, Option, OptionError, OptionTable, boolean, check_topic,
    choice, comma_list, connection_settings, group_name, integer, parse_int,
    require_name_server, text,
)
from ..client.group.allocation import MACHINE_ROOM, STRATEGIES
from .namespacing import wire_names
from .offsets import queue_offsets

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class Bound:
    """Where a read starts or ends.

    ``kind`` is "earliest", "latest", "group" (the consumer group's committed offsets),
    "offsets" (``per_queue`` offsets; -2 earliest, -1 latest), "timestamp" (one store time for
    every queue) or "timestamps" (``per_queue`` store times)."""

    kind: str
    per_queue: Mapping[MessageQueue, int] = field(default_factory=dict)
    timestamp: Optional[int] = None


DEFAULT_GROUP = "spark-rocketmq-source"


@dataclass(frozen=True)
class SourceOptions(ConnectionFields):
    """What ``spark.read`` / ``readStream`` with ``format("rocketmq")`` was asked to do, as
    :func:`parse_source_options` checked it (the options are :data:`SOURCE_OPTIONS`).
    ``connection``: name servers, credentials, TLS and namespace (read through
    :class:`ConnectionFields` too: ``options.namespace``...); its ``repr`` hides the keys."""

    connection: ConnectionSettings
    topics: Tuple[str, ...] = ()
    topic_pattern: Optional[str] = None
    assigned: Tuple[MessageQueue, ...] = ()
    consumer_group: str = DEFAULT_GROUP
    group_given: bool = False
    starting: Bound = Bound("latest")
    ending: Bound = Bound("latest")
    fail_on_data_loss: bool = True
    max_messages_per_trigger: Optional[int] = None
    min_partitions: Optional[int] = None
    pull_batch_size: int = 32
    pull_timeout_ms: int = 10_000
    broker_busy_timeout_ms: int = 60_000
    filter: str = "*"
    filter_type: str = "TAG"
    filter_version: int = 0  # SQL92: when the driver built the subscription (ms), as subVersion
    include_properties: bool = False
    commit_offsets: bool = True
    offsets_refresh_interval_ms: int = 250
    verify_crc: bool = True
    membership: str = "none"
    allocate_strategy: str = "averagely"
    consistent_hash_virtual_nodes: int = 10
    machine_rooms: Tuple[str, ...] = ()
    lock_queues: bool = False
    member_name: Optional[str] = None
    rebalance_interval_ms: int = 20_000
    consume_retry_topic: bool = True

    @property
    def group_member(self) -> bool:
        """The query is one member of its consumer group (``membership=group``)."""
        return self.membership == "group"

    @property
    def retry_topic(self) -> str:
        """The group's retry topic on the wire: ``%RETRY%<group>`` (``%RETRY%ns%group``)."""
        return RETRY_PREFIX + self.consumer_group

    @property
    def reads_retry_topic(self) -> bool:
        """A group member reads its share of the group's retry queues, as Java's push
        consumers do (``consumeRetryTopic``)."""
        return self.group_member and self.consume_retry_topic

    @property
    def commits_to_group(self) -> bool:
        """Offsets go back to the broker only for a group the user named (a shared default
        group would mix unrelated queries' progress)."""
        return self.commit_offsets and self.group_given

    @property
    def tags(self) -> List[str]:
        return split_tags_expression(self.filter) if self.filter_type == "TAG" else []


# ----------------------------------------------------------------------------------- parsing


def _json(name: str, value: str):
    try:
        return json.loads(value)
    except ValueError as exc:
        raise OptionError(f"option {name} is not valid JSON ({exc}): {value!r}") from None


def _queue(name: str, topic: str, key: str) -> MessageQueue:
    broker, sep, queue_id = str(key).rpartition("/")
    if not sep or not broker or not queue_id.isdigit():
        raise OptionError(f"option {name}: queue {key!r} of topic {topic!r} must be written "
                          "\"brokerName/queueId\"")
    return MessageQueue(topic, broker, int(queue_id))


def parse_queue_values(name: str, value: str, allow_modes: bool) -> Dict[MessageQueue, int]:
    """``{"T": {"broker-a/0": 5}}``, the flat form ``{"T/broker-a/0": 5}``, or an offset as
    the checkpoint and the progress's ``endOffset`` give it (``{"version": 2, "queues": ...}``).

    With ``allow_modes``, -2 means earliest and -1 latest (as in Spark's Kafka source)."""
    obj = _json(name, value)
    if not isinstance(obj, dict) or not obj:
        raise OptionError(f"option {name} must be a non-empty JSON object of queues")
    if isinstance(obj.get("version"), int) and not isinstance(obj["version"], bool):
        try:
            obj = queue_offsets(obj)  # a checkpoint's offset: its queues, as the flat form
        except ValueError as exc:
            raise OptionError(f"option {name}: {exc}") from None
        if not obj:
            raise OptionError(f"option {name}: the offset names no queue")
    out: Dict[MessageQueue, int] = {}

    def put(mq: MessageQueue, number) -> None:
        if isinstance(number, bool) or not isinstance(number, int):
            raise OptionError(f"option {name}: the value for {mq.key} must be an integer, "
                              f"got {number!r}")
        low = EARLIEST if allow_modes else 0
        if number < low:
            raise OptionError(f"option {name}: the value for {mq.key} must be >= {low}, "
                              f"got {number}")
        out[mq] = number

    for key, inner in obj.items():
        if isinstance(inner, dict):
            if not inner:
                raise OptionError(f"option {name}: topic {key!r} lists no queues")
            for queue_key, number in inner.items():
                put(_queue(name, key, queue_key), number)
        else:
            try:
                mq = MessageQueue.from_key(key)
            except ValueError:
                raise OptionError(f"option {name}: {key!r} must map to an object of queues, or "
                                  "be a \"topic/brokerName/queueId\" key") from None
            put(mq, inner)
    return out


def _position(name: str, value: str, modes: Tuple[str, ...]) -> Bound:
    text = value.strip()
    if text.lower() in modes:
        return Bound(text.lower())
    if text.startswith("{"):
        return Bound("offsets", parse_queue_values(name, text, allow_modes=True))
    raise OptionError(f"option {name} must be one of {', '.join(modes)} or a JSON object of "
                      f"queues, got {value!r}")




def _positions(*modes: str):
    return lambda name, value: _position(name, value, modes)


def _topic_list(name: str, value: str) -> Tuple[str, ...]:
    topics = comma_list(name, value)
    if not topics:
        raise OptionError(f"option {name} must list at least one topic")
    return tuple(dict.fromkeys(check_topic(name, topic) for topic in topics))


def _regex(name: str, value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise OptionError(f"option {name} is not a valid regular expression: {exc}") from None
    return value


def _queue_list(name: str, value: str) -> Tuple[MessageQueue, ...]:
    queues = _json(name, value)
    if not isinstance(queues, list) or not queues:
        raise OptionError(f"option {name} must be a non-empty JSON list of queues, e.g. "
                          '[{"topic":"T","brokerName":"broker-a","queueId":0}] or '
                          '["T/broker-a/0"]')
    assigned = []
    for item in queues:
        try:
            if isinstance(item, str):
                assigned.append(MessageQueue.from_key(item))
            else:
                assigned.append(MessageQueue(str(item["topic"]), str(item["brokerName"]),
                                             int(item["queueId"])))
        except (KeyError, TypeError, ValueError):
            raise OptionError(f"option {name}: {item!r} is not a queue; write "
                              '{"topic":..,"brokerName":..,"queueId":..} or '
                              '"topic/brokerName/queueId"') from None
    return tuple(sorted(set(assigned)))


def _timestamp(name: str, value: str) -> Bound:
    return Bound("timestamp", timestamp=parse_int(name, value, 0))


def _timestamps(name: str, value: str) -> Bound:
    return Bound("timestamps", parse_queue_values(name, value, allow_modes=False))


def _tag_expression(name: str, value: str) -> str:
    expression = value.strip() or "*"
    if "*" in expression and expression != "*":
        raise OptionError(f"option {name}: {value!r} mixes * with tags; use * alone or tags "
                          "joined with ||")
    if any(c in expression for c in "\x01\x02"):
        raise OptionError(f"option {name} contains a control character")
    return expression


def _member_name(name: str, value: str) -> str:
    member = value.strip()
    if not re.match(r"^[A-Za-z0-9_.:-]{1,64}$", member):
        raise OptionError(f"option {name} {value!r} must be 1 to 64 letters, digits, '.', ':', "
                          "'_' or '-' (it goes into the client id)")
    return member


SUBSCRIPTION = ("subscribe", "subscribePattern", "assign")
STARTS = ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
ENDS = ("endingOffsets", "endingTimestamp")
MEMBER_ONLY = ("allocateStrategy", "consistentHashVirtualNodes", "allocateMachineRooms",
               "lockQueues", "memberName", "rebalanceIntervalMs", "consumeRetryTopic")

SOURCE_OPTIONS = OptionTable("the rocketmq source", CONNECTION + (
    Option("subscribe", "topics", _topic_list, (), "a comma list of topics",
           shown_default="exactly one"),
    Option("subscribePattern", "topic_pattern", _regex, None,
           "a regular expression over the cluster's topics", shown_default="exactly one"),
    Option("assign", "assigned", _queue_list, (), "a JSON list of queues",
           shown_default="exactly one"),
    Option("consumerGroup", "consumer_group", group_name, DEFAULT_GROUP,
           "the group pulls name; offsets are read and committed only for a group given"),
    Option("startingOffsets", "starting", _positions("earliest", "latest", "group"), None,
           "earliest, latest, group or JSON per queue",
           shown_default="latest (stream), earliest (batch)"),
    Option("startingTimestamp", "starting", _timestamp, None,
           "one store time (ms) for every queue"),
    Option("startingOffsetsByTimestamp", "starting", _timestamps, None,
           "store times (ms) per queue, as JSON"),
    Option("endingOffsets", "ending", _positions("latest"), Bound("latest"),
           "batch only: latest or JSON per queue", shown_default="latest"),
    Option("endingTimestamp", "ending", _timestamp, None,
           "batch only: stop before the first message stored at or after it"),
    Option("failOnDataLoss", "fail_on_data_loss", boolean, True,
           "fail when messages of a planned range are gone"),
    Option("maxMessagesPerTrigger", "max_messages_per_trigger", integer(1), None,
           "streams: at most this many messages per micro-batch", shown_default="unlimited"),
    Option("minPartitions", "min_partitions", integer(1, 100_000), None,
           "cut queue ranges into at least this many partitions",
           shown_default="one per queue"),
    Option("pullBatchSize", "pull_batch_size", integer(1, 65_536), 32,
           "messages asked for per pull"),
    Option("pullTimeoutMs", "pull_timeout_ms", integer(1, 3_600_000), 10_000,
           "per-request timeout"),
    Option("brokerBusyTimeoutMs", "broker_busy_timeout_ms", integer(0, 3_600_000), 60_000,
           "how long pulls ride out a broker's flow control (busy answers) before failing"),
    Option("filterType", "filter_type", choice("TAG", "SQL92"), "TAG",
           "SQL92: filter is a SQL92 expression over message properties (broker-side)"),
    Option("filter", "filter", text, "*", "a TAG expression, or SQL92 with filterType=SQL92"),
    Option("includeProperties", "include_properties", boolean, False,
           "add a properties map column"),
    Option("commitOffsets", "commit_offsets", boolean, True,
           "commit each completed batch's end to consumerGroup"),
    Option("offsetsRefreshIntervalMs", "offsets_refresh_interval_ms", integer(0, 600_000), 250,
           "how old cached max offsets may be while a stream is idle"),
    Option("verifyCrc", "verify_crc", boolean, True, "check each message's body CRC"),
    Option("membership", "membership", choice("none", "group"), "none",
           "group: share consumerGroup's queues with its other members"),
    Option("allocateStrategy", "allocate_strategy", choice(*STRATEGIES), "averagely",
           "how the group's members split the queues"),
    Option("consistentHashVirtualNodes", "consistent_hash_virtual_nodes",
           integer(1, 10_000), 10, "points per member on the ring (consistentHash)"),
    Option("allocateMachineRooms", "machine_rooms", comma_list, (),
           "the rooms whose queues the group reads (machineRoom)"),
    Option("lockQueues", "lock_queues", boolean, False,
           "read a queue only while holding its broker lock"),
    Option("memberName", "member_name", _member_name, None, "goes into the client id"),
    Option("rebalanceIntervalMs", "rebalance_interval_ms", integer(100, 3_600_000), 20_000,
           "the longest time between two rebalances"),
    Option("consumeRetryTopic", "consume_retry_topic", boolean, True,
           "read this member's share of the group's retry queues (%RETRY%<group>)"),
))


def parse_source_options(raw: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check every option; raise :class:`OptionError` naming the first one at fault."""
    given = SOURCE_OPTIONS.given(raw)
    require_name_server(given)
    _one_subscription(given)
    values = SOURCE_OPTIONS.parse(given)
    kw = SOURCE_OPTIONS.fields(values)
    kw["group_given"] = "consumerGroup" in values
    kw["connection"] = connection_settings(values, given, kw["pull_timeout_ms"] / 1000.0)
    _bounds(values, kw, streaming)
    if "maxMessagesPerTrigger" in values and not streaming:
        raise OptionError("option maxMessagesPerTrigger is for streaming queries")
    if values.get("commitOffsets") and not kw["group_given"]:
        raise OptionError("commitOffsets=true needs the option consumerGroup (the group the "
                          "offsets are committed to)")
    _membership(values, kw, streaming)
    wire_names(kw)
    _filter(values, kw)
    return SourceOptions(**kw)


def _filter(values: Mapping[str, Any], kw: Dict[str, Any]) -> None:
    """``filter`` as ``filterType`` reads it: a TAG expression, or SQL92 checked here on the
    driver (a broker takes a bad SQL92 expression as ``*`` and sends every message)."""
    if kw.get("filter_type", "TAG") == "TAG":
        kw["filter"] = _tag_expression("filter", values.get("filter", "*"))
        return
    kw["filter"] = _sql92_expression(values.get("filter", ""))
    kw["filter_version"] = int(time.time() * 1000)


def _sql92_expression(value: str) -> str:
    from ..client.filter import FilterSyntaxError, parse_sql92

    expression = value.strip()
    if not expression:
        raise OptionError("option filter must be a SQL92 expression with filterType=SQL92, "
                          "e.g. \"region = 'eu' AND amount > 100\"")
    try:
        parsed = parse_sql92(expression)
    except FilterSyntaxError as exc:
        where = "at the end" if exc.position > len(expression) else f"at column {exc.position}"
        caret = str(exc).partition("\n")[2]  # the expression, and a caret under the fault
        raise OptionError(f"option filter (filterType=SQL92) is not valid SQL92 {where} "
                          f"(position {exc.position}): {exc.reason}\n{caret}") from None
    if parsed.uses_string_match_operators:
        log.warning("option filter %r uses CONTAINS, STARTSWITH or ENDSWITH, which brokers "
                    "before %s do not know: such a broker reads the words as property names and "
                    "stops parsing there, so it selects other messages than meant (none, "
                    "every one, or those of a shorter expression)", expression,
                    parsed.minimum_broker_version)
    return expression


def _one_subscription(given: Mapping[str, str]) -> None:
    chosen = [name for name in SUBSCRIPTION if name.lower() in given]
    if len(chosen) != 1:
        raise OptionError("exactly one of the options subscribe, subscribePattern and assign "
                          f"must be set, got {len(chosen)}"
                          + (f" ({', '.join(chosen)})" if chosen else ""))


def _bounds(values: Mapping[str, Any], kw: Dict[str, Any], streaming: bool) -> None:
    """Where the read starts and ends: at most one option each, and what the query allows."""
    starts = [name for name in STARTS if name in values]
    if len(starts) > 1:
        raise OptionError("set at most one of startingOffsets, startingTimestamp and "
                          "startingOffsetsByTimestamp, got " + ", ".join(starts))
    kw["starting"] = values[starts[0]] if starts else Bound(
        "latest" if streaming else "earliest")
    if kw["starting"].kind == "group" and not kw["group_given"]:
        raise OptionError("startingOffsets=group needs the option consumerGroup")
    ends = [name for name in ENDS if name in values]
    if ends and streaming:
        raise OptionError(f"option {ends[0]} is for batch queries (spark.read); a stream has "
                          "no end")
    if len(ends) > 1:
        raise OptionError("set at most one of endingOffsets and endingTimestamp")
    if EARLIEST in kw["ending"].per_queue.values():
        raise OptionError("option endingOffsets cannot use -2 (earliest) for a queue")
    if not streaming and kw["starting"].kind == "latest":
        raise OptionError("startingOffsets=latest makes an empty batch query; use it with "
                          "spark.readStream")
    if not streaming and LATEST in kw["starting"].per_queue.values():
        raise OptionError("option startingOffsets cannot use -1 (latest) in a batch query")


def _membership(values: Mapping[str, Any], kw: Dict[str, Any], streaming: bool) -> None:
    """``membership=group``: the query shares its topics' queues with the consumer group's
    other members (see :mod:`..client.group.membership`)."""
    if values.get("membership", "none") == "none":
        given = [name for name in MEMBER_ONLY if name in values]
        if given:
            raise OptionError(f"option {given[0]} needs membership=group")
        return
    if not streaming:
        raise OptionError("option membership=group is for streaming queries (spark.readStream); "
                          "a batch query reads the offsets it is given")
    if not kw["group_given"]:
        raise OptionError("membership=group needs the option consumerGroup (the group to join)")
    if kw["assigned"]:
        raise OptionError("membership=group shares a subscription's queues with the group; it "
                          "cannot be used with assign (use subscribe or subscribePattern)")
    if not kw["commit_offsets"]:
        raise OptionError("membership=group hands queues over through the group's committed "
                          "offsets; it cannot be used with commitOffsets=false")
    strategy = kw["allocate_strategy"]
    if "consistentHashVirtualNodes" in values and strategy != "consistentHash":
        raise OptionError("option consistentHashVirtualNodes needs "
                          "allocateStrategy=consistentHash")
    if strategy == MACHINE_ROOM and not kw["machine_rooms"]:
        raise OptionError("allocateStrategy=machineRoom needs the option allocateMachineRooms: "
                          "the rooms (the part of a broker name before '@') whose queues the "
                          "group reads, e.g. \"hz1,hz2\"")
    if strategy != MACHINE_ROOM and "allocateMachineRooms" in values:
        raise OptionError("option allocateMachineRooms needs allocateStrategy=machineRoom")
