"""Transactional sends, END_TRANSACTION and check-backs through the embedded 5.x proxy's
remoting port, driven by the sink's own task code and check-back responder.

The proxy's side follows Apache 5.1's source, read and not run against a genuine proxy:
SendMessageActivity.java (addTransactionData), TransactionActivity.java and
TransactionProcessor.java (END_TRANSACTION answered at once, sent on oneway when the data is
kept), AbstractTransactionService.java / TransactionDataManager.java (data kept 30 s),
ClusterTransactionService.java (producer heartbeats to the brokers) and
ProxyClientRemotingProcessor.java (check-backs passed on to a producer of the group).
"""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from rocketmq_spark.client.nameserver import NameServerClient
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.transaction import (
    CheckResponder, HalfHandle, Outcome, end_transactions_confirmed,
)
from rocketmq_spark.sink.ids import TaskIdentity
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.sink.responder import _brokers
from rocketmq_spark.sink.schema import plan_columns
from rocketmq_spark.sink.task import write_task
from rocketmq_spark.sink.writer import _half_properties
from waiting import wait_until

SCHEMA = StructType([StructField("body", StringType())])
QUERY = "q-proxy"


def visible(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


def send_halves(cluster, topic: str, rows, group: str):
    """One task attempt's half messages through the proxy, by the sink's task code."""
    options = parse_sink_options({"nameServer": cluster.proxy_remoting_addr, "topic": topic,
                                  "deliveryGuarantee": "exactlyOnce", "producerGroup": group})
    batch = pa.RecordBatch.from_arrays([pa.array([str(r) for r in rows])], ["body"])
    return write_task([batch], plan_columns(SCHEMA, topic), options,
                      TaskIdentity("stream", QUERY, 0, 0), group,
                      half_properties=_half_properties(group, QUERY, 0))


@pytest.fixture
def txn_proxied(embedded_cluster_factory):
    """Brokers that check back fast, a proxy that announces producers every 0.2 s and keeps
    transaction data ``expire`` seconds."""
    def make(expire: float = 30.0):
        return embedded_cluster_factory(
            brokers=2, proxy_remoting=True, transaction_check_interval=0.5,
            transaction_timeout=0.5, transaction_check_max=30, proxy_transaction_heartbeat=0.2,
            proxy_transaction_data_expire=expire)
    return make


def test_commits_are_answered_by_the_proxy_and_reach_the_brokers(txn_proxied, unique_name):
    cluster = txn_proxied()
    topic, group = unique_name("PxEo"), unique_name("PxEoGroup")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(40), group)
    assert visible(cluster, topic) == 0
    with RemotingClient() as remoting:
        handles = [HalfHandle.from_tuple(t) for t in summary.handles]
        applied, unconfirmed = end_transactions_confirmed(remoting, group, handles,
                                                          Outcome.COMMIT, timeout=10)
        assert (applied, unconfirmed) == (40, [])
    wait_until(lambda: visible(cluster, topic) == 40, 20, "the commits at the brokers")
    assert cluster.pending_transactions("broker-a") == []
    assert cluster.pending_transactions("broker-b") == []


def test_a_commit_the_proxy_lost_is_settled_by_a_check_back_through_it(txn_proxied,
                                                                       unique_name):
    """A commit sent after the proxy's transaction data expired is answered SUCCESS and sent
    nowhere; the brokers check back through the proxy, which passes the check to the sink's
    responder registered with it, and its answer commits each half message once."""
    cluster = txn_proxied(expire=1.0)
    topic, group = unique_name("PxCheck"), unique_name("PxCheckGroup")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(30), group)
    kept = cluster.proxy_remoting.transactions
    newest = max(at for _, _, _, at in kept.kept.values())
    wait_until(lambda: time.monotonic() - newest > kept.data_expire, 10, "the data to expire")
    with RemotingClient() as remoting:
        handles = [HalfHandle.from_tuple(t) for t in summary.handles]
        applied, unconfirmed = end_transactions_confirmed(remoting, group, handles,
                                                          Outcome.COMMIT, timeout=10)
        assert (applied, unconfirmed) == (30, [])  # "confirmed", and lost
        names = NameServerClient(cluster.proxy_remoting_addr, remoting)
        assert _brokers(names) == [cluster.proxy_remoting_addr]  # the responder's targets
    assert visible(cluster, topic) == 0  # nothing reached a broker
    responder = CheckResponder.create(RemotingClient().config, group,
                                      lambda request: Outcome.COMMIT).start()
    try:
        responder.register([cluster.proxy_remoting_addr])
        wait_until(lambda: visible(cluster, topic) == 30, 60, "check-backs through the proxy")
    finally:
        responder.close()
    assert cluster.proxy_remoting.transactions.relayed >= 30
    assert cluster.pending_transactions("broker-a") == []
    assert cluster.pending_transactions("broker-b") == []
