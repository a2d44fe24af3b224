"""deliveryGuarantee=exactlyOnce: half messages, the commit record, END_TRANSACTION, check-backs.

Against the embedded server over real sockets (its transactional messages follow
apache/rocketmq 4.9.8's broker), and a real Spark session for the pipeline. The part tests
drive the sink's own task and commit code without Spark where Spark cannot be paused at the
moment that matters (between the tasks' sends and the driver's commit).

The driver-kill tests (the hooks of tests/sink_pipeline.py) are in
test_sink_exactly_once_kills.py.
"""
from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.txn.transaction import END_TRANSACTION, CheckResponder
from rocketmq_spark.options import OptionError
from rocketmq_spark.sink import exactly_once
from rocketmq_spark.sink.ids import TaskIdentity
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.sink.schema import plan_columns
from rocketmq_spark.sink.exactly_once_task import (
    half_message_properties as _half_properties, write_halves as write_task,
)
from rocketmq_spark.sink.writer import batch_writer, stream_writer
from source_helpers import produce
from waiting import wait_until

SCHEMA = StructType([StructField("body", StringType())])
QUERY = "q-test"


def visible(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


def pull_bodies(cluster, topic: str) -> Counter:
    from rocketmq_spark.client.broker import BrokerClient
    from rocketmq_spark.client.protocol.message import decode_messages
    from rocketmq_spark.client.pull import PullRequest, PullStatus

    seen: Counter = Counter()
    with RemotingClient() as remoting:
        brokers = BrokerClient(remoting)
        for b in cluster.brokers:
            for q in range(4):
                offset = 0
                while True:
                    r = brokers.pull(b.addr, PullRequest("eo-check", topic, q, offset, b.name))
                    if r.status is not PullStatus.FOUND:
                        break
                    for m in decode_messages(r.body):
                        seen[m.body.decode()] += 1
                        assert m.properties.get("TRAN_MSG") == "true"
                    offset = r.next_begin_offset
    return seen


def send_halves(cluster, topic: str, rows, batch_id: int = 0, group: str = "eo-group",
                **extra: str):
    """One task attempt's half messages, sent by the sink's task code; its summary."""
    options = parse_sink_options({"nameServer": cluster.namesrv_addr, "topic": topic,
                                  "deliveryGuarantee": "exactlyOnce",
                                  "producerGroup": group, **extra})
    plan = plan_columns(SCHEMA, topic)
    batch = pa.RecordBatch.from_arrays([pa.array([str(r) for r in rows])], ["body"])
    identity = TaskIdentity("stream", QUERY, batch_id, 0)
    return write_task([batch], plan, options, identity, group,
                      half_properties=_half_properties(group, QUERY, batch_id))


def commit_batch(log, remoting, record) -> int:
    """The sink's driver-side commit of ``record``, with the op topic read over ``remoting``."""
    return exactly_once.commit_batch(log, remoting, exactly_once.OpTopic(remoting), record)


def record_of(summary, batch_id: int, group: str = "eo-group") -> exactly_once.BatchRecord:
    from rocketmq_spark.client.txn.transaction import HalfHandle

    return exactly_once.BatchRecord(batch_id, QUERY, group, [summary.token],
                          [HalfHandle.from_tuple(t) for t in summary.handles])


@pytest.fixture
def txn_cluster(embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=2, transaction_check_interval=0.5,
                                       transaction_timeout=0.5, transaction_check_max=30)
    return cluster


# ------------------------------------------------------------------------------ options


def recorded_then_killed(summary, batch_id: int, group: str, tmp_path, ended: int,
                         before_close=None) -> exactly_once.CommitLog:
    """A driver that wrote its batch's record and sent only the first ``ended`` of its
    COMMITs before it died; ``before_close`` runs while the connection that sent them is
    still open (oneway requests still queued at the broker are dropped when it closes)."""
    from rocketmq_spark.client.txn.transaction import Outcome, end_transactions

    record = record_of(summary, batch_id, group)
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    with RemotingClient() as remoting:
        ops = exactly_once.OpTopic(remoting)
        for a in {h.address for h in record.handles}:
            record.op_start[a] = ops.max_offset(a)
        log.record_commit(record)
        end_transactions(remoting, group, record.handles[:ended], Outcome.COMMIT)
        if before_close is not None:
            before_close()
    return log


def start_responder(cluster, group: str, log, ops) -> CheckResponder:
    """A check-back responder for ``group`` answering from ``log``, registered on every
    broker of the cluster (what the sink's responder process does)."""
    responder = CheckResponder.create(RemotingClient().config, group,
                                      lambda req: exactly_once.decide(log, QUERY, ops, req)).start()
    responder.register(b.addr for b in cluster.brokers)
    return responder


def test_option_errors_name_the_option(tmp_path):
    with pytest.raises(OptionError, match="deliveryGuarantee must be one of atLeastOnce, "
                                          "exactlyOnce, got 'twice'"):
        parse_sink_options({"nameServer": "h:9876", "deliveryGuarantee": "twice"})
    with pytest.raises(OptionError, match="exactlyOnce works over RocketMQ's remoting"):
        parse_sink_options({"endpoints": "h:8081", "deliveryGuarantee": "exactlyOnce"})
    with pytest.raises(OptionError, match="checkpointLocation"):
        stream_writer({"nameServer": "h:9876", "topic": "t",
                       "deliveryGuarantee": "exactlyOnce"}, SCHEMA, False)
    with pytest.raises(OptionError, match="scheme ftp:, which the connector cannot store to"):
        stream_writer({"nameServer": "h:9876", "topic": "t", "deliveryGuarantee": "exactlyOnce",
                       "checkpointLocation": "ftp://host/cp"}, SCHEMA, False)
    delayed = StructType(SCHEMA.fields + [StructField("delayLevel", __import__(
        "pyspark.sql.types", fromlist=["IntegerType"]).IntegerType())])
    with pytest.raises(OptionError, match="column delayLevel"):
        batch_writer({"nameServer": "h:9876", "topic": "t",
                      "deliveryGuarantee": "exactlyOnce"}, delayed, False)
    assert parse_sink_options({"nameServer": "h:9876"}).delivery_guarantee == "atLeastOnce"
    assert parse_sink_options({"nameServer": "h:9876", "deliveryguarantee": "EXACTLYONCE"}
                              ).exactly_once


# ------------------------------------------------------------------------------ protocol paths


def test_half_messages_are_invisible_until_the_commit_then_delivered_once(txn_cluster,
                                                                           unique_name,
                                                                           tmp_path):
    cluster = txn_cluster
    topic = unique_name("EoVisible")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(200))
    assert len(summary.handles) == 200 and summary.token
    time.sleep(0.3)
    assert visible(cluster, topic) == 0, "a half message reached its topic before the commit"
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    with RemotingClient() as remoting:
        sent = commit_batch(log, remoting, record_of(summary, 0))
    assert sent == 200
    wait_until(lambda: visible(cluster, topic) >= 200, 10, "the 200 committed rows")
    seen = pull_bodies(cluster, topic)
    assert seen == Counter(str(i) for i in range(200))
    assert log.ended_at(0) is not None and log.pending() == []


def test_a_refused_half_rolls_back_the_rest_of_its_run_at_once(embedded_cluster_factory,
                                                                unique_name, tmp_path):
    """Half messages go to a queue in runs written together; when the broker refuses one of
    a run, the ones it stored are rolled back right away (not left to the check-back) and the
    run is sent again: the brokers hold exactly one pending half per row."""
    cluster = embedded_cluster_factory(brokers=2)  # no check-back during the test
    topic = unique_name("EoRefused")
    cluster.create_topic(topic, 4)
    cluster.fail_next(1, ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR",  # a fault, not busy
                      request_codes=[RequestCode.SEND_MESSAGE_V2])
    summary = send_halves(cluster, topic, range(300), group="eo-refused")
    assert summary.retries == 1 and len(summary.handles) == 300
    assert len({h[2] for h in summary.handles}) == 300
    # the rollbacks are oneway: give the broker a moment
    wait_until(lambda: sum(len(cluster.pending_transactions(b.name))
                           for b in cluster.brokers) == 300, 10,
               "the stored rest of the refused run to be rolled back (300 pending halves)")
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    with RemotingClient() as remoting:
        commit_batch(log, remoting, record_of(summary, 0, "eo-refused"))
    wait_until(lambda: visible(cluster, topic) >= 300, 10, "the 300 committed rows")
    time.sleep(0.3)  # a duplicate would arrive now
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(300))


def test_signed_half_messages_and_end_transactions(embedded_cluster_factory, unique_name,
                                                   tmp_path):
    """With ACL every request is signed on its own (runs are written as commands, not
    spliced frames); the broker checks each signature."""
    cluster = embedded_cluster_factory(brokers=1, acl={"ak-eo": "sk-eo-secret"})
    topic = unique_name("EoSigned")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(150), group="eo-signed",
                          accessKey="ak-eo", secretKey="sk-eo-secret")
    assert len(summary.handles) == 150
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    from rocketmq_spark.client.acl import Credentials
    from rocketmq_spark.client.config import ClientConfig

    config = ClientConfig(credentials=Credentials("ak-eo", "sk-eo-secret"))
    with RemotingClient(config) as remoting:
        commit_batch(log, remoting, record_of(summary, 0, "eo-signed"))
    wait_until(lambda: visible(cluster, topic) >= 150, 10, "the 150 signed commits")
    assert visible(cluster, topic) == 150
    with RemotingClient() as unsigned:  # an unsigned END_TRANSACTION is refused
        from rocketmq_spark.client.txn.transaction import Outcome, end_transactions

        end_transactions(unsigned, "eo-signed", record_of(summary, 0, "eo-signed").handles[:5],
                         Outcome.COMMIT)
    time.sleep(0.5)
    assert visible(cluster, topic) == 150


def test_aborted_attempt_is_never_delivered_even_after_check_backs(txn_cluster, unique_name,
                                                                   tmp_path):
    cluster = txn_cluster
    topic = unique_name("EoAbort")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(50), group="eo-abort")
    with RemotingClient() as remoting:
        exactly_once.rollback(remoting, "eo-abort", record_of(summary, 0, "eo-abort").handles)
    # An attempt nobody settles (a dead task): the record answers ROLLBACK once a later
    # batch is committed.
    lost = send_halves(cluster, topic, range(1000, 1030), batch_id=1, group="eo-abort")
    later = send_halves(cluster, topic, range(2000, 2010), batch_id=2, group="eo-abort")
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    with RemotingClient() as remoting:
        commit_batch(log, remoting, record_of(later, 2, "eo-abort"))
        ops = exactly_once.OpTopic(remoting)
        responder = start_responder(cluster, "eo-abort", log, ops)
        try:
            wait_until(lambda: responder.answered["ROLLBACK"] >= 30, 15,
                       "30 check-backs answered ROLLBACK")
        finally:
            responder.close()
    assert responder.answered["ROLLBACK"] >= 30, responder.answered
    assert responder.answered["COMMIT"] == 0
    time.sleep(1)
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(2000, 2010))
    assert lost.token not in log.committed(2).tokens


def test_dropped_end_transactions_are_settled_by_check_back_as_recorded(txn_cluster,
                                                                        unique_name, tmp_path):
    cluster = txn_cluster
    topic = unique_name("EoDrop")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(100), group="eo-drop")
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    cluster.drop_next(40, request_codes=[END_TRANSACTION])  # 40 COMMITs lost on the way
    with RemotingClient() as remoting:
        commit_batch(log, remoting, record_of(summary, 0, "eo-drop"))
    time.sleep(1)
    assert visible(cluster, topic) == 60
    import os
    past = time.time() - 2 * exactly_once.END_GRACE_SECONDS
    os.utime(os.path.join(log.root, "ended", "0"), (past, past))  # the grace period is over
    with RemotingClient() as lookups:
        ops = exactly_once.OpTopic(lookups)
        responder = start_responder(cluster, "eo-drop", log, ops)
        try:
            wait_until(lambda: visible(cluster, topic) >= 100, 20,
                       "the 40 dropped COMMITs settled by check-back")
            time.sleep(2)  # more check rounds: nothing may be committed twice
        finally:
            responder.close()
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(100))
    assert responder.answered["COMMIT"] == 40, responder.answered


def test_restart_settles_a_recorded_batch_without_a_second_commit(txn_cluster, unique_name,
                                                                  tmp_path):
    """A driver killed after its record, with half of its END_TRANSACTIONs sent: settling
    commits exactly the other half (the op topic says which arrived)."""
    cluster = txn_cluster
    topic = unique_name("EoSettle")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(300), group="eo-settle")
    log = recorded_then_killed(summary, 7, "eo-settle", tmp_path, ended=120)
    time.sleep(1)
    assert log.pending() == [7]
    with RemotingClient() as remoting:  # the next run
        sent = exactly_once.settle(log, remoting, exactly_once.OpTopic(remoting))
    assert sent == 180
    time.sleep(1)
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(300))
    assert log.pending() == []


def test_replayed_committed_batch_is_rolled_back(txn_cluster, unique_name, tmp_path):
    cluster = txn_cluster
    topic = unique_name("EoReplay")
    cluster.create_topic(topic, 4)
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    first = send_halves(cluster, topic, range(80), batch_id=3, group="eo-replay")
    with RemotingClient() as remoting:
        commit_batch(log, remoting, record_of(first, 3, "eo-replay"))
    replay = send_halves(cluster, topic, range(80), batch_id=3, group="eo-replay")
    with RemotingClient() as remoting:
        sent = commit_batch(log, remoting,
                               record_of(replay, 3, "eo-replay"))
    assert sent == 0
    time.sleep(1)
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(80))


@pytest.mark.timeout(60)
def test_a_large_replay_finds_its_new_half_messages_in_linear_time():
    """A replayed batch of 200,000 rows: the handles the earlier run did not record are found
    with one set of the recorded ones (a set built per handle stalled the driver for hours)."""
    from rocketmq_spark.client.txn.transaction import HalfHandle

    def handles(offsets):
        return [HalfHandle("broker-a", "127.0.0.1:10911", f"U{i}", i, 1000 + i) for i in offsets]

    rows = 200_000
    previous = exactly_once.BatchRecord(5, QUERY, "eo-group", ["t1"], handles(range(rows)))
    # The replay's attempt stored every row again: half at offsets the record already holds
    # (a task whose halves were recorded), half at new ones.
    replay = handles(range(rows // 2, rows + rows // 2))
    record = exactly_once.BatchRecord(5, QUERY, "eo-group", ["t2"], replay)
    started = time.perf_counter()
    fresh = exactly_once.new_handles(record, previous)
    elapsed = time.perf_counter() - started
    assert fresh == handles(range(rows, rows + rows // 2))
    assert elapsed < 5.0, f"{elapsed:.1f} s for {rows:,} handles"


def test_the_responder_leaves_after_the_idle_limit_it_is_given(txn_cluster, tmp_path):
    """The check-back responder process stays while the query commits; the limit after the
    last commit is handed to it (here 1 s; 20 minutes by default), and it releases the
    record's responder lease when it leaves."""
    import os

    from rocketmq_spark.storage import lease_looks_held

    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    log.touch()
    exactly_once.ensure_responder(log, {"nameServer": txn_cluster.namesrv_addr}, "eo-idle",
                                  QUERY, idle_limit_s=1.0)
    responder_log = os.path.join(log.root, "responder.log")
    wait_until(lambda: os.path.exists(responder_log)
               and "answering check-backs" in open(responder_log).read(), 30,
               "the responder to start")
    wait_until(lambda: "no commit for 1 s" in open(responder_log).read(), 30,
               "the responder to notice it is idle")
    wait_until(lambda: b'"released": true' in (log.store.read(exactly_once.RESPONDER_LEASE)
                                               or b""), 10,
               "the responder to exit and release its lease")
    assert not lease_looks_held(log.store, exactly_once.RESPONDER_LEASE)


# ------------------------------------------------------------------------------ Spark


def test_stream_pipeline_exactly_once(spark, embedded_cluster_factory, unique_name, tmp_path):
    # A broker's usual pace of check-backs (none while a batch commits in time).
    cluster = embedded_cluster_factory(brokers=2, transaction_check_interval=30,
                                       transaction_timeout=6)
    source, sink = unique_name("EoIn"), unique_name("EoOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    produce(cluster.namesrv_addr, source, range(1500))
    checkpoint = str(tmp_path / "cp")

    def run():
        query = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                 .option("subscribe", source).option("startingOffsets", "earliest")
                 .option("maxMessagesPerTrigger", "500").load()
                 .selectExpr("CAST(body AS STRING) AS body")
                 .writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                 .option("topic", sink).option("deliveryGuarantee", "exactlyOnce")
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(240)
        assert query.exception() is None, query.exception()

    run()
    produce(cluster.namesrv_addr, source, range(1500, 2000))
    run()  # a restart on the same checkpoint
    seen = pull_bodies(cluster, sink)
    assert len(seen) == 2000 and set(seen.values()) == {1}
    log = exactly_once.CommitLog(exactly_once.record_root(checkpoint))
    assert log.pending() == [] and len(log.committed_ids()) >= 2
