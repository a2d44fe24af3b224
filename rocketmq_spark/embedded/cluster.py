"""EmbeddedCluster: one name server and N brokers on one event loop in a daemon thread.

Every public method is thread-safe: it runs its work on the cluster's loop and waits for the
result, so tests (and Spark executors in the same process) can drive the cluster from any
thread. Calling a method from the loop thread itself (e.g. from a server callback) also works
for everything except start/stop.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import shutil
import string
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ..client.protocol.codes import PERM_READ, PERM_WRITE
from .acl_permissions import AccountPermissions
from .broker import Broker
from .broker_handle import BrokerHandle
from .cluster_faults import ClusterFaults
from .cluster_slaves import ClusterSlaves
from .direct_writes import append_messages
from .faults import FaultInjector
from .nameserver import NameServer
from .options import ServerOptions
from .proxy_remoting import ProxyRemoting
from .server import RemotingServer
from .tls import TlsSettings, self_signed_cert
from .topic_types import ATTRIBUTE as TYPE_ATTRIBUTE, check_type_name

log = logging.getLogger(__name__)

NAMESRV = "namesrv"


def broker_name(index: int) -> str:
    """broker-a, broker-b, ..., broker-z, broker-aa, ..."""
    letters = string.ascii_lowercase
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        name = letters[rem] + name
    return f"broker-{name}"


class EmbeddedCluster(ClusterFaults, ClusterSlaves):
    """A RocketMQ-compatible name server and ``brokers`` brokers on 127.0.0.1.

    Use as a context manager (``with EmbeddedCluster(brokers=2) as c:``) or call ``start()`` and
    ``stop()``. Ports are free ones unless given. With ``data_dir`` the brokers keep their
    messages, topics and offsets there across restarts. ``acl`` maps access keys to secret keys
    (brokers then reject unsigned or wrongly signed requests); ``acl_permissions`` gives some of
    those accounts 4.9's topic and group permissions (:mod:`.acl_permissions`); ``tls`` is
    "enforcing" or "permissive" (plain and TLS on one port), with a self-signed certificate unless
    ``tls_cert``/``tls_key`` are given. ``grpc_proxy=True`` adds a 5.x proxy endpoint
    (gRPC ``MessagingService``, :mod:`.grpc_proxy`) over the same stores at
    :attr:`proxy_endpoint`: TLS with the same (or a self-signed) certificate unless
    ``grpc_proxy_tls=False``. ``proxy_remoting=True`` adds the 5.x proxy's remoting port
    (:mod:`.proxy_remoting`) at :attr:`proxy_remoting_addr`, forwarding to the brokers (TLS
    as the brokers' when ``tls`` is given); ``proxy_transaction_heartbeat`` and
    ``proxy_transaction_data_expire`` (seconds) are its transactionHeartbeatPeriodSecond and
    transactionDataExpireMillis. ``slaves=n`` gives each broker n slaves (brokerId 1..n, same
    name, ports of their own; :mod:`.cluster_slaves`). ``release="5.1"`` makes the brokers
    behave as 5.1.4's (default "4.9", 4.9.8's; :attr:`ServerOptions.release`). Other keyword
    arguments are :class:`ServerOptions`.
    """

    def __init__(self, brokers: int = 1, data_dir: Optional[Union[str, Path]] = None, *,
                 slaves: int = 0,
                 host: str = "127.0.0.1", namesrv_port: int = 0,
                 broker_ports: Optional[Sequence[int]] = None,
                 acl: Optional[Mapping[str, str]] = None,
                 acl_permissions: Optional[Mapping[str, Mapping[str, Any]]] = None,
                 tls: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 grpc_proxy: bool = False, grpc_proxy_tls: bool = True,
                 grpc_proxy_port: int = 0, proxy_remoting: bool = False,
                 proxy_remoting_port: int = 0, proxy_transaction_heartbeat: float = 20.0,
                 proxy_transaction_data_expire: float = 30.0,
                 call_timeout: float = 30.0, **options: Any):
        if brokers < 1:
            raise ValueError("an embedded cluster needs at least one broker")
        if slaves < 0:
            raise ValueError(f"slaves must be 0 or more, got {slaves}")
        if broker_ports is not None and len(broker_ports) != brokers:
            raise ValueError("broker_ports must give one port per broker")
        self.options = ServerOptions(**options)
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.host = host
        self.acl = dict(acl) if acl else None
        self.call_timeout = call_timeout
        self.tls_settings: Optional[TlsSettings] = None
        self._cert_dir: Optional[Path] = None  # a generated certificate, removed on stop
        if tls is not None:
            if not (tls_cert and tls_key):
                tls_cert, tls_key = self_signed_cert()
                self._cert_dir = Path(tls_cert).parent
            self.tls_settings = TlsSettings(tls, tls_cert, tls_key)
        self.proxy_tls_cert: Optional[str] = None  # the proxy's certificate (a CA file)
        proxy_tls: Optional[TlsSettings] = None
        if grpc_proxy and grpc_proxy_tls:
            if not (tls_cert and tls_key):
                tls_cert, tls_key = self_signed_cert()
                self._cert_dir = Path(tls_cert).parent
            proxy_tls = TlsSettings("enforcing", tls_cert, tls_key)
            self.proxy_tls_cert = tls_cert
        self.faults = FaultInjector()
        self._originals: Dict[tuple, bytes] = {}  # records damaged by corrupt(), for repair()
        self.namesrv = NameServer(self.options.cluster_name, self.options.version,
                                  acting_master_field=self.options.at_least("5.1"))
        self._namesrv_server = RemotingServer(NAMESRV, self.namesrv, host=host, port=namesrv_port,
                                              tls=self.tls_settings, faults=self.faults,
                                              version=self.options.version)
        self._brokers: List[Broker] = []
        for i in range(brokers):
            name = broker_name(i)
            self._brokers.append(Broker(
                name, self.namesrv, self.options, host=host,
                port=broker_ports[i] if broker_ports else 0,
                data_dir=self.data_dir / name if self.data_dir else None, acl=self.acl,
                tls=self.tls_settings, faults=self.faults))
        permissions = {ak: AccountPermissions.from_config(config)
                       for ak, config in (acl_permissions or {}).items()}
        if set(permissions) - set(self.acl or {}):
            raise ValueError("acl_permissions names accounts acl does not: "
                             f"{sorted(set(permissions) - set(self.acl or {}))}")
        self.brokers: List[BrokerHandle] = [BrokerHandle(self, b) for b in self._brokers]
        self._slaves: Dict[str, List[Broker]] = {
            master.name: [Broker(master.name, self.namesrv, self.options, host=host,
                                 data_dir=(self.data_dir / f"{master.name}-slave{i}"
                                           if self.data_dir else None),
                                 acl=self.acl, tls=self.tls_settings, faults=self.faults,
                                 broker_id=i, master=master)
                          for i in range(1, slaves + 1)]
            for master in self._brokers}
        for b in [*self._brokers, *(s for group in self._slaves.values() for s in group)]:
            b.server.acl_permissions = permissions
        self._grpc_proxy = None
        if grpc_proxy:
            from .grpc_proxy import GrpcProxy  # grpcio is loaded only when asked for

            self._grpc_proxy = GrpcProxy(self._brokers, host=host, port=grpc_proxy_port,
                                         tls=proxy_tls, acl=self.acl,
                                         max_message_size=self.options.max_message_size)
        self._proxy_remoting: Optional[ProxyRemoting] = None
        if proxy_remoting:
            self._proxy_remoting = ProxyRemoting(
                self.namesrv, host=host, port=proxy_remoting_port, tls=self.tls_settings,
                faults=self.faults, transaction_heartbeat_period=proxy_transaction_heartbeat,
                transaction_data_expire=proxy_transaction_data_expire,
                topic_config=self._topic_config if self.options.at_least("5.1") else None)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._started = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "EmbeddedCluster":
        """Start the loop thread, the name server and every broker; returns self."""
        if self._started:
            return self
        ready = threading.Event()

        def run():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="rocketmq-embedded", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self._start_all)
        except BaseException:
            self._stop_loop()
            raise
        self._started = True
        return self

    async def _start_all(self) -> None:
        server = self._namesrv_server
        port_file = self.data_dir / "namesrv.json" if self.data_dir else None
        if port_file is not None and server.port == 0 and port_file.exists():
            server.port = int(json.loads(port_file.read_text()).get("port") or 0)
            try:
                await server.start()  # the previous run's port, so clients can reconnect
            except OSError:
                server.port = 0
        await server.start()
        if port_file is not None:
            port_file.parent.mkdir(parents=True, exist_ok=True)
            port_file.write_text(json.dumps({"port": server.port}))
        for broker in self._brokers:
            await broker.start()
        for slave in self._all_slaves():
            await slave.start()
        if self._grpc_proxy is not None:
            await self._grpc_proxy.start()
        if self._proxy_remoting is not None:
            await self._proxy_remoting.start()

    def stop(self) -> None:
        """Stop every server, flush the data dir and end the loop thread."""
        if not self._started:
            return
        try:
            self._call(self._stop_all)
        finally:
            self._stop_loop()
            self._started = False
            if self._cert_dir is not None:
                shutil.rmtree(self._cert_dir, ignore_errors=True)

    async def _stop_all(self) -> None:
        if self._proxy_remoting is not None:
            await self._proxy_remoting.stop()
        if self._grpc_proxy is not None:
            await self._grpc_proxy.stop()
        for broker in self._all_slaves() + self._brokers:
            await broker.close()
        await self._namesrv_server.stop()

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None
        self._thread = None

    def __enter__(self) -> "EmbeddedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._started

    def _call(self, fn: Callable, *args, **kwargs):
        """Run ``fn`` on the loop thread (awaiting it if it is a coroutine function)."""
        if self._loop is None:
            raise RuntimeError("the embedded cluster is not running")
        if threading.current_thread() is self._thread:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                raise RuntimeError("cannot wait for an async operation on the cluster's own loop")
            return result

        async def runner():
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(runner(), self._loop).result(self.call_timeout)

    # ---------------------------------------------------------------- addresses

    @property
    def proxy_endpoint(self) -> str:
        """``"127.0.0.1:port"`` of the 5.x proxy endpoint (with ``grpc_proxy=True``)."""
        if self._grpc_proxy is None:
            raise RuntimeError("this cluster has no proxy endpoint: pass grpc_proxy=True")
        return self._grpc_proxy.addr

    @property
    def proxy_remoting_addr(self) -> str:
        """``"127.0.0.1:port"`` of the 5.x proxy's remoting port (with ``proxy_remoting=True``):
        give it to a client as its name server."""
        if self._proxy_remoting is None:
            raise RuntimeError("this cluster has no proxy remoting endpoint: pass "
                               "proxy_remoting=True")
        return self._proxy_remoting.addr

    @property
    def proxy_remoting(self) -> "ProxyRemoting":
        """The proxy remoting endpoint itself (its client registry, what it forwarded)."""
        if self._proxy_remoting is None:
            raise RuntimeError("this cluster has no proxy remoting endpoint: pass "
                               "proxy_remoting=True")
        return self._proxy_remoting

    @property
    def namesrv_addr(self) -> str:
        """``"127.0.0.1:port"`` of the name server."""
        return self._namesrv_server.addr

    def broker(self, name: str) -> BrokerHandle:
        for handle in self.brokers:
            if handle.name == name:
                return handle
        raise KeyError(f"no broker named {name!r}; brokers are {[b.name for b in self.brokers]}")

    def _targets(self, brokers: Optional[Iterable[str]]) -> List[Broker]:
        if brokers is None:
            return list(self._brokers)
        names = [brokers] if isinstance(brokers, str) else list(brokers)
        return [self.broker(n)._broker for n in names]

    def _topic_config(self, topic: str):
        """The config of ``topic`` on the first broker holding it (what a 5.x proxy reads)."""
        return next((b.store.topics[topic] for b in self._brokers if topic in b.store.topics),
                    None)

    def _broker(self, name: str) -> Broker:
        return self.broker(name)._broker

    def _handle(self, broker: Broker) -> BrokerHandle:
        return BrokerHandle(self, broker)

    # ---------------------------------------------------------------- topics and data

    def create_topic(self, topic: str, queues: int = 4, read_queues: Optional[int] = None,
                     write_queues: Optional[int] = None, brokers: Optional[Iterable[str]] = None,
                     perm: int = PERM_READ | PERM_WRITE,
                     message_type: Optional[str] = None) -> None:
        """Create (or replace) a topic on every broker (or the named ones); routable at once.
        Their slaves get it at once too (without waiting for SlaveSynchronize's round).
        ``message_type`` (release 5.1 only): its ``+message.type`` attribute, NORMAL, FIFO,
        DELAY, TRANSACTION or MIXED (:mod:`.topic_types`)."""
        read = queues if read_queues is None else read_queues
        write = queues if write_queues is None else write_queues
        attributes = {}
        if message_type is not None:
            if not self.options.at_least("5.1"):
                raise ValueError("topic message types are a 5.x feature: build the cluster "
                                 "with release=\"5.1\" to give a topic one")
            attributes[TYPE_ATTRIBUTE] = check_type_name(message_type)
        targets = self._with_slaves(self._targets(brokers))
        self._call(lambda: [b.create_topic(topic, read, write, perm, attributes)
                            for b in targets])

    def add_queues(self, topic: str, total_queues: int,
                   brokers: Optional[Iterable[str]] = None) -> None:
        """Grow a topic to ``total_queues`` read and write queues while running (on the named
        brokers, by default on every broker that has the topic, and their slaves); the route
        changes at once."""
        def grow():
            targets = (self._targets(brokers) if brokers is not None else
                       [b for b in self._brokers if topic in b.store.topics])
            if not targets:
                raise KeyError(f"no broker has topic {topic!r}")
            for b in self._with_slaves(targets):
                b.add_queues(topic, total_queues)
        self._call(grow)

    def topic_config(self, topic: str, broker_name: str):
        """The broker's TopicConfig for ``topic`` (a copy), or None."""
        def get():
            config = self._broker(broker_name).store.topics.get(topic)
            return None if config is None else type(config)(**vars(config))
        return self._call(get)

    def truncate(self, topic: str, broker_name: str, queue_id: int, min_offset: int) -> int:
        """Retention: drop the queue's head so its min offset becomes ``min_offset`` (clamped to
        the max offset); returns the new min offset."""
        b = self._broker(broker_name)
        return self._call(b.store.truncate, topic, queue_id, min_offset)

    def max_offset(self, topic: str, broker_name: str, queue_id: int) -> int:
        b = self._broker(broker_name)
        return self._call(lambda: b.store.queue(topic, queue_id).max_offset)

    def min_offset(self, topic: str, broker_name: str, queue_id: int) -> int:
        b = self._broker(broker_name)
        return self._call(lambda: b.store.queue(topic, queue_id).min_offset)

    def store_time(self, topic: str, broker_name: str, queue_id: int,
                   offset: int) -> Optional[int]:
        """Store time (ms) of the message at ``offset``; None when none is stored there."""
        b = self._broker(broker_name)
        return self._call(lambda: b.store.queue(topic, queue_id).store_time(offset))

    def consumer_offset(self, group: str, topic: str, broker_name: str,
                        queue_id: int) -> Optional[int]:
        """The group's committed offset for the queue, None when nothing was committed."""
        b = self._broker(broker_name)
        offset = self._call(b.store.query_offset, group, topic, queue_id)
        return None if offset < 0 else offset

    def consumer_clients(self, group: str, broker_name: Optional[str] = None) -> List[str]:
        """Client ids registered (by heartbeat) for a consumer group on a broker (default:
        the first broker)."""
        b = self._brokers[0] if broker_name is None else self._broker(broker_name)

        def get():
            info = b.clients.consumers.get(group)
            return info.client_ids() if info else []
        return self._call(get)

    def lock_holders(self, group: str, broker_name: str) -> Dict[tuple, str]:
        """(topic, broker name, queue id) -> client id of a broker's unexpired locks of
        ``group`` (LOCK_BATCH_MQ)."""
        return self._call(self._broker(broker_name).lock_holders, group)

    def append(self, topic: str, broker_name: str, queue_id: int,
               bodies: Iterable[bytes], tags: Optional[str] = None, keys: Optional[str] = None,
               properties: Optional[Mapping[str, str]] = None,
               born_timestamp: Optional[int] = None,
               store_timestamp: Optional[int] = None) -> int:
        """Store messages directly (no client): for tests and benchmarks. Creates the topic on
        that broker if needed. Returns the queue offset of the first message.

        ``store_timestamp`` (ms) back-dates the messages, to build a history (e.g. for reads
        by time); it may not be older than the queue's last message, since store times never
        go back along a queue (searches by time rely on it)."""
        context = self._broker(broker_name).context
        bodies = [bytes(x) for x in bodies]
        return self._call(append_messages, context, topic, queue_id, bodies, tags, keys,
                          properties, born_timestamp, store_timestamp)

    # ---------------------------------------------------------------- transactions

    def check_transactions(self, brokers: Optional[Iterable[str]] = None) -> int:
        """Run one pass of the brokers' transaction check service now (it also runs every
        ``transaction_check_interval`` seconds); returns how many check-backs were asked."""
        targets = self._targets(brokers)
        return self._call(lambda: sum(b.transactions.check() for b in targets))

    def pending_transactions(self, broker_name: Optional[str] = None) -> List[int]:
        """Half-queue offsets of half messages not yet committed, rolled back or checked
        (on the first broker unless named)."""
        b = self._brokers[0] if broker_name is None else self._broker(broker_name)
        return self._call(b.transactions.pending)

    def transaction_stats(self, broker_name: Optional[str] = None) -> Dict[str, int]:
        """``{"checks_sent": n, "discarded": n}`` of a broker's check service."""
        b = self._brokers[0] if broker_name is None else self._broker(broker_name)
        return self._call(lambda: {"checks_sent": b.transactions.checks_sent,
                                   "discarded": b.transactions.discarded})

    def flow_control_stats(self, broker_name: Optional[str] = None) -> Dict[str, int]:
        """SYSTEM_BUSY answers of a broker's request queues (:mod:`.flow_control`), summed over
        every broker unless one is named: ``busy`` (all of them), ``<queue>_timeout``
        (``[TIMEOUT_CLEAN_QUEUE]``) and ``<queue>_overload`` (``[OVERLOAD]``, counting oneway
        requests dropped without an answer) for queue send, pull, heartbeat and transaction, and
        ``<queue>_queue_peak``, the most requests that queue held (the highest of any broker)."""
        targets = self._brokers if broker_name is None else [self._broker(broker_name)]

        def collect() -> Dict[str, int]:
            total: Dict[str, int] = {}
            for b in targets:
                for key, n in b.queues.stats.items():
                    total[key] = max(total.get(key, 0), n) if key.endswith("_peak") \
                        else total.get(key, 0) + n
            return total
        return self._call(collect)

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"<EmbeddedCluster {state} namesrv={self.namesrv_addr} brokers={self.brokers}>"

