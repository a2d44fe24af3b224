"""A streaming query as one member of a RocketMQ consumer group, on the Spark driver.

RocketMQ has no group coordinator: every member heartbeats to the brokers, lists the group's
members (GET_CONSUMER_LIST_BY_GROUP), and computes its own share of the queues with a strategy
that every member computes alike (:mod:`.allocation`). The broker tells members when the list
changes (NOTIFY_CONSUMER_IDS_CHANGED, a oneway request on the member's own connection); the
committed offsets hand a queue from one member to the next; orderly consumers also hold a
broker lock on each queue they read (LOCK_BATCH_MQ), so two members never read one queue.

Here the member lives in Spark's streaming-source runner process. A background thread keeps it
in the group: it reads the broker's notifications, heartbeats, lists, allocates and (with
``lockQueues``) takes and renews locks, at least every ``rebalanceIntervalMs``. The planner
(:meth:`GroupMember.apply_allocation`, on Spark's thread, when it plans the next batch) applies
the result between batches only:

* a queue that leaves: the batch that ended at ``start`` is complete, so ``start`` is committed
  for the group, then the queue is unlocked and planned no more;
* a queue that joins enters at the group's committed offset (by ``startingOffsets`` when the
  group has none) with an empty range, so the next batch reads it from there;
* a batch already in Spark's offset log is replayed as planned: nothing here is consulted.

Leaving (:meth:`GroupMember.leave`: commit, unlock, UNREGISTER_CLIENT) runs on a clean stop.
Spark kills the runner instead of calling ``stop()`` most of the time, usually with SIGTERM,
so the member leaves from a SIGTERM handler too; when the runner dies without one, the broker
drops the member as soon as its connection closes.

The requests of a round (heartbeat, member list, locks) are in :mod:`.requests`.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from ..admin import Admin
from ..config import ClientConfig
from ..errors import RocketMQError
from ..namespace import RETRY_PREFIX
from ..protocol.codes import RequestCode, ResponseCode
from ..protocol.frame import RemotingCommand
from ..protocol.route import MessageQueue
from ..remoting import RemotingClient
from .allocation import allocate
from .requests import (
    broker_nodes, heartbeat, list_members, lock_queues, master_addresses, member_client_id,
    member_subscriptions, subscribed_queues, unlock_queues,
)
from .joining import StartPositions, joining_positions
from .running_info import running_info_body

__all__ = ["BatchShare", "GroupMember", "member_client_id"]

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1          # how often the member thread reads notifications between rounds
LOCK_RETRY_SECONDS = 0.5    # how soon a queue allocated to us but locked by another is retried
LEAVE_TIMEOUT_SECONDS = 5.0  # the most a SIGTERM'd runner spends leaving the group


@dataclass
class BatchShare:
    """The queues the next batch may plan (:meth:`GroupMember.apply_allocation`): queues read
    on from their position in ``start`` and queues that join at a position (they enter the
    batch's end with an empty range)."""

    kept: Dict[MessageQueue, int] = field(default_factory=dict)
    entering: Dict[MessageQueue, int] = field(default_factory=dict)


class GroupMember:
    """The driver side of one query in a consumer group. Thread-safe; see the module doc.

    The member has a client of its own (``config``, whose client id names this run in the
    group): its connections carry the brokers' notifications to :meth:`on_request`.
    ``topics`` lists the subscribed topics; ``start_positions(queues, first)`` says where
    queues with no committed offset in the group start: by ``startingOffsets`` in the query's
    first batch (``first``), at their first message later (a queue added to the topic
    meanwhile)."""

    def __init__(self, name_servers: Union[str, Sequence[str]], config: ClientConfig,
                 group: str, topics: Callable[[], List[str]],
                 start_positions: StartPositions, *,
                 strategy: str = "averagely", virtual_nodes: int = 10,
                 rooms: Iterable[str] = (), lock_queues: bool = False,
                 expression: str = "*", interval: float = 20.0,
                 expression_type: str = "TAG", sub_version: int = 0):
        self.group = group
        self.client_id = config.client_id
        self._topics = topics
        self._start_positions = start_positions
        self.retry_topic = RETRY_PREFIX + group  # read when ``topics`` lists it
        self._unread_retry: List[MessageQueue] = []  # the retry share last warned about
        self.strategy = strategy
        self.virtual_nodes = virtual_nodes
        self.rooms = tuple(rooms)
        self.lock_queues = lock_queues
        self.expression = expression
        self.expression_type, self.sub_version = expression_type, sub_version  # SQL92 or TAG
        self.interval = interval
        # RocketMQ's client trusts a lock for 30 s when it renews every 20 s; the broker keeps
        # it for 60 s. Same proportions for other intervals.
        self.lock_validity = 1.5 * interval
        self._lock = threading.RLock()
        self.admin = Admin(name_servers, remoting=RemotingClient(
            config, request_handler=self.on_request))
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._left = False
        self._started = False
        # Published by the rebalance (member thread), read by the planner (Spark's thread).
        self.members: List[str] = []
        self.wanted: Set[MessageQueue] = set()
        self.lock_ok: Dict[MessageQueue, float] = {}
        self.addresses: Dict[str, str] = {}
        self.node_addresses: List[str] = []  # every node heartbeated (masters and slaves)
        self.notifications = 0
        self._notified = False
        self._next_lock_retry = 0.0
        # Owned by the planner.
        self.held: Set[MessageQueue] = set()
        self._completed: Dict[MessageQueue, int] = {}   # positions of held queues, as committed
        self._committed: Dict[MessageQueue, int] = {}
        self._previous_sigterm = None
        self._terminating = False
        self._started_ms = int(time.time() * 1000)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "GroupMember":
        """Join: a first rebalance now (so the first batch is planned over a real share), then
        the member thread. Installs the SIGTERM handler when called on the main thread."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        self.rebalance()
        self._thread = threading.Thread(target=self._run, name=f"rocketmq-member-{self.group}",
                                        daemon=True)
        self._thread.start()
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            except ValueError:  # not the main interpreter
                pass
        log.info("joined consumer group %s as %s (strategy %s%s)", self.group, self.client_id,
                 self.strategy, ", locking queues" if self.lock_queues else "")
        return self

    def leave(self, reason: str = "stopped", close: bool = True) -> None:
        """Leave the group at once: commit the positions of the completed batches, unlock,
        UNREGISTER_CLIENT on every broker (the others rebalance without waiting for the
        broker to notice), then (``close``) close the connections. Idempotent; errors are
        logged, never raised."""
        with self._lock:
            if self._left:
                return
            self._left = True
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)  # no lock may be taken after the unlock
        with self._lock:
            completed = {mq: p for mq, p in self._completed.items() if mq in self.held}
            locked = set(self.lock_ok) | (self.held if self.lock_queues else set())
            addresses = sorted(set(self.addresses.values()) | set(self.node_addresses))
        # Commit and unlock on connections of their own: a SIGTERM may have interrupted the
        # main thread while it was reading one of ours, and nothing reads it meanwhile.
        if completed or (self.lock_queues and locked):
            try:
                with Admin(self.admin.names.addresses, config=self.admin.remoting.config,
                           route_ttl=3600) as fresh:
                    if completed:
                        self._commit(completed, fresh)
                    if self.lock_queues and locked:
                        self._unlock(locked, fresh)
            except RocketMQError as exc:
                log.warning("leaving group %s: %s", self.group, exc)
        # UNREGISTER_CLIENT counts on the connection that heartbeated (the broker keys members
        # by connection); if it cannot be sent, the connection closing does the same.
        for address in addresses:
            try:
                self.admin.brokers.unregister_client(address, consumer_group=self.group,
                                                     timeout=1.0)
            except RocketMQError as exc:
                log.info("unregister from %s failed: %s", address, exc)
        log.info("left consumer group %s as %s (%s); %d queue(s) handed over", self.group,
                 self.client_id, reason, len(self.held))
        if close:
            self.admin.close()

    @property
    def left(self) -> bool:
        return self._left

    def _on_sigterm(self, signum, frame) -> None:
        if self._terminating:
            return  # Spark may signal twice; the first signal's handler ends the process
        self._terminating = True
        # The handler runs on the main thread, maybe interrupting it inside a request: leave
        # from another thread (with its own timeout) so a lock the interrupted frame holds can
        # delay the exit but never hang it.
        worker = threading.Thread(target=self.leave, args=("SIGTERM",), daemon=True)
        worker.start()
        worker.join(LEAVE_TIMEOUT_SECONDS)
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        os.kill(os.getpid(), signal.SIGTERM)

    # ------------------------------------------------------------------ the member thread

    def _run(self) -> None:
        try:  # SIGTERM must reach the main thread, whose handler leaves the group
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        except (AttributeError, ValueError, OSError):
            pass
        next_round = time.monotonic() + self.interval
        while not self._stopping.is_set():
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()
            if self._stopping.is_set():
                return
            self._poll()
            now = time.monotonic()
            with self._lock:
                due = self._notified or now >= next_round
                retry = (self.lock_queues and now >= self._next_lock_retry
                         and bool(self.wanted - set(self.lock_ok)))
            try:
                if due:
                    self.rebalance()
                    next_round = time.monotonic() + self.interval
                elif retry:
                    self._take_locks(renew=False)
            except Exception:  # keep the member alive; the next round retries
                log.exception("rebalance of group %s failed", self.group)

    def _poll(self) -> None:
        """Read what the brokers sent on our connections (notifications, running-info asks),
        and notice a connection the broker closed: the member must heartbeat again."""
        for address in sorted(set(self.addresses.values()) | set(self.node_addresses)):
            conn = self.admin.remoting.existing_connection(address)
            if conn is not None and not conn.poll():
                with self._lock:
                    self._notified = True

    def on_request(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        """Requests the broker sends on our connections (the Connection's request_handler)."""
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            with self._lock:
                self._notified = True
                self.notifications += 1
            self._wake.set()
        elif cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            if cmd.fields.get("consumerGroup") != self.group:
                return cmd.make_response(
                    ResponseCode.SYSTEM_ERROR, language="PYTHON",
                    remark=f"The Consumer Group <{cmd.fields.get('consumerGroup')}> not exist "
                           "in this consumer")
            return cmd.make_response(ResponseCode.SUCCESS, body=self.running_info(),
                                     language="PYTHON")
        return None

    def running_info(self) -> bytes:
        """ConsumerRunningInfo, as a Java consumer answers GET_CONSUMER_RUNNING_INFO."""
        now_ms, mono = int(time.time() * 1000), time.monotonic()
        with self._lock:
            held = sorted(self.held)
            committed = dict(self._committed)
            locked_at_ms = {mq: now_ms - int((mono - at) * 1000)
                            for mq, at in self.lock_ok.items()}
            topics = sorted({mq.topic for mq in self.wanted | self.held})
        return running_info_body(
            group=self.group, client_id=self.client_id, strategy=self.strategy,
            orderly=self.lock_queues, started_ms=self._started_ms,
            name_servers=self.admin.names.addresses, expression=self.expression, held=held,
            committed=committed, locked_at_ms=locked_at_ms, topics=topics,
            expression_type=self.expression_type, sub_version=self.sub_version)

    # ------------------------------------------------------------------ rebalance

    def rebalance(self) -> None:
        """Heartbeat, list the members, allocate and (with ``lockQueues``) lock: one round, as
        the Java client's RebalanceService runs it."""
        with self._lock:
            self._notified = False
        topics = self._topics()
        by_topic = subscribed_queues(self.admin, [*topics, self.retry_topic])
        addresses = master_addresses(self.admin, by_topic)  # locks are the masters'
        nodes = broker_nodes(self.admin, by_topic)
        every = sorted({a for addrs in nodes.values() for a in addrs})
        heartbeat(self.admin, every, self.group,
                  member_subscriptions(self.group, by_topic, self.expression,
                                       self.expression_type, self.sub_version))
        if self.retry_topic not in by_topic:  # a broker creates it on the group's heartbeat
            by_topic.update(subscribed_queues(self.admin, [self.retry_topic]))
        # masters first, then the slaves (a broker whose master is down still answers there)
        members = list_members(self.admin, sorted(set(addresses.values())) + sorted(
            set(every) - set(addresses.values())), self.group)
        with self._lock:
            self.addresses = addresses
            self.node_addresses = every
            if members is not None:
                if self.client_id not in members:
                    log.warning("the brokers do not list %s in group %s yet (members: %s)",
                                self.client_id, self.group, members)
                share = set(allocate(self.strategy, [q for qs in by_topic.values() for q in qs],
                                     members, self.client_id, self.virtual_nodes, self.rooms))
                read = set(topics)
                wanted = {mq for mq in share if mq.topic in read}
                self._warn_unread_retry(share - wanted)
                if wanted != self.wanted or members != self.members:
                    log.info("group %s: %d member(s); %s now reads %d of %d queue(s)",
                             self.group, len(members), self.client_id, len(wanted),
                             sum(len(q) for q in by_topic.values()))
                self.members, self.wanted = members, wanted
        if self.lock_queues:
            self._take_locks(renew=True)

    def _warn_unread_retry(self, unread: Set[MessageQueue]) -> None:
        """The member's share of the group's retry queues, when its topics leave them out
        (``consumeRetryTopic=false``): no other member reads them either, so say so each time
        the share changes."""
        queues = sorted(unread)
        if queues and queues != self._unread_retry:
            log.warning("consumeRetryTopic=false: %d retry queue(s) of group %s fall to %s and "
                        "are not read (%s); the messages members of the group send back there "
                        "are consumed by no member", len(queues), self.group, self.client_id,
                        ", ".join(mq.key for mq in queues[:5]))
        self._unread_retry = queues

    def _entry_positions(self, queues: List[MessageQueue], first: bool
                         ) -> Dict[MessageQueue, int]:
        """Where queues with no committed offset start: the retry topic's at their first
        message (Java's push consumer starts them at 0, RebalancePushImpl.
        computePullFromWhere), so nothing sent back before this member joined is skipped;
        the others where the query's start positions say."""
        retry = [mq for mq in queues if mq.topic == self.retry_topic]
        rest = [mq for mq in queues if mq.topic != self.retry_topic]
        out = self._start_positions(rest, first) if rest else {}
        if retry:
            lows = self.admin.offsets("min", retry)
            failed = sorted(mq.key for mq, v in lows.items() if not isinstance(v, int))
            if failed:
                raise RocketMQError(f"cannot read the min offsets of {', '.join(failed)}")
            out.update(lows)
        return out

    def _take_locks(self, renew: bool) -> None:
        """LOCK_BATCH_MQ for the queues we want (and, with ``renew``, those we hold), one
        request per broker; what is granted is valid for ``lock_validity`` seconds."""
        with self._lock:
            wanted = set(self.wanted)
            targets = wanted | (self.held if renew else set())
            if not renew:
                targets -= set(self.lock_ok)
            addresses = dict(self.addresses)
        granted, refused = lock_queues(self.admin, self.group, targets, addresses,
                                       self._stopping)
        now = time.monotonic()
        with self._lock:
            # A renewal that crossed the planner's release: give that lock straight back.
            stray = {mq for mq in granted if mq not in self.wanted and mq not in self.held}
            granted -= stray
            for mq in granted:
                self.lock_ok[mq] = now
            for mq in refused:
                if self.lock_ok.pop(mq, None) is not None or mq in self.held:
                    log.warning("lost the lock of %s in group %s: another member holds it",
                                mq.key, self.group)
            self._next_lock_retry = now + min(LOCK_RETRY_SECONDS, self.interval)
        if stray:
            self._unlock(stray)
        if refused - self.held:
            log.info("%d queue(s) allocated to %s are locked by another member; retrying",
                     len(refused - self.held), self.client_id)

    def share(self, wait: float = 0.0) -> Tuple[Set[MessageQueue], Set[MessageQueue]]:
        """(the queues allocated to this member that it may read, those whose lock another
        member still holds), waiting up to ``wait`` seconds for those locks."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                wanted = set(self.wanted)
                missing = wanted - set(self.lock_ok) if self.lock_queues else set()
            if not missing or time.monotonic() >= deadline:
                return wanted - missing, missing
            time.sleep(0.1)

    def _lock_valid(self, mq: MessageQueue, now: float) -> bool:
        if not self.lock_queues:
            return True
        at = self.lock_ok.get(mq)
        return at is not None and now - at < self.lock_validity

    # ------------------------------------------------------------------ planning (Spark's thread)

    def apply_allocation(self, start: Dict[MessageQueue, int],
                         allowed: Optional[Set[MessageQueue]] = None, first: bool = False
                         ) -> BatchShare:
        """Apply the latest allocation at a batch boundary: ``start`` is where every planned
        batch has ended (Spark calls ``latestOffset(start)`` only once the batch ending there
        is complete). Commits ``start`` for the queues held; hands over the queues that left
        (commit, unlock); returns the queues kept and those that join. ``allowed`` limits
        joins (Trigger.AvailableNow reads only the queues allocated at its start); ``first``:
        this plans the query's first batch (``startingOffsets`` applies)."""
        if self._left:
            return BatchShare()
        now = time.monotonic()
        with self._lock:
            wanted = set(self.wanted)
            valid = {mq for mq in wanted | self.held if self._lock_valid(mq, now)}
        leaving = {mq for mq in self.held if mq not in wanted or mq not in valid}
        lost = {mq for mq in leaving if mq not in valid}  # another member may hold it now
        with self._lock:  # unless its master is down: locks are the master's, no one has it
            lost = {mq for mq in lost if mq.broker_name in self.addresses}
        handed = {mq: start[mq] for mq in leaving - lost if mq in start}
        self._commit({mq: p for mq, p in start.items() if mq in self.held and mq not in lost})
        if leaving:
            with self._lock:
                self.held -= leaving
                for mq in leaving:
                    self.lock_ok.pop(mq, None)
            if self.lock_queues and leaving - lost:
                self._unlock(leaving - lost)
            for mq in sorted(leaving):
                log.info("queue %s leaves %s%s", mq.key, self.client_id,
                         f" at {handed[mq]} (committed)" if mq in handed else
                         " (its lock was lost)" if mq in lost else "")
        kept = {mq: start[mq] for mq in self.held if mq in start}
        joining = sorted(mq for mq in wanted & valid
                         if mq not in self.held and (allowed is None or mq in allowed))
        entering: Dict[MessageQueue, int] = {}
        if joining:
            read_on, entering = joining_positions(self.admin, self.group, joining, start,
                                                  self._entry_positions, first)
            kept.update(read_on)
            with self._lock:
                self.held |= set(kept) | set(entering)
            for mq in sorted(entering):
                log.info("queue %s joins %s at %d", mq.key, self.client_id, entering[mq])
        with self._lock:
            self._completed = {mq: start[mq] for mq in kept}
        return BatchShare(kept, entering)

    def drop(self, queues: Set[MessageQueue]) -> None:
        """Forget queues :meth:`apply_allocation` let join but the planner could not plan (no
        address for their broker yet): they join again at a later batch."""
        with self._lock:
            self.held -= queues

    def commit(self, positions: Dict[MessageQueue, int]) -> None:
        """Commit the positions of queues this member holds (Spark's late ``commit``)."""
        if not self._left:
            self._commit({mq: p for mq, p in positions.items() if mq in self.held})

    def _commit(self, positions: Dict[MessageQueue, int], admin: Optional[Admin] = None
                ) -> None:
        todo = {mq: p for mq, p in positions.items() if self._committed.get(mq) != p}
        if not todo:
            return
        failed = (admin or self.admin).commit_offsets(self.group, todo, timeout=3.0)
        for mq, error in sorted(failed.items())[:3]:
            log.warning("could not commit the offset of %s for group %s: %s", mq.key,
                        self.group, error)
        self._committed.update((mq, p) for mq, p in todo.items() if mq not in failed)

    def _unlock(self, queues: Set[MessageQueue], admin: Optional[Admin] = None) -> None:
        unlock_queues(admin or self.admin, self.group, queues, dict(self.addresses))
        with self._lock:
            for mq in queues:
                self.lock_ok.pop(mq, None)
