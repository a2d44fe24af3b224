"""The embedded slave's rules that the genuine capture does not show, read from 4.9.8's source:
HA replication (asynchronous, stops with the master), SlaveSynchronize (topic configs and
consumer offsets), the suggestWhichBrokerId of PullMessageProcessor with slaveReadEnable, and
what a slave refuses. Real sockets, hand-built frames.
"""
from __future__ import annotations

import json

import pytest

from raw_client import RawClient
from rocketmq_spark.client.protocol.message import decode_messages
from rocketmq_spark.client.protocol.route import ClusterInfo, TopicRouteData
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.embedded.subscription_groups import SubscriptionGroupConfig
from waiting import wait_until

PULL, QUERY_OFFSET, UPDATE_OFFSET, CREATE_TOPIC, END_TRANSACTION = 11, 14, 15, 17, 37
LOCK_BATCH_MQ, ROUTE, CLUSTER_INFO = 41, 105, 106


def pull_fields(topic, queue_id=0, offset=0, max_nums=32, sys_flag=4, commit=0, suspend=0):
    return {"consumerGroup": "G", "topic": topic, "queueId": str(queue_id),
            "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
            "commitOffset": str(commit), "suspendTimeoutMillis": str(suspend),
            "subscription": "*", "subVersion": "0", "expressionType": "TAG"}


def offset_fields(group, topic, queue_id, commit=None):
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)}
    if commit is not None:
        fields["commitOffset"] = str(commit)
    return fields


# ------------------------------------------------------------------ HA replication


def test_replication_catches_up_and_stops_with_the_master():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("T", 2)
        slave = c.slave("broker-a", 1)
        slave.stop()
        c.append("T", "broker-a", 0, [b"a%d" % i for i in range(100)])
        c.append("T", "broker-a", 1, [b"b"] * 7)
        assert c.replication_lag("broker-a", 1) == 107  # a stopped slave copies nothing
        slave.start()
        c.wait_replicated()
        assert c.node_max_offset("T", "broker-a", 0, 1) == 100
        assert c.node_max_offset("T", "broker-a", 1, 1) == 7
        c.broker("broker-a").stop()  # a master that is down sends nothing more
        c.append("T", "broker-a", 0, [b"late"])
        replication = c._slaves["broker-a"][0].replication
        assert c._call(replication.run_once) == 0  # a round copies nothing
        c.wait_replicated()  # nor is there anything to wait for
        assert c.replication_lag("broker-a", 1) == 1
        assert c.node_max_offset("T", "broker-a", 0, 1) == 100
        c.broker("broker-a").start()
        c.wait_replicated()
        assert c.node_max_offset("T", "broker-a", 0, 1) == 101


def test_a_round_copies_about_a_mebibyte_in_commit_log_order():
    """Replication rounds are capped (the loop stays responsive); each copies the oldest
    records first, so every queue on the slave is a gapless prefix of the master's."""
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("T", 3)
        c.slave("broker-a", 1).stop()  # its own rounds stop: this test runs them
        for i in range(1000):
            c.append("T", "broker-a", i % 3, [b"%04d" % i + b"x" * 1000])
        replication = c._slaves["broker-a"][0].replication
        first = c._call(replication.run_once)
        assert 900 < first < 1000 and replication.more
        assert [c.node_max_offset("T", "broker-a", q, 1) for q in range(3)] == \
            [len(range(q, first, 3)) for q in range(3)]  # the oldest ``first`` messages
        assert c._call(replication.run_once) == 1000 - first and not replication.more
        assert c.replication_lag("broker-a", 1) == 0


def test_a_pull_parked_on_the_slave_wakes_when_the_copy_arrives():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("T", 1)
        client = RawClient(c.slave("broker-a", 1).addr)
        parked = client.send(PULL, pull_fields("T", sys_flag=4 | 2, suspend=20000))
        wait_until(lambda: c._call(lambda: len(c._slaves["broker-a"][0].long_poll)), 5,
                   "the pull parked on the slave")
        c.append("T", "broker-a", 0, [b"wake"])
        answer = parked.result(10)
        assert answer.code == 0 and answer.remark == "FOUND"
        assert [m.body for m in decode_messages(answer.body)] == [b"wake"]


# ------------------------------------------------------------------ SlaveSynchronize


def test_slave_synchronize_copies_topics_and_offsets():
    """SlaveSynchronize.syncTopicConfig and syncSubscriptionGroupConfig replace the slave's
    tables; syncConsumerOffset puts the master's entries over the slave's (putAll), keeping keys
    only the slave has."""
    with EmbeddedCluster(brokers=1, slaves=1, slave_sync_interval=0.2) as c:
        master = RawClient(c.broker("broker-a").addr)
        slave = RawClient(c.slave("broker-a", 1).addr)
        created = master.request(CREATE_TOPIC, {
            "topic": "OnlyOnMaster", "defaultTopic": "TBW102", "readQueueNums": "3",
            "writeQueueNums": "3", "perm": "6", "topicFilterType": "SINGLE_TAG"})
        assert created.code == 0
        assert master.request(UPDATE_OFFSET, offset_fields("GM", "OnlyOnMaster", 2, 7)).code == 0
        assert slave.request(UPDATE_OFFSET, offset_fields("GS", "OnlyOnMaster", 0, 4)).code == 0
        wait_until(lambda: c.node_consumer_offset("GM", "OnlyOnMaster", "broker-a", 2, 1) == 7,
                   10, "the master's offset on the slave")
        config = c._call(lambda: c._slaves["broker-a"][0].store.topics.get("OnlyOnMaster"))
        assert (config.read_queue_nums, config.write_queue_nums, config.perm) == (3, 3, 6)
        assert c.node_consumer_offset("GS", "OnlyOnMaster", "broker-a", 0, 1) == 4
        group = SubscriptionGroupConfig("GM", retry_queue_nums=2, retry_max_times=3)
        c._call(c._broker("broker-a").clients.subscription_groups.put, group)
        wait_until(lambda: c._call(lambda: c._slaves["broker-a"][0].clients.subscription_groups
                                   .table.get("GM")) == group, 10, "the group on the slave")
        # the master's later commit of the slave's key wins at the next round
        assert master.request(UPDATE_OFFSET, offset_fields("GS", "OnlyOnMaster", 0, 9)).code == 0
        assert c.sync_slaves() == 1
        answer = slave.request(QUERY_OFFSET, offset_fields("GS", "OnlyOnMaster", 0))
        assert answer.ext_fields == {"offset": "9"}


def test_no_sync_while_the_master_is_down():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.broker("broker-a").stop()
        assert c.sync_slaves() == 0


# ------------------------------------------------------------------ suggestWhichBrokerId


def _suggestions(c, node, offsets, queue_id=0):
    client = RawClient(node.addr)
    out = []
    for offset in offsets:
        answer = client.request(PULL, pull_fields("T", queue_id, offset, max_nums=1))
        out.append((answer.code, answer.remark, answer.ext_fields["suggestWhichBrokerId"]))
    return out


def test_master_sends_a_lagging_consumer_to_the_slave_with_slave_read_enable():
    """PullMessageProcessor: with slaveReadEnable, whichBrokerWhenConsumeSlowly (1) when the
    last message pulled lies further than accessMessageInMemoryMaxRatio (40) % of memory from
    the commit log's end (DefaultMessageStore.getMessage), else the group's brokerId (0); the
    slave decides the same way. memory_bytes=10,000: a lag of more than 4,000 bytes."""
    with EmbeddedCluster(brokers=1, slaves=1, slave_read_enable=True,
                         memory_bytes=10_000) as c:
        c.create_topic("T", 1)
        c.append("T", "broker-a", 0, [b"x" * 900] * 20)
        c.wait_replicated()
        for node in c.brokers_of("broker-a"):
            assert _suggestions(c, node, [0, 19]) == [(0, "FOUND", "1"), (0, "FOUND", "0")]


def test_without_slave_read_enable_every_answer_suggests_the_master():
    with EmbeddedCluster(brokers=1, slaves=1, memory_bytes=10_000) as c:
        c.create_topic("T", 1)
        c.append("T", "broker-a", 0, [b"x" * 900] * 20)
        c.wait_replicated()
        for node in c.brokers_of("broker-a"):
            assert _suggestions(c, node, [0, 19]) == [(0, "FOUND", "0")] * 2


def test_suggest_broker_id_forces_the_answer():
    with EmbeddedCluster(brokers=1, suggest_broker_id=2) as c:
        c.create_topic("T", 1)
        c.append("T", "broker-a", 0, [b"x"] * 3)
        assert _suggestions(c, c.broker("broker-a"), [0, 2]) == [(0, "FOUND", "2")] * 2


# ------------------------------------------------------------------ what a slave refuses


@pytest.fixture(scope="module")
def pair():
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("T", 1)
        c.append("T", "broker-a", 0, [b"m%d" % i for i in range(5)])
        c.wait_replicated()
        yield c


def test_slave_does_not_correct_offsets(pair):
    """PullMessageProcessor: a slave (offsetCheckInSlave off) turns PULL_OFFSET_MOVED into
    PULL_RETRY_IMMEDIATELY suggesting the group's brokerId; the master answers 21."""
    master, slave = pair.brokers_of("broker-a")
    assert _suggestions(pair, master, [9]) == [(21, "OFFSET_OVERFLOW_BADLY", "0")]
    assert _suggestions(pair, slave, [9]) == [(20, "OFFSET_OVERFLOW_BADLY", "0")]


def test_a_pull_does_not_commit_on_the_slave(pair):
    """PullMessageProcessor: storeOffsetEnable is false on a slave (the commit-offset flag of a
    pull is ignored there; UPDATE_CONSUMER_OFFSET is not, as the capture shows)."""
    slave = RawClient(pair.slave("broker-a", 1).addr)
    answer = slave.request(PULL, pull_fields("T", 0, 2, sys_flag=1 | 4, commit=2))
    assert answer.code == 0
    assert pair.node_consumer_offset("G", "T", "broker-a", 0, 1) is None
    master = RawClient(pair.broker("broker-a").addr)
    assert master.request(PULL, pull_fields("T", 0, 2, sys_flag=1 | 4, commit=2)).code == 0
    assert pair.node_consumer_offset("G", "T", "broker-a", 0, 0) == 2


def test_slave_refuses_end_transaction(pair):
    """EndTransactionProcessor: SLAVE_NOT_AVAILABLE before looking at the transaction; the
    remark is createResponseCommand's default."""
    slave = RawClient(pair.slave("broker-a", 1).addr)
    answer = slave.request(END_TRANSACTION, {
        "producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
        "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "X"})
    assert (answer.code, answer.remark, answer.ext_fields) == \
        (11, "not set any response code", None)


def test_slave_grants_queue_locks(pair):
    """RebalanceLockManager and AdminBrokerProcessor.lockBatchMQ have no role check: a slave
    grants LOCK_BATCH_MQ like a master (read from source)."""
    body = json.dumps({"consumerGroup": "OG", "clientId": "c1", "mqSet": [
        {"topic": "T", "brokerName": "broker-a", "queueId": 0}]}).encode()
    answer = RawClient(pair.slave("broker-a", 1).addr).request(LOCK_BATCH_MQ, None, body)
    assert answer.code == 0
    assert json.loads(answer.body)["lockOKMQSet"] == [
        {"brokerName": "broker-a", "queueId": 0, "topic": "T"}]


def test_a_topic_created_on_the_slave_lasts_until_the_next_sync(pair):
    """AdminBrokerProcessor.updateAndCreateTopic has no role check; SlaveSynchronize then
    replaces the slave's whole topic (and group) table with the master's (read from source)."""
    slave = RawClient(pair.slave("broker-a", 1).addr)
    created = slave.request(CREATE_TOPIC, {
        "topic": "SlaveOnly", "defaultTopic": "TBW102", "readQueueNums": "1",
        "writeQueueNums": "1", "perm": "6", "topicFilterType": "SINGLE_TAG"})
    assert created.code == 0
    on_slave = pair._slaves["broker-a"][0].store.topics
    groups = pair._slaves["broker-a"][0].clients.subscription_groups
    pair._call(groups.put, SubscriptionGroupConfig("SlaveOnlyGroup"))
    assert pair._call(lambda: "SlaveOnly" in on_slave)
    assert pair.sync_slaves() == 1
    assert pair._call(lambda: "SlaveOnly" not in on_slave and "T" in on_slave)
    assert pair._call(lambda: "SlaveOnlyGroup" not in groups.table)


def test_routes_and_cluster_info_follow_the_slave():
    """RouteInfoManager: a stopped slave leaves brokerAddrs, a started one comes back; the
    cluster info lists both nodes."""
    with EmbeddedCluster(brokers=1, slaves=1) as c:
        c.create_topic("T", 1)
        master, slave = c.brokers_of("broker-a")
        names = RawClient(c.namesrv_addr)

        def addrs():
            route = TopicRouteData.from_json(names.request(ROUTE, {"topic": "T"}).body)
            return route.broker_datas[0].broker_addrs
        info = ClusterInfo.from_json(names.request(CLUSTER_INFO).body)
        assert info.broker_addr_table["broker-a"].broker_addrs == {0: master.addr,
                                                                    1: slave.addr}
        slave.stop()
        assert addrs() == {0: master.addr}
        slave.start()
        assert addrs() == {0: master.addr, 1: slave.addr}
        master.stop()
        slave.stop()  # the last node of the name: the name and its queues go
        assert names.request(ROUTE, {"topic": "T"}).code == 17


def test_slave_keeps_its_copy_across_restarts(tmp_path):
    """With data_dir a slave keeps its own commit log and config (``broker-a-slave1``): after
    a restart it serves what it had before copying anything new."""
    with EmbeddedCluster(brokers=1, slaves=1, data_dir=tmp_path) as c:
        c.create_topic("T", 1)
        c.append("T", "broker-a", 0, [b"kept%d" % i for i in range(3)])
        c.wait_replicated()
    with EmbeddedCluster(brokers=1, slaves=1, data_dir=tmp_path,
                         replication_interval=3600) as c:
        assert c.replication_lag("broker-a", 1) == 0
        answer = RawClient(c.slave("broker-a", 1).addr).request(PULL, pull_fields("T"))
        assert [m.body for m in decode_messages(answer.body)] == [b"kept0", b"kept1", b"kept2"]


def test_fault_rules_name_a_slave_apart_from_its_master(pair):
    """``fail_next(broker="broker-a")`` is the master's; the slave is "broker-a-slave1"."""
    master = RawClient(pair.broker("broker-a").addr)
    slave = RawClient(pair.slave("broker-a", 1).addr)
    fields = {"topic": "T", "queueId": "0"}
    pair.fail_next(1, 1, "master only", request_codes=[30], broker="broker-a")
    assert slave.request(30, fields).code == 0
    assert master.request(30, fields).remark == "master only"
    pair.fail_next(1, 1, "slave only", request_codes=[30], broker="broker-a-slave1")
    assert master.request(30, fields).code == 0
    assert slave.request(30, fields).remark == "slave only"


def test_slave_refuses_a_too_big_send_as_any_send(pair):
    """DefaultMessageStore.putMessage checks the store's role before the message's size: an
    oversized send to a slave is 14 as any other (a master answers 13 MESSAGE_ILLEGAL)."""
    fields = {"a": "P", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0",
              "h": "0", "i": "WAIT\x01true\x02", "j": "0", "k": "false"}
    big = b"x" * (4 * 1024 * 1024 + 1)
    assert RawClient(pair.broker("broker-a").addr).request(310, fields, big).code == 13
    assert RawClient(pair.slave("broker-a", 1).addr).request(310, fields, big).code == 14
    assert RawClient(pair.slave("broker-a", 1).addr).request(310, fields, b"ok").code == 14


@pytest.mark.parametrize("fields", [
    {"producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
     "commitOrRollback": "8"},  # no msgId
    {"producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
     "commitOrRollback": "5", "msgId": "X"},  # no such kind
])
def test_a_bad_end_transaction_header_is_refused_on_the_slave_as_on_the_master(pair, fields):
    """EndTransactionProcessor decodes (and checks) the header before its role check."""
    answers = [RawClient(node.addr).request(END_TRANSACTION, fields)
               for node in pair.brokers_of("broker-a")]
    assert answers[0].code == 1
    assert [(a.code, a.remark, a.ext_fields) for a in answers] == \
        [(answers[0].code, answers[0].remark, answers[0].ext_fields)] * 2
