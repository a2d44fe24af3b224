"""A broker as tests see it (:class:`BrokerHandle`), for the cluster's masters and slaves."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker


class BrokerHandle:
    """A broker as tests see it: name, address, and stop/start on the same port."""

    def __init__(self, cluster: Any, broker: "Broker"):  # cluster: whose _call runs on its loop
        self._cluster = cluster
        self._broker = broker

    @property
    def name(self) -> str:
        return self._broker.name

    @property
    def addr(self) -> str:
        return self._broker.addr

    @property
    def port(self) -> int:
        return self._broker.port

    @property
    def running(self) -> bool:
        return self._broker.running

    @property
    def broker_id(self) -> int:
        """0 for a master, 1, 2, ... for its slaves."""
        return self._broker.broker_id

    def stop(self) -> None:
        """Close the listener and all connections; the broker leaves every route."""
        self._cluster._call(self._broker.stop)

    def start(self) -> None:
        """Listen again on the same port with the same data, and re-register."""
        self._cluster._call(self._broker.start)

    def __repr__(self) -> str:
        return (f"<broker {self.name}/{self.broker_id} {self.addr} "
                f"{'running' if self.running else 'stopped'}>")
