"""A pure-Python RocketMQ remoting client. It knows nothing of Spark.

The pieces, from the bottom up:

* :mod:`.protocol`: pure functions over bytes (frames, headers, stored messages, routes; pull
  bodies to Arrow in :mod:`.protocol.pull_decode` and its numpy twin; send encodings over Arrow
  in :mod:`.protocol.send_encode`; request frames spliced over columns in
  :mod:`.protocol.spliced_requests`).
* :mod:`.transport` (plain TCP or TLS byte streams), :class:`Connection` (one socket, requests
  multiplexed by opaque), :class:`RemotingClient` (connections by address).
* :class:`NameServerClient` and :class:`BrokerClient` (one method per request), :mod:`.admin`.
* Reading: :class:`QueueRangeReader` (an offset range as Arrow batches) over a pull engine
  (:mod:`.read.pull_engine`): :mod:`.read.python_pull_engine`, or :mod:`.read.native_pull_engine`,
  the C loop set up by :mod:`.read.native_pull` and driven on a connection by
  :mod:`.read.native_pull_driver`.
* Writing: :class:`Producer`, the :mod:`.send.pipeline` (requests in flight per broker, with
  retries) and :mod:`.txn.transaction` (half messages, END_TRANSACTION, check-backs).

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
    "Message": ".send.producer", "Producer": ".send.producer", "SendResult": ".send.producer",
    "MessageQueue": ".protocol.route", "TopicRouteData": ".protocol.route",
    "PullRequest": ".read.pull", "PullResult": ".read.pull", "PullStatus": ".read.pull",
    "DataLossError": ".errors", "QueueRangeReader": ".read.reader", "ReadSettings": ".read.reader",
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
