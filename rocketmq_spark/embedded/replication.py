"""A slave's copy of its master: the stored records (HA) and the metadata (SlaveSynchronize).

Both run in-process on the cluster's event loop, reading the master's store directly, not over
sockets. 4.9.8 moves the commit log over its HA port with a protocol of its own (not remoting
frames; the genuine capture does not even record it), so no client ever sees those bytes: what
a client can observe is that the slave holds the master's records, byte for byte, a little
later, and stops getting new ones while the master is down. Copying in-process gives exactly
that (the lag is up to ``replication_interval``) without a second wire protocol to keep.

* :class:`HaReplication`: every ``replication_interval`` seconds, while the master runs, the
  records the master stored since the last round are appended to the slave's commit log in the
  master's physical order and to its consume queues (same bytes, so the same physical offsets,
  store host and store times), and the slave's parked pulls wake.
* :class:`SlaveSynchronize`: every ``slave_sync_interval`` seconds (first after 3 s or the
  interval, whichever is shorter), while the master runs, the slave takes the master's topic
  configs and subscription groups (each table replaced whole when it differs, as when the
  master's dataVersion moved) and consumer offsets (per topic@group, overwritten; the slave
  keeps keys only it has). The embedded store keeps the schedule service's delay offsets among
  the consumer offsets, so they come along (GET_ALL_DELAY_OFFSET's data).
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import replace
from typing import Protocol

from .background import BackgroundService
from .commitlog import tag_code_of
from .consumers import ClientRegistry
from .context import BrokerContext
from .records import properties_text
from .store import BrokerStore, TopicConfig

log = logging.getLogger(__name__)

FIRST_SYNC_DELAY = 3.0  # BrokerController schedules syncAll 3 s after start, then every 10 s
ROUND_BYTES = 1 << 20  # a replication round copies about this much, then lets others run
PHYSICAL_OFFSET_AT = 28  # a stored record's physicalOffset field


class Master(Protocol):
    """What a slave reads of its master."""

    store: BrokerStore
    clients: ClientRegistry

    @property
    def running(self) -> bool: ...


class _Periodic(BackgroundService):
    """A task on the loop running ``run_once`` every ``interval`` seconds."""

    def __init__(self, name: str, interval: float, first_delay: float):
        self.name = name
        self.interval = interval
        self.first_delay = first_delay
        self.more = False  # the last round stopped early: run again at once

    async def _run(self) -> None:
        await asyncio.sleep(self.first_delay)
        while True:
            try:
                self.run_once()
            except Exception:  # pragma: no cover - keep the task alive
                log.exception("%s failed", self.name)
            await asyncio.sleep(0 if self.more else self.interval)

    def run_once(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


def _new_records(source, start: int, topic: str, queue_id: int):
    """(physical offset, topic, queue id, record, store time) of ``source``'s records from
    queue offset ``start`` on, read lazily."""
    for offset in range(start, source.max_offset):
        yield (source.record_long(offset, PHYSICAL_OFFSET_AT), topic, queue_id,
               source.record(offset), source.store_time(offset) or 0)


class HaReplication(_Periodic):
    """Copies the master's new records into the slave's store."""

    def __init__(self, slave: BrokerContext, master: Master):
        interval = slave.options.replication_interval
        super().__init__(f"{slave.name}-{slave.broker_id} replication", interval, interval)
        self.slave = slave
        self.master = master

    def run_once(self) -> int:
        """One round: copies up to ``ROUND_BYTES`` of what the master stored since the last
        one, in its commit log's order; returns how many records (0 while the master is
        down). A round that stopped at the cap is followed by the next one at once."""
        if not self.master.running:
            return 0
        store = self.slave.store
        pending = []
        for (topic, queue_id), source in list(self.master.store.queues.items()):
            target = store.queue(topic, queue_id)
            if target.max_offset < source.min_offset:  # retention passed what we have
                if len(target):
                    store.truncate(topic, queue_id, target.max_offset)
                target.reset_empty(source.min_offset)
            if target.max_offset < source.max_offset:
                pending.append(_new_records(source, target.max_offset, topic, queue_id))
        copied, size, woken = 0, 0, {}
        # each queue's records lie in commit log order: merging them gives the log's order,
        # and any prefix of it leaves every queue without gaps
        for _, topic, queue_id, record, stored_at in heapq.merge(*pending):
            store.commit_log.append(record)
            code = tag_code_of(properties_text(record))
            store.queue(topic, queue_id).append(record, code, stored_at)
            store.last_store_timestamp = max(store.last_store_timestamp, stored_at)
            woken.setdefault((topic, queue_id), []).append(code)
            copied += 1
            size += len(record)
            if size >= ROUND_BYTES:
                self.more = True
                break
        else:
            self.more = False
        for (topic, queue_id), codes in woken.items():
            self.slave.long_poll.notify_arrival(topic, queue_id,
                                                store.queue(topic, queue_id).max_offset, codes)
        return copied

    def behind(self) -> int:
        """Records the master holds that the slave has not copied yet (over every queue)."""
        store = self.slave.store
        missing = 0
        for key, source in self.master.store.queues.items():
            target = store.queues.get(key)
            have = target.max_offset if target is not None else 0
            missing += max(0, source.max_offset - max(have, source.min_offset))
        return missing


class SlaveSynchronize(_Periodic):
    """Copies the master's topic configs and consumer (and delay) offsets to the slave."""

    def __init__(self, slave: BrokerContext, master: Master):
        interval = slave.options.slave_sync_interval
        super().__init__(f"{slave.name}-{slave.broker_id} sync", interval,
                         min(FIRST_SYNC_DELAY, interval))
        self.slave = slave
        self.master = master
        self.rounds = 0

    def run_once(self) -> int:
        """syncAll; returns 1 when it ran (the master is up), else 0."""
        if not self.master.running:
            return 0
        source, target = self.master.store, self.slave.store
        topics = {name: TopicConfig(**vars(config)) for name, config in source.topics.items()}
        if topics != target.topics:  # the master's dataVersion moved: take the whole table
            target.topics.clear()
            target.topics.update(topics)
        for key, table in source.offsets.items():
            target.offsets[key] = dict(table)
        groups = {name: replace(config) for name, config in
                  self.master.clients.subscription_groups.table.items()}
        table = self.slave.clients.subscription_groups.table
        if groups != table:
            table.clear()
            table.update(groups)
        target.mark_dirty(now=True)
        self.rounds += 1
        return 1
