"""Consumer and producer registries fed by heartbeats (the broker's ConsumerManager).

Members are keyed by connection, as the genuine broker keys them by channel: a client is a group
member while its connection is open and it has heartbeated within the expiry (120 s). A change of
members or subscriptions sends NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every member's
connection, which is how clients learn to rebalance.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from ..client.protocol.properties import java_string_hash, split_tags_expression
from .property_filter import ConsumerFilters
from .subscription_groups import SubscriptionGroups

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                "CONSUME_FROM_TIMESTAMP")


def enum_name(value, names) -> str:
    """fastjson reads an enum from its name or its ordinal (the C++ client sends ordinals)."""
    if isinstance(value, int) and 0 <= value < len(names):
        return names[value]
    if isinstance(value, str):
        if value.isdigit() and int(value) < len(names):
            return names[int(value)]
        return value
    return names[0]


@dataclass(frozen=True)
class Subscription:
    """A TAG subscription as the broker filters with it: ``codes`` empty means everything."""

    topic: str
    sub_string: str = "*"
    codes: frozenset = frozenset()
    sub_version: int = 0
    expression_type: str = "TAG"

    @property
    def match_all(self) -> bool:
        return self.sub_string == "*"


def build_subscription(topic: str, expression: Optional[str], expression_type: Optional[str] = None,
                       sub_version: int = 0) -> Subscription:
    """The genuine FilterAPI.build: ``*``/empty = all; else tags split on ``||``, trimmed,
    each kept as its Java hash code."""
    tags = split_tags_expression(expression or "")
    if not tags:
        return Subscription(topic, "*", frozenset(), sub_version, expression_type or "TAG")
    return Subscription(topic, expression or "", frozenset(java_string_hash(t) for t in tags),
                        sub_version, expression_type or "TAG")


def subscription_from_heartbeat(data: dict) -> Subscription:
    """A subscriptionDataSet entry: Java sends codeSet, the C++ client only subString."""
    topic = str(data.get("topic", ""))
    sub_string = data.get("subString") or "*"
    try:
        version = int(data.get("subVersion") or 0)
    except (TypeError, ValueError):
        version = 0
    expr_type = data.get("expressionType") or "TAG"
    if expr_type.upper() != "TAG":  # SQL92: kept as sent, without tags (FilterAPI.build)
        return Subscription(topic, sub_string, frozenset(), version, expr_type)
    codes = data.get("codeSet")
    if sub_string != "*" and codes:
        return Subscription(topic, sub_string, frozenset(int(c) for c in codes), version,
                            expr_type)
    return build_subscription(topic, sub_string, expr_type, version)


@dataclass
class ChannelInfo:
    client_id: str
    language: str
    version: int
    last_update: float = field(default_factory=time.monotonic)


@dataclass
class ConsumerGroupInfo:
    name: str
    consume_type: str = "CONSUME_ACTIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: Dict[object, ChannelInfo] = field(default_factory=dict)
    subscriptions: Dict[str, Subscription] = field(default_factory=dict)

    def client_ids(self) -> List[str]:
        return [info.client_id for info in self.channels.values()]

    def update_channel(self, conn, info: ChannelInfo) -> bool:
        old = self.channels.get(conn)
        if old is None:
            self.channels[conn] = info
            return True
        if old.client_id != info.client_id:
            self.channels[conn] = info
        else:
            old.last_update = info.last_update
        return False

    def update_subscriptions(self, subs: Iterable[Subscription]) -> bool:
        """4.9.8 rules: new topics and dropped topics are changes; a newer subVersion replaces
        the entry silently."""
        updated = False
        subs = list(subs)
        for sub in subs:
            old = self.subscriptions.get(sub.topic)
            if old is None:
                self.subscriptions[sub.topic] = sub
                updated = True
            elif sub.sub_version > old.sub_version:
                self.subscriptions[sub.topic] = sub
        topics = {s.topic for s in subs}
        for topic in [t for t in self.subscriptions if t not in topics]:
            del self.subscriptions[topic]
            updated = True
        return updated


class ClientRegistry:
    """Consumer and producer groups of one broker, and the SQL92 filters their heartbeats
    registered (``filters``, the genuine ConsumerFilterManager)."""

    def __init__(self, notify: Callable[[object, str], None]):
        self._notify = notify  # notify(conn, group): send NOTIFY_CONSUMER_IDS_CHANGED
        self.consumers: Dict[str, ConsumerGroupInfo] = {}
        self.producers: Dict[str, Dict[object, ChannelInfo]] = {}
        self.filters = ConsumerFilters()
        self.subscription_groups = SubscriptionGroups()  # retry settings per group

    def _notify_group(self, group: str) -> None:
        info = self.consumers.get(group)
        if info is None:
            return
        for conn in list(info.channels):
            self._notify(conn, group)

    def register_consumer(self, group: str, conn, channel: ChannelInfo, consume_type: str,
                          message_model: str, consume_from_where: str,
                          subscriptions: Iterable[Subscription]) -> bool:
        info = self.consumers.get(group)
        if info is None:
            info = self.consumers[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        subscriptions = list(subscriptions)
        r1 = info.update_channel(conn, channel)
        r2 = info.update_subscriptions(subscriptions)
        if r1 or r2:
            self._notify_group(group)
        self.filters.register(group, subscriptions)  # on every heartbeat, as the REGISTER event
        return r1 or r2

    def unregister_consumer(self, group: str, conn) -> None:
        info = self.consumers.get(group)
        if info is None:
            return
        if info.channels.pop(conn, None) is not None:
            if not info.channels:
                del self.consumers[group]
            self._notify_group(group)

    def register_heartbeat(self, conn, cmd, data: dict,
                           each_consumer: Optional[Callable[[str, dict], None]] = None) -> None:
        """Register the consumers and producers a HEART_BEAT body (``data``, its JSON) names,
        as a broker's and a proxy's ClientManager do; ``each_consumer(group, entry)`` runs
        before each consumer is registered."""
        client_id = str(data.get("clientID") or "")
        for consumer in data.get("consumerDataSet") or []:
            group = str(consumer.get("groupName") or "")
            if each_consumer is not None:
                each_consumer(group, consumer)
            subs = [subscription_from_heartbeat(s)
                    for s in consumer.get("subscriptionDataSet") or []]
            self.register_consumer(
                group, conn, ChannelInfo(client_id, cmd.language, cmd.version),
                enum_name(consumer.get("consumeType"), CONSUME_TYPES),
                enum_name(consumer.get("messageModel"), MESSAGE_MODELS),
                enum_name(consumer.get("consumeFromWhere"), CONSUME_FROM), subs)
        for producer in data.get("producerDataSet") or []:
            self.register_producer(str(producer.get("groupName") or ""), conn,
                                   ChannelInfo(client_id, cmd.language, cmd.version))

    def register_producer(self, group: str, conn, channel: ChannelInfo) -> None:
        table = self.producers.setdefault(group, {})
        old = table.get(conn)
        if old is None or old.client_id != channel.client_id:
            table[conn] = channel
        else:
            old.last_update = channel.last_update

    def unregister_producer(self, group: str, conn) -> None:
        table = self.producers.get(group)
        if table is not None:
            table.pop(conn, None)
            if not table:
                del self.producers[group]

    def connection_closed(self, conn) -> None:
        for group in [g for g, info in self.consumers.items() if conn in info.channels]:
            self.unregister_consumer(group, conn)
        for group in [g for g, table in self.producers.items() if conn in table]:
            self.unregister_producer(group, conn)

    def expired_connections(self, max_idle: float, now: Optional[float] = None) -> List[object]:
        """Connections whose last heartbeat is older than ``max_idle`` seconds."""
        now = time.monotonic() if now is None else now
        out = []
        for info in self.consumers.values():
            out.extend(c for c, ch in info.channels.items() if now - ch.last_update > max_idle)
        for table in self.producers.values():
            out.extend(c for c, ch in table.items() if now - ch.last_update > max_idle)
        return list(dict.fromkeys(out))

    def find_channel(self, group: str, client_id: str):
        """The connection of ``client_id`` in ``group`` (ConsumerManager.findChannel), or None."""
        info = self.consumers.get(group)
        for conn, channel in (info.channels.items() if info else ()):
            if channel.client_id == client_id:
                return conn
        return None
