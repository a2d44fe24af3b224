"""Topic message types (5.x): the embedded brokers under ``release="5.1"`` publish them as
5.1.4's do (GET_TOPIC_CONFIG's body, the ``+message.type`` attribute of UPDATE_AND_CREATE_TOPIC)
and refuse no send by type (``SendMessageProcessor`` at rocketmq-all-5.1.4 does not); the
proxy's check (``proxy/.../remoting/activity/SendMessageActivity.java``,
``DefaultTopicMessageTypeValidator.java``) is :func:`proxy_send_refusal`, held to the genuine
5.1.4 proxy's answers in the capture; and the sink checks the published type on the driver
before it sends."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.properties import decode_properties
from rocketmq_spark.embedded.store import TopicConfig
from rocketmq_spark.embedded.topic_types import message_type_of, proxy_send_refusal
from rocketmq_spark.options import OptionError
from rocketmq_spark.sink.writer import batch_writer, stream_writer
from raw_client import RawClient

CAPTURE = Path("/work/shared/captures/rocketmq-5.1.4-proxy-remoting/frames.jsonl")
if not CAPTURE.exists():
    CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "captures" / \
        "rocketmq-5.1.4-proxy-remoting" / "frames.jsonl"
GET_TOPIC_CONFIG = 351
SCHEMA = StructType([StructField("body", StringType())])


def frames():
    with CAPTURE.open() as f:
        return {json.loads(line)["seq"]: json.loads(line) for line in f}


needs_capture = pytest.mark.skipif(not CAPTURE.exists(), reason="the 5.1.4 capture is absent")


@pytest.fixture
def five(embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=2, release="5.1")
    for name, kind in (("CapNormalT", "NORMAL"), ("CapFifoT", "FIFO"), ("CapDelayT", "DELAY"),
                       ("CapTxT", "TRANSACTION"), ("CapMixedT", "MIXED")):
        cluster.create_topic(name, 4, message_type=kind)
    cluster.create_topic("CapUntypedT", 4)
    return cluster


# ------------------------------------------------------------------------------ the brokers


@needs_capture
def test_get_topic_config_answers_as_the_genuine_broker(five):
    genuine = frames()[8]  # the 5.1.4 broker's answer to the proxy's GET_TOPIC_CONFIG
    client = RawClient(five.brokers[0].addr)
    try:
        answer = client.request(GET_TOPIC_CONFIG, {"lo": "true", "topic": "CapNormalT"})
        missing = client.request(GET_TOPIC_CONFIG, {"topic": "NoSuchTopicXyz"})
    finally:
        client.close()
    assert answer.code == ResponseCode.SUCCESS
    assert answer.body == bytes.fromhex(genuine["body_hex"])  # byte for byte
    assert answer.version == json.loads(genuine["header_text"])["version"] == 441
    assert (missing.code, missing.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                              "No topic in this broker. topic: NoSuchTopicXyz")


def test_a_4_9_broker_does_not_serve_get_topic_config(embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=1)
    client = RawClient(cluster.brokers[0].addr)
    try:
        answer = client.request(GET_TOPIC_CONFIG, {"topic": "TBW102"})
    finally:
        client.close()
    assert (answer.code, answer.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                            " request type 351 not supported")
    with pytest.raises(ValueError, match='release="5.1"'):
        cluster.create_topic("Typed", 4, message_type="FIFO")


def test_update_topic_with_a_type_and_the_topic_tables(five):
    client = RawClient(five.brokers[0].addr)
    fields = {"topic": "AdminFifoT", "defaultTopic": "TBW102", "readQueueNums": "4",
              "writeQueueNums": "4", "perm": "6", "topicFilterType": "SINGLE_TAG",
              "attributes": "+message.type=FIFO"}
    try:
        assert client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields).code == 0
        config = json.loads(client.request(GET_TOPIC_CONFIG, {"topic": "AdminFifoT"}).body)
        table = json.loads(client.request(21, {}).body)["topicConfigTable"]  # GET_ALL_TOPIC_CONFIG
        bad = client.request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                             dict(fields, topic="AdminBadT", attributes="+message.type=ODD"))
    finally:
        client.close()
    assert config["attributes"] == {"message.type": "FIFO"}
    assert table["CapTxT"]["attributes"] == {"message.type": "TRANSACTION"}
    assert table["CapUntypedT"]["attributes"] == {}
    assert bad.code == ResponseCode.SYSTEM_ERROR
    assert five.topic_config("AdminBadT", five.brokers[0].name) is None


def test_the_broker_itself_refuses_no_send_by_type(five):
    """5.1.4's SendMessageProcessor reads the type only for its metrics: a half message to a
    NORMAL topic, sent to the broker directly, is stored."""
    client = RawClient(five.brokers[0].addr)
    try:
        answer = client.request(RequestCode.SEND_MESSAGE, {
            "producerGroup": "G", "topic": "CapNormalT", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "4", "bornTimestamp": "1",
            "flag": "0", "properties": "TRAN_MSG\x01true\x02PGROUP\x01G\x02",
            "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}, b"x")
    finally:
        client.close()
    assert answer.code == ResponseCode.SUCCESS, answer.remark


# ------------------------------------------------------------------------------ the proxy's check


@needs_capture
@pytest.mark.parametrize("request_seq, topic_type", [
    (875, None), (877, "TRANSACTION"), (881, "NORMAL"), (884, "NORMAL"), (887, "FIFO"),
    (892, "NORMAL"), (895, "FIFO"), (899, "DELAY"), (847, "NORMAL")])
def test_proxy_send_refusal_answers_as_the_genuine_proxy(request_seq, topic_type):
    """Each hand-made send of the capture: our check's code and remark are the proxy's
    answer's (a success: no refusal)."""
    captured = frames()
    request = captured[request_seq]
    answer = captured[request["response_seq"]] if "response_seq" in request else None
    ext = request["header"]["extFields"]
    props = decode_properties(ext.get("i") or ext.get("properties") or "")
    config = None if topic_type is None else TopicConfig(
        ext.get("b") or ext["topic"], attributes={"message.type": topic_type})
    refusal = proxy_send_refusal(ext.get("b") or ext["topic"], config, props)
    genuine = json.loads(answer["header_text"]) if answer else {"code": 0}
    if genuine["code"] == ResponseCode.SUCCESS:
        assert refusal is None
    else:
        assert refusal == (genuine["code"], genuine["remark"])


def test_message_types_and_unchecked_topics():
    assert message_type_of({"TRAN_MSG": "TRUE", "DELAY": "2"}) == "TRANSACTION"
    assert message_type_of({"TRAN_MSG": "yes", "__SHARDINGKEY": "g"}) == "FIFO"
    assert message_type_of({"TIMER_DELAY_SEC": "3", "__SHARDINGKEY": "g"}) == "DELAY"
    assert proxy_send_refusal("%RETRY%G", None, {}) is None
    assert proxy_send_refusal("M", TopicConfig("M", attributes={"message.type": "MIXED"}),
                              {"TRAN_MSG": "true"}) is None
    assert proxy_send_refusal("U", TopicConfig("U"), {}) is None  # no attribute: NORMAL


# ------------------------------------------------------------------------------ the sink


def _options(cluster, topic, **extra):
    return {"nameServer": cluster.namesrv_addr, "topic": topic, **extra}


def _schema(*extra):
    return StructType(SCHEMA.fields + [StructField(name, kind) for name, kind in extra])


@pytest.mark.parametrize("topic, extra, columns, needed", [
    ("CapNormalT", {"deliveryGuarantee": "exactlyOnce", "producerGroup": "eo-typed"}, (),
     "TRANSACTION"),
    ("CapNormalT", {}, (("shardingKey", StringType()),), "FIFO"),
    ("CapFifoT", {}, (("delayLevel", IntegerType()),), "DELAY"),
])
def test_the_sink_refuses_a_topic_of_another_type_before_sending(five, tmp_path, topic, extra,
                                                                 columns, needed):
    if "deliveryGuarantee" in extra:
        extra = dict(extra, checkpointLocation=str(tmp_path))
    with pytest.raises(OptionError) as info:
        batch_writer(_options(five, topic, **extra), _schema(*columns), False)
    message = str(info.value)
    assert f"a {needed} topic is needed" in message
    assert f"mqadmin updateTopic -n <nameServer> -c DefaultCluster -t {topic} -a " \
           f"+message.type={needed}" in message
    assert "Nothing was sent" in message


@pytest.mark.parametrize("topic, extra, columns", [
    ("CapTxT", {"deliveryGuarantee": "exactlyOnce", "producerGroup": "eo-typed"}, ()),
    ("CapFifoT", {}, (("shardingKey", StringType()),)),
    ("CapDelayT", {}, (("delayLevel", IntegerType()),)),
    ("CapMixedT", {}, (("shardingKey", StringType()),)),
    ("CapUntypedT", {"deliveryGuarantee": "exactlyOnce", "producerGroup": "eo-typed"}, ()),
    ("CapNormalT", {}, ()),
])
def test_the_sink_takes_a_topic_of_the_right_type_or_none(five, tmp_path, topic, extra,
                                                         columns):
    if "deliveryGuarantee" in extra:
        extra = dict(extra, checkpointLocation=str(tmp_path))
        stream_writer(_options(five, topic, **extra), _schema(*columns), False)
    else:
        batch_writer(_options(five, topic, **extra), _schema(*columns), False)


def test_no_check_where_no_type_is_published(embedded_cluster_factory, tmp_path):
    cluster = embedded_cluster_factory(brokers=1)  # 4.9.8: no GET_TOPIC_CONFIG, no types
    cluster.create_topic("OldT", 4)
    batch_writer(_options(cluster, "OldT", deliveryGuarantee="exactlyOnce",
                          producerGroup="eo-old", checkpointLocation=str(tmp_path)),
                 SCHEMA, False)


def test_exactly_once_to_a_normal_topic_fails_in_spark_before_any_task(spark, five, tmp_path):
    df = spark.range(20).selectExpr("CAST(id AS STRING) AS body")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(Exception) as info:
        (df.write.format("rocketmq").mode("append").option("nameServer", five.namesrv_addr)
         .option("topic", "CapNormalT").option("deliveryGuarantee", "exactlyOnce")
         .option("producerGroup", "eo-spark-typed")
         .option("checkpointLocation", str(tmp_path)).save())
    message = str(info.value)
    assert "is published as NORMAL on broker-a, NORMAL on broker-b" in message, message[:3000]
    assert "mqadmin updateTopic -n <nameServer> -c DefaultCluster -t CapNormalT -a " \
           "+message.type=TRANSACTION" in message
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs, "no job ran"
    assert all(five.max_offset("CapNormalT", b.name, q) == 0 for b in five.brokers
               for q in range(4))


@needs_capture
def test_a_type_refusal_met_while_sending_says_what_to_do(embedded_cluster_factory):
    """Through a proxy's remoting port the type cannot be read first: the proxy's refusal
    (the genuine remark of seq 882) fails the task with the type needed and the command."""
    import pyarrow as pa

    from rocketmq_spark.client.protocol.codes import RequestCode as Codes
    from rocketmq_spark.sink.ids import TaskIdentity
    from rocketmq_spark.sink.options import parse_sink_options
    from rocketmq_spark.sink.schema import plan_columns
    from rocketmq_spark.sink.task import SinkWriteError, write_task

    remark = json.loads(frames()[882]["header_text"])["remark"]
    cluster = embedded_cluster_factory(brokers=1, release="5.1")
    cluster.create_topic("HintT", 4, message_type="NORMAL")
    cluster.fail_next(5, ResponseCode.MESSAGE_ILLEGAL, remark,
                      request_codes=[Codes.SEND_MESSAGE, Codes.SEND_MESSAGE_V2,
                                     Codes.SEND_BATCH_MESSAGE])
    options = parse_sink_options({"nameServer": cluster.namesrv_addr, "topic": "HintT",
                                  "retries": "0"})
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"])], ["body"])
    with pytest.raises(SinkWriteError) as info:
        write_task([batch], plan_columns(SCHEMA, "HintT"), options,
                   TaskIdentity("batch", "job", 0, 0), "G")
    message = str(info.value)
    assert "TopicMessageType validate failed, the expected type is NORMAL, but actual type " \
           "is TRANSACTION" in message
    assert "The topic is NORMAL and these messages are TRANSACTION: change its type with " \
           "mqadmin updateTopic -n <nameServer> -c <cluster> -t HintT -a " \
           "+message.type=TRANSACTION" in message
