"""The name server: routes, cluster info and the topic list, built from the live brokers.

Brokers register in-process (no REGISTER_BROKER frames): a registered broker's current topic
table is read at request time, so a topic created or grown on a broker is routable at once, and
a stopped broker's queues disappear from every route (as when a genuine broker's channel to the
name server closes). JSON bodies follow 4.9.8: HashMap iteration order where Java uses a
HashMap, fastjson's bare integer keys unless the client is 4.9.4+ or asks for standard JSON.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Protocol

from ..client.protocol.codes import VERSION_V4_9_4, RequestCode, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import java_hashmap_order
from ..client.protocol.route import BrokerData, ClusterInfo, QueueData, TopicRouteData
from .headers import java_bool, req_str

FAQ_SUFFIX = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


class RegisteredBroker(Protocol):
    """What the name server needs from a broker."""

    name: str
    cluster: str

    @property
    def addr(self) -> str: ...

    def topic_configs(self) -> Dict[str, "object"]: ...


def unsupported(cmd: RemotingCommand, version: int) -> RemotingCommand:
    """The genuine answer to a request code nobody handles (note the leading space)."""
    return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                             remark=f" request type {cmd.code} not supported", version=version)


class NameServer:
    """Request handlers of the name server; brokers register and unregister themselves."""

    def __init__(self, cluster: str = "DefaultCluster", version: int = 409):
        self.cluster = cluster
        self.version = version
        self._brokers: Dict[str, RegisteredBroker] = {}

    # registration -----------------------------------------------------------------

    def register(self, broker: RegisteredBroker) -> None:
        self._brokers[broker.name] = broker

    def unregister(self, name: str) -> None:
        self._brokers.pop(name, None)

    def broker_address(self, name: str) -> Optional[str]:
        """The registered broker's address (None: no broker of that name is registered)."""
        broker = self._brokers.get(name)
        return None if broker is None else broker.addr

    def broker_names(self) -> List[str]:
        """Registered brokers in the order a Java HashMap keyed by name iterates them."""
        return java_hashmap_order(self._brokers)

    # views ------------------------------------------------------------------------

    def route(self, topic: str) -> Optional[TopicRouteData]:
        """The topic's route over every registered broker that has it; None if none does."""
        queue_datas, broker_datas = [], []
        for name in self.broker_names():
            broker = self._brokers[name]
            config = broker.topic_configs().get(topic)
            if config is None:
                continue
            queue_datas.append(QueueData(name, config.read_queue_nums, config.write_queue_nums,
                                         config.perm, config.topic_sys_flag))
            broker_datas.append(BrokerData(name, {0: broker.addr}, broker.cluster))
        if not queue_datas:
            return None
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def cluster_info(self) -> ClusterInfo:
        names = self.broker_names()
        clusters: Dict[str, List[str]] = {}
        for name in names:
            clusters.setdefault(self._brokers[name].cluster, []).append(name)
        return ClusterInfo(
            broker_addr_table={n: BrokerData(n, {0: self._brokers[n].addr},
                                             self._brokers[n].cluster) for n in names},
            cluster_addr_table={c: java_hashmap_order(members)
                                for c, members in clusters.items()})

    def topics(self) -> List[str]:
        topics: Dict[str, None] = {}
        for name in self.broker_names():
            for topic in self._brokers[name].topic_configs():
                topics[topic] = None
        return java_hashmap_order(topics)

    # requests ---------------------------------------------------------------------

    def handle(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        code = cmd.code
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return self._route(cmd)
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return cmd.make_response(ResponseCode.SUCCESS, None, body=self.cluster_info().to_json(),
                                     version=self.version)
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            body = json.dumps({"topicList": self.topics()}, separators=(",", ":"),
                              ensure_ascii=False).encode("utf-8")
            return cmd.make_response(ResponseCode.SUCCESS, None, body=body, version=self.version)
        return unsupported(cmd, self.version)

    def connection_closed(self, conn) -> None:
        pass

    def _route(self, cmd: RemotingCommand) -> RemotingCommand:
        fields = cmd.fields
        topic = req_str(fields, "topic")
        route = self.route(topic)
        if route is None:
            return cmd.make_response(
                ResponseCode.TOPIC_NOT_EXIST, None, version=self.version,
                remark=f"No topic route info in name server for the topic: {topic}{FAQ_SUFFIX}")
        standard = (cmd.version >= VERSION_V4_9_4
                    or java_bool(fields.get("acceptStandardJsonOnly")))
        return cmd.make_response(ResponseCode.SUCCESS, None, body=route.to_json(standard),
                                 version=self.version)
