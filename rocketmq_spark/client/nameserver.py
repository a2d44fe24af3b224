"""Name server lookups with failover between addresses and a route cache."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Sequence, Set, Tuple, TypeVar, Union

from .config import parse_name_servers
from .errors import (
    NameServerUnavailable, ProtocolError, RemotingConnectionError, RequestTimeout, ResponseError,
    RouteNotFound,
)
from .protocol.codes import RequestCode, ResponseCode
from .protocol.frame import RemotingCommand
from .protocol.route import ClusterInfo, TopicRouteData, json_object
from .responses import response_error
from .remoting import RemotingClient

log = logging.getLogger(__name__)
T = TypeVar("T")


class NameServerClient:
    """Asks the name servers in turn, sticking to the last one that answered.

    Routes are cached for ``route_ttl`` seconds; :meth:`route` with ``refresh=True`` bypasses the
    cache, and a failed refresh keeps serving the cached route for as long as it is not older
    than ``stale_ttl`` (a name server restart must not stop readers that already know the route).
    """

    def __init__(self, addresses: Union[str, Sequence[str]], remoting: RemotingClient,
                 timeout: float = 3.0, route_ttl: float = 30.0, stale_ttl: float = 300.0):
        self.addresses: List[str] = parse_name_servers(addresses)
        self.remoting = remoting
        self.timeout = timeout
        self.route_ttl = route_ttl
        self.stale_ttl = stale_ttl
        self._current = 0
        self._routes: Dict[str, Tuple[float, TopicRouteData]] = {}
        self._lock = threading.Lock()
        self._proxies: Set[str] = set()  # addresses that answered as a 5.x proxy's remoting port

    def _ask(self, cmd_factory: Callable[[], RemotingCommand], name: str,
             handle: Callable[[RemotingCommand, str], T]) -> T:
        errors = []
        n = len(self.addresses)
        for i in range(n):
            index = (self._current + i) % n
            address = self.addresses[index]
            try:
                response = self.remoting.invoke(address, cmd_factory(), self.timeout,
                                                unavailable=NameServerUnavailable)
            except (RemotingConnectionError, RequestTimeout) as exc:
                errors.append(f"{address}: {exc}")
                log.info("name server %s failed %s: %s", address, name, exc)
                continue
            self._current = index
            return handle(response, address)
        raise NameServerUnavailable(";".join(self.addresses),
                                    f"no name server answered {name}: " + "; ".join(errors))

    def route(self, topic: str, refresh: bool = False) -> TopicRouteData:
        """The topic's route. Raises RouteNotFound when the name servers do not know it."""
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[0] < self.route_ttl:
            return cached[1]
        try:
            route = self.fetch_route(topic)
        except (NameServerUnavailable, ProtocolError):
            if cached is not None and now - cached[0] < self.stale_ttl:
                log.warning("name servers unreachable; using the cached route of %s", topic)
                return cached[1]
            raise
        except RouteNotFound:
            self._routes.pop(topic, None)
            raise
        self._routes[topic] = (now, route)
        return route

    def fetch_route(self, topic: str) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC, uncached."""

        def handle(r: RemotingCommand, address: str) -> TopicRouteData:
            if r.code == ResponseCode.TOPIC_NOT_EXIST:
                raise RouteNotFound(topic, r.remark, address)
            if r.code != ResponseCode.SUCCESS:
                raise response_error(r, "GET_ROUTEINFO_BY_TOPIC", address)
            return TopicRouteData.from_json(r.body)

        return self._ask(lambda: RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields={"topic": topic, "acceptStandardJsonOnly": "true"}),
            "GET_ROUTEINFO_BY_TOPIC", handle)

    def cluster_info(self) -> ClusterInfo:
        """The cluster's brokers. A 5.x proxy's remoting port does not serve this request
        (REQUEST_CODE_NOT_SUPPORTED): through one, the brokers are those of the routes this
        client has looked up, which the proxy builds from its name server's live view."""
        def handle(r: RemotingCommand, address: str) -> ClusterInfo:
            if r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                if address not in self._proxies:
                    self._proxies.add(address)
                    log.info("%s does not list the cluster's brokers (a 5.x proxy's remoting "
                             "port): they are taken from the routes", address)
                return self._brokers_of_routes()
            if r.code != ResponseCode.SUCCESS:
                raise response_error(r, "GET_BROKER_CLUSTER_INFO", address)
            return ClusterInfo.from_json(r.body)

        return self._ask(lambda: RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO),
                         "GET_BROKER_CLUSTER_INFO", handle)

    def topic_list(self) -> List[str]:
        """Every topic the name servers know (for pattern subscriptions)."""

        def handle(r: RemotingCommand, address: str) -> List[str]:
            if r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise ResponseError(r.code, f"{address} does not list topics (a 5.x proxy's "
                                    "remoting port answers only routes of named topics): "
                                    "subscribe to topics by name", "topic list", address)
            if r.code != ResponseCode.SUCCESS:
                raise response_error(r, "GET_ALL_TOPIC_LIST_FROM_NAMESERVER", address)
            return sorted(str(t) for t in json_object(r.body, "topic list").get(
                "topicList") or [])

        return self._ask(lambda: RemotingCommand(
            code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list", handle)

    @property
    def proxies(self) -> List[str]:
        """Name server addresses found to be a 5.x proxy's remoting port (by
        :meth:`cluster_info`): every broker behind one is reached at its address."""
        return sorted(self._proxies)

    def _brokers_of_routes(self) -> ClusterInfo:
        info = ClusterInfo()
        for _, route in list(self._routes.values()):
            for broker in route.broker_datas:
                info.broker_addr_table[broker.broker_name] = broker
                members = info.cluster_addr_table.setdefault(broker.cluster, [])
                if broker.broker_name not in members:
                    members.append(broker.broker_name)
        return info
