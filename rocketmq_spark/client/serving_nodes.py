"""Which node of a broker serves offset lookups and commits, and the commits a slave took.

A broker name has a master (brokerId 0) and maybe slaves. When the master is down, its slave
answers offset lookups (min, max, by time, committed) and takes offset commits, as a 4.9.8
slave does (see the genuine capture ``rocketmq-4.9.8-slave``). Two things follow, kept here:

* the user is told, once per change, that a broker's offsets come from a slave (its max
  offset can trail the master's), and again when the master answers again;
* a slave never passes the offsets committed to it on to its master (it copies the master's
  table instead), so what a slave took is sent to the master once the master is routed again.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Iterable, List, Protocol, Tuple

from .broker import update_offset_command
from .errors import RocketMQError
from .masters import master_of
from .nameserver import NameServerClient
from .protocol.codes import ResponseCode
from .protocol.route import MASTER_ID, MessageQueue
from .remoting import RemotingClient

log = logging.getLogger(__name__)


class ServingNodes:
    """The node each broker's lookups went to last; logs when that changes."""

    def __init__(self) -> None:
        self._by_broker: Dict[str, int] = {}
        self._lock = threading.Lock()

    def note(self, broker_name: str, broker_id: int, address: str) -> None:
        with self._lock:
            before = self._by_broker.get(broker_name, MASTER_ID)
            self._by_broker[broker_name] = broker_id
        if broker_id == before:
            return
        if broker_id != MASTER_ID:
            log.warning("broker %s: its master is not reachable or not routed; offsets are "
                        "looked up and committed on its slave %s (brokerId %d), whose max "
                        "offset may trail the master's", broker_name, address, broker_id)
        else:
            log.warning("broker %s: its master %s answers again; offsets are looked up and "
                        "committed there", broker_name, address)


class RoutedClient(Protocol):
    """What :meth:`SlaveCommits.flush` uses of the admin (which imports this module)."""

    names: NameServerClient
    remoting: RemotingClient


class SlaveCommits:
    """Offsets committed to a slave, to commit to the master again once it is routed."""

    def __init__(self) -> None:
        self._pending: Dict[Tuple[str, MessageQueue], int] = {}
        self._lock = threading.Lock()

    def record(self, group: str, mq: MessageQueue, offset: int, broker_id: int) -> None:
        with self._lock:
            if broker_id == MASTER_ID:
                self._pending.pop((group, mq), None)
            else:
                self._pending[(group, mq)] = offset

    def pending(self) -> Dict[Tuple[str, MessageQueue], int]:
        with self._lock:
            return dict(self._pending)

    def flush(self, admin: RoutedClient, queues: Iterable[MessageQueue]) -> None:
        """Commit to its master what a slave took for the brokers of ``queues`` whose master
        is routed now (by the admin's cached routes); failures stay pending."""
        if not self._pending:
            return
        brokers = {mq.broker_name for mq in queues}
        with self._lock:
            due = {k: v for k, v in self._pending.items() if k[1].broker_name in brokers}
        sent: List[Tuple[Tuple[str, MessageQueue], int, str, object]] = []
        for (group, mq), offset in due.items():
            try:
                address = master_of(admin.names.route(mq.topic), mq.broker_name)
                if address is None:
                    continue
                sent.append(((group, mq), offset, address, admin.remoting.send(
                    address, update_offset_command(mq, group, offset))))
            except RocketMQError as exc:
                log.info("offset of %s for %s stays on the slave for now: %s", mq.key, group,
                         exc)
        done = 0
        for key, offset, address, pending in sent:
            try:
                answer = admin.remoting.wait(pending, 3.0)
            except RocketMQError as exc:
                log.info("offset of %s for %s stays on the slave for now: %s", key[1].key,
                         key[0], exc)
                continue
            if answer.code == ResponseCode.SUCCESS:
                done += 1
                with self._lock:
                    if self._pending.get(key) == offset:
                        del self._pending[key]
        if done:
            log.warning("committed %d offset(s) to their master again, back after the outage "
                        "in which its slave took them", done)
