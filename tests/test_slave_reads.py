"""Reads go on from a slave while its master is down: the client side, over real sockets.

An embedded cluster of two brokers, each with a slave that copies its master (as a 4.9.8 slave:
it answers GET_MIN/MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, PULL_MESSAGE and offset commits for
its copy, captured in ``captures/rocketmq-4.9.8-slave``). The master of ``broker-a`` is stopped:
its address leaves the route, as the genuine name server drops a master whose connection closed.
Java's consumer pulls from the slave then (``MQClientInstance.findBrokerAddressInSubscribe``
falls back from the master), follows each answer's ``suggestWhichBrokerId``
(``PullAPIWrapper.updatePullFromWhichNode``) and commits offsets to the slave when no master is
routed (``RemoteBrokerOffsetStore.updateConsumeOffsetToBroker``).
"""
from __future__ import annotations

import time

import pytest

from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import RouteNotFound
from rocketmq_spark.client.read.reader import QueueRangeReader, ReadSettings
from rocketmq_spark.embedded.cluster import EmbeddedCluster
from rocketmq_spark.source.offset_reader import OffsetReader
from rocketmq_spark.source.options import parse_source_options
from rocketmq_spark.source.planning import next_end
from rocketmq_spark.client.config import ClientConfig
from rocketmq_spark.client.group.requests import broker_nodes, heartbeat
from rocketmq_spark.client.group.membership import GroupMember, member_client_id
from rocketmq_spark.client.broker import Subscription

from source_helpers import produce
from waiting import wait_until


@pytest.fixture
def slaves():
    """A cluster of its own: the tests stop and start its masters."""
    with EmbeddedCluster(brokers=2, slaves=1) as cluster:
        yield cluster


def _ids(batches) -> list:
    return [int(k) for b in batches for k in b.column("keys").to_pylist()]


def test_lookups_and_commits_go_to_the_slave_then_back_to_the_master(slaves):
    slaves.create_topic("T", queues=2)
    sent = produce(slaves.namesrv_addr, "T", range(200))
    slaves.wait_replicated()
    slaves.sync_slaves()  # the slaves copy the topic config (every 10 s by themselves)
    with Admin(slaves.namesrv_addr) as admin:
        queues = admin.queues("T", refresh=True)
        before = admin.offsets("max", queues)
        assert before == {mq: len(ids) for mq, ids in sent.items()}
        slaves.broker("broker-a").stop()

        # every lookup is answered, broker-a's by its slave (brokerId 1), broker-b's by its master
        for kind in ("max", "min", "committed"):
            answers = admin.offsets_by_node(kind, queues, group="G")
            assert {mq.broker_name: node for mq, (_, node) in answers.items()} == {
                "broker-a": 1, "broker-b": 0}, kind
        assert admin.offsets("max", queues) == before
        assert admin.offsets("min", queues) == {mq: 0 for mq in queues}
        a0 = next(mq for mq in queues if mq.broker_name == "broker-a")
        assert admin.offsets("timestamp", [a0], timestamp_ms=0)[a0] == 0
        assert all(isinstance(t, int) for t in admin.store_times({a0: 5}).values())

        # commits: broker-a's to its slave, which serves them back
        assert admin.commit_offsets("G", {mq: 7 for mq in queues}) == {}
        assert slaves.node_consumer_offset("G", "T", "broker-a", a0.queue_id, 1) == 7
        assert slaves.node_consumer_offset("G", "T", "broker-a", a0.queue_id, 0) is None
        assert admin.offsets("committed", queues, group="G") == {mq: 7 for mq in queues}

        # the master comes back: lookups go there again, and it gets the slave's commits
        slaves.broker("broker-a").start()
        wait_until(lambda: admin.names.route("T", refresh=True).broker("broker-a").master_addr,
                   10, "broker-a's master in the route")
        answers = admin.offsets_by_node("max", queues)
        assert {mq.broker_name: node for mq, (_, node) in answers.items()} == {
            "broker-a": 0, "broker-b": 0}
        assert slaves.node_consumer_offset("G", "T", "broker-a", a0.queue_id, 0) == 7
        assert admin.offsets("committed", queues, group="G") == {mq: 7 for mq in queues}


def test_a_master_that_cannot_be_reached_is_skipped_while_still_routed(slaves):
    """The route is cached (30 s, as Java's client polls it): a lookup to a master that went
    away since fails to connect and is asked again at a slave at once."""
    slaves.create_topic("T", queues=1)
    produce(slaves.namesrv_addr, "T", range(10))
    slaves.wait_replicated()
    slaves.sync_slaves()  # the slaves copy the topic config (every 10 s by themselves)
    with Admin(slaves.namesrv_addr) as admin:
        queues = admin.queues("T", refresh=True)
        assert admin.names.route("T").broker("broker-a").master_addr  # cached with the master
        slaves.broker("broker-a").stop()
        answers = admin.offsets_by_node("max", queues)
        assert {mq.broker_name: answer for mq, answer in answers.items()} == {
            "broker-a": (5, 1), "broker-b": (5, 0)}
        assert admin.commit_offsets("G", {mq: 1 for mq in queues}) == {}
        slaves.broker("broker-a").start()
        wait_until(lambda: admin.names.route("T", refresh=True).broker("broker-a").master_addr,
                   10, "the master routed (and cached) again")
        slaves.broker("broker-a").stop()
        options = parse_source_options({"nameServer": slaves.namesrv_addr, "subscribe": "T"},
                                       streaming=True)
        a0 = next(mq for mq in queues if mq.broker_name == "broker-a")
        assert OffsetReader(options, admin).offset_for_time(a0, 0) == 0


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_pulls_follow_the_suggested_broker_and_fall_back_to_the_slave(native):
    """A master with slaveReadEnable sends a consumer that lags far behind to its slave
    (suggestWhichBrokerId 1); the slave, not lagging, sends it back (0). With the master
    stopped, the read goes on from the slave. Both pull loops."""
    with EmbeddedCluster(brokers=1, slaves=1, slave_read_enable=True,
                         memory_bytes=50_000) as cluster:
        cluster.create_topic("T", queues=1)
        produce(cluster.namesrv_addr, "T", range(2000))
        cluster.wait_replicated()
        cluster.sync_slaves()
        with Admin(cluster.namesrv_addr) as admin:
            mq = admin.queues("T", refresh=True)[0]
            asked = []

            def resolve(queue, broker_id, refresh):
                address = admin.address(queue, broker_id, refresh)
                asked.append((broker_id, address))
                return address

            settings = ReadSettings(consumer_group="G", native=native, pipeline_depth=4)
            reader = QueueRangeReader(admin.brokers, resolve, mq, 0, 2000, settings)
            assert _ids(reader) == list(range(2000))
            master, slave = (b.addr for b in cluster.brokers_of(mq.broker_name))
            assert (1, slave) in asked and asked[0] == (0, master)
            assert (0, master) in asked[asked.index((1, slave)):]  # sent back by the slave

            cluster.broker(mq.broker_name).stop()
            asked.clear()
            reader = QueueRangeReader(admin.brokers, resolve, mq, 100, 400, settings)
            assert _ids(reader) == list(range(100, 400))
            # the cached route still names the master: one failed connection, then the slave
            assert asked[-1][1] == slave and reader.retries <= 1


def test_heartbeats_reach_the_slaves(slaves):
    slaves.create_topic("T", queues=1)
    slaves.sync_slaves()
    with Admin(slaves.namesrv_addr) as admin:
        nodes = broker_nodes(admin, ["T"])
        assert {name: len(addrs) for name, addrs in nodes.items()} == {
            "broker-a": 2, "broker-b": 2}
        heartbeat(admin, [a for addrs in nodes.values() for a in addrs], "G",
                  [Subscription("T")])
        for name in ("broker-a", "broker-b"):
            for handle in slaves.brokers_of(name):
                assert admin.brokers.get_consumer_list_by_group(handle.addr, "G") == [
                    admin.remoting.config.client_id]


def test_sends_skip_a_broker_whose_master_is_down_and_say_so_when_all_are(slaves):
    """Producers send to masters only (a slave refuses sends: code 14 in the capture)."""
    slaves.create_topic("T", queues=2)
    slaves.broker("broker-a").stop()
    with Producer(slaves.namesrv_addr) as producer:
        results = [producer.send(Message("T", b"x")) for _ in range(8)]
        assert {r.queue.broker_name for r in results} == {"broker-b"}
        slaves.broker("broker-b").stop()
        with pytest.raises(RouteNotFound, match="no master of broker-a, broker-b is in the "
                                                "route"):
            producer.send(Message("T", b"y"))


def test_a_slave_that_trails_its_masters_max_holds_the_queue_instead_of_losing_it():
    """Asynchronous replication: the slave misses what its master stored last. Planned to the
    master's max before it went down, the queue must not look truncated (data loss) when the
    slave answers less: it makes no progress until the master is back."""
    # the slave copies every 3 s: just after a round, what the master stores next stays
    # on the master alone for that long
    with EmbeddedCluster(brokers=1, slaves=1, replication_interval=3.0) as cluster:
        cluster.create_topic("T", queues=1)
        cluster.sync_slaves()
        produce(cluster.namesrv_addr, "T", range(100))
        cluster.wait_replicated(timeout=15)
        produce(cluster.namesrv_addr, "T", range(100, 150))  # the slave misses these
        options = parse_source_options({"nameServer": cluster.namesrv_addr, "subscribe": "T",
                                        "failOnDataLoss": "true"}, streaming=True)
        with Admin(cluster.namesrv_addr) as admin:
            offsets = OffsetReader(options, admin)
            mq = offsets.discover(force=True).queues[0]
            assert offsets.max_offsets([mq], fresh=True) == {mq: 150}
            start = {mq: 150}  # a batch read up to the master's max

            cluster.broker("broker-a").stop()
            assert cluster.node_max_offset("T", "broker-a", 0, 1) == 100
            discovery = offsets.discover(force=True)
            assert offsets.admin.offsets("max", [mq]) == {mq: 100}  # the slave's copy
            latest = offsets.max_offsets([mq], fresh=True)
            assert latest == {}  # held, not planned back to 100
            assert next_end(start, discovery.queues, discovery.why_missing, latest, {},
                            True) == start

            cluster.broker("broker-a").start()
            wait_until(lambda: offsets.max_offsets([mq], fresh=True) == {mq: 150} or None, 10,
                       "the master's max again")


def test_a_locked_queue_stops_while_its_master_is_down_and_comes_back_with_it(slaves):
    """lockQueues: locks are the master's (Java's RebalanceImpl.lock asks the master only, and
    ConsumeMessageOrderlyService consumes no queue it has not locked). While broker-a's master
    is down its queues' locks cannot be renewed: once they lapse the member reads them no more,
    handing each over at its position, committed to the slave (no one else can lock it
    meanwhile); when the master is back and grants the locks they join again there."""
    slaves.create_topic("T", queues=1)
    slaves.sync_slaves()
    member = GroupMember(slaves.namesrv_addr, ClientConfig(client_id=member_client_id("l")),
                         "LG", lambda: ["T"], lambda queues, first: {mq: 0 for mq in queues},
                         lock_queues=True, interval=0.4).start()
    try:
        wait_until(lambda: len(member.share()[0]) == 2, 10, "both queues locked")
        share = member.apply_allocation({}, first=True)
        start = {**share.kept, **share.entering}
        a, b = sorted(start)
        assert (a.broker_name, b.broker_name) == ("broker-a", "broker-b")
        position = {a: 5, b: 9}  # where the last complete batch ended

        slaves.broker("broker-a").stop()
        wait_until(lambda: time.monotonic() - member.lock_ok.get(a, 0) > member.lock_validity,
                   10, "broker-a's lock lapsed (not renewed)")
        share = member.apply_allocation(position)
        assert share.kept == {b: 9} and not share.entering
        assert slaves.node_consumer_offset("LG", "T", "broker-a", 0, 1) == 5  # on the slave

        slaves.broker("broker-a").start()
        wait_until(lambda: time.monotonic() - member.lock_ok.get(a, 0) < member.lock_validity,
                   10, "broker-a's lock granted again")
        share = member.apply_allocation({b: 9})
        assert share.kept == {b: 9} and share.entering == {a: 5}
        assert slaves.node_consumer_offset("LG", "T", "broker-a", 0, 0) == 5  # re-committed
    finally:
        member.leave()
