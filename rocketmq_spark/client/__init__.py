"""A pure-Python RocketMQ remoting client. It knows nothing of Spark.

The pieces, from the bottom up: :mod:`.protocol` (bytes in, objects out), :class:`Connection`
(one socket, requests multiplexed by opaque), :class:`RemotingClient` (connections by address),
:class:`NameServerClient` and :class:`BrokerClient` (one method per request),
:class:`QueueRangeReader` (a pull loop over an offset range) and :class:`Producer`.

Names are imported on first use, so ``import rocketmq_spark.client.protocol.frame`` (as the
embedded server does) does not load numpy and pyarrow.
"""
import importlib

_EXPORTS = {
    "Credentials": ".acl",
    "BrokerClient": ".broker", "SendResponse": ".broker", "Subscription": ".broker",
    "ClientConfig": ".config", "make_tls_context": ".config", "parse_name_servers": ".config",
    "Connection": ".connection",
    "AuthError": ".errors", "BrokerUnavailable": ".errors", "ClientClosed": ".errors",
    "MessageDecodeError": ".errors", "NameServerUnavailable": ".errors",
    "ProtocolError": ".errors", "RemotingConnectionError": ".errors",
    "RequestTimeout": ".errors", "ResponseError": ".errors", "RocketMQError": ".errors",
    "RouteNotFound": ".errors",
    "NameServerClient": ".nameserver",
    "Message": ".producer", "Producer": ".producer", "SendResult": ".producer",
    "MessageQueue": ".protocol.route", "TopicRouteData": ".protocol.route",
    "PullRequest": ".pull", "PullResult": ".pull", "PullStatus": ".pull",
    "DataLossError": ".errors", "QueueRangeReader": ".reader", "ReadSettings": ".reader",
    "RemotingClient": ".remoting",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
