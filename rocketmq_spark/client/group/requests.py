"""What a consumer-group member (:class:`.membership.GroupMember`) says to the brokers in a
rebalance round: who it is, what it subscribes to (HEART_BEAT), who else is in the group
(GET_CONSUMER_LIST_BY_GROUP), and which queue locks it takes or gives back (LOCK_BATCH_MQ,
UNLOCK_BATCH_MQ), one request per broker. No state here: the member keeps that.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..admin import Admin
from ..broker import Subscription
from ..errors import RocketMQError, RouteNotFound
from ..masters import masters
from ..namespace import RETRY_PREFIX
from ..protocol.codes import PERM_READ
from ..protocol.route import MessageQueue

log = logging.getLogger(__name__)


def member_client_id(name: Optional[str] = None) -> str:
    """A client id unique to this run and readable in ``mqadmin consumerConnection``:
    ``<ip>@spark-<name>-<pid>-<random>``. The part before ``@`` is the address, as Java and
    C++ clients put it there and ``mqadmin consumerProgress`` shows that part per queue."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    label = f"spark-{name}" if name else "spark"
    return f"{ip}@{label}-{os.getpid()}-{secrets.token_hex(3)}"


def subscribed_queues(admin: Admin, topics: Iterable[str]) -> Dict[str, List[MessageQueue]]:
    """Each topic's queues as the Java client lists them for allocation: every queue of every
    readable QueueData in the route (whether or not its broker has an address now)."""
    out: Dict[str, List[MessageQueue]] = {}
    for topic in topics:
        try:
            route = admin.names.route(topic, refresh=True)
        except RouteNotFound:
            continue
        out[topic] = sorted(MessageQueue(topic, q.broker_name, i) for q in route.queue_datas
                            if q.perm & PERM_READ for i in range(q.read_queue_nums))
    return out


def broker_nodes(admin: Admin, topics: Iterable[str]) -> Dict[str, List[str]]:
    """broker name -> the addresses of its nodes, master first then slaves by id, over the
    routes of ``topics`` (cached by the admin)."""
    nodes: Dict[str, List[str]] = {}
    for topic in topics:
        for broker in admin.names.route(topic).broker_datas:
            if broker.broker_addrs:
                nodes[broker.broker_name] = [address for _, address in broker.nodes()]
    return nodes


def master_addresses(admin: Admin, topics: Iterable[str]) -> Dict[str, str]:
    """broker name -> master address, over the routes of ``topics`` (cached by the admin):
    where queue locks are taken (a broker whose master is down has no entry)."""
    return masters(admin.names.route(topic) for topic in topics)


def member_subscriptions(group: str, topics: Iterable[str], expression: str,
                         expression_type: str = "TAG", sub_version: int = 0
                         ) -> List[Subscription]:
    """The subscriptions a member announces: its topics, then the group's retry topic, as push
    consumers announce it (the broker keeps one subscription table per group, and a member
    announcing another topic set makes it flap). ``group`` is the name on the wire (with its
    namespace), so the retry topic is ``%RETRY%<namespace>%<group>`` as Java's is."""
    retry = RETRY_PREFIX + group
    subscriptions = [Subscription(t, expression, expression_type, sub_version)
                     for t in sorted(topics) if t != retry]
    subscriptions.append(Subscription(retry))
    return subscriptions


def heartbeat(admin: Admin, addresses: Iterable[str], group: str,
              subscriptions: List[Subscription]) -> None:
    """HEART_BEAT to every node of ``addresses`` (slaves too, as Java's consumers do: a slave
    that serves the group while its master is down knows its members); a node that fails is
    logged."""
    for address in sorted(set(addresses)):
        try:
            admin.brokers.heart_beat(address, group, subscriptions,
                                     consume_from_where="CONSUME_FROM_LAST_OFFSET")
        except RocketMQError as exc:
            log.warning("heartbeat of group %s to %s failed: %s", group, address, exc)


def list_members(admin: Admin, addresses: List[str], group: str) -> Optional[List[str]]:
    """The group's client ids from the first node that answers (as the Java client asks one
    broker of the topic, its master else a slave); None when none answers (the last
    allocation then stands)."""
    for address in addresses:
        try:
            return admin.brokers.get_consumer_list_by_group(address, group)
        except RocketMQError as exc:
            log.info("cannot list group %s on %s: %s", group, address, exc)
    return None


def by_broker(queues: Iterable[MessageQueue], addresses: Mapping[str, str]
              ) -> Dict[Tuple[str, str], List[MessageQueue]]:
    """``queues`` by their master's address and broker name (queues of a broker with no
    address are left out). Brokers behind a 5.x proxy share its address, and the proxy hands
    a (un)lock request to the broker of its first queue only: one request per broker."""
    out: Dict[Tuple[str, str], List[MessageQueue]] = {}
    for mq in queues:
        address = addresses.get(mq.broker_name)
        if address:
            out.setdefault((address, mq.broker_name), []).append(mq)
    return out


def lock_queues(admin: Admin, group: str, targets: Iterable[MessageQueue],
                addresses: Mapping[str, str], stopping
                ) -> Tuple[Set[MessageQueue], Set[MessageQueue]]:
    """LOCK_BATCH_MQ, one request per broker: (the queues granted, those another member
    holds). A broker that fails counts for neither; ``stopping`` (an Event) set stops
    before the next broker (a leaving member takes no lock after its unlocks)."""
    granted: Set[MessageQueue] = set()
    refused: Set[MessageQueue] = set()
    for (address, _), queues in sorted(by_broker(targets, addresses).items()):
        if stopping.is_set():
            break
        try:
            ok = set(admin.brokers.lock_batch_mq(address, group, queues, timeout=3.0))
        except RocketMQError as exc:
            log.warning("cannot lock %d queue(s) on %s: %s", len(queues), address, exc)
            continue
        granted |= ok
        refused |= set(queues) - ok
    return granted, refused


def unlock_queues(admin: Admin, group: str, queues: Iterable[MessageQueue],
                  addresses: Mapping[str, str]) -> None:
    """UNLOCK_BATCH_MQ, one request per broker; a failure is logged (locks expire anyway)."""
    for (address, _), qs in sorted(by_broker(queues, addresses).items()):
        try:
            admin.brokers.unlock_batch_mq(address, group, qs, timeout=2.0)
        except RocketMQError as exc:
            log.warning("cannot unlock %d queue(s) on %s (they expire on their own): %s",
                        len(qs), address, exc)
