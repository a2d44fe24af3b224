"""A busy broker slows the sink down, it does not fail the job: ``df.write`` and
``writeStream`` against embedded brokers whose send queue is small, so they answer as a
genuine 4.9.8 broker under load does (SYSTEM_BUSY ``[OVERLOAD]`` for a full queue,
``[TIMEOUT_CLEAN_QUEUE]`` for a request that waited too long: 4.9.8's
NettyRemotingAbstract.processRequestCommand and BrokerFastFailure.cleanExpiredRequest, as
rocketmq_spark/embedded/flow_control.py reproduces them).

One Spark session (the suite's), a cluster per case with the limits that make busy answers
certain for it; 200,000 rows only for the two writes the issue is about.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict

import pytest

from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.embedded import EmbeddedCluster

from broker_store import stored_messages
from waiting import wait_until

ROWS = 200_000
TIMEOUT_CLEAN_QUEUE = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                       "period in queue: 201ms, size of queue: 3071")


def busy_sends(cluster) -> int:
    stats = cluster.flow_control_stats()
    return stats["send_timeout"] + stats["send_overload"]


def visible(cluster, topic: str, queues: int = 4) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers
               for q in range(queues))


def stored(cluster, topic: str, queues: int = 4):
    """(body, message id) of every message of ``topic``."""
    return [(m.body.decode(), m.uniq_key) for _, m in stored_messages(cluster, topic, queues)]


def ids_frame(spark, rows: int = ROWS, partitions: int = 4):
    return spark.range(0, rows, 1, partitions).selectExpr("CAST(id AS STRING) AS body")


def write(df, cluster, topic, **options):
    writer = (df.write.format("rocketmq").mode("append").option("nameServer", cluster.namesrv_addr)
              .option("topic", topic))
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.save()


# ---------------------------------------------------------------------- the writes


def test_an_exactly_once_write_of_200000_rows_rides_out_a_busy_broker(spark, unique_name):
    """The report: every SEND_MESSAGE_V2 of a half message is a request, four tasks of runs
    of 512 each; a send queue of 300 cannot hold even one run, so the broker answers
    [OVERLOAD] (and [TIMEOUT_CLEAN_QUEUE] past 10 ms). The write completes, each row once."""
    with EmbeddedCluster(brokers=1, send_queue_capacity=300, wait_ms_in_send_queue=10) as c:
        topic = unique_name("FcEo")
        c.create_topic(topic, 4)
        write(ids_frame(spark), c, topic, deliveryGuarantee="exactlyOnce")
        assert busy_sends(c) > 0, "the broker never answered busy: the test proves nothing"
        wait_until(lambda: visible(c, topic) >= ROWS, 120, "every committed row")
        rows = stored(c, topic)
        assert len(rows) == ROWS
        assert Counter(body for body, _ in rows) == Counter(str(i) for i in range(ROWS))
        assert not c.pending_transactions("broker-a"), "a half message left unsettled"


def test_an_at_least_once_write_of_200000_rows_rides_out_a_busy_broker(spark, unique_name):
    """Small requests (4 KiB, about 60 rows) from four tasks against a send queue of one:
    [OVERLOAD] whenever two wait. Every row arrives, a duplicate only with its first copy's
    message id."""
    with EmbeddedCluster(brokers=1, send_queue_capacity=1, wait_ms_in_send_queue=5) as c:
        topic = unique_name("FcAlo")
        c.create_topic(topic, 4)
        write(ids_frame(spark), c, topic, maxBatchBytes=4096)
        assert busy_sends(c) > 0, "the broker never answered busy: the test proves nothing"
        ids = defaultdict(set)
        for body, uniq in stored(c, topic):
            ids[body].add(uniq)
        assert set(ids) == {str(i) for i in range(ROWS)}
        assert all(len(v) == 1 for v in ids.values()), "a duplicate with another message id"


def test_a_write_through_a_busy_proxy_rides_out_too_many_requests(spark, unique_name):
    """Through the 5.x proxy (endpoints), which answers TOO_MANY_REQUESTS when its broker
    answers SYSTEM_BUSY (rocketmq_spark/embedded/grpc_send.py's BROKER_CODES, after Apache's
    proxy, proxy/.../common/utils/ExceptionUtils and ProxyException). Now and then a call is
    refused among stored ones (the embedded broker's fault rules: its queue model does not make
    the proxy's single requests wait): exactly the refused calls are sent again, every row is
    stored once, a sharding key's rows in order."""
    from pyspark.sql import functions as F

    rows = 6_000
    with EmbeddedCluster(brokers=1, grpc_proxy=True, grpc_proxy_tls=False) as c:
        topic = unique_name("FcGrpc")
        c.create_topic(topic, 4)
        for _ in range(20):
            c.delay_next(97, 0.0, request_codes=[RequestCode.SEND_MESSAGE_V2])
            c.fail_next(3, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                        request_codes=[RequestCode.SEND_MESSAGE_V2])
        df = spark.range(rows, numPartitions=2).select(
            F.col("id").cast("string").alias("body"),
            F.when(F.col("id") % 3 == 0,  # a key's rows in one task: ordered within it
                   F.concat(F.lit("p"), F.spark_partition_id().cast("string"), F.lit("-"),
                            (F.col("id") % 7).cast("string"))).alias("shardingKey"))
        (df.write.format("rocketmq").mode("append").option("endpoints", c.proxy_endpoint)
           .option("tls", "false").option("topic", topic).save())
        assert c._call(lambda: len(c.faults.rules)) == 0, "not every busy answer was given"
        copies, keyed = Counter(), defaultdict(list)
        for qid, m in stored_messages(c, topic):
            copies[m.body.decode()] += 1
            key = m.properties.get("__SHARDINGKEY")
            if key:
                keyed[key].append((qid, int(m.body)))
    assert copies == Counter(str(i) for i in range(rows)), "each row once: no call sent twice"
    assert len(keyed) == 14
    for key, placed in keyed.items():
        assert len({q for q, _ in placed}) == 1, key
        assert [n for _, n in placed] == sorted(n for _, n in placed), key


# ---------------------------------------------------------------------- the budget


def test_a_broker_busy_past_the_budget_fails_the_write_and_leaves_nothing(spark,
                                                                           unique_name):
    """The broker stores the first 3,000 half messages, then answers nothing but busy. A
    task of 100 rows finishes; the other, of 10,000, fails after brokerBusyTimeoutMs, and
    so does the job, with an error naming the broker, how long, how many busy answers, the
    last remark and the option. Every half message stored is rolled back (the failed task's
    by the task, the finished one's by the job's abort): nothing of the write is visible."""
    with EmbeddedCluster(brokers=1) as c:
        topic = unique_name("FcBudget")
        c.create_topic(topic, 4)
        c.delay_next(3000, 0.0, request_codes=[RequestCode.SEND_MESSAGE_V2])
        c.fail_next(10 ** 7, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                    request_codes=[RequestCode.SEND_MESSAGE_V2])
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            # two tasks: ids 9,900-9,999 (100 rows) and 10,000-19,999
            df = ids_frame(spark, 20_000, 2).where("CAST(body AS INT) >= 9900")
            write(df, c, topic, deliveryGuarantee="exactlyOnce", brokerBusyTimeoutMs=3000)
        assert time.monotonic() - started < 120
        text = str(info.value)
        address = c.brokers[0].addr
        assert f"broker broker-a ({address}) answered busy for " in text
        assert "busy answer(s) to this writer" in text
        assert "the last: [TIMEOUT_CLEAN_QUEUE]broker busy" in text
        assert "Raise brokerBusyTimeoutMs (now 3000 ms)" in text
        c.clear_faults()
        wait_until(lambda: not c.pending_transactions("broker-a"), 30,
                   "every stored half message rolled back")
        assert visible(c, topic) == 0


def test_a_jobs_commits_refused_by_a_busy_transaction_queue_are_sent_again(spark,
                                                                          unique_name):
    """A df.write has no check-back responder, so its END_TRANSACTION COMMITs must arrive:
    4.9.8's fast failure answers an END_TRANSACTION that waited longer than
    waitTimeMillsInTransactionQueue SYSTEM_BUSY and does not apply it
    (BrokerFastFailure.cleanExpiredRequest; RequestTask.returnResponse answers oneway requests
    too). With a 1 ms wait most COMMITs of a 20,000-row job expire; the job's commit sends
    them again until the broker confirms, so every row is visible, once."""
    rows = 20_000
    with EmbeddedCluster(brokers=1, wait_ms_in_transaction_queue=1) as c:
        topic = unique_name("FcEnds")
        c.create_topic(topic, 4)
        write(ids_frame(spark, rows, 2), c, topic, deliveryGuarantee="exactlyOnce")
        assert c.flow_control_stats()["transaction_timeout"] > 0, \
            "no END_TRANSACTION expired: the test proves nothing"
        assert visible(c, topic) == rows  # the job's commit returned after confirmation
        assert Counter(body for body, _ in stored(c, topic)) == \
            Counter(str(i) for i in range(rows))
        assert not c.pending_transactions("broker-a"), "a half message left unsettled"


# ---------------------------------------------------------------------- a stream's rate


def input_files(folder, files: int, rows: int):
    """``files`` text files of ``rows`` lines each: a micro-batch each (maxFilesPerTrigger 1),
    one task each (a file of ~150 KB is one split)."""
    folder.mkdir()
    for f in range(files):
        (folder / f"part-{f:03d}.txt").write_text(
            "".join(f"{f}-{i}\n" for i in range(rows)))
    return str(folder)


def run_stream(spark, cluster, topic, source: str, checkpoint: str):
    return (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(source)
            .selectExpr("value AS body")
            .writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
            .option("topic", topic).option("maxBatchBytes", 4096)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def per_row_ms(query, skip: int = 1):
    """The median ``addBatch`` time per row of the query's micro-batches (after ``skip``)."""
    times = [p["durationMs"]["addBatch"] / p["numInputRows"]
             for p in query.recentProgress if p["numInputRows"] > 0][skip:]
    return statistics.median(times), len(times)


def test_a_stream_keeps_its_rate_within_twice_the_unthrottled_one(spark, unique_name,
                                                                   tmp_path):
    """Two streams at once, so they share whatever else the machine does, each a task at a
    time (local[2] runs both side by side: neither waits for the other's task slot): one to
    a broker without flow control, one to a broker whose send queue holds two requests (of
    the four a task keeps in flight at first, the others are refused). Eight micro-batches of
    20,000 rows each. The throttled one's median time per row (Spark's addBatch per
    micro-batch, measured side by side) stays within twice the other's, and every row is
    stored."""
    source = input_files(tmp_path / "in", 8, 20_000)
    with EmbeddedCluster(brokers=1, broker_fast_failure=False,
                         send_queue_capacity=10 ** 6) as free, \
            EmbeddedCluster(brokers=1, send_queue_capacity=2, wait_ms_in_send_queue=5) as tight:
        topics = unique_name("FcFree"), unique_name("FcTight")
        free.create_topic(topics[0], 4)
        tight.create_topic(topics[1], 4)
        queries = [run_stream(spark, cluster, topic, source, str(tmp_path / topic))
                   for cluster, topic in ((free, topics[0]), (tight, topics[1]))]
        for q in queries:
            assert q.awaitTermination(300), "the stream did not finish its eight files"
            assert q.exception() is None, q.exception()
        (free_ms, n_free), (tight_ms, n_tight) = per_row_ms(queries[0]), per_row_ms(queries[1])
        refused = busy_sends(tight)
        print(f"per row: unthrottled {free_ms * 1000:.1f} us over {n_free} batches, throttled "
              f"{tight_ms * 1000:.1f} us over {n_tight}; {refused} busy answers for "
              f"{visible(tight, topics[1])} rows")
        assert refused > 0, "the broker never answered busy: the test proves nothing"
        assert tight_ms <= 2 * free_ms
        assert visible(tight, topics[1]) >= 160_000 and visible(free, topics[0]) >= 160_000
