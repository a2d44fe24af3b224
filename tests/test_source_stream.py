"""spark.readStream.format("rocketmq") in a real local[2] Spark session against the embedded
server: exactly-once restarts, every starting mode, limits, AvailableNow, queue growth, tag
filters, data loss both ways, batch 0's replay and commits back to the consumer group."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chispa import assert_df_equality

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.source.offsets import queue_offsets
from source_helpers import (
    assert_read_in_queue_order, committed, ids_of, max_offsets, produce, reader,
    run_available_now, start_memory,
)
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"


def rows_of(spark, query):
    return spark.table(query.table_name).collect()


def test_checkpointed_query_restarts_exactly_once_into_parquet(spark, cluster, topic, tmp_path):
    checkpoint, sink = str(tmp_path / "cp"), str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(0, 3000))
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest")
    run_available_now(spark, df, checkpoint, sink)
    assert spark.read.parquet(sink).count() == 3000
    produce(cluster.namesrv_addr, topic, range(3000, 5000))
    run_available_now(spark, df, checkpoint, sink)
    out = spark.read.parquet(sink)
    assert ids_of(out.select("keys").collect()) == list(range(5000))
    assert_read_in_queue_order(out, 8)


def test_running_query_stopped_midway_and_restarted(spark, cluster, topic, tmp_path):
    checkpoint, sink = str(tmp_path / "cp"), str(tmp_path / "out")
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                maxMessagesPerTrigger=300)
    query = df.writeStream.format("parquet").option("path", sink) \
        .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start()
    try:
        produce(cluster.namesrv_addr, topic, range(0, 2000))
        wait_until(lambda: query.lastProgress and query.lastProgress["numInputRows"] > 0,
                 timeout=60, what="a first batch with rows")
    finally:
        query.stop()
    produce(cluster.namesrv_addr, topic, range(2000, 2500))
    run_available_now(spark, df, checkpoint, sink)
    assert ids_of(spark.read.parquet(sink).select("keys").collect()) == list(range(2500))


def test_starting_offsets_earliest_json_and_group(spark, cluster, topic, tmp_path):
    sent = produce(cluster.namesrv_addr, topic, range(400))
    earliest = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                               startingOffsets="earliest"), str(tmp_path / "a"))
    assert ids_of(rows_of(spark, earliest)) == list(range(400))

    # JSON: per queue, in the nested form and with -2 (earliest) for one queue.
    queues = sorted(sent)
    spec = {topic: {f"{mq.broker_name}/{mq.queue_id}": 10 for mq in queues}}
    spec[topic][f"{queues[0].broker_name}/{queues[0].queue_id}"] = -2
    from_json = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                                startingOffsets=json.dumps(spec)),
                                  str(tmp_path / "b"))
    expected = sorted(sent[queues[0]] + [n for mq in queues[1:] for n in sent[mq][10:]])
    assert ids_of(rows_of(spark, from_json)) == expected

    # group: the group's committed offsets (20 per queue), as another consumer left them.
    with Admin(cluster.namesrv_addr) as admin:
        assert admin.commit_offsets("seeded-group", {mq: 20 for mq in queues}) == {}
    from_group = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                                 startingOffsets="group",
                                                 consumerGroup="seeded-group"),
                                   str(tmp_path / "c"))
    assert ids_of(rows_of(spark, from_group)) == sorted(n for mq in queues
                                                        for n in sent[mq][20:])


def test_starting_offsets_latest_reads_only_new_messages(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(100))
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="latest")
    query = start_memory(df, "latest_mode", str(tmp_path / "cp"))
    try:
        wait_until(lambda: query.lastProgress is not None, 60, "batch 0")
        produce(cluster.namesrv_addr, topic, range(100, 150))
        wait_until(lambda: spark.table("latest_mode").count() >= 50, 60, "the new messages")
        query.processAllAvailable()
        assert ids_of(spark.table("latest_mode").collect()) == list(range(100, 150))
    finally:
        query.stop()


def test_a_topic_created_after_the_stream_started_is_read_from_its_first_message(
        spark, cluster, unique_name, tmp_path):
    late = unique_name("Late")
    df = reader(spark, cluster.namesrv_addr, late)  # startingOffsets=latest, no route yet
    query = start_memory(df, "late_topic", str(tmp_path / "cp"))
    try:
        wait_until(lambda: query.lastProgress is not None, 60, "batch 0")
        assert json.loads(query.lastProgress["sources"][0]["endOffset"]) == {
            "version": 2, "queues": {}}, "the start is pinned even with no queue"
        cluster.create_topic(late, queues=2)
        produce(cluster.namesrv_addr, late, range(40))  # before the stream sees the topic
        wait_until(lambda: spark.table("late_topic").count() >= 40, timeout=120,
                 what="the late topic's rows")
        query.processAllAvailable()
        assert ids_of(spark.table("late_topic").collect()) == list(range(40))
    finally:
        query.stop()


def test_starting_timestamp_and_offsets_by_timestamp(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(200))
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    later = produce(cluster.namesrv_addr, topic, range(200, 300))
    one = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                          startingTimestamp=boundary), str(tmp_path / "a"))
    assert ids_of(rows_of(spark, one)) == list(range(200, 300))
    spec = {topic: {f"{mq.broker_name}/{mq.queue_id}": boundary for mq in later}}
    several = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                              startingOffsetsByTimestamp=json.dumps(spec)),
                                str(tmp_path / "b"))
    assert ids_of(rows_of(spark, several)) == list(range(200, 300))


def test_max_messages_per_trigger_bounds_batches_and_available_now_drains(
        spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(1000))
    query = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                            startingOffsets="earliest",
                                            maxMessagesPerTrigger=150), str(tmp_path / "cp"))
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000 and max(sizes) <= 150 and len(sizes) >= 7
    assert ids_of(rows_of(spark, query)) == list(range(1000))
    assert not query.isActive  # AvailableNow stopped by itself once drained


def test_topic_grown_from_4_to_8_queues_mid_stream(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(200))
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest")
    query = start_memory(df, "grown", str(tmp_path / "cp"))
    try:
        wait_until(lambda: spark.table("grown").count() == 200, 60, "the first 200")
        cluster.add_queues(topic, 8)
        with Admin(cluster.namesrv_addr) as admin:
            wait_until(lambda: len(admin.queues(topic, refresh=True)) == 16, 60, "8 queues each")
            new = [mq for mq in admin.queues(topic) if mq.queue_id >= 4]
        produce(cluster.namesrv_addr, topic, range(200, 400), queues=new)
        wait_until(lambda: spark.table("grown").count() == 400, 60, "the new queues' messages")
        rows = spark.table("grown").collect()
        assert ids_of(rows) == list(range(400))
        fresh = [r for r in rows if r["queueId"] >= 4]
        assert len(fresh) == 200 and min(r["queueOffset"] for r in fresh) == 0
    finally:
        query.stop()


def test_tag_filter_returns_only_matching_rows(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(0, 300), tags="TagA")
    produce(cluster.namesrv_addr, topic, range(300, 600), tags="TagB")
    produce(cluster.namesrv_addr, topic, range(600, 700), tags="TagC")
    produce(cluster.namesrv_addr, topic, range(700, 800), tags="BB")  # hash of "Aa"
    query = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                            startingOffsets="earliest",
                                            filter="TagA || TagC || Aa"), str(tmp_path / "cp"))
    rows = rows_of(spark, query)
    assert ids_of(rows) == list(range(0, 300)) + list(range(600, 700))
    assert {r["tags"] for r in rows} == {"TagA", "TagC"}


def test_fail_on_data_loss_both_ways(spark, cluster, topic, tmp_path):
    sent = produce(cluster.namesrv_addr, topic, range(400))
    strict = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest")
    lenient = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                     failOnDataLoss="false")
    for name, df in (("strict", strict), ("lenient", lenient)):
        run_available_now(spark, df, str(tmp_path / name), str(tmp_path / f"{name}-out"))
    more = produce(cluster.namesrv_addr, topic, range(400, 800))
    victim = sorted(more)[0]
    checkpoint_offset = len(sent[victim])  # both checkpoints stopped here
    cluster.truncate(topic, victim.broker_name, victim.queue_id, checkpoint_offset + 20)

    with pytest.raises(Exception) as err:
        run_available_now(spark, strict, str(tmp_path / "strict"), str(tmp_path / "strict-out"))
    text = str(err.value)
    assert victim.key in text and f"[{checkpoint_offset}, {checkpoint_offset + 20})" in text
    assert "failOnDataLoss" in text

    run_available_now(spark, lenient, str(tmp_path / "lenient"), str(tmp_path / "lenient-out"))
    rows = spark.read.parquet(str(tmp_path / "lenient-out")).select("keys").collect()
    lost = set(more[victim][:20])
    assert ids_of(rows) == sorted(set(range(800)) - lost)


def test_crash_during_batch_0_with_latest_loses_nothing(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(100))
    checkpoint = tmp_path / "cp"
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="latest")
    query = df.writeStream.format("parquet").option("path", str(tmp_path / "out")) \
        .option("checkpointLocation", str(checkpoint)).start()
    wait_until(lambda: (checkpoint / "offsets" / "0").exists(), 60, "batch 0's offsets")
    query.stop()
    # The crash: batch 0 planned and logged, never committed.
    shutil.rmtree(checkpoint / "commits", ignore_errors=True)
    produce(cluster.namesrv_addr, topic, range(100, 160))  # after the pinned start
    time.sleep(0.2)
    run_available_now(spark, df, str(checkpoint), str(tmp_path / "out"))
    rows = spark.read.parquet(str(tmp_path / "out")).select("keys").collect()
    assert ids_of(rows) == list(range(100, 160))


def test_batch_0_replay_keeps_a_start_resolved_from_group_offsets(spark, cluster, topic,
                                                                  tmp_path):
    """The query dies while writing its first rows; the group's offsets then move. The replay
    must start where the first run resolved the start, not where the group is now."""
    sent = produce(cluster.namesrv_addr, topic, range(400))
    queues = sorted(sent)
    with Admin(cluster.namesrv_addr) as admin:
        assert admin.commit_offsets("replay-group", {mq: 20 for mq in queues}) == {}
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="group",
                consumerGroup="replay-group", commitOffsets="false")
    checkpoint = str(tmp_path / "cp")

    def fail_on_first_rows(batch, batch_id):
        if batch.count():
            raise RuntimeError("simulated crash while writing")

    failing = df.writeStream.foreachBatch(fail_on_first_rows) \
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    with pytest.raises(Exception, match="simulated crash"):
        failing.awaitTermination(120)
    with Admin(cluster.namesrv_addr) as admin:  # someone moves the group meanwhile
        assert admin.commit_offsets("replay-group", {mq: 50 for mq in queues}) == {}
    written = []
    recovered = df.writeStream.foreachBatch(lambda batch, _: written.extend(
        batch.select("keys").collect())).option("checkpointLocation", checkpoint) \
        .trigger(availableNow=True).start()
    assert recovered.awaitTermination(120) and recovered.exception() is None
    assert ids_of(written) == sorted(n for mq in queues for n in sent[mq][20:])


def test_offsets_are_sorted_and_committed_back_to_the_group(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(500))
    query = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                            startingOffsets="earliest",
                                            consumerGroup="spark-group-a",
                                            maxMessagesPerTrigger=200), str(tmp_path / "cp"))
    end = queue_offsets(json.loads(query.lastProgress["sources"][0]["endOffset"]))
    assert list(end) == sorted(end), "offset keys must be in canonical order"
    assert end == max_offsets(cluster.namesrv_addr, topic)
    # After a drained AvailableNow run the group's offsets equal the end, although Spark
    # calls commit() one batch late and never for the last batch.
    assert committed(cluster.namesrv_addr, topic, "spark-group-a") == end


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_cpp_push_consumer_starts_where_spark_stopped(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(300))
    run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                    startingOffsets="earliest", consumerGroup="handover"),
                      str(tmp_path / "cp"))
    produce(cluster.namesrv_addr, topic, range(300, 340))
    out = subprocess.run(
        [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr, "--topic", topic,
         "--group", "handover", "--expect", "40", "--timeout", "20", "--linger", "2"],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    consumed = json.loads(out.stdout.strip().splitlines()[-1])["messages"]
    assert sorted(int(m["keys"]) for m in consumed) == list(range(300, 340))


def test_same_range_replays_to_identical_rows(spark, cluster, topic, tmp_path):
    produce(cluster.namesrv_addr, topic, range(300))
    first = run_available_now(spark, reader(spark, cluster.namesrv_addr, topic,
                                            startingOffsets="earliest"), str(tmp_path / "a"))
    end = first.lastProgress["sources"][0]["endOffset"]
    again = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", topic).option("endingOffsets", end).load()
    assert_df_equality(spark.table(first.table_name), again, ignore_row_order=True)


def test_unreachable_broker_is_planned_around_not_lost(spark, embedded_cluster, tmp_path):
    cluster = embedded_cluster
    cluster.create_topic("Outage", queues=2)
    with Admin(cluster.namesrv_addr) as admin:
        queues = admin.queues("Outage", refresh=True)
    on_a = [mq for mq in queues if mq.broker_name == "broker-a"]
    on_b = [mq for mq in queues if mq.broker_name == "broker-b"]
    produce(cluster.namesrv_addr, "Outage", range(100), queues=on_b)
    df = reader(spark, cluster.namesrv_addr, "Outage", startingOffsets="earliest")
    query = start_memory(df, "outage", str(tmp_path / "cp"))
    try:
        wait_until(lambda: spark.table("outage").count() == 100, 60, "broker-b's first 100")
        cluster.broker("broker-b").stop()
        produce(cluster.namesrv_addr, "Outage", range(100, 200), queues=on_a)
        wait_until(lambda: spark.table("outage").count() == 200,
                 timeout=60, what="broker-a's messages while broker-b is down")
        assert query.isActive and query.exception() is None
        cluster.broker("broker-b").start()
        produce(cluster.namesrv_addr, "Outage", range(200, 300), queues=on_b)
        wait_until(lambda: spark.table("outage").count() == 300, 60, "broker-b after restart")
        assert ids_of(spark.table("outage").collect()) == list(range(300))
    finally:
        query.stop()


def test_running_query_shows_in_the_groups_consumer_list(spark, cluster, topic, tmp_path):
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                consumerGroup="visible-group")
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")) \
        .start()
    try:
        produce(cluster.namesrv_addr, topic, range(50))
        with Admin(cluster.namesrv_addr) as admin:
            members = wait_until(lambda: admin.brokers.get_consumer_list_by_group(
                cluster.broker("broker-a").addr, "visible-group"), 60, "the query's heartbeat")
            assert len(members) == 1
            wait_until(lambda: committed(cluster.namesrv_addr, topic, "visible-group")
                     == max_offsets(cluster.namesrv_addr, topic), 60, "the commit-back")
    finally:
        query.stop()


def test_a_group_it_shares_with_other_consumers_is_warned_about(cluster, topic, caplog):
    """membership=none: the query reads every queue; a group with other members gets a warning
    (their rebalance counts the query and leaves it a share they never read)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rocketmq_spark.client import ClientConfig, Subscription
    from rocketmq_spark.source.options import parse_source_options
    from rocketmq_spark.source.stream_reader import RocketMQStreamReader

    group = f"shared-{topic}"
    with Admin(cluster.namesrv_addr, config=ClientConfig(client_id="java-consumer@10.0.0.9")) \
            as other:
        for b in cluster.brokers:  # another member of the group, still connected
            other.brokers.heart_beat(b.addr, group, [Subscription(topic)])
        reader = RocketMQStreamReader(parse_source_options({
            "nameServer": cluster.namesrv_addr, "subscribe": topic, "consumerGroup": group,
            "startingOffsets": "earliest"}, streaming=True))
        try:
            start = reader.latestOffset({}, ReadAllAvailable())
            with caplog.at_level("WARNING", logger="rocketmq_spark.source.stream_reader"):
                reader.latestOffset(start, ReadAllAvailable())
                reader.runner.heartbeat_at = 0.0  # the next heartbeat: no second warning
                reader.runner.committed = None
                reader.latestOffset(start, ReadAllAvailable())
        finally:
            reader.stop()
    warnings = [r.getMessage() for r in caplog.records if group in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "java-consumer@10.0.0.9" in warnings[0] and "membership=group" in warnings[0]
