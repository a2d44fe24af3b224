"""A Spark member of a consumer group reads its share of the group's retry queues
(``%RETRY%<group>``), under the original topic; dead-letter topics (``%DLQ%<group>``) are
readable by name. Real Spark against the embedded brokers; the messages go back through the
brokers' own CONSUMER_SEND_MSG_BACK (what Java's and C++'s push consumers send when a message
fails), as Apache's C++ producer stored them first.

What Java does and this follows (read in apache/rocketmq's source, the 4.9.8 capture
``rocketmq-4.9.8-retry-dlq`` showing the stored retry message and the C++ consumer's restored
topic): ``DefaultMQPushConsumerImpl.copySubscription`` subscribes a clustering consumer to its
retry topic with ``*``; ``RebalancePushImpl.computePullFromWhere`` starts a retry queue the group
has no offset for at 0; ``resetRetryAndNamespace`` puts the RETRY_TOPIC property back into the
message's topic; a sent-back copy keeps the original's UNIQ_KEY (its msgId) and counts one more
reconsume.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.group.send_back import send_message_back
from rocketmq_spark.source.offsets import queue_offsets
from source_helpers import run_available_now
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
TOPIC = "RetryT"


def cpp_produce(namesrv: str, topic: str, count: int, prefix: str = "r") -> list:
    """Apache's C++ producer sends ``count`` messages keyed ``<prefix>0``...; their msgIds."""
    specs = [{"body": f"retry body {i}", "keys": f"{prefix}{i}", "tags": "TagR"}
             for i in range(count)]
    done = subprocess.run([sys.executable, str(PEER), "produce", "--namesrv", namesrv,
                           "--topic", topic], input=json.dumps(specs), capture_output=True,
                          text=True, timeout=120)
    results = json.loads(done.stdout.strip().splitlines()[-1])["results"]
    assert all(r.get("status") == "OK" for r in results), results
    return [r["msg_id"] for r in results]


def stored(spark, namesrv: str, topic: str) -> dict:
    """key -> the row a batch read gives (brokerName, commitLogOffset, msgId...)."""
    rows = (spark.read.format("rocketmq").option("nameServer", namesrv)
            .option("subscribe", topic).load().collect())
    return {r["keys"]: r for r in rows}


def send_back(cluster, rows, group: str, delay_level: int = 0) -> None:
    """CONSUMER_SEND_MSG_BACK for each row, to the broker that stored it, as a push consumer
    whose listener failed the message sends it (delay level 0: the broker's 3 + reconsumes;
    -1: straight to the dead-letter topic)."""
    with Admin(cluster.namesrv_addr) as admin:
        for row in rows:
            send_message_back(admin.remoting, cluster.broker(row["brokerName"]).addr,
                              row["commitLogOffset"], group, delay_level, row["msgId"],
                              row["topic"])


def queue_totals(namesrv: str, topic: str, kind: str, group: str = "") -> dict:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic, refresh=True)
        extra = {"group": group} if group else {}
        return {mq: v for mq, v in admin.offsets(kind, queues, **extra).items()}


@pytest.fixture
def retry_cluster(embedded_cluster_factory):
    """Two brokers whose delay levels are all 100 ms, so sent-back messages reach the retry
    topic at once; the group gives up after 2 reconsumes."""
    cluster = embedded_cluster_factory(brokers=2, message_delay_level=" ".join(["100ms"] * 18),
                                       retry_max_times=2)
    cluster.create_topic(TOPIC, queues=2)
    return cluster


def member_stream(spark, namesrv: str, group: str, **extra):
    reader = (spark.readStream.format("rocketmq").option("nameServer", namesrv)
              .option("subscribe", TOPIC).option("consumerGroup", group)
              .option("membership", "group").option("includeProperties", "true"))
    for key, value in {"startingOffsets": "earliest", **extra}.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_a_member_reads_the_retry_queues_filled_before_it_joined(spark, retry_cluster,
                                                                  tmp_path):
    """A Spark-only group whose retry queues an earlier (Java or C++) member filled, their
    first message since deleted by retention: the Spark member, starting at the topic's
    latest offsets, reads the retry queues all the same from their first message (the group
    has no offset there), each row under the original topic with its first msgId and
    reconsumeTimes 1; the retry queues' offsets are in the checkpoint and committed back."""
    cluster, group = retry_cluster, "retry-readers"
    ids = cpp_produce(cluster.namesrv_addr, TOPIC, 20)
    first = stored(spark, cluster.namesrv_addr, TOPIC)
    failed = [first[f"r{i}"] for i in (1, 4, 7, 10, 13, 16, 19)]
    send_back(cluster, failed, group)
    retry = f"%RETRY%{group}"
    wait_until(lambda: sum(queue_totals(cluster.namesrv_addr, retry, "max").values()) == 7, 30,
               "the broker to store the seven sent back in the retry topic")
    # Retention took the head of every queue: the group's offsets are "none" (a broker
    # answers 0 for a queue whose first message is still there), so where to start counts.
    for mq in queue_totals(cluster.namesrv_addr, retry, "max"):
        cluster.truncate(retry, mq.broker_name, mq.queue_id, 1)
    for mq in queue_totals(cluster.namesrv_addr, TOPIC, "max"):
        cluster.truncate(TOPIC, mq.broker_name, mq.queue_id, 1)
    left = stored(spark, cluster.namesrv_addr, retry)  # read by name: as stored
    assert 0 < len(left) < 7 and {r["topic"] for r in left.values()} == {retry}

    query = run_available_now(
        spark, member_stream(spark, cluster.namesrv_addr, group, startingOffsets="latest"),
        str(tmp_path / "cp"))
    rows = spark.table(query.table_name).collect()
    assert sorted(r["keys"] for r in rows) == sorted(left)
    assert {r["topic"] for r in rows} == {TOPIC}  # none under %RETRY%retry-readers
    assert all(r["reconsumeTimes"] == 1 and r["properties"]["RETRY_TOPIC"] == TOPIC
               and r["msgId"] == ids[int(r["keys"][1:])] for r in rows)
    # Where they sit: the retry queues, in the checkpoint and committed for the group.
    assert {(r["brokerName"], r["queueId"]) for r in rows} <= {("broker-a", 0),
                                                              ("broker-b", 0)}
    # queueTopic names the retry queue, so the four columns name the message's real place:
    # the same place a read of the retry topic by name gives it.
    position = ("queueTopic", "brokerName", "queueId", "queueOffset")
    assert {tuple(r[c] for c in position) for r in rows} == {
        tuple(left[r["keys"]][c] for c in position) for r in rows}
    assert {r["queueTopic"] for r in rows} == {retry}
    assert all(r["queueTopic"] == r["topic"] == retry for r in left.values())
    offsets = [queue_offsets(json.loads(f.read_text().splitlines()[-1]))
               for f in sorted((tmp_path / "cp" / "offsets").glob("[0-9]*"),
                               key=lambda f: int(f.name))]
    ends = queue_totals(cluster.namesrv_addr, retry, "max")
    assert {k: v for k, v in offsets[-1].items() if k.startswith(retry)} == {
        mq.key: v for mq, v in ends.items()}
    assert queue_totals(cluster.namesrv_addr, retry, "committed", group) == ends


def test_consume_retry_topic_false_leaves_the_share_unread(spark, retry_cluster, tmp_path,
                                                           caplog):
    """consumeRetryTopic=false: the member reads only the topic; its retry queues keep their
    messages and get no offset; the member warns, naming the option."""
    from rocketmq_spark.client.config import ClientConfig
    from rocketmq_spark.client.group.membership import GroupMember, member_client_id

    cluster, group = retry_cluster, "retry-ignored"
    cpp_produce(cluster.namesrv_addr, TOPIC, 10)
    first = stored(spark, cluster.namesrv_addr, TOPIC)
    send_back(cluster, [first["r2"], first["r5"]], group)
    retry = f"%RETRY%{group}"
    wait_until(lambda: sum(queue_totals(cluster.namesrv_addr, retry, "max").values()) == 2, 30,
               "the two sent back in the retry topic")
    query = run_available_now(
        spark, member_stream(spark, cluster.namesrv_addr, group, consumeRetryTopic="false"),
        str(tmp_path / "cp"))
    rows = spark.table(query.table_name).collect()
    assert sorted(r["keys"] for r in rows) == sorted(f"r{i}" for i in range(10))
    assert all(r["reconsumeTimes"] == 0 for r in rows)
    # No offset of the group there: a 4.9.x broker answers 0 for a queue whose first message
    # is still in memory, as for one never read.
    assert set(queue_totals(cluster.namesrv_addr, retry, "committed", group).values()) <= {
        None, 0}
    # The warning comes from the member (in Spark's source runner there): one here, alone.
    member = GroupMember(cluster.namesrv_addr, ClientConfig(client_id=member_client_id("w")),
                         group, lambda: [TOPIC], lambda queues, first: {})
    with caplog.at_level(logging.WARNING, "rocketmq_spark.client.group.membership"):
        member.rebalance()
    member.leave()
    warned = [r.getMessage() for r in caplog.records if "consumeRetryTopic=false" in
              r.getMessage()]
    assert len(warned) == 1 and retry in warned[0], warned


def test_dead_letters_and_retry_topics_read_by_name(spark, retry_cluster, tmp_path):
    """``subscribe=%DLQ%<group>`` reads the dead letters, batch and stream, under the
    dead-letter topic with their first msgId and the original topic in RETRY_TOPIC; a retry
    topic named outside group membership is read as it is stored; a pattern leaves both out."""
    cluster, group = retry_cluster, "dead-group"
    ids = cpp_produce(cluster.namesrv_addr, TOPIC, 8, prefix="d")
    first = stored(spark, cluster.namesrv_addr, TOPIC)
    send_back(cluster, [first["d1"], first["d6"]], group, delay_level=-1)  # straight to DLQ
    send_back(cluster, [first["d3"]], group)
    dlq, retry = f"%DLQ%{group}", f"%RETRY%{group}"
    wait_until(lambda: sum(queue_totals(cluster.namesrv_addr, dlq, "max").values()) == 2
               and sum(queue_totals(cluster.namesrv_addr, retry, "max").values()) == 1, 30,
               "the broker to store the dead letters and the retry")

    def batch(topic: str = "", **extra):
        r = (spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr)
             .option("includeProperties", "true"))
        for key, value in ({"subscribe": topic} if topic else extra).items():
            r = r.option(key, value)
        return r.load()

    def check_dead(rows) -> None:
        assert sorted(r["keys"] for r in rows) == ["d1", "d6"]
        assert {r["topic"] for r in rows} == {dlq}
        assert sorted(r["msgId"] for r in rows) == sorted([ids[1], ids[6]])
        assert {r["properties"]["RETRY_TOPIC"] for r in rows} == {TOPIC}

    check_dead(batch(dlq).collect())
    stream = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("subscribe", dlq).option("startingOffsets", "earliest")
              .option("includeProperties", "true").load())
    query = run_available_now(spark, stream, str(tmp_path / "dlq-cp"))
    check_dead(spark.table(query.table_name).collect())
    (retried,) = batch(retry).collect()
    assert (retried["topic"], retried["keys"], retried["msgId"], retried["reconsumeTimes"],
            retried["properties"]["RETRY_TOPIC"]) == (retry, "d3", ids[3], 1, TOPIC)
    assert {r["topic"] for r in batch(subscribePattern=".*").select("topic").collect()} \
        == {TOPIC}


def test_a_write_only_dead_letter_topic_fails_the_read_saying_how_to_grant_it(
        spark, cluster, unique_name, tmp_path):
    """A dead-letter topic with perm 2 (as brokers before 4.9.8 created them): batch and
    stream reads fail at once naming the topic and the mqadmin command that grants reads;
    a pull the broker refuses for that reason says the same."""
    from rocketmq_spark.client.protocol.route import MessageQueue
    from rocketmq_spark.client.read.reader import QueueRangeReader, ReadSettings, TopicNotReadable

    dlq = "%DLQ%" + unique_name("oldgroup")
    cluster.create_topic(dlq, queues=1, perm=2)
    hint = f"mqadmin updateTopicPerm -n {cluster.namesrv_addr} -c DefaultCluster -t {dlq} -p 6"
    reader = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", dlq)
    with pytest.raises(Exception, match="perm on broker-a, broker-b is 2") as batch_error:
        reader.load().collect()
    assert hint in str(batch_error.value)
    stream = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("subscribe", dlq).load())
    with pytest.raises(Exception) as stream_error:
        run_available_now(spark, stream, str(tmp_path / "cp"), timeout=60)
    assert hint in str(stream_error.value)
    with Admin(cluster.namesrv_addr) as admin:
        mq = MessageQueue(dlq, "broker-a", 0)
        pulls = QueueRangeReader(admin.brokers, lambda q, i, r: cluster.broker("broker-a").addr,
                                 mq, 0, 1, ReadSettings(consumer_group="any"))
        with pytest.raises(TopicNotReadable, match=f"updateTopicPerm .* -t {dlq} -p 6"):
            list(pulls)


def test_a_namespaced_member_reads_its_retry_queues_without_the_namespace(spark, retry_cluster,
                                                                          tmp_path):
    """namespace=ns, consumerGroup=g: the retry topic is ``%RETRY%ns%g``, its messages carry
    ``RETRY_TOPIC=ns%RetryT``, and the rows say ``RetryT``, as Java's consumer in ns shows
    them (``resetRetryAndNamespace``: the original topic, then without the namespace)."""
    cluster, ns, group = retry_cluster, "ns1", "nsgroup"
    wire = f"{ns}%{TOPIC}"
    cluster.create_topic(wire, queues=2)
    ids = cpp_produce(cluster.namesrv_addr, wire, 6, prefix="s")
    first = stored(spark, cluster.namesrv_addr, wire)
    send_back(cluster, [first["s2"], first["s5"]], f"{ns}%{group}")
    retry = f"%RETRY%{ns}%{group}"
    wait_until(lambda: sum(queue_totals(cluster.namesrv_addr, retry, "max").values()) == 2, 30,
               "the two sent back in the namespaced retry topic")
    stream = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("namespace", ns).option("subscribe", TOPIC)
              .option("consumerGroup", group).option("membership", "group")
              .option("startingOffsets", "earliest").option("includeProperties", "true")
              .load())
    query = run_available_now(spark, stream, str(tmp_path / "cp"))
    rows = spark.table(query.table_name).collect()
    assert sorted(r["keys"] for r in rows) == sorted([f"s{i}" for i in range(6)] + ["s2", "s5"])
    assert {r["topic"] for r in rows} == {TOPIC}
    assert sorted((r["keys"], r["msgId"], r["properties"]["RETRY_TOPIC"]) for r in rows
                  if r["reconsumeTimes"]) == [("s2", ids[2], wire), ("s5", ids[5], wire)]
    assert queue_totals(cluster.namesrv_addr, retry, "committed", f"{ns}%{group}") == \
        queue_totals(cluster.namesrv_addr, retry, "max")
