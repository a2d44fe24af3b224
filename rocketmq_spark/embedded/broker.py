"""A broker: its store, client registry and long polling, behind a remoting server.

The request handlers answer as a 4.9.8 master broker does (codes, remarks, ext-field sets and
their HashMap order, ``{}`` versus no ``extFields``). Sends, pulls and END_TRANSACTION live in
:mod:`.send`, :mod:`.pull` and :mod:`.transactions`, client management and queue locks in
:mod:`.consumer_admin`, the periodic services in :mod:`.schedule`
and :mod:`.transaction_check`; they get a :class:`~.context.BrokerContext`, never the broker, so
imports run one way (broker -> handlers and services -> :mod:`.records` -> :mod:`.store`). The
smaller requests are here.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

from ..client.protocol.codes import (
    DEFAULT_TOPIC, PERM_INHERIT, PERM_READ, PERM_WRITE, RequestCode, ResponseCode,
)
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.route import dumps_fastjson
from .consumers import (
    ClientRegistry,
)
from .admin_tables import AdminTables
from .consumer_admin import ConsumerAdmin
from .context import BrokerContext
from .fast_paths import BrokerFastPaths
from .faults import FaultInjector
from .flow_control import LocalConnection, RequestQueues
from .headers import HeaderError, java_bool, opt_int, opt_str, req_int, req_long, req_str
from .long_poll import LongPollService
from .nameserver import NameServer, unsupported
from .options import ServerOptions
from .property_filter import CHECK_CLIENT_CONFIG, check_client_config
from .pull import handle_pull
from .query_message import (
    QUERY_MESSAGE, VIEW_MESSAGE_BY_ID, handle_query_message, handle_view_message,
)
from .schedule import ScheduleService
from .send import SYSTEM_TOPICS, handle_send, validate_topic
from .send_back import CONSUMER_SEND_MSG_BACK, handle_send_back
from .replication import HaReplication, SlaveSynchronize
from .server import RemotingServer, ServerConnection
from .slave_role import end_transaction_refusal
from .store import BrokerStore, TopicConfig
from .subscription_groups import (
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, handle_update_subscription_group,
)
from .tls import TlsSettings
from .topic_stats import handle_topic_stats
from .topic_types import (
    ATTRIBUTE, GET_TOPIC_CONFIG, check_type_name, parse_attributes, topic_config_json,
)
from .transaction_check import TransactionCheckService
from .transactions import END_TRANSACTION, EndTransactionHandler

log = logging.getLogger(__name__)

NOT_SET_REMARK = "not set any response code"
QUERY_NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


class Broker:
    """One broker of an embedded cluster: a master (``broker_id`` 0) or a slave of ``master``
    (``broker_id`` 1, 2, ...; :mod:`.replication` copies the master's store to it,
    :mod:`.slave_role` has what it refuses). Runs on the cluster's event loop."""

    def __init__(self, name: str, namesrv: NameServer, options: ServerOptions, *,
                 host: str = "127.0.0.1", port: int = 0, data_dir: Optional[Path] = None,
                 acl: Optional[Mapping[str, str]] = None, tls: Optional[TlsSettings] = None,
                 faults: Optional[FaultInjector] = None, broker_id: int = 0,
                 master: Optional["Broker"] = None):
        if (broker_id == 0) != (master is None):
            raise ValueError("a slave (broker_id > 0) needs its master, a master has none")
        self.name = name
        self.broker_id = broker_id
        self.master = master
        self.cluster = options.cluster_name
        self.options = options
        self.namesrv = namesrv
        self.store = BrokerStore(data_dir, options.flush_interval)
        self.clients = ClientRegistry(self._notify_ids_changed)
        self.long_poll = LongPollService(self._repull)
        self.context = BrokerContext(name, options, self.store, self.long_poll, self.clients,
                                     lambda: self.server.addr, broker_id)
        self.schedule = ScheduleService(self.context)  # delayed messages (DELAY 1-18)
        self.transactions = TransactionCheckService(self.context)  # half message check-backs
        self.end_transaction = EndTransactionHandler(self.context)
        self.fast_paths = BrokerFastPaths(self.context)
        if options.slave_read_enable and not options.suggest_broker_id:
            self.fast_paths.pulls = None  # its suggestion depends on each pull's lag
        self.replication = self.slave_sync = None
        if master is not None:
            self.replication = HaReplication(self.context, master)
            self.slave_sync = SlaveSynchronize(self.context, master)
        self.queues = RequestQueues(options)  # the executors' queues and their busy answers
        # a slave's server is "broker-a-slave1" in logs and fault rules
        server_name = name if master is None else f"{name}-slave{broker_id}"
        self.server = RemotingServer(server_name, self, host=host, port=port, tls=tls, acl=acl,
                                     faults=faults, version=options.version,
                                     fast_path=self.fast_paths if self.fast_paths.available
                                     and master is None else None, flow_control=self.queues)
        self.registration: Dict[str, str] = {}  # the name server's answer (a slave's master)
        self._loaded = False
        self._housekeeping: Optional[asyncio.Task] = None
        self.consumer_admin = ConsumerAdmin(self.context)  # heartbeats, members, locks
        self._locks = self.consumer_admin.locks  # (group, queue) -> (client, time); tests age them
        self._handlers: Dict[int, Callable[[ServerConnection, RemotingCommand],
                                           Optional[RemotingCommand]]] = {
            RequestCode.SEND_MESSAGE: self._send,
            RequestCode.SEND_MESSAGE_V2: self._send,
            RequestCode.SEND_BATCH_MESSAGE: self._send,
            RequestCode.PULL_MESSAGE: lambda c, r: handle_pull(self.context, c, r),
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_consumer_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            **({GET_TOPIC_CONFIG: self._get_topic_config} if options.at_least("5.1") else {}),
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset,
            RequestCode.GET_MAX_OFFSET: self._get_max_offset,
            RequestCode.GET_MIN_OFFSET: self._get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self._get_earliest_time,
            RequestCode.GET_TOPIC_STATS_INFO: lambda c, r: handle_topic_stats(self.context, r),
            **self.consumer_admin.handlers(),
            **AdminTables(self.context).handlers(),  # GET_ALL_*: what a slave syncs
            END_TRANSACTION: self.end_transaction.handle if master is None
            else lambda c, r: end_transaction_refusal(self.context, r),
            CONSUMER_SEND_MSG_BACK: lambda c, r: handle_send_back(self.context, c, r),
            UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: lambda c, r: handle_update_subscription_group(
                self.clients.subscription_groups, r, options.version),
            CHECK_CLIENT_CONFIG: lambda c, r: check_client_config(
                options.enable_property_filter, r, options.version),
            QUERY_MESSAGE: lambda c, r: handle_query_message(self.context, r),
            VIEW_MESSAGE_BY_ID: lambda c, r: handle_view_message(self.context, r),
        }

    # ---------------------------------------------------------------- identity

    @property
    def addr(self) -> str:
        """The advertised address (what routes list and stored records carry as storeHost)."""
        return self.server.addr

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def ha_addr(self) -> str:
        """The haServerAddr it registers: a genuine broker's default, listen port + 1 (nobody
        listens there: replication is in-process, :mod:`.replication`)."""
        return f"{self.server.host}:{self.server.port + 1}"

    @property
    def running(self) -> bool:
        return self.server.running

    def topic_configs(self) -> Dict[str, TopicConfig]:
        return self.store.topics

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load the store once, bind (the same port after a stop) and register."""
        if self.running:
            return
        remembered = False
        if not self._loaded:
            self.store.load()
            self._loaded = True
            if self.server.port == 0 and self.store.port:
                self.server.port = self.store.port  # try the port of the previous run
                remembered = True
            if self.options.auto_create_topics and DEFAULT_TOPIC not in self.store.topics:
                n = self.options.default_topic_queue_nums
                self.store.put_topic(TopicConfig(DEFAULT_TOPIC, n, n,
                                                 PERM_INHERIT | PERM_READ | PERM_WRITE))
        try:
            await self.server.start()
        except OSError:
            if not remembered:
                raise
            self.server.port = 0  # the previous run's port is taken; any free one will do
            await self.server.start()
        if self.store.port != self.server.port:
            self.store.port = self.server.port
            self.store.mark_dirty(now=True)
        self.registration = self.namesrv.register(self)
        self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())
        if self.master is None:
            self.schedule.start()
            self.transactions.start()
            self.end_transaction.start()
        else:  # a slave runs no schedule or check service, it copies its master
            self.replication.start()
            self.slave_sync.start()

    async def stop(self) -> None:
        """Unregister, drop parked pulls and connections, close the listener; data is kept."""
        if not self.running:
            return
        self.namesrv.unregister(self.name, self.broker_id)
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            self._housekeeping = None
        self.schedule.stop()
        self.transactions.stop()
        self.end_transaction.stop()
        if self.master is not None:
            self.replication.stop()
            self.slave_sync.stop()
        self.long_poll.clear()
        await self.server.stop()
        self.store.flush(force=True)

    async def close(self) -> None:
        await self.stop()
        self.store.close()

    async def _housekeep(self) -> None:
        """Flush offsets and expire clients that stopped heartbeating."""
        while True:
            opts = self.options
            await asyncio.sleep(min(opts.housekeeping_interval, opts.flush_interval))
            try:
                self.store.flush()
                for conn in self.clients.expired_connections(self.options.channel_expiry_seconds):
                    log.info("%s: closing %s, no heartbeat for %.0f s", self.name, conn.peer,
                             self.options.channel_expiry_seconds)
                    self.clients.connection_closed(conn)
                    conn.close()
            except Exception:  # pragma: no cover - keep the task alive
                log.exception("%s: housekeeping failed", self.name)

    # ---------------------------------------------------------------- Handler protocol

    def handle(self, conn: ServerConnection, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        handler = self._handlers.get(cmd.code)
        if handler is None:
            return unsupported(cmd, self.options.version)
        return handler(conn, cmd)

    def connection_closed(self, conn: ServerConnection) -> None:
        self.long_poll.connection_closed(conn)
        self.clients.connection_closed(conn)

    def queued_request(self, peer: str, cmd: RemotingCommand) -> "asyncio.Future":
        """The answer to ``cmd`` from an in-process client at ``peer`` (the gRPC proxy), after
        it waited in this broker's queues like a remote client's request."""
        return LocalConnection(self.server, peer).request(cmd)

    def _send(self, conn: ServerConnection, cmd: RemotingCommand) -> RemotingCommand:
        return handle_send(self.context, conn, cmd)

    def _repull(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        """A parked pull's second run (never parks, never commits)."""
        try:
            return handle_pull(self.context, conn, cmd, allow_suspend=False)
        except HeaderError as exc:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, {}, str(exc))

    def _notify_ids_changed(self, conn, group: str) -> None:
        conn.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    def _reply(self, cmd: RemotingCommand, code: int, ext: Optional[Dict[str, str]] = None,
               remark: Optional[str] = None, body: bytes = b"") -> RemotingCommand:
        return cmd.make_response(code, ext, remark, body=body, version=self.options.version)

    # ---------------------------------------------------------------- offsets

    def _query_consumer_offset(self, conn, cmd):
        f = cmd.fields
        group, topic = req_str(f, "consumerGroup"), req_str(f, "topic")
        queue_id = req_int(f, "queueId")
        offset = self.store.query_offset(group, topic, queue_id)
        if offset >= 0:
            return self._reply(cmd, ResponseCode.SUCCESS, {"offset": str(offset)})
        queue = self.store.existing_queue(topic, queue_id)
        if self.options.at_least("5.1"):
            # 5.1.4's ConsumerManageProcessor: setZeroIfNotFound=false refuses; else 0 only
            # when message 0 is there (checkInMemByConsumeOffset): an empty queue is not found
            if (f.get("setZeroIfNotFound") or "").lower() == "false":
                return self._reply(cmd, ResponseCode.QUERY_NOT_FOUND, {},
                                   "Not found, do not set to zero, maybe this group boot first")
            if queue is not None and queue.min_offset <= 0 < queue.max_offset:
                return self._reply(cmd, ResponseCode.SUCCESS, {"offset": "0"})
            return self._reply(cmd, ResponseCode.QUERY_NOT_FOUND, {}, QUERY_NOT_FOUND_REMARK)
        if queue is None or queue.min_offset <= 0:
            # 4.9.8: min offset 0 and message 0 still "in memory" (or the queue empty) -> 0
            return self._reply(cmd, ResponseCode.SUCCESS, {"offset": "0"})
        return self._reply(cmd, ResponseCode.QUERY_NOT_FOUND, {}, QUERY_NOT_FOUND_REMARK)

    def _update_consumer_offset(self, conn, cmd):
        f = cmd.fields
        self.store.commit_offset(req_str(f, "consumerGroup"), req_str(f, "topic"),
                                 req_int(f, "queueId"), req_long(f, "commitOffset"))
        return self._reply(cmd, ResponseCode.SUCCESS, {})

    def _get_max_offset(self, conn, cmd):
        f = cmd.fields
        queue = self.store.existing_queue(req_str(f, "topic"), req_int(f, "queueId"))
        return self._reply(cmd, ResponseCode.SUCCESS,
                           {"offset": str(queue.max_offset if queue else 0)})

    def _get_min_offset(self, conn, cmd):
        f = cmd.fields
        queue = self.store.existing_queue(req_str(f, "topic"), req_int(f, "queueId"))
        return self._reply(cmd, ResponseCode.SUCCESS,
                           {"offset": str(queue.min_offset if queue else 0)})

    def _search_offset(self, conn, cmd):
        f = cmd.fields
        topic, queue_id = req_str(f, "topic"), req_int(f, "queueId")
        timestamp = req_long(f, "timestamp")
        boundary = opt_str(f, "boundaryType")
        if boundary is None:
            mode = self.options.search_by_time
        else:
            mode = "upper" if boundary.lower() == "upper" else "lower"
        queue = self.store.existing_queue(topic, queue_id)
        return self._reply(cmd, ResponseCode.SUCCESS,
                           {"offset": str(queue.search(timestamp, mode) if queue else 0)})

    def _get_earliest_time(self, conn, cmd):
        f = cmd.fields
        queue = self.store.existing_queue(req_str(f, "topic"), req_int(f, "queueId"))
        return self._reply(cmd, ResponseCode.SUCCESS,
                           {"timestamp": str(queue.earliest_time() if queue else -1)})

    # ---------------------------------------------------------------- admin

    def _update_and_create_topic(self, conn, cmd):
        f = cmd.fields
        topic = req_str(f, "topic")
        req_str(f, "defaultTopic")
        read_nums, write_nums = req_int(f, "readQueueNums"), req_int(f, "writeQueueNums")
        perm = req_int(f, "perm")
        filter_type = req_str(f, "topicFilterType")
        sys_flag = opt_int(f, "topicSysFlag", 0) or 0
        order = java_bool(f.get("order"))
        if topic == self.cluster:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None,
                               f"the topic[{topic}] is conflict with system reserved words.")
        bad = validate_topic(topic)
        if bad:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None, bad)
        if topic in SYSTEM_TOPICS or topic.startswith("rmq_sys_"):
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None,
                               f"The topic[{topic}] is conflict with system topic.")
        attributes = {}
        if self.options.at_least("5.1"):  # 5.x: "+message.type=FIFO" (topic_types)
            try:
                attributes = parse_attributes(opt_str(f, "attributes"))
                if ATTRIBUTE in attributes:
                    check_type_name(attributes[ATTRIBUTE])
            except ValueError as exc:
                return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None, str(exc))
        self.store.put_topic(TopicConfig(topic, read_nums, write_nums, perm, filter_type,
                                         sys_flag, order, attributes))
        return self._reply(cmd, ResponseCode.SUCCESS, None, NOT_SET_REMARK)

    def _get_topic_config(self, conn, cmd):
        """GET_TOPIC_CONFIG (5.x): the topic's config with its attributes, as
        AdminBrokerProcessor.getTopicConfig answers it."""
        topic = req_str(cmd.fields, "topic")
        config = self.store.topics.get(topic)
        if config is None:
            return self._reply(cmd, ResponseCode.TOPIC_NOT_EXIST, None,
                               f"No topic in this broker. topic: {topic}")
        return self._reply(cmd, ResponseCode.SUCCESS, None, None,
                           body=dumps_fastjson(topic_config_json(config, True)))

    def lock_holders(self, group: str) -> Dict[tuple, str]:
        """(topic, broker name, queue id) -> client id of the unexpired locks of ``group``."""
        return self.consumer_admin.lock_holders(group)

    # ---------------------------------------------------------------- control (cluster API)

    def create_topic(self, topic: str, read_queues: int, write_queues: int, perm: int,
                     attributes: Optional[Dict[str, str]] = None) -> None:
        self.store.put_topic(TopicConfig(topic, read_queues, write_queues, perm,
                                         attributes=dict(attributes or {})))

    def add_queues(self, topic: str, total: int) -> None:
        config = self.store.topics.get(topic)
        if config is None:
            raise KeyError(f"broker {self.name} has no topic {topic!r}")
        config.read_queue_nums = max(config.read_queue_nums, total)
        config.write_queue_nums = max(config.write_queue_nums, total)
        self.store.mark_dirty(now=True)
