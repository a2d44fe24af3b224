"""The option ``namespace`` as the source, the sink and the lag listener parse it: the names
they use on the wire, the pattern rule, and a clear error naming the option at fault."""
from __future__ import annotations

import pyarrow as pa
import pytest

from rocketmq_spark import RocketMQLagListener
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.options import OptionError
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.source.namespacing import pattern_topics, queue_key_without_namespace
from rocketmq_spark.source.options import parse_source_options
from rocketmq_spark.source.partition_reader import topics_without_namespace

NS = {"nameServer": "h:1", "namespace": "ns1"}


def test_source_names_go_into_the_namespace_once():
    o = parse_source_options({**NS, "subscribe": "T,ns1%U,rmq_sys_X", "consumerGroup": "g"},
                             streaming=True)
    assert o.topics == ("ns1%T", "ns1%U", "rmq_sys_X") and o.consumer_group == "ns1%g"
    assert o.namespace == "ns1"
    assert parse_source_options({**NS, "subscribe": "T"}, True).consumer_group == \
        "ns1%spark-rocketmq-source"
    assert parse_source_options({"nameServer": "h:1", "subscribe": "T"}, True).topics == ("T",)


def test_queues_of_assign_and_per_queue_offsets_go_into_the_namespace():
    o = parse_source_options({**NS, "assign": '["T/b/0", "ns1%T/b/1"]',
                              "startingOffsets": '{"T": {"b/0": 3}, "ns1%T/b/1": 4}',
                              "endingOffsets": '{"T/b/0": 9, "T/b/1": 9}'}, streaming=False)
    assert o.assigned == (MessageQueue("ns1%T", "b", 0), MessageQueue("ns1%T", "b", 1))
    assert o.starting.per_queue == {MessageQueue("ns1%T", "b", 0): 3,
                                    MessageQueue("ns1%T", "b", 1): 4}
    assert set(o.ending.per_queue) == set(o.assigned)


@pytest.mark.parametrize("raw, named", [
    ({**NS, "namespace": "a%b", "subscribe": "T"}, "option namespace 'a%b'"),
    ({**NS, "namespace": "ns 1", "subscribe": "T"}, "option namespace"),
    ({**NS, "namespace": "rmq_sys_x", "subscribe": "T"}, "system"),
    ({**NS, "namespace": "n" * 100, "subscribe": "t" * 27}, "option subscribe"),
    ({**NS, "namespace": "n" * 100, "subscribe": "T", "consumerGroup": "g" * 155},
     "option consumerGroup"),
])
def test_bad_source_namespace_names_the_option(raw, named):
    with pytest.raises(OptionError, match=named):
        parse_source_options(raw, streaming=True)


def test_sink_namespace_is_checked_and_kept_as_given():
    o = parse_sink_options({**NS, "topic": "T", "producerGroup": "pg"})
    assert (o.topic, o.producer_group, o.namespace) == ("T", "pg", "ns1")
    with pytest.raises(OptionError, match="option namespace"):
        parse_sink_options({**NS, "namespace": "a.b", "topic": "T"})
    with pytest.raises(OptionError, match="option topic: in namespace"):
        parse_sink_options({**NS, "namespace": "n" * 100, "topic": "t" * 27})
    with pytest.raises(OptionError, match="option producerGroup: in namespace"):
        parse_sink_options({**NS, "namespace": "n" * 100, "topic": "T",
                            "producerGroup": "g" * 155})


def test_a_pattern_matches_names_within_the_namespace():
    topics = ["ns1%orders", "ns1%orders-eu", "orders", "ns2%orders", "ns1x%orders",
              "%RETRY%ns1%g"]
    assert pattern_topics(topics, "orders.*", "ns1") == ["ns1%orders", "ns1%orders-eu"]
    assert pattern_topics(topics, "orders", "") == ["orders"]
    assert pattern_topics(topics, "ns1%orders", "ns1") == []   # names are matched without it


def test_rows_and_lag_keys_show_topics_without_the_namespace():
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["ns1%T", "ns1%T", "ns2%T", "ns1%U"]), pa.array([1, 2, 3, 4])],
        names=["topic", "queueOffset"])
    out = topics_without_namespace(batch, "ns1")
    assert out.column(0).to_pylist() == ["T", "T", "ns2%T", "U"]
    assert out.schema == batch.schema and out.column(1).to_pylist() == [1, 2, 3, 4]
    assert queue_key_without_namespace("ns1%T/broker-a/3", "ns1") == "T/broker-a/3"
    assert queue_key_without_namespace("(no queues yet)", "ns1") == "(no queues yet)"


def test_the_lag_listener_checks_its_namespace():
    with pytest.raises(OptionError, match="option namespace"):
        RocketMQLagListener({"nameServer": "h:1", "namespace": "a%b"})
    RocketMQLagListener({"nameServer": "h:1", "Namespace": "ns1"}).close()
