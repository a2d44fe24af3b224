"""Reads against a broker in flow control: a busy pull answer is back-pressure, not a fault.

A genuine 4.9.8 broker answers SYSTEM_BUSY to a pull that waited ``waitTimeMillsInPullQueue``
(5 s) in its pull queue (broker/.../latency/BrokerFastFailure.java, ``[TIMEOUT_CLEAN_QUEUE]``)
or that found the queue full (remoting/.../netty/NettyRemotingAbstract.java, ``[OVERLOAD]``).
The reader backs off per broker (exponential, jitter), restarts its pipeline one pull deep,
retries the same offset and gives up only after ``busy_timeout`` of nothing but busy answers.
Both pull engines (the C loop and its pure-Python twin) are held to that.
"""
from __future__ import annotations

import logging
import threading

import pytest

from rocketmq_spark.client import QueueRangeReader, ReadSettings
from rocketmq_spark.client.accelerator import FORCE_PURE_PYTHON
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.read.busy_brokers import BrokerBusyError, BusyBrokers, busy_target
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.source.options import OptionError, parse_source_options
from source_helpers import ids_of, produce
from waiting import wait_until

PULL = [RequestCode.PULL_MESSAGE]
TIMEOUT_CLEAN = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                 "period in queue: 5012ms, size of queue: 4711")
FAST = dict(retry_backoff=0.01, busy_backoff_max=0.05)  # seconds-long tests
ENGINES = [pytest.param(True, id="native", marks=pytest.mark.skipif(
               FORCE_PURE_PYTHON, reason="ROCKETMQ_SPARK_PURE_PYTHON is set: no C loop")),
           pytest.param(False, id="python")]


@pytest.fixture(scope="module")
def busy_cluster():
    """Two brokers; queue 0 of "Busy" holds 3,000 messages on each."""
    from rocketmq_spark.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(brokers=2)
    cluster.start()
    cluster.create_topic("Busy", queues=1)
    for broker in ("broker-a", "broker-b"):
        cluster.append("Busy", broker, 0, [b"%s:%d" % (broker.encode(), i)
                                           for i in range(3000)])
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def admin(busy_cluster):
    busy_cluster.clear_faults()
    with Admin(busy_cluster.namesrv_addr) as admin:
        yield admin
    busy_cluster.clear_faults()


def queue_of(admin, broker: str):
    return next(mq for mq in admin.queues("Busy") if mq.broker_name == broker)


def read(admin, broker: str, native: bool, brokers: BusyBrokers, **kw):
    """Every offset read from queue 0 of "Busy" on ``broker``, and the reader."""
    reader = QueueRangeReader(admin.brokers, admin.address, queue_of(admin, broker), 0, 3000,
                              ReadSettings(consumer_group="flow-group", native=native,
                                           **{**FAST, **kw}), busy_brokers=brokers)
    offsets = [o for batch in reader for o in batch.column("queue_offset").to_pylist()]
    return offsets, reader


@pytest.mark.parametrize("native", ENGINES)
def test_busy_answers_mid_read_cost_time_not_messages(busy_cluster, admin, native):
    """Five pulls are served, then 40 are answered busy: answers already consumed stay
    consumed (the C loop had read past them when the busy answer stopped it), the busy offset
    is pulled again, and every message arrives exactly once."""
    busy_cluster.delay_next(5, 0.0, request_codes=PULL)  # served as usual, in order
    busy_cluster.fail_next(40, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN, request_codes=PULL)
    brokers = BusyBrokers()
    offsets, reader = read(admin, "broker-a", native, brokers)
    assert offsets == list(range(3000))
    assert reader.busy_answers >= 1 and reader.retries == 0  # busy is no fault
    assert reader.busy_wait > 0
    assert brokers.active == 0  # the broker answered again: the episode is over
    assert reader.path == ("native" if native else "python")


@pytest.mark.parametrize("native", ENGINES)
def test_after_a_busy_answer_the_broker_gets_one_pull_per_backoff(busy_cluster, admin, native):
    """16 pulls are in flight when the broker turns busy; after that the pipeline restarts one
    deep, so each of the 30 busy answers after the first burst costs a backoff of its own
    (a reader that went back to 16 at once would spend the 46 in three bursts)."""
    busy_cluster.fail_next(46, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN, request_codes=PULL)
    offsets, reader = read(admin, "broker-a", native, BusyBrokers())
    assert offsets == list(range(3000))
    assert reader.busy_answers >= 25, reader.busy_answers


@pytest.mark.parametrize("native", ENGINES)
def test_busy_beyond_the_budget_fails_with_a_clear_error(busy_cluster, admin, native):
    busy_cluster.fail_next(100_000, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN,
                           request_codes=PULL, broker="broker-a")
    brokers = BusyBrokers()
    with pytest.raises(BrokerBusyError) as caught:
        read(admin, "broker-a", native, brokers, busy_timeout=0.3)
    error, address = caught.value, admin.address(queue_of(admin, "broker-a"), 0, False)
    text = str(error)
    assert error.seconds > 0.3 and error.answers >= 2 and error.address == address
    assert "broker-a" in text and address in text and "brokerBusyTimeoutMs=300" in text
    assert f"{error.answers} busy answers" in text and "[TIMEOUT_CLEAN_QUEUE]" in text
    assert error.__cause__ is None and error.__suppress_context__  # no chained stack trace
    assert brokers.active == 0  # given up: a retried task starts a budget of its own


@pytest.mark.parametrize("native", ENGINES)
def test_other_brokers_are_read_while_one_is_backed_off(busy_cluster, admin, native):
    """Readers of one process share a broker's backoff, and only that broker's: broker-b is
    read in full while broker-a's reader is still riding out its busy answers."""
    busy_cluster.fail_next(100_000, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN,
                           request_codes=PULL, broker="broker-a")
    brokers = BusyBrokers()
    a_address = busy_target(admin.address(queue_of(admin, "broker-a"), 0, False), "broker-a")
    got = {}

    def read_a():  # waits of 0.5 s and more: long enough to hold up anything sharing them
        got["a"] = read(admin, "broker-a", native, brokers, busy_timeout=30.0,
                        retry_backoff=1.0, busy_backoff_max=2.0)[0]

    thread = threading.Thread(target=read_a, daemon=True)
    thread.start()
    wait_until(lambda: brokers.episode(a_address)[1] >= 2, 10, "broker-a's busy answers")
    offsets_b, reader_b = read(admin, "broker-b", native, brokers)
    assert offsets_b == list(range(3000)) and reader_b.busy_answers == 0
    assert reader_b.busy_wait == 0.0  # never held up by broker-a's backoff
    assert brokers.episode(a_address)[1] >= 2 and thread.is_alive()  # still backed off
    busy_cluster.clear_faults()
    thread.join(30)
    assert got["a"] == list(range(3000))


@pytest.mark.parametrize("native", ENGINES)
def test_busy_answers_are_counted_and_logged_once_a_minute(busy_cluster, admin, native,
                                                           caplog):
    busy_cluster.fail_next(60, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN, request_codes=PULL)
    brokers = BusyBrokers()
    with caplog.at_level(logging.INFO, logger="rocketmq_spark"):
        offsets, reader = read(admin, "broker-a", native, brokers)
    assert offsets == list(range(3000))
    address = admin.address(queue_of(admin, "broker-a"), 0, False)
    assert brokers.total(busy_target(address, "broker-a")) == reader.busy_answers >= 20
    lines = [r.getMessage() for r in caplog.records if "busy" in r.getMessage()]
    assert len(lines) == 1 and address in lines[0] and "[TIMEOUT_CLEAN_QUEUE]" in lines[0]


@pytest.fixture(scope="module")
def small_pull_queue():
    """A broker whose pull queue holds 8 requests (pullThreadPoolQueueCapacity) and drops
    those that waited 1 ms (waitTimeMillsInPullQueue): eight readers of 16 pulls in flight
    each overflow it. Queue 0..7 of "Flood" hold 2,000 messages of 1 KB each."""
    from rocketmq_spark.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(brokers=1, pull_queue_capacity=8, wait_ms_in_pull_queue=1)
    cluster.start()
    cluster.create_topic("Flood", queues=8)
    for queue in range(8):
        cluster.append("Flood", "broker-a", queue, [b"%d:" % i + b"x" * 1000
                                                     for i in range(2000)])
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("native", ENGINES)
def test_eight_readers_ride_out_a_full_pull_queue(small_pull_queue, native):
    """The broker's own flow control (JSON answers without extFields, [OVERLOAD] and
    [TIMEOUT_CLEAN_QUEUE], overtaking earlier answers): every reader gets its range exactly."""
    before = small_pull_queue.flow_control_stats()["busy"]
    brokers, got = BusyBrokers(), {}
    with Admin(small_pull_queue.namesrv_addr) as admin:
        def read_queue(mq):
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 2000, ReadSettings(
                consumer_group="flood-group", native=native, **FAST), busy_brokers=brokers)
            offsets = [o for b in reader for o in b.column("queue_offset").to_pylist()]
            got[mq.queue_id] = (offsets, reader.busy_answers, reader.retries)

        threads = [threading.Thread(target=read_queue, args=(mq,), daemon=True)
                   for mq in admin.queues("Flood")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert sorted(got) == list(range(8))
    assert all(offsets == list(range(2000)) for offsets, _, _ in got.values())
    assert all(retries == 0 for _, _, retries in got.values())
    busy_answers = small_pull_queue.flow_control_stats()["busy"] - before
    assert busy_answers > 0 and sum(n for _, n, _ in got.values()) > 0


def spark_read(spark, cluster, topic, **options):
    reader = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
        .option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def rules_left(cluster) -> int:
    return sum(rule.remaining for rule in list(cluster.faults.rules))


def test_a_spark_batch_read_over_a_busy_broker_is_exact(spark, busy_cluster):
    """spark.read over both brokers while broker-a answers 20 pulls busy: every message once
    (the first 16 answer one task's first pipeline, the others each cost a backoff)."""
    busy_cluster.create_topic("BusySpark", queues=4)
    produce(busy_cluster.namesrv_addr, "BusySpark", range(4000))
    busy_cluster.fail_next(20, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN, request_codes=PULL,
                           broker="broker-a")
    try:
        rows = spark_read(spark, busy_cluster, "BusySpark").select("keys").collect()
        assert rules_left(busy_cluster) == 0  # every busy answer was given
    finally:
        busy_cluster.clear_faults()
    assert ids_of(rows) == list(range(4000))


def test_a_spark_read_fails_clearly_when_the_broker_stays_busy(spark, busy_cluster):
    busy_cluster.create_topic("BusyForever", queues=1, brokers=["broker-a"])
    produce(busy_cluster.namesrv_addr, "BusyForever", range(100))
    busy_cluster.fail_next(100_000, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN,
                           request_codes=PULL, broker="broker-a")
    try:
        with pytest.raises(Exception) as caught:
            spark_read(spark, busy_cluster, "BusyForever", brokerBusyTimeoutMs=500).collect()
    finally:
        busy_cluster.clear_faults()
    text = str(caught.value)
    assert "broker broker-a at " in text and "brokerBusyTimeoutMs=500" in text
    assert "kept answering pulls busy" in text and "[TIMEOUT_CLEAN_QUEUE]" in text


def test_broker_busy_timeout_is_checked_up_front():
    base = {"nameServer": "127.0.0.1:9876", "subscribe": "T"}
    assert parse_source_options(base, False).broker_busy_timeout_ms == 60_000
    assert parse_source_options({**base, "brokerBusyTimeoutMs": "0"},
                                False).broker_busy_timeout_ms == 0
    with pytest.raises(OptionError, match="brokerBusyTimeoutMs"):
        parse_source_options({**base, "brokerBusyTimeoutMs": "-1"}, False)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_busy_broker_waits_longer_each_time_up_to_the_cap():
    """Only the first busy answer after a wait lengthens the next one (the rest answer pulls
    sent before it); waits double up to the cap, with jitter of at most half; another answer
    ends the episode and the next one starts short again."""
    clock = FakeClock()
    brokers = BusyBrokers(clock=clock, jitter=lambda: 1.0)
    waits = []
    for _ in range(7):
        waits.append(brokers.busy("b:1", "busy", 0.1, 1.0))
        assert brokers.busy("b:1", "busy", 0.1, 1.0) == pytest.approx(waits[-1])  # same wait
        clock.now += waits[-1]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert brokers.episode("b:1")[:2] == (pytest.approx(sum(waits)), 14)
    assert brokers.wait("other:1") == 0.0 and brokers.active == 1
    brokers.end_episode("b:1")
    assert brokers.active == 0 and brokers.wait("b:1") == 0.0
    low = BusyBrokers(clock=clock, jitter=lambda: 0.0)
    assert low.busy("b:1", "busy", 0.1, 1.0) == pytest.approx(0.05)  # equal jitter's floor
