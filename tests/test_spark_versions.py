"""Spark 4.0 to 4.3: what rocketmq_spark.spark_compat finds in the running PySpark, and the
fallbacks for what it lacks, in a real local Spark session against the embedded server.

The whole file belongs to the compatibility subset that ci/compat.sh runs on Spark 4.0 and 4.1
(ci/test.sh runs it on the newest Spark). The stream reader Spark 4.0 and 4.1 get
(:class:`LegacyStreamReader`: ``latestOffset()`` without a start or limit) also runs here on the
newest Spark, through a data source that hands it out; Spark 4.2+ still calls a reader of that
shape (and runs Trigger.AvailableNow as one batch for it, as 4.0 and 4.1 do for every Python
source), so its fallbacks are checked on every run, and on the real old Spark by ci/compat.sh.
"""
from __future__ import annotations

import inspect
import json

import pyspark
import pytest
from pyspark.sql import datasource as pyspark_datasource

from rocketmq_spark import spark_compat
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.source.lag import RocketMQLagListener
from rocketmq_spark.source.offsets import (
    entries_of, from_offset, to_offset, with_entries,
)
from rocketmq_spark.source.stream_reader import LegacyStreamReader, RocketMQStreamReader
from rocketmq_spark.sink.writer import RocketMQStreamWriter
from source_helpers import ids_of, produce, reader, run_available_now
from waiting import wait_until

SPARK = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
LEGACY_SPARK = SPARK < (4, 2)


# ----------------------------------------------------------------------------- detection

def test_features_found_are_those_each_release_documents():
    """The versionadded of each API in pyspark/sql/datasource.py of 4.0.5, 4.1.4, 4.2.1 and
    4.3.0: admission control, the AvailableNow mixin and reportLatestOffset came in 4.2, the
    Arrow stream writer and pushFilters in 4.1."""
    assert spark_compat.SPARK_VERSION == pyspark.__version__
    assert spark_compat.ADMISSION_CONTROL is (SPARK >= (4, 2))
    assert spark_compat.TRIGGER_AVAILABLE_NOW is (SPARK >= (4, 2))
    assert spark_compat.REPORTS_LATEST_OFFSET is (SPARK >= (4, 2))
    assert spark_compat.STREAM_ARROW_WRITER is (SPARK >= (4, 1))
    assert spark_compat.FILTER_PUSHDOWN is (SPARK >= (4, 1))


def test_spark_gets_the_reader_and_writer_its_workers_call():
    """Spark's streaming-source runner calls ``latestOffset()`` with no argument before 4.2
    and ``latestOffset(start, limit)`` from 4.2 on (it reads the signature); the stream writer
    must be a class Spark's write worker feeds Arrow batches."""
    parameters = inspect.signature(RocketMQStreamReader.latestOffset).parameters
    assert len(parameters) == (1 if LEGACY_SPARK else 3)  # self included
    assert (RocketMQStreamReader is LegacyStreamReader) is LEGACY_SPARK
    if SPARK >= (4, 1):
        assert issubclass(RocketMQStreamWriter, pyspark_datasource.DataSourceStreamArrowWriter)
    else:  # 4.0's write worker hands Arrow batches to any DataSourceArrowWriter
        assert issubclass(RocketMQStreamWriter, pyspark_datasource.DataSourceArrowWriter)
        assert issubclass(RocketMQStreamWriter, pyspark_datasource.DataSourceStreamWriter)


def test_one_info_line_names_the_spark_version_and_what_it_changes(monkeypatch, caplog):
    monkeypatch.setattr(spark_compat, "_announced", False)
    with caplog.at_level("INFO", logger="rocketmq_spark.spark_compat"):
        line = spark_compat.announce(max_messages_per_trigger=100)
        again = spark_compat.announce(max_messages_per_trigger=100)
    logged = [r.getMessage() for r in caplog.records]
    if not LEGACY_SPARK:
        assert line is None and logged == []
        return
    assert logged == [line] and again is None
    assert f"Spark {pyspark.__version__}" in line
    assert "maxMessagesPerTrigger=100 caps every micro-batch" in line
    assert "Trigger.AvailableNow runs as one micro-batch" in line
    assert "looks the latest offsets up itself" in line
    assert ("DataSourceStreamArrowWriter" in line) is (SPARK < (4, 1))


def test_entry_positions_ride_in_the_end_offset_and_stay_canonical():
    a, b = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-b", 1)
    end = with_entries(to_offset({a: 10, b: 7}), {b: 3})
    text = json.dumps(end)
    assert end["entering"] == {b.key: 3}
    back = json.loads(text)  # what Spark hands back: the same text, the same meaning
    assert json.dumps(back) == text
    assert from_offset(back) == {a: 10, b: 7} and entries_of(back) == {b: 3}
    assert with_entries(to_offset({a: 1}), {}) == to_offset({a: 1})
    with pytest.raises(ValueError, match="must map queues"):
        entries_of({"version": 2, "queues": {}, "entering": 5})


# ------------------------------------------------------------------- the reader of 4.0/4.1

def _legacy_source():
    """The rocketmq data source, handing out the reader of Spark 4.0 and 4.1 (made here so
    that cloudpickle ships it to the workers by value)."""
    from rocketmq_spark.datasource import RocketMQDataSource
    from rocketmq_spark.source.options import parse_source_options
    from rocketmq_spark.source.stream_reader import LegacyStreamReader

    class LegacyRocketMQ(RocketMQDataSource):
        @classmethod
        def name(cls) -> str:
            return "rocketmq_legacy_reader"

        def streamReader(self, schema):
            return LegacyStreamReader(parse_source_options(self.options, streaming=True))

    return LegacyRocketMQ


@pytest.fixture(scope="module")
def legacy_format(spark) -> str:
    """The format whose stream reader is :class:`LegacyStreamReader`: ``rocketmq`` itself on
    Spark 4.0 and 4.1."""
    if LEGACY_SPARK:
        return "rocketmq"
    source = _legacy_source()
    spark.dataSource.register(source)
    return source.name()


def legacy_reader(spark, fmt: str, namesrv: str, topic: str, **options):
    r = spark.readStream.format(fmt).option("nameServer", namesrv).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def batch_sizes(query):
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_available_now_reads_what_is_there_in_one_batch_and_restarts_exactly_once(
        spark, legacy_format, cluster, topic, tmp_path):
    """Spark runs AvailableNow as one batch for this reader: batch 0 must read, from the start
    recorded in its end offset (the 4.2+ reader's batch 0 only pins the start)."""
    checkpoint, sink = tmp_path / "cp", str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(0, 1200))
    df = legacy_reader(spark, legacy_format, cluster.namesrv_addr, topic,
                       startingOffsets="earliest")
    first = run_available_now(spark, df, str(checkpoint), sink)
    assert batch_sizes(first) == [1200]
    logged = (checkpoint / "offsets" / "0").read_text().splitlines()[-1]
    assert len(entries_of(json.loads(logged))) == 8  # every queue entered at 0
    produce(cluster.namesrv_addr, topic, range(1200, 1500))
    second = run_available_now(spark, df, str(checkpoint), sink)
    assert batch_sizes(second) == [300]
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == list(range(1500))


def test_max_messages_per_trigger_caps_each_batch_and_a_restart_goes_on(
        spark, legacy_format, cluster, topic, tmp_path):
    checkpoint, sink = str(tmp_path / "cp"), str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(1000))
    df = legacy_reader(spark, legacy_format, cluster.namesrv_addr, topic,
                       startingOffsets="earliest", maxMessagesPerTrigger=150)

    def run_until(total: int):
        query = df.writeStream.format("parquet").option("path", sink) \
            .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start()
        try:
            wait_until(lambda: sum(batch_sizes(query)) >= total or query.exception(), 120,
                       f"{total} rows read")
            assert query.exception() is None, query.exception()
            return batch_sizes(query)
        finally:
            query.stop()

    sizes = run_until(1000)
    assert sum(sizes) == 1000 and max(sizes) == 150 and len(sizes) == 7
    produce(cluster.namesrv_addr, topic, range(1000, 1200))
    assert run_until(200) == [150, 50]
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == list(range(1200))


def test_a_restart_under_the_available_now_wrapper_stops_before_reading(
        spark, legacy_format, cluster, topic, tmp_path):
    """Spark's Trigger.AvailableNow wrapper asks for the latest offset before saying where the
    checkpoint stands: the reader refuses, naming the setting, instead of guessing."""
    checkpoint, sink = str(tmp_path / "cp"), str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(100))
    df = legacy_reader(spark, legacy_format, cluster.namesrv_addr, topic,
                       startingOffsets="earliest")
    run_available_now(spark, df, checkpoint, sink)
    produce(cluster.namesrv_addr, topic, range(100, 150))
    spark.conf.set("spark.sql.streaming.triggerAvailableNowWrapper.enabled", "true")
    try:
        query = df.writeStream.format("parquet").option("path", sink) \
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        with pytest.raises(Exception, match="triggerAvailableNowWrapper"):
            query.awaitTermination(120)
    finally:
        spark.conf.unset("spark.sql.streaming.triggerAvailableNowWrapper.enabled")
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == list(range(100))
    run_available_now(spark, df, checkpoint, sink)  # without it, the run goes on
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == list(range(150))


def test_lag_listener_looks_the_latest_offsets_up_where_spark_reports_none(
        spark, legacy_format, embedded_cluster_session, unique_name, tmp_path):
    """Before 4.2 the progress's latestOffset is the batch's end: the listener asks the
    brokers. (On 4.2+ this reader's progress has no reported latest either, so the test asks
    for the lookup; on 4.0 and 4.1 it is the listener's default.)"""
    cluster = embedded_cluster_session
    topic = unique_name("LegacyLag")
    cluster.create_topic(topic, queues=2, brokers=["broker-a"])
    for q in (0, 1):
        cluster.append(topic, "broker-a", q, [b"%d" % i for i in range(100)])
    options = {"nameServer": cluster.namesrv_addr, "subscribe": topic}
    lag = RocketMQLagListener(options, **({} if LEGACY_SPARK else {"latest_from_broker": True}))
    spark.streams.addListener(lag)
    query = legacy_reader(spark, legacy_format, cluster.namesrv_addr, topic,
                          startingOffsets="earliest", maxMessagesPerTrigger=50) \
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(processingTime="0 seconds").start()
    try:
        wait_until(lambda: sum(batch_sizes(query)) >= 200 or query.exception(), 120,
                   "200 rows read")
        wait_until(lambda: len(lag.reports(query.id)) >= 4, 60, "a report per batch")
    finally:
        query.stop()
        spark.streams.removeListener(lag)
        lag.close()
    reports = [r for r in lag.reports(query.id) if r.num_input_rows]
    assert [r.total_offsets_behind_latest for r in reports] == [150, 100, 50, 0]
    assert [r.max_offsets_behind_latest for r in reports] == [75, 50, 25, 0]
    assert reports[0].queues[f"{topic}/broker-a/0"].oldest_unread_ms == \
        cluster.store_time(topic, "broker-a", 0, 25)


def test_a_group_member_reads_its_share_in_its_one_available_now_batch(
        spark, legacy_format, embedded_cluster, tmp_path):
    from group_helpers import Feeder, queues_of, sink_rows
    from rocketmq_spark.client.group.allocation import allocate_all
    from test_group_member import make_member

    cluster, group, topic = embedded_cluster, "legacy-group", "LegacyGroupT"
    cluster.create_topic(topic, queues=6)
    other = make_member(cluster.namesrv_addr, group, topic, "other").start()
    try:
        other.apply_allocation({})  # holds its share (no Spark behind it: it never reads)
        feeder = Feeder(cluster.namesrv_addr, topic, 1200, rate=100_000, chunk=20).start()
        feeder.join()
        df = legacy_reader(spark, legacy_format, cluster.namesrv_addr, topic,
                           consumerGroup=group, membership="group", memberName="legacy",
                           startingOffsets="earliest")
        query = df.select("topic", "brokerName", "queueId", "queueOffset", "keys") \
            .writeStream.format("parquet").option("path", str(tmp_path / "legacy-out")) \
            .option("checkpointLocation", str(tmp_path / "legacy-cp")) \
            .trigger(availableNow=True).start()
        seen = set()

        def finished() -> bool:
            seen.update(cluster.consumer_clients(group))
            return not query.isActive

        wait_until(finished, 120, "the AvailableNow query to finish", interval=0.02)
        assert query.exception() is None, query.exception()
        (mine,) = seen - {other.client_id}
        assert "@spark-legacy-" in mine
        share = allocate_all("averagely", queues_of(cluster, topic), [other.client_id, mine])
        expected = sorted(k for k, mq in feeder.queue_of.items() if mq in share[mine])
        rows = sink_rows(spark, tmp_path, "legacy")
        assert sorted(int(r["keys"]) for r in rows) == expected and len(expected) == 600
        assert batch_sizes(query) == [600]
    finally:
        other.leave()


# ------------------------------------------------------------------ batch reads, the sink

def test_a_filtered_batch_read_is_filtered_by_spark(spark, cluster, topic):
    """Without filter pushdown (4.0, or the flag off, the default) Spark filters what the source
    reads."""
    produce(cluster.namesrv_addr, topic, range(400))
    df = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", topic).load()
    picked = df.where("queueId = 1 AND brokerName = 'broker-a'").select("keys").collect()
    assert len(picked) == 50
    assert all(int(r["keys"]) % 8 == int(picked[0]["keys"]) % 8 for r in picked)


def test_exactly_once_stream_sink_across_a_restart(spark, embedded_cluster_factory, unique_name,
                                                   tmp_path):
    from test_sink_exactly_once import pull_bodies

    from rocketmq_spark.sink import exactly_once

    cluster = embedded_cluster_factory(brokers=2, transaction_check_interval=30,
                                       transaction_timeout=6)
    source, sink = unique_name("VerIn"), unique_name("VerOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    produce(cluster.namesrv_addr, source, range(600))
    checkpoint = str(tmp_path / "cp")

    def run():
        query = reader(spark, cluster.namesrv_addr, source, startingOffsets="earliest") \
            .selectExpr("CAST(body AS STRING) AS body") \
            .writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
            .option("topic", sink).option("deliveryGuarantee", "exactlyOnce") \
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        assert query.awaitTermination(180)
        assert query.exception() is None, query.exception()

    run()
    produce(cluster.namesrv_addr, source, range(600, 800))
    run()
    seen = pull_bodies(cluster, sink)
    assert len(seen) == 800 and set(seen.values()) == {1}
    log = exactly_once.CommitLog(exactly_once.record_root(checkpoint))
    assert log.pending() == [] and len(log.committed_ids()) >= 2
