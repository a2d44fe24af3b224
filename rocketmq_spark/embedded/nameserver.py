"""The name server: routes, cluster info and the topic list, built from the live brokers.

Brokers register in-process (no REGISTER_BROKER frames): a registered master's current topic
table is read at request time, so a topic created or grown on a broker is routable at once, and
a stopped broker's address leaves every route (as when a genuine broker's channel to the name
server closes). Slaves register as 4.9.8's RouteInfoManager takes them: under their master's
broker name with their own brokerId, adding their address to ``brokerAddrs`` but no queue
data (only a master's registration carries topics); the answer names the master's address and
HA address. When the master goes and a slave stays, the queue data the master registered last
stays in the routes with only the slave's address; when the last node of a name goes, the name
and its queues go. JSON bodies follow 4.9.8: HashMap iteration order where Java uses a
HashMap, fastjson's bare integer keys unless the client is 4.9.4+ or asks for standard JSON.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Protocol

from ..client.protocol.codes import VERSION_V4_9_4, RequestCode, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import java_hashmap_order
from ..client.protocol.route import (
    MASTER_ID, BrokerData, ClusterInfo, QueueData, TopicRouteData,
)
from .headers import java_bool, req_str

FAQ_SUFFIX = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


class RegisteredBroker(Protocol):
    """What the name server needs from a broker."""

    name: str
    cluster: str
    broker_id: int

    @property
    def addr(self) -> str: ...

    @property
    def ha_addr(self) -> str: ...

    def topic_configs(self) -> Dict[str, "object"]: ...


def unsupported(cmd: RemotingCommand, version: int) -> RemotingCommand:
    """The genuine answer to a request code nobody handles (note the leading space)."""
    return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                             remark=f" request type {cmd.code} not supported", version=version)


class NameServer:
    """Request handlers of the name server; brokers register and unregister themselves."""

    def __init__(self, cluster: str = "DefaultCluster", version: int = 409,
                 acting_master_field: bool = False):
        self.cluster = cluster
        self.version = version
        # 5.x name servers write BrokerData's enableActingMaster in routes and cluster info
        self.acting_master_field = acting_master_field
        self._nodes: Dict[str, Dict[int, RegisteredBroker]] = {}  # name -> brokerId -> node
        self._kept_topics: Dict[str, Dict[str, object]] = {}  # a gone master's last topics

    # registration -----------------------------------------------------------------

    def register(self, broker: RegisteredBroker) -> Dict[str, str]:
        """Add a node; returns the answer's ext fields (a slave: its master's address and HA
        address when the master is registered, as RegisterBrokerResult; a master: none)."""
        nodes = self._nodes.setdefault(broker.name, {})
        nodes[broker.broker_id] = broker
        if broker.broker_id == MASTER_ID:
            self._kept_topics.pop(broker.name, None)
            return {}
        master = nodes.get(MASTER_ID)
        return {} if master is None else {"haServerAddr": master.ha_addr,
                                          "masterAddr": master.addr}

    def unregister(self, name: str, broker_id: int = MASTER_ID) -> None:
        """Drop a node (its connection closed); a master's topics stay while a slave does."""
        nodes = self._nodes.get(name, {})
        node = nodes.pop(broker_id, None)
        if not nodes:
            self._nodes.pop(name, None)
            self._kept_topics.pop(name, None)
        elif node is not None and broker_id == MASTER_ID:
            self._kept_topics[name] = dict(node.topic_configs())

    def broker_address(self, name: str) -> Optional[str]:
        """The registered master's address (None: no master of that name is registered)."""
        master = self._nodes.get(name, {}).get(MASTER_ID)
        return None if master is None else master.addr

    def broker_names(self) -> List[str]:
        """Registered broker names in the order a Java HashMap keyed by name iterates them."""
        return java_hashmap_order(self._nodes)

    def _addrs(self, name: str) -> Dict[int, str]:
        return {i: node.addr for i, node in sorted(self._nodes[name].items())}

    def _topic_configs(self, name: str) -> Dict[str, object]:
        master = self._nodes[name].get(MASTER_ID)
        return master.topic_configs() if master is not None else self._kept_topics.get(name, {})

    def _cluster(self, name: str) -> str:
        return next(iter(self._nodes[name].values())).cluster

    # views ------------------------------------------------------------------------

    def route(self, topic: str) -> Optional[TopicRouteData]:
        """The topic's route over every registered broker that has it; None if none does."""
        queue_datas, broker_datas = [], []
        for name in self.broker_names():
            config = self._topic_configs(name).get(topic)
            if config is None:
                continue
            queue_datas.append(QueueData(name, config.read_queue_nums, config.write_queue_nums,
                                         config.perm, config.topic_sys_flag))
            broker_datas.append(BrokerData(name, self._addrs(name), self._cluster(name)))
        if not queue_datas:
            return None
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def cluster_info(self) -> ClusterInfo:
        names = self.broker_names()
        clusters: Dict[str, List[str]] = {}
        for name in names:
            clusters.setdefault(self._cluster(name), []).append(name)
        return ClusterInfo(
            broker_addr_table={n: BrokerData(n, self._addrs(n), self._cluster(n))
                               for n in names},
            cluster_addr_table={c: java_hashmap_order(members)
                                for c, members in clusters.items()})

    def topics(self) -> List[str]:
        topics: Dict[str, None] = {}
        for name in self.broker_names():
            for topic in self._topic_configs(name):
                topics[topic] = None
        return java_hashmap_order(topics)

    # requests ---------------------------------------------------------------------

    def handle(self, conn, cmd: RemotingCommand) -> Optional[RemotingCommand]:
        code = cmd.code
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return self._route(cmd)
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            body = self.cluster_info().to_json(self.acting_master_field)
            return cmd.make_response(ResponseCode.SUCCESS, None, body=body, version=self.version)
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
        return cmd.make_response(ResponseCode.SUCCESS, None,
                                 body=route.to_json(standard, self.acting_master_field),
                                 version=self.version)
