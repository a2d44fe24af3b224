"""spark.read.format("rocketmq"): bounded reads, registration, options checked up front."""
from __future__ import annotations

import json
import logging
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql.utils import AnalysisException

import rocketmq_spark
from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.source.offset_reader import OffsetReader
from rocketmq_spark.source.options import OptionError, parse_source_options
from source_helpers import ids_of, produce


def read(spark, namesrv, topic, **options):
    r = spark.read.format("rocketmq").option("nameServer", namesrv).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def test_batch_read_defaults_to_earliest_through_latest(spark, cluster, topic):
    produce(cluster.namesrv_addr, topic, range(1000))
    df = read(spark, cluster.namesrv_addr, topic)
    assert df.count() == 1000
    assert ids_of(df.select("keys").collect()) == list(range(1000))
    assert [f.name for f in df.schema.fields] == [
        "topic", "brokerName", "queueId", "queueOffset", "body", "tags", "keys", "msgId",
        "bornTimestamp", "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes",
        "commitLogOffset", "queueTopic"]


def test_ending_offsets_and_ending_timestamp(spark, cluster, topic):
    sent = produce(cluster.namesrv_addr, topic, range(400))
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    produce(cluster.namesrv_addr, topic, range(400, 500))
    assert ids_of(read(spark, cluster.namesrv_addr, topic, endingTimestamp=boundary)
                  .select("keys").collect()) == list(range(400))
    spec = {topic: {f"{mq.broker_name}/{mq.queue_id}": 5 for mq in sent}}
    five = read(spark, cluster.namesrv_addr, topic, endingOffsets=json.dumps(spec))
    assert ids_of(five.select("keys").collect()) == sorted(n for ids in sent.values()
                                                          for n in ids[:5])


def test_min_partitions_splits_ranges(spark, cluster, unique_name):
    topic = unique_name("Split")
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    produce(cluster.namesrv_addr, topic, range(1000))
    df = read(spark, cluster.namesrv_addr, topic, minPartitions=5)
    assert df.rdd.getNumPartitions() == 5
    assert ids_of(df.select("keys").collect()) == list(range(1000))


def test_include_properties_gives_a_map(spark, cluster, topic):
    with Producer(cluster.namesrv_addr) as p:
        p.send(Message(topic, b"x", tags="T", keys="k1", properties={"color": "red", "n": "7"}))
    row = read(spark, cluster.namesrv_addr, topic, includeProperties="true").collect()[0]
    assert row["properties"]["color"] == "red" and row["properties"]["n"] == "7"
    assert row["properties"]["TAGS"] == "T" and row["properties"]["KEYS"] == "k1"


def test_subscribe_pattern_and_assign(spark, cluster, unique_name):
    prefix = unique_name("Pat")
    for suffix in ("a", "b"):
        cluster.create_topic(f"{prefix}-{suffix}", queues=2)
        produce(cluster.namesrv_addr, f"{prefix}-{suffix}", range(10), prefix=suffix)
    df = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribePattern", f"{prefix}-.*").load()
    assert sorted({r.topic for r in df.select("topic").collect()}) == [f"{prefix}-a",
                                                                      f"{prefix}-b"]
    assert df.count() == 20
    one = json.dumps([f"{prefix}-a/broker-a/0", {"topic": f"{prefix}-b", "brokerName":
                                                   "broker-b", "queueId": 1}])
    assigned = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("assign", one).load()
    assert {(r.topic, r.brokerName, r.queueId) for r in assigned.collect()} == {
        (f"{prefix}-a", "broker-a", 0), (f"{prefix}-b", "broker-b", 1)}


def test_empty_topic_reads_zero_rows(spark, cluster, topic):
    df = read(spark, cluster.namesrv_addr, topic)
    assert df.collect() == [] and df.count() == 0


def test_topic_without_route_reads_zero_rows_and_warns_naming_it(spark, cluster, unique_name,
                                                                 caplog):
    missing = unique_name("NoSuchTopic")
    assert read(spark, cluster.namesrv_addr, missing).collect() == []
    # The planning runs in a Spark worker; the same lookup here shows what it logs.
    reader = OffsetReader(parse_source_options({"nameServer": cluster.namesrv_addr,
                                                "subscribe": missing}, streaming=True),
                          Admin(cluster.namesrv_addr))
    with caplog.at_level(logging.INFO, logger="rocketmq_spark.source.offset_reader"):
        for _ in range(3):
            assert reader.discover(force=True).queues == []
    warnings = [r for r in caplog.records if missing in r.getMessage()]
    assert [r.levelname for r in warnings] == ["WARNING"], "warned once, at WARNING"
    assert "has no route" in warnings[0].getMessage()
    cluster.create_topic(missing, queues=2)
    assert len(reader.discover(force=True).queues) == 2 * len(cluster.brokers)
    reader.admin.close()


def test_starting_offsets_naming_a_queue_the_topic_lacks_names_it(spark, cluster, topic):
    spec = {topic: {f"{b.name}/{q}": 0 for b in cluster.brokers for q in range(4)}}
    spec[topic]["broker-zz/0"] = 0
    with pytest.raises(Exception) as err:
        read(spark, cluster.namesrv_addr, topic, startingOffsets=json.dumps(spec)).collect()
    text = str(err.value)
    assert f"it names {topic}/broker-zz/0, which the subscription does not have" in text
    assert "startingOffsets" in text and "missing" not in text


def test_register_works_as_well_as_discovery(spark, cluster, topic):
    produce(cluster.namesrv_addr, topic, range(3))
    rocketmq_spark.register(spark)
    assert read(spark, cluster.namesrv_addr, topic).count() == 3
    # Names are case-insensitive in Spark.
    assert spark.read.format("RocketMQ").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", topic).load().count() == 3


@pytest.mark.parametrize("options, named", [
    ({"subscribe": "T"}, "nameServer"),
    ({"nameServer": "nohost", "subscribe": "T"}, "nameServer"),
    ({"nameServer": "h:1"}, "subscribe, subscribePattern and assign"),
    ({"nameServer": "h:1", "subscribe": "T", "assign": "[]"}, "assign"),
    ({"nameServer": "h:1", "subscribe": "bad topic!"}, "subscribe"),
    ({"nameServer": "h:1", "subscribePattern": "(unclosed"}, "subscribePattern"),
    ({"nameServer": "h:1", "assign": "[{\"topic\":1}]"}, "assign"),
    ({"nameServer": "h:1", "subscribe": "T", "startingOffsets": "yesterday"}, "startingOffsets"),
    ({"nameServer": "h:1", "subscribe": "T", "startingOffsets": "{\"T\":{\"0\":1}}"},
     "startingOffsets"),
    ({"nameServer": "h:1", "subscribe": "T", "startingOffsets": "group"}, "consumerGroup"),
    ({"nameServer": "h:1", "subscribe": "T", "startingTimestamp": "soon"}, "startingTimestamp"),
    ({"nameServer": "h:1", "subscribe": "T", "startingTimestamp": "1",
      "startingOffsets": "earliest"}, "startingOffsets, startingTimestamp"),
    ({"nameServer": "h:1", "subscribe": "T", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"nameServer": "h:1", "subscribe": "T", "minPartitions": "0"}, "minPartitions"),
    ({"nameServer": "h:1", "subscribe": "T", "pullBatchSize": "x"}, "pullBatchSize"),
    ({"nameServer": "h:1", "subscribe": "T", "accessKey": "ak"}, "secretKey"),
    ({"nameServer": "h:1", "subscribe": "T", "filter": "a || *"}, "filter"),
    ({"nameServer": "h:1", "subscribe": "T", "subscribtion": "oops"}, "subscribtion"),
    ({"nameServer": "h:1", "subscribe": "T", "endingOffsets": "latest"}, "endingOffsets"),
    ({"nameServer": "h:1", "subscribe": "T", "maxMessagesPerTrigger": "-5"},
     "maxMessagesPerTrigger"),
])
def test_bad_options_name_the_option(options, named):
    with pytest.raises(OptionError) as err:
        parse_source_options(options, streaming=True)
    assert named in str(err.value)


G = {"nameServer": "h:1", "subscribe": "T", "consumerGroup": "g", "membership": "group"}


@pytest.mark.parametrize("options, streaming, named", [
    ({"nameServer": "h:1", "subscribe": "T", "membership": "maybe"}, True, "membership"),
    ({"nameServer": "h:1", "subscribe": "T", "lockQueues": "true"}, True,
     "lockQueues needs membership=group"),
    ({"nameServer": "h:1", "subscribe": "T", "membership": "group"}, True, "consumerGroup"),
    (G, False, "streaming queries"),
    ({**G, "subscribe": None, "assign": '["T/broker-a/0"]'}, True, "assign"),
    ({**G, "commitOffsets": "false"}, True, "commitOffsets=false"),
    ({**G, "allocateStrategy": "randomly"}, True, "allocateStrategy must be one of"),
    ({**G, "consistentHashVirtualNodes": "5"}, True, "allocateStrategy=consistentHash"),
    ({**G, "allocateStrategy": "consistentHash", "consistentHashVirtualNodes": "0"}, True,
     "consistentHashVirtualNodes must be between 1 and 10000"),
    ({**G, "allocateStrategy": "machineRoom"}, True, "allocateMachineRooms"),
    ({**G, "allocateMachineRooms": "hz1"}, True, "allocateMachineRooms needs"),
    ({**G, "lockQueues": "yes"}, True, "lockQueues must be true or false"),
    ({**G, "memberName": "has space"}, True, "memberName"),
    ({**G, "rebalanceIntervalMs": "10"}, True, "rebalanceIntervalMs must be between"),
])
def test_bad_membership_options_name_the_option(options, streaming, named):
    options = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(OptionError) as err:
        parse_source_options(options, streaming=streaming)
    assert named in str(err.value)


def test_membership_options_are_read():
    o = parse_source_options({**G, "allocateStrategy": "CONSISTENTHASH",
                              "consistentHashVirtualNodes": "32", "lockQueues": "true",
                              "memberName": "eu-1", "rebalanceIntervalMs": "5000"},
                             streaming=True)
    assert (o.membership, o.allocate_strategy, o.consistent_hash_virtual_nodes, o.lock_queues,
            o.member_name, o.rebalance_interval_ms) == (
        "group", "consistentHash", 32, True, "eu-1", 5000)
    rooms = parse_source_options({**G, "allocateStrategy": "machineRoom",
                                  "allocateMachineRooms": "hz1, hz2"}, streaming=True)
    assert rooms.machine_rooms == ("hz1", "hz2")


def test_bad_options_fail_the_query_before_it_runs(spark):
    started = time.monotonic()
    with pytest.raises((PySparkException, AnalysisException, Exception)) as err:
        spark.read.format("rocketmq").option("nameServer", "127.0.0.1:1") \
            .option("subscribe", "T").option("startingOffset", "earliest").load().collect()
    assert "startingOffset" in str(err.value) and "unknown option" in str(err.value)
    assert time.monotonic() - started < 30
    with pytest.raises(Exception) as err:
        spark.readStream.format("rocketmq").option("nameServer", "127.0.0.1:1") \
            .option("subscribe", "T").option("endingOffsets", "latest").load() \
            .writeStream.format("noop").start().awaitTermination(30)
    assert "endingOffsets" in str(err.value)


def test_secrets_stay_out_of_reprs_and_errors():
    options = parse_source_options({"nameServer": "h:1", "subscribe": "T", "accessKey": "AK1",
                                    "secretKey": "s3cr3t-value"}, streaming=True)
    assert "s3cr3t-value" not in repr(options) and "AK1" not in repr(options)
    assert "credentials=<set>" in repr(options)
    with pytest.raises(OptionError) as err:
        parse_source_options({"nameServer": "h:1", "subscribe": "T", "accessKey": "AK1",
                              "secretKey": "s3cr3t-value", "startingOffsets": "nope"},
                             streaming=True)
    assert "s3cr3t-value" not in str(err.value)
