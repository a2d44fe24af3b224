"""What the proxy says of a topic (QueryRoute): its writable queues and the message types it
takes, cached for ``ROUTE_TTL`` seconds.

The proxy picks every call's queue itself (see :mod:`.queue_choice`); the client needs the
route only to refuse what a topic does not take and to predict a FIFO message's queue.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, FrozenSet, List

from ..errors import RouteNotFound
from ..protocol.route import MessageQueue
from . import definition_pb2 as definition
from . import service_pb2 as service
from . import status
from .endpoints import ProxyEndpoints

ROUTE_TTL = 30.0
_WRITABLE = (definition.WRITE, definition.READ_WRITE)


class TopicRoute:
    """A topic's writable queues on master brokers (sorted) and the message types it takes
    (empty: the proxy did not say, so any)."""

    __slots__ = ("queues", "accepts", "fetched")

    def __init__(self, queues: List[MessageQueue], accepts: FrozenSet[int], fetched: float):
        self.queues = queues
        self.accepts = accepts
        self.fetched = fetched


def route_from_response(topic: str, response: service.QueryRouteResponse,
                        address: str) -> TopicRoute:
    """The :class:`TopicRoute` of a QueryRoute answer, or the error it reports."""
    if response.status.code == definition.TOPIC_NOT_FOUND:
        raise RouteNotFound(topic, f"the proxy knows no topic {topic!r} "
                                   f"({response.status.message})".rstrip(), address)
    status.check(response.status, "QueryRoute", address)
    # The route's queue ids need not be the broker's (Apache lists read-only ones first);
    # a broker with n writable entries takes writes on its queues 0..n-1.
    writable: Dict[str, int] = {}
    accepts = set()
    for queue in response.message_queues:
        if queue.permission in _WRITABLE and queue.broker.id == 0:
            writable[queue.broker.name] = writable.get(queue.broker.name, 0) + 1
            accepts.update(queue.accept_message_types)
    queues = [MessageQueue(topic, name, i) for name, n in writable.items() for i in range(n)]
    return TopicRoute(sorted(queues), frozenset(accepts), time.monotonic())


class RouteCache:
    """Routes by topic, asked for with ``query_route(request)`` (a blocking QueryRoute call)
    when missing or older than ``ROUTE_TTL``."""

    def __init__(self, endpoints: ProxyEndpoints, namespace: str,
                 query_route: Callable[[service.QueryRouteRequest],
                                       service.QueryRouteResponse]):
        self._endpoints = endpoints
        self._namespace = namespace
        self._query_route = query_route
        self._routes: Dict[str, TopicRoute] = {}

    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        route = self._routes.get(topic)
        if route is not None and not refresh and time.monotonic() - route.fetched < ROUTE_TTL:
            return route
        response = self._query_route(service.QueryRouteRequest(
            topic=definition.Resource(name=topic, resource_namespace=self._namespace),
            endpoints=self._endpoints.to_proto()))
        route = route_from_response(topic, response, str(self._endpoints))
        self._routes[topic] = route
        return route
