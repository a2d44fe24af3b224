"""Lag users can see: RocketMQLagListener in a real Spark session against the embedded server."""
from __future__ import annotations

import time

import pytest

from rocketmq_spark import RocketMQLagListener
from rocketmq_spark.options import OptionError
from rocketmq_spark.source.lag import offsets_behind
from source_helpers import available_now_with_lag_listener, reader


def test_offsets_behind_counts_queues_in_both_offsets_only():
    latest = {"T/a/0": 10, "T/a/1": 7, "T/b/0": 5}
    end = {"T/a/0": 4, "T/a/1": 7, "(no queues yet)": 0}
    assert offsets_behind(latest, end) == {"T/a/0": 6, "T/a/1": 0}
    assert offsets_behind({"(no queues yet)": 0}, {"(no queues yet)": 0}) == {}


def test_the_listener_needs_a_name_server():
    with pytest.raises(OptionError, match="nameServer"):
        RocketMQLagListener({"subscribe": "T"})
    listener = RocketMQLagListener({"nameServer": "h:1", "accessKey": "AK9",
                                    "secretKey": "SK-hidden"})
    assert "SK-hidden" not in repr(listener) and "AK9" not in repr(listener)


def test_lag_in_offsets_and_time_per_micro_batch(spark, embedded_cluster_session, unique_name,
                                                 tmp_path):
    cluster = embedded_cluster_session
    topic = unique_name("Lag")
    cluster.create_topic(topic, queues=2, brokers=["broker-a"])
    for block in range(4):  # four blocks of 25 per queue, stored at different times
        for q in (0, 1):
            cluster.append(topic, "broker-a", q, [b"%d-%d" % (block, i) for i in range(25)])
        time.sleep(0.02)
    options = {"nameServer": cluster.namesrv_addr, "subscribe": topic}
    df = reader(spark, cluster.namesrv_addr, topic, startingOffsets="earliest",
                maxMessagesPerTrigger=50)
    lag, query = available_now_with_lag_listener(spark, options, df, str(tmp_path / "cp"))
    reports = lag.reports(query.id)
    # batch 0 pins the start (0, 0), then 50 rows a batch: 25 per queue.
    assert [r.total_offsets_behind_latest for r in reports] == [200, 150, 100, 50, 0]
    assert [r.max_offsets_behind_latest for r in reports] == [100, 75, 50, 25, 0]
    assert reports[1].min_offsets_behind_latest == 75
    assert reports[1].avg_offsets_behind_latest == 75.0
    for report in reports:
        for key, queue in report.queues.items():
            q = int(key.rsplit("/", 1)[1])
            end = 100 - queue.offsets_behind
            if queue.offsets_behind:
                assert queue.oldest_unread_ms == cluster.store_time(topic, "broker-a", q, end)
                assert report.time_lag_ms(key) == report.measured_at_ms - queue.oldest_unread_ms
            else:
                assert queue.oldest_unread_ms is None and report.time_lag_ms(key) == 0
    assert reports[-1].max_time_lag_ms == 0
    assert lag.latest(query.id) == reports[-1]
