"""The source's options: parsed and checked once, before anything runs.

Names follow Spark's Kafka source where the concept is the same (``subscribe``,
``subscribePattern``, ``assign``, ``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``startingOffsetsByTimestamp``, ``endingTimestamp``,
``failOnDataLoss``, ``minPartitions``); ``maxMessagesPerTrigger`` is Kafka's
``maxOffsetsPerTrigger`` in RocketMQ's words. Every error names the option at fault.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from ..client.acl import Credentials
from ..client.config import parse_name_servers
from ..client.protocol.properties import split_tags_expression
from ..client.protocol.route import MessageQueue
# One error class and the same checks for the source and the sink.
from ..options import (
    OptionError, lower_keys, parse_bool as _bool, parse_credentials, parse_int as _int, parse_tls,
    reject_unknown,
)

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


KNOWN = {
    "nameserver": "nameServer",
    "subscribe": "subscribe",
    "subscribepattern": "subscribePattern",
    "assign": "assign",
    "consumergroup": "consumerGroup",
    "startingoffsets": "startingOffsets",
    "startingtimestamp": "startingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "endingoffsets": "endingOffsets",
    "endingtimestamp": "endingTimestamp",
    "failondataloss": "failOnDataLoss",
    "maxmessagespertrigger": "maxMessagesPerTrigger",
    "minpartitions": "minPartitions",
    "pullbatchsize": "pullBatchSize",
    "pulltimeoutms": "pullTimeoutMs",
    "filter": "filter",
    "includeproperties": "includeProperties",
    "accesskey": "accessKey",
    "secretkey": "secretKey",
    "tls": "tls",
    "tlscafile": "tlsCaFile",
    "tlsverify": "tlsVerify",
    "commitoffsets": "commitOffsets",
    "offsetsrefreshintervalms": "offsetsRefreshIntervalMs",
    "verifycrc": "verifyCrc",
    "membership": "membership",
    "allocatestrategy": "allocateStrategy",
    "consistenthashvirtualnodes": "consistentHashVirtualNodes",
    "allocatemachinerooms": "allocateMachineRooms",
    "lockqueues": "lockQueues",
    "membername": "memberName",
    "rebalanceintervalms": "rebalanceIntervalMs",
}

DEFAULT_GROUP = "spark-rocketmq-source"
_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")


@dataclass(frozen=True)
class SourceOptions:
    name_servers: Tuple[str, ...]
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
    filter: str = "*"
    include_properties: bool = False
    credentials: Optional[Credentials] = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_verify: bool = True
    commit_offsets: bool = True
    offsets_refresh_interval_ms: int = 50
    verify_crc: bool = True
    membership: str = "none"
    allocate_strategy: str = "averagely"
    consistent_hash_virtual_nodes: int = 10
    machine_rooms: Tuple[str, ...] = ()
    lock_queues: bool = False
    member_name: Optional[str] = None
    rebalance_interval_ms: int = 20_000

    @property
    def group_member(self) -> bool:
        """The query is one member of its consumer group (``membership=group``)."""
        return self.membership == "group"

    @property
    def commits_to_group(self) -> bool:
        """Offsets go back to the broker only for a group the user named (a shared default
        group would mix unrelated queries' progress)."""
        return self.commit_offsets and self.group_given

    @property
    def tags(self) -> List[str]:
        return split_tags_expression(self.filter)

    def __repr__(self) -> str:
        # Neither key is shown (the access key is a credential too): only whether they are set.
        shown = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if k != "credentials")
        return f"SourceOptions({shown}, credentials={'<set>' if self.credentials else None})"


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
    """``{"T": {"broker-a/0": 5}}`` or the flat checkpoint form ``{"T/broker-a/0": 5}``.

    With ``allow_modes``, -2 means earliest and -1 latest (as in Spark's Kafka source)."""
    obj = _json(name, value)
    if not isinstance(obj, dict) or not obj:
        raise OptionError(f"option {name} must be a non-empty JSON object of queues")
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


MEMBERSHIP_MODES = ("none", "group")
MEMBER_ONLY = ("allocatestrategy", "consistenthashvirtualnodes", "allocatemachinerooms",
               "lockqueues", "membername", "rebalanceintervalms")


def _membership_options(opts: Dict[str, str], kw: Dict[str, object], streaming: bool) -> None:
    """``membership=group``: the query shares its topics' queues with the consumer group's other
    members (see :mod:`.membership`)."""
    from .allocation import MACHINE_ROOM, STRATEGIES  # light: no Spark, no network

    mode = opts.get("membership", "none").strip().lower()
    if mode not in MEMBERSHIP_MODES:
        raise OptionError(f"option membership must be none or group, got {opts['membership']!r}")
    given = [KNOWN[k] for k in MEMBER_ONLY if k in opts]
    if mode == "none":
        if given:
            raise OptionError(f"option {given[0]} needs membership=group")
        return
    if not streaming:
        raise OptionError("option membership=group is for streaming queries (spark.readStream); "
                          "a batch query reads the offsets it is given")
    if not kw.get("group_given"):
        raise OptionError("membership=group needs the option consumerGroup (the group to join)")
    if kw.get("assigned"):
        raise OptionError("membership=group shares a subscription's queues with the group; it "
                          "cannot be used with assign (use subscribe or subscribePattern)")
    if kw.get("commit_offsets") is False:
        raise OptionError("membership=group hands queues over through the group's committed "
                          "offsets; it cannot be used with commitOffsets=false")
    kw["membership"] = mode
    if "allocatestrategy" in opts:
        wanted = opts["allocatestrategy"].strip()
        by_lower = {s.lower(): s for s in STRATEGIES}
        if wanted.lower() not in by_lower:
            raise OptionError(f"option allocateStrategy must be one of {', '.join(STRATEGIES)}, "
                              f"got {opts['allocatestrategy']!r}")
        kw["allocate_strategy"] = by_lower[wanted.lower()]
    if "consistenthashvirtualnodes" in opts:
        if kw.get("allocate_strategy") != "consistentHash":
            raise OptionError("option consistentHashVirtualNodes needs "
                              "allocateStrategy=consistentHash")
        kw["consistent_hash_virtual_nodes"] = _int("consistentHashVirtualNodes",
                                                   opts["consistenthashvirtualnodes"], 1, 10_000)
    rooms = tuple(r.strip() for r in opts.get("allocatemachinerooms", "").split(",")
                  if r.strip())
    if kw.get("allocate_strategy") == MACHINE_ROOM:
        if not rooms:
            raise OptionError("allocateStrategy=machineRoom needs the option "
                              "allocateMachineRooms: the rooms (the part of a broker name before "
                              "'@') whose queues the group reads, e.g. \"hz1,hz2\"")
        kw["machine_rooms"] = rooms
    elif "allocatemachinerooms" in opts:
        raise OptionError("option allocateMachineRooms needs allocateStrategy=machineRoom")
    if "lockqueues" in opts:
        kw["lock_queues"] = _bool("lockQueues", opts["lockqueues"])
    if "membername" in opts:
        name = opts["membername"].strip()
        if not re.match(r"^[A-Za-z0-9_.:-]{1,64}$", name):
            raise OptionError(f"option memberName {opts['membername']!r} must be 1 to 64 "
                              "letters, digits, '.', ':', '_' or '-' (it goes into the client id)")
        kw["member_name"] = name
    if "rebalanceintervalms" in opts:
        kw["rebalance_interval_ms"] = _int("rebalanceIntervalMs", opts["rebalanceintervalms"],
                                           100, 3_600_000)


def parse_options(raw: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check every option; raise :class:`OptionError` naming the first one at fault."""
    opts = lower_keys(raw)
    reject_unknown(raw, KNOWN, "the rocketmq source")

    if "nameserver" not in opts or not opts["nameserver"].strip():
        raise OptionError("option nameServer is required, e.g. \"host:9876;host2:9876\"")
    try:
        name_servers = tuple(parse_name_servers(opts["nameserver"]))
    except ValueError as exc:
        raise OptionError(f"option nameServer: {exc}") from None

    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise OptionError("exactly one of the options subscribe, subscribePattern and assign "
                          f"must be set, got {len(chosen)}"
                          + (f" ({', '.join(KNOWN[c] for c in chosen)})" if chosen else ""))
    kw: Dict[str, object] = {"name_servers": name_servers}
    if "subscribe" in opts:
        topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe must list at least one topic")
        for topic in topics:
            if not _TOPIC.match(topic):
                raise OptionError(f"option subscribe: {topic!r} is not a valid topic name "
                                  "(letters, digits, %, |, _ and -, at most 127)")
        kw["topics"] = tuple(dict.fromkeys(topics))
    elif "subscribepattern" in opts:
        try:
            re.compile(opts["subscribepattern"])
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a valid regular expression: "
                              f"{exc}") from None
        kw["topic_pattern"] = opts["subscribepattern"]
    else:
        queues = _json("assign", opts["assign"])
        if not isinstance(queues, list) or not queues:
            raise OptionError("option assign must be a non-empty JSON list of queues, e.g. "
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
                raise OptionError(f"option assign: {item!r} is not a queue; write "
                                  '{"topic":..,"brokerName":..,"queueId":..} or '
                                  '"topic/brokerName/queueId"') from None
        kw["assigned"] = tuple(sorted(set(assigned)))

    if "consumergroup" in opts:
        group = opts["consumergroup"].strip()
        if not re.match(r"^[%|a-zA-Z0-9_-]{1,255}$", group):
            raise OptionError(f"option consumerGroup {group!r} is not a valid group name "
                              "(letters, digits, %, |, _ and -, at most 255)")
        kw["consumer_group"], kw["group_given"] = group, True

    starts = [k for k in ("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp")
              if k in opts]
    if len(starts) > 1:
        raise OptionError("set at most one of startingOffsets, startingTimestamp and "
                          "startingOffsetsByTimestamp, got "
                          + ", ".join(KNOWN[k] for k in starts))
    kw["starting"] = Bound("latest" if streaming else "earliest")
    if "startingoffsets" in opts:
        kw["starting"] = _position("startingOffsets", opts["startingoffsets"],
                                   ("earliest", "latest", "group"))
        if kw["starting"].kind == "group" and not kw.get("group_given"):
            raise OptionError("startingOffsets=group needs the option consumerGroup")
    elif "startingtimestamp" in opts:
        kw["starting"] = Bound("timestamp", timestamp=_int(
            "startingTimestamp", opts["startingtimestamp"], 0))
    elif "startingoffsetsbytimestamp" in opts:
        kw["starting"] = Bound("timestamps", parse_queue_values(
            "startingOffsetsByTimestamp", opts["startingoffsetsbytimestamp"], False))

    ends = [k for k in ("endingoffsets", "endingtimestamp") if k in opts]
    if ends and streaming:
        raise OptionError(f"option {KNOWN[ends[0]]} is for batch queries (spark.read); a "
                          "stream has no end")
    if len(ends) > 1:
        raise OptionError("set at most one of endingOffsets and endingTimestamp")
    if "endingoffsets" in opts:
        kw["ending"] = _position("endingOffsets", opts["endingoffsets"], ("latest",))
        if EARLIEST in kw["ending"].per_queue.values():
            raise OptionError("option endingOffsets cannot use -2 (earliest) for a queue")
    elif "endingtimestamp" in opts:
        kw["ending"] = Bound("timestamp", timestamp=_int(
            "endingTimestamp", opts["endingtimestamp"], 0))
    if not streaming and kw["starting"].kind == "latest":
        raise OptionError("startingOffsets=latest makes an empty batch query; use it with "
                          "spark.readStream")
    if not streaming and LATEST in kw["starting"].per_queue.values():
        raise OptionError("option startingOffsets cannot use -1 (latest) in a batch query")

    if "failondataloss" in opts:
        kw["fail_on_data_loss"] = _bool("failOnDataLoss", opts["failondataloss"])
    if "maxmessagespertrigger" in opts:
        if not streaming:
            raise OptionError("option maxMessagesPerTrigger is for streaming queries")
        kw["max_messages_per_trigger"] = _int("maxMessagesPerTrigger",
                                              opts["maxmessagespertrigger"])
    if "minpartitions" in opts:
        kw["min_partitions"] = _int("minPartitions", opts["minpartitions"], 1, 100_000)
    if "pullbatchsize" in opts:
        kw["pull_batch_size"] = _int("pullBatchSize", opts["pullbatchsize"], 1, 65_536)
    if "pulltimeoutms" in opts:
        kw["pull_timeout_ms"] = _int("pullTimeoutMs", opts["pulltimeoutms"], 1, 3_600_000)
    if "filter" in opts:
        expression = opts["filter"].strip() or "*"
        if "*" in expression and expression != "*":
            raise OptionError(f"option filter: {opts['filter']!r} mixes * with tags; use * "
                              "alone or tags joined with ||")
        if any(c in expression for c in "\x01\x02"):
            raise OptionError("option filter contains a control character")
        kw["filter"] = expression
    if "includeproperties" in opts:
        kw["include_properties"] = _bool("includeProperties", opts["includeproperties"])
    kw["credentials"] = parse_credentials(opts)
    kw["tls"], kw["tls_ca_file"], kw["tls_verify"] = parse_tls(opts)
    if "commitoffsets" in opts:
        kw["commit_offsets"] = _bool("commitOffsets", opts["commitoffsets"])
        if kw["commit_offsets"] and not kw.get("group_given"):
            raise OptionError("commitOffsets=true needs the option consumerGroup (the group "
                              "the offsets are committed to)")
    if "offsetsrefreshintervalms" in opts:
        kw["offsets_refresh_interval_ms"] = _int("offsetsRefreshIntervalMs",
                                                 opts["offsetsrefreshintervalms"], 0, 600_000)
    if "verifycrc" in opts:
        kw["verify_crc"] = _bool("verifyCrc", opts["verifycrc"])
    _membership_options(opts, kw, streaming)
    return SourceOptions(**kw)
