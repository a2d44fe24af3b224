"""The embedded cluster's 5.x proxy remoting endpoint: what Apache RocketMQ 5.1's
``RemotingProtocolServer`` (the proxy's remoting port, 8080 by default) and its activities do,
read from the 5.1 source (proxy/src/main/java/org/apache/rocketmq/proxy/remoting/).

* GET_ROUTEINFO_BY_TOPIC (GetTopicRouteActivity): the name server's route with every address of
  every broker, whatever its id, replaced by the proxy's own (ProxyTopicRouteData): several
  brokers share one address and keep their names and ids. An unknown topic is TOPIC_NOT_EXIST
  with the proxy's MQClientException text.
* Requests for one broker (AbstractRemotingActivity.request) name it in the ``bname`` header
  field, or ``n`` for SEND_MESSAGE_V2 only (SEND_BATCH_MESSAGE, although it writes the V2
  letters, needs ``bname``: Apache's own 5.1.4 Java client sends batches with ``n`` alone and
  is refused); without it the answer is VERSION_NOT_SUPPORTED "Request doesn't have field
  bname". The proxy forwards the request to that broker's master over its own connection
  (:mod:`.proxy_links`) and passes the answer back with MSG_REGION "" and TRACE_ON "false"
  added; a broker name the name server does not know is TOPIC_NOT_EXIST (the proxy resolves a
  broker through the route of the topic of that name), and for a send that answer carries the
  proxy's own forward opaque, not the client's (seen on a genuine 5.1.4 proxy), so the client
  never matches it.
  Sends, CONSUMER_SEND_MSG_BACK and the offset requests wait 3 s; a pull waits its
  suspendTimeoutMillis + 10 s (PullMessageActivity), so long polling happens at the broker.
* With 5.1 brokers (``topic_config`` given) a send's message type must match its topic's
  (SendMessageActivity, ``enableTopicMessageTypeCheck``; :func:`.topic_types.proxy_send_refusal`),
  the topic's config read from a broker holding it, before the broker name is resolved (seen
  on a genuine 5.1.4 proxy: GET_TOPIC_CONFIG first, then the broker's route).
* A pull without the subscription flag gets the group's subscription from the proxy's own
  heartbeat registry (SUBSCRIPTION_NOT_LATEST / SUBSCRIPTION_NOT_EXIST when it has none).
* HEART_BEAT, UNREGISTER_CLIENT and CHECK_CLIENT_CONFIG (ClientManagerActivity) are the proxy's
  own: its registry, not the brokers', answers GET_CONSUMER_LIST_BY_GROUP, across every broker;
  a group nobody heartbeated is a NullPointerException in the proxy, SYSTEM_ERROR with no remark
  (Java 8).
* LOCK_BATCH_MQ and UNLOCK_BATCH_MQ (ConsumerManagerActivity) go to the broker of the first queue
  of the body; an empty set is answered by the proxy (code SYSTEM_ERROR, remark
  "MessageQueue set is empty", as createResponseCommand(null) leaves the code).
* END_TRANSACTION (TransactionActivity) is answered SUCCESS at once; the proxy then sends the
  broker a oneway END_TRANSACTION built from what it kept of the broker's check-back
  (:mod:`.proxy_transactions`), or nothing when it kept nothing (or kept it more than 30 s
  ago). A prepared send over remoting is not kept, so every first-phase END_TRANSACTION is
  dropped: half messages sent through this port become visible only by check-back. A client
  never learns the broker's verdict.
* Anything else (GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER, VIEW_MESSAGE_BY_ID,
  GET_EARLIEST_MSG_STORETIME, ...) is REQUEST_CODE_NOT_SUPPORTED; GET_CONSUMER_CONNECTION_LIST
  is registered but unhandled in 5.1, so it is never answered.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Callable, Dict, Optional, Tuple

from ..client.protocol.codes import FLAG_ONEWAY, VERSION_V4_9_4, RequestCode, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import decode_properties
from ..client.protocol.route import BrokerData, TopicRouteData
from .consumers import (
    ClientRegistry,
)
from .faults import FaultInjector
from .headers import java_bool
from .nameserver import NameServer, unsupported
from .proxy_links import BrokerLinks
from .proxy_transactions import ProxyTransactions
from .server import RemotingServer
from .tls import TlsSettings
from .topic_types import proxy_send_refusal

log = logging.getLogger(__name__)

PROXY_VERSION = 441  # MQVersion.Version.V5_1_4's ordinal: what the proxy's own answers carry
FAQ_URL = "https://rocketmq.apache.org/docs/bestPractice/06FAQ"
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"
# the ext fields AbstractRemotingActivity.writeResponse adds to every answer, with the values a
# genuine 5.1.4 proxy in cluster mode writes at its default settings
DECORATION = {TRACE_ON: "false", MSG_REGION: ""}
END_TRANSACTION_REMARK = "end transaction from proxy"
NO_BNAME = "Request doesn't have field bname"
BROKER_NAME_FIELD = "bname"
BROKER_NAME_FIELD_V2 = "n"
FORWARD_TIMEOUT = 3.0
PULL_EXTRA_TIMEOUT = 10.0
PULL_FLAG_SUBSCRIPTION = 0x4

CONSUMER_SEND_MSG_BACK = 36
END_TRANSACTION = 37
CHECK_CLIENT_CONFIG = 46
POP_MESSAGE = 200050
ACK_MESSAGE = 200051
CHANGE_MESSAGE_INVISIBLETIME = 200053

SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
              RequestCode.SEND_BATCH_MESSAGE)
PULL_CODES = (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE, POP_MESSAGE)
FORWARDED_3S = (CONSUMER_SEND_MSG_BACK, RequestCode.UPDATE_CONSUMER_OFFSET,
                RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                RequestCode.GET_MIN_OFFSET, RequestCode.GET_MAX_OFFSET)
# registered with an activity whose switch has no case for them: no answer at all
UNANSWERED = (RequestCode.GET_CONSUMER_CONNECTION_LIST, ACK_MESSAGE,
              CHANGE_MESSAGE_INVISIBLETIME)


def client_exception_text(code: int, message: str) -> str:
    """MQClientException.getMessage(): what the proxy writes as the remark."""
    return f"CODE: {code}  DESC: {message}\nFor more information, please visit the url, {FAQ_URL}"


def topic_not_exist(name: str) -> Tuple[int, str]:
    return ResponseCode.TOPIC_NOT_EXIST, client_exception_text(
        ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {name}")


class ProxyRemoting:
    """Request handler of the proxy's remoting port; :attr:`server` listens."""

    def __init__(self, namesrv: NameServer, *, host: str = "127.0.0.1", port: int = 0,
                 tls: Optional[TlsSettings] = None, faults: Optional[FaultInjector] = None,
                 transaction_heartbeat_period: float = 20.0,
                 transaction_data_expire: float = 30.0,
                 topic_config: Optional[Callable[[str], object]] = None):
        self.namesrv = namesrv
        self.topic_config = topic_config  # topic -> a broker's TopicConfig or None (5.1+)
        self.server = RemotingServer("proxy-remoting", self, host=host, port=port, tls=tls,
                                     faults=faults, version=PROXY_VERSION)
        self.clients = ClientRegistry(self._notify_ids_changed)
        self.links = BrokerLinks(tls=tls is not None, on_request=self._broker_request)
        self.transactions = ProxyTransactions(self.links, namesrv, self.clients,
                                              heartbeat_period=transaction_heartbeat_period,
                                              data_expire=transaction_data_expire)
        self._tasks: set = set()
        self.forwarded = 0  # requests passed on to a broker (for tests)

    @property
    def addr(self) -> str:
        return self.server.addr

    async def start(self) -> None:
        await self.server.start()
        task = asyncio.get_running_loop().create_task(self.transactions.heartbeat_forever())
        self._tasks.add(task)

    async def stop(self) -> None:
        await self.server.stop()
        self.links.close()
        for task in list(self._tasks):
            task.cancel()

    # ---------------------------------------------------------------- dispatch

    def handle(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        code = cmd.code
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return self._route(cmd)
        if code == RequestCode.HEART_BEAT:
            return self._heartbeat(conn, cmd)
        if code == RequestCode.UNREGISTER_CLIENT:
            return self._unregister(conn, cmd)
        if code == CHECK_CLIENT_CONFIG:
            return self._reply(cmd, ResponseCode.SUCCESS, "")
        if code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
            return self._consumer_list(cmd)
        if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            return self._lock(conn, cmd)
        if code == END_TRANSACTION:
            return self._end_transaction(cmd)
        if code in SEND_CODES or code in PULL_CODES or code in FORWARDED_3S:
            field = BROKER_NAME_FIELD_V2 if code == RequestCode.SEND_MESSAGE_V2 \
                else BROKER_NAME_FIELD
            broker = cmd.fields.get(field)
            if broker is None:
                return self._reply(cmd, ResponseCode.VERSION_NOT_SUPPORTED, NO_BNAME)
            if code in PULL_CODES:
                return self._pull(conn, cmd, broker)
            if code in SEND_CODES:
                refusal = self._type_refusal(cmd)
                if refusal is not None:
                    return self._reply(cmd, *refusal)
                self.transactions.note_send(cmd)
            self._forward(conn, cmd, broker, FORWARD_TIMEOUT)
            return None
        if code in UNANSWERED:
            return None
        return unsupported(cmd, PROXY_VERSION)

    def _type_refusal(self, cmd: RemotingCommand) -> Optional[Tuple[int, str]]:
        if self.topic_config is None:
            return None
        v1 = cmd.code == RequestCode.SEND_MESSAGE
        topic = cmd.fields.get("topic" if v1 else "b", "")
        properties = decode_properties(cmd.fields.get("properties" if v1 else "i", ""))
        return proxy_send_refusal(topic, self.topic_config(topic), properties)

    def connection_closed(self, conn) -> None:
        self.clients.connection_closed(conn)

    def _reply(self, cmd: RemotingCommand, code: int, remark: Optional[str] = None,
               body: bytes = b"") -> RemotingCommand:
        return cmd.make_response(code, self._decoration(), remark=remark, body=body,
                                 version=PROXY_VERSION)

    @staticmethod
    def _decoration() -> Dict[str, str]:
        return dict(DECORATION)

    # ---------------------------------------------------------------- routes

    def _route(self, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.fields.get("topic", "")
        route = self.namesrv.route(topic)
        if route is None or not route.queue_datas:
            return self._reply(cmd, *topic_not_exist(topic))
        proxied = TopicRouteData(
            queue_datas=route.queue_datas,
            broker_datas=[BrokerData(b.broker_name, {i: self.addr for i in b.broker_addrs},
                                     b.cluster) for b in route.broker_datas],
            order_topic_conf=route.order_topic_conf)
        standard = (cmd.version >= VERSION_V4_9_4
                    or java_bool(cmd.fields.get("acceptStandardJsonOnly")))
        return self._reply(cmd, ResponseCode.SUCCESS, None, proxied.to_json(standard))

    # ---------------------------------------------------------------- forwarding

    def _forward(self, conn, cmd: RemotingCommand, broker: str, timeout: float,
                 on_answer=None) -> None:
        """Hand ``cmd`` to ``broker``'s master and its answer back to ``conn``."""
        address = self.namesrv.broker_address(broker)
        if address is None:
            if not cmd.is_oneway:
                answer = self._reply(cmd, *topic_not_exist(broker))
                if cmd.code in SEND_CODES:  # the opaque the proxy gave its forward
                    answer = replace(answer, opaque=next(self.server._opaque))
                conn.send(answer)
            return
        link = self.links.open_link(address)
        if link is None:  # the first request to this broker: connect first
            task = asyncio.get_running_loop().create_task(
                self._connect_and_forward(conn, cmd, address, timeout, on_answer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._send(link, conn, cmd, timeout, on_answer)

    async def _connect_and_forward(self, conn, cmd, address: str, timeout: float,
                                   on_answer) -> None:
        try:
            link = await self.links.link(address)
        except ConnectionError as exc:
            if not cmd.is_oneway:
                conn.send(self._reply(cmd, ResponseCode.SYSTEM_ERROR, str(exc)))
            return
        self._send(link, conn, cmd, timeout, on_answer)

    def _send(self, link, conn, cmd: RemotingCommand, timeout: float, on_answer) -> None:
        self.forwarded += 1
        if cmd.is_oneway:
            link.oneway(cmd)
            return

        def answered(answer) -> None:
            if isinstance(answer, BaseException):
                conn.send(self._reply(cmd, ResponseCode.SYSTEM_ERROR, str(answer)))
                return
            if on_answer is not None:
                on_answer(answer)
            fields = dict(answer.fields)
            fields.update(DECORATION)
            conn.send(replace(answer, opaque=cmd.opaque, ext_fields=fields))

        link.call(cmd, timeout, answered)

    def _pull(self, conn, cmd: RemotingCommand, broker: str) -> Optional[RemotingCommand]:
        fields = cmd.fields
        try:
            sys_flag = int(fields.get("sysFlag", "0"))
            suspend_ms = int(fields.get("suspendTimeoutMillis", "0"))
        except ValueError:
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR,
                               "the custom field <sysFlag/suspendTimeoutMillis> is not a number")
        if cmd.code != POP_MESSAGE and not sys_flag & PULL_FLAG_SUBSCRIPTION:
            info = self.clients.consumers.get(fields.get("consumerGroup", ""))
            if info is None:
                return self._reply(cmd, ResponseCode.SUBSCRIPTION_NOT_LATEST,
                                   "the consumer's subscription not latest")
            sub = info.subscriptions.get(fields.get("topic", ""))
            if sub is None:
                return self._reply(cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                   "the consumer's subscription not exist")
            cmd = replace(cmd, ext_fields={**fields, "subscription": sub.sub_string,
                                           "expressionType": sub.expression_type})
        self._forward(conn, cmd, broker, suspend_ms / 1000 + PULL_EXTRA_TIMEOUT)
        return None

    # ---------------------------------------------------------------- clients

    def _notify_ids_changed(self, conn, group: str) -> None:
        conn.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    def _heartbeat(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        data = json.loads(cmd.body.decode("utf-8") or "{}")
        self.clients.register_heartbeat(conn, cmd, data)
        return self._reply(cmd, ResponseCode.SUCCESS, "")

    def _unregister(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        fields = cmd.fields
        if fields.get("producerGroup") is not None:
            self.clients.unregister_producer(fields["producerGroup"], conn)
        if fields.get("consumerGroup") is not None:
            self.clients.unregister_consumer(fields["consumerGroup"], conn)
        return self._reply(cmd, ResponseCode.SUCCESS, "")

    def _consumer_list(self, cmd: RemotingCommand) -> RemotingCommand:
        info = self.clients.consumers.get(cmd.fields.get("consumerGroup", ""))
        if info is None:  # consumerGroupInfo.getAllClientId() on null
            return self._reply(cmd, ResponseCode.SYSTEM_ERROR, None)
        body = json.dumps({"consumerIdList": info.client_ids()},
                          separators=(",", ":")).encode()
        return self._reply(cmd, ResponseCode.SUCCESS, None, body)

    def _lock(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        body = json.loads(cmd.body.decode("utf-8") or "{}")
        mq_set = body.get("mqSet") or []
        if not mq_set:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, self._decoration(),
                                     remark="MessageQueue set is empty", body=cmd.body,
                                     version=PROXY_VERSION)
        self._forward(conn, cmd, str(mq_set[0].get("brokerName")), FORWARD_TIMEOUT)
        return None

    # ---------------------------------------------------------------- transactions

    def _broker_request(self, link, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.transactions.check_back(link, cmd)

    def _end_transaction(self, cmd: RemotingCommand) -> RemotingCommand:
        f = cmd.fields
        kept = self.transactions.take(f.get("producerGroup", ""), f.get("transactionId", ""))
        if kept is not None:
            broker, queue_offset, commit_log_offset, _ = kept
            header = {k: f[k] for k in ("producerGroup", "msgId", "transactionId",
                                        "fromTransactionCheck") if k in f}
            # TransactionStatus: COMMIT and ROLLBACK pass, anything else becomes NOT_TYPE (0)
            verdict = f.get("commitOrRollback", "")
            header.update(commitOrRollback=verdict if verdict in ("8", "12") else "0",
                          tranStateTableOffset=str(queue_offset),
                          commitLogOffset=str(commit_log_offset))
            oneway = replace(cmd, ext_fields=header, flag=cmd.flag | FLAG_ONEWAY,
                             remark=END_TRANSACTION_REMARK, language="JAVA",
                             version=PROXY_VERSION)
            self._forward(None, oneway, broker, FORWARD_TIMEOUT)
        return self._reply(cmd, ResponseCode.SUCCESS, None)
