"""Driver-side lookups: which queues the query reads, and their offsets.

Everything here talks to the name servers and brokers in bulk (every request of a lookup is
sent before any answer is awaited), so planning stays fast with a thousand queues. Min and max
offsets come from one GET_TOPIC_STATS_INFO per topic and broker where the broker serves it, else
one request per queue (see :mod:`..client.topic_stats`). Max offsets are cached for
``offsetsRefreshIntervalMs`` while a stream is idle: Spark asks for the latest offset about
ninety times a second, and the brokers should see a few requests a second, not ninety. A batch
that ends looks them up afresh at once, and while messages keep arriving the cache lasts
50 ms at most, so a stream that is reading keeps its latency.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set

from ..client.admin import Admin
from ..client.errors import (
    AuthError, RemotingConnectionError, RequestTimeout, RocketMQError, RouteNotFound,
)
from ..client.namespace import DLQ_PREFIX, unwrap
from ..client.protocol.route import MessageQueue
from ..client.pull import PullRequest, PullStatus
from ..client.read.reader import TopicNotReadable
from .namespacing import pattern_topics
from .options import EARLIEST, LATEST, Bound, OptionError, SourceOptions

log = logging.getLogger(__name__)

ROUTE_REFRESH_SECONDS = 1.0
# While messages keep arriving (a queue grew within ACTIVE_SECONDS), max offsets are looked up
# every ACTIVE_REFRESH_SECONDS at most (or offsetsRefreshIntervalMs if shorter): a stream that
# is reading keeps its latency; an idle one asks at offsetsRefreshIntervalMs.
ACTIVE_SECONDS = 1.0
ACTIVE_REFRESH_SECONDS = 0.05
# Topics every RocketMQ cluster has, which a pattern must not pick up.
SYSTEM_TOPICS = re.compile(r"^(%RETRY%|%DLQ%|%SYS%|rmq_sys_|RMQ_SYS_|SCHEDULE_TOPIC_XXXX$|"
                           r"TBW102$|BenchmarkTest$|OFFSET_MOVED_EVENT$|TRANS_CHECK_MAX_TIME_TOPIC$|"
                           r"SELF_TEST_TOPIC$)")


@dataclass
class Discovery:
    """The queues readable now, the address serving each broker (its master, else a slave: a
    task pulls there first), and the brokers registered with the name servers (to tell a
    stopped broker from a queue that was removed)."""

    queues: List[MessageQueue]
    addresses: Dict[str, str] = field(default_factory=dict)
    alive_brokers: Set[str] = field(default_factory=set)

    def why_missing(self, mq: MessageQueue) -> str:
        """For a queue read before but not routed now: "vanished" when its broker is up
        without it (the topic or queue was removed), else "unreachable" (the broker is down
        or cut off, which is not data loss)."""
        return "vanished" if mq.broker_name in self.alive_brokers else "unreachable"


class OffsetReader:
    """Queue discovery and offset lookups for one query, on the driver."""

    def __init__(self, options: SourceOptions, admin: Admin):
        self.options = options
        self.admin = admin
        self._discovery: Optional[Discovery] = None
        self._discovered_at = 0.0
        self._max: Dict[MessageQueue, int] = {}
        self._max_at = 0.0
        self._max_took = 0.0
        self._grew_at = float("-inf")  # when a lookup last found a queue grown
        self.clock = time.monotonic  # tests may put another in its place
        self._unrouted: Set[str] = set()  # topics already warned about (once each)
        # the highest max offset seen of each queue, and the queues waiting for a slave that
        # trails it (see max_offsets)
        self._highest: Dict[MessageQueue, int] = {}
        self._trailing: Set[MessageQueue] = set()

    # ------------------------------------------------------------------ queues

    def topics(self) -> List[str]:
        """The subscribed topics' wire names (a pattern matches names within the namespace,
        without it)."""
        o = self.options
        if o.assigned:
            return sorted({mq.topic for mq in o.assigned})
        if o.topics:
            named = list(o.topics)
        else:
            cluster = self.admin.names.cluster_info()
            reserved = set(cluster.cluster_addr_table) | set(cluster.broker_addr_table)
            named = [t for t in pattern_topics(self.admin.names.topic_list(), o.topic_pattern,
                                               o.namespace)
                     if not SYSTEM_TOPICS.match(unwrap(t, o.namespace))
                     and not SYSTEM_TOPICS.match(t) and t not in reserved]
        if o.reads_retry_topic and o.retry_topic not in named:
            # a group member's share of it (see ..client.group.membership)
            named.append(o.retry_topic)
        return named

    def expire_discovery(self) -> None:
        """Let the next :meth:`discover` look the routes up again (as when they went stale)."""
        self._discovered_at = float("-inf")

    def discover(self, force: bool = False) -> Discovery:
        """Readable queues of the subscribed topics, refreshed at most once a second."""
        now = time.monotonic()
        refresh_after = max(ROUTE_REFRESH_SECONDS,
                            self.options.offsets_refresh_interval_ms / 1e3)
        if (self._discovery is not None and not force
                and now - self._discovered_at < refresh_after):
            return self._discovery
        queues: List[MessageQueue] = []
        addresses: Dict[str, str] = {}
        for topic in self.topics():
            try:
                route = self.admin.names.route(topic, refresh=True)
            except RouteNotFound:
                if topic not in self._unrouted:
                    self._unrouted.add(topic)
                    if topic == self.options.retry_topic and self.options.reads_retry_topic:
                        log.info("the retry topic %s has no route yet (no broker has had a "
                                 "heartbeat of the group): read once it has", topic)
                        continue
                    log.warning("topic %s has no route on the name servers %s: it does not "
                                "exist, or no broker serves it. Nothing is read from it until "
                                "it appears (a stream then reads it from its first message)",
                                topic, ";".join(self.admin.names.addresses))
                continue
            self._unrouted.discard(topic)
            check_readable(route, topic, self.admin.names.addresses)
            queues.extend(route.readable_queues(topic))
            for broker in route.broker_datas:
                nodes = broker.nodes()
                if nodes:  # the master, else the first slave
                    addresses[broker.broker_name] = nodes[0][1]
        if self.options.assigned:
            wanted = set(self.options.assigned)
            queues = [mq for mq in queues if mq in wanted]
        try:
            alive = set(self.admin.names.cluster_info().broker_addr_table)
        except RocketMQError as exc:
            log.warning("cannot list the cluster's brokers (%s); queues that left the route "
                        "are treated as unreachable", exc)
            alive = set()
        self._discovery = Discovery(sorted(set(queues)), addresses, alive)
        self._discovered_at = now
        return self._discovery

    # ------------------------------------------------------------------ offsets

    def _lookup(self, kind: str, queues: Iterable[MessageQueue], **kw
                ) -> Dict[MessageQueue, Optional[int]]:
        """Offsets by queue; a queue whose broker fails maps to no entry (and is logged)."""
        out: Dict[MessageQueue, Optional[int]] = {}
        for mq, (result, node) in self.admin.offsets_by_node(kind, list(queues), **kw).items():
            if isinstance(result, RocketMQError):
                log.warning("%s offset of %s unavailable: %s", kind, mq.key, result)
                continue
            if kind == "max" and not self._plannable_max(mq, result, node):
                continue
            out[mq] = result
        return out

    def _plannable_max(self, mq: MessageQueue, offset: int, node: int) -> bool:
        """Whether a max offset may be planned to. A slave serves only what it has, so a
        range planned from its max is exact; but a slave that trails the max its master
        reported earlier (asynchronous replication) would look like a truncated queue, which
        is data loss. Such a queue makes no progress (as one whose broker is down) until the
        slave catches up or the master is back: the messages in between are on the master."""
        highest = self._highest.get(mq, -1)
        if node <= 0 or offset >= highest:  # the master's word stands, even going back
            self._highest[mq] = offset
            if mq in self._trailing:
                self._trailing.discard(mq)
                log.warning("%s: planned again from its max offset %d", mq.key, offset)
            return True
        if mq not in self._trailing:
            self._trailing.add(mq)
            log.warning("%s: the slave (brokerId %d) serving it while its master is away has "
                        "max offset %d, below the %d seen before; the queue waits for the "
                        "slave to catch up or the master to return", mq.key, node, offset,
                        highest)
        return False

    def refresh_interval(self) -> float:
        """Seconds a cached max offset may be used: offsetsRefreshIntervalMs while idle, at
        most ACTIVE_REFRESH_SECONDS while messages arrive; never less than five times as long
        as the last lookup took (a thousand queues polled ninety times a second must not keep
        the driver busy)."""
        interval = self.options.offsets_refresh_interval_ms / 1e3
        if self.clock() - self._grew_at < ACTIVE_SECONDS:
            interval = min(interval, ACTIVE_REFRESH_SECONDS)
        return max(interval, 5 * self._max_took)

    def max_offsets(self, queues: Iterable[MessageQueue], fresh: bool = False
                    ) -> Dict[MessageQueue, int]:
        """Next offsets to be written, from a cache no older than :meth:`refresh_interval`.
        Queues whose broker cannot be reached are missing from the result."""
        queues = list(queues)
        now = self.clock()
        if (fresh or now - self._max_at >= self.refresh_interval()
                or any(mq not in self._max for mq in queues)):
            before, self._max = self._max, self._lookup("max", queues)
            self._max_at = self.clock()
            self._max_took = self._max_at - now
            if any(offset > before.get(mq, offset) for mq, offset in self._max.items()):
                self._grew_at = self._max_at
        return {mq: self._max[mq] for mq in queues if mq in self._max}

    def cached_max_offsets(self) -> Dict[MessageQueue, int]:
        return dict(self._max)

    def min_offsets(self, queues: Iterable[MessageQueue]) -> Dict[MessageQueue, int]:
        return self._lookup("min", queues)

    # ------------------------------------------------------------------ bounds

    def resolve(self, bound: Bound, queues: List[MessageQueue], is_end: bool = False
                ) -> Dict[MessageQueue, int]:
        """Offsets for a starting or ending :class:`Bound`; every queue gets one.

        Queues whose broker cannot be reached now raise: a start must be known for each."""
        if not queues:
            return {}
        kind = bound.kind
        if kind == "offsets":
            _check_queues("endingOffsets" if is_end else "startingOffsets", bound, queues)
            specials = {v for v in bound.per_queue.values() if v in (EARLIEST, LATEST)}
            lows = self._complete("min", queues) if EARLIEST in specials else {}
            highs = self._complete("max", queues) if LATEST in specials else {}
            out = {}
            for mq in queues:
                v = bound.per_queue[mq]
                out[mq] = lows[mq] if v == EARLIEST else highs[mq] if v == LATEST else v
            return out
        if kind == "earliest":
            return self._complete("min", queues)
        if kind == "latest":
            return self._complete("max", queues)
        if kind == "group":
            committed = self._complete("committed", queues, group=self.options.consumer_group,
                                       allow_none=True)
            lows = self._complete("min", [mq for mq in queues if committed[mq] is None]) \
                if any(v is None for v in committed.values()) else {}
            return {mq: committed[mq] if committed[mq] is not None else lows[mq]
                    for mq in queues}
        if kind in ("timestamp", "timestamps"):
            if kind == "timestamps":
                _check_queues("startingOffsetsByTimestamp", bound, queues)
            times = {mq: bound.timestamp if kind == "timestamp" else bound.per_queue[mq]
                     for mq in queues}
            return {mq: self.offset_for_time(mq, t) for mq, t in times.items()}
        raise ValueError(f"unknown bound {kind!r}")

    def _complete(self, kind: str, queues: List[MessageQueue], allow_none: bool = False,
                  **kw) -> Dict[MessageQueue, Optional[int]]:
        results = self.admin.offsets(kind, queues, **kw)
        failed = {mq: r for mq, r in results.items() if isinstance(r, RocketMQError)}
        if failed:
            mq, error = sorted(failed.items())[0]
            if isinstance(error, AuthError):
                raise error  # keep the type: wrong credentials are not a passing fault
            raise RocketMQError(f"cannot resolve the {kind} offsets of {len(failed)} queue(s), "
                                f"e.g. {mq.key}: {error}")
        if not allow_none and any(v is None for v in results.values()):
            raise RocketMQError(f"the broker has no {kind} offset for some queues")
        return results

    def offset_for_time(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose store time is at or after ``timestamp_ms`` (the max offset
        when every message is older), whatever the broker version's search rule.

        Brokers before 5.1.1 answer with the *nearest* entry, which can sit on either side of
        the answer; the broker's offset is a starting guess, checked against the store times
        of the messages around it."""
        _, address = self.admin.lookup_address(mq)  # the master, else a slave
        brokers = self.admin.brokers
        try:
            low = brokers.get_min_offset(address, mq)
        except (RemotingConnectionError, RequestTimeout):  # gone since the route was cached
            _, address = self.admin.lookup_address(mq, refresh=True, avoid={address})
            low = brokers.get_min_offset(address, mq)
        high = brokers.get_max_offset(address, mq)
        guess = min(max(brokers.search_offset_by_timestamp(address, mq, timestamp_ms), low),
                    high)

        from ..client.protocol.pull_decode import decode_columns  # pyarrow: only for this

        def store_times(start: int) -> List[tuple]:
            """(offset, store time) of up to 32 messages from ``start``."""
            result = brokers.pull(address, PullRequest(
                consumer_group=self.options.consumer_group, topic=mq.topic,
                queue_id=mq.queue_id, queue_offset=start, broker_name=mq.broker_name,
                max_msg_nums=32))
            if result.status is not PullStatus.FOUND:
                return []
            batch = decode_columns(result.body, verify_crc=False, decompress=False)
            return list(zip(batch.column("queue_offset").to_pylist(),
                            batch.column("store_timestamp").to_pylist()))

        # Store times never decrease along a queue. Step back while the message before the
        # guess is not older than the timestamp...
        while guess > low:
            window = [(o, t) for o, t in store_times(max(low, guess - 32)) if o < guess]
            older = [o for o, t in window if t < timestamp_ms]
            if older or not window:
                guess = max(older) + 1 if older else guess
                break
            guess = window[0][0]
        # ...then forward past messages older than it.
        while guess < high:
            window = [(o, t) for o, t in store_times(guess) if o >= guess]
            if not window:
                break
            newer = [o for o, t in window if t >= timestamp_ms]
            if newer:
                return newer[0]
            guess = window[-1][0] + 1
        return guess


def check_readable(route, topic: str, name_servers: Iterable[str]) -> None:
    """A dead-letter topic some of whose brokers forbid reads fails the read, saying how to
    grant it: older brokers create ``%DLQ%<group>`` write-only (perm 2; 4.9.8 makes it 6),
    which would otherwise read as an empty topic, forever in a stream. (Other topics may be
    made write-only on purpose, to pause their consumers: those are read again once
    readable.)"""
    if not topic.startswith(DLQ_PREFIX):
        return
    closed = sorted({q.broker_name for q in route.queue_datas if not q.readable})
    if not closed:
        return
    clusters = sorted({b.cluster for b in route.broker_datas
                       if b.broker_name in closed and b.cluster}) or ["<cluster>"]
    perms = sorted({q.perm for q in route.queue_datas if not q.readable})
    raise TopicNotReadable.for_topic(topic, brokers=closed, perm=perms[0], cluster=clusters[0],
                                     name_servers=";".join(name_servers))


def _check_queues(option: str, bound: Bound, queues: List[MessageQueue]) -> None:
    """A per-queue bound must name exactly the subscription's queues: a queue it names that
    the subscription does not have (a typo, a queue of another topic) is as wrong as one it
    leaves out."""
    routed = set(queues)
    unknown = sorted(mq.key for mq in bound.per_queue if mq not in routed)
    missing = sorted(mq.key for mq in queues if mq not in bound.per_queue)
    problems = []
    if unknown:
        problems.append(f"it names {_listed(unknown)}, which the subscription does not have "
                        f"(its queues: {_listed([mq.key for mq in sorted(routed)]) or 'none'})")
    if missing:
        problems.append(f"missing: {_listed(missing)}")
    if problems:
        raise OptionError(f"option {option} must give every queue of the subscription and no "
                          f"other; " + "; ".join(problems))


def _listed(keys: List[str], limit: int = 20) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
