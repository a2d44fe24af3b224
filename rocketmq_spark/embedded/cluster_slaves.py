"""The slave half of EmbeddedCluster: handles on each broker name's slaves, waiting for them
to catch up, running their metadata sync now, and reading one node's offsets.

A slave (``EmbeddedCluster(slaves=n)``) has its master's broker name, brokerId 1..n and a port
of its own; it copies the master's records within ``replication_interval`` and its topic configs
and consumer offsets every ``slave_sync_interval`` (:mod:`.replication`), answers reads and
refuses writes as a 4.9.8 slave (:mod:`.slave_role`)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, List, Optional

from .broker_handle import BrokerHandle

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker


class ClusterSlaves:
    """Slave methods of :class:`~.cluster.EmbeddedCluster` (mixed into it).

    They rely on the cluster's ``_call``, ``_broker``, ``_handle``, ``_slaves`` and
    ``broker``."""

    _slaves: Dict[str, List["Broker"]]

    def _all_slaves(self) -> List["Broker"]:
        return [s for slaves in self._slaves.values() for s in slaves]

    def _with_slaves(self, masters: List["Broker"]) -> List["Broker"]:
        return masters + [s for m in masters for s in self._slaves.get(m.name, [])]

    def _node(self, broker_name: str, broker_id: int) -> "Broker":
        if broker_id == 0:
            return self._broker(broker_name)
        self._broker(broker_name)  # a clear error for an unknown name
        slaves = self._slaves.get(broker_name, [])
        if not 1 <= broker_id <= len(slaves):
            raise KeyError(f"{broker_name} has no slave {broker_id}; its slaves are "
                           f"{[s.broker_id for s in slaves]}")
        return slaves[broker_id - 1]

    def slave(self, broker_name: str, broker_id: int = 1) -> BrokerHandle:
        """The handle of a slave (address, ``stop()``/``start()`` on the same port)."""
        return self._handle(self._node(broker_name, broker_id))

    def brokers_of(self, broker_name: str) -> List[BrokerHandle]:
        """The master and its slaves, by brokerId."""
        return [self.broker(broker_name)] + [self.slave(broker_name, s.broker_id)
                                             for s in self._slaves.get(broker_name, [])]

    def replication_lag(self, broker_name: str, broker_id: int = 1) -> int:
        """Records the master holds that the slave has not copied yet."""
        node = self._node(broker_name, broker_id)
        if node.replication is None:
            raise ValueError("broker id 0 is the master; give a slave's id")
        return self._call(node.replication.behind)

    def wait_replicated(self, broker_names: Optional[List[str]] = None,
                        timeout: float = 10.0) -> None:
        """Wait until every running slave (of the named brokers) holds all its running
        master's records; raises TimeoutError naming the slave and its lag."""
        names = list(self._slaves) if broker_names is None else list(broker_names)
        deadline = time.monotonic() + timeout
        while True:
            lagging = []
            for name in names:
                for node in self._slaves.get(name, []):
                    if node.running and node.master.running:
                        behind = self._call(node.replication.behind)
                        if behind:
                            lagging.append(f"{name}/{node.broker_id}: {behind} records")
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"slaves still behind after {timeout} s: "
                                   f"{', '.join(lagging)}")
            time.sleep(0.01)

    def sync_slaves(self, broker_names: Optional[List[str]] = None) -> int:
        """Run every running slave's SlaveSynchronize now (it also runs every
        ``slave_sync_interval``); returns how many synced (their master was up)."""
        names = list(self._slaves) if broker_names is None else list(broker_names)
        nodes = [n for name in names for n in self._slaves.get(name, []) if n.running]
        return self._call(lambda: sum(n.slave_sync.run_once() for n in nodes))

    def node_max_offset(self, topic: str, broker_name: str, queue_id: int,
                        broker_id: int) -> int:
        """The queue's max offset on one node of a broker (0: the master, 1..: a slave)."""
        node = self._node(broker_name, broker_id)
        return self._call(lambda: node.store.queue(topic, queue_id).max_offset)

    def node_consumer_offset(self, group: str, topic: str, broker_name: str, queue_id: int,
                             broker_id: int) -> Optional[int]:
        """A group's committed offset on one node; None when nothing was committed there."""
        node = self._node(broker_name, broker_id)
        offset = self._call(node.store.query_offset, group, topic, queue_id)
        return None if offset < 0 else offset
