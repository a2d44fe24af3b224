"""The connection options, declared once (rocketmq_spark/options.py), parsed into one
ConnectionSettings for the source, the sink and the lag listener; the settings are the client
pool's key; every holder of the credentials shows them as ``<set>`` only; and one lookup of a
broker's master address (rocketmq_spark/client/masters.py)."""
from __future__ import annotations

import pytest

from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.config import ClientConfig
from rocketmq_spark.client.errors import BrokerUnavailable, RouteNotFound
from rocketmq_spark.client.masters import master_address, masters, routes_of
from rocketmq_spark.client.protocol.route import BrokerData, QueueData, TopicRouteData
from rocketmq_spark.options import CONNECTION, parse_connection_settings
from rocketmq_spark.sink.options import SINK_OPTIONS, parse_sink_options
from rocketmq_spark.source.options import SOURCE_OPTIONS, parse_source_options

AK, SK = "AKconn4Q", "SKconn9Z"
BASE = {"nameServer": "h:9876", "accessKey": AK, "secretKey": SK, "tls": "true",
        "tlsVerify": "false", "namespace": "ns1"}


def test_source_sink_and_listener_read_the_same_settings():
    source = parse_source_options({**BASE, "subscribe": "T"}, streaming=True).connection
    sink = parse_sink_options({**BASE, "topic": "T"}).connection
    listener = parse_connection_settings({**BASE, "subscribe": "T", "pullBatchSize": "8"})
    for settings in (source, sink, listener):
        assert (settings.name_servers, settings.credentials, settings.tls,
                settings.tls_verify, settings.namespace) == (
            ("h:9876",), Credentials(AK, SK), True, False, "ns1")
    # Each side's own timeout: the source's pull timeout, the sink's send timeout.
    assert (source.timeout, sink.timeout, listener.timeout) == (10.0, 5.0, 5.0)


def test_both_tables_take_the_connection_options_from_one_declaration():
    for table in (SOURCE_OPTIONS, SINK_OPTIONS):
        for option in CONNECTION:
            assert table[option.name] is option


def test_the_settings_are_the_pool_key():
    one = parse_sink_options({**BASE, "topic": "T"}).connection
    same = parse_sink_options({**BASE, "topic": "U"}).connection
    other_secret = parse_sink_options({**BASE, "topic": "T", "secretKey": "SKother1"}).connection
    assert one == same and hash(one) == hash(same) and len({one, same}) == 1
    assert one != other_secret and len({one, other_secret}) == 2


def test_every_holder_of_the_credentials_hides_them():
    credentials = Credentials(AK, SK, "TOKENconn7")
    source = parse_source_options({**BASE, "subscribe": "T"}, streaming=True)
    sink = parse_sink_options({**BASE, "topic": "T"})
    for holder in (credentials, ClientConfig(credentials=credentials), source,
                   source.connection, source.connection.client_config(), sink):
        for text in (repr(holder), str(holder)):
            assert AK not in text and SK not in text and "TOKENconn7" not in text, text
            assert "<set>" in text, text


def _route(**brokers) -> TopicRouteData:
    return TopicRouteData(queue_datas=[QueueData(name, 4, 4) for name in brokers],
                          broker_datas=[BrokerData(name, addrs) for name, addrs in brokers.items()])


def test_the_master_is_taken_from_the_first_route_that_routes_one():
    headless = _route(a={1: "slave:1"})
    full = _route(a={0: "master:1", 1: "slave:1"}, b={0: "master:2"})
    assert master_address([headless, full], "a", "no master") == "master:1"
    with pytest.raises(BrokerUnavailable, match="no master of a"):
        master_address([headless], "a", "no master of a")
    assert masters([headless, full]) == {"a": "master:1", "b": "master:2"}

    asked = []

    def route(topic: str) -> TopicRouteData:
        asked.append(topic)
        if topic == "gone":
            raise RouteNotFound(topic, "not routed")
        return full

    # Routes are read lazily: a topic after the one that answers is not looked up.
    assert master_address(routes_of(route, ["gone", "T", "U"]), "b", "x") == "master:2"
    assert asked == ["gone", "T"]
