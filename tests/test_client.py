"""Our client against the embedded server over real sockets: every request of the protocol
layer, every pull status, the range reader's fault handling, ACL and TLS."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from rocketmq_spark.client import (
    AuthError, BrokerClient, ClientConfig, Credentials, DataLossError, Message, MessageQueue,
    NameServerClient, NameServerUnavailable, Producer, PullRequest, PullStatus, QueueRangeReader,
    ReadSettings, RemotingClient, RouteNotFound, Subscription, make_tls_context,
)
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.properties import java_string_hash
from waiting import wait_until

GROUP = "test-group"


@pytest.fixture
def cluster(embedded_cluster):
    """A fresh cluster for each test, not conftest's shared one: tests here restart
    brokers and name servers and create fixed-name topics."""
    return embedded_cluster


@pytest.fixture
def admin(cluster):
    with Admin(cluster.namesrv_addr) as a:
        yield a


@pytest.fixture
def producer(cluster):
    with Producer(cluster.namesrv_addr) as p:
        yield p


def read_all(admin, queue, start=0, end=None, **settings):
    end = admin.offsets("max", [queue])[queue] if end is None else end
    reader = QueueRangeReader(admin.brokers, admin.address, queue, start, end,
                              ReadSettings(consumer_group=GROUP, **settings))
    rows = [row for batch in reader for row in batch.to_pylist()]
    return rows, reader


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- name server


def test_route_cluster_info_and_topic_list(cluster, admin):
    admin.create_topic("RouteTopic", queues=3)
    route = admin.names.route("RouteTopic")
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    assert {b.broker_name: b.master_addr for b in route.broker_datas} == {
        b.name: b.addr for b in cluster.brokers}
    assert len(route.readable_queues("RouteTopic")) == 6
    info = admin.names.cluster_info()
    assert sorted(info.cluster_addr_table["DefaultCluster"]) == ["broker-a", "broker-b"]
    assert "RouteTopic" in admin.names.topic_list()
    with pytest.raises(RouteNotFound) as err:
        admin.names.route("NoSuchTopic")
    assert err.value.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in str(err.value)


def test_name_server_failover_skips_a_dead_address(cluster):
    dead = f"127.0.0.1:{free_port()}"
    with RemotingClient() as remoting:
        names = NameServerClient(f"{dead};{cluster.namesrv_addr}", remoting, timeout=2)
        assert names.cluster_info().cluster_addr_table
        assert names.addresses[names._current] == cluster.namesrv_addr
        only_dead = NameServerClient(dead, remoting, timeout=1)
        with pytest.raises(NameServerUnavailable) as err:
            only_dead.cluster_info()
        assert dead in str(err.value)


def test_cached_route_survives_a_name_server_restart(cluster, admin):
    admin.create_topic("CachedRoute", queues=2)
    admin.names.route("CachedRoute")
    cluster.stop_namesrv()
    try:
        # A refresh fails, but the cached route keeps readers going.
        route = admin.names.route("CachedRoute", refresh=True)
        assert len(route.readable_queues("CachedRoute")) == 4
    finally:
        cluster.start_namesrv()
    assert len(admin.names.route("CachedRoute", refresh=True).readable_queues("CachedRoute")) == 4


# ---------------------------------------------------------------------- producing


def test_send_with_tags_keys_properties_and_compression(cluster, admin, producer):
    admin.create_topic("SendTopic", queues=1, brokers=["broker-a"])
    big = bytes(range(256)) * 40  # 10 KiB: compressed on the wire, inflated on read
    sent = [producer.send(Message("SendTopic", b"small", tags="TagA", keys=["k1", "k2"],
                                  properties={"color": "red"})),
            producer.send(Message("SendTopic", big, tags="TagB"))]
    assert [s.status for s in sent] == ["SEND_OK", "SEND_OK"]
    assert [s.queue_offset for s in sent] == [0, 1]
    rows, _ = read_all(admin, sent[0].queue)
    assert [r["body"] for r in rows] == [b"small", big]
    assert rows[0]["tags"] == "TagA" and rows[0]["keys"] == "k1 k2"
    assert "color\x01red" in rows[0]["properties"]
    assert rows[0]["sys_flag"] & 1 == 0
    assert rows[1]["sys_flag"] == 0x301, "the stored flag (zlib, compressed) is kept, as Java"
    assert [r["msg_id"] for r in rows] == [s.msg_id for s in sent]
    assert [r["offset_msg_id"] for r in rows] == [s.offset_msg_id for s in sent]


def test_first_send_auto_creates_the_topic_through_tbw102(cluster, admin, producer):
    with pytest.raises(RouteNotFound):
        admin.names.route("BrandNewTopic")
    result = producer.send(Message("BrandNewTopic", b"hello"))
    assert result.status == "SEND_OK"

    def queues_once_routed():
        try:
            return admin.queues("BrandNewTopic", refresh=True)
        except RouteNotFound:
            return None

    queues = wait_until(queues_once_routed, 5, "BrandNewTopic's route")
    assert result.queue in queues


def test_batch_lands_in_one_queue_with_consecutive_offsets(cluster, admin, producer):
    admin.create_topic("BatchTopic", queues=4)
    msgs = [Message("BatchTopic", b"b%d" % i, tags="T", keys=f"k{i}") for i in range(50)]
    result = producer.send_batch(msgs)
    rows, _ = read_all(admin, result.queue)
    assert [r["body"] for r in rows] == [m.body for m in msgs]
    assert [r["queue_offset"] for r in rows] == list(range(result.queue_offset,
                                                           result.queue_offset + 50))
    assert len({r["msg_id"] for r in rows}) == 50, "each batch message keeps its own UNIQ_KEY"


# ---------------------------------------------------------------------- offsets and groups


def test_offset_lookups_and_commits(cluster, admin, producer):
    admin.create_topic("OffsetTopic", queues=2)
    queues = admin.queues("OffsetTopic")
    for mq in queues:
        producer.send_batch([Message("OffsetTopic", b"x")] * 5, queue=mq)
    assert set(admin.offsets("max", queues).values()) == {5}
    assert set(admin.offsets("min", queues).values()) == {0}
    # 4.9.8: a young queue (min offset 0) answers 0 for a group that never committed.
    assert set(admin.offsets("committed", queues, group="fresh").values()) == {0}
    assert admin.commit_offsets("g1", {mq: 3 for mq in queues}) == {}
    assert set(admin.offsets("committed", queues, group="g1").values()) == {3}
    assert cluster.consumer_offset("g1", "OffsetTopic", queues[0].broker_name,
                                   queues[0].queue_id) == 3
    cluster.truncate("OffsetTopic", queues[0].broker_name, queues[0].queue_id, 2)
    # Past retention the broker no longer invents 0: nothing stored means None.
    assert admin.offsets("committed", [queues[0]], group="fresh")[queues[0]] is None


def test_search_offset_by_timestamp_and_earliest_store_time(cluster, admin, producer):
    admin.create_topic("TimeTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("TimeTopic")[0]
    producer.send_batch([Message("TimeTopic", b"early")] * 3, queue=mq)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    producer.send_batch([Message("TimeTopic", b"late")] * 2, queue=mq)
    address = admin.master_address(mq)
    assert admin.brokers.search_offset_by_timestamp(address, mq, middle) == 3
    assert admin.offsets("timestamp", [mq], timestamp_ms=middle)[mq] == 3
    earliest = admin.brokers.get_earliest_msg_store_time(address, mq)
    assert 0 < earliest < middle


def test_heartbeat_registers_the_group_and_unregister_removes_it(cluster, admin):
    admin.create_topic("HbTopic", queues=1)
    address = cluster.broker("broker-a").addr
    brokers = admin.brokers
    assert brokers.get_consumer_list_by_group(address, "hb-group") == []
    brokers.heart_beat(address, "hb-group", [Subscription("HbTopic", "TagA || TagB")])
    client_id = admin.remoting.config.client_id
    assert brokers.get_consumer_list_by_group(address, "hb-group") == [client_id]
    brokers.unregister_client(address, consumer_group="hb-group")
    assert brokers.get_consumer_list_by_group(address, "hb-group") == []


# ---------------------------------------------------------------------- pull statuses


def pull(admin, mq, offset, **kw):
    request = PullRequest(consumer_group=GROUP, topic=mq.topic, queue_id=mq.queue_id,
                          queue_offset=offset, broker_name=mq.broker_name, **kw)
    return admin.brokers.pull(admin.address(mq), request)


def test_every_pull_status(cluster, admin, producer):
    admin.create_topic("StatusTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("StatusTopic")[0]
    producer.send_batch([Message("StatusTopic", b"m%d" % i, tags="TagA" if i < 40 else "TagB")
                         for i in range(60)], queue=mq)
    found = pull(admin, mq, 0)
    assert found.status is PullStatus.FOUND and found.next_begin_offset == 32  # broker cap
    assert (found.min_offset, found.max_offset, found.suggest_which_broker_id) == (0, 60, 0)
    assert pull(admin, mq, 60).status is PullStatus.NO_NEW_MSG
    too_far = pull(admin, mq, 99)
    assert too_far.status is PullStatus.OFFSET_ILLEGAL and too_far.next_begin_offset == 60
    tagged = pull(admin, mq, 0, subscription="TagB")
    assert tagged.status is PullStatus.FOUND and tagged.next_begin_offset == 60
    none = pull(admin, mq, 40, subscription="TagC")
    assert none.status is PullStatus.NO_MATCHED_MSG and none.next_begin_offset == 60
    cluster.truncate("StatusTopic", "broker-a", 0, 10)
    moved = pull(admin, mq, 3)
    assert moved.status is PullStatus.OFFSET_ILLEGAL and moved.next_begin_offset == 10


def test_long_poll_wakes_up_when_a_message_arrives(cluster, admin, producer):
    admin.create_topic("PollTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("PollTopic")[0]
    sent = []
    late = threading.Timer(0.3, lambda: sent.append(
        producer.send(Message("PollTopic", b"late"), queue=mq)))
    late.start()
    started = time.monotonic()
    result = pull(admin, mq, 0, suspend_timeout_ms=10_000)
    waited = time.monotonic() - started
    late.join(10)  # the send's reply may land after the pull's: keep the producer open for it
    assert result.status is PullStatus.FOUND and len(sent) == 1
    assert 0.2 < waited < 5


# ---------------------------------------------------------------------- the range reader


def test_reader_reads_exactly_the_range(cluster, admin, producer):
    admin.create_topic("RangeTopic", queues=1, brokers=["broker-b"])
    mq = admin.queues("RangeTopic")[0]
    producer.send_batch([Message("RangeTopic", b"%d" % i) for i in range(500)], queue=mq)
    rows, reader = read_all(admin, mq, 17, 433, batch_max_messages=100)
    assert [r["queue_offset"] for r in rows] == list(range(17, 433))
    assert [r["body"] for r in rows] == [b"%d" % i for i in range(17, 433)]
    assert reader.lost_ranges == [] and reader.pulls >= (433 - 17) // 32


def test_reader_rechecks_tags_because_brokers_filter_by_hash(cluster, admin, producer):
    assert java_string_hash("Aa") == java_string_hash("BB")  # a genuine collision
    admin.create_topic("HashTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("HashTopic")[0]
    producer.send_batch([Message("HashTopic", b"%d" % i, tags=("Aa", "BB", "C")[i % 3])
                         for i in range(90)], queue=mq)
    broker_view = pull(admin, mq, 0, subscription="Aa")
    assert broker_view.status is PullStatus.FOUND
    rows, reader = read_all(admin, mq, subscription="Aa")
    assert {r["tags"] for r in rows} == {"Aa"} and len(rows) == 30
    assert reader.filtered_out == 30  # the BB messages the broker let through


def test_reader_data_loss_fails_or_is_counted(cluster, admin, producer):
    admin.create_topic("LossTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("LossTopic")[0]
    producer.send_batch([Message("LossTopic", b"%d" % i) for i in range(100)], queue=mq)
    cluster.truncate("LossTopic", "broker-a", 0, 40)
    with pytest.raises(DataLossError) as err:
        read_all(admin, mq, 10, 100)
    assert err.value.start == 10 and err.value.end == 40
    assert "LossTopic/broker-a/0" in str(err.value) and "failOnDataLoss" in str(err.value)
    rows, reader = read_all(admin, mq, 10, 100, fail_on_data_loss=False)
    assert [r["queue_offset"] for r in rows] == list(range(40, 100))
    assert reader.lost_ranges == [(10, 40)] and reader.lost_messages == 30


def test_reader_retries_transient_broker_errors(cluster, admin, producer):
    admin.create_topic("RetryTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("RetryTopic")[0]
    producer.send_batch([Message("RetryTopic", b"%d" % i) for i in range(200)], queue=mq)
    cluster.fail_next(3, ResponseCode.SYSTEM_BUSY, "[REJECTREQUEST]system busy",
                      request_codes=[RequestCode.PULL_MESSAGE])
    rows, reader = read_all(admin, mq, retry_backoff=0.01)
    assert [r["queue_offset"] for r in rows] == list(range(200))
    assert reader.busy_answers >= 1 and reader.retries == 0  # busy is back-pressure, no fault


def test_reader_rides_out_a_broker_restart(cluster, admin, producer):
    admin.create_topic("RestartTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("RestartTopic")[0]
    producer.send_batch([Message("RestartTopic", b"%d" % i) for i in range(300)], queue=mq)
    broker = cluster.broker("broker-a")
    broker.stop()
    threading.Timer(1.0, broker.start).start()
    rows, reader = read_all(admin, mq, 0, 300, retry_backoff=0.05)
    assert [r["queue_offset"] for r in rows] == list(range(300))
    assert reader.retries >= 1


def test_reader_survives_dropped_connections(cluster, admin, producer):
    admin.create_topic("DropTopic", queues=1, brokers=["broker-a"])
    mq = admin.queues("DropTopic")[0]
    producer.send_batch([Message("DropTopic", b"%d" % i) for i in range(300)], queue=mq)
    cluster.delay_next(1, 0.5, request_codes=[RequestCode.PULL_MESSAGE])
    threading.Timer(0.2, cluster.drop_connections).start()
    rows, _ = read_all(admin, mq, retry_backoff=0.01)
    assert [r["queue_offset"] for r in rows] == list(range(300))


# ---------------------------------------------------------------------- ACL and TLS


def test_acl_signed_requests_pass_and_bad_ones_are_refused(embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=1, acl={"ak-test": "sk-very-secret"})
    good = ClientConfig(credentials=Credentials("ak-test", "sk-very-secret"))
    with Producer(cluster.namesrv_addr, config=good) as p:
        assert p.send(Message("AclTopic", b"ok")).status == "SEND_OK"
    for config in (ClientConfig(), ClientConfig(credentials=Credentials("ak-test", "wrong"))):
        with Producer(cluster.namesrv_addr, config=config) as p:
            with pytest.raises(AuthError) as err:
                p.send(Message("AclTopic", b"refused"))
            assert "sk-very-secret" not in str(err.value)
    assert "sk-very-secret" not in repr(good) + str(good)


@pytest.mark.parametrize("secret", [None, "sk-very-secret"], ids=["no-credentials", "unknown-key"])
def test_acl_refusals_fail_at_once_and_are_never_retried(embedded_cluster_factory, secret):
    """No credentials, or an access key the broker does not know ("No acl config for ..."):
    the broker answers SYSTEM_ERROR, which must not pass for a busy broker."""
    cluster = embedded_cluster_factory(brokers=1, acl={"ak-test": "sk-very-secret"})
    cluster.create_topic("AclRefused", queues=1)
    cluster.append("AclRefused", "broker-a", 0, [b"x"] * 10)
    config = ClientConfig(credentials=Credentials("ak-unknown", secret) if secret else None)
    started = time.monotonic()
    with Producer(cluster.namesrv_addr, config=config, retries=3) as p:
        with pytest.raises(AuthError, match="check the access key") as err:
            p.send(Message("AclRefused", b"refused"))
    assert ("No acl config for <redacted>" if secret else "No accessKey") in str(err.value)
    with Admin(cluster.namesrv_addr, config=config) as admin:
        mq = MessageQueue("AclRefused", "broker-a", 0)
        reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 10,
                                  ReadSettings(consumer_group=GROUP, retry_deadline=60))
        with pytest.raises(AuthError):
            list(reader)
        assert reader.retries == 0
    assert time.monotonic() - started < 5, "an ACL refusal was retried"
    assert "sk-very-secret" not in str(err.value) and "ak-unknown" not in str(err.value)


@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
def test_tls_connections(embedded_cluster_factory, mode):
    cluster = embedded_cluster_factory(brokers=1, tls=mode)
    for context in (make_tls_context(verify=False),
                    make_tls_context(ca_file=cluster.tls_settings.certfile,
                                     check_hostname=False)):
        with Producer(cluster.namesrv_addr, config=ClientConfig(tls=context)) as p:
            sent = p.send(Message("TlsTopic", b"secret payload"))
        with Admin(cluster.namesrv_addr, config=ClientConfig(tls=context)) as admin:
            rows, _ = read_all(admin, sent.queue)
            assert rows[-1]["body"] == b"secret payload"


def test_reader_follows_suggest_which_broker_id(embedded_cluster_factory):
    """A master that suggests broker id 1 sends the reader to the slave's address, which keeps
    it while the slave also suggests 1. Two clusters stand in for master and slave, told apart
    by their bodies."""
    master = embedded_cluster_factory(brokers=1, suggest_broker_id=1)
    slave = embedded_cluster_factory(brokers=1, suggest_broker_id=1)
    for cluster, text in ((master, "master"), (slave, "slave")):
        cluster.create_topic("SlaveRead", queues=1)
        cluster.append("SlaveRead", "broker-a", 0, [f"{text} {i}".encode() for i in range(100)])
    addresses = {0: master.broker("broker-a").addr, 1: slave.broker("broker-a").addr}
    asked = []

    def resolve(mq, broker_id, refresh):
        asked.append(broker_id)
        return addresses[broker_id]

    with RemotingClient() as remoting:
        mq = MessageQueue("SlaveRead", "broker-a", 0)
        reader = QueueRangeReader(BrokerClient(remoting), resolve, mq, 0, 100,
                                  ReadSettings(consumer_group=GROUP, pipeline_depth=1))
        bodies = [row["body"] for batch in reader for row in batch.to_pylist()]
    assert bodies[:32] == [b"master %d" % i for i in range(32)]
    assert bodies[32:] == [b"slave %d" % i for i in range(32, 100)]
    assert asked == [0, 1]
