"""The producer paths the sink relies on, against the embedded server over real sockets:
topic auto-creation through TBW102 on every broker, pipelined batch sends, retries on another
broker, accepted statuses, sharding-key queue choice and the oversize check."""
from __future__ import annotations

import pytest

from rocketmq_spark.client import Message, Producer, RouteNotFound
from rocketmq_spark.client.admin import Admin


def test_auto_created_topic_lands_on_every_broker_that_allows_it(embedded_cluster,
                                                                 unique_name):
    """Java's producer keeps the TBW102 template route for a new topic and rotates its sends
    over every queue of it, so each broker with auto-creation creates the topic on its first
    send; the topic's route then lists them all (issue 7, defect 6)."""
    topic = unique_name("AutoEvery")
    with Producer(embedded_cluster.namesrv_addr) as producer:
        results = [producer.send(Message(topic, b"m%d" % i)) for i in range(8)]
    assert {r.status for r in results} == {"SEND_OK"}
    assert {r.queue.broker_name for r in results} == {"broker-a", "broker-b"}
    with Admin(embedded_cluster.namesrv_addr) as admin:
        route = admin.names.route(topic, refresh=True)
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    assert all(q.write_queue_nums == 4 for q in route.queue_datas)


def test_unknown_topic_with_auto_create_off_names_the_topic(embedded_cluster_factory,
                                                           unique_name):
    cluster = embedded_cluster_factory(brokers=1, auto_create_topics=False)
    topic = unique_name("NoAuto")
    with Producer(cluster.namesrv_addr) as producer:
        with pytest.raises(RouteNotFound) as info:
            producer.send(Message(topic, b"x"))
    assert topic in str(info.value) and "create the topic first" in str(info.value)
