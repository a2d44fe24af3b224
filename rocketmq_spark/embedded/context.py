"""What a broker's request handlers and services may use of it, and nothing more.

Handlers (send, pull, END_TRANSACTION) and services (schedule, transaction checks, long
polling) take a :class:`BrokerContext` instead of the whole :class:`~.broker.Broker`, so the
imports run one way: the broker builds them, they never reach back into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .consumers import ClientRegistry
from .long_poll import LongPollService
from .options import ServerOptions
from .records import RecordWriter
from .store import BrokerStore


@dataclass
class BrokerContext:
    """One broker's name, options, store, long polling and client registry.

    ``address`` gives the advertised ``host:port``, known only once the server is bound."""

    name: str
    options: ServerOptions
    store: BrokerStore
    long_poll: LongPollService
    clients: ClientRegistry
    address: Callable[[], str]
    broker_id: int = 0  # 0: the master; 1, 2, ...: a slave (brokerRole SLAVE)
    records: RecordWriter = field(init=False)

    def __post_init__(self) -> None:
        self.records = RecordWriter(self.store, self.long_poll)

    @property
    def is_slave(self) -> bool:
        return self.broker_id != 0

    @property
    def addr(self) -> str:
        """The advertised address (what routes list and records carry as storeHost)."""
        return self.address()
