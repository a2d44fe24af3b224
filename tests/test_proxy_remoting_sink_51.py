"""The sink through a 5.1+ proxy's remoting port, and that port as strict as a genuine 5.1.4
proxy (captures/rocketmq-5.1.4-proxy-remoting, observations 1, 6, 7, 8 and 11).

Where the proxy reads its broker name: AbstractRemotingActivity.java (apache/rocketmq tag
rocketmq-all-5.1.4, proxy/src/main/java/org/apache/rocketmq/proxy/remoting/activity/):
``n`` for SEND_MESSAGE_V2 only, ``bname`` for every other routed code, SEND_BATCH_MESSAGE
included. END_TRANSACTION: TransactionActivity.java and proxy/.../service/transaction/
(AbstractTransactionService, ClusterTransactionService): answered SUCCESS, found only in what
the proxy kept when it relayed a check-back. Each refusal below is the capture's, code and
remark; the sink's answer to them (both fields on every send, exactly once refused before a
send) is checked with real Spark and read back by Apache's C++ PullConsumer from the brokers.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_spark.client.broker import send_command
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.message import BatchEntry, encode_batch
from rocketmq_spark.client.protocol.properties import encode_properties
from rocketmq_spark.client.txn.transaction import HalfHandle, Outcome, end_transaction_command
from raw_client import RawClient
from waiting import wait_until

NO_BNAME = "Request doesn't have field bname"
END_TRANSACTION = 37
PEER = Path(__file__).resolve().parent / "cpp_peer.py"


@pytest.fixture(scope="module", params=["4.9", "5.1"], ids=["brokers-4.9", "brokers-5.1"])
def proxied(request):
    """Two brokers (as 4.9.8's, or as 5.1.4's: op topic, topic types) behind the proxy's
    remoting port; check-backs every 0.5 s and the proxy's producer announcements every 0.2 s,
    so a check-back settles in about a second."""
    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=2, proxy_remoting=True, transaction_check_interval=0.5,
                         transaction_timeout=0.5, transaction_check_max=30,
                         proxy_transaction_heartbeat=0.2, release=request.param) as cluster:
        yield cluster


def make_topic(cluster, topic: str, queues: int, message_type: str = "NORMAL", **kw) -> None:
    """A topic of ``message_type`` where the brokers keep types (5.1), else a plain one."""
    if cluster.options.at_least("5.1"):
        kw["message_type"] = message_type
    cluster.create_topic(topic, queues, **kw)


def v2_fields(group: str, topic: str, props: str = "", sys_flag: int = 0) -> dict:
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": str(sys_flag),
            "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false"}


def visible(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


# ------------------------------------------------------------------ the broker-name field


def test_only_a_single_v2_send_may_name_its_broker_in_n(proxied, unique_name):
    """AbstractRemotingActivity.java: SEND_MESSAGE_V2 reads ``n``; SEND_BATCH_MESSAGE (V2
    letters all the same) and SEND_MESSAGE read ``bname`` (capture seq 855-874, 27)."""
    topic = unique_name("Px51Field")
    make_topic(proxied, topic, 1, brokers=["broker-a"])
    batch = encode_batch([BatchEntry(b"one", ""), BatchEntry(b"two", "")])
    with RawClient(proxied.proxy_remoting_addr) as raw:
        def code(request_code, fields, body=b"x"):
            r = raw.request(request_code, fields, body)
            return (r.code, r.remark) if r.code else (r.code, r.fields.get("TRACE_ON"),
                                                      r.fields.get("MSG_REGION"))

        v2 = v2_fields("Px51PG", topic)
        refused = (ResponseCode.VERSION_NOT_SUPPORTED, NO_BNAME)
        ok = (ResponseCode.SUCCESS, "false", "")  # the decoration a 5.1.4 proxy writes
        assert code(RequestCode.SEND_MESSAGE_V2, {**v2, "bname": "broker-a"}) == refused
        assert code(RequestCode.SEND_MESSAGE_V2, v2) == refused
        assert code(RequestCode.SEND_MESSAGE_V2, {**v2, "n": "broker-a"}) == ok
        batch_v2 = {**v2, "m": "true"}
        assert code(RequestCode.SEND_BATCH_MESSAGE, {**batch_v2, "n": "broker-a"},
                    batch) == refused  # what Apache's 5.1.4 Java client sends
        assert code(RequestCode.SEND_BATCH_MESSAGE, {**batch_v2, "bname": "broker-a"},
                    batch) == ok
        assert code(RequestCode.SEND_BATCH_MESSAGE,
                    {**batch_v2, "n": "broker-a", "bname": "broker-a"}, batch) == ok
        v1 = {"producerGroup": "Px51PG", "topic": topic, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
              "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": "",
              "reconsumeTimes": "0", "unitMode": "false"}
        assert code(RequestCode.SEND_MESSAGE, v1) == refused
        assert code(RequestCode.SEND_MESSAGE, {**v1, "n": "broker-a"}) == refused
        assert code(RequestCode.SEND_MESSAGE, {**v1, "bname": "broker-a"}) == ok
    assert proxied.max_offset(topic, "broker-a", 0) == 6


def test_our_send_and_end_transaction_headers_name_the_broker_as_the_proxy_reads_it():
    single = send_command("broker-b", "G", "T", 1, b"x").fields
    batch = send_command("broker-b", "G", "T", 1, b"x", batch=True).fields
    v1 = send_command("broker-b", "G", "T", 1, b"x", use_v2=False).fields
    assert (single["n"], single["bname"]) == ("broker-b", "broker-b")
    assert (batch["n"], batch["bname"], batch["m"]) == ("broker-b", "broker-b", "true")
    assert v1["bname"] == "broker-b" and "n" not in v1
    handle = HalfHandle("broker-b", "127.0.0.1:1", "U", 3, 99, "T")
    assert end_transaction_command("G", handle, Outcome.COMMIT).fields["bname"] == "broker-b"
    # a check-back's answer names no broker, as Java's client's does not
    answer = end_transaction_command("G", handle._replace(broker_name=""), Outcome.COMMIT,
                                     from_check=True)
    assert "bname" not in answer.fields


def test_spliced_end_transactions_name_their_brokers_mixed_or_not(proxied, unique_name):
    """The spliced END_TRANSACTIONs (one template per run) carry each handle's broker name,
    and a handle without one gets no field; checked at a server that records the frames."""
    from rocketmq_spark.client.remoting import RemotingClient
    from rocketmq_spark.client.txn.transaction import end_transactions
    from rocketmq_spark.embedded.server import RemotingServer
    import asyncio
    import threading

    seen = []

    class Recorder:
        def handle(self, conn, cmd):
            seen.append(cmd)
            return None

        def connection_closed(self, conn):
            pass

    loop = asyncio.new_event_loop()
    server = RemotingServer("recorder", Recorder())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
    try:
        handles = [HalfHandle("broker-a", server.addr, "U0", 0, 10, "T0"),
                   HalfHandle("", server.addr, "U1", 1, 11, "T1"),
                   HalfHandle("broker-b", server.addr, "U2", 2, 12, "T2")]
        with RemotingClient() as remoting:
            assert end_transactions(remoting, "G", handles, Outcome.COMMIT) == 3
            wait_until(lambda: len(seen) == 3, 10, "three END_TRANSACTIONs")
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    names = {c.fields["msgId"]: c.fields.get("bname") for c in seen}
    assert names == {"U0": "broker-a", "U1": None, "U2": "broker-b"}


# ------------------------------------------------------------------ what the proxy refuses


def test_stats_requests_are_not_served_and_an_unknown_broker_answers_out_of_turn(
        proxied, unique_name):
    """RemotingProtocolServer.java registers no GET_TOPIC_STATS_INFO / GET_CONSUME_STATS
    (capture seq 943-946: 3 " request type N not supported", no extFields); a send naming a
    broker the name server does not know is answered TOPIC_NOT_EXIST under the proxy's own
    forward opaque, not the client's (capture seq 959/962)."""
    topic = unique_name("Px51Stats")
    make_topic(proxied, topic, 1, brokers=["broker-a"])
    with RawClient(proxied.proxy_remoting_addr, timeout=3) as raw:
        for request_code in (RequestCode.GET_TOPIC_STATS_INFO, RequestCode.GET_CONSUME_STATS):
            r = raw.request(request_code, {"topic": topic, "consumerGroup": "G"})
            assert (r.code, r.remark, r.ext_fields or None) == (
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request_code} not supported", None)
        pending = raw.send(RequestCode.SEND_MESSAGE_V2,
                           {**v2_fields("Px51PG", topic), "n": "broker-zz"}, b"x")
        wait_until(lambda: raw.stray_responses, 10, "the proxy's answer")
        stray = raw.stray_responses[0]
        assert stray.code == ResponseCode.TOPIC_NOT_EXIST
        assert "No topic route info in name server for the topic: broker-zz" in stray.remark
        assert not pending.done()  # the client's opaque is never answered


def test_sends_of_the_wrong_message_type_are_refused_by_the_5_1_proxy(proxied, unique_name):
    """SendMessageActivity.java (enableTopicMessageTypeCheck) as the capture shows it (seq
    875-894): 13 MESSAGE_ILLEGAL naming the topic's type and the message's, nothing forwarded;
    a topic the brokers do not hold is UNSPECIFIED. 4.9.8 brokers keep no types: unchecked."""
    if not proxied.options.at_least("5.1"):
        pytest.skip("topic message types are 5.x's")
    normal, tx = unique_name("Px51Normal"), unique_name("Px51TxType")
    make_topic(proxied, normal, 1, brokers=["broker-a"])
    make_topic(proxied, tx, 1, "TRANSACTION", brokers=["broker-a"])
    half = encode_properties({"TRAN_MSG": "true", "PGROUP": "Px51PG"})
    forwarded = proxied.proxy_remoting.forwarded
    with RawClient(proxied.proxy_remoting_addr) as raw:
        def remark(topic, props=""):
            r = raw.request(RequestCode.SEND_MESSAGE_V2,
                            {**v2_fields("Px51PG", topic, props), "n": "broker-a"}, b"x")
            assert r.code == ResponseCode.MESSAGE_ILLEGAL
            return r.remark

        prefix = "TopicMessageType validate failed, the expected type is "
        assert remark(tx) == prefix + "TRANSACTION, but actual type is NORMAL"
        assert remark(normal, half) == prefix + "NORMAL, but actual type is TRANSACTION"
        nowhere = unique_name("Px51Nowhere")
        assert remark(nowhere) == prefix + "UNSPECIFIED, but actual type is NORMAL"
    assert proxied.proxy_remoting.forwarded == forwarded


# ------------------------------------------------------------------ END_TRANSACTION


def test_a_first_phase_commit_is_dropped_and_the_check_back_settles_the_row(proxied,
                                                                           unique_name):
    """TransactionActivity.java / AbstractTransactionService.java, as the capture shows them
    (seq 700-766): the COMMIT is answered SUCCESS and reaches no broker; the broker's
    check-back comes through the proxy as a request with four fields to the connection that
    heartbeated for the group, and the answer to it commits the row."""
    topic, group = unique_name("Px51Tx"), unique_name("Px51TxG")
    make_topic(proxied, topic, 1, "TRANSACTION", brokers=["broker-a"])
    props = encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": "PX51UNIQ"})
    with RawClient(proxied.proxy_remoting_addr, timeout=10) as raw:
        heartbeat = json.dumps({"clientID": "px51@raw", "consumerDataSet": [],
                                "producerDataSet": [{"groupName": group}]}).encode()
        assert raw.request(RequestCode.HEART_BEAT, body=heartbeat).code == 0
        half = raw.request(RequestCode.SEND_MESSAGE_V2,
                           {**v2_fields(group, topic, props, 4), "n": "broker-a",
                            "bname": "broker-a"}, b"held")
        assert half.code == ResponseCode.SUCCESS
        commit = {"producerGroup": group, "tranStateTableOffset": half.fields["queueOffset"],
                  "commitLogOffset": str(int(half.fields["msgId"][-16:], 16)),
                  "commitOrRollback": "8", "fromTransactionCheck": "false",
                  "msgId": "PX51UNIQ", "transactionId": half.fields.get("transactionId")
                  or "PX51UNIQ", "bname": "broker-a"}
        answer = raw.request(END_TRANSACTION, commit)
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
        check = raw.wait_server_request(RequestCode.CHECK_TRANSACTION_STATE, timeout=30)
        assert check is not None, "no check-back came through the proxy"
        assert proxied.max_offset(topic, "broker-a", 0) == 0  # the COMMIT was dropped
        assert not check.is_oneway
        assert sorted(check.fields) == ["commitLogOffset", "msgId", "tranStateTableOffset",
                                        "transactionId"]
        raw.send(END_TRANSACTION, {
            "producerGroup": group, "tranStateTableOffset": check.fields["tranStateTableOffset"],
            "commitLogOffset": check.fields["commitLogOffset"], "commitOrRollback": "8",
            "fromTransactionCheck": "true", "msgId": check.fields["msgId"],
            "transactionId": check.fields["transactionId"]}, oneway=True)
        wait_until(lambda: proxied.max_offset(topic, "broker-a", 0) == 1, 10,
                   "the commit of the check-back's answer")


def test_check_back_answers_of_a_job_settled_through_the_proxy(proxied, unique_name):
    """The rules that keep each row once when the broker asks again about a re-stored copy
    (rocketmq_spark/sink/proxy_settle.py): COMMIT the first time, UNKNOWN while that COMMIT
    may still be on its way, COMMIT again once it must have been lost, ROLLBACK once the row
    is in its topic; ROLLBACK for an attempt Spark did not keep, UNKNOWN for another job."""
    from types import SimpleNamespace

    from rocketmq_spark.client.txn.transaction import CheckRequest
    from rocketmq_spark.sink.options import parse_sink_options
    from rocketmq_spark.sink.proxy_settle import ANSWER_GRACE_S, ProxySettlement

    topic = unique_name("Px51Rules")
    make_topic(proxied, topic, 1, "TRANSACTION", brokers=["broker-b"])
    now = [100.0]
    options = parse_sink_options({"nameServer": proxied.proxy_remoting_addr, "topic": topic,
                                  "deliveryGuarantee": "exactlyOnce"})
    row = HalfHandle("broker-b", proxied.proxy_remoting_addr, "ROW1", 7, 70, "ROW1")
    settlement = ProxySettlement(options, proxied.proxy_remoting_addr, "G", "job1", ["kept"],
                                 [row], clock=lambda: now[0])

    def ask(uniq="ROW1", token="kept", job="job1"):
        props = {"UNIQ_KEY": uniq, "SPARK_QUERY_ID": job, "SPARK_WRITE_TOKEN": token,
                 "REAL_TOPIC": topic, "REAL_QID": "0"}
        return settlement.decide(CheckRequest(proxied.proxy_remoting_addr, 9, 90, uniq, uniq,
                                              "", SimpleNamespace(properties=props)))

    try:
        assert ask(job="job2") is Outcome.UNKNOWN
        assert ask(token="failed-attempt") is Outcome.ROLLBACK
        assert ask() is Outcome.COMMIT
        now[0] += ANSWER_GRACE_S / 2
        assert ask() is Outcome.UNKNOWN          # the COMMIT may still be on its way
        now[0] += ANSWER_GRACE_S
        assert ask() is Outcome.COMMIT           # it was lost: the row is not stored
        proxied.append(topic, "broker-b", 0, [b"row"], properties={"UNIQ_KEY": "ROW1"})
        now[0] += 2 * ANSWER_GRACE_S
        assert ask() is Outcome.ROLLBACK         # stored: a copy must not be stored again
        assert settlement.settled() == 1
    finally:
        settlement.close()


# ------------------------------------------------------------------ the sink in Spark


def run_peer(*args, timeout=120):
    proc = subprocess.run([sys.executable, str(PEER), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_at_least_once_through_the_proxy_in_batches_read_back_by_the_cpp_client(
        spark, proxied, unique_name):
    """df.write through the proxy's remoting port: the sink's SEND_BATCH_MESSAGEs carry
    ``bname`` as well as ``n``, so the proxy forwards them; Apache's C++ PullConsumer reads
    every row back from the brokers themselves."""
    topic = unique_name("Px51Alo")
    make_topic(proxied, topic, 4)
    forwarded = proxied.proxy_remoting.forwarded
    (spark.range(1000).selectExpr("CAST(id AS STRING) AS body", "CAST(id AS STRING) AS keys")
     .repartition(3).write.mode("append").format("rocketmq")
     .option("nameServer", proxied.proxy_remoting_addr).option("topic", topic).save())
    assert proxied.proxy_remoting.forwarded - forwarded < 1000  # batches, not one per row
    got = run_peer("pull", "--namesrv", proxied.namesrv_addr, "--topic", topic, "--group",
                   unique_name("Px51CppG"))
    bodies = sorted(int(m["body"]) for m in got["messages"])
    assert bodies == list(range(1000))


@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_exactly_once_df_write_through_the_proxy_is_settled_by_check_back(
        spark, proxied, unique_name):
    """No END_TRANSACTION reaches a broker through the proxy: the job's commit registers its
    producer group there, answers the relayed check-backs and returns once every row is in
    its topic; each row once, as Apache's C++ PullConsumer reads them from the brokers."""
    topic = unique_name("Px51Eo")
    make_topic(proxied, topic, 4, "TRANSACTION")
    relayed = proxied.proxy_remoting.transactions.relayed
    (spark.range(600).selectExpr("CAST(id AS STRING) AS body").repartition(3)
     .write.mode("append").format("rocketmq")
     .option("nameServer", proxied.proxy_remoting_addr).option("topic", topic)
     .option("deliveryGuarantee", "exactlyOnce").save())
    assert visible(proxied, topic) == 600  # visible when df.write returns
    assert proxied.proxy_remoting.transactions.relayed - relayed >= 600
    got = run_peer("pull", "--namesrv", proxied.namesrv_addr, "--topic", topic, "--group",
                   unique_name("Px51CppEoG"))
    assert sorted(int(m["body"]) for m in got["messages"]) == list(range(600))
    wait_until(lambda: all(proxied.pending_transactions(b.name) == []
                           for b in proxied.brokers), 30, "no half message left pending")
    assert visible(proxied, topic) == 600  # the copies checked later were rolled back


def test_an_exactly_once_stream_through_the_proxy_is_refused_before_anything_is_sent(
        spark, proxied, unique_name, tmp_path):
    """A stream's recovery after a driver crash reads each broker's op topic by address,
    which the proxy hides: writeStream refuses on the driver, naming the address and what to
    do; nothing is sent."""
    topic = unique_name("Px51EoStream")
    make_topic(proxied, topic, 4, "TRANSACTION")
    forwarded = proxied.proxy_remoting.forwarded
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
              .selectExpr("CAST(value AS STRING) AS body").writeStream.format("rocketmq")
              .option("nameServer", proxied.proxy_remoting_addr).option("topic", topic)
              .option("deliveryGuarantee", "exactlyOnce")
              .option("checkpointLocation", str(tmp_path / "cp")))
    with pytest.raises(Exception) as refused:
        query = stream.start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    text = str(refused.value)
    assert "deliveryGuarantee=exactlyOnce" in text and proxied.proxy_remoting_addr in text
    assert "END_TRANSACTION" in text and "atLeastOnce" in text
    assert proxied.proxy_remoting.forwarded == forwarded
    assert visible(proxied, topic) == 0
