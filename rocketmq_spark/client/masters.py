"""Where a broker's master is: the one lookup of a master address in the routes.

Only a broker's master (brokerId 0) takes sends, send-backs, queue locks and the offsets a
slave took while the master was down; when no master is routed, those wait or fail, while
reads and offset lookups fall over to a slave (:meth:`.admin.Admin.lookup_address`, which
:mod:`.serving_nodes` follows).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Iterator, Optional

from .errors import BrokerUnavailable, RocketMQError
from .protocol.route import TopicRouteData


def master_of(route: TopicRouteData, broker_name: str) -> Optional[str]:
    """The master address of ``broker_name`` in ``route`` (None: the broker or its master
    is not routed)."""
    broker = route.broker(broker_name)
    return broker.master_addr if broker is not None else None


def master_address(routes: Iterable[TopicRouteData], broker_name: str, missing: str) -> str:
    """The master of ``broker_name`` in the first of ``routes`` that routes one (``routes``
    is read lazily: a generator that refreshes or looks up another topic's route is asked
    only when the routes before it name no master). Raises :class:`BrokerUnavailable` with
    the reason ``missing`` when none does."""
    for route in routes:
        address = master_of(route, broker_name)
        if address:
            return address
    raise BrokerUnavailable(broker_name, missing)


def routes_of(route: Callable[[str], TopicRouteData], topics: Iterable[str]
              ) -> Iterator[TopicRouteData]:
    """The routes of ``topics`` by ``route``, in turn; a topic whose route cannot be had is
    skipped."""
    for topic in topics:
        try:
            found = route(topic)
        except RocketMQError:
            continue
        yield found


def masters(routes: Iterable[TopicRouteData]) -> Dict[str, str]:
    """Broker name -> master address over ``routes`` (a broker whose master is not routed has
    no entry; a later route's answer wins)."""
    out: Dict[str, str] = {}
    for route in routes:
        for broker in route.broker_datas:
            if broker.master_addr:
                out[broker.broker_name] = broker.master_addr
    return out
