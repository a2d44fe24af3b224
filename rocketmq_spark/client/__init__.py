"""A pure-Python RocketMQ remoting client. It knows nothing of Spark.

The pieces, from the bottom up (``tests/test_layering.py`` holds the arrows):

* Plumbing, used by every room: :mod:`.protocol` (pure functions over bytes: frames, headers,
  stored messages, routes, pull bodies to Arrow, send encodings, spliced request frames);
  :mod:`.errors`, :mod:`.responses` (a refusal as a typed error, transient or not) and
  :mod:`.busy` (what a busy answer is, the pace of the waits after one); :mod:`.transport`,
  :class:`Connection` and :class:`RemotingClient`; :class:`NameServerClient`,
  :class:`BrokerClient` (one method per request; :mod:`.pull` is PULL_MESSAGE's request and
  answer), :mod:`.admin`; ACL, TLS, namespaces, the per-worker pool.
* The rooms, one job each, on the plumbing: :mod:`.read` (:class:`QueueRangeReader` over a
  pull engine, Python or the C loop), :mod:`.send` (:class:`Producer`, the send pipeline,
  back-pressure), :mod:`.txn` (half messages, END_TRANSACTION, the op topic),
  :mod:`.group` (the consumer-group client: membership, allocation, locks,
  CONSUMER_SEND_MSG_BACK), :mod:`.grpc` (the 5.x proxy's producer, which sends
  :mod:`.send`'s messages) and :mod:`.filter` (SQL92 expressions).

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
    "PullRequest": ".pull", "PullResult": ".pull", "PullStatus": ".pull",
    "DataLossError": ".errors", "QueueRangeReader": ".read.reader",
    "ReadSettings": ".read.settings",
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
