"""Cluster-wide conveniences: topics on every broker, queues, addresses, bulk offset lookups."""
from __future__ import annotations

import time
from typing import Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from .broker import BrokerClient, update_offset_command
from .config import ClientConfig
from .errors import (
    BrokerUnavailable, RemotingConnectionError, RequestTimeout, RocketMQError, RouteNotFound,
)
from .masters import master_address, master_of
from .nameserver import NameServerClient
from .protocol.codes import ResponseCode
from .protocol.message import decode_message
from .protocol.route import MessageQueue, TopicRouteData
from .pull import PullRequest, PullStatus
from .responses import response_error
from .remoting import RemotingClient
from .serving_nodes import ServingNodes, SlaveCommits
from .topic_stats import TopicStatsLookups

OffsetResult = Union[int, None, RocketMQError]
# The group named in lookups that pull (no offset is committed for it).
LOOKUP_GROUP = "rocketmq-spark-lookup"


class Admin:
    """What tools and the Spark driver need beyond single requests.

    Pass ``remoting`` to share connections with other clients; otherwise the admin owns its own
    and :meth:`close` closes them.
    """

    def __init__(self, name_server: Union[str, Sequence[str]],
                 config: Optional[ClientConfig] = None,
                 remoting: Optional[RemotingClient] = None, route_ttl: float = 30.0):
        self._owns_remoting = remoting is None
        self.remoting = remoting or RemotingClient(config)
        self.names = NameServerClient(name_server, self.remoting, route_ttl=route_ttl)
        self.brokers = BrokerClient(self.remoting)
        self._serving = ServingNodes()
        self._slave_commits = SlaveCommits()
        self.topic_stats = TopicStatsLookups(self.brokers, self._routed_queue_count)

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: str, queues: int = 4, write_queues: Optional[int] = None,
                     brokers: Optional[Iterable[str]] = None, perm: int = 6,
                     wait: float = 10.0) -> TopicRouteData:
        """Create (or resize) ``topic`` on the named brokers (default: every master), then wait
        until the name servers route it with that many read queues on each of them."""
        cluster = self.names.cluster_info()
        names = sorted(brokers) if brokers is not None else sorted(cluster.broker_addr_table)
        for name in names:
            data = cluster.broker_addr_table.get(name)
            if data is None or data.master_addr is None:
                raise BrokerUnavailable(name, "the name servers list no master for it")
            self.brokers.create_topic(data.master_addr, topic, queues, write_queues, perm)
        deadline = time.monotonic() + wait
        while True:
            try:
                route = self.names.route(topic, refresh=True)
                have = {q.broker_name: q.read_queue_nums for q in route.queue_datas}
                if all(have.get(n) == queues for n in names):
                    return route
            except RouteNotFound:
                pass
            if time.monotonic() > deadline:
                raise RouteNotFound(topic, f"the route did not show {queues} queues on "
                                           f"{names} within {wait} s")
            time.sleep(0.05)

    def queues(self, topic: str, refresh: bool = False) -> List[MessageQueue]:
        """The readable queues of ``topic``, sorted."""
        return self.names.route(topic, refresh).readable_queues(topic)

    def address(self, mq: MessageQueue, broker_id: int = 0, refresh: bool = False) -> str:
        """The address that serves ``mq`` (the suggested node, else any node of its broker)."""
        route = self.names.route(mq.topic, refresh)
        broker = route.broker(mq.broker_name)
        addr = broker.select_addr(broker_id) if broker is not None else None
        if addr is None:
            if not refresh:
                return self.address(mq, broker_id, True)
            raise BrokerUnavailable(mq.broker_name, f"no address for {mq.key} in the route")
        return addr

    def is_master(self, mq: MessageQueue, address: str) -> bool:
        """Whether ``address`` is the master of ``mq``'s broker in a fresh route (a reader
        told "no new message" by a slave waits for the master rather than skip)."""
        return master_of(self.names.route(mq.topic, True), mq.broker_name) == address

    def master_address(self, mq: MessageQueue, refresh: bool = False) -> str:
        """The master (id 0) of ``mq``'s broker: where sends and queue locks go."""
        routes = (self.names.route(mq.topic, fresh)
                  for fresh in ((True,) if refresh else (False, True)))
        return master_address(routes, mq.broker_name, f"no master for {mq.key} in the route")

    def nodes(self, mq: MessageQueue, refresh: bool = False) -> List[Tuple[int, str]]:
        """``(brokerId, address)`` of every node of ``mq``'s broker, master first."""
        broker = self.names.route(mq.topic, refresh).broker(mq.broker_name)
        nodes = broker.nodes() if broker is not None else []
        if not nodes:
            if not refresh:
                return self.nodes(mq, True)
            raise BrokerUnavailable(mq.broker_name, f"no address for {mq.key} in the route")
        return nodes

    def lookup_address(self, mq: MessageQueue, refresh: bool = False,
                       avoid: Collection[str] = ()) -> Tuple[int, str]:
        """``(brokerId, address)`` where ``mq``'s offsets are read and committed: the master,
        else a slave (as Java's consumer commits to a slave when no master is routed; a
        4.9.8 slave answers every offset lookup and commit for its copy). ``avoid``: nodes
        that just failed, skipped while another node is routed."""
        nodes = self.nodes(mq, refresh)
        for broker_id, address in nodes:
            if address not in avoid:
                self._serving.note(mq.broker_name, broker_id, address)
                return broker_id, address
        raise BrokerUnavailable(mq.broker_name, f"every node of {mq.key} failed: "
                                                f"{', '.join(a for _, a in nodes)}")

    def _routed_queue_count(self, topic: str, broker_name: str) -> Optional[int]:
        """Readable queues of ``topic`` on ``broker_name`` in the cached route, if any."""
        try:
            route = self.names.route(topic)
        except RocketMQError:
            return None
        counts = [q.read_queue_nums for q in route.queue_datas if q.broker_name == broker_name]
        return counts[0] if counts else None

    # ------------------------------------------------------------------ offsets

    def offsets(self, kind: str, queues: Iterable[MessageQueue], group: Optional[str] = None,
                timestamp_ms: Optional[int] = None, timeout: Optional[float] = None
                ) -> Dict[MessageQueue, OffsetResult]:
        """Bulk lookup (see :meth:`BrokerClient.queue_offsets`), every broker at once."""
        return {mq: result for mq, (result, _) in self.offsets_by_node(
            kind, queues, group=group, timestamp_ms=timestamp_ms, timeout=timeout).items()}

    def offsets_by_node(self, kind: str, queues: Iterable[MessageQueue],
                        group: Optional[str] = None, timestamp_ms: Optional[int] = None,
                        timeout: Optional[float] = None
                        ) -> Dict[MessageQueue, Tuple[OffsetResult, int]]:
        """:meth:`offsets`, each answer with the id of the node that gave it (0: the master;
        a slave's max offset can trail its master's). A queue whose master cannot be reached
        is asked again at a slave of the refreshed route."""
        queues = list(queues)
        self._slave_commits.flush(self, queues)
        out: Dict[MessageQueue, Tuple[OffsetResult, int]] = {}
        failed: Dict[MessageQueue, Set[str]] = {}
        for attempt in range(2):
            targets, ids = [], {}
            for mq in (queues if attempt == 0 else list(failed)):
                try:
                    ids[mq], address = self.lookup_address(mq, attempt > 0, failed.get(mq, ()))
                except RocketMQError as exc:
                    if mq not in out:
                        out[mq] = (exc, -1)
                    continue
                targets.append((address, mq))
            if kind in ("min", "max"):  # one request per topic and node where served
                answers = self.topic_stats.queue_offsets(kind, targets, timeout=timeout)
            else:
                answers = self.brokers.queue_offsets(kind, targets, group=group,
                                                     timestamp_ms=timestamp_ms, timeout=timeout)
            failed = {}
            for address, mq in targets:
                out[mq] = (answers[mq], ids[mq])
                if _unreachable(answers[mq]):
                    failed[mq] = {address}
            if not failed:
                break
        return out

    def store_times(self, positions: Mapping[MessageQueue, int], group: str = LOOKUP_GROUP,
                    timeout: Optional[float] = None) -> Dict[MessageQueue, OffsetResult]:
        """The store time (ms) of the message at each queue's offset: one message pulled per
        queue, every pull of a broker sent in one write. ``None`` where no message is stored
        there (the offset is at the queue's end, or retention dropped it); a queue whose broker
        fails maps to the error. Pulled from the master, else a slave."""
        out: Dict[MessageQueue, OffsetResult] = {}
        failed: Dict[MessageQueue, Set[str]] = {}
        for attempt in range(2):
            asked = list(positions) if attempt == 0 else list(failed)
            by_address: Dict[str, List[MessageQueue]] = {}
            for mq in asked:
                try:
                    _, address = self.lookup_address(mq, attempt > 0, failed.get(mq, ()))
                except RocketMQError as exc:
                    out.setdefault(mq, exc)
                    continue
                by_address.setdefault(address, []).append(mq)
            failed = {}
            for address, queues in by_address.items():
                for mq, result in self._store_times_at(address, queues, positions, group,
                                                       timeout).items():
                    out[mq] = result
                    if _unreachable(result):
                        failed[mq] = {address}
            if not failed:
                break
        return out

    def _store_times_at(self, address: str, queues: List[MessageQueue],
                        positions: Mapping[MessageQueue, int], group: str,
                        timeout: Optional[float]) -> Dict[MessageQueue, OffsetResult]:
        out: Dict[MessageQueue, OffsetResult] = {}
        requests = [PullRequest(consumer_group=group, topic=mq.topic, queue_id=mq.queue_id,
                                queue_offset=positions[mq], broker_name=mq.broker_name,
                                max_msg_nums=1) for mq in queues]
        try:
            sent = list(zip(queues, self.brokers.pull_many_async(address, requests)))
        except RocketMQError as exc:
            return {mq: exc for mq in queues}
        for mq, pending in sent:
            try:
                result = self.brokers.pull_wait(address, pending,
                                                timeout or self.remoting.config.request_timeout)
                if result.status is not PullStatus.FOUND or not result.body:
                    out[mq] = None
                    continue
                message, _ = decode_message(result.body, verify_crc=False, decompress=False)
                out[mq] = message.store_timestamp if message.queue_offset == positions[mq] \
                    else None
            except RocketMQError as exc:
                out[mq] = exc
        return out

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int],
                       timeout: Optional[float] = None) -> Dict[MessageQueue, RocketMQError]:
        """UPDATE_CONSUMER_OFFSET for each queue, all sent before any answer is awaited: to
        the master, else (no master routed, or it cannot be reached) to a slave, as Java's
        consumer does. What a slave took is sent to the master again once the master is back
        (at the next lookup or commit of that broker's queues), because a slave never passes
        offsets on to its master.

        Returns the queues that failed (an empty dict when every commit succeeded)."""
        self._slave_commits.flush(self, offsets)
        failed: Dict[MessageQueue, RocketMQError] = {}
        tried: Dict[MessageQueue, Set[str]] = {}
        todo = dict(offsets)
        for attempt in range(2):
            sent = []
            for mq, offset in todo.items():
                try:
                    broker_id, address = self.lookup_address(mq, attempt > 0, tried.get(mq, ()))
                    sent.append((mq, broker_id, address, self.remoting.send(
                        address, update_offset_command(mq, group, offset))))
                except RocketMQError as exc:
                    failed.setdefault(mq, exc)
            retry = {}
            for mq, broker_id, address, pending in sent:
                try:
                    r = self.remoting.wait(pending, timeout)
                    if r.code != ResponseCode.SUCCESS:
                        failed[mq] = response_error(r, "UPDATE_CONSUMER_OFFSET", address)
                        continue
                    failed.pop(mq, None)
                    self._slave_commits.record(group, mq, todo[mq], broker_id)
                except RocketMQError as exc:
                    failed[mq] = exc
                    if _unreachable(exc):
                        tried.setdefault(mq, set()).add(address)
                        retry[mq] = todo[mq]
            if not retry:
                break
            todo = retry
        return failed

    def close(self) -> None:
        if self._owns_remoting:
            self.remoting.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unreachable(result: object) -> bool:
    """Whether a lookup failed for want of the node (another node of the broker may answer)."""
    return isinstance(result, (RemotingConnectionError, RequestTimeout))
