"""The fault half of EmbeddedCluster: damaged records, refused, held or lost requests, dropped
connections and a stopped name server, for tests that need a misbehaving cluster."""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Union

from .direct_writes import CORRUPT_FIELDS, corrupt_record, restore_record
from .faults import FaultRule


class ClusterFaults:
    """Fault injection methods of :class:`~.cluster.EmbeddedCluster` (mixed into it).

    They rely on the cluster's ``_call`` (run on the loop thread), ``_broker``, ``_brokers``,
    ``faults``, ``_namesrv_server``, ``_proxy_remoting`` and ``_originals``."""

    _originals: Dict[tuple, bytes]

    CORRUPT_FIELDS = CORRUPT_FIELDS

    def corrupt(self, topic: str, broker_name: str, queue_id: int, offset: int,
                field: str = "crc") -> None:
        """Damage the stored record of one message in place, so the broker serves bad bytes
        for it (a disk or memory fault), until :meth:`repair` or retention drops it.

        ``field``: "crc" changes the stored body CRC, "magic" the magic code, "size" makes
        totalSize overrun the record, "body" flips a bit of the body (caught by the CRC check,
        not with verifyCrc=false), "properties" makes the properties invalid UTF-8. The record
        keeps its length and the consume queue its extent, as on a genuine broker. Memory only:
        the commit log file of a ``data_dir`` keeps the good record (a restart repairs it).
        """
        if field not in CORRUPT_FIELDS:
            raise ValueError(f"field must be one of {CORRUPT_FIELDS}, got {field!r}")
        store = self._broker(broker_name).store

        def damage():
            old = corrupt_record(store, broker_name, topic, queue_id, offset, field)
            self._originals.setdefault((broker_name, topic, queue_id, offset), old)
        self._call(damage)

    def repair(self, topic: str, broker_name: str, queue_id: int, offset: int) -> None:
        """Put back the record that :meth:`corrupt` damaged (if retention has not dropped it)."""
        store = self._broker(broker_name).store

        def fix():
            original = self._originals.pop((broker_name, topic, queue_id, offset), None)
            if original is None:
                raise KeyError(f"message {topic}/{broker_name}/{queue_id} at {offset} was not "
                               "corrupted")
            restore_record(store, topic, queue_id, offset, original)
        self._call(fix)

    def drop_connections(self) -> None:
        """Close every client connection on every server (listeners stay up)."""
        def drop():
            self._namesrv_server.drop_connections()
            for b in self._brokers:
                b.server.drop_connections()
            if self._proxy_remoting is not None:
                self._proxy_remoting.server.drop_connections()
        self._call(drop)

    def fail_next(self, n: int, code: int, remark: str = "",
                  request_codes: Optional[Iterable[int]] = None,
                  broker: Optional[Union[str, Iterable[str]]] = None) -> None:
        """Answer the next ``n`` matching requests with ``code``/``remark`` (oneways are
        dropped). ``request_codes`` limits the request codes; ``broker`` limits the servers
        (a broker name, several, or "namesrv"); by default any request on any server."""
        self._add_rule(FaultRule("fail", n, code=code, remark=remark,
                                 request_codes=_codes(request_codes), servers=_servers(broker)))

    def delay_next(self, n: int, seconds: float, request_codes: Optional[Iterable[int]] = None,
                   broker: Optional[Union[str, Iterable[str]]] = None) -> None:
        """Hold the next ``n`` matching requests for ``seconds`` before processing them."""
        self._add_rule(FaultRule("delay", n, seconds=seconds, request_codes=_codes(request_codes),
                                 servers=_servers(broker)))

    def drop_next(self, n: int, request_codes: Optional[Iterable[int]] = None,
                  broker: Optional[Union[str, Iterable[str]]] = None) -> None:
        """Read and ignore the next ``n`` matching requests: no effect, no answer (e.g. a lost
        oneway END_TRANSACTION, code 37)."""
        self._add_rule(FaultRule("drop", n, request_codes=_codes(request_codes),
                                 servers=_servers(broker)))

    def clear_faults(self) -> None:
        self._call(self.faults.clear)

    def _add_rule(self, rule: FaultRule) -> None:
        self._call(self.faults.add, rule)

    def stop_namesrv(self) -> None:
        """Stop the name server (brokers keep running)."""
        self._call(self._namesrv_server.stop)

    def start_namesrv(self) -> None:
        """Start the name server again on the same port."""
        self._call(self._namesrv_server.start)


def _codes(codes: Optional[Iterable[int]]):
    if codes is None:
        return None
    return frozenset(int(c) for c in ([codes] if isinstance(codes, int) else codes))


def _servers(broker) -> Optional[frozenset]:
    if broker is None:
        return None
    return frozenset([broker] if isinstance(broker, str) else broker)
