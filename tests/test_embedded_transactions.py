"""Transactional (half) messages on the embedded broker, over real sockets.

Frames are built with the protocol layer's codec (tests/raw_client.py), not through the sink,
so these tests pin the broker's side of the contract: what a 4.9.8 broker does with a half
message, END_TRANSACTION and its check-back (apache/rocketmq rocketmq-all-4.9.8:
SendMessageProcessor, TransactionalMessageBridge, EndTransactionProcessor,
TransactionalMessageServiceImpl, AbstractTransactionalMessageCheckListener).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_spark.client.protocol.message import (
    BatchEntry, decode_message, decode_messages, encode_batch, parse_offset_msg_id,
)
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.embedded.__main__ import _parse_args
from rocketmq_spark.embedded.options import ServerOptions
from raw_client import RawClient
from waiting import wait_until

SEND_V2, SEND_BATCH, PULL, HEART_BEAT, UNREGISTER = 310, 320, 11, 34, 35
END_TRANSACTION, CHECK_TRANSACTION_STATE, GET_MAX_OFFSET = 37, 39, 30
HALF, OP, MAX_TIME = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", \
    "TRANS_CHECK_MAX_TIME_TOPIC"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
GROUP = "PG_TXN"
CPP_PEER = Path(__file__).resolve().parent / "cpp_peer.py"
TOPIC = "TxnTopic"


# ------------------------------------------------------------------------------------ helpers


def send_half(client, body: bytes, queue_id: int = 1, topic: str = TOPIC, group: str = GROUP,
              uniq: str = "", tags: str = "", flag: int = 0, extra: str = ""):
    """A prepared message as DefaultMQProducerImpl.sendMessageInTransaction sends it."""
    uniq = uniq or f"UNIQ{time.monotonic_ns():024X}"[:32]
    props = (f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02UNIQ_KEY\x01{uniq}\x02"
             + (f"TAGS\x01{tags}\x02" if tags else "") + extra + "WAIT\x01true\x02")
    fields = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "4",
              "g": str(int(time.time() * 1000)), "h": str(flag), "i": props, "j": "0",
              "k": "false", "m": "false"}
    resp = client.request(SEND_V2, fields, body)
    assert resp.code == 0, resp.remark
    f = resp.fields
    return {"queueOffset": int(f["queueOffset"]), "msgId": f["msgId"],
            "commitLogOffset": parse_offset_msg_id(f["msgId"])[1], "uniq": uniq,
            "queueId": int(f["queueId"])}


def end_fields(handle, kind: int, group: str = GROUP, from_check: bool = False):
    return {"producerGroup": group, "tranStateTableOffset": str(handle["queueOffset"]),
            "commitLogOffset": str(handle["commitLogOffset"]), "commitOrRollback": str(kind),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": handle["uniq"], "transactionId": handle["uniq"]}


def end(client, handle, kind: int, **kwargs) -> None:
    """END_TRANSACTION as the Java client sends it: oneway, no answer."""
    client.send(END_TRANSACTION, end_fields(handle, kind, **kwargs), oneway=True)


def pull(client, topic: str, queue_id: int = 0, offset: int = 0):
    fields = {"consumerGroup": "G_READ", "topic": topic, "queueId": str(queue_id),
              "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": "4",
              "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0",
              "subscription": "*"}
    resp = client.request(PULL, fields)
    return decode_messages(resp.body, decompress=False) if resp.code == 0 else []


def register_producer(client, group: str = GROUP, client_id: str = "127.0.0.1@txn") -> None:
    body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": group}],
                       "consumerDataSet": []}).encode()
    assert client.request(HEART_BEAT, {}, body).code == 0


def checks(client):
    return [c for c in client.server_requests if c.code == CHECK_TRANSACTION_STATE]


def answer(client, check, kind: int, group: str = GROUP) -> None:
    """END_TRANSACTION answering a check-back (ClientRemotingProcessor.checkTransactionState)."""
    f = check.fields
    client.send(END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": f["tranStateTableOffset"],
        "commitLogOffset": f["commitLogOffset"], "commitOrRollback": str(kind),
        "fromTransactionCheck": "true", "msgId": f["msgId"],
        "transactionId": f["transactionId"]}, oneway=True)


@pytest.fixture
def cluster(embedded_cluster_factory):
    """One broker whose check service is fast: checks every 0.3 s, after 0.2 s, 3 at most."""
    c = embedded_cluster_factory(brokers=1, transaction_check_interval=0.3,
                                 transaction_timeout=0.2, transaction_check_max=3)
    c.create_topic(TOPIC, 4)
    return c


@pytest.fixture
def quiet_cluster(embedded_cluster_factory):
    """One broker whose check service never runs on its own during a test (genuine timeout)."""
    c = embedded_cluster_factory(brokers=1, transaction_check_interval=3600)
    c.create_topic(TOPIC, 4)
    return c


@pytest.fixture
def broker(cluster):
    with RawClient(cluster.brokers[0].addr) as client:
        yield client


@pytest.fixture
def quiet(quiet_cluster):
    with RawClient(quiet_cluster.brokers[0].addr) as client:
        yield client


# ------------------------------------------------------------------------------------ half


def test_half_message_is_stored_in_the_half_topic_and_invisible(quiet_cluster, quiet):
    handle = send_half(quiet, b"payload-1", queue_id=2, tags="TagA", flag=7)
    assert handle["queueId"] == 2 and handle["queueOffset"] == 0
    assert pull(quiet, TOPIC, 2) == []
    assert quiet_cluster.max_offset(TOPIC, "broker-a", 2) == 0
    [half] = pull(quiet, HALF, 0)
    assert half.topic == HALF and half.queue_id == 0 and half.queue_offset == 0
    assert half.physical_offset == handle["commitLogOffset"]
    assert half.sys_flag & 0xC == 0  # parseHalfMessageInner resets the transaction type
    assert half.flag == 7 and half.body == b"payload-1"
    p = half.properties
    assert (p["REAL_TOPIC"], p["REAL_QID"], p["TRAN_MSG"], p["PGROUP"]) == \
        (TOPIC, "2", "true", GROUP)
    assert p["UNIQ_KEY"] == handle["uniq"] and p["TAGS"] == "TagA"
    assert p["WAIT"] == "true" and p["CLUSTER"] == "DefaultCluster"  # re-serialized with WAIT
    assert quiet_cluster.pending_transactions() == [0]


def test_tran_msg_decides_not_the_sys_flag(quiet_cluster, quiet):
    """TRAN_MSG=false with sysFlag PREPARED: the genuine broker stores it as a normal message."""
    fields = {"a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
              "g": str(int(time.time() * 1000)), "h": "0",
              "i": "TRAN_MSG\x01false\x02WAIT\x01true\x02", "j": "0", "k": "false"}
    assert quiet.request(SEND_V2, fields, b"plain").code == 0
    assert [m.body for m in pull(quiet, TOPIC, 0)] == [b"plain"]
    assert quiet_cluster.pending_transactions() == []


def test_batch_of_half_messages_is_refused(quiet_cluster, quiet):
    """CommitLog.putMessages refuses a batch with transaction bits: MESSAGE_ILLEGAL."""
    entries = [BatchEntry(b"b%d" % i, f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02")
               for i in range(3)]
    fields = {"a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "4",
              "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
              "m": "true"}
    resp = quiet.request(SEND_BATCH, fields, encode_batch(entries))
    assert resp.code == 13
    assert "message is illegal" in resp.remark
    assert pull(quiet, TOPIC, 0) == [] and pull(quiet, HALF, 0) == []


# ------------------------------------------------------------------------ END_TRANSACTION


def test_commit_delivers_the_message_once_with_the_genuine_fields(quiet_cluster, quiet):
    handle = send_half(quiet, b"commit-me", queue_id=1, tags="TagA", flag=3)
    other = send_half(quiet, b"still-pending", queue_id=1)
    end(quiet, handle, COMMIT)
    [msg] = wait_until(lambda: pull(quiet, TOPIC, 1), 5, "the committed message")
    assert msg.body == b"commit-me" and msg.flag == 3 and msg.queue_offset == 0
    assert msg.sys_flag & 0xC == 8  # TRANSACTION_COMMIT_TYPE
    assert msg.prepared_transaction_offset == handle["commitLogOffset"]
    p = msg.properties
    # endMessageTransaction serializes the properties before clearing REAL_*: they stay
    assert p["TRAN_MSG"] == "true" and p["PGROUP"] == GROUP and p["REAL_TOPIC"] == TOPIC
    assert p["UNIQ_KEY"] == handle["uniq"] and p["TAGS"] == "TagA"
    [op] = pull(quiet, OP, 0)
    assert op.tags == "d" and op.body == b"0"
    assert quiet_cluster.pending_transactions() == [other["queueOffset"]]
    # the tag filter sees the committed message's tag
    time.sleep(0.1)
    assert len(pull(quiet, TOPIC, 1)) == 1


def test_rollback_writes_only_the_op_message(quiet_cluster, quiet):
    handle = send_half(quiet, b"roll-me-back", queue_id=0)
    end(quiet, handle, ROLLBACK)
    [op] = wait_until(lambda: pull(quiet, OP, 0), 5, "the op message")
    assert op.body == str(handle["queueOffset"]).encode()
    assert pull(quiet, TOPIC, 0) == []
    assert quiet_cluster.pending_transactions() == []
    assert quiet_cluster.check_transactions() == 0


def test_a_second_commit_stores_the_message_again(quiet_cluster, quiet):
    """The genuine broker keeps no record of ended half messages: COMMIT twice, two copies.
    (Which is why the sink must never send a blind second COMMIT.)"""
    handle = send_half(quiet, b"twice", queue_id=3)
    end(quiet, handle, COMMIT)
    end(quiet, handle, COMMIT)
    msgs = wait_until(lambda: len(pull(quiet, TOPIC, 3)) == 2 and pull(quiet, TOPIC, 3),
                    timeout=5, what="two copies")
    assert [m.body for m in msgs] == [b"twice", b"twice"]
    assert [m.queue_offset for m in msgs] == [0, 1]


def test_end_transaction_answers_when_not_sent_oneway(quiet_cluster, quiet):
    handle = send_half(quiet, b"x", queue_id=0)
    wrong_group = dict(end_fields(handle, COMMIT), producerGroup="OTHER")
    assert quiet.request(END_TRANSACTION, wrong_group).remark == "The producer group wrong"
    wrong_offset = dict(end_fields(handle, COMMIT), tranStateTableOffset="5")
    assert quiet.request(END_TRANSACTION, wrong_offset).remark == \
        "The transaction state table offset wrong"
    nowhere = dict(end_fields(handle, COMMIT), commitLogOffset="12345")
    resp = quiet.request(END_TRANSACTION, nowhere)
    assert (resp.code, resp.remark) == (1, "Find prepared transaction message failed")
    bad_kind = quiet.request(END_TRANSACTION, end_fields(handle, 5))
    assert bad_kind.code == 1 and "commitOrRollback" in bad_kind.remark
    missing = {k: v for k, v in end_fields(handle, COMMIT).items() if k != "msgId"}
    assert "<msgId>" in quiet.request(END_TRANSACTION, missing).remark
    with pytest.raises(TimeoutError):  # UNKNOWN: the genuine processor answers nothing
        quiet.request(END_TRANSACTION, end_fields(handle, UNKNOWN), timeout=0.5)
    assert pull(quiet, TOPIC, 0) == [] and quiet_cluster.pending_transactions() == [0]
    ok = quiet.request(END_TRANSACTION, end_fields(handle, COMMIT))
    assert (ok.code, ok.ext_fields) == (0, None)
    assert [m.body for m in pull(quiet, TOPIC, 0)] == [b"x"]


# ------------------------------------------------------------------------------------ check-back


def test_check_back_goes_to_the_registered_producer_with_the_genuine_header(cluster, broker):
    with RawClient(cluster.brokers[0].addr) as producer, \
            RawClient(cluster.brokers[0].addr) as bystander:
        register_producer(producer)
        register_producer(bystander, group="SOME_OTHER_GROUP", client_id="127.0.0.1@other")
        handle = send_half(broker, b"ask-me", queue_id=2, flag=9)
        check = producer.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5)
        assert check is not None and check.is_oneway
        f = check.fields
        # the half message was stored again (counted) and the check names the copy
        copy_offset = int(f["tranStateTableOffset"])
        assert copy_offset == handle["queueOffset"] + 1
        assert f["msgId"] == f["transactionId"] == handle["uniq"]
        assert parse_offset_msg_id(f["offsetMsgId"]) == (cluster.brokers[0].addr,
                                                         int(f["commitLogOffset"]))
        msg, _ = decode_message(check.body)
        assert (msg.topic, msg.queue_id, msg.body, msg.flag) == (TOPIC, 2, b"ask-me", 9)
        assert msg.queue_offset == copy_offset
        assert msg.physical_offset == int(f["commitLogOffset"])
        assert msg.properties["TRANSACTION_CHECK_TIMES"] == "1"
        assert msg.properties["PGROUP"] == GROUP
        [_, copy] = pull(broker, HALF, 0)
        assert copy.physical_offset == int(f["commitLogOffset"])
        assert copy.properties["TRANSACTION_CHECK_TIMES"] == "1"
        answer(producer, check, COMMIT)
        [real] = wait_until(lambda: pull(broker, TOPIC, 2), 5, "the committed message")
        assert real.body == b"ask-me" and real.sys_flag & 0xC == 8
        assert real.prepared_transaction_offset == int(f["commitLogOffset"])
        time.sleep(1.0)  # three more passes: settled, so no more checks and no second copy
        assert len(checks(producer)) == 1 and checks(bystander) == []
        assert len(pull(broker, TOPIC, 2)) == 1
        assert cluster.pending_transactions() == []


def test_check_back_answered_rollback_is_never_delivered(cluster, broker):
    with RawClient(cluster.brokers[0].addr) as producer:
        register_producer(producer)
        send_half(broker, b"no", queue_id=0)
        check = producer.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5)
        answer(producer, check, ROLLBACK)
        wait_until(lambda: cluster.pending_transactions() == [], 5, "the rollback")
        time.sleep(0.8)
        assert len(checks(producer)) == 1
        assert pull(broker, TOPIC, 0) == []


def test_unknown_answers_are_checked_again_then_discarded_after_the_max(cluster, broker):
    with RawClient(cluster.brokers[0].addr) as producer:
        register_producer(producer)
        send_half(broker, b"undecided", queue_id=1)
        seen = []

        def discarded_after_unknowns() -> bool:
            for check in checks(producer)[len(seen):]:
                seen.append(check)
                answer(producer, check, UNKNOWN)
            return cluster.transaction_stats()["discarded"] > 0

        wait_until(discarded_after_unknowns, 10,
                   "the half message discarded after UNKNOWN answers", interval=0.02)
        seen = wait_until(lambda: len(checks(producer)) >= 3 and checks(producer),
                        timeout=5, what="three checks")  # the last may still be on its way
        times = [decode_message(c.body)[0].properties["TRANSACTION_CHECK_TIMES"] for c in seen]
        assert times == ["1", "2", "3"]  # transaction_check_max=3, then discarded
        [dead] = pull(broker, MAX_TIME, 0)
        assert dead.body == b"undecided" and dead.properties["REAL_TOPIC"] == TOPIC
        time.sleep(0.8)
        assert len(checks(producer)) == 3
        assert pull(broker, TOPIC, 1) == []
        assert cluster.pending_transactions() == []


def test_without_a_producer_half_messages_are_counted_and_discarded():
    """Nobody to ask: every pass still stores a counted copy, so the message is gone after
    max passes (what a query down for longer than interval x max loses)."""
    cluster = EmbeddedCluster(brokers=1, transaction_check_interval=3600,
                              transaction_timeout=0, transaction_check_max=2)
    with cluster:
        cluster.create_topic(TOPIC, 4)
        with RawClient(cluster.brokers[0].addr) as client:
            send_half(client, b"orphan", queue_id=0)
            time.sleep(0.01)
            counts = []
            for _ in range(4):
                counts.append(cluster.check_transactions())
                time.sleep(0.01)
            assert counts == [1, 1, 0, 0]  # checked twice (copies counted 1, 2), then dropped
            assert cluster.transaction_stats() == {"checks_sent": 0, "discarded": 1}
            times = [m.properties.get("TRANSACTION_CHECK_TIMES") for m in pull(client, HALF)]
            assert times == [None, "1", "2"]
            assert [m.body for m in pull(client, MAX_TIME, 0)] == [b"orphan"]
            assert pull(client, TOPIC, 0) == []


def test_half_messages_younger_than_the_timeout_are_not_checked():
    with EmbeddedCluster(brokers=1, transaction_check_interval=3600,
                         transaction_timeout=1.0) as cluster:
        cluster.create_topic(TOPIC, 4)
        with RawClient(cluster.brokers[0].addr) as client:
            register_producer(client)
            send_half(client, b"young", queue_id=0)
            time.sleep(0.05)
            assert cluster.check_transactions() == 0  # born 50 ms ago: not yet
            time.sleep(1.0)
            assert cluster.check_transactions() == 1
            assert client.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5) is not None


def test_a_closed_or_unregistered_producer_is_not_asked(cluster, broker):
    with RawClient(cluster.brokers[0].addr) as gone:
        register_producer(gone, client_id="127.0.0.1@gone")
    with RawClient(cluster.brokers[0].addr) as left:
        register_producer(left, client_id="127.0.0.1@left")
        assert left.request(UNREGISTER, {"clientID": "127.0.0.1@left",
                                         "producerGroup": GROUP}).code == 0
        with RawClient(cluster.brokers[0].addr) as live:
            register_producer(live, client_id="127.0.0.1@live")
            send_half(broker, b"who", queue_id=0)
            check = live.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5)
            assert check is not None and checks(left) == []
            answer(live, check, COMMIT)
            wait_until(lambda: pull(broker, TOPIC, 0), 5, "the committed message")


def test_dropped_end_transaction_is_settled_by_the_check_back(cluster, broker):
    """The fault kind "drop": END_TRANSACTION is read and ignored; the check-back settles it."""
    with RawClient(cluster.brokers[0].addr) as producer:
        register_producer(producer)
        cluster.drop_next(1, request_codes=[END_TRANSACTION])
        handle = send_half(broker, b"lost-commit", queue_id=3)
        end(producer, handle, COMMIT)
        check = producer.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5)
        assert check is not None, "the dropped END_TRANSACTION was not checked back"
        assert pull(broker, TOPIC, 3) == []
        assert int(check.fields["tranStateTableOffset"]) > handle["queueOffset"]
        answer(producer, check, COMMIT)
        [msg] = wait_until(lambda: pull(broker, TOPIC, 3), 5, "the settled message")
        assert msg.body == b"lost-commit"
        time.sleep(0.8)
        assert len(pull(broker, TOPIC, 3)) == 1 and len(checks(producer)) == 1


def test_drop_fault_gives_no_answer_to_a_two_way_request(quiet_cluster, quiet):
    quiet_cluster.drop_next(1, request_codes=[GET_MAX_OFFSET])
    fields = {"topic": TOPIC, "queueId": "0"}
    with pytest.raises(TimeoutError):
        quiet.request(GET_MAX_OFFSET, fields, timeout=0.5)
    assert quiet.request(GET_MAX_OFFSET, fields).code == 0


def test_pending_half_messages_and_check_counts_survive_a_restart(tmp_path):
    opts = dict(brokers=1, data_dir=tmp_path, transaction_check_interval=3600,
                transaction_timeout=0, transaction_check_max=15)
    with EmbeddedCluster(**opts) as cluster:
        cluster.create_topic(TOPIC, 4)
        with RawClient(cluster.brokers[0].addr) as client:
            send_half(client, b"kept", queue_id=0)
            time.sleep(0.01)
            cluster.check_transactions()
            assert cluster.pending_transactions() == [1]
    with EmbeddedCluster(**opts) as cluster:
        assert cluster.pending_transactions() == [1]
        with RawClient(cluster.brokers[0].addr) as producer:
            register_producer(producer)
            time.sleep(0.01)
            assert cluster.check_transactions() == 1
            check = producer.wait_server_request(CHECK_TRANSACTION_STATE, timeout=5)
            assert decode_message(check.body)[0].properties["TRANSACTION_CHECK_TIMES"] == "2"
            answer(producer, check, COMMIT)
            [msg] = wait_until(lambda: pull(producer, TOPIC, 0), 5, "the committed message")
            assert msg.body == b"kept"


# ------------------------------------------------------------------------------------ peer


@pytest.mark.cpp
@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")
def test_cpp_push_consumer_sees_only_committed_messages(quiet_cluster, quiet):
    """Apache's C++ PushConsumer (a client we did not write) on the real topic: committed
    messages arrive once, with their properties; half and rolled-back ones never."""
    handles = [send_half(quiet, f"txn-{i}".encode(), queue_id=i % 4, tags="T")
               for i in range(8)]
    for i in (0, 1, 2, 4, 5, 6):
        end(quiet, handles[i], COMMIT)
    end(quiet, handles[3], ROLLBACK)  # and 7 stays pending
    committed = sorted(f"txn-{i}" for i in (0, 1, 2, 4, 5, 6))
    wait_until(lambda: sum(len(pull(quiet, TOPIC, q)) for q in range(4)) == 6, 5, "commits")
    proc = subprocess.run(
        [sys.executable, str(CPP_PEER), "push", "--namesrv", quiet_cluster.namesrv_addr,
         "--topic", TOPIC, "--group", "CppTxnG", "--expect", "6", "--timeout", "30",
         "--linger", "1.5", "--props", "TRAN_MSG,PGROUP"],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])["messages"]
    assert sorted(m["body"] for m in got) == committed
    assert all(m["properties"] == {"TRAN_MSG": "true", "PGROUP": GROUP} for m in got)
    assert quiet_cluster.pending_transactions() == [7]


# ------------------------------------------------------------------------------------ settings


def test_defaults_are_a_genuine_4x_brokers_and_bad_values_are_refused():
    opts = ServerOptions()
    assert (opts.transaction_check_interval, opts.transaction_timeout,
            opts.transaction_check_max) == (60.0, 6.0, 15)
    with pytest.raises(ValueError, match="transaction_check_max"):
        ServerOptions(transaction_check_max=0)
    with pytest.raises(ValueError, match="transaction_check_interval"):
        ServerOptions(transaction_check_interval=0)
    args = _parse_args(["--transaction-check-interval", "5", "--transaction-timeout", "1",
                        "--transaction-check-max", "4"])
    assert (args.transaction_check_interval, args.transaction_timeout,
            args.transaction_check_max) == (5.0, 1.0, 4)
