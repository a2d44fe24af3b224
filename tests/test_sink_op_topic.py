"""The op topic in both of its forms: one half offset a message (up to 5.0) and comma-joined
offsets written in batches (5.1+, ``TransactionalMessageServiceImpl.deletePrepareMessage`` and
``TransactionalOpBatchService`` at rocketmq-all-5.1.4), read by the exactly-once sink wherever it
decides by it: the restart's settling and the check-back's answer."""
from __future__ import annotations

import time
from collections import Counter

import pytest

from rocketmq_spark.client.broker import BrokerClient
from rocketmq_spark.client.errors import ResponseError
from rocketmq_spark.client.protocol.codes import ResponseCode
from rocketmq_spark.client.protocol.message import MessageExt, decode_messages
from rocketmq_spark.client.pull import PullRequest, PullStatus
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.txn.transaction import OP_TOPIC, CheckRequest, Outcome, end_transactions
from rocketmq_spark.embedded.op_batches import op_offsets
from rocketmq_spark.sink import exactly_once
from rocketmq_spark.sink.check_back import BATCH_PROPERTY, QUERY_PROPERTY, TOKEN_PROPERTY
from rocketmq_spark.client.txn.op_topic import OpTopicError, half_offsets
from test_sink_exactly_once import (
    QUERY, pull_bodies, record_of, recorded_then_killed, send_halves, visible,
)
from waiting import wait_until

RELEASES = ["4.9", "5.1"]


def op_messages(cluster, broker) -> list:
    """Every op message stored on ``broker``: (tag, body)."""
    found = []
    with RemotingClient() as remoting:
        brokers = BrokerClient(remoting)
        offset = 0
        while True:
            try:
                r = brokers.pull(broker.addr, PullRequest("op-peek", OP_TOPIC, 0, offset))
            except ResponseError as exc:
                assert exc.code == ResponseCode.TOPIC_NOT_EXIST
                return found  # no op message yet
            if r.status is not PullStatus.FOUND:
                return found
            found += [(m.tags, m.body) for m in decode_messages(r.body, verify_crc=False)]
            offset = r.next_begin_offset


@pytest.fixture(params=RELEASES)
def release_cluster(request, embedded_cluster_factory):
    return embedded_cluster_factory(brokers=1, release=request.param,
                                    transaction_check_interval=600,
                                    transaction_op_msg_max_size=256)


# ------------------------------------------------------------------------------ bodies


def test_both_body_forms_are_read():
    where = "op topic on broker X, op offset 7"
    assert half_offsets(b"17", "d", where) == [17]
    assert half_offsets(b"2,3,1,0,4,", "d", where) == [2, 3, 1, 0, 4]
    assert half_offsets(b"5,6", "d", where) == [5, 6]  # Java's split reads it too
    assert op_offsets(b"2,3,1,") == [2, 3, 1] and op_offsets(b"17") == [17]
    assert op_offsets(b"4,x,") == [4, -1]  # the broker's own reader: Long.parseLong or -1


@pytest.mark.parametrize("body", [b"", b",", b"abc", b"1,,2", b"1,x,", b"-1", b"1 ", b"\xff1",
                                  b"1;2"])
def test_a_body_in_neither_form_fails_naming_broker_and_offset(body):
    with pytest.raises(OpTopicError, match="broker X, op offset 7: op message body .* neither"):
        half_offsets(body, "d", "broker X, op offset 7")


def test_a_tag_other_than_d_fails():
    with pytest.raises(OpTopicError, match="tag 'x', not 'd'"):
        half_offsets(b"1", "x", "broker X, op offset 7")


# ------------------------------------------------------------------------------ brokers


def test_each_release_writes_its_own_op_form(release_cluster, unique_name):
    cluster = release_cluster
    topic = unique_name("OpForm")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(400), group="op-form")
    handles = record_of(summary, 0, "op-form").handles
    five = cluster.options.at_least("5.1")
    b = cluster.brokers[0]
    mine = sorted(h.queue_offset for h in handles)
    with RemotingClient() as remoting:  # open until the broker has taken every oneway
        end_transactions(remoting, "op-form", handles, Outcome.COMMIT)
        wait_until(lambda: sorted(o for _, body in op_messages(cluster, b)
                                  for o in op_offsets(body)) == mine, 10,
                   f"the op entries of {b.name}")
    ops = op_messages(cluster, b)
    assert {tag for tag, _ in ops} == {"d"}
    if five:  # batches of comma-terminated offsets, each up to the size and one entry more
        assert 5 <= len(ops) < len(mine) / 10
        assert all(body.endswith(b",") and body.count(b",") > 1 for _, body in ops)
        assert max(len(body) for _, body in ops) < 256 + len("399,")
    else:     # one message per END_TRANSACTION, the bare offset
        assert all(body.isdigit() for _, body in ops) and len(ops) == len(mine)


def test_settled_reads_the_comma_form(embedded_cluster_factory, unique_name):
    """The reader of 4.x bodies saw nothing in a 5.1 op topic: every settled half looked
    unsettled."""
    cluster = embedded_cluster_factory(brokers=1, release="5.1", transaction_check_interval=600,
                                       transaction_op_batch_interval=0.2)
    topic = unique_name("OpRead")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(50), group="op-read")
    handles = record_of(summary, 0, "op-read").handles
    with RemotingClient() as remoting:
        end_transactions(remoting, "op-read", handles[:30], Outcome.COMMIT)
        end_transactions(remoting, "op-read", handles[30:40], Outcome.ROLLBACK)
        ops = exactly_once.OpTopic(remoting)
        address = cluster.brokers[0].addr
        want = {h.queue_offset for h in handles[:40]}
        wait_until(lambda: ops.settled(address, 0) >= want, 10, "40 halves settled")
        assert ops.settled(address, 0) == want


def test_an_unreadable_op_body_fails_loudly(embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=1, release="5.1")
    broker = cluster.brokers[0]
    cluster.append(OP_TOPIC, broker.name, 0, [b"3,4,"], tags="d")
    cluster.append(OP_TOPIC, broker.name, 0, [b"3;4"], tags="d")
    with RemotingClient() as remoting:
        ops = exactly_once.OpTopic(remoting)
        with pytest.raises(OpTopicError, match=rf"RMQ_SYS_TRANS_OP_HALF_TOPIC on the broker at "
                           rf"{broker.addr}, op offset 1: op message body b'3;4'"):
            ops.settled(broker.addr, 0)


# ------------------------------------------------------------------------------ decisions


def test_restart_settles_without_a_second_commit_while_ops_are_still_buffered(
        embedded_cluster_factory, unique_name, tmp_path):
    """A driver killed after its record, with 120 of its 300 END_TRANSACTIONs sent, on a 5.1
    broker that holds their op entries for up to 3 s: settling at once commits exactly the
    other 180 (it reads the op topic again after the batch interval)."""
    cluster = embedded_cluster_factory(brokers=2, release="5.1", transaction_check_interval=600)
    topic = unique_name("OpSettle")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(300), group="op-settle")
    log = recorded_then_killed(
        summary, 7, "op-settle", tmp_path, ended=120,
        before_close=lambda: wait_until(lambda: visible(cluster, topic) == 120, 10,
                                        "120 rows committed"))
    with RemotingClient() as remoting:  # the next run, at once
        sent = exactly_once.settle(log, remoting, exactly_once.OpTopic(remoting))
    assert sent == 180
    wait_until(lambda: sum(pull_bodies(cluster, topic).values()) >= 300, 10, "300 rows")
    time.sleep(0.5)
    assert pull_bodies(cluster, topic) == Counter(str(i) for i in range(300))
    assert log.pending() == []


def test_check_back_about_a_copy_of_a_settled_half_is_rolled_back(embedded_cluster_factory,
                                                                   unique_name, tmp_path):
    """A broker asking about a re-stored copy of a half message our COMMIT settled: the
    answer is ROLLBACK only if the comma form is read (else COMMIT stores the row twice)."""
    cluster = embedded_cluster_factory(brokers=1, release="5.1", transaction_check_interval=600,
                                       transaction_op_batch_interval=0.2)
    topic = unique_name("OpCheck")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(20), group="op-check")
    record = record_of(summary, 3, "op-check")
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    with RemotingClient() as remoting:
        exactly_once.commit_batch(log, remoting, exactly_once.OpTopic(remoting), record)
        ops = exactly_once.OpTopic(remoting)
        original = record.handles[5]
        wait_until(lambda: original.queue_offset in ops.settled(original.address, 0), 10,
                   "the op entry written")
        copy = CheckRequest(original.address, 999, 123456, original.uniq_key,
                            original.uniq_key, "", MessageExt(
                                topic, 0, 999, b"", {QUERY_PROPERTY: QUERY,
                                                     BATCH_PROPERTY: "3",
                                                     TOKEN_PROPERTY: summary.token,
                                                     "UNIQ_KEY": original.uniq_key}))
        later = time.time() + 2 * exactly_once.END_GRACE_SECONDS
        assert exactly_once.decide(log, QUERY, ops, copy, now=later) is Outcome.ROLLBACK


def test_a_row_committed_by_check_back_is_committed_once(embedded_cluster_factory, unique_name,
                                                         tmp_path):
    """A row whose END_TRANSACTION was lost: the first check-back about it is answered COMMIT;
    a 5.1 broker that asks about a newer copy before the op entry of that COMMIT is written
    (up to 3 s later) gets UNKNOWN, then ROLLBACK once the entry shows. Answering COMMIT again
    stored the row twice (seen in the 5.1 kill test)."""
    cluster = embedded_cluster_factory(brokers=1, release="5.1", transaction_check_interval=600)
    topic = unique_name("OpOnce")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(5), group="op-once")
    record = record_of(summary, 4, "op-once")
    log = exactly_once.CommitLog(str(tmp_path / "rocketmq-sink"))
    log.record_commit(record)
    log.mark_ended(4)  # its END_TRANSACTIONs "sent", none arrived
    lost = record.handles[2]
    broker = cluster.brokers[0]

    def copy(offset: int) -> CheckRequest:
        return CheckRequest(lost.address, offset, 5000 + offset, lost.uniq_key, lost.uniq_key,
                            "", MessageExt(topic, 0, offset, b"", {
                                QUERY_PROPERTY: QUERY, BATCH_PROPERTY: "4",
                                TOKEN_PROPERTY: summary.token, "UNIQ_KEY": lost.uniq_key}))

    later = time.time() + 2 * exactly_once.END_GRACE_SECONDS
    with RemotingClient() as remoting:
        ops = exactly_once.OpTopic(remoting)
        assert exactly_once.decide(log, QUERY, ops, copy(900), now=later) is Outcome.COMMIT
        assert exactly_once.decide(log, QUERY, ops, copy(901), now=later) is Outcome.UNKNOWN
        cluster.append(OP_TOPIC, broker.name, 0, [b"17,900,18,"], tags="d")  # the batch lands
        assert exactly_once.decide(log, QUERY, ops, copy(902), now=later) is Outcome.ROLLBACK
        other = record.handles[3]  # another row is answered on its own
        assert exactly_once.decide(log, QUERY, ops, CheckRequest(
            other.address, 903, 9903, other.uniq_key, other.uniq_key, "", MessageExt(
                topic, 0, 903, b"", {QUERY_PROPERTY: QUERY, BATCH_PROPERTY: "4",
                                     TOKEN_PROPERTY: summary.token,
                                     "UNIQ_KEY": other.uniq_key})), now=later) is Outcome.COMMIT
