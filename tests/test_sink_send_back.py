"""The sink's ``sendBack`` mode: rows read by our source go back to a consumer group, as a Java
push consumer's ``sendMessageBack`` sends them (client side: ``DefaultMQPushConsumerImpl`` and
``MQClientAPIImpl.consumerSendMessageBack``; broker side: 4.9.8's
``SendMessageProcessor.asyncConsumerSendMsgBack`` as the embedded broker answers it).

With real Spark, over real sockets, against the embedded cluster (short delay levels, so a
message's trip through the schedule takes a moment): the retry copies are received by Apache's
C++ PushConsumer of the group with the reconsume count and properties the broker gives them;
sending back again after ``maxReconsumeTimes`` lands in ``%DLQ%<group>``; a broker that refuses
CONSUMER_SEND_MSG_BACK (a fault only ``fail_next`` produces) gets Java's fallback, the message
itself in the retry topic, from another broker; and the errors.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.protocol.codes import ResponseCode
from rocketmq_spark.client.protocol.message import offset_msg_id, pack_host
from rocketmq_spark.embedded import EmbeddedCluster
from waiting import wait_until

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
DELAYS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s"
CONSUMER_SEND_MSG_BACK = 36
needs_cpp = pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                               reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")


@pytest.fixture(scope="module")
def cluster():
    """Two brokers whose delay levels last a moment (a retry goes through the schedule)."""
    with EmbeddedCluster(brokers=2, message_delay_level=DELAYS) as c:
        yield c


def produce(cluster, topic: str, n: int) -> None:
    cluster.create_topic(topic, queues=2)
    with Producer(cluster.namesrv_addr) as producer:
        for i in range(n):
            producer.send(Message(topic, f"body {i}".encode(), tags="orig", keys=f"k{i}",
                                  properties={"color": "red"}))


def read(spark, cluster, topic: str, **options):
    reader = (spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("subscribe", topic).option("includeProperties", "true"))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def send_back(df, cluster, group: str, **options) -> None:
    writer = (df.write.format("rocketmq").mode("append")
              .option("nameServer", cluster.namesrv_addr).option("sendBack", group))
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.save()


def rows_of(spark, cluster, topic: str, n: int, what: str, **options) -> List[dict]:
    """Wait until ``topic`` holds ``n`` messages (a retry arrives after its delay)."""
    def found():
        rows = [r.asDict() for r in read(spark, cluster, topic, **options).collect()]
        return rows if len(rows) >= n else None
    rows = wait_until(found, 60, what)
    assert len(rows) == n, rows
    return rows


def original_offset_id(row: dict) -> str:
    return offset_msg_id(pack_host(row["storeHost"])[0], row["commitLogOffset"])


def run_peer_push(cluster, topic: str, group: str, expect: int, expression: str):
    return subprocess.Popen(
        [sys.executable, str(PEER), "push", "--namesrv", cluster.namesrv_addr, "--topic", topic,
         "--group", group, "--expect", str(expect), "--expression", expression,
         "--timeout", "90", "--props", "RETRY_TOPIC,ORIGIN_MESSAGE_ID,color"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_cpp
def test_stream_sends_back_and_the_cpp_push_consumer_gets_the_retries(spark, cluster, tmp_path):
    """writeStream with sendBack: the failed rows come back to the group's C++ PushConsumer
    through %RETRY%<group>, as the broker makes them: reconsume count 1, RETRY_TOPIC the
    original topic, ORIGIN_MESSAGE_ID the original's offset id, the user's properties and the
    same message id. (The consumer subscribes the topic with a tag no original has, so what it
    gets is what came through its retry subscription.)"""
    topic, group = "SbStreamT", "SbStreamG"
    produce(cluster, topic, 6)
    originals = {r["keys"]: r for r in (x.asDict() for x in read(spark, cluster, topic).collect())}
    peer = run_peer_push(cluster, topic, group, 3, "nothing-has-this-tag")
    try:
        assert json.loads(peer.stdout.readline()) == {"started": True}
        failed = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                  .option("subscribe", topic).option("startingOffsets", "earliest").load()
                  .where("keys in ('k1', 'k3', 'k5')"))
        query = (failed.writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
                 .option("sendBack", group).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None, query.exception()
        out, err = peer.communicate(timeout=120)
    finally:
        if peer.poll() is None:
            peer.kill()
    assert peer.returncode == 0, err[-3000:]
    got = {m["keys"]: m for m in json.loads(out.strip().splitlines()[-1])["messages"]}
    assert sorted(got) == ["k1", "k3", "k5"]
    for key, message in got.items():
        original = originals[key]
        assert message["topic"] == topic  # the client puts RETRY_TOPIC back as the topic
        assert message["reconsume_times"] == 1
        assert message["body"] == original["body"].decode()
        assert message["id"] == original["msgId"]
        assert message["properties"] == {"RETRY_TOPIC": topic, "color": "red",
                                         "ORIGIN_MESSAGE_ID": original_offset_id(original)}


def test_sent_back_again_past_max_reconsume_times_lands_in_the_dlq(spark, cluster):
    """df.write with sendBack, round after round (each read from the retry topic): with
    maxReconsumeTimes=2 the third send-back stores the message in %DLQ%<group>, with its
    reconsume count, RETRY_TOPIC, ORIGIN_MESSAGE_ID, body and properties. A delayLevel of -1
    sends a message straight there."""
    topic, group = "SbDlqT", "SbDlqG"
    produce(cluster, topic, 4)
    first = read(spark, cluster, topic)
    originals = {r["keys"]: r.asDict() for r in first.collect()}
    send_back(first.where("keys in ('k0', 'k1')"), cluster, group, maxReconsumeTimes=2)
    for times in (1, 2):
        rows = rows_of(spark, cluster, f"%RETRY%{group}", 2 * times,
                       f"the retries of round {times}")
        this_round = [r for r in rows if r["reconsumeTimes"] == times]
        assert sorted(r["keys"] for r in this_round) == ["k0", "k1"]
        df = spark.createDataFrame(this_round, read(spark, cluster, topic).schema)
        send_back(df, cluster, group, maxReconsumeTimes=2)
    from pyspark.sql import functions as F
    send_back(first.where("keys = 'k2'").withColumn("delayLevel", F.lit(-1)), cluster, group)
    dead = rows_of(spark, cluster, f"%DLQ%{group}", 3, "the dead letters")
    by_key = {r["keys"]: r for r in dead}
    assert sorted(by_key) == ["k0", "k1", "k2"]
    for key, row in by_key.items():
        original = originals[key]
        props = dict(row["properties"])
        assert row["topic"] == f"%DLQ%{group}" and row["body"] == original["body"]
        assert row["reconsumeTimes"] == (3 if key != "k2" else 1)
        assert props["RETRY_TOPIC"] == topic and props["color"] == "red"
        assert props["ORIGIN_MESSAGE_ID"] == original_offset_id(original)
        assert props["UNIQ_KEY"] == original["msgId"]
    assert rows_of(spark, cluster, f"%RETRY%{group}", 4, "the retry topic, unchanged")


def test_a_broker_refusing_send_back_gets_the_message_in_the_retry_topic(spark, cluster):
    """Java's catch block: the broker answers CONSUMER_SEND_MSG_BACK with an error (a fault
    only fail_next makes), so the message itself goes to %RETRY%<group>, from the other broker,
    with RETRY_TOPIC, ORIGIN_MESSAGE_ID (the row's msgId), the reconsume count in the send
    header (not as properties) and its own properties and id."""
    topic, group = "SbFallbackT", "SbFallbackG"
    produce(cluster, topic, 2)
    row = read(spark, cluster, topic).where("keys = 'k0'")
    original = row.collect()[0].asDict()
    cluster.fail_next(1, ResponseCode.SYSTEM_ERROR, "look message by offset failed, 0",
                      request_codes=[CONSUMER_SEND_MSG_BACK], broker=original["brokerName"])
    send_back(row, cluster, group)
    retried = rows_of(spark, cluster, f"%RETRY%{group}", 1, "the fallback's retry message")[0]
    props = dict(retried["properties"])
    assert retried["brokerName"] != original["brokerName"]
    assert retried["reconsumeTimes"] == 1 and retried["body"] == original["body"]
    assert props["RETRY_TOPIC"] == topic and props["color"] == "red"
    assert props["ORIGIN_MESSAGE_ID"] == original["msgId"]
    assert props["UNIQ_KEY"] == original["msgId"] and props["TAGS"] == "orig"
    assert "RECONSUME_TIME" not in props and "MAX_RECONSUME_TIMES" not in props


def test_a_refusal_where_the_only_retry_queues_are_goes_to_another_broker(spark, cluster):
    """The retry topic lives on one broker (its first send-back made it there); that broker
    refuses the next one: the fallback stores the message on the other broker, whose retry
    topic the send creates (queue 0, as a broker creates a retry topic sent to)."""
    topic, group = "SbElsewhereT", "SbElsewhereG"
    produce(cluster, topic, 8)
    rows = read(spark, cluster, topic)
    broker = rows.collect()[0]["brokerName"]
    first, second = [r["keys"] for r in rows.where(f"brokerName = '{broker}'").collect()][:2]
    send_back(rows.where(f"keys = '{first}'"), cluster, group)
    routed = rows_of(spark, cluster, f"%RETRY%{group}", 1, "the first retry")
    assert [r["brokerName"] for r in routed] == [broker]
    cluster.fail_next(1, ResponseCode.SYSTEM_ERROR, "look message by offset failed, 0",
                      request_codes=[CONSUMER_SEND_MSG_BACK], broker=broker)
    send_back(rows.where(f"keys = '{second}'"), cluster, group)
    retried = rows_of(spark, cluster, f"%RETRY%{group}", 2, "the fallback's retry")
    assert {(r["keys"], r["brokerName"] == broker) for r in retried} == {
        (first, True), (second, False)}


def test_the_fallback_past_max_reconsume_times_lands_in_the_dlq(spark, cluster):
    """The fallback's send carries maxReconsumeTimes in its header: over it, the broker stores
    the message in %DLQ%<group> (4.9.8's handleRetryAndDLQ)."""
    topic, group = "SbFallbackDlqT", "SbFallbackDlqG"
    produce(cluster, topic, 1)
    row = read(spark, cluster, topic)
    cluster.fail_next(1, ResponseCode.SYSTEM_ERROR, "look message by offset failed, 0",
                      request_codes=[CONSUMER_SEND_MSG_BACK])
    send_back(row, cluster, group, maxReconsumeTimes=0)
    dead = rows_of(spark, cluster, f"%DLQ%{group}", 1, "the fallback's dead letter")[0]
    assert dead["keys"] == "k0" and dict(dead["properties"])["RETRY_TOPIC"] == topic


def test_namespace_wraps_the_group_and_retry_topic(spark, cluster):
    topic, group = "SbNsT", "SbNsG"
    produce(cluster, f"ns1%{topic}", 1)
    rows = read(spark, cluster, topic, namespace="ns1")
    assert [r["topic"] for r in rows.collect()] == [topic]
    send_back(rows, cluster, group, namespace="ns1")
    retried = rows_of(spark, cluster, f"%RETRY%ns1%{group}", 1, "the retry in the namespace")
    assert dict(retried[0]["properties"])["RETRY_TOPIC"] == f"ns1%{topic}"


def _error(action) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def test_rows_without_the_identity_columns_are_refused_naming_them(spark, cluster):
    cluster.create_topic("SbErrT", queues=1)
    df = read(spark, cluster, "SbErrT")
    message = _error(lambda: send_back(df.select("topic", "body"), cluster, "G"))
    assert "brokerName, commitLogOffset, msgId, reconsumeTimes" in message
    message = _error(lambda: send_back(df.selectExpr("*", "'bad input' AS reason"), cluster,
                                       "G"))
    assert "column 'reason' is not one sendBack takes" in message
    message = _error(lambda: send_back(df.selectExpr("*", "'x' AS delayLevel"), cluster, "G"))
    assert "column 'delayLevel' must be int" in message


@pytest.mark.parametrize("options, words", [
    ({"topic": "T"}, "option topic has no meaning with sendBack"),
    ({"deliveryGuarantee": "exactlyOnce"}, "cannot be used with sendBack"),
    ({"sendBack": "bad group!"}, "option sendBack 'bad group!' is not a valid group name"),
    ({"sendBack": None, "maxReconsumeTimes": "3"}, "maxReconsumeTimes works with sendBack"),
    ({"maxReconsumeTimes": "-1"}, "option maxReconsumeTimes must be between 0"),
])
def test_options_that_make_no_sense_with_send_back(spark, cluster, options, words):
    cluster.create_topic("SbErrT", queues=1)
    df = read(spark, cluster, "SbErrT")
    writer = (df.write.format("rocketmq").mode("append")
              .option("nameServer", cluster.namesrv_addr))
    for key, value in {"sendBack": "G", **options}.items():
        if value is not None:
            writer = writer.option(key, value)
    assert words in _error(writer.save)


def test_endpoints_with_send_back_is_refused():
    from rocketmq_spark.options import OptionError
    from rocketmq_spark.sink.options import parse_sink_options

    with pytest.raises(OptionError, match="sendBack works over RocketMQ's remoting protocol"):
        parse_sink_options({"endpoints": "proxy:8081", "sendBack": "G"})


def test_a_null_identity_or_a_bad_delay_level_fails_the_task_naming_it(spark, cluster):
    produce(cluster, "SbNullT", 1)
    df = read(spark, cluster, "SbNullT")
    message = _error(lambda: send_back(df.selectExpr(
        *[c for c in df.columns if c != "commitLogOffset"],
        "CAST(NULL AS BIGINT) AS commitLogOffset"), cluster, "SbNullG"))
    assert "row 0: column commitLogOffset is null" in message
    message = _error(lambda: send_back(df.selectExpr("*", "19 AS delayLevel"), cluster,
                                       "SbNullG"))
    assert "row 0: delayLevel 19 is not -1" in message

