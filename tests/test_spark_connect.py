"""The connector from a Spark Connect client: plans go to a server (tests/connect_server.py,
``local[2]`` in a process of its own) whose Python workers run the connector, while this test
process is only the client.

The server's Python imports ``rocketmq_spark`` but not the ``pyspark_rocketmq`` discovery
module, so ``format("rocketmq")`` resolves only in sessions where the client called
``rocketmq_spark.register(spark)``. The lag listener is attached from the client and runs here.
"""
from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from pyspark.errors import PySparkException
from pyspark.sql.connect.functions import udf
from pyspark.sql.types import BooleanType

import rocketmq_spark
from connect_server import ConnectServer, python_without_discovery
from rocketmq_spark import RocketMQLagListener
from rocketmq_spark.client.broker import BrokerClient
from rocketmq_spark.client.protocol.message import decode_messages
from rocketmq_spark.client.pull import PullRequest, PullStatus
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.sink import exactly_once
from source_helpers import ids_of, produce, reader, run_available_now
from waiting import wait_until


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("connect")
    server = ConnectServer(python_without_discovery(workdir / "server-venv"), workdir)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def connect(connect_server):
    """A client session on the server, with the source registered from the client."""
    session = connect_server.session()
    rocketmq_spark.register(session)
    yield session
    session.stop()


def pull_bodies(cluster, topic: str) -> Counter:
    """Every message of ``topic`` as its brokers serve it (our pull client, not the source
    under test); each must be a committed transactional message."""
    seen: Counter = Counter()
    with RemotingClient() as remoting:
        brokers = BrokerClient(remoting)
        for b in cluster.brokers:
            for q in range(4):
                offset = 0
                while True:
                    r = brokers.pull(b.addr, PullRequest("connect-check", topic, q, offset,
                                                         b.name))
                    if r.status is not PullStatus.FOUND:
                        break
                    for m in decode_messages(r.body):
                        assert m.properties.get("TRAN_MSG") == "true", "not an exactlyOnce send"
                        seen[m.body.decode()] += 1
                    offset = r.next_begin_offset
    return seen


# ------------------------------------------------------------------ registration


def test_the_server_resolves_rocketmq_only_in_sessions_that_registered_it(connect_server,
                                                                          connect, cluster,
                                                                          topic):
    session = connect_server.session()  # a session of its own: ``connect`` registered already
    try:
        assert importable_on_the_server(session, ["rocketmq_spark", "pyspark_rocketmq"]) == {
            "rocketmq_spark": True, "pyspark_rocketmq": False}
        options = {"nameServer": cluster.namesrv_addr, "subscribe": topic}
        with pytest.raises(PySparkException, match="DATA_SOURCE_NOT_FOUND"):
            session.read.format("rocketmq").options(**options).load().schema
        rocketmq_spark.register(session)
        produce(cluster.namesrv_addr, topic, range(20))
        df = session.read.format("rocketmq").options(**options).load()
        assert ids_of(df.select("keys").collect()) == list(range(20))
    finally:
        session.stop()


def importable_on_the_server(session, modules):
    """Which modules the server's Python workers find (a UDF runs there, not here). The
    Connect ``udf``: this process is no Connect-mode client, so PySpark's ``udf`` would be the
    classic one."""
    def found(name):
        import importlib.util

        return importlib.util.find_spec(name) is not None

    names = session.createDataFrame([(m,) for m in modules], "name string")
    rows = names.select("name", udf(found, BooleanType())("name").alias("found")).collect()
    return {r["name"]: r["found"] for r in rows}


def test_register_refuses_what_is_not_a_spark_session():
    with pytest.raises(TypeError, match="register.*SparkSession.*got SparkContext"):
        rocketmq_spark.register(type("SparkContext", (), {})())


# ------------------------------------------------------------------ reading


def test_batch_read(connect, cluster, topic):
    produce(cluster.namesrv_addr, topic, range(50))
    df = (connect.read.format("rocketmq").option("nameServer", cluster.namesrv_addr)
          .option("subscribe", topic).load())
    assert ids_of(df.select("keys").collect()) == list(range(50))
    assert df.where("CAST(body AS STRING) = 'm7'").count() == 1


def test_available_now_restarts_from_its_checkpoint(connect, cluster, topic, tmp_path):
    checkpoint, out = str(tmp_path / "cp"), str(tmp_path / "out")
    produce(cluster.namesrv_addr, topic, range(30))
    df = reader(connect, cluster.namesrv_addr, topic, startingOffsets="earliest",
                maxMessagesPerTrigger=20)
    run_available_now(connect, df, checkpoint, out)
    assert ids_of(connect.read.parquet(out).select("keys").collect()) == list(range(30))
    produce(cluster.namesrv_addr, topic, range(30, 45))
    run_available_now(connect, df, checkpoint, out)  # on from the checkpoint's offsets
    assert ids_of(connect.read.parquet(out).select("keys").collect()) == list(range(45))


# ------------------------------------------------------------------ lag listener


def test_the_lag_listener_runs_in_the_client_and_reports_lag(connect, cluster, unique_name,
                                                            tmp_path):
    topic = unique_name("ConnectLag")
    cluster.create_topic(topic, queues=2, brokers=["broker-a"])
    for q in (0, 1):
        cluster.append(topic, "broker-a", q, [b"%d" % i for i in range(30)])
    threads = set()
    lag = RocketMQLagListener({"nameServer": cluster.namesrv_addr},
                              on_report=lambda r: threads.add(threading.get_ident()))
    connect.streams.addListener(lag)
    try:
        df = reader(connect, cluster.namesrv_addr, topic, startingOffsets="earliest",
                    maxMessagesPerTrigger=20)
        query = run_available_now(connect, df, str(tmp_path / "cp"))
        batches = len(query.recentProgress)
        wait_until(lambda: len(lag.reports(query.id)) == batches, 60, "a report per batch")
    finally:
        connect.streams.removeListener(lag)
        lag.close()
    reports = lag.reports(query.id)
    # batch 0 pins the start, then 20 rows a batch: 10 per queue.
    assert [r.total_offsets_behind_latest for r in reports] == [60, 40, 20, 0]
    assert threads and threading.get_ident() not in threads  # the client's listener bus thread
    lagging = reports[1]
    for key, queue in lagging.queues.items():
        assert queue.offsets_behind == 20
        assert queue.oldest_unread_ms == cluster.store_time(
            topic, "broker-a", int(key.rsplit("/", 1)[1]), 10)  # looked up from the client

    # Spark 4.0 and 4.1 Connect clients hand the listener a source's offsets as str() of a
    # dict (Python's repr, not JSON); 4.2 and later as JSON. The same progress either way:
    progress = query.recentProgress[1]
    for source in progress.sources:
        for field in ("startOffset", "endOffset", "latestOffset"):
            source[field] = str(json.loads(source[field]))
    assert "'" in progress.sources[0].latestOffset
    [as_repr] = RocketMQLagListener({"nameServer": cluster.namesrv_addr},
                                    time_lag=False).record(progress)
    assert {k: q.offsets_behind for k, q in as_repr.queues.items()} == {
        k: q.offsets_behind for k, q in lagging.queues.items()}


# ------------------------------------------------------------------ writing


def test_df_write_exactly_once(connect, cluster, unique_name):
    topic = unique_name("ConnectWrite")
    cluster.create_topic(topic, queues=4)
    rows = connect.range(40, numPartitions=2).selectExpr("concat('w', id) AS body")
    (rows.write.format("rocketmq").mode("append").option("nameServer", cluster.namesrv_addr)
     .option("topic", topic).option("deliveryGuarantee", "exactlyOnce").save())
    assert pull_bodies(cluster, topic) == Counter(f"w{i}" for i in range(40))


def test_write_stream_exactly_once_across_a_restart(connect, cluster, unique_name, tmp_path):
    source, sink = unique_name("ConnectEoIn"), unique_name("ConnectEoOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    checkpoint = str(tmp_path / "cp")

    def run():
        query = (reader(connect, cluster.namesrv_addr, source, startingOffsets="earliest",
                        maxMessagesPerTrigger=40)
                 .selectExpr("CAST(body AS STRING) AS body")
                 .writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                 .option("topic", sink).option("deliveryGuarantee", "exactlyOnce")
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180), "the query did not finish in time"
        assert query.exception() is None, query.exception()

    produce(cluster.namesrv_addr, source, range(60))
    run()
    produce(cluster.namesrv_addr, source, range(60, 80))
    run()  # a restart on the same checkpoint
    assert pull_bodies(cluster, sink) == Counter(f"m{i}" for i in range(80))
    log = exactly_once.CommitLog(exactly_once.record_root(checkpoint))
    assert log.pending() == [] and len(log.committed_ids()) >= 2
