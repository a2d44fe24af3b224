"""Exactly once is refused through a 5.x proxy's remoting port, before anything is sent.

Through that port a first-phase END_TRANSACTION never reaches a broker: a genuine 5.1.4 proxy
answers it SUCCESS and drops it, because it finds a transaction only in a table it fills when
it passes a broker's check-back on. The rows of an exactly-once write would become visible only
by check-back, one broker ``transactionCheckInterval`` (30 s by default on 5.x) or more after
the commit, each answered through the proxy within its ``transactionDataExpireMillis`` (30 s),
and with no way to learn that a COMMIT was applied. The sink's record of what it committed is
kept per broker address and read from the brokers' op topic, which a proxy hides. So the write
is refused on the driver, with what to do instead.

How a proxy is told from a name server: a name server answers GET_BROKER_CLUSTER_INFO; a
proxy's remoting port refuses it (REQUEST_CODE_NOT_SUPPORTED " request type 106 not
supported", seen on a genuine 5.1.4 proxy), which :class:`~..client.nameserver.NameServerClient`
records. The route's broker addresses are no test: the proxy hands out its interface address,
not the one the client dialled.
"""
from __future__ import annotations

from typing import List

from ..client.config import parse_name_servers
from ..client.errors import RocketMQError
from ..client.nameserver import NameServerClient
from ..client.remoting import RemotingClient
from ..options import OptionError
from .options import SinkOptions


def proxies_among_name_servers(options: SinkOptions) -> List[str]:
    """The ``nameServer`` addresses that are a 5.x proxy's remoting port (asked once)."""
    if not options.name_servers:
        return []
    remoting = RemotingClient(options.connection().client_config())
    try:
        for address in parse_name_servers(list(options.name_servers)):
            names = NameServerClient(address, remoting)
            try:
                names.cluster_info()
            except RocketMQError:
                continue  # unreachable now: the write will say so when it sends
            if names.proxies:
                return names.proxies
        return []
    finally:
        remoting.close()


def refuse_exactly_once_through_proxy(options: SinkOptions) -> None:
    """Raise :class:`OptionError` when ``deliveryGuarantee=exactlyOnce`` would go through a
    5.x proxy's remoting port."""
    if not options.exactly_once or options.send_back:
        return
    proxies = proxies_among_name_servers(options)
    if not proxies:
        return
    raise OptionError(
        f"option deliveryGuarantee=exactlyOnce cannot be kept through a 5.x proxy's remoting "
        f"port (nameServer {', '.join(proxies)} is one: it does not list the cluster's "
        "brokers). Such a proxy answers every first-phase END_TRANSACTION (COMMIT) with "
        "SUCCESS and drops it; the rows would become visible only when a broker checks back, "
        "a transactionCheckInterval (30 s by default) or more later, and the sink could not "
        "confirm them. Nothing was sent. Give nameServer the cluster's name servers so the "
        "sink reaches the brokers directly, or write with deliveryGuarantee=atLeastOnce "
        "through the proxy (each row keeps one message id, so readers can drop repeats)")
