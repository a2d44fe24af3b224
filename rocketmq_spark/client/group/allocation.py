"""Which queues of a consumer group each member reads: RocketMQ's allocation strategies as pure
functions.

Every member of a group computes its own share from the same two lists, the topic's queues and
the group's client ids, so members written in different languages agree only if they compute
exactly alike. The rules here are those of Apache RocketMQ's Java client (4.9.x
``AllocateMessageQueue*``), which its C++ client follows for ``averagely``:

* both lists are sorted first, queues by (topic, broker name, queue id) and client ids as Java
  sorts strings (by UTF-16 code unit);
* a topic is allocated on its own (the Java client rebalances topic by topic);
* a member missing from the id list gets nothing.
"""
from __future__ import annotations

import bisect
import hashlib
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ..protocol.route import MessageQueue

AVERAGELY = "averagely"
AVERAGELY_BY_CIRCLE = "averagelyByCircle"
CONSISTENT_HASH = "consistentHash"
MACHINE_ROOM = "machineRoom"
STRATEGIES = (AVERAGELY, AVERAGELY_BY_CIRCLE, CONSISTENT_HASH, MACHINE_ROOM)
DEFAULT_VIRTUAL_NODES = 10


def java_sorted(ids: Iterable[str]) -> List[str]:
    """Strings in ``java.lang.String.compareTo`` order (UTF-16 code units, which differs from
    Python's code point order only past the Basic Multilingual Plane)."""
    return sorted(ids, key=lambda s: s.encode("utf-16-be", "surrogatepass"))


def averagely(queues: Sequence[MessageQueue], members: Sequence[str], me: str
              ) -> List[MessageQueue]:
    """Contiguous blocks: the first ``len(queues) % len(members)`` members get one queue more
    than the others (``AllocateMessageQueueAveragely``)."""
    if me not in members or not queues:
        return []
    n, m = len(queues), len(members)
    index = members.index(me)
    extra = n % m
    size = 1 if n <= m else n // m + (1 if index < extra else 0)
    first = index * size if index < extra else index * size + extra
    count = min(size, n - first)
    return [queues[(first + i) % n] for i in range(count)]


def averagely_by_circle(queues: Sequence[MessageQueue], members: Sequence[str], me: str
                        ) -> List[MessageQueue]:
    """Dealt like cards: queue ``i`` goes to member ``i % len(members)``
    (``AllocateMessageQueueAveragelyByCircle``)."""
    if me not in members:
        return []
    index, m = members.index(me), len(members)
    return [queues[i] for i in range(index, len(queues)) if i % m == index]


def _ring_hash(key: str) -> int:
    """The first four bytes of the MD5 of ``key`` (UTF-8), big-endian, as RocketMQ's
    ``ConsistentHashRouter`` hashes both virtual nodes and queues."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def java_queue_text(mq: MessageQueue) -> str:
    """``MessageQueue.toString()`` in Java: the text consistent hashing places on the ring."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


class HashRing:
    """Members on a hash ring, ``virtual_nodes`` points each (keys ``"<id>-<n>"``).

    As in the Java router, a point that hashes like an earlier one replaces it, and a queue
    goes to the first point at or after its hash, wrapping round to the first point."""

    def __init__(self, members: Sequence[str], virtual_nodes: int = DEFAULT_VIRTUAL_NODES):
        if virtual_nodes < 0:
            raise ValueError(f"virtual_nodes must be >= 0, got {virtual_nodes}")
        owner: Dict[int, str] = {}
        for member in members:
            # A member listed twice continues its replica numbers, as the Java router counts
            # the points already on the ring for that member.
            existing = sum(1 for o in owner.values() if o == member)
            for i in range(virtual_nodes):
                owner[_ring_hash(f"{member}-{i + existing}")] = member
        self._points = sorted(owner)
        self._owner = owner

    def route(self, key: str) -> Optional[str]:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, _ring_hash(key))
        return self._owner[self._points[i if i < len(self._points) else 0]]


def consistent_hash(queues: Sequence[MessageQueue], members: Sequence[str], me: str,
                    virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> List[MessageQueue]:
    """Queues whose ring position falls to ``me`` (``AllocateMessageQueueConsistentHash``):
    a member joining or leaving moves only the queues next to its points."""
    if me not in members:
        return []
    ring = HashRing(members, virtual_nodes)
    return [mq for mq in queues if ring.route(java_queue_text(mq)) == me]


def _java_split_at(text: str) -> List[str]:
    """``String.split("@")`` in Java, which drops trailing empty strings."""
    parts = text.split("@")
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def machine_room(queues: Sequence[MessageQueue], members: Sequence[str], me: str,
                 rooms: Iterable[str]) -> List[MessageQueue]:
    """Only queues of brokers named ``"<room>@<name>"`` with ``room`` in ``rooms``, in blocks of
    equal size, the remainder dealt one each from the first member on
    (``AllocateMessageQueueByMachineRoom``)."""
    if me not in members:
        return []
    wanted = set(rooms)
    eligible = []
    for mq in queues:
        parts = _java_split_at(mq.broker_name)
        if len(parts) == 2 and parts[0] in wanted:
            eligible.append(mq)
    m = len(members)
    index = members.index(me)
    size, rest = divmod(len(eligible), m)
    out = eligible[index * size:(index + 1) * size]
    if rest > index:
        out.append(eligible[index + size * m])
    return out


def strategy_function(strategy: str, virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
                      rooms: Iterable[str] = ()
                      ) -> Callable[[Sequence[MessageQueue], Sequence[str], str],
                                    List[MessageQueue]]:
    """The allocation function for a strategy name (see :data:`STRATEGIES`)."""
    if strategy == AVERAGELY:
        return averagely
    if strategy == AVERAGELY_BY_CIRCLE:
        return averagely_by_circle
    if strategy == CONSISTENT_HASH:
        return lambda q, m, me: consistent_hash(q, m, me, virtual_nodes)
    if strategy == MACHINE_ROOM:
        chosen = frozenset(rooms)
        return lambda q, m, me: machine_room(q, m, me, chosen)
    raise ValueError(f"unknown allocation strategy {strategy!r}; one of {', '.join(STRATEGIES)}")


def allocate(strategy: str, queues: Iterable[MessageQueue], members: Iterable[str], me: str,
             virtual_nodes: int = DEFAULT_VIRTUAL_NODES, rooms: Iterable[str] = ()
             ) -> List[MessageQueue]:
    """``me``'s queues, topic by topic, as every RocketMQ client of the group computes them.

    ``queues`` may span several topics and come in any order; ``members`` is the group's
    client id list as the broker returns it (any order, duplicates kept as Java keeps them)."""
    share = strategy_function(strategy, virtual_nodes, rooms)
    ids = java_sorted(members)
    by_topic: Dict[str, List[MessageQueue]] = {}
    for mq in queues:
        by_topic.setdefault(mq.topic, []).append(mq)
    out: List[MessageQueue] = []
    for topic in sorted(by_topic, key=lambda t: t.encode("utf-16-be", "surrogatepass")):
        ordered = sorted(set(by_topic[topic]), key=_java_queue_order)
        if ordered and ids:
            out.extend(share(ordered, ids, me))
    return out


def allocate_all(strategy: str, queues: Iterable[MessageQueue], members: Iterable[str],
                 virtual_nodes: int = DEFAULT_VIRTUAL_NODES, rooms: Iterable[str] = ()
                 ) -> Mapping[str, List[MessageQueue]]:
    """Every member's share (tests, tools and benchmarks: what the whole group will read)."""
    queues, members = list(queues), list(members)
    return {me: allocate(strategy, queues, members, me, virtual_nodes, rooms)
            for me in dict.fromkeys(members)}


def _java_queue_order(mq: MessageQueue):
    return (mq.topic.encode("utf-16-be", "surrogatepass"),
            mq.broker_name.encode("utf-16-be", "surrogatepass"), mq.queue_id)
