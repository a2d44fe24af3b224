"""Exactly once through a 5.x proxy's remoting port: found on the driver, before anything is
sent. ``df.write`` is settled by check-back there (:mod:`.proxy_settle`); a stream is refused.

Through that port a first-phase END_TRANSACTION never reaches a broker: a genuine 5.1.4 proxy
answers it SUCCESS and drops it, because it finds a transaction only in a table it fills when
it passes a broker's check-back on. A stream's recovery after a driver crash decides which rows
its dead driver committed from each broker's op topic, by broker address, which a proxy hides
(every broker is at its address), so a stream is refused with what to do instead.

How a proxy is told from a name server: a name server answers GET_BROKER_CLUSTER_INFO; a
proxy's remoting port refuses it (REQUEST_CODE_NOT_SUPPORTED " request type 106 not
supported", seen on a genuine 5.1.4 proxy), which :class:`~..client.nameserver.NameServerClient`
records. The route's broker addresses are no test: the proxy hands out its interface address,
not the one the client dialled.
"""
from __future__ import annotations

from typing import List, Optional

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
    remoting = RemotingClient(options.connection.client_config())
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


def exactly_once_proxy(options: SinkOptions) -> Optional[str]:
    """The proxy an exactly-once write would go through, or None."""
    if not options.exactly_once or options.send_back:
        return None
    proxies = proxies_among_name_servers(options)
    return proxies[0] if proxies else None


def refuse_exactly_once_stream_through_proxy(options: SinkOptions) -> None:
    """Raise :class:`OptionError` when a stream's ``deliveryGuarantee=exactlyOnce`` would go
    through a 5.x proxy's remoting port."""
    proxy = exactly_once_proxy(options)
    if proxy is None:
        return
    raise OptionError(
        f"option deliveryGuarantee=exactlyOnce is not kept by a stream through a 5.x proxy's "
        f"remoting port (nameServer {proxy} is one: it does not list the cluster's brokers). "
        "Such a proxy drops every first-phase END_TRANSACTION (COMMIT), so rows settle only "
        "when a broker checks back, and after a driver crash the stream could not tell which "
        "rows its last run committed. Nothing was sent. Give nameServer the cluster's name "
        "servers so the sink reaches the brokers directly, or use "
        "deliveryGuarantee=atLeastOnce through the proxy (each row keeps one message id, so "
        "readers can drop repeats); a batch df.write with exactlyOnce works through the proxy")
