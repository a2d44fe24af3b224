"""A broker answers "no new message" before the end of a planned range: loss or a wait?

A range is planned from a max offset; the node that serves the pulls may then have less. A
master that lost its data (restarted without it) never gets it back: after ``pull_timeout`` the
rest of the range is data loss (DataLossError, or skipped and counted with failOnDataLoss=false).
A slave serving while its master is down lacks what replication had not copied yet
(asynchronous, as 4.9.8's HA): its master holds the rest, so the reader waits for the master and
fails after ``retry_deadline`` rather than skip, even with failOnDataLoss=false.
"""
from __future__ import annotations

import threading

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import BrokerUnavailable, DataLossError
from rocketmq_spark.client.read.reader import QueueRangeReader, ReadSettings
from rocketmq_spark.embedded.cluster import EmbeddedCluster

from source_helpers import produce
from waiting import wait_until


def _keys(reader) -> list:
    return [int(k) for b in reader for k in b.column("keys").to_pylist()]


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_master_short_of_the_planned_end_is_data_loss_after_the_pull_timeout(native):
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("T", queues=1)
        produce(cluster.namesrv_addr, "T", range(40))
        with Admin(cluster.namesrv_addr) as admin:
            mq = admin.queues("T", refresh=True)[0]
            settings = ReadSettings(consumer_group="G", native=native, pull_timeout=0.5,
                                    fail_on_data_loss=False)
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 60, settings,
                                      is_master=admin.is_master)
            assert _keys(reader) == list(range(40))
            assert reader.lost_ranges == [(40, 60)]

            strict = ReadSettings(consumer_group="G", native=native, pull_timeout=0.5)
            with pytest.raises(DataLossError, match="only up to 40"):
                _keys(QueueRangeReader(admin.brokers, admin.address, mq, 30, 60, strict,
                                       is_master=admin.is_master))


def _slave_short_of_its_master(cluster: EmbeddedCluster) -> None:
    """broker-a's slave holds 0-99, its master 0-149, and the master is down: the HA link
    broke before the master stored 100-149 (the slave's copying loop is stopped, a fault the
    cluster has no switch for), then the master went down."""
    cluster.create_topic("T", queues=1)
    cluster.sync_slaves()
    produce(cluster.namesrv_addr, "T", range(100))
    cluster.wait_replicated()
    slave = cluster._slaves["broker-a"][0]
    cluster._call(slave.replication.stop)
    produce(cluster.namesrv_addr, "T", range(100, 150))  # stored by the master alone
    cluster.broker("broker-a").stop()
    assert cluster.node_max_offset("T", "broker-a", 0, 1) == 100


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_slave_short_of_the_planned_end_waits_for_its_master_and_never_skips(native):
    with EmbeddedCluster(brokers=1, slaves=1) as cluster:
        _slave_short_of_its_master(cluster)
        with Admin(cluster.namesrv_addr) as admin:
            mq = admin.queues("T", refresh=True)[0]
            # planned to the master's max before it went down; failOnDataLoss=false must not
            # turn the master's messages into a skip
            settings = ReadSettings(consumer_group="G", native=native, pull_timeout=0.5,
                                    retry_deadline=1.5, fail_on_data_loss=False)
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 150, settings,
                                      is_master=admin.is_master)
            with pytest.raises(BrokerUnavailable, match=r"\[100, 150\) is on its master"):
                _keys(reader)
            assert reader.reached == 100 and reader.lost_ranges == []

            # the master comes back while the reader waits: every message, once
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, 150,
                                      ReadSettings(consumer_group="G", native=native,
                                                   pull_timeout=0.5, retry_deadline=60,
                                                   fail_on_data_loss=False),
                                      is_master=admin.is_master)

            def restart_when_short() -> None:
                wait_until(lambda: reader.reached == 100 or None, 30, "the reader at 100")
                cluster.broker("broker-a").start()

            restarter = threading.Thread(target=restart_when_short, daemon=True)
            restarter.start()
            assert _keys(reader) == list(range(150))
            restarter.join(30)
            assert reader.lost_ranges == []
