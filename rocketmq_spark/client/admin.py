"""Cluster-wide conveniences: topics on every broker, queues, addresses, bulk offset lookups."""
from __future__ import annotations

import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .broker import BrokerClient, update_offset_command
from .config import ClientConfig
from .errors import BrokerUnavailable, RocketMQError, RouteNotFound
from .nameserver import NameServerClient
from .protocol.codes import ResponseCode
from .protocol.message import decode_message
from .protocol.route import MessageQueue, TopicRouteData
from .pull import PullRequest, PullStatus, response_error
from .remoting import RemotingClient

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

    def master_address(self, mq: MessageQueue, refresh: bool = False) -> str:
        """Where offsets are committed and read: the master (id 0)."""
        route = self.names.route(mq.topic, refresh)
        broker = route.broker(mq.broker_name)
        if broker is None or broker.master_addr is None:
            if not refresh:
                return self.master_address(mq, True)
            raise BrokerUnavailable(mq.broker_name, f"no master for {mq.key} in the route")
        return broker.master_addr

    # ------------------------------------------------------------------ offsets

    def offsets(self, kind: str, queues: Iterable[MessageQueue], group: Optional[str] = None,
                timestamp_ms: Optional[int] = None, timeout: Optional[float] = None
                ) -> Dict[MessageQueue, OffsetResult]:
        """Bulk lookup (see :meth:`BrokerClient.queue_offsets`), every broker at once."""
        targets, out = [], {}
        for mq in queues:
            try:
                targets.append((self.master_address(mq), mq))
            except RocketMQError as exc:
                out[mq] = exc
        out.update(self.brokers.queue_offsets(kind, targets, group=group,
                                              timestamp_ms=timestamp_ms, timeout=timeout))
        return out

    def store_times(self, positions: Mapping[MessageQueue, int], group: str = LOOKUP_GROUP,
                    timeout: Optional[float] = None) -> Dict[MessageQueue, OffsetResult]:
        """The store time (ms) of the message at each queue's offset: one message pulled per
        queue, every pull of a broker sent in one write. ``None`` where no message is stored
        there (the offset is at the queue's end, or retention dropped it); a queue whose broker
        fails maps to the error."""
        out: Dict[MessageQueue, OffsetResult] = {}
        by_address: Dict[str, List[MessageQueue]] = {}
        for mq in positions:
            try:
                by_address.setdefault(self.master_address(mq), []).append(mq)
            except RocketMQError as exc:
                out[mq] = exc
        sent = []
        for address, queues in by_address.items():
            requests = [PullRequest(consumer_group=group, topic=mq.topic, queue_id=mq.queue_id,
                                    queue_offset=positions[mq], broker_name=mq.broker_name,
                                    max_msg_nums=1) for mq in queues]
            try:
                sent.extend(zip(queues, [address] * len(queues),
                                self.brokers.pull_many_async(address, requests)))
            except RocketMQError as exc:
                out.update((mq, exc) for mq in queues)
        for mq, address, pending in sent:
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
        """UPDATE_CONSUMER_OFFSET for each queue, all sent before any answer is awaited.

        Returns the queues that failed (an empty dict when every commit succeeded)."""
        failed: Dict[MessageQueue, RocketMQError] = {}
        sent = []
        for mq, offset in offsets.items():
            try:
                address = self.master_address(mq)
                sent.append((mq, address, self.remoting.send(
                    address, update_offset_command(mq, group, offset))))
            except RocketMQError as exc:
                failed[mq] = exc
        for mq, address, pending in sent:
            try:
                r = self.remoting.wait(pending, timeout)
                if r.code != ResponseCode.SUCCESS:
                    failed[mq] = response_error(r, "UPDATE_CONSUMER_OFFSET", address)
            except RocketMQError as exc:
                failed[mq] = exc
        return failed

    def close(self) -> None:
        if self._owns_remoting:
            self.remoting.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
